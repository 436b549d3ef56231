"""The operator's own spans: what a reconcile and an autoscaling cycle record, read back from the SDK's memory."""

from __future__ import annotations

import dataclasses
import functools
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from mmfleet import telemetry
from mmfleet.autoscaler import cycle, metrics
from mmfleet.handlers import autoscale, discovery, reconcile, records
from mmfleet.handlers.records import Operator, utc_now
from tests.helpers.operator_state import FakePrometheus, RecordingKube, fleet_body, operator, reconcile_once

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def provider() -> None:
    """The SDK's provider, once per process (the API refuses a second), exporting to memory."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        sdk = TracerProvider()
        sdk.add_span_processor(SimpleSpanProcessor(EXPORTER))
        trace.set_tracer_provider(sdk)
    current = trace.get_tracer_provider()
    assert isinstance(current, TracerProvider)
    if EXPORTER not in [getattr(p, "span_exporter", None) for p in current._active_span_processor._span_processors]:
        current.add_span_processor(SimpleSpanProcessor(EXPORTER))


@pytest.fixture(autouse=True)
def fresh_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    EXPORTER.clear()
    monkeypatch.setattr(reconcile, "FIRST_STATUS_WAIT", 0.0)  # each new fleet's status is written at once, and read


body = functools.partial(fleet_body, generation=3, replicas=1, capacity_per_replica=2.0)


def _reconcile(op: Operator, generation: int, tracing: bool = False) -> None:
    assert not reconcile_once(op, body(generation=generation, tracing=tracing)).retry


def spans(name: str) -> list[ReadableSpan]:
    return [s for s in EXPORTER.get_finished_spans() if s.name == name]


def one(name: str) -> ReadableSpan:
    found = spans(name)
    assert len(found) == 1, [s.name for s in EXPORTER.get_finished_spans()]
    return found[0]


def test_a_reconcile_is_a_span_with_an_apply_per_child_and_the_status_write_inside() -> None:
    kube = RecordingKube()
    _reconcile(operator(kube), 3)
    reconcile = one(telemetry.RECONCILE)
    assert dict(reconcile.attributes or {}) == {
        telemetry.NAMESPACE: "ml",
        telemetry.INFERENCE: "qwen",
        telemetry.GENERATION: 3,
        telemetry.CLOUD: "eks",
        telemetry.BACKEND: "vllm",
        telemetry.CHILDREN: len(kube.applied),
    }
    applies = spans(telemetry.APPLY)
    assert [(s.attributes or {}).get(telemetry.CHILD_KIND) for s in applies] == [m["kind"] for m in kube.applied]
    assert {(s.attributes or {}).get(telemetry.CHILD_NAME) for s in applies} >= {"qwen"}
    write = one(telemetry.STATUS_WRITE)
    assert (write.attributes or {})[telemetry.PHASE] == kube.written[0]["phase"]
    for child in [*applies, write]:
        assert child.parent is not None and child.parent.span_id == reconcile.context.span_id
        assert child.context.trace_id == reconcile.context.trace_id


def test_an_unchanged_status_is_no_write_and_no_span() -> None:
    op = operator(RecordingKube())
    _reconcile(op, 3)
    EXPORTER.clear()
    op.records[("ml", "qwen")].drifted = True  # applied again: idempotent, nothing new to write
    _reconcile(op, 3)
    assert spans(telemetry.STATUS_WRITE) == []
    assert len(spans(telemetry.RECONCILE)) == 1
    _reconcile(op, 3)  # nothing to apply: a status refresh, no span
    assert len(spans(telemetry.RECONCILE)) == 1


def _cycle(monkeypatch: pytest.MonkeyPatch, prometheus: metrics.Prometheus) -> tuple[Operator, RecordingKube]:
    """One autoscaling cycle over one fleet at 2 replicas whose series have been read for two minutes."""
    kube = RecordingKube()
    op = operator(kube)
    monkeypatch.setattr(autoscale, "kopf_event", lambda *args: None)  # kopf's posting needs its own context
    key = ("ml", "qwen")
    op.record(key).scaling = cycle.Memory(metrics_since=(utc_now() - timedelta(minutes=2)).timestamp())
    pod = {
        "metadata": {"name": "qwen-1", "creationTimestamp": "2026-12-01T00:00:00+00:00"},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    deployment = {"metadata": {"generation": 1}, "spec": {"replicas": 2}, "status": {}}
    view = autoscale.FleetView(key, body(autoscaling=True), deployment, [pod, pod])
    with ThreadPoolExecutor(2) as pool:
        autoscale.autoscale(op, [view], prometheus, pool, lambda *_: (deployment, [pod, pod]))
    return op, kube


def test_a_scale_decision_links_to_the_prometheus_read_it_was_made_on(monkeypatch: pytest.MonkeyPatch) -> None:
    signals = metrics.Signals(latency=9.0, request_rate=12.0, waiting=40.0, running=16.0, kv_cache_usage=0.9)
    op, kube = _cycle(monkeypatch, FakePrometheus(signals))
    assert kube.scaled, "the test needs a cycle that scales"
    observe, decide, cycle_span = one(telemetry.OBSERVE), one(telemetry.DECIDE), one(telemetry.AUTOSCALE_CYCLE)
    assert [link.context.span_id for link in decide.links] == [observe.context.span_id]
    assert decide.links[0].context.trace_id == observe.context.trace_id
    assert decide.parent is not None and decide.parent.span_id == cycle_span.context.span_id
    assert (observe.attributes or {})[telemetry.QUERIES] == 5
    attributes = dict(decide.attributes or {})
    assert attributes[telemetry.REPLICAS_BEFORE] == 2
    assert attributes[telemetry.REPLICAS_AFTER] == kube.scaled[0] > 2
    assert attributes[telemetry.SCALED] is True
    assert attributes[telemetry.REASON] == op.records[("ml", "qwen")].written.last_scale_reason  # type: ignore[union-attr]
    assert (attributes[telemetry.LATENCY], attributes[telemetry.REQUEST_RATE]) == (9.0, 12.0)
    assert (attributes[telemetry.WAITING], attributes[telemetry.RUNNING]) == (40.0, 16.0)
    assert attributes[telemetry.KV_CACHE_USAGE] == 0.9
    assert (attributes[telemetry.SLO_TARGET], attributes[telemetry.SLO_PERCENTILE]) == (2.0, 90.0)
    assert attributes[telemetry.PODS_READY] == 2
    assert (attributes[telemetry.NAMESPACE], attributes[telemetry.INFERENCE]) == ("ml", "qwen")
    write = one(telemetry.STATUS_WRITE)
    assert write.parent is not None and write.parent.span_id == decide.context.span_id


def test_a_hold_on_an_outage_says_why_and_sets_no_signal(monkeypatch: pytest.MonkeyPatch) -> None:
    _, kube = _cycle(monkeypatch, FakePrometheus(None, outage="http://prometheus:9090 unreachable"))
    assert kube.scaled == []
    decide = one(telemetry.DECIDE)
    attributes = dict(decide.attributes or {})
    assert attributes[telemetry.SCALED] is False
    assert attributes[telemetry.REPLICAS_BEFORE] == attributes[telemetry.REPLICAS_AFTER] == 2
    assert attributes[telemetry.OUTAGE] == "http://prometheus:9090 unreachable"
    assert telemetry.LATENCY not in attributes and telemetry.REQUEST_RATE not in attributes  # unmeasured, not 0
    assert (one(telemetry.OBSERVE).attributes or {})[telemetry.OUTAGE] == attributes[telemetry.OUTAGE]
    assert [link.context.span_id for link in decide.links] == [one(telemetry.OBSERVE).context.span_id]


def test_spans_go_where_the_standard_variables_say_and_nowhere_without_them(monkeypatch: pytest.MonkeyPatch) -> None:
    assert telemetry.endpoint({}) is None
    assert telemetry.endpoint({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}) == "http://c:4317"
    both = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:4317"}
    assert telemetry.endpoint(both) == "http://t:4317"  # the signal's own variable wins, as in the SDK
    for name in telemetry.ENDPOINT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert telemetry.setup() is None


def test_tracing_ready_follows_the_collector_service_looked_up_once_for_all_fleets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events: list[tuple[str, ...]] = []
    monkeypatch.setattr(records, "kopf_event", lambda body, *event: events.append(event))
    kube = RecordingKube()
    op = operator(kube)
    _reconcile(op, 1, tracing=True)
    _reconcile(op, 2, tracing=True)
    assert kube.listed == 1  # cached for COLLECTOR_CACHE_SECONDS
    condition = next(c for c in kube.written[-1]["conditions"] if c["type"] == "TracingReady")
    assert (condition["status"], condition["reason"]) == ("False", "CollectorNotFound")
    assert events == [("Warning", "CollectorNotFound", condition["message"])]

    def tracing_ready(generation: int) -> tuple[str, str]:
        op.collectors.clear()  # as if the cache had expired
        _reconcile(op, generation, tracing=True)
        condition = next(c for c in kube.written[-1]["conditions"] if c["type"] == "TracingReady")
        return condition["status"], condition["reason"]

    kube.services = ["mmfleet-otel-collector"]
    assert tracing_ready(3) == ("False", "CollectorNotReady")  # a Service, no pod serving behind it
    kube.slices = [{"endpoints": [{"addresses": ["10.0.0.9"], "conditions": {"ready": False}}]}]
    assert tracing_ready(4) == ("False", "CollectorNotReady")
    kube.slices = [{"endpoints": [{"addresses": ["10.0.0.9"], "conditions": {"ready": True}}]}]
    assert tracing_ready(5) == ("True", "CollectorFound")
    kube.slices = 403  # no RBAC for the slices: the Service is taken on trust
    assert tracing_ready(6) == ("True", "CollectorFound")
    assert op.records[("ml", "qwen")].tracing is not None  # what the autoscaler's status writes carry


def _tracing_ready(op: Operator, kube: RecordingKube, generation: int) -> tuple[str, str, str]:
    _reconcile(op, generation, tracing=True)
    condition = next(c for c in kube.written[-1]["conditions"] if c["type"] == "TracingReady")
    return condition["status"], condition["reason"], condition["message"]


def test_endpoint_slices_that_fail_to_read_keep_what_was_seen_and_are_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only a 403 means "may not know, trust the Service"; any other failure must not turn a down collector True."""
    monkeypatch.setattr(records, "kopf_event", lambda body, *event: None)
    kube = RecordingKube()
    op = operator(kube)
    kube.services = ["mmfleet-otel-collector"]
    kube.slices = 503
    status, reason, message = _tracing_ready(op, kube, 1)  # nothing seen before: the condition says what failed
    assert (status, reason) == ("Unknown", "CollectorLookupFailed")
    assert "EndpointSlices of mmfleet-system/mmfleet-otel-collector" in message
    listed = kube.listed
    _tracing_ready(op, kube, 2)
    assert kube.listed == listed + 2  # not cached: the Service and its slices are asked again
    kube.slices = []
    assert _tracing_ready(op, kube, 3)[:2] == ("False", "CollectorNotReady")
    key = ("mmfleet-system", "mmfleet-otel-collector")
    seen = op.collectors[key] = dataclasses.replace(op.collectors[key], at=-1e9)  # as if it had expired
    kube.slices = 503
    assert _tracing_ready(op, kube, 4)[:2] == ("False", "CollectorNotReady")  # the ready count seen before holds
    assert op.collectors[key] == seen  # and the failure is not remembered


def test_the_missing_endpoint_slice_rbac_is_logged_once(monkeypatch: pytest.MonkeyPatch, caplog: Any) -> None:
    monkeypatch.setattr(records, "kopf_event", lambda body, *event: None)
    kube = RecordingKube()
    op = operator(kube)
    kube.services, kube.slices = ["mmfleet-otel-collector"], 403
    for generation in (1, 2):
        op.collectors.clear()
        assert _tracing_ready(op, kube, generation)[:2] == ("True", "CollectorFound")
    assert sum("may not list EndpointSlices" in r.getMessage() for r in caplog.records) == 1


def test_a_failed_service_look_up_says_what_failed_and_is_remembered_briefly(
    monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    monkeypatch.setattr(records, "kopf_event", lambda body, *event: None)
    kube = RecordingKube()
    op = operator(kube)
    kube.services = None
    status, reason, message = _tracing_ready(op, kube, 1)
    assert (status, reason) == ("Unknown", "CollectorLookupFailed")
    assert "listing Services in mmfleet-system" in message and "503" in message
    listed = kube.listed
    _tracing_ready(op, kube, 2)
    assert kube.listed == listed  # remembered: the next fleets neither ask nor warn again
    assert sum("looking up the collector Service" in r.getMessage() for r in caplog.records) == 1
    lookup = op.collectors[("mmfleet-system", "mmfleet-otel-collector")]
    op.collectors[("mmfleet-system", "mmfleet-otel-collector")] = dataclasses.replace(
        lookup, at=lookup.at - discovery.COLLECTOR_FAILURE_CACHE_SECONDS
    )
    kube.services, kube.slices = ["mmfleet-otel-collector"], [{"endpoints": [{"addresses": ["10.0.0.9"]}]}]
    assert _tracing_ready(op, kube, 3)[:2] == ("True", "CollectorFound")  # asked again once the failure expired


def test_the_operators_collector_setting_reaches_the_pods_and_tracing_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reused collector or a chart outside mmfleet-system: fleets without spec.tracing.endpoint follow the setting."""
    monkeypatch.setattr(records, "kopf_event", lambda body, *event: None)
    kube = RecordingKube()
    endpoint = "http://otel.observability.svc.corp.example:4317"
    op = operator(kube, collector_endpoint=endpoint, cluster_domain="corp.example")
    kube.services = ["otel"]
    kube.slices = [{"endpoints": [{"addresses": ["10.0.0.9"]}]}]
    status, reason, message = _tracing_ready(op, kube, 1)
    assert (status, reason) == ("True", "CollectorFound")
    assert endpoint in message and "Service observability/otel" in message
    deployment = next(m for m in kube.applied if m["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert args[args.index("--otlp-traces-endpoint") + 1] == endpoint


def test_a_service_the_spec_names_in_another_namespace_is_not_looked_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 23, item 9: TracingReady told an author who may only write MultimodalInferences whether a Service of
    that name exists in any namespace (CollectorFound against CollectorNotFound)."""
    monkeypatch.setattr(records, "kopf_event", lambda body, *event: None)
    kube = RecordingKube()
    kube.services = ["vault"]
    op = operator(kube)
    inference = fleet_body(generation=3, tracing=True)
    inference["spec"]["tracing"]["endpoint"] = "http://vault.secrets:4317"
    assert not reconcile_once(op, inference).retry
    condition = next(c for c in kube.written[-1]["conditions"] if c["type"] == "TracingReady")
    assert (condition["status"], condition["reason"]) == ("Unknown", "EndpointNotChecked")
    assert "namespace secrets, not this resource's" in condition["message"]
    assert kube.listed == 0, "nothing was asked about that namespace"

    inference["spec"]["tracing"]["endpoint"] = "http://vault:4317"  # the fleet's own namespace: looked up
    inference["metadata"]["generation"] = 4
    assert not reconcile_once(op, inference).retry
    condition = next(c for c in kube.written[-1]["conditions"] if c["type"] == "TracingReady")
    assert condition["reason"] != "EndpointNotChecked" and kube.listed >= 1
