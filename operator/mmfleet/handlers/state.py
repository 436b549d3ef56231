"""What the handlers share: the operator's memory between calls, and the one way status is written."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import threading
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import kopf
from kubernetes.dynamic.exceptions import NotFoundError
from opentelemetry.sdk.trace import TracerProvider
from pydantic import ValidationError

from mmfleet import render, status, telemetry
from mmfleet.api import CONDITION_TYPES, MultimodalInference, MultimodalInferenceStatus
from mmfleet.autoscaler import cycle
from mmfleet.config import OperatorConfig
from mmfleet.kube import Kube
from mmfleet.validation import parse

log = logging.getLogger("mmfleet")

Key = tuple[str, str]
Body = dict[str, Any]


@dataclass
class Parsed:
    """One generation of a fleet's spec, parsed, and its children as rendered for each (cloud, monitoring CRDs)."""

    generation: int | None
    inference: MultimodalInference
    rendered: dict[tuple[str, bool], list[Body]] = field(default_factory=dict)


@dataclass(frozen=True)
class CollectorLookup:
    """One look-up of a collector Service for all fleets: what was found, or why nothing could be."""

    found: bool | None  # None: the look-up failed
    ready: int | None  # ready endpoints; None when EndpointSlices may not be read (or not looked at)
    at: float  # time.monotonic() of the look-up
    failed: str | None = None  # what failed, e.g. "listing Services in mmfleet-system: 500 Internal Server Error"


@dataclass
class Retry:
    """A fleet whose last reconcile failed where kopf does not retry (drift repair, a refused apply): when next."""

    attempts: int
    due: float  # time.monotonic()


@dataclass
class State:
    """What the operator keeps between handler calls (created at startup)."""

    config: OperatorConfig = field(default_factory=OperatorConfig)
    kube: Kube | None = None
    monitoring_crds: bool = False
    monitoring_checked_at: float = -math.inf
    detected_cloud: str = "generic"
    detected_at: float = -math.inf
    # Generation or resourceVersion of each child as our last apply left it, to tell hand edits apart.
    applied: dict[str, tuple[int, str]] = field(default_factory=dict)
    children: defaultdict[Key, set[str]] = field(default_factory=lambda: defaultdict(set))
    # (kind, name) of each fleet's children seen controlled by it: looked up once, not before every apply.
    owned: defaultdict[Key, set[tuple[str, str]]] = field(default_factory=lambda: defaultdict(set))
    # Why nothing was applied for a fleet, (reason, message): the autoscaler leaves such a fleet alone.
    refused: dict[Key, tuple[str, str]] = field(default_factory=dict)
    # Reconciles to try again (handlers.fleet.retry_forever), with a backoff that grows per attempt.
    retries: dict[Key, Retry] = field(default_factory=dict)
    # Why a fleet's reconcile waits to be retried (a call the API server may answer next time), for Progressing:
    # every status write carries it (a refresh, the autoscaler's cycle) until a reconcile goes through.
    retrying: dict[Key, str] = field(default_factory=dict)
    # The generation each fleet's last reconcile finished with (applied, or judged invalid): a newer one no handler
    # takes up is reconciled by the retry loop (handlers.fleet.follow_generation).
    reconciled: dict[Key, int] = field(default_factory=dict)
    retry: asyncio.Task[None] | None = None
    written: dict[Key, MultimodalInferenceStatus] = field(default_factory=dict)
    locks: defaultdict[Key, threading.Lock] = field(default_factory=lambda: defaultdict(threading.Lock))
    # The autoscaler's memory of each autoscaled fleet (policy state, attainment, cold start).
    scaling: dict[Key, cycle.Memory] = field(default_factory=dict)
    autoscaler: asyncio.Task[None] | None = None
    resync: asyncio.Task[None] | None = None  # the status safety net (handlers.fleet.resync_forever)
    # The status refresh each fleet's pod or Deployment events have asked for (handlers.fleet._refresh_later).
    refreshes: dict[Key, asyncio.Task[None]] = field(default_factory=dict)
    refresh_again: set[Key] = field(default_factory=set)  # fleets with events since their refresh began
    # time.monotonic() when the autoscaling loop last finished a cycle (or started), for the liveness probe.
    autoscaler_cycled: float = -math.inf
    # Why a fleet's shared model cache claim cannot serve it, as the last reconcile or refresh saw it: the
    # autoscaler's status writes carry it rather than read the claim every cycle.
    cache_problems: dict[Key, tuple[str, str] | None] = field(default_factory=dict)
    # Where each tracing fleet's spans go, as the last reconcile or refresh saw it (for the autoscaler's writes).
    tracing: dict[Key, status.TracingSeen | None] = field(default_factory=dict)
    # The last look-up of each in-cluster collector Service, by (namespace, name) (handlers.fleet._collector).
    collectors: dict[Key, CollectorLookup] = field(default_factory=dict)
    # Whether the missing RBAC for EndpointSlices has been logged (once: it lasts until the ClusterRole changes).
    endpointslices_forbidden_logged: bool = False
    # By uid: what only changes with the generation (the autoscaler reads every fleet every cycle).
    parsed: dict[str, Parsed] = field(default_factory=dict)
    # A context of kopf's handlers, for kopf.event outside them (see remember_kopf_context).
    kopf_context: contextvars.Context | None = None
    # The SDK's provider of the operator's own spans (mmfleet.telemetry.setup), None when they go nowhere.
    tracer_provider: TracerProvider | None = None


STATE = State()


def get_kube() -> Kube:
    if STATE.kube is None:
        STATE.kube = Kube()
    return STATE.kube


def parse_spec(body: Body) -> MultimodalInference:
    """``validation.parse``, once per uid and generation; raises ``SpecError`` as it does.

    The spec, name, namespace and uid (all that rendering and the autoscaler read) only change with
    the generation. The status in the result is the one first parsed: read it with ``last_status``.
    """
    uid, generation = body["metadata"].get("uid"), body["metadata"].get("generation")
    cached = STATE.parsed.get(uid) if uid else None
    if cached is not None and cached.generation == generation:
        return cached.inference
    inference = parse(body)
    if uid:
        STATE.parsed[uid] = Parsed(generation, inference)
    return inference


def render_children(inference: MultimodalInference, cloud: str, monitoring_crds: bool) -> list[Body]:
    """``render.render``, once per uid, generation, cloud and monitoring CRDs; callers must not change the result."""
    cached = STATE.parsed.get(inference.metadata.uid or "")
    # The NetworkPolicy admits the operator's Prometheus to /metrics when its URL names an in-cluster Service.
    prometheus = status.collector_service(STATE.config.prometheus_url, "") if STATE.config.prometheus_url else None
    settings: dict[str, Any] = {
        "monitoring_crds": monitoring_crds,
        "collector_endpoint": STATE.config.collector_endpoint,
        "prometheus_namespace": prometheus[0] if prometheus else None,
    }
    if cached is None or cached.inference is not inference:
        return render.render(inference, cloud, **settings)
    key = (cloud, monitoring_crds)
    if key not in cached.rendered:
        cached.rendered[key] = render.render(inference, cloud, **settings)
    return cached.rendered[key]


def previous_status(body: Body) -> MultimodalInferenceStatus | None:
    try:
        return MultimodalInferenceStatus.model_validate(body.get("status") or {})
    except ValidationError:
        return None


def last_status(key: Key, body: Body) -> MultimodalInferenceStatus | None:
    """The status as this process last judged it, else as the resource shows it (after a restart)."""
    written = STATE.written.get(key)
    return written if written is not None else previous_status(body)


def remember_kopf_context() -> None:
    """Keep the context of a kopf handler, for ``kopf.event`` from the autoscaler loop, which is none.

    ``kopf.event`` reads the operator's settings, its event queue and that queue's event loop from
    context variables that kopf sets only around its handlers (kopf 1.45.2,
    ``kopf/_core/engines/posting.py``); events posted in this context join kopf's own queue.
    """
    if STATE.kopf_context is None:
        STATE.kopf_context = contextvars.copy_context()


def kopf_event(body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    target = body if isinstance(body, kopf.Body) else kopf.Body(cast(kopf.RawBody, dict(body)))
    kopf.event(target, type=type_, reason=reason, message=message)


def write_status(
    body: kopf.Body | Body, new: MultimodalInferenceStatus, previous: MultimodalInferenceStatus | None
) -> bool:
    """Write status only when it changed, and tell the user about transitions as events; whether it wrote.

    "Changed" is judged against what this process last judged (the operator is the only writer),
    because the watched copy of the resource can lag behind our own last patch. Conditions are kept
    in one order: the reconcile and the autoscaler each list their own first, and would otherwise
    rewrite each other's status on every cycle without changing a thing. A fleet deleted since the
    event or cycle that asked for the write (404) has no status to write and no one to tell.
    """
    new = new.model_copy(update={"conditions": sorted(new.conditions, key=lambda c: CONDITION_TYPES.index(c.type))})
    meta = body["metadata"]
    key = (meta["namespace"], meta["name"])
    previous = STATE.written.get(key, previous)
    # observedGeneration is the generation whose children were last applied, not the one a status refresh or an
    # autoscaling cycle happens to read: a spec still waiting for its apply (a retry, a reconcile not yet run) is not
    # reported as current, which Argo CD's health check and kstatus read as done.
    applied = STATE.reconciled.get(key, previous.observed_generation if previous else None)
    if applied is not None and (new.observed_generation or 0) > applied:
        new = new.model_copy(update={"observed_generation": applied})
    if previous == new:
        return False
    wire = new.wire()
    if previous is not None and previous.wire() == wire:
        STATE.written[key] = new
        return False
    attributes = {**telemetry.fleet(*key, new.observed_generation), telemetry.PHASE: new.phase or ""}
    with telemetry.tracer().start_as_current_span(telemetry.STATUS_WRITE, attributes=attributes):
        try:
            get_kube().patch_status(meta["namespace"], meta["name"], wire)
        except NotFoundError:
            STATE.written.pop(key, None)
            return False
    STATE.written[key] = new
    for type_, reason, message in status.events(previous, new):
        kopf_event(body, type_, reason, message)
    return True


def utc_now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)
