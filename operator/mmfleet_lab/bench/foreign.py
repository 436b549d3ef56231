"""``mmfleet bench foreign``: what the operator pays for the cluster's other objects.

A cluster is mostly not the operator's: other teams' pods, ConfigMaps and Services come and go all day. The operator
watches every kind its children come in; this run starts a fresh local cluster and the operator with no fleet, then
creates and patches ConfigMaps and creates pods (kwok binds and runs them) that carry none of a fleet's labels, and
measures the operator's CPU over that span against an idle span of the same length right after, and its RSS.
"""

from __future__ import annotations

import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from mmfleet_lab.bench.operator_scale import (
    CLUSTER,
    NAMESPACE,
    OPERATOR_COMMAND,
    PODS_PER_NODE,
    Operator,
    Progress,
    _cpu_seconds,
    _install,
    _peak_rss_mb,
    _wait_operator,
)
from mmfleet_lab.bench.report import table, write_section
from mmfleet_lab.cluster import NodePool, down, up

CONFIGMAP_BYTES = 2000
SETTLE_SECONDS = 20.0  # after the last request, for the pods to run and the watches to drain
THREADS = 8


@dataclass(frozen=True)
class Result:
    configmaps: int
    pods: int
    seconds: float  # the churn's span, settling included; the idle span is as long
    idle_cpu: float
    churn_cpu: float
    peak_rss_before_mb: float  # its peak RSS from its start until the churn
    peak_rss_mb: float


def run_once(configmaps: int, pods: int, progress: Progress) -> Result:
    from kubernetes import client

    nodes = max(1, -(-pods // PODS_PER_NODE))
    node_pool = NodePool(
        cloud="eks", gpu_type="H100", count=nodes, gpus_per_node=8, pods=str(PODS_PER_NODE), cpu="1000", memory="4000Gi"
    )
    down(CLUSTER)
    cluster = up(CLUSTER, pod_ready_delay="1s", nodes=(node_pool,), progress=lambda line: progress(f"   {line}"))
    try:
        api = _install(cluster)
        core = client.CoreV1Api(api)
        log = cluster.logs_dir / "operator.log"
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "MMFLEET_PROMETHEUS_URL": ""}
        with log.open("ab") as out:
            operator = Operator(
                subprocess.Popen(OPERATOR_COMMAND, env=env, stdout=out, stderr=subprocess.STDOUT), spied=False
            )
        try:
            _wait_operator(log, operator)
            time.sleep(5.0)  # its first lists done
            progress(f"   {configmaps} ConfigMaps created and patched, {pods} pods created, none a fleet's")
            rss_before, started, cpu_before = _peak_rss_mb(operator.pid), time.monotonic(), _cpu_seconds(operator.pid)

            def configmap(i: int) -> None:
                body = {"metadata": {"name": f"c{i}", "labels": {"app": "web"}}, "data": {"a": "x" * CONFIGMAP_BYTES}}
                core.create_namespaced_config_map(NAMESPACE, body)
                core.patch_namespaced_config_map(f"c{i}", NAMESPACE, {"data": {"b": "y"}})

            def pod(i: int) -> None:
                meta = {"name": f"p{i}", "labels": {"app": "web"}}
                spec = {"containers": [{"name": "web", "image": "example.com/web:1"}]}
                spec["tolerations"] = [{"operator": "Exists"}]
                core.create_namespaced_pod(NAMESPACE, {"metadata": meta, "spec": spec})

            with ThreadPoolExecutor(THREADS) as pool:
                list(pool.map(configmap, range(configmaps)))
                list(pool.map(pod, range(pods)))
            time.sleep(SETTLE_SECONDS)
            seconds, churn_cpu = time.monotonic() - started, _cpu_seconds(operator.pid) - cpu_before
            progress(f"   idle for {seconds:.0f}s")
            cpu_before = _cpu_seconds(operator.pid)
            time.sleep(seconds)
            idle_cpu = _cpu_seconds(operator.pid) - cpu_before
            peak = _peak_rss_mb(operator.pid)
        finally:
            operator.stop()
        return Result(configmaps, pods, seconds, idle_cpu, churn_cpu, rss_before, peak)
    finally:
        down(CLUSTER)


def render(result: Result) -> str:
    headers = ["other objects", "span (s)", "operator CPU, churn (s)", "operator CPU, idle (s)", "peak RSS before (MB)",
               "peak RSS after (MB)"]  # fmt: skip
    row = [
        f"{result.configmaps} ConfigMaps (created, patched), {result.pods} pods",
        f"{result.seconds:.0f}",
        f"{result.churn_cpu:.2f}",
        f"{result.idle_cpu:.2f}",
        f"{result.peak_rss_before_mb:.0f}",
        f"{result.peak_rss_mb:.0f}",
    ]
    return table(headers, [row])


def main(configmaps: int, pods: int, docs: Path, progress: Progress) -> int:
    result = run_once(configmaps, pods, progress)
    text = render(result)
    print(text)
    body = (
        f"Command: `mmfleet bench foreign --configmaps {configmaps} --pods {pods}`. A fresh local cluster and the "
        "operator with no fleet; then ConfigMaps of "
        f"{CONFIGMAP_BYTES:,} bytes created and patched and pods created (kwok binds and runs them), from {THREADS} "
        "threads, none carrying a fleet's labels, and "
        f"{SETTLE_SECONDS:g} s to settle. The operator's CPU (user and system) over that span, against an idle span "
        "of the same length right after; its peak RSS (VmHWM) from its start until the churn, and after. "
        f"Machine: {os.cpu_count()} cores.\n\n{text}"
    )
    write_section(docs, "operator-foreign", "The operator while the cluster's other objects churn", body)
    return 0
