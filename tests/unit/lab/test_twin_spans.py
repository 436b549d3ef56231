"""The twin's request spans: a pod's resource as its server's SDK would build it, and each request's phases."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from mmfleet import clouds, render
from mmfleet.api import MultimodalInference
from mmfleet_lab.twin import spans as twin_spans
from mmfleet_lab.twin.replica import H100_QWEN25VL7B
from mmfleet_lab.twin.serve import FleetTwin, TrafficSpec, build_requests, pod_view
from tests.helpers.repo import DATA, spec_doc


def rendered_pod(name: str, tracing: bool, ratio: float = 1.0, ready: bool = True) -> dict[str, Any]:
    """A pod as the Deployment's ReplicaSet would create it on eks, Ready."""
    doc = spec_doc(cloud="eks", tracing={"enabled": tracing, "sampleRatio": ratio})
    template = render.build_deployment(MultimodalInference.model_validate(doc), clouds.get("eks"))["spec"]["template"]
    return {
        "metadata": {**template["metadata"], "name": name, "namespace": "ml", "uid": f"uid-{name}"},
        "spec": template["spec"],
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_a_traced_pod_has_the_resource_its_server_would_send() -> None:
    tracing = twin_spans.pod_tracing(rendered_pod("qwen-abc12", tracing=True, ratio=0.5))
    assert tracing is not None
    assert dict(tracing.attributes) == {
        "k8s.namespace.name": "ml",
        "k8s.pod.name": "qwen-abc12",
        "mmfleet.inference": "qwen",
        "mmfleet.model": "Qwen/Qwen2.5-VL-7B-Instruct",
        "mmfleet.backend": "vllm",
        "mmfleet.cloud": "eks",
        "service.name": "qwen",
    }
    assert tracing.ratio == 0.5
    assert twin_spans.pod_tracing(rendered_pod("qwen-abc12", tracing=False)) is None  # its server sends nothing


class Exporters:
    """A fresh in-memory exporter per pod (shutting one pod's provider down shuts its exporter)."""

    def __init__(self) -> None:
        self.made: list[InMemorySpanExporter] = []

    def __call__(self) -> InMemorySpanExporter:
        self.made.append(InMemorySpanExporter())
        return self.made[-1]

    def spans(self) -> list[Any]:
        return [span for exporter in self.made for span in exporter.get_finished_spans()]


def test_each_finished_request_is_a_trace_with_its_phases_from_the_pod_that_served_it() -> None:
    exporters = Exporters()
    request_spans = twin_spans.RequestSpans(exporters, epoch_ns=1_000_000_000_000)
    req = build_requests(TrafficSpec(rate=3.0, duration=30.0, traces=DATA), "ml/qwen")
    fleet = FleetTwin("ml", "qwen", req, H100_QWEN25VL7B, now=0.0, spans=request_spans)
    fleet.sync([pod_view(rendered_pod("qwen-a", tracing=True)), pod_view(rendered_pod("qwen-b", tracing=True))])
    for step in range(1, 301):
        fleet.advance(step * 0.2)  # one minute, as twin serve steps
    request_spans.shutdown()
    finished = exporters.spans()
    roots = [s for s in finished if s.name == twin_spans.REQUEST_SPAN]
    done = int((fleet.engine.outcomes.e2e < float("inf")).sum())
    assert done > 40 and len(roots) == done  # every finished request, and only those
    assert {r.resource.attributes["k8s.pod.name"] for r in roots} == {"qwen-a", "qwen-b"}
    by_parent: dict[int, list[Any]] = {}
    for span in finished:
        if span.parent is not None:
            by_parent.setdefault(span.parent.span_id, []).append(span)
    for root in roots:
        attributes = root.attributes or {}
        assert root.resource.attributes["mmfleet.inference"] == "qwen"
        assert root.resource.attributes["service.name"] == "qwen"
        assert root.start_time is not None and root.end_time is not None
        assert abs((root.end_time - root.start_time) / 1e9 - float(attributes[twin_spans.E2E])) < 1e-6
        children = sorted(by_parent[root.context.span_id], key=lambda s: s.start_time or 0)
        names = [c.name for c in children]
        assert names in (list(twin_spans.PHASES), ["queue", "prefill", "decode"], ["prefill", "decode"])
        assert children[0].start_time == root.start_time and children[-1].end_time == root.end_time
        for before, after in itertools.pairwise(children):
            assert before.end_time == after.start_time  # the phases tile the request
        first_token = next(c for c in children if c.name == "prefill").end_time
        assert first_token is not None
        assert abs((first_token - root.start_time) / 1e9 - float(attributes[twin_spans.TIME_TO_FIRST_TOKEN])) < 1e-6
    assert any(c.name == "encoder" for c in finished)  # ServeGen's mix has images


def test_sampling_follows_the_pods_ratio() -> None:
    exporter = InMemorySpanExporter()
    request_spans = twin_spans.RequestSpans(lambda: exporter, epoch_ns=0)
    req = build_requests(TrafficSpec(rate=3.0, duration=30.0, traces=DATA), "ml/qwen")
    fleet = FleetTwin("ml", "qwen", req, H100_QWEN25VL7B, now=0.0, spans=request_spans)
    fleet.sync([pod_view(rendered_pod("qwen-a", tracing=True, ratio=0.0))])
    for step in range(1, 151):
        fleet.advance(step * 0.2)
    request_spans.shutdown()
    assert (fleet.engine.outcomes.e2e < float("inf")).sum() > 20
    assert exporter.get_finished_spans() == ()


@pytest.mark.parametrize("tracing", [False])
def test_a_pod_without_tracing_sends_nothing(tracing: bool) -> None:
    exporter = InMemorySpanExporter()
    request_spans = twin_spans.RequestSpans(lambda: exporter, epoch_ns=0)
    req = build_requests(TrafficSpec(rate=3.0, duration=20.0, traces=DATA), "ml/qwen")
    fleet = FleetTwin("ml", "qwen", req, H100_QWEN25VL7B, now=0.0, spans=request_spans)
    fleet.sync([pod_view(rendered_pod("qwen-a", tracing=tracing))])
    for step in range(1, 101):
        fleet.advance(step * 0.2)
    request_spans.shutdown()
    assert (fleet.engine.outcomes.e2e < float("inf")).sum() > 10
    assert exporter.get_finished_spans() == ()
