"""The local data plane: `mmfleet twin serve` simulates the rendered pods, the cluster's Prometheus scrapes them.

Fleets are rendered by mmfleet itself (no operator: the children are applied directly), so the pods carry
exactly the labels and command lines a real fleet's pods would; kwok makes them Ready.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from mmfleet import render
from mmfleet.kube import Kube
from mmfleet.validation import parse
from mmfleet_lab.cluster import READY_DELAY_ANNOTATION, Cluster, get, process, start_prometheus, stop_prometheus, up
from mmfleet_lab.twin.serve import TARGETS_FILE
from tests.helpers.cluster import CLUSTER_NAME, POD_READY_DELAY, POOLS, SCRAPE_INTERVAL
from tests.helpers.operator_process import stop
from tests.helpers.repo import ROOT
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.integration

RATE = 6.0  # req/s per fleet: 3 per replica of vllm-fleet, far under an H100 replica's capacity at P90 5 s


def promql(url: str, query: str, at: float | None = None) -> list[dict[str, Any]]:
    params = {"query": query, **({"time": f"{at:.3f}"} if at is not None else {})}
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode(params)}", timeout=5) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def by_fleet(result: list[dict[str, Any]], namespace: str) -> dict[str, float]:
    """Values by fleet name, of one namespace (the operator's tests may run fleets of the same names)."""
    return {
        r["metric"]["mmfleet_io_inference"]: float(r["value"][1])
        for r in result
        if r["metric"].get("namespace") == namespace
    }


class TwinProcess:
    """`mmfleet twin serve` as users start it, its log in a file."""

    def __init__(self, log: Path) -> None:
        self.port = process.free_port()
        self.log = log
        argv = [
            sys.executable,
            "-m",
            "mmfleet.cli",
            "twin",
            "serve",
            "--cluster",
            CLUSTER_NAME,
            "--port",
            str(self.port),
        ]
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*argv, "--rate", str(RATE), "--traces", str(ROOT / "tests" / "data")],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_for(self._healthy, 30, f"the twin's /healthz (log: {self.tail()})")

    def _healthy(self) -> bool:
        assert self.proc.poll() is None, self.tail()
        try:
            return process.http_get(f"http://127.0.0.1:{self.port}/healthz") == "ok"
        except OSError:
            return False

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def stop(self) -> int:
        return stop(self.proc)

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-20:]) if self.log.exists() else ""


@dataclass
class DataPlane:
    cluster: Cluster
    namespace: str
    twin: TwinProcess
    apps: Any
    core: Any

    @property
    def targets(self) -> Path:
        return self.cluster.prometheus_targets / TARGETS_FILE

    def target_pods(self) -> list[str]:
        if not self.targets.exists():
            return []
        return sorted(group["labels"]["pod"] for group in json.loads(self.targets.read_text()))

    def pods(self, fleet: str) -> list[Any]:
        found: list[Any] = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"mmfleet.io/inference={fleet}"
        ).items
        return found


def apply_fleet(kube: Kube, namespace: str, name: str, ready_delay: str | None = None, **spec: Any) -> None:
    """Render a MultimodalInference and apply its children as the operator would (no owner: there is no resource)."""
    spec.setdefault("model", {"name": "Qwen/Qwen2.5-VL-7B-Instruct"})
    spec.setdefault("gpu", {"count": 1, "type": "H100"})
    doc = {"apiVersion": "mmfleet.io/v1alpha1", "kind": "MultimodalInference"}
    inference = parse({**doc, "metadata": {"name": name, "namespace": namespace}, "spec": spec})
    for child in render.render(inference, "eks"):
        if child["kind"] == "Deployment" and ready_delay:
            child["spec"]["template"]["metadata"]["annotations"][READY_DELAY_ANNOTATION] = ready_delay
        kube.apply(child)


@pytest.fixture(scope="module")
def plane(cluster: Cluster, api: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DataPlane]:
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    namespace = f"twin-{int(time.time())}"
    core.create_namespace({"metadata": {"name": namespace}})
    wait_for(lambda: core.list_namespaced_service_account(namespace).items, 30, "the default ServiceAccount")
    kube = Kube(api)
    apply_fleet(kube, namespace, "vl", replicas=2, model={"name": "Qwen/Qwen2.5-VL-7B-Instruct", "servedName": "qwen"})
    apply_fleet(kube, namespace, "trt", replicas=1, backend={"name": "tensorrt-llm"})
    apply_fleet(kube, namespace, "loading", replicas=1, ready_delay="10m")
    twin = TwinProcess(tmp_path_factory.mktemp("twin") / "twin.log")
    state = get(CLUSTER_NAME)
    assert state is not None
    yield DataPlane(state, namespace, twin, apps, core)
    twin.stop()
    start_prometheus(CLUSTER_NAME)  # whatever a failed test left, the session goes on with Prometheus up
    core.delete_namespace(namespace)


def test_prometheus_runs_with_the_cluster(cluster: Cluster) -> None:
    assert cluster.prometheus_url.startswith("http://127.0.0.1:")
    assert process.http_get(f"{cluster.prometheus_url}/-/ready").startswith("Prometheus Server is Ready")
    assert f"MMFLEET_PROMETHEUS_URL={cluster.prometheus_url}" in cluster.env_line()
    with urllib.request.urlopen(f"{cluster.prometheus_url}/api/v1/status/config", timeout=5) as response:
        loaded = json.load(response)["data"]["yaml"]
    assert "scrape_interval: 2s" in loaded and "file_sd_configs" in loaded


def test_prometheus_scrapes_the_simulated_pods(plane: DataPlane) -> None:
    url, ns = plane.cluster.prometheus_url, plane.namespace
    success = "sum by (namespace, mmfleet_io_inference) (rate({}[20s]))"

    # 20 s of samples after the pods turn Ready, so each fleet's window is full (a rate over a window the
    # series started inside reads low: Prometheus extrapolates at most half an interval past the first sample)
    def window_full(fleet: str, gauge: str) -> float | None:
        return by_fleet(promql(url, f"count_over_time({gauge}[20s]) >= 9"), ns).get(fleet)

    for fleet, gauge in (("vl", "vllm:num_requests_running"), ("trt", "trtllm_num_requests_running")):
        wait_for(
            functools.partial(window_full, fleet, gauge),
            90,
            f"20 s of scrapes of fleet {fleet} (twin log: {plane.twin.tail()})",
        )
    rates = by_fleet(promql(url, success.format("vllm:request_success_total")), ns)
    assert 0.6 * RATE < rates["vl"] < 1.4 * RATE, rates
    assert "loading" not in rates  # its pod is still loading: not served, not scraped
    p90 = by_fleet(
        promql(
            url,
            "histogram_quantile(0.9, sum by (namespace, mmfleet_io_inference, le) "
            "(rate(vllm:e2e_request_latency_seconds_bucket[20s])))",
        ),
        ns,
    )
    assert 0.3 < p90["vl"] < 5.0, p90  # an H100 replica at 3 req/s of ServeGen's mix: about 2 s
    series = promql(url, f'vllm:num_requests_running{{namespace="{ns}", mmfleet_io_inference="vl"}}')
    assert len(series) == 2  # one per pod
    assert {s["metric"]["model_name"] for s in series} == {"qwen"}  # the pods' --served-model-name
    assert {s["metric"]["engine"] for s in series} == {"0"}
    for query in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"):
        assert "vl" in by_fleet(promql(url, f"sum by (namespace, mmfleet_io_inference) ({query})"), ns), query
    trt = by_fleet(promql(url, success.format("trtllm_request_success_total")), ns)
    assert 0.5 * RATE < trt["trt"] < 1.5 * RATE, trt
    assert promql(url, f'trtllm_time_per_output_token_seconds_count{{namespace="{ns}"}}')  # its names, not vLLM's


def test_targets_follow_the_pods(plane: DataPlane) -> None:
    loading = plane.pods("loading")[0].metadata.name
    assert loading not in plane.target_pods()
    status, _ = plane.twin.get(f"/pods/{plane.namespace}/{loading}/metrics")
    assert status == 404  # a loading vLLM serves no /metrics yet
    plane.apps.patch_namespaced_deployment_scale("vl", plane.namespace, {"spec": {"replicas": 3}})
    wait_for(lambda: sum(p.startswith("vl-") for p in plane.target_pods()) == 3, 30, "a third vl target")
    plane.apps.patch_namespaced_deployment_scale("vl", plane.namespace, {"spec": {"replicas": 1}})
    wait_for(lambda: sum(p.startswith("vl-") for p in plane.target_pods()) == 1, 30, "one vl target left")
    (pod,) = [p.metadata.name for p in plane.pods("vl") if not p.metadata.deletion_timestamp]
    status, body = plane.twin.get(f"/pods/{plane.namespace}/{pod}/metrics")
    assert status == 200 and 'vllm:request_success_total{engine="0",finished_reason="stop",model_name="qwen"}' in body


def test_prometheus_stops_and_restarts_with_its_data(plane: DataPlane) -> None:
    url = plane.cluster.prometheus_url
    wait_for(lambda: promql(url, "vllm:request_success_total"), 30, "series to query")
    before = time.time()
    stop_prometheus(CLUSTER_NAME)
    with pytest.raises(OSError):
        process.http_get(f"{url}/-/ready")
    time.sleep(3)  # a gap in the scrapes, as in an outage
    again = start_prometheus(CLUSTER_NAME)
    assert again.prometheus_url == url  # same address: clients need no new configuration
    restarted = time.time()
    assert promql(url, "vllm:request_success_total", at=before)  # the TSDB was kept
    wait_for(
        lambda: promql(url, f"timestamp(vllm:request_success_total) > {restarted}"), 20, "scrapes after the restart"
    )
    stop_prometheus(CLUSTER_NAME)  # `up` of the running cluster brings a stopped Prometheus back too
    up(CLUSTER_NAME, pod_ready_delay=POD_READY_DELAY, nodes=POOLS, scrape_interval=SCRAPE_INTERVAL)
    assert process.http_get(f"{url}/-/ready").startswith("Prometheus Server is Ready")


def test_the_twin_stops_cleanly_on_sigterm(plane: DataPlane) -> None:
    assert plane.targets.exists()
    assert plane.twin.stop() == 0, plane.twin.tail()
    assert not plane.targets.exists()  # Prometheus drops the simulated pods
