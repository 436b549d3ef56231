"""The operator's own spans: each reconcile, apply, status write, Prometheus read and scale decision.

Configured the standard way, so the operator's Deployment needs nothing of its own: spans leave over
OTLP/gRPC when ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (the
SDK's exporter reads them, with ``OTEL_EXPORTER_OTLP_HEADERS``, ``_INSECURE`` and ``_CERTIFICATE``),
``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` name the process, and ``OTEL_TRACES_SAMPLER``
samples; with no endpoint the API's default provider makes every span a no-op that costs nothing.

The attribute names below are the contract between the handlers, the tests and a user's queries in
the tracing service. A decision span carries a link to the span of the Prometheus read it decided on,
so a scale-up can be followed back to the latency and request rate that caused it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Final

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, Tracer
from opentelemetry.util.types import AttributeValue

log = logging.getLogger("mmfleet")

TRACER_NAME: Final = "mmfleet"
SERVICE_NAME: Final = "mmfleet-operator"  # unless OTEL_SERVICE_NAME says otherwise
ENDPOINT_VARIABLES: Final = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")

# Span names.
RECONCILE: Final = "mmfleet.reconcile"
APPLY: Final = "mmfleet.apply"
STATUS_WRITE: Final = "mmfleet.status.write"
AUTOSCALE_CYCLE: Final = "mmfleet.autoscale.cycle"
OBSERVE: Final = "mmfleet.autoscale.observe"  # the cycle's batched Prometheus read
DECIDE: Final = "mmfleet.autoscale.decide"

# Attributes. The resource's own follow the Kubernetes semantic conventions.
NAMESPACE: Final = "k8s.namespace.name"
INFERENCE: Final = "mmfleet.inference"
GENERATION: Final = "mmfleet.generation"
CLOUD: Final = "mmfleet.cloud"
BACKEND: Final = "mmfleet.backend"
CHILD_KIND: Final = "mmfleet.child.kind"
CHILD_NAME: Final = "mmfleet.child.name"
CHILDREN: Final = "mmfleet.children"
PHASE: Final = "mmfleet.status.phase"
FLEETS: Final = "mmfleet.autoscale.fleets"
QUERIES: Final = "mmfleet.prometheus.queries"
OUTAGE: Final = "mmfleet.prometheus.outage"
REPLICAS_BEFORE: Final = "mmfleet.replicas.before"
REPLICAS_AFTER: Final = "mmfleet.replicas.after"
SCALED: Final = "mmfleet.scaled"
REASON: Final = "mmfleet.decision.reason"
LATENCY: Final = "mmfleet.signal.latency"  # s, the SLO's percentile over its window
REQUEST_RATE: Final = "mmfleet.signal.request_rate"  # completions/s
WAITING: Final = "mmfleet.signal.waiting"
RUNNING: Final = "mmfleet.signal.running"
KV_CACHE_USAGE: Final = "mmfleet.signal.kv_cache_usage"
MISSING: Final = "mmfleet.signal.missing"
SLO_TARGET: Final = "mmfleet.slo.target"  # s
SLO_PERCENTILE: Final = "mmfleet.slo.percentile"
PODS_READY: Final = "mmfleet.pods.ready"
PODS_STARTING: Final = "mmfleet.pods.starting"
PODS_UNSCHEDULABLE: Final = "mmfleet.pods.unschedulable"
COLD_START: Final = "mmfleet.cold_start"  # s, as the policy planned with it

Attributes = dict[str, AttributeValue]


def endpoint(environ: Mapping[str, str] | None = None) -> str | None:
    """Where the operator's spans go, from the standard variables; None when they go nowhere."""
    env = os.environ if environ is None else environ
    return next((env[name] for name in ENDPOINT_VARIABLES if env.get(name)), None)


def setup(exporter: SpanExporter | None = None) -> TracerProvider | None:
    """Install the SDK's provider when there is somewhere to send spans (or ``exporter`` is given, for tests).

    Returns the provider, to be shut down at exit so the last batch is sent; None leaves the
    API's no-op provider in place.
    """
    where = endpoint()
    if exporter is None:
        if where is None:
            log.info("operator spans: off (no OTEL_EXPORTER_OTLP_ENDPOINT)")
            return None
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()  # endpoint, headers and TLS from the environment
    provider = TracerProvider(resource=resource())
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    log.info("operator spans: OTLP to %s", where or type(exporter).__name__)
    return provider


def resource() -> Resource:
    """The operator's resource as the SDK builds it from the environment: ``OTEL_RESOURCE_ATTRIBUTES`` (the pod and
    namespace its Deployment passes from the downward API) and ``OTEL_SERVICE_NAME``.

    ``SERVICE_NAME`` is given only when ``OTEL_SERVICE_NAME`` is unset: attributes given to ``Resource.create``
    override the environment's.
    """
    attributes: Attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": SERVICE_NAME}
    return Resource.create(attributes)


def tracer() -> Tracer:
    """The operator's tracer, from whichever provider is installed when it is asked for."""
    return trace.get_tracer(TRACER_NAME)


def fleet(namespace: str, name: str, generation: int | None) -> Attributes:
    """The attributes that say which fleet, at which generation of its spec, a span is about."""
    found: Attributes = {NAMESPACE: namespace, INFERENCE: name}
    if generation is not None:
        found[GENERATION] = generation
    return found


def set_present(span: Span, attributes: Mapping[str, AttributeValue | None]) -> None:
    """Set the attributes that have a value: an unmeasured signal is left out, never written as 0."""
    span.set_attributes({k: v for k, v in attributes.items() if v is not None})
