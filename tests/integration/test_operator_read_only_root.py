"""The operator runs as its image and Deployment run it: read-only root, only /tmp writable, no lab.

No container runtime here, so the image's run-time conditions are rebuilt around the real ``mmfleet run``: a
mount namespace (``unshare -m``) in which every filesystem but /proc, /sys, /dev and /tmp is remounted read-only
(the Deployment's ``readOnlyRootFilesystem`` and its ``tmp`` emptyDir), with the image's
environment (``HOME=/tmp``, ``PYTHONDONTWRITEBYTECODE=1``, images/operator.Dockerfile) and the lab unimportable
(the image installs no extra). Restricted to a namespace of its own, it must reconcile a resource there and
answer its health probe, as the kubelet would ask.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from mmfleet.api import GROUP, PLURAL, VERSION
from mmfleet_lab.cluster import Cluster
from mmfleet_lab.cluster.process import free_port
from tests.helpers.operator_process import LAB_MODULES, mmfleet_command, stop
from tests.helpers.repo import ROOT
from tests.helpers.tools import missing
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.integration

# Everything read-only but the kernel's filesystems and /tmp, the emptyDir's stand-in; the command follows. /tmp
# stays the host's (a mount of its own, left writable) rather than a fresh tmpfs, because the checkout and its venv
# may live under it (CI clones into /tmp): what is tested is that the operator writes nowhere else.
READ_ONLY_ROOT = r"""
set -e
mount --bind /tmp /tmp
mount -o remount,ro,bind /
for m in $(awk '$5 != "/" && $5 != "/tmp" && $5 !~ "^/(proc|sys|dev)(/|$)" {print $5}' /proc/self/mountinfo); do
  mount -o remount,ro,bind "$m" 2>/dev/null || true
done
exec "$@"
"""
IMAGE_ENV = {"HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1"}


def _read_only_prefix() -> list[str]:
    unshare = shutil.which("unshare")
    probe = (
        subprocess.run(
            [unshare, "-m", "sh", "-c", READ_ONLY_ROOT, "sh", "sh", "-c", "! touch /.mmfleet-rw-probe 2>/dev/null"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if unshare
        else None
    )
    if probe is None or probe.returncode != 0:
        why = "no unshare command" if probe is None else f"unshare -m with a read-only remount failed: {probe.stderr}"
        missing(f"{why} (this test needs root)")
    return [str(unshare), "-m", "sh", "-c", READ_ONLY_ROOT, "sh"]


def test_operator_reconciles_with_a_read_only_root_and_only_tmp_writable(
    cluster: Cluster, api: Any, crd: None, namespace: str, tmp_path: Path
) -> None:
    prefix = _read_only_prefix()
    port = free_port()
    log = tmp_path / "operator.log"
    env = {
        **os.environ,
        **IMAGE_ENV,
        "KUBECONFIG": str(cluster.kubeconfig),
        "MMFLEET_NAMESPACES": namespace,
        "MMFLEET_PROMETHEUS_URL": "",
    }
    command = [
        *prefix,
        *mmfleet_command(LAB_MODULES),
        "run",
        "--health-address",
        f"127.0.0.1:{port}",
        "--metrics-address",
        "",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd="/")
    try:
        minimal = yaml.safe_load((ROOT / "examples" / "minimal.yaml").read_text())
        client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, minimal)

        def deployment_made() -> bool:
            try:
                client.AppsV1Api(api).read_namespaced_deployment("minimal", namespace)
            except ApiException as error:
                if error.status == 404:
                    assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
                    return False
                raise
            return True

        wait_for(deployment_made, 60, "the read-only operator to create the fleet's Deployment")

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
                    return bool(answer.status == 200)
            except OSError:
                return False

        wait_for(healthy, 60, "the read-only operator's /healthz to answer 200")
        assert proc.poll() is None
        text = log.read_text(errors="replace")
        assert "Read-only file system" not in text and "Traceback" not in text, text[-3000:]
    finally:
        stop(proc)
    # The remounts stayed inside the operator's mount namespace.
    assert os.access(ROOT, os.W_OK)
