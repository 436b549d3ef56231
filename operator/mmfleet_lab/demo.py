"""``mmfleet demo``: the main job on the embedded default, from nothing to a fleet riding a spike.

A local control plane (built on first use) with Prometheus, the CRD, the operator as its own
process, the examples that can run on kwok GPU nodes, then a traffic spike served by the digital
twin (``mmfleet twin serve``) while the operator scales the autoscaled example: replicas and P90
against the target live on the terminal, and a PNG of the run at the end. The cluster stays up
afterwards so the user can explore it with kubectl.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mmfleet import crd
from mmfleet.api import GROUP, PLURAL, VERSION
from mmfleet_lab import spike
from mmfleet_lab.cluster import Cluster, NodePool, attach, ensure_binaries, up
from mmfleet_lab.twin.serve import Spike

CLUSTER = "mmfleet"
NAMESPACE = "ml"
# Examples whose nodes the demo cluster has; internvl-ack needs a storage provisioner for its PVC cache.
EXAMPLES = ("qwen-vl-eks.yaml", "llama-vision-trtllm-aks.yaml", "minimal.yaml")
SECRETS = ("hf-token",)
POD_READY_DELAY = "8s"
SCRAPE_INTERVAL = "2s"  # Prometheus'; the demo's 20 s SLO window needs several scrapes in it
# GPU nodes labelled as each example's cloud labels them, so every example lands on its own pool.
POOLS = (
    NodePool(cloud="eks", gpu_type="H100", count=2),
    NodePool(cloud="aks", gpu_type="A100", count=2),
    NodePool(cloud="ack", gpu_type="H20", count=1),
)
WAIT_SECONDS = 180
# The spike: the autoscaled example at 4 req/s, five times that for 90 s, then back. The twin's ServeGen
# mix has long answers, so the demo's SLO is P90 3 s over 20 s windows (the example says 2 s over 60 s),
# with a short scale-down delay: the same settings as tests/e2e/test_spike.py.
SCALED = "qwen-vl"
BASE_RATE = 4.0
SPIKE = Spike(start=100.0, end=190.0, factor=5.0)
DEMO_AUTOSCALING = {
    "scaleDownDelay": "45s",
    "slo": {"metric": "e2e", "percentile": 90, "target": "3s", "window": "20s"},
}
SPIKE_SECONDS = 360
AUTOSCALE_INTERVAL = "5s"


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
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "MMFLEET_PROMETHEUS_URL": cluster.prometheus_url or "",
        "MMFLEET_AUTOSCALE_INTERVAL": AUTOSCALE_INTERVAL,
    }
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
    _say("== 1/5 local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok GPU nodes)")
    cluster = up(
        CLUSTER, pod_ready_delay=POD_READY_DELAY, nodes=POOLS, scrape_interval=SCRAPE_INTERVAL,
        progress=lambda line: _say(f"   {line}"),
    )  # fmt: skip
    kubectl = _kubectl(cluster)
    _say(kubectl("get", "nodes", "-L", "node.kubernetes.io/instance-type,nvidia.com/gpu.product").stdout)

    _say("== 2/5 the MultimodalInference CRD (generated from the pydantic models)")
    _say("   " + kubectl("apply", "--server-side", "-f", "-", stdin=crd.crd_yaml()).stdout.strip())
    kubectl("wait", "--for=condition=Established", "crd/multimodalinferences.mmfleet.io", "--timeout=60s")

    _say("== 3/5 the operator (mmfleet run), logging to " + str(cluster.logs_dir / "operator.log"))
    _say(f"   pid {_start_operator(cluster)}")

    _say(f"== 4/5 examples into namespace {NAMESPACE}: {', '.join(EXAMPLES)}")
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
    code = _play_spike(cluster, kubectl)
    _say("The cluster stays up (the twin keeps serving the base rate); explore it with:")
    for env in cluster.env_line().splitlines():
        _say(f"   {env}")
    _say(f"   {ensure_binaries().kubectl} get mmi -n {NAMESPACE} -w")
    _say(f"   {ensure_binaries().kubectl} explain mmi.spec.autoscaling.slo")
    _say(f"   curl -s '{cluster.prometheus_url}/api/v1/query?query=vllm:num_requests_running'")
    _say("Stop everything (control plane, Prometheus, operator, twin) with:  .venv/bin/mmfleet cluster down")
    return code


def _play_spike(cluster: Cluster, kubectl: Callable[..., subprocess.CompletedProcess[str]]) -> int:
    """The twin serves every fleet; the autoscaled one meets a spike while we watch."""
    _say(f"== 5/5 a traffic spike on {NAMESPACE}/{SCALED}: {BASE_RATE:g} req/s, x{SPIKE.factor:g} from "
         f"{SPIKE.start:g}s to {SPIKE.end:g}s (mmfleet twin serve, the digital twin, serves the pods)")  # fmt: skip
    patch = json.dumps({"spec": {"autoscaling": DEMO_AUTOSCALING}}, separators=(",", ":"))
    kubectl("-n", NAMESPACE, "patch", "mmi", SCALED, "--type", "merge", "-p", patch)
    _say(f"   kubectl patch mmi {SCALED} --type merge -p '{patch}'   (the demo's SLO and scale-down delay)")
    twin = spike.Twin(
        cluster, BASE_RATE, (SPIKE,), cluster.logs_dir / "twin.log", _examples_dir().parent / "tests" / "data"
    )
    _say(f"   twin pid {twin.proc.pid}, log {cluster.logs_dir / 'twin.log'}; Prometheus {cluster.prometheus_url}")
    samples: list[spike.Sample] = []
    for sample in spike.follow(cluster, NAMESPACE, SCALED, twin.started):
        samples.append(sample)
        for event in sample.events:
            _say(f"   event: {event}")
        if len(samples) % 3 == 1 or sample.events:
            _say("   " + spike.line(sample, (SPIKE,)))
        if sample.t >= SPIKE_SECONDS:
            break
    png = cluster.logs_dir.parent / "demo-spike.png"
    spike.plot(samples, (SPIKE,), f"{NAMESPACE}/{SCALED} through a x{SPIKE.factor:g} spike", png)
    peak = max(s.replicas for s in samples)
    over = [s for s in samples if s.latency is not None and s.latency > s.target]
    _say(f"   replicas: {samples[0].replicas} -> {peak} at the peak -> {samples[-1].replicas} at the end; "
         f"P90 over target in {len(over)} of {len(samples)} samples; plot: {png}")  # fmt: skip
    return 0
