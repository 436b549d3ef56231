"""``make demo``'s span summary on what the real collector wrote (``demo.span_summary``).

Spans go over OTLP/gRPC to the collector built by ``ensure_collector`` (``run_collector``, file exporter), the
request spans through the twin's own ``RequestSpans`` and the operator's under its names and attributes
(``mmfleet.telemetry``), with known timings: another fleet's slower request and scaled decision, and a decision
that held, must stay out of what the summary says about the demo's fleet. Needs the collector binary only.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Link

from mmfleet import telemetry
from mmfleet_lab import demo
from mmfleet_lab.cluster.collector import attributes, read_spans, run_collector
from mmfleet_lab.twin import spans as twin_spans

pytestmark = pytest.mark.integration

NAMESPACE, NAME, OTHER = "ml", "qwen-vl", "llama-vision"


def _pod(inference: str, pod: str) -> twin_spans.PodTracing:
    attributes = {"k8s.namespace.name": NAMESPACE, "k8s.pod.name": pod, telemetry.INFERENCE: inference}
    return twin_spans.PodTracing(tuple(sorted({**attributes, "service.name": inference}.items())), 1.0)


def _request(request_id: str, arrival: float, queue: float, ttft: float, e2e: float) -> twin_spans.RequestTiming:
    return twin_spans.RequestTiming(request_id, arrival, arrival + queue, 0.2, ttft, e2e, 900, 300)


def _operator_spans(endpoint: str, epoch: float) -> tuple[str, str]:
    """A reconcile, a Prometheus read and three decisions linked to it; the hex ids of the read and the scale-up."""
    provider = TracerProvider(resource=Resource.create({"service.name": telemetry.SERVICE_NAME}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    tracer = provider.get_tracer(telemetry.TRACER_NAME)
    at = int((epoch + 120.0) * 1e9)  # t=120s on the twin's clock
    tracer.start_span(telemetry.RECONCILE, attributes=telemetry.fleet(NAMESPACE, NAME, 1), start_time=at).end(
        at + 10**7
    )
    read = tracer.start_span(telemetry.OBSERVE, attributes={telemetry.QUERIES: 5}, start_time=at)
    read.end(at + 10**6)

    def decide(name: str, before: int, after: int, reason: str) -> str:
        attributes = {
            **telemetry.fleet(NAMESPACE, name, 1),
            telemetry.REPLICAS_BEFORE: before,
            telemetry.REPLICAS_AFTER: after,
            telemetry.SCALED: before != after,
            telemetry.REASON: reason,
            telemetry.LATENCY: 4.1,
            telemetry.REQUEST_RATE: 19.5,
            telemetry.SLO_PERCENTILE: 90,
        }
        span = tracer.start_span(
            telemetry.DECIDE, attributes=attributes, links=[Link(read.get_span_context())], start_time=at + 2 * 10**6
        )
        span.end(at + 3 * 10**6)
        return trace.format_span_id(span.get_span_context().span_id)

    scale_up = decide(NAME, 1, 3, "P90 4.1 s over the 3 s target")
    decide(NAME, 3, 3, "within the SLO")
    decide(OTHER, 2, 4, "the other fleet's scale-up")
    provider.shutdown()
    return trace.format_span_id(read.get_span_context().span_id), scale_up


def test_the_demo_summary_reads_the_collectors_file(tmp_path: Path) -> None:
    epoch = time.time() - 600.0
    with run_collector(tmp_path / "collector") as collector:
        observation, _ = _operator_spans(collector.endpoint, epoch)
        requests = twin_spans.RequestSpans(twin_spans.otlp_exporter(collector.endpoint), int(epoch * 1e9))
        ours, theirs = _pod(NAME, "qwen-vl-7d9f-abcde"), _pod(OTHER, "llama-vision-5c4b-fghij")
        requests.emit("uid-1", ours, _request("a", arrival=100.0, queue=0.5, ttft=1.0, e2e=3.0))
        requests.emit("uid-1", ours, _request("slow", arrival=150.0, queue=5.0, ttft=6.0, e2e=9.0))
        requests.emit("uid-2", theirs, _request("slower", arrival=150.0, queue=15.0, ttft=16.0, e2e=20.0))
        requests.shutdown()
    spans = read_spans(collector.output)
    lines = demo.span_summary(spans, collector.output, NAMESPACE, NAME, epoch)
    text = "\n".join(lines)

    assert str(collector.output) in lines[0]
    assert "reconcile 1," in text and "scale decision 3, 1 of them scaling qwen-vl" in text, text
    assert "llm_request 3, 2 of them ml/qwen-vl's, and 12 phase spans under them" in text, text
    slowest = next(i for i, line in enumerate(lines) if "slowest request of ml/qwen-vl" in line)
    assert "9.00 s end to end" in lines[slowest] and "t=150s" in lines[slowest], lines[slowest]
    assert "900 prompt and 300 output tokens, pod qwen-vl-7d9f-abcde" in lines[slowest]
    slow = next(s for s in spans if attributes(s.get("attributes", [])).get(twin_spans.REQUEST_ID) == "slow")
    assert lines[slowest].endswith(f"trace {slow['traceId']}")
    phases = [line.split()[:2] for line in lines[slowest + 1 : slowest + 5]]
    assert phases == [["queue", "5.00"], ["encoder", "0.20"], ["prefill", "0.80"], ["decode", "3.00"]], lines
    heading = next(i for i, line in enumerate(lines) if line.startswith("   scale decisions of ml/qwen-vl"))
    decisions = lines[heading + 1 :]
    assert len(decisions) == 2, decisions  # the one scale-up: its line and its reason's
    assert (
        f"t=  120s  1 -> 3 replicas on P90 4.10 s, 19.5 req/s, linked to the Prometheus read {observation}"
        in (decisions[0])
    ), decisions
    assert decisions[1].strip() == "P90 4.1 s over the 3 s target"
