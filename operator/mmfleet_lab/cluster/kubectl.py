"""kubectl, as a user runs it against a lab cluster, failing with kubectl's own message rather than an exit status."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from mmfleet_lab.cluster.build import ensure_binaries
from mmfleet_lab.cluster.process import ClusterError


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    """``kubectl --kubeconfig <kubeconfig> <args>``; ClusterError with kubectl's own message when it fails."""
    argv = [str(ensure_binaries().kubectl), "--kubeconfig", str(kubeconfig), *args]
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ClusterError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def apply_ready(kubeconfig: Path, resource: dict[str, Any], timeout: str = "90s") -> None:
    """Create the namespace of a MultimodalInference, ``kubectl apply`` it and wait until its phase is Ready."""
    namespace, name = resource["metadata"]["namespace"], resource["metadata"]["name"]
    kubectl(kubeconfig, "create", "namespace", namespace)
    kubectl(kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(resource))
    ready = "--for=jsonpath={.status.phase}=Ready"
    kubectl(kubeconfig, "-n", namespace, "wait", f"mmi/{name}", ready, f"--timeout={timeout}")
