"""``mmfleet demo``: the main job on the embedded default, from nothing to Ready fleets.

A local control plane (built on first use), the CRD, the operator as its own process, the
examples that can run on kwok GPU nodes, and a live view of what the operator reports. The
cluster stays up afterwards so the user can explore it with kubectl.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mmfleet import crd
from mmfleet.api import GROUP, PLURAL, VERSION
from mmfleet.localcluster import Cluster, NodePool, attach, ensure_binaries, up

CLUSTER = "mmfleet"
NAMESPACE = "ml"
# Examples whose nodes the demo cluster has; internvl-ack needs a storage provisioner for its PVC cache.
EXAMPLES = ("qwen-vl-eks.yaml", "llama-vision-trtllm-aks.yaml", "minimal.yaml")
SECRETS = ("hf-token",)
POD_READY_DELAY = "8s"
# GPU nodes labelled as each example's cloud labels them, so every example lands on its own pool.
POOLS = (
    NodePool(cloud="eks", gpu_type="H100", count=2),
    NodePool(cloud="aks", gpu_type="A100", count=2),
    NodePool(cloud="ack", gpu_type="H20", count=1),
)
WAIT_SECONDS = 180


def _say(line: str) -> None:
    print(line, flush=True)


def _examples_dir() -> Path:
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "examples" / EXAMPLES[0]).exists():
            return parent / "examples"
    raise FileNotFoundError("examples/ not found next to the mmfleet source tree")


def _kubectl(cluster: Cluster) -> Callable[..., subprocess.CompletedProcess[str]]:
    binary = str(ensure_binaries().kubectl)

    def run(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [binary, "--kubeconfig", str(cluster.kubeconfig), *args],
            input=stdin, capture_output=True, text=True, check=check,
        )  # fmt: skip

    return run


def _start_operator(cluster: Cluster) -> int:
    log = cluster.logs_dir / "operator.log"
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mmfleet.cli", "run", "--health-address", ""],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    attach(cluster.name, "operator", proc.pid)
    return proc.pid


def _table(items: list[dict[str, Any]]) -> list[str]:
    rows = [("NAME", "BACKEND", "PHASE", "READY", "MESSAGE")]
    for item in items:
        status = item.get("status") or {}
        conditions: dict[str, dict[str, Any]] = {c["type"]: c for c in status.get("conditions", [])}
        ready, degraded = conditions.get("Ready", {}), conditions.get("Degraded", {})
        message = degraded.get("message") if degraded.get("status") == "True" else ready.get("message", "")
        rows.append(
            (
                item["metadata"]["name"],
                status.get("backend", ""),
                status.get("phase", "Pending"),
                f"{status.get('readyReplicas', 0)}/{status.get('desiredReplicas', '?')}",
                (message or "")[:70],
            )
        )
    widths = [max(len(str(row[i])) for row in rows) for i in range(5)]
    return ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]


def run_demo() -> int:
    _say("== 1/4 local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok GPU nodes)")
    cluster = up(CLUSTER, pod_ready_delay=POD_READY_DELAY, nodes=POOLS, progress=lambda line: _say(f"   {line}"))
    kubectl = _kubectl(cluster)
    _say(kubectl("get", "nodes", "-L", "node.kubernetes.io/instance-type,nvidia.com/gpu.product").stdout)

    _say("== 2/4 the MultimodalInference CRD (generated from the pydantic models)")
    _say("   " + kubectl("apply", "--server-side", "-f", "-", stdin=crd.crd_yaml()).stdout.strip())
    kubectl("wait", "--for=condition=Established", "crd/multimodalinferences.mmfleet.io", "--timeout=60s")

    _say("== 3/4 the operator (mmfleet run), logging to " + str(cluster.logs_dir / "operator.log"))
    _say(f"   pid {_start_operator(cluster)}")

    _say(f"== 4/4 examples into namespace {NAMESPACE}: {', '.join(EXAMPLES)}")
    kubectl("create", "namespace", NAMESPACE, check=False)
    for secret in SECRETS:  # the examples read model credentials; kwok never starts the container
        kubectl("-n", NAMESPACE, "create", "secret", "generic", secret, "--from-literal=HF_TOKEN=demo", check=False)
    for example in EXAMPLES:
        _say("   " + kubectl("-n", NAMESPACE, "apply", "-f", str(_examples_dir() / example)).stdout.strip())

    from kubernetes import client

    custom = client.CustomObjectsApi(cluster.api_client())
    deadline = time.monotonic() + WAIT_SECONDS
    last: list[str] = []
    while time.monotonic() < deadline:
        items = custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)["items"]
        table = _table(items)
        if table != last:
            _say(f"-- {time.strftime('%H:%M:%S')}")
            _say("\n".join(table))
            last = table
        if items and all((i.get("status") or {}).get("phase") == "Ready" for i in items):
            break
        time.sleep(2)
    else:
        _say(f"not every fleet was Ready within {WAIT_SECONDS}s; see {cluster.logs_dir / 'operator.log'}")
        return 1

    _say("\n" + kubectl("-n", NAMESPACE, "get", "mmi,deployments,pods,services").stdout)
    _say("All fleets are Ready. The cluster stays up; explore it with:")
    _say(f"   {cluster.env_line()}")
    _say(f"   {ensure_binaries().kubectl} get mmi -n {NAMESPACE} -w")
    _say(f"   {ensure_binaries().kubectl} explain mmi.spec.autoscaling.slo")
    _say("Stop everything (control plane and operator) with:  .venv/bin/mmfleet cluster down")
    return 0
