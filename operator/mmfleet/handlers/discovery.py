"""What the operator looks up beside the fleets, cached for all of them: the cloud (from the nodes), whether the
Prometheus Operator's CRDs are served, the collector Services that tracing fleets send to, shared cache claims."""

from __future__ import annotations

import time

from mmfleet import clouds, render, routing, status
from mmfleet.api import MultimodalInference
from mmfleet.handlers.records import CollectorLookup, FleetRecord, Operator, log
from mmfleet.kube import error_text, is_forbidden

MONITORING_KIND = ("monitoring.coreos.com/v1", "PodMonitor")
# Nodes and installed CRDs change rarely; look again after this long.
DISCOVERY_CACHE_SECONDS = 600
# How long one look-up of a collector Service (and its ready endpoints) serves all fleets. A collector installed,
# removed or left without ready pods shows in TracingReady at the fleet's next reconcile after that (reconciles follow
# the fleet's own pod and Deployment events, else the resync tick): up to RESYNC_SECONDS + COLLECTOR_CACHE_SECONDS.
COLLECTOR_CACHE_SECONDS = 60
# A failed look-up is remembered this long, so the fleets reconciled meanwhile neither retry nor warn one by one.
COLLECTOR_FAILURE_CACHE_SECONDS = 10


def resolve_cloud(op: Operator, inference: MultimodalInference) -> str:
    if inference.spec.cloud != "auto":
        return inference.spec.cloud
    if op.config.default_cloud != "auto":
        return op.config.default_cloud
    with op.discovery_lock:
        if time.monotonic() - op.detected_at > DISCOVERY_CACHE_SECONDS:
            op.detected_cloud = clouds.detect(op.get_kube().provider_ids())
            op.detected_at = time.monotonic()
        return op.detected_cloud


def served(op: Operator, api_version: str, kind: str) -> bool:
    """Whether a kind whose CRD may be missing is served; asked again after ``DISCOVERY_CACHE_SECONDS``, so one
    installed or removed later is picked up."""
    with op.discovery_lock:
        known = op.served.get((api_version, kind))
        if known is None or time.monotonic() - known[1] > DISCOVERY_CACHE_SECONDS:
            known = (op.get_kube().has_api(api_version, kind), time.monotonic())
            op.served[(api_version, kind)] = known
        return known[0]


def monitoring_crds(op: Operator) -> bool:
    """Whether the Prometheus Operator's PodMonitor is served."""
    return served(op, *MONITORING_KIND)


def routing_crds(op: Operator, inference: MultimodalInference) -> routing.RoutingCrds:
    """Whether the InferencePool and, for a fleet naming a Gateway, the HTTPRoute are served; asked only of fleets
    in routing mode inferencePool (the others render neither)."""
    spec = inference.spec.routing
    if spec.mode != "inferencePool":
        return routing.RoutingCrds()
    pool = served(op, routing.POOL_API_VERSION, "InferencePool")
    route = spec.gateway is None or served(op, routing.HTTPROUTE_API_VERSION, "HTTPRoute")
    return routing.RoutingCrds(pool, route)


def forget_served(op: Operator, api_version: str, kind: str) -> None:
    """A kind found gone on a write: discovery is asked afresh at the next look."""
    with op.discovery_lock:
        op.served.pop((api_version, kind), None)


def cache_problem(op: Operator, record: FleetRecord, inference: MultimodalInference) -> tuple[str, str] | None:
    """The shared cache's claim as it is now (one request, only for fleets that share a claim), remembered
    for the autoscaler's status writes."""
    meta, cache = inference.metadata, inference.spec.model_cache
    problem = None
    if cache.volume == "shared" and cache.claim_name is not None:
        claim = op.get_kube().get("v1", "PersistentVolumeClaim", meta.namespace, cache.claim_name)
        problem = status.shared_cache_problem(inference, claim)
    record.cache_problem = problem
    return problem


class _EndpointsUnreadableError(Exception):
    """Reading a Service's EndpointSlices failed for another reason than RBAC."""


def _ready_endpoints(op: Operator, namespace: str, service: str) -> int | None:
    """The Service's ready endpoints, from its EndpointSlices; None when the operator may not read them (403).

    Any other failure raises ``_EndpointsUnreadableError``: a collector that is down must not be taken on trust.
    An endpoint whose ``ready`` is unset counts as ready, as the EndpointSlice API defines it.
    """
    try:
        slices = op.get_kube().list_objects(
            "discovery.k8s.io/v1", "EndpointSlice", namespace, selector=f"kubernetes.io/service-name={service}"
        )
    except Exception as error:
        if not is_forbidden(error):
            text = error_text(error)
            raise _EndpointsUnreadableError(f"listing the EndpointSlices of {namespace}/{service}: {text}") from error
        if not op.endpointslices_forbidden_logged:
            op.endpointslices_forbidden_logged = True
            log.warning(
                "may not list EndpointSlices (%s): TracingReady checks that collector Services exist, not that a "
                "collector pod serves behind them; grant list on discovery.k8s.io endpointslices",
                error_text(error),
            )
        return None
    endpoints = [e for s in slices for e in s.get("endpoints") or []]
    return sum((e.get("conditions") or {}).get("ready") is not False for e in endpoints)


def _collector(op: Operator, namespace: str, name: str) -> CollectorLookup:
    """The Service and its ready endpoints, looked up at most once per ``COLLECTOR_CACHE_SECONDS`` for all fleets.

    A failed Service look-up is remembered for ``COLLECTOR_FAILURE_CACHE_SECONDS`` and says what failed. A failed
    EndpointSlice read keeps the ready count seen before, and is not remembered, so the next fleet tries again.
    A list by name rather than a get: the operator's ClusterRole lists Services, it does not get them.
    """
    known = op.collectors.get((namespace, name))
    now = time.monotonic()
    if known is not None:
        ttl = COLLECTOR_FAILURE_CACHE_SECONDS if known.failed is not None else COLLECTOR_CACHE_SECONDS
        if now - known.at < ttl:
            return known
    try:
        found = bool(op.get_kube().list_objects("v1", "Service", namespace, field_selector=f"metadata.name={name}"))
    except Exception as error:
        failed = f"listing Services in {namespace}: {error_text(error)}"
        log.warning("looking up the collector Service %s/%s failed: %s", namespace, name, failed)
        lookup = CollectorLookup(None, None, now, failed)
        op.collectors[(namespace, name)] = lookup
        return lookup
    try:
        ready = _ready_endpoints(op, namespace, name) if found else None
    except _EndpointsUnreadableError as error:
        log.warning("%s", error)
        before = known.ready if known is not None and known.found else None
        if before is None:
            return CollectorLookup(found, None, now, str(error))
        return CollectorLookup(found, before, now)
    lookup = CollectorLookup(found, ready, now)
    op.collectors[(namespace, name)] = lookup
    return lookup


def tracing_seen(
    op: Operator, record: FleetRecord, inference: MultimodalInference, cloud: str
) -> status.TracingSeen | None:
    """Where the fleet's spans go and whether that collector's Service exists, remembered for the autoscaler."""
    meta, tracing = inference.metadata, inference.spec.tracing
    seen = None
    if tracing.enabled:
        endpoint = render.tracing_endpoint(inference, clouds.get(cloud), op.config.collector_endpoint) or ""
        service = status.collector_service(endpoint, meta.namespace, op.config.cluster_domain)
        ours = status.collector_service(op.config.collector_endpoint, meta.namespace, op.config.cluster_domain)
        if service is None:
            seen = status.TracingSeen(endpoint, bool(tracing.endpoint), cloud)
        elif tracing.endpoint and service[0] != meta.namespace and service != ours:
            seen = status.TracingSeen(endpoint, True, cloud, service, elsewhere=True)
        else:
            lookup = _collector(op, *service)
            seen = status.TracingSeen(
                endpoint, bool(tracing.endpoint), cloud, service, lookup.found, lookup.ready, lookup.failed
            )
    record.tracing = seen
    return seen
