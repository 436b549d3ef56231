"""What the operator keeps between reconciles: one record per fleet, the process's shared state, and the one way
status is written.

Handlers reach the ``Operator`` through kopf's ``memo`` (``operator_of``), so a test builds its own.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
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
from mmfleet.autoscaler.encode import EncodeMemory
from mmfleet.autoscaler.standby import WAKES_KEPT, Intent
from mmfleet.backends import ServerStartup
from mmfleet.config import OperatorConfig
from mmfleet.kube import Kube, load_client, pool_size
from mmfleet.leader import own_namespace
from mmfleet.routing import PickerSettings, RoutingCrds
from mmfleet.validation import parse, refuse_system_namespace
from mmfleet.workqueue import WorkQueue

log = logging.getLogger("mmfleet")

Key = tuple[str, str]
Body = dict[str, Any]
Fingerprint = tuple[int, str]  # a child's generation and spec digest, or (0, resourceVersion)

# A new fleet's first status waits this many seconds after its first apply while it only says "rolling out".
FIRST_STATUS_WAIT = 5.0


@dataclass
class Parsed:
    """One generation of a fleet's spec, parsed, and its children as rendered for each (cloud, monitoring CRDs)."""

    generation: int | None
    inference: MultimodalInference
    rendered: dict[tuple[str, bool, RoutingCrds, PickerSettings], list[Body]] = field(default_factory=dict)


@dataclass(frozen=True)
class CollectorLookup:
    """One look-up of a collector Service for all fleets: what was found, or why nothing could be."""

    found: bool | None  # None: the look-up failed
    ready: int | None  # ready endpoints; None when EndpointSlices may not be read (or not looked at)
    at: float  # time.monotonic() of the look-up
    failed: str | None = None  # what failed, e.g. "listing Services in mmfleet-system: 500 Internal Server Error"


@dataclass
class StandbyMemory:
    """A fleet's warm standby between cycles: the pods with a sleep or wake under way (each in a thread of its own,
    which updates this under ``lock``), the last wake times, and the last failure."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    busy: dict[str, Intent] = field(default_factory=dict)  # pod -> the call queued or under way
    wakes: deque[float] = field(default_factory=lambda: deque(maxlen=WAKES_KEPT))
    problem: str | None = None  # as the status shows it, with its tries
    failure: str | None = None  # the last failure without them: a Warning event when it changes
    # A pod whose call failed is left alone until time.monotonic() passes its entry, twice as long each time.
    retry_at: dict[str, float] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)


@dataclass
class ServerLogs:
    """What each pod's server logged about its start, by pod name, read once by the autoscaler's cycle; and how many
    reads of those not read yet failed for a reason that may pass."""

    read: dict[str, ServerStartup] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    reading: Future[None] | None = None  # the last batch of reads given to the server-log threads


@dataclass
class FleetRecord:
    """What the operator knows about one fleet (one uid) between reconciles; dropped when the fleet is deleted."""

    uid: str | None = None
    # Held by whoever writes the fleet's children or status: a reconcile or the autoscaler's cycle.
    lock: threading.Lock = field(default_factory=threading.Lock)
    parsed: Parsed | None = None
    # The status this process last wrote (the watched copy of the resource can lag behind our own patch).
    written: MultimodalInferenceStatus | None = None
    # The generation a watch event of the fleet last queued: its own status writes (same generation) queue nothing.
    queued: int | None = None
    # The generation the last reconcile finished with (applied, or judged invalid); a newer one needs an apply.
    reconciled: int | None = None
    # The generation the last apply tried (whether it went through or failed).
    attempted: int | None = None
    # A child was deleted or edited by hand since the last apply: the next reconcile applies again.
    drifted: bool = False
    # Each child's fingerprint as our last apply left it, by uid, to tell hand edits apart.
    applied: dict[str, Fingerprint] = field(default_factory=dict)
    # (kind, name) of the children seen controlled by this fleet: looked up once, not before every apply.
    owned: set[tuple[str, str]] = field(default_factory=set)
    # Why nothing was applied, (reason, message): the autoscaler leaves such a fleet alone.
    refused: tuple[str, str] | None = None
    # Why the reconcile waits to be retried (a call the API server may answer next time), for Progressing: every
    # status write (the autoscaler's too) carries it until a reconcile goes through.
    retrying: str | None = None
    # time.monotonic() before which a failed apply is not tried again (its backoff, or the server's Retry-After):
    # a reconcile that comes sooner (a pod's event) only observes.
    retry_due: float = -math.inf
    # time.monotonic() until which a new fleet's first status waits for its rollout (FIRST_STATUS_WAIT).
    first_status_due: float = -math.inf
    # The autoscaler's memory (policy state, attainment, cold start).
    scaling: cycle.Memory | None = None
    encode_scaling: EncodeMemory | None = None  # with the encode tier's autoscaling: what its cycles learned
    # Why the shared model cache's claim cannot serve the fleet, and where its spans go, as the last reconcile saw
    # them: the autoscaler's status writes carry them rather than look again every cycle.
    cache_problem: tuple[str, str] | None = None
    tracing: status.TracingSeen | None = None
    # With warm standby: its sleeps and wakes under way and done (mmfleet.handlers.standby).
    standby: StandbyMemory = field(default_factory=StandbyMemory)
    # What each Ready pod's server logged about its start (autoscale._read_server_logs).
    server_logs: ServerLogs = field(default_factory=ServerLogs)

    def needs_apply(self, generation: int | None) -> bool:
        return self.reconciled is None or self.reconciled != (generation or 0) or self.drifted or self.failed()

    def failed(self) -> bool:
        return self.refused is not None or self.retrying is not None

    def holding_status(self, now: float) -> float | None:
        """Seconds until a held first status is due, or None when none is held."""
        if self.written is not None or now >= self.first_status_due:
            return None
        return self.first_status_due - now

    def backing_off(self, generation: int | None, now: float) -> float:
        """Seconds the failed apply of this same generation still waits (0: none): a new spec is applied at once."""
        if not self.failed() or self.attempted != (generation or 0):
            return 0.0
        return max(0.0, self.retry_due - now)


@dataclass
class Operator:
    """The operator process's state: settings, its client, what it discovered, and a record per fleet."""

    config: OperatorConfig = field(default_factory=OperatorConfig)
    kube: Kube | None = None
    records: dict[Key, FleetRecord] = field(default_factory=dict)
    # Every reconcile goes through this queue (mmfleet.handlers.triggers); None until the operator starts.
    queue: WorkQueue[Key] | None = None
    # kopf's indexes (fleets, fleet_deployments, fleet_pods), handed over by the startup handler.
    indexes: Mapping[str, Any] = field(default_factory=dict)
    # Whether each optional kind (PodMonitor, InferencePool, HTTPRoute) is served, and when that was asked.
    served: dict[tuple[str, str], tuple[bool, float]] = field(default_factory=dict)
    detected_cloud: str = "generic"
    detected_at: float = -math.inf
    # One look at the nodes or at discovery when the cached answer expires, not one per worker thread.
    discovery_lock: threading.Lock = field(default_factory=threading.Lock)
    # The last look-up of each in-cluster collector Service, by (namespace, name) (mmfleet.handlers.discovery).
    collectors: dict[Key, CollectorLookup] = field(default_factory=dict)
    # Whether the missing RBAC for EndpointSlices has been logged (once: it lasts until the ClusterRole changes).
    endpointslices_forbidden_logged: bool = False
    # A context of kopf's handlers, for kopf.event outside them (see remember_kopf_context).
    kopf_context: contextvars.Context | None = None
    # The SDK's provider of the operator's own spans (mmfleet.telemetry.setup), None when they go nowhere.
    tracer_provider: TracerProvider | None = None
    # The operator's own loops (the workers, the resync tick, the autoscaler), cancelled at cleanup, and the threads
    # the workers' reconciles run in, awaited at cleanup (no apply may outlive the Lease).
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    pool: ThreadPoolExecutor | None = None
    autoscaler: asyncio.Task[None] | None = None
    # time.monotonic() when the autoscaling loop last finished a cycle (or started), for the liveness probe.
    autoscaler_cycled: float = -math.inf
    # The threads that put warm-standby pods to sleep, and those that wake them (mmfleet.handlers.standby).
    standby_pools: tuple[ThreadPoolExecutor, ThreadPoolExecutor] | None = None
    # The threads that read new pods' server logs for the autoscaler (mmfleet.handlers.autoscale), while its loop runs.
    server_log_pool: ThreadPoolExecutor | None = None

    kube_lock: threading.Lock = field(default_factory=threading.Lock)

    def get_kube(self) -> Kube:
        """The one client, made on first use: without leader election, the first reconciles ask at once from their
        threads, and each client made would open its own connections and read discovery again."""
        with self.kube_lock:
            if self.kube is None:
                self.kube = Kube(load_client(pool_size(self.config.workers)))
            return self.kube

    def record(self, key: Key, uid: str | None = None) -> FleetRecord:
        """The fleet's record; a new one when ``uid`` says the name now belongs to another fleet (a missed delete).

        Only the event loop makes or replaces records (watch events, in order per fleet); worker threads ``find``.
        """
        found = self.find(key, uid)
        if found is None:
            found = self.records[key] = FleetRecord(uid=uid)
        elif found.uid is None:
            found.uid = uid
        return found

    def find(self, key: Key, uid: str | None) -> FleetRecord | None:
        """The record of the fleet ``uid`` under ``key``; None when the name is gone or now another fleet's."""
        found = self.records.get(key)
        if found is None or (uid is not None and found.uid is not None and found.uid != uid):
            return None
        return found

    def forget(self, key: Key, uid: str | None = None) -> None:
        """Drop the fleet's record and pending work; with ``uid``, only if the name still belongs to that fleet
        (a namesake created since must not lose its own)."""
        if uid is not None and self.find(key, uid) is None:
            return
        self.records.pop(key, None)
        if self.queue is not None:
            self.queue.discard(key)

    def remember_kopf_context(self) -> None:
        """Keep the context of a kopf handler, for ``kopf.event`` from the operator's own loops, which have none.

        ``kopf.event`` reads the operator's settings, its event queue and that queue's event loop from
        context variables that kopf sets only around its handlers (kopf 1.45.2,
        ``kopf/_core/engines/posting.py``); events posted in this context join kopf's own queue.
        """
        if self.kopf_context is None:
            self.kopf_context = contextvars.copy_context()

    def in_kopf_context(self) -> contextvars.Context:
        """A context to run a thread's work in, where ``kopf.event`` can post (empty before any fleet was seen)."""
        return (self.kopf_context or contextvars.Context()).copy()


MEMO_KEY = "mmfleet"


def operator_of(memo: Any) -> Operator:
    """The ``Operator`` that ``cli run`` handed kopf as its memo (kopf gives each object a shallow copy of it)."""
    return cast(Operator, memo[MEMO_KEY])


def parse_spec(op: Operator, record: FleetRecord, body: Body) -> MultimodalInference:
    """``validation.parse`` under the admin's policy, once per generation; raises ``SpecError`` as it does, and
    ``PolicyDeniedError`` for a fleet in a system namespace (the reconcile and the autoscaler both start here).

    The spec, name, namespace and uid (all that rendering and the autoscaler read) only change with
    the generation. The status in the result is the one first parsed: read it with ``last_status``.
    """
    generation = body["metadata"].get("generation")
    cached = record.parsed
    if cached is not None and cached.generation == generation:
        return cached.inference
    refuse_system_namespace(str(body["metadata"].get("namespace") or ""))
    inference = parse(body, op.config.policy)
    record.parsed = Parsed(generation, inference)
    return inference


def render_children(
    op: Operator,
    record: FleetRecord,
    inference: MultimodalInference,
    cloud: str,
    monitoring_crds: bool,
    routing_crds: RoutingCrds,
    measured_cold_start: float | None = None,
) -> list[Body]:
    """``render.render``, once per generation, cloud, served CRDs and picker settings; callers must not change the
    result. ``measured_cold_start``: the fleet's, as its status shows it."""
    # The NetworkPolicy admits the operator's Prometheus to /metrics when its URL names an in-cluster Service.
    prometheus = status.collector_service(op.config.prometheus_url, "") if op.config.prometheus_url else None
    # The picker's request TTL outlives the operator's expected cold start (not one held in memory: it would change the
    # picker's configuration, and restart it, at each restart of the operator). A fleet that may scale to zero holds
    # its first request for the measured cold start from its status, after the autoscaler's next cycle and the
    # picker's next scrape.
    lead = op.config.default_cold_start
    autoscaling = inference.spec.autoscaling
    if inference.spec.autoscaled and autoscaling is not None and autoscaling.min_replicas == 0:
        lead = max(lead, measured_cold_start or 0.0) + op.config.autoscale_interval + render.SCRAPE_INTERVAL
    picker = PickerSettings(lead, op.config.picker_cluster_role, op.config.picker_image)
    settings: dict[str, Any] = {
        "monitoring_crds": monitoring_crds,
        "collector_endpoint": op.config.collector_endpoint,
        "prometheus_namespace": prometheus[0] if prometheus else None,
        "picker": picker,
        "routing_crds": routing_crds,
        "operator_namespace": own_namespace(),
    }
    cached = record.parsed
    if cached is None or cached.inference is not inference:
        return render.render(inference, cloud, **settings)
    key = (cloud, monitoring_crds, routing_crds, picker)
    if key not in cached.rendered:
        cached.rendered[key] = render.render(inference, cloud, **settings)
    return cached.rendered[key]


def previous_status(body: Body) -> MultimodalInferenceStatus | None:
    try:
        return MultimodalInferenceStatus.model_validate(body.get("status") or {})
    except ValidationError:
        return None


def last_status(record: FleetRecord, body: Body) -> MultimodalInferenceStatus | None:
    """The status as this process last judged it, else as the resource shows it (after a restart)."""
    return record.written if record.written is not None else previous_status(body)


def never_reported(previous: MultimodalInferenceStatus | None) -> bool:
    """Whether a fleet's status has never named a generation: no write of ours has reached it yet."""
    return previous is None or previous.observed_generation is None


def kopf_event(body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    target = body if isinstance(body, kopf.Body) else kopf.Body(cast(kopf.RawBody, dict(body)))
    kopf.event(target, type=type_, reason=reason, message=message)


def write_status(
    op: Operator,
    record: FleetRecord,
    body: kopf.Body | Body,
    new: MultimodalInferenceStatus,
    previous: MultimodalInferenceStatus | None,
) -> bool:
    """Write status only when it changed, and tell the user about transitions as events; whether it wrote.

    A new fleet's first status waits up to FIRST_STATUS_WAIT while it only says "rolling out": a rollout that ends
    by then is written once, Ready, rather than twice; bad news is never held.

    "Changed" is judged against what this process last judged (the operator is the only writer),
    because the watched copy of the resource can lag behind our own last patch. Conditions are kept
    in one order: the reconcile and the autoscaler each list their own first, and would otherwise
    rewrite each other's status on every cycle without changing a thing. A fleet deleted since the
    event or cycle that asked for the write (404) has no status to write and no one to tell.
    """
    new = new.model_copy(update={"conditions": sorted(new.conditions, key=lambda c: CONDITION_TYPES.index(c.type))})
    meta = body["metadata"]
    previous = record.written or previous
    # observedGeneration is the generation whose children were last applied, not the one an autoscaling cycle happens
    # to read: a spec still waiting for its apply (a retry, a reconcile not yet run) is not reported as current,
    # which Argo CD's health check and kstatus read as done.
    applied = (
        record.reconciled if record.reconciled is not None else (previous.observed_generation if previous else None)
    )
    if applied is not None and (new.observed_generation or 0) > applied:
        new = new.model_copy(update={"observed_generation": applied})
    if previous == new:
        return False
    if record.holding_status(time.monotonic()) is not None and status.rolling_out(new):
        return False
    wire = new.wire()
    if previous is not None and previous.wire() == wire:
        record.written = new
        return False
    attributes = {
        **telemetry.fleet(meta["namespace"], meta["name"], new.observed_generation),
        telemetry.PHASE: new.phase or "",
    }
    # A merge patch keeps what it does not name: status.routing, gone once the fleet is back in routing mode service,
    # status.standby, once warm standby is off, and status.encode, once the encode tier is, are named with null (only
    # they: the replica counts a refused apply's status leaves out must stay).
    before = previous.wire() if previous is not None else {}
    gone = {"routing", "standby", "encode"} & (set(before) - set(wire))
    patch = {**wire, **dict.fromkeys(gone)}
    # And within status.encode, its autoscaler's fields once that is off.
    if isinstance(before.get("encode"), dict) and isinstance(wire.get("encode"), dict):
        patch["encode"] = {**dict.fromkeys(set(before["encode"]) - set(wire["encode"])), **wire["encode"]}
    with telemetry.tracer().start_as_current_span(telemetry.STATUS_WRITE, attributes=attributes):
        try:
            op.get_kube().patch_status(meta["namespace"], meta["name"], patch)
        except NotFoundError:
            record.written = None
            return False
    record.written = new
    for type_, reason, message in status.events(previous, new):
        kopf_event(body, type_, reason, message)
    return True


def utc_now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)
