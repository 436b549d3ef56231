"""The plain-Prometheus job of docs/operator.md, run by a real Prometheus against the pods mmfleet renders.

Debian's Prometheus has no Kubernetes discovery, so the job's ``kubernetes_sd_configs`` becomes a file_sd target
per container port of each rendered pod, with the ``__meta_kubernetes_*`` labels Kubernetes pod discovery gives it
(pod labels sanitised, ``labelpresent``, phase, port name); its relabelling is the document's, unchanged.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from mmfleet import render, routing
from mmfleet.api import MultimodalInference
from mmfleet_lab.cluster import process
from mmfleet_lab.cluster import prometheus as prom
from tests.helpers.repo import ROOT, spec_doc
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.integration

# Each pod kept: the label naming its fleet, the fleet, and the path it is scraped on. The encode tier's series stay
# out of the serving replicas' sums, under the label its PodMonitor gives them; TensorRT-LLM's server (not its picker)
# serves /prometheus/metrics.
KEPT = {
    "qwen-0": ("mmfleet_io_inference", "qwen", "/metrics"),
    f"qwen{routing.PICKER_SUFFIX}-0": ("mmfleet_io_inference", "qwen", "/metrics"),
    "qwen-encode-0": ("mmfleet_io_encode", "qwen", "/metrics"),
    "trt-0": ("mmfleet_io_inference", "trt", "/prometheus/metrics"),
    f"trt{routing.PICKER_SUFFIX}-0": ("mmfleet_io_inference", "trt", "/metrics"),
}


def documented_job() -> dict[str, Any]:
    """The scrape job under docs/operator.md's "Prometheus wiring"."""
    text = (ROOT / "docs" / "operator.md").read_text()
    section = text.split("## Prometheus wiring", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    (job,) = yaml.safe_load(block)["scrape_configs"]
    assert isinstance(job, dict)
    return job


def _sanitised(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def discovered(
    pod: str, namespace: str, labels: dict[str, str], ports: list[str], phase: str, address: str
) -> list[dict[str, Any]]:
    """What Kubernetes pod discovery gives one pod: a target per container port (address: our stand-in server)."""
    meta = {"__meta_kubernetes_namespace": namespace, "__meta_kubernetes_pod_name": pod}
    meta["__meta_kubernetes_pod_phase"] = phase
    for key, value in labels.items():
        meta[f"__meta_kubernetes_pod_label_{_sanitised(key)}"] = value
        meta[f"__meta_kubernetes_pod_labelpresent_{_sanitised(key)}"] = "true"
    return [{"targets": [address], "labels": {**meta, "__meta_kubernetes_pod_container_port_name": p}} for p in ports]


def pods_of(inference: MultimodalInference, address: str) -> list[dict[str, Any]]:
    """A Running pod of each Deployment the operator renders for ``inference``."""
    groups = []
    for child in render.render(inference, "eks"):
        if child["kind"] != "Deployment":
            continue
        template = child["spec"]["template"]
        ports = [p["name"] for c in template["spec"]["containers"] for p in c.get("ports", []) if "name" in p]
        name, namespace = child["metadata"]["name"], child["metadata"]["namespace"]
        groups += discovered(f"{name}-0", namespace, template["metadata"]["labels"], ports, "Running", address)
    return groups


class MetricsServer:
    """Any path answers one sample naming the path scraped."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = f'probe{{served_path="{self.path}"}} 1\n'.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def pods() -> Iterator[MetricsServer]:
    server = MetricsServer()
    yield server
    server.close()


def test_the_documented_job_labels_serving_encode_and_picker_pods_as_the_podmonitors_do(
    tmp_path: Path, pods: MetricsServer
) -> None:
    vllm = MultimodalInference.model_validate(
        spec_doc(
            autoscaling={
                "enabled": True,
                "maxReplicas": 4,
                "slo": {"metric": "ttft", "percentile": 90, "target": "1s"},
            },
            disaggregation={"encode": {"gpu": {"count": 1, "type": "H100"}, "autoscaling": {"maxReplicas": 2}}},
            routing={"mode": "inferencePool"},
        )
    )
    trt = spec_doc(backend={"name": "tensorrt-llm"}, routing={"mode": "inferencePool"})
    trt["metadata"]["name"] = "trt"
    groups = pods_of(vllm, pods.address) + pods_of(MultimodalInference.model_validate(trt), pods.address)
    serving = {"app.kubernetes.io/name": "vllm", "mmfleet.io/inference": "qwen"}
    groups += discovered("qwen-pending", "ml", serving, ["http"], "Pending", pods.address)
    groups += discovered("stranger", "ml", {"app": "other"}, ["http"], "Running", pods.address)

    targets = tmp_path / "targets"
    targets.mkdir()
    (targets / "pods.json").write_text(json.dumps(groups))
    job = documented_job()
    del job["kubernetes_sd_configs"]
    job["file_sd_configs"] = [{"files": [str(targets / "*.json")], "refresh_interval": "1s"}]
    job["scrape_interval"] = "1s"
    prom.home(tmp_path).mkdir()
    (prom.home(tmp_path) / "data").mkdir()
    (prom.home(tmp_path) / "prometheus.yml").write_text(yaml.safe_dump({"scrape_configs": [job]}))
    port = process.free_port()
    url = f"http://127.0.0.1:{port}"
    proc = prom.launch(tmp_path, port)
    try:
        prom.wait_ready(proc, url, 30)

        def scraped() -> dict[str, dict[str, str]] | None:
            answer = process.http_get(f"{url}/api/v1/query?query={urllib.parse.quote('probe')}")
            found = {r["metric"]["pod"]: r["metric"] for r in json.loads(answer)["data"]["result"]}
            return found if len(found) >= len(KEPT) else None

        series = wait_for(scraped, 30, "the kept pods' series in Prometheus", interval=0.5)
        # One file, discovered at once: with those series in, the targets are final.
        active = json.loads(process.http_get(f"{url}/api/v1/targets?state=active"))["data"]["activeTargets"]
    finally:
        process.stop([proc])

    assert sorted(t["labels"]["pod"] for t in active) == sorted(KEPT), "pending and other pods, other ports dropped"
    for pod, (fleet_label, fleet, path) in KEPT.items():
        labels = {k: v for k, v in series[pod].items() if k not in ("__name__", "instance", "job", "pod")}
        assert labels == {"namespace": "ml", fleet_label: fleet, "served_path": path}, pod
