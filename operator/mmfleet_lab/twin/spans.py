"""Request spans from the twin's simulated pods, as their traced inference servers would send them over OTLP.

A pod sends spans only if its server would: when the rendered pod carries the OTel environment that
``mmfleet.backends.otel_env`` sets with ``spec.tracing.enabled``. Its resource is what the server's SDK
would build from that environment, resolved as the kubelet resolves it (``fieldRef`` from the pod,
``$(VAR)`` from the variables before), and its sampler is the parent-based ratio of
``OTEL_TRACES_SAMPLER_ARG``. Only the endpoint differs: the twin runs outside the cluster, so it sends
to the collector it is given.

One ``llm_request`` span per finished request, from arrival to the last token, with the
``gen_ai.*`` latency attributes vLLM's request span carries (names from ``vllm/tracing/utils.py``
``SpanAttributes``), and one child span per phase: ``queue`` (arrival, request overhead and image
preprocessing, waiting for a seat), ``encoder`` (the vision encoder, run in the first step that admits
the request), ``prefill`` (to the first token) and ``decode`` (to the last). A request the client gave up
on, or that was dropped for want of a serving pod, sends nothing, as none reaches ``do_tracing``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import unquote

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind

REQUEST_SPAN: Final = "llm_request"
PHASES: Final = ("queue", "encoder", "prefill", "decode")
# vLLM's SpanAttributes (vllm/tracing/utils.py).
REQUEST_ID: Final = "gen_ai.request.id"
PROMPT_TOKENS: Final = "gen_ai.usage.prompt_tokens"
COMPLETION_TOKENS: Final = "gen_ai.usage.completion_tokens"
TIME_IN_QUEUE: Final = "gen_ai.latency.time_in_queue"
TIME_TO_FIRST_TOKEN: Final = "gen_ai.latency.time_to_first_token"
E2E: Final = "gen_ai.latency.e2e"
TIME_IN_PREFILL: Final = "gen_ai.latency.time_in_model_prefill"
TIME_IN_DECODE: Final = "gen_ai.latency.time_in_model_decode"
ENCODER_MS: Final = "mmfleet.twin.encoder_ms"  # the twin's own: vLLM has no per-request encoder time


@dataclass(frozen=True)
class PodTracing:
    """What a pod's environment tells its server's OTel SDK: the resource attributes and the sampling ratio."""

    attributes: tuple[tuple[str, str], ...]
    ratio: float


def kubelet_env(env: list[dict[str, Any]], pod: Mapping[str, Any]) -> dict[str, str]:
    """A container's environment as the kubelet builds it: ``fieldRef`` from the pod's metadata, and
    ``$(VAR)`` replaced by the value of a variable defined before it."""
    meta = pod.get("metadata") or {}
    fields = {"metadata.namespace": meta.get("namespace", ""), "metadata.name": meta.get("name", "")}
    out: dict[str, str] = {}
    for item in env:
        name = str(item.get("name", ""))
        if "valueFrom" in item:
            path = ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")
            out[name] = fields.get(path, "")
            continue
        value = str(item.get("value", ""))
        for known, resolved in out.items():
            value = value.replace(f"$({known})", resolved)
        out[name] = value
    return out


def pod_tracing(pod: Mapping[str, Any]) -> PodTracing | None:
    """The pod's tracing as its server would set it up; None when its spec turns tracing off."""
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    env = kubelet_env(containers[0].get("env") or [], pod)
    if "OTEL_SERVICE_NAME" not in env:
        return None
    attributes: dict[str, str] = {}
    for item in env.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):  # as the SDK's OTELResourceDetector
        key, eq, value = item.partition("=")
        if eq:
            attributes[key.strip()] = unquote(value.strip())
    attributes["service.name"] = env["OTEL_SERVICE_NAME"]
    try:
        ratio = float(env.get("OTEL_TRACES_SAMPLER_ARG", "1"))
    except ValueError:
        ratio = 1.0
    return PodTracing(tuple(sorted(attributes.items())), min(max(ratio, 0.0), 1.0))


@dataclass(frozen=True)
class RequestTiming:
    """One finished request, in seconds since the twin started."""

    request_id: str
    arrival: float
    started: float  # first admitted to a running batch
    encoder: float  # s of vision encoder
    ttft: float
    e2e: float
    prompt_tokens: int
    output_tokens: int


class RequestSpans:
    """One tracer provider per pod (its own resource and sampler), exporting through ``exporter()``."""

    def __init__(self, exporter: Callable[[], SpanExporter], epoch_ns: int) -> None:
        self.exporter = exporter
        self.epoch_ns = epoch_ns  # the wall clock when the twin's clock read 0
        self.providers: dict[str, TracerProvider] = {}
        self.sent = 0

    def _tracer(self, pod_uid: str, tracing: PodTracing) -> trace.Tracer:
        provider = self.providers.get(pod_uid)
        if provider is None:
            provider = TracerProvider(
                resource=Resource.create(dict(tracing.attributes)),
                sampler=ParentBased(TraceIdRatioBased(tracing.ratio)),
            )
            provider.add_span_processor(BatchSpanProcessor(self.exporter()))
            self.providers[pod_uid] = provider
        return provider.get_tracer("mmfleet_lab.twin")

    def _ns(self, t: float) -> int:
        return self.epoch_ns + round(t * 1e9)

    def emit(self, pod_uid: str, tracing: PodTracing, req: RequestTiming) -> None:
        """The request's span and its phases, timed as the engine ran them."""
        tracer = self._tracer(pod_uid, tracing)
        first_token, done = req.arrival + req.ttft, req.arrival + req.e2e
        started = min(max(req.started, req.arrival), first_token)
        encoded = min(started + req.encoder, first_token)
        root = tracer.start_span(
            REQUEST_SPAN,
            kind=SpanKind.SERVER,
            start_time=self._ns(req.arrival),
            attributes={
                REQUEST_ID: req.request_id,
                PROMPT_TOKENS: req.prompt_tokens,
                COMPLETION_TOKENS: req.output_tokens,
                TIME_IN_QUEUE: started - req.arrival,
                TIME_TO_FIRST_TOKEN: req.ttft,
                E2E: req.e2e,
                TIME_IN_PREFILL: first_token - encoded,
                TIME_IN_DECODE: done - first_token,
                ENCODER_MS: req.encoder * 1000.0,
            },
        )
        if root.is_recording():  # sampled out: no children either
            parent = trace.set_span_in_context(root)
            bounds = (req.arrival, started, encoded, first_token, done)
            for name, start, end in zip(PHASES, bounds, bounds[1:], strict=False):
                if end > start or name in ("prefill", "decode"):
                    tracer.start_span(name, context=parent, start_time=self._ns(start)).end(end_time=self._ns(end))
            self.sent += 1
        root.end(end_time=self._ns(done))

    def shutdown(self) -> None:
        """Send what is batched and stop every pod's exporter."""
        for provider in self.providers.values():
            provider.shutdown()
        self.providers.clear()


def otlp_exporter(endpoint: str) -> Callable[[], SpanExporter]:
    """OTLP/gRPC to ``endpoint``, in plaintext for ``http://`` (the SDK's rule), as the backends send."""

    def make() -> SpanExporter:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=endpoint)

    return make
