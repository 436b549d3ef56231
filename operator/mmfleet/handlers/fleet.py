"""The fleet's handlers: reconcile, drift repair and pruning, status from what runs.

One reconcile: parse the spec, resolve the cloud, render, check that no child's name is taken by an
object this fleet does not control, server-side apply every child, observe, write status. Children
are watched too, so a child deleted or edited by hand is re-applied, and pod or Deployment changes
refresh the parent's status. kopf indexes keep the fleets, Deployments and pods in memory, so a
status refresh costs one API request. A reconcile kopf does not retry (a drift repair, a refused
apply) is retried by ``retry_forever`` with a growing delay.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import json
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any, cast

import kopf
from opentelemetry.trace import Span

from mmfleet import clouds, metrics_export, render, status, telemetry
from mmfleet.api import GROUP, KIND, PLURAL, VERSION, MultimodalInference
from mmfleet.handlers.state import (
    STATE,
    Body,
    CollectorLookup,
    Key,
    Retry,
    get_kube,
    last_status,
    log,
    parse_spec,
    previous_status,
    remember_kopf_context,
    render_children,
    utc_now,
    write_status,
)
from mmfleet.kube import (
    AUTOSCALER_FIELD_MANAGER,
    NamespaceTerminatingError,
    RefusedError,
    RetryableError,
    error_text,
    is_forbidden,
)
from mmfleet.render import FIELD_MANAGER, INFERENCE_LABEL, SpecError

CHILD_LABELS: dict[str, Any] = {
    INFERENCE_LABEL: kopf.PRESENT,
    "app.kubernetes.io/managed-by": "mmfleet",
}
POD_LABELS: dict[str, Any] = {INFERENCE_LABEL: kopf.PRESENT}
# Nodes and installed CRDs change rarely; look again after this long.
DISCOVERY_CACHE_SECONDS = 600
# Status is event-driven; this periodic recompute from the indexes only catches a missed event.
RESYNC_SECONDS = 300
# Pod and Deployment events refresh their fleet's status at most once in this many seconds.
STATUS_DEBOUNCE = 1.0
INDEXES = ("fleets", "fleet_deployments", "fleet_pods")
WORKER_IDLE_SECONDS = 1.0
# How long one look-up of a collector Service (and its ready endpoints) serves all fleets. A collector installed,
# removed or left without ready pods shows in TracingReady at the fleet's next reconcile or status refresh after
# that (status refreshes follow the fleet's own pod and Deployment events, else RESYNC_SECONDS): up to
# RESYNC_SECONDS + COLLECTOR_CACHE_SECONDS.
COLLECTOR_CACHE_SECONDS = 60
# A failed look-up is remembered this long, so the fleets reconciled meanwhile neither retry nor warn one by one.
COLLECTOR_FAILURE_CACHE_SECONDS = 10
# A reconcile kopf does not retry is tried again after RETRY_FIRST_SECONDS, doubling up to RETRY_MAX_SECONDS.
RETRY_FIRST_SECONDS = 5.0
RETRY_MAX_SECONDS = 300.0
RETRY_TICK_SECONDS = 1.0
# A Retry-After is waited for as asked, within these bounds (0 would spin; the header is the server's to set), for the
# first RETRY_AFTER_ATTEMPTS retries, as client-go honours it for 10 retries of a request (rest.Request's maxRetries);
# after that the doubling backoff starts again from RETRY_FIRST_SECONDS, never shorter than the header.
RETRY_AFTER_MIN_SECONDS = 1
RETRY_AFTER_MAX_SECONDS = 60
RETRY_AFTER_ATTEMPTS = 10
# kopf retries a reconcile that raised TemporaryError after its delay; retry_forever reconciles the fleet this much
# later if kopf has not: kopf drops the retry when the spec returns to what it last handled (a scale 1 -> 2 that failed
# half way, then back to 1), which would leave what the failed attempt applied (2 replicas) in place.
KOPF_RETRY_GRACE_SECONDS = 5.0
# The API server's own message is kept whole up to this length in a condition.
MESSAGE_LIMIT = 2048


def retry_delay(attempts: int) -> float:
    """Seconds before retry number ``attempts`` (0 for the first): doubling, bounded, so a refusal never spins."""
    return min(RETRY_MAX_SECONDS, RETRY_FIRST_SECONDS * 2.0 ** min(attempts, 16))


def api_retry_delay(retry_after: int | None, attempts: int) -> float:
    """Seconds before retry number ``attempts`` of a call the API server may answer next time: its ``Retry-After``
    (bounded) when it sent one, else the doubling backoff."""
    if retry_after is None:
        return retry_delay(attempts)
    asked = float(min(RETRY_AFTER_MAX_SECONDS, max(RETRY_AFTER_MIN_SECONDS, retry_after)))
    if attempts < RETRY_AFTER_ATTEMPTS:
        return asked
    return max(asked, retry_delay(attempts - RETRY_AFTER_ATTEMPTS))


def retrying_message(error: RetryableError, delay: float) -> str:
    """The Progressing condition's message: the call, what it met, what the API server asked, when the next try is."""
    asked = f"; the API server asked to retry after {error.retry_after} s" if error.retry_after is not None else ""
    return f"{error}{asked}; next in {delay:.0f} s"


def schedule_retry(key: Key, delay: float | None = None) -> None:
    """Make ``key`` due for ``retry_forever`` after ``delay`` (a Retry-After's), else the next doubling delay."""
    before = STATE.retries.get(key)
    attempts = before.attempts + 1 if before is not None else 0
    STATE.retries[key] = Retry(attempts, time.monotonic() + (retry_delay(attempts) if delay is None else delay))


def _replicas_set_by_others(obj: Mapping[str, Any]) -> bool:
    """Whether a manager other than the operator's two (its apply, the autoscaler's scale) owns ``spec.replicas``."""
    return any(
        entry.get("manager") not in (FIELD_MANAGER, AUTOSCALER_FIELD_MANAGER)
        and "f:replicas" in (entry.get("fieldsV1") or {}).get("f:spec", {})
        for entry in obj.get("metadata", {}).get("managedFields") or []
    )


def _spec_digest(obj: Mapping[str, Any]) -> str:
    """The spec, with replicas only when someone else set them: the operator's own scales are not edits (its apply
    leaves replicas to the autoscaler, whose scale then bumps the generation), ``kubectl scale`` is."""
    spec = dict(obj.get("spec") or {})
    if not _replicas_set_by_others(obj):
        spec.pop("replicas", None)
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()


def _fingerprint(obj: Mapping[str, Any]) -> tuple[int, str]:
    """Generation and spec digest where the kind has one (it moves only on spec changes), else the resourceVersion."""
    meta = obj.get("metadata", {})
    generation = meta.get("generation")
    return (int(generation), _spec_digest(obj)) if generation else (0, str(meta.get("resourceVersion") or ""))


def edited_by_hand(obj: Mapping[str, Any], applied: tuple[int, str] | None) -> bool:
    """Changed since our last apply (``applied``, its fingerprint): late events about older generations and the
    autoscaler's own scale (a new generation with the same spec but replicas) do not count."""
    if applied is None:
        return False
    current = _fingerprint(obj)
    if applied[0]:
        return current[0] > applied[0] and current[1] != applied[1]
    return current[1] != applied[1]


def foreign_owner(live: Mapping[str, Any] | None, uid: str | None) -> str | None:
    """Who controls a live object that has a child's name, when it is not the fleet of ``uid``; None when the name
    is free or the object is the fleet's own (its controller owner reference carries the fleet's uid)."""
    if live is None:
        return None
    references = (live.get("metadata") or {}).get("ownerReferences") or []
    if any(r.get("controller") and r.get("uid") == uid for r in references):
        return None
    controller = next((r for r in references if r.get("controller")), None)
    if controller is None:
        return "no controller (created by hand or by another tool)"
    return f"{controller.get('kind')} {controller.get('name')} (uid {controller.get('uid')})"


class _NotAppliedError(Exception):
    """Nothing more is applied for this fleet: ``reason`` and ``message`` go into its conditions."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _claim_names(inference: MultimodalInference, children: list[Body]) -> None:
    """Raise ``_NotAppliedError`` when a child's name is held by an object this fleet does not control.

    Applying over it would adopt it: a ServiceAccount taken over this way runs the fleet's image with its
    rights, and deleting the fleet would delete it. One read per child the first time, none after.
    """
    meta = inference.metadata
    owned = STATE.owned[(meta.namespace, meta.name)]
    for child in children:
        kind, name = child["kind"], child["metadata"]["name"]
        if (kind, name) in owned:
            continue
        live = get_kube().get(child["apiVersion"], kind, meta.namespace, name)
        holder = foreign_owner(live, meta.uid)
        if holder is not None:
            raise _NotAppliedError(
                "ChildNotOwned",
                f"{kind} {meta.namespace}/{name} already exists with {holder}, not this MultimodalInference: the "
                f"operator neither changes nor deletes objects it did not create; delete or rename that {kind}, or "
                f"give this MultimodalInference another metadata.name (now {meta.name})",
            )
        if live is not None:
            owned.add((kind, name))


# One look at the nodes or at discovery when the cached answer expires, not one per handler thread.
_DISCOVERY_LOCK = threading.Lock()


def resolve_cloud(inference: MultimodalInference) -> str:
    if inference.spec.cloud != "auto":
        return inference.spec.cloud
    if STATE.config.default_cloud != "auto":
        return STATE.config.default_cloud
    with _DISCOVERY_LOCK:
        if time.monotonic() - STATE.detected_at > DISCOVERY_CACHE_SECONDS:
            STATE.detected_cloud = clouds.detect(get_kube().provider_ids())
            STATE.detected_at = time.monotonic()
        return STATE.detected_cloud


def _monitoring_crds() -> bool:
    """Whether the Prometheus Operator's PodMonitor is served (installed or removed later is picked up too)."""
    with _DISCOVERY_LOCK:
        if time.monotonic() - STATE.monitoring_checked_at > DISCOVERY_CACHE_SECONDS:
            STATE.monitoring_crds = get_kube().has_api("monitoring.coreos.com/v1", "PodMonitor")
            STATE.monitoring_checked_at = time.monotonic()
        return STATE.monitoring_crds


def _cache_problem(inference: MultimodalInference) -> tuple[str, str] | None:
    """The shared cache's claim as it is now (one request, only for fleets that share a claim), remembered
    for the autoscaler's status writes."""
    meta, cache = inference.metadata, inference.spec.model_cache
    problem = None
    if cache.volume == "shared" and cache.claim_name is not None:
        claim = get_kube().get("v1", "PersistentVolumeClaim", meta.namespace, cache.claim_name)
        problem = status.shared_cache_problem(inference, claim)
    STATE.cache_problems[(meta.namespace, meta.name)] = problem
    return problem


class _EndpointsUnreadableError(Exception):
    """Reading a Service's EndpointSlices failed for another reason than RBAC."""


def _ready_endpoints(namespace: str, service: str) -> int | None:
    """The Service's ready endpoints, from its EndpointSlices; None when the operator may not read them (403).

    Any other failure raises ``_EndpointsUnreadableError``: a collector that is down must not be taken on trust.
    An endpoint whose ``ready`` is unset counts as ready, as the EndpointSlice API defines it.
    """
    try:
        slices = get_kube().list_objects(
            "discovery.k8s.io/v1", "EndpointSlice", namespace, selector=f"kubernetes.io/service-name={service}"
        )
    except Exception as error:
        if not is_forbidden(error):
            text = error_text(error)
            raise _EndpointsUnreadableError(f"listing the EndpointSlices of {namespace}/{service}: {text}") from error
        if not STATE.endpointslices_forbidden_logged:
            STATE.endpointslices_forbidden_logged = True
            log.warning(
                "may not list EndpointSlices (%s): TracingReady checks that collector Services exist, not that a "
                "collector pod serves behind them; grant list on discovery.k8s.io endpointslices",
                error_text(error),
            )
        return None
    endpoints = [e for s in slices for e in s.get("endpoints") or []]
    return sum((e.get("conditions") or {}).get("ready") is not False for e in endpoints)


def _collector(namespace: str, name: str) -> CollectorLookup:
    """The Service and its ready endpoints, looked up at most once per ``COLLECTOR_CACHE_SECONDS`` for all fleets.

    A failed Service look-up is remembered for ``COLLECTOR_FAILURE_CACHE_SECONDS`` and says what failed. A failed
    EndpointSlice read keeps the ready count seen before, and is not remembered, so the next fleet tries again.
    A list by name rather than a get: the operator's ClusterRole lists Services, it does not get them.
    """
    known = STATE.collectors.get((namespace, name))
    now = time.monotonic()
    if known is not None:
        ttl = COLLECTOR_FAILURE_CACHE_SECONDS if known.failed is not None else COLLECTOR_CACHE_SECONDS
        if now - known.at < ttl:
            return known
    try:
        found = bool(get_kube().list_objects("v1", "Service", namespace, field_selector=f"metadata.name={name}"))
    except Exception as error:
        failed = f"listing Services in {namespace}: {error_text(error)}"
        log.warning("looking up the collector Service %s/%s failed: %s", namespace, name, failed)
        lookup = CollectorLookup(None, None, now, failed)
        STATE.collectors[(namespace, name)] = lookup
        return lookup
    try:
        ready = _ready_endpoints(namespace, name) if found else None
    except _EndpointsUnreadableError as error:
        log.warning("%s", error)
        before = known.ready if known is not None and known.found else None
        if before is None:
            return CollectorLookup(found, None, now, str(error))
        return CollectorLookup(found, before, now)
    lookup = CollectorLookup(found, ready, now)
    STATE.collectors[(namespace, name)] = lookup
    return lookup


def _tracing(inference: MultimodalInference, cloud: str) -> status.TracingSeen | None:
    """Where the fleet's spans go and whether that collector's Service exists, remembered for the autoscaler."""
    meta, tracing = inference.metadata, inference.spec.tracing
    seen = None
    if tracing.enabled:
        endpoint = render.tracing_endpoint(inference, clouds.get(cloud), STATE.config.collector_endpoint) or ""
        service = status.collector_service(endpoint, meta.namespace, STATE.config.cluster_domain)
        if service is None:
            seen = status.TracingSeen(endpoint, bool(tracing.endpoint), cloud)
        else:
            lookup = _collector(*service)
            seen = status.TracingSeen(
                endpoint, bool(tracing.endpoint), cloud, service, lookup.found, lookup.ready, lookup.failed
            )
    STATE.tracing[(meta.namespace, meta.name)] = seen
    return seen


def _observe(
    body: Body,
    inference: MultimodalInference,
    deployment: Body | None,
    pods: list[Body],
    cloud: str | None,
) -> None:
    meta = inference.metadata
    key = (meta.namespace, meta.name)
    observed = status.Observed(
        deployment=deployment,
        pod_problems=status.pod_problems(pods),
        cloud=cloud,
        cache_problem=_cache_problem(inference),
        tracing=_tracing(inference, cloud) if cloud is not None else None,
        refused=STATE.refused.get(key),
        retrying=STATE.retrying.get(key),
    )
    previous = last_status(key, body)
    write_status(body, status.compute_status(inference, observed, previous, utc_now()), previous)


def _clamp_replicas(inference: MultimodalInference, deployment: Body) -> Body:
    """With autoscaling on, the Deployment's replicas belong to the scaler; keep them within bounds."""
    desired = status.desired_replicas(inference, deployment)
    if deployment.get("spec", {}).get("replicas") != desired:
        meta = inference.metadata
        get_kube().scale(meta.namespace, meta.name, desired)
        deployment = {**deployment, "spec": {**deployment.get("spec", {}), "replicas": desired}}
    return deployment


def _scaler_owns_replicas(deployment: Body) -> bool:
    if "scalerOwnsReplicas" in deployment.get("metadata", {}):
        return bool(deployment["metadata"]["scalerOwnsReplicas"])
    for entry in deployment.get("metadata", {}).get("managedFields") or []:
        fields = entry.get("fieldsV1") or {}
        if entry.get("manager") == AUTOSCALER_FIELD_MANAGER and "f:replicas" in fields.get("f:spec", {}):
            return True
    return False


def _hand_over_replicas(inference: MultimodalInference, live: Body | None) -> None:
    """Before an apply that drops replicas (autoscaling turned on), let the scaler own the field.

    Server-side apply resets a field its only manager stops applying; without a co-owner the
    Deployment would fall to 1 replica for a moment and kill serving pods.
    """
    if live is None or not inference.spec.autoscaled or _scaler_owns_replicas(live):
        return
    meta = inference.metadata
    get_kube().scale(meta.namespace, meta.name, status.desired_replicas(inference, live))


def reconcile(body: Body, pods: list[Body], live: Body | None, prune: bool, attempt: int = 0) -> None:
    """Bring the children in line with the spec and write status. Idempotent. One span, the applies and
    the status write inside it. ``attempt``: kopf's retry count, for the delay of the next one."""
    meta = body["metadata"]
    attributes = telemetry.fleet(meta["namespace"], meta["name"], meta.get("generation"))
    with (
        metrics_export.reconciling(),
        telemetry.tracer().start_as_current_span(telemetry.RECONCILE, attributes=attributes) as span,
    ):
        _reconcile(body, pods, live, prune, span, attempt)


def _reconcile(body: Body, pods: list[Body], live: Body | None, prune: bool, span: Span, attempt: int) -> None:
    meta = body["metadata"]
    key = (meta["namespace"], meta["name"])
    started, requests_before = time.perf_counter(), get_kube().thread_requests()
    with STATE.locks[key]:
        try:
            inference = parse_spec(body)
        except SpecError as error:
            STATE.retries.pop(key, None)  # only a new spec can help
            STATE.reconciled[key] = int(meta.get("generation") or 0)
            previous = previous_status(body)
            invalid_spec = status.InvalidSpec(error.problems, meta.get("generation"))
            invalid = status.compute_status(invalid_spec, status.Observed(), previous, utc_now())
            write_status(body, invalid, previous)
            raise kopf.PermanentError("; ".join(error.problems)) from None
        cloud: str | None = None
        deployment: Body | None = None
        try:
            cloud = resolve_cloud(inference)
            children = render_children(inference, cloud, _monitoring_crds())
            backend = inference.spec.backend.name
            span.set_attributes({telemetry.CLOUD: cloud, telemetry.BACKEND: backend, telemetry.CHILDREN: len(children)})
            _claim_names(inference, children)
            _hand_over_replicas(inference, live)
            for child in children:
                applied = _apply(child)
                STATE.applied[applied["metadata"]["uid"]] = _fingerprint(applied)
                STATE.children[key].add(applied["metadata"]["uid"])
                STATE.owned[key].add((child["kind"], child["metadata"]["name"]))
                if child["kind"] == "Deployment":
                    deployment = applied
            if deployment is not None and inference.spec.autoscaled:
                deployment = _clamp_replicas(inference, deployment)
            if prune:
                _prune(inference, children)
            STATE.reconciled[key] = int(meta.get("generation") or 0)
            STATE.refused.pop(key, None)
            STATE.retries.pop(key, None)
            STATE.retrying.pop(key, None)
            _observe(body, inference, deployment, pods, cloud)
        except RetryableError as error:
            # Said in Progressing until a reconcile goes through; every status write (refresh, autoscaler) keeps it.
            scheduled = STATE.retries.get(key)  # a retry of retry_forever's is numbered there, kopf's by kopf
            delay = api_retry_delay(error.retry_after, max(attempt, scheduled.attempts if scheduled else 0))
            STATE.retrying[key] = retrying_message(error, delay)
            due = time.monotonic() + delay + KOPF_RETRY_GRACE_SECONDS
            STATE.retries[key] = Retry(scheduled.attempts if scheduled else 0, due)
            seen = last_status(key, body)
            with contextlib.suppress(RetryableError):  # the status write may meet the same fault
                _observe(body, inference, deployment or live, pods, cloud or (seen.cloud if seen else None))
            raise kopf.TemporaryError(STATE.retrying[key], delay=delay) from error
        except NamespaceTerminatingError:
            log.info("%s/%s: its namespace is being deleted; nothing to apply", *key)
            return
        except (_NotAppliedError, RefusedError) as error:
            refused = (
                error if isinstance(error, _NotAppliedError) else _NotAppliedError("ApplyRefused", _refusal(error))
            )
            log.warning("%s/%s: %s: %s", *key, refused.reason, refused.message)
            STATE.refused[key] = (refused.reason, refused.message)
            STATE.retrying.pop(key, None)
            schedule_retry(key)
            _observe(body, inference, live, pods, cloud)
            raise kopf.PermanentError(f"{refused.reason}: {refused.message}") from None
    log.info(
        "reconciled %s/%s in %.1f ms with %d API requests",
        *key,
        (time.perf_counter() - started) * 1000,
        get_kube().thread_requests() - requests_before,
    )


def _refusal(error: RefusedError) -> str:
    text = f"the API server refused a write ({error.status}): {error.message}"
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 1] + "…"


def _apply(child: Body) -> Body:
    """One server-side apply, as a span of the reconcile that asked for it; a refusal names the child."""
    kind, meta = child["kind"], child["metadata"]
    attributes = {telemetry.CHILD_KIND: kind, telemetry.CHILD_NAME: meta["name"]}
    with telemetry.tracer().start_as_current_span(telemetry.APPLY, attributes=attributes):
        try:
            return get_kube().apply(child)
        except RefusedError as error:
            where = f"{kind} {meta.get('namespace')}/{meta['name']}"
            raise RefusedError(error.status, f"applying {where}: {error.message}") from error


def _prune(inference: MultimodalInference, children: list[Body]) -> None:
    """Delete optional children the spec no longer asks for, but only ones this resource owns."""
    kube = get_kube()
    meta = inference.metadata
    present = {(c["apiVersion"], c["kind"]) for c in children}
    for api_version, kind, name in render.optional_children(inference):
        if (api_version, kind) in present or (kind == "PodMonitor" and not _monitoring_crds()):
            continue
        found = kube.get(api_version, kind, meta.namespace, name)
        owners = (found or {}).get("metadata", {}).get("ownerReferences") or []
        if any(o.get("uid") == meta.uid for o in owners):
            kube.delete(api_version, kind, meta.namespace, name)


class DiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's diff base, built only for fleets, and without first deep-copying whole bodies.

    kopf builds the essence of every watched event, children's included, by deep-copying the
    body and then dropping metadata (but labels and annotations) and status, and diffs it against
    the stored one (kopf 1.45.2, ``kopf/_core/reactor/processing.py``, ``_detect_causes``). Only
    the fleets have handlers that read the diff (create, update); for the children, pods included,
    the essence is empty. Leaving managedFields and status out before the copy gives the same essence.
    """

    def build(self, *, body: kopf.Body, extra_fields: Iterable[kopf.FieldSpec] | None = None) -> kopf.BodyEssence:
        if body.get("kind") != KIND:
            return cast(kopf.BodyEssence, {})
        if extra_fields:  # fields a handler asked to track may live anywhere, status included
            return super().build(body=body, extra_fields=extra_fields)
        raw = {key: value for key, value in body.items() if key != "status"}
        raw["metadata"] = {key: value for key, value in body.metadata.items() if key != "managedFields"}
        return super().build(body=kopf.Body(cast(kopf.RawBody, raw)), extra_fields=extra_fields)


@kopf.on.startup()
def configure_operator(settings: kopf.OperatorSettings, **_: Any) -> None:
    # No handler needs a finalizer (no timers, the delete handler is optional); kopf removes one an
    # earlier version added. Named under mmfleet.io all the same, should one ever be needed.
    settings.persistence.finalizer = "mmfleet.io/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="mmfleet.io")
    settings.persistence.diffbase_storage = DiffBaseStorage(prefix="mmfleet.io", key="last-handled-configuration")
    # kopf's own log lines become Kubernetes Events only from warnings up (not one per handler success);
    # the operator's own events (Ready, Degraded) are posted explicitly with kopf.event.
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = STATE.config.workers
    settings.watching.server_timeout = 600
    # kopf's own requests (annotation patches, events) end within this long: a hung one would hold its fleet's
    # worker. Watches are bounded by server_timeout and kopf's inactivity_timeout.
    settings.networking.request_timeout = 30
    settings.networking.connect_timeout = 5
    # kopf waits this long for its own annotation patch to come back through the watch before it
    # trusts an older copy; on a busy API server the 5 s default made it re-run creation handlers.
    settings.persistence.consistency_timeout = 60
    settings.queueing.error_delays = [1, 2, 5, 10, 30]
    # kopf keeps a worker per object (with its queue and last event) this long after its last
    # event; at the default 5 s, a burst of creations kept thousands alive at once.
    settings.queueing.idle_timeout = WORKER_IDLE_SECONDS
    if STATE.tracer_provider is None:
        STATE.tracer_provider = telemetry.setup()
    log.info("mmfleet operator started: monitoring CRDs %s", "found" if _monitoring_crds() else "absent")


# kopf injects indexes as keyword arguments named after their functions; its handler protocols
# cannot name them, so handlers take them from **kwargs through these helpers.
def _index(kwargs: dict[str, Any], name: str, key: Key) -> list[Body]:
    index: kopf.Index[Key, Body] = kwargs[name]
    return list(index.get(key, []))


def _first(kwargs: dict[str, Any], name: str, key: Key) -> Body | None:
    found = _index(kwargs, name, key)
    return found[0] if found else None


@kopf.on.cleanup()
def report_requests(**_: Any) -> None:
    log.info("API requests made: %d", get_kube().requests)
    if STATE.tracer_provider is not None:  # send the last batch of spans
        STATE.tracer_provider.shutdown()
        STATE.tracer_provider = None


# The indexes keep only what status and drift need: at 1,000 fleets, whole bodies (managedFields,
# kopf's annotations, pod specs) would be most of the operator's memory. They are async, so kopf
# calls them on its event loop: a sync one costs a hop to a worker thread on every watch event.
def _slim_meta(meta: kopf.Meta, *keys: str) -> Body:
    return {k: meta[k] for k in ("name", "namespace", "uid", "generation", "deletionTimestamp", *keys) if k in meta}


@kopf.index(GROUP, VERSION, PLURAL)
async def fleets(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Key, Body]:
    remember_kopf_context()  # indexed before the autoscaler sees a fleet
    slim = {k: body[k] for k in ("apiVersion", "kind", "spec", "status") if k in body}
    return {(namespace or "", name): {**slim, "metadata": _slim_meta(body.meta, "labels")}}


@kopf.index("apps", "v1", "deployments", labels=CHILD_LABELS)
async def fleet_deployments(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Key, Body]:
    meta = _slim_meta(body.meta)
    meta["scalerOwnsReplicas"] = _scaler_owns_replicas(dict(body))
    slim = {"metadata": meta, "spec": {"replicas": body.spec.get("replicas")}, "status": dict(body.status)}
    return {(namespace or "", labels[INFERENCE_LABEL]): slim}


@kopf.index("", "v1", "pods", labels=POD_LABELS)
async def fleet_pods(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Key, Body]:
    pod_status = body.status
    slim = {
        "metadata": _slim_meta(body.meta, "creationTimestamp"),  # the autoscaler measures cold starts from it
        "status": {k: pod_status[k] for k in ("phase", "conditions", "containerStatuses") if k in pod_status},
    }
    return {(namespace or "", labels[INFERENCE_LABEL]): slim}


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
def create_fleet(body: kopf.Body, namespace: str | None, name: str, retry: int, **kwargs: Any) -> None:
    key = (namespace or "", name)
    pods, deployment = _index(kwargs, "fleet_pods", key), _first(kwargs, "fleet_deployments", key)
    reconcile(dict(body), pods, deployment, prune=False, attempt=retry)


@kopf.on.update(GROUP, VERSION, PLURAL)
def update_fleet(body: kopf.Body, namespace: str | None, name: str, retry: int, **kwargs: Any) -> None:
    key = (namespace or "", name)
    pods, deployment = _index(kwargs, "fleet_pods", key), _first(kwargs, "fleet_deployments", key)
    reconcile(dict(body), pods, deployment, prune=True, attempt=retry)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def forget_fleet(event: kopf.RawEvent, namespace: str | None, name: str, **_: Any) -> None:
    """A fleet gone from the API server: drop what the operator kept about it.

    Children go with the owner references. A watch event, not ``kopf.on.delete``: with no
    finalizer on fleets kopf calls no delete handler, and a fleet recreated under the same name
    must not be judged against the last status of the one before.
    """
    if event["type"] != "DELETED":
        return
    key = (namespace or "", name)
    STATE.parsed.pop(event["object"].get("metadata", {}).get("uid", ""), None)
    STATE.locks.pop(key, None)
    STATE.written.pop(key, None)
    STATE.scaling.pop(key, None)
    STATE.cache_problems.pop(key, None)
    STATE.tracing.pop(key, None)
    STATE.owned.pop(key, None)
    STATE.refused.pop(key, None)
    STATE.retries.pop(key, None)
    STATE.retrying.pop(key, None)
    STATE.reconciled.pop(key, None)
    for child in STATE.children.pop(key, set()):
        STATE.applied.pop(child, None)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def follow_generation(event: kopf.RawEvent, namespace: str | None, name: str, **_: Any) -> None:
    """A new generation is reconciled even when no handler takes it up (level-triggered).

    kopf calls no update handler when the spec returns to what it last handled (a scale 1 -> 2 whose reconcile failed
    after the Deployment's apply, then back to 1), and drops the failed one's retry, leaving 2 replicas. The retry
    loop reconciles such a fleet ``KOPF_RETRY_GRACE_SECONDS`` later unless a reconcile of it finishes first.
    """
    key = (namespace or "", name)
    done = STATE.reconciled.get(key)
    generation = event["object"].get("metadata", {}).get("generation")
    if event["type"] != "MODIFIED" or done is None or generation in (None, done) or key in STATE.retries:
        return
    STATE.retries[key] = Retry(0, time.monotonic() + KOPF_RETRY_GRACE_SECONDS)


async def observe_child(event: kopf.RawEvent, namespace: str, labels: kopf.Labels, kwargs: dict[str, Any]) -> None:
    """A child changed: repair it if it was deleted or edited by hand, else refresh the parent's status soon.

    Judged on the event loop, so the thousands of events a burst of creations brings (pods and
    Deployments get several status updates each) never wait for a handler thread behind the
    reconciles, holding their bodies; only a repair or a status refresh takes a thread (asyncio's,
    which carries this context over, as ``kopf.event`` needs).
    """
    found = _index(kwargs, "fleets", (namespace, labels.get(INFERENCE_LABEL, "")))
    if not found or found[0].get("metadata", {}).get("deletionTimestamp"):
        return
    parent = found[0]
    obj = event["object"]
    key = (namespace, parent["metadata"]["name"])
    kind = obj.get("kind", "")
    meta = obj.get("metadata", {})
    deleted = event["type"] == "DELETED"
    edited = (
        event["type"] == "MODIFIED"
        and kind != "Pod"
        and not meta.get("deletionTimestamp")
        and edited_by_hand(obj, STATE.applied.get(meta.get("uid", "")))
    )
    indexes = {name: kwargs[name] for name in INDEXES}
    if kind != "Pod" and (deleted or edited):
        log.info("%s %s/%s was %s by hand; re-applying", kind, namespace, meta["name"],
                 "deleted" if deleted else "edited")  # fmt: skip
        STATE.applied.pop(meta.get("uid", ""), None)
        if deleted:
            STATE.owned[key].discard((kind, meta["name"]))
        await _repair(key, parent, indexes)
        return
    if kind not in ("Pod", "Deployment"):
        return
    if key in STATE.refreshes:
        STATE.refresh_again.add(key)
    else:
        STATE.refreshes[key] = asyncio.create_task(_refresh_later(key, indexes))


async def _repair(key: Key, parent: Body, indexes: dict[str, Any]) -> None:
    """Reconcile on a child's behalf; kopf retries no event handler, so a failure is retried by ``retry_forever``."""
    pods, deployment = _index(indexes, "fleet_pods", key), _first(indexes, "fleet_deployments", key)
    try:
        await asyncio.to_thread(reconcile, parent, pods, deployment, False)
    except kopf.PermanentError:  # an invalid spec (its status says so) or a refusal (which scheduled its retry)
        return
    except Exception as error:
        log.warning("repairing %s/%s failed (%s); trying again later", *key, error_text(error))
        metrics_export.error("repair")
        schedule_retry(key, error.delay if isinstance(error, kopf.TemporaryError) else None)


async def retry_forever(indexes: dict[str, Any]) -> None:
    """Reconcile again each fleet whose retry is due: a failed repair, a refused apply, a child not owned, a
    reconcile the API server failed that kopf did not retry in time (``KOPF_RETRY_GRACE_SECONDS``).

    Level-triggered: the retry reads the fleet and its children as the indexes show them then, and a fleet
    whose cause is gone (the conflicting object deleted) converges without any event about it.
    """
    while True:
        await asyncio.sleep(RETRY_TICK_SECONDS)
        now = time.monotonic()
        for key in [k for k, r in STATE.retries.items() if r.due <= now]:
            if STATE.locks[key].locked():  # being reconciled now: its outcome clears or reschedules the retry
                continue
            parent = _first(indexes, "fleets", key)
            if parent is None or parent.get("metadata", {}).get("deletionTimestamp"):
                STATE.retries.pop(key, None)
                continue
            schedule_retry(key)  # not due again until a success clears it or the next delay passes
            context = STATE.kopf_context or contextvars.Context()
            with contextlib.suppress(Exception):
                await asyncio.to_thread(context.copy().run, _retry, key, parent, indexes)


def _retry(key: Key, parent: Body, indexes: dict[str, Any]) -> None:
    """One retry; when the API server asks for another (a TemporaryError), it is due when the error's delay says."""
    pods, deployment = _index(indexes, "fleet_pods", key), _first(indexes, "fleet_deployments", key)
    try:
        reconcile(parent, pods, deployment, False)
    except kopf.PermanentError:
        raise
    except Exception as error:
        log.warning("retrying %s/%s failed: %s", *key, error_text(error))
        if isinstance(error, kopf.TemporaryError) and error.delay is not None and key in STATE.retries:
            STATE.retries[key].due = time.monotonic() + error.delay
        raise


async def _refresh_later(key: Key, indexes: dict[str, Any]) -> None:
    """Refresh a fleet's status ``STATUS_DEBOUNCE`` after an event, from the indexes as they are then.

    A pod's way to Ready brings a Deployment event or two per step; writing status on each cost
    a request per event, on an API server already busy with the burst that caused them. Events
    during a refresh ask for one more; a fleet never has more than one refresh waiting for a thread.
    A failed refresh is tried again after ``retry_delay`` (5 s doubling): no event may come to ask
    for one, and the resync is minutes away (a status left saying 1 of 2 ready, in the fault bench).
    """
    failures = 0
    try:
        while True:
            await asyncio.sleep(STATUS_DEBOUNCE)
            STATE.refresh_again.discard(key)
            try:
                await asyncio.to_thread(refresh_status, key, indexes)
            except Exception as error:
                if isinstance(error, RetryableError):  # the API server's fault, said in one line
                    log.warning("refreshing the status of %s/%s failed: %s", *key, error)
                else:
                    log.exception("refreshing the status of %s/%s failed", *key)
                metrics_export.error("status_refresh")
                STATE.refresh_again.add(key)
                await asyncio.sleep(retry_delay(failures))
                failures += 1
            if key not in STATE.refresh_again:
                return
    finally:
        STATE.refreshes.pop(key, None)


def refresh_status(key: Key, kwargs: dict[str, Any]) -> None:
    """Recompute status from the indexes. Read under the lock, so the last writer saw the newest state."""
    with STATE.locks[key]:
        found = _index(kwargs, "fleets", key)
        if not found or found[0].get("metadata", {}).get("deletionTimestamp"):
            return
        try:
            inference = parse_spec(found[0])
        except SpecError:
            return
        deployment = _first(kwargs, "fleet_deployments", key)
        _observe(found[0], inference, deployment, _index(kwargs, "fleet_pods", key), resolve_cloud(inference))


async def resync_forever(indexes: dict[str, Any]) -> None:
    """Every ``RESYNC_SECONDS``, recompute each fleet's status from the indexes: a safety net for a missed event.

    One loop for all fleets rather than a ``kopf.timer`` per fleet: kopf puts a finalizer on every
    resource a timer serves, and that finalizer would block deleting a fleet, or its namespace,
    while the operator is down. A refresh costs no request unless the status is wrong. It runs in
    a kopf handler's context (``remember_kopf_context``), where ``kopf.event`` can post.
    """
    while True:
        await asyncio.sleep(RESYNC_SECONDS)
        context = STATE.kopf_context or contextvars.Context()
        for key in list(indexes["fleets"].keys()):
            try:
                await asyncio.to_thread(context.copy().run, refresh_status, key, indexes)
            except Exception:  # one fleet's failure must not end the safety net for all
                log.exception("resyncing the status of %s/%s failed", *key)
                metrics_export.error("status_refresh")


@kopf.on.startup()
async def start_resync(**kwargs: Any) -> None:
    STATE.resync = asyncio.create_task(resync_forever(kwargs), name="mmfleet status resync")
    STATE.retry = asyncio.create_task(retry_forever(kwargs), name="mmfleet reconcile retries")


@kopf.on.cleanup()
async def stop_resync(**_: Any) -> None:
    loops = [task for task in (STATE.resync, STATE.retry) if task is not None]
    for task in [*STATE.refreshes.values(), *loops]:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _child_handler(group: str, version: str, plural: str) -> None:
    @kopf.on.event(
        group, version, plural, labels=POD_LABELS if plural == "pods" else CHILD_LABELS, id=f"watch_{plural}"
    )
    async def watch_child(event: kopf.RawEvent, namespace: str | None, labels: kopf.Labels, **kwargs: Any) -> None:
        await observe_child(event, namespace or "", labels, kwargs)


for _group, _version, _plural in (
    ("apps", "v1", "deployments"),
    ("", "v1", "services"),
    ("", "v1", "serviceaccounts"),
    ("", "v1", "configmaps"),
    ("policy", "v1", "poddisruptionbudgets"),
    ("", "v1", "pods"),
):
    _child_handler(_group, _version, _plural)
