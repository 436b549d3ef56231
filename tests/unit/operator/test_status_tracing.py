"""TracingReady: where a fleet's spans go, or why they are lost, from what the handler looked up."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from mmfleet import clouds
from mmfleet.api import MultimodalInference, MultimodalInferenceStatus
from mmfleet.status import Observed, TracingSeen, collector_service, compute_status, events
from tests.helpers.repo import spec_doc

NOW = datetime(2026, 12, 1, 21, 0, tzinfo=UTC)
COLLECTOR = ("mmfleet-system", "mmfleet-otel-collector")


def inference(**tracing: Any) -> MultimodalInference:
    doc = spec_doc(tracing=tracing)
    doc["metadata"]["generation"] = 4
    return MultimodalInference.model_validate(doc)


def tracing_condition(status: MultimodalInferenceStatus) -> tuple[str, str, str] | None:
    found = [c for c in status.conditions if c.type == "TracingReady"]
    return (found[0].status, found[0].reason, found[0].message) if found else None


@pytest.mark.parametrize(
    ("endpoint", "service"),
    [
        (clouds.COLLECTOR_ENDPOINT, COLLECTOR),
        ("http://otel.observability.svc.cluster.local:4317", ("observability", "otel")),
        ("collector:4317", ("ml", "collector")),  # a bare name is a Service of the pod's own namespace
        ("http://collector:4317", ("ml", "collector")),
        ("https://xray.us-east-1.amazonaws.com/v1/traces", None),
        ("http://10.0.0.7:4317", None),
        ("http://localhost:4317", None),
        ("http://a.b.svc.example.com:4317", None),
        ("http://otel.observability:4317", ("observability", "otel")),  # name.ns, through the search path
        ("otel.observability:4317", ("observability", "otel")),
        ("http://otel.observability.svc.cluster.local.:4317", ("observability", "otel")),  # absolute
        ("http://otel.observability.svc.:4317", None),  # absolute without the cluster domain: no Service
        ("http://otel.observability.:4317", None),
        ("http://collector.:4317", None),
        ("http://[::1]:4317", None),
        ("http://4317bad:4317", None),  # not a Service name
    ],
)
def test_the_service_an_endpoint_names_in_cluster_dns(endpoint: str, service: tuple[str, str] | None) -> None:
    assert collector_service(endpoint, "ml") == service


@pytest.mark.parametrize(
    ("endpoint", "service"),
    [
        ("http://otel.observability.svc.corp.example:4317", ("observability", "otel")),
        ("http://otel.observability.svc.corp.example.:4317", ("observability", "otel")),
        ("http://otel.observability.svc:4317", ("observability", "otel")),
        ("http://otel.observability.svc.cluster.local:4317", None),  # not this cluster's domain
    ],
)
def test_a_cluster_domain_of_its_own(endpoint: str, service: tuple[str, str] | None) -> None:
    assert collector_service(endpoint, "ml", cluster_domain="corp.example") == service


def test_no_condition_unless_tracing_is_enabled() -> None:
    seen = TracingSeen(clouds.COLLECTOR_ENDPOINT, False, "eks", COLLECTOR, False)
    assert tracing_condition(compute_status(inference(enabled=False), Observed(tracing=seen), None, NOW)) is None


def test_the_cloud_collector_found_says_where_spans_go() -> None:
    seen = TracingSeen(clouds.COLLECTOR_ENDPOINT, False, "eks", COLLECTOR, True)
    status, reason, message = tracing_condition(
        compute_status(inference(enabled=True), Observed(tracing=seen), None, NOW)
    ) or ("", "", "")
    assert (status, reason) == ("True", "CollectorFound")
    assert (
        clouds.COLLECTOR_ENDPOINT in message and "eks" in message and "mmfleet-system/mmfleet-otel-collector" in message
    )


def test_a_missing_collector_is_false_with_the_service_and_the_fix_and_a_warning() -> None:
    fleet = inference(enabled=True)
    seen = TracingSeen(clouds.COLLECTOR_ENDPOINT, False, "aks", COLLECTOR, False)
    new = compute_status(fleet, Observed(tracing=seen), None, NOW)
    status, reason, message = tracing_condition(new) or ("", "", "")
    assert (status, reason) == ("False", "CollectorNotFound")
    assert "no Service mmfleet-otel-collector in namespace mmfleet-system" in message
    assert "install the collector" in message
    assert ("Warning", "CollectorNotFound", message) in events(None, new)
    # the user's own endpoint: the fix is in the spec
    own = TracingSeen("http://otel:4317", True, "aks", ("ml", "otel"), False)
    _, _, message = tracing_condition(compute_status(fleet, Observed(tracing=own), None, NOW)) or ("", "", "")
    assert "spec.tracing.endpoint" in message and "namespace ml" in message


def test_an_endpoint_outside_the_cluster_is_unknown_not_trusted_and_named() -> None:
    seen = TracingSeen("https://otlp.example.com:4317", True, "generic", None, None)
    fleet = inference(enabled=True, endpoint="https://otlp.example.com:4317")
    new = compute_status(fleet, Observed(tracing=seen), None, NOW)
    status, reason, message = tracing_condition(new) or ("", "", "")
    assert (status, reason) == ("Unknown", "EndpointNotChecked")
    assert "https://otlp.example.com:4317" in message and "spec.tracing.endpoint" in message
    assert "not checked" in message
    assert not [e for e in events(None, new) if e[1] == "EndpointNotChecked"]  # nothing is known to be wrong


def test_name_dot_namespace_without_that_service_may_be_a_host_outside() -> None:
    """``otel.observability`` resolves outside the cluster when no such Service exists: not lost, not checked."""
    endpoint = "http://otel.observability:4317"
    seen = TracingSeen(endpoint, True, "generic", ("observability", "otel"), False)
    status, reason, message = tracing_condition(
        compute_status(inference(enabled=True, endpoint=endpoint), Observed(tracing=seen), None, NOW)
    ) or ("", "", "")
    assert (status, reason) == ("Unknown", "EndpointNotChecked")
    assert "no Service otel in namespace observability" in message
    found = TracingSeen(endpoint, True, "generic", ("observability", "otel"), True, ready=1)
    assert (tracing_condition(compute_status(inference(enabled=True), Observed(tracing=found), None, NOW)) or ("",))[
        :2
    ] == ("True", "CollectorFound")


def test_a_failed_look_up_says_what_failed() -> None:
    seen = TracingSeen(clouds.COLLECTOR_ENDPOINT, False, "eks", COLLECTOR, failed="listing Services in x: 503 Nope")
    status, reason, message = tracing_condition(
        compute_status(inference(enabled=True), Observed(tracing=seen), None, NOW)
    ) or ("", "", "")
    assert (status, reason) == ("Unknown", "CollectorLookupFailed")
    assert "listing Services in x: 503 Nope" in message and "mmfleet-system/mmfleet-otel-collector" in message


def test_without_a_look_up_the_last_condition_stays_and_the_first_is_unknown() -> None:
    fleet = inference(enabled=True)
    first = compute_status(fleet, Observed(), None, NOW)
    assert (tracing_condition(first) or ("",))[0] == "Unknown"
    seen = TracingSeen(clouds.COLLECTOR_ENDPOINT, False, "eks", COLLECTOR, False)
    missing = compute_status(fleet, Observed(tracing=seen), first, NOW)
    later = compute_status(fleet, Observed(), missing, NOW)  # the autoscaler's write, which looks nothing up
    assert tracing_condition(later) == tracing_condition(missing)


def test_a_collector_service_without_a_ready_pod_loses_the_spans_and_says_where_to_look() -> None:
    seen = TracingSeen(clouds.COLLECTOR_ENDPOINT, False, "aks", COLLECTOR, True, ready=0)
    new = compute_status(inference(enabled=True), Observed(tracing=seen), None, NOW)
    status, reason, message = tracing_condition(new) or ("", "", "")
    assert (status, reason) == ("False", "CollectorNotReady")
    assert "mmfleet-system/mmfleet-otel-collector has no ready endpoint" in message
    assert "Secret" in message and "kubectl -n mmfleet-system get pods" in message
    assert ("Warning", "CollectorNotReady", message) in events(None, new)
    unreadable = TracingSeen(clouds.COLLECTOR_ENDPOINT, False, "aks", COLLECTOR, True, ready=None)
    trusted = compute_status(inference(enabled=True), Observed(tracing=unreadable), None, NOW)
    assert (tracing_condition(trusted) or ("",))[0] == "True"  # no RBAC for EndpointSlices: the Service is trusted
