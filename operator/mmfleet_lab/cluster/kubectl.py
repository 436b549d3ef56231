"""kubectl, as a user runs it against a lab cluster, failing with kubectl's own message rather than an exit status."""

from __future__ import annotations

import subprocess
from pathlib import Path

from mmfleet_lab.cluster.build import ensure_binaries
from mmfleet_lab.cluster.process import ClusterError


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    """``kubectl --kubeconfig <kubeconfig> <args>``; ClusterError with kubectl's own message when it fails."""
    argv = [str(ensure_binaries().kubectl), "--kubeconfig", str(kubeconfig), *args]
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ClusterError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout
