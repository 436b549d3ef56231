"""OTLP end to end on 127.0.0.1: the real OpenTelemetry Collector, the operator's spans, the twin's request spans.

The collector (built from its Go modules by ``mmfleet_lab.cluster.build.ensure_collector``, run by
``mmfleet_lab.cluster.collector.run_collector``) receives OTLP/gRPC and writes what it received with its file
exporter. The operator, reconciling and autoscaling a fleet on the
local control plane with the cluster's Prometheus, sends its spans there; ``mmfleet twin serve`` serves the
fleet's pods and sends their request spans there. The test stops all three (each flushes on SIGTERM) and reads
the file: the operator's reconcile and scale-decision spans with their attributes, the link from the decision
to the Prometheus read it was made on, and request spans with their phases under the pods' resource.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mmfleet import telemetry
from mmfleet_lab.cluster import Cluster, process
from mmfleet_lab.cluster.collector import RunningCollector, attributes, read_spans, run_collector
from mmfleet_lab.spike import Twin
from mmfleet_lab.twin import spans as twin_spans
from tests.helpers.fleet import Fleet, mmi
from tests.helpers.operator_process import OperatorProcess
from tests.helpers.repo import ROOT
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.integration

RATE = 4.0  # req/s: P90 about 2 s on one H100 replica, over the 1 s target, so the autoscaler must grow it


@dataclass(frozen=True)
class Span:
    """One span as the collector's file exporter wrote it (OTLP JSON), with its resource flattened."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    start: int
    end: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    links: tuple[tuple[str, str], ...]


def read_typed_spans(path: Path) -> list[Span]:
    """The lab's ``read_spans`` of the file exporter's output, as Spans (int64 attributes stay strings, as in
    OTLP JSON: compared through int() below)."""
    return [
        Span(
            name=span["name"],
            trace_id=span["traceId"],
            span_id=span["spanId"],
            parent_span_id=span.get("parentSpanId", ""),
            start=int(span["startTimeUnixNano"]),
            end=int(span["endTimeUnixNano"]),
            attributes=attributes(span.get("attributes", [])),
            resource=span["resource"],
            links=tuple((link["traceId"], link["spanId"]) for link in span.get("links", [])),
        )
        for span in read_spans(path)
    ]


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[RunningCollector]:
    """The collector, stopped (SIGTERM: its file exporter flushes) before the test reads its file."""
    with run_collector(tmp_path / "collector") as running:
        yield running


def test_operator_and_twin_spans_reach_the_collector(
    cluster: Cluster,
    api: Any,
    namespace: str,
    operator: OperatorProcess,
    collector: RunningCollector,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kubernetes import client

    fleet = Fleet(api, namespace)
    # The collector's in-cluster face, which TracingReady looks up: a Service named by the fleet's endpoint,
    # with a ready endpoint behind it; and one with none (its collector pods would be failing).
    for service in ("collector", "idle"):
        fleet.core.create_namespaced_service(
            namespace, {"metadata": {"name": service}, "spec": {"ports": [{"name": "otlp", "port": 4317}]}}
        )
    client.DiscoveryV1Api(api).create_namespaced_endpoint_slice(
        namespace,
        {
            "metadata": {"name": "collector-1", "labels": {"kubernetes.io/service-name": "collector"}},
            "addressType": "IPv4",
            "ports": [{"name": "otlp", "port": 4317, "protocol": "TCP"}],
            "endpoints": [{"addresses": ["10.0.0.9"], "conditions": {"ready": True}}],
        },
    )
    saved = operator.env
    operator.stop()
    operator.env = {
        **saved,
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
        "MMFLEET_PROMETHEUS_URL": cluster.prometheus_url,
        "MMFLEET_AUTOSCALE_INTERVAL": "2s",
    }
    operator.start()
    twin: Twin | None = None
    try:
        tracing = {"enabled": True, "sampleRatio": 1.0, "endpoint": "http://collector:4317"}
        fleet.create(
            mmi(
                "traced",
                model={"name": "Qwen/Qwen2.5-VL-7B-Instruct"},
                gpu={"count": 1, "type": "H100"},
                cloud="eks",
                tracing=tracing,
                autoscaling={
                    "minReplicas": 1,
                    "maxReplicas": 3,
                    "slo": {"target": "1s", "window": "10s"},
                    "capacityPerReplica": 1.0,
                },
            )
        )
        fleet.create(mmi("lost", tracing={"enabled": True, "endpoint": "http://missing:4317"}))
        fleet.create(mmi("stalled", tracing={"enabled": True, "endpoint": "http://idle:4317"}))
        ready = fleet.wait_condition("traced", "TracingReady", status="True", timeout=60)
        assert ready["reason"] == "CollectorFound"
        assert f"Service {namespace}/collector" in ready["message"]
        assert "http://collector:4317" in ready["message"]
        lost = fleet.wait_condition("lost", "TracingReady", status="False", timeout=60)
        assert lost["reason"] == "CollectorNotFound"
        assert f"no Service missing in namespace {namespace}" in lost["message"]
        stalled = fleet.wait_condition("stalled", "TracingReady", status="False", timeout=60)
        assert stalled["reason"] == "CollectorNotReady"
        assert f"Service {namespace}/idle has no ready endpoint" in stalled["message"]
        fleet.wait_ready("traced")

        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint)  # the twin's, as documented
        twin = Twin(cluster, RATE, (), tmp_path / "twin.log", ROOT / "tests" / "data")
        # The autoscaler reads a fleet once its series cover the 1m rate window, then grows it.
        wait_for(
            lambda: (fleet.deployment("traced").spec.replicas or 0) > 1,
            180,
            f"the autoscaler to scale traced up (operator log: {operator.tail()})",
        )
        reason = wait_for(lambda: fleet.status("traced").get("lastScaleReason"), 30, "the scale reason in status")
        pods = {p.metadata.name for p in fleet.core.list_namespaced_pod(namespace).items}
    finally:
        if twin is not None:
            twin.stop()  # SIGTERM: its span processors flush
        operator.stop()  # SIGTERM: kopf's cleanup shuts the tracer provider down, which flushes
        operator.env = saved
        operator.start()
    process.stop([collector.proc], grace=30)  # SIGTERM: the collector drains and its file exporter flushes
    spans = read_typed_spans(collector.output)
    assert spans, f"nothing arrived (collector log: {collector.log})"

    def about(name: str, fleet_name: str) -> list[Span]:
        return [
            s
            for s in spans
            if s.name == name
            and s.attributes.get(telemetry.NAMESPACE) == namespace
            and s.attributes.get(telemetry.INFERENCE) == fleet_name
        ]

    # The operator's reconcile, with its applies inside it.
    reconciles = about(telemetry.RECONCILE, "traced")
    assert reconciles, sorted({s.name for s in spans})
    reconcile = reconciles[0]
    assert reconcile.resource["service.name"] == telemetry.SERVICE_NAME
    assert int(reconcile.attributes[telemetry.GENERATION]) == 1
    assert reconcile.attributes[telemetry.CLOUD] == "eks"
    applies = [s for s in spans if s.name == telemetry.APPLY and s.parent_span_id == reconcile.span_id]
    assert {s.attributes[telemetry.CHILD_KIND] for s in applies} >= {"Deployment", "Service"}

    # The scale decision: what it decided, on what, and the link to the Prometheus read it decided on.
    scaled = [s for s in about(telemetry.DECIDE, "traced") if s.attributes.get(telemetry.SCALED)]
    assert scaled, [s.attributes for s in about(telemetry.DECIDE, "traced")][-3:]
    decision = scaled[0]
    assert int(decision.attributes[telemetry.REPLICAS_BEFORE]) == 1
    assert int(decision.attributes[telemetry.REPLICAS_AFTER]) > 1
    assert decision.attributes[telemetry.REASON] == reason or any(
        s.attributes[telemetry.REASON] == reason for s in scaled
    )
    assert decision.attributes[telemetry.REQUEST_RATE] > 0
    assert telemetry.LATENCY in decision.attributes
    assert decision.attributes[telemetry.SLO_TARGET] == 1.0
    observations = {(s.trace_id, s.span_id): s for s in spans if s.name == telemetry.OBSERVE}
    assert len(decision.links) == 1 and decision.links[0] in observations
    observation = observations[decision.links[0]]
    assert int(observation.attributes[telemetry.QUERIES]) >= 5 and telemetry.OUTAGE not in observation.attributes
    assert observation.end <= decision.start

    # The twin's request spans, from the fleet's pods, with their phases.
    requests = [
        s
        for s in spans
        if s.name == twin_spans.REQUEST_SPAN
        and s.resource.get("k8s.namespace.name") == namespace
        and s.resource.get("mmfleet.inference") == "traced"
    ]
    assert len(requests) > 20, f"{len(requests)} request spans (twin log: {twin.log if twin else ''})"
    assert {s.resource["k8s.pod.name"] for s in requests} <= pods
    resource = requests[0].resource
    assert resource["mmfleet.model"] == "Qwen/Qwen2.5-VL-7B-Instruct"
    assert (resource["mmfleet.backend"], resource["mmfleet.cloud"]) == ("vllm", "eks")
    assert resource["service.name"] == "traced"
    slowest = max(requests, key=lambda s: s.end - s.start)
    phases = sorted((s for s in spans if s.parent_span_id == slowest.span_id), key=lambda s: s.start)
    assert [p.name for p in phases][-2:] == ["prefill", "decode"]
    assert phases[0].start == slowest.start and phases[-1].end == slowest.end
    assert slowest.attributes[twin_spans.E2E] > 0
