"""kubectl, as a user runs it against a lab cluster, failing with kubectl's own message rather than an exit status.

Every call gets the cluster's own discovery cache (``--cache-dir`` beside its kubeconfig): kubectl keys its
default cache, ``~/.kube/cache``, by host:port only, and lab clusters come and go on reused random ports, so
one cluster's cached API groups (a CRD's, say) would otherwise be read for another's.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from mmfleet_lab.cluster.build import ensure_binaries
from mmfleet_lab.cluster.process import ClusterError


def run_kubectl(
    kubeconfig: Path, *args: str, stdin: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``kubectl --kubeconfig <kubeconfig> <args>`` whatever its exit code, so a caller can read a refusal."""
    argv = [
        str(ensure_binaries().kubectl),
        "--kubeconfig",
        str(kubeconfig),
        f"--cache-dir={kubeconfig.parent / 'kube-cache'}",
        *args,
    ]
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False, timeout=timeout)


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None, timeout: float = 120) -> str:
    """kubectl's stdout; ClusterError with kubectl's own message when it fails."""
    done = run_kubectl(kubeconfig, *args, stdin=stdin, timeout=timeout)
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
