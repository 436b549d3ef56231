"""The autoscaling loop: one cycle for all fleets, every ``autoscale_interval``, and its liveness probe.

Every cycle reads kopf's indexes, asks Prometheus one batched query per signal and per distinct SLO
(side by side, within half the interval, so a slow query cannot stall the loop), and per fleet
decides (the pure ``autoscaler.cycle``), scales through the Deployment's scale subresource, writes
status and posts an event (``kopf.event``) for every scale decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import kopf
from opentelemetry import context as otel_context
from opentelemetry.trace import Link, Span, SpanContext, Status, StatusCode

from mmfleet import backends, metrics_export, render, status, telemetry
from mmfleet.api import MultimodalInference, MultimodalInferenceStatus, seconds
from mmfleet.autoscaler import cycle, encode, metrics, standby
from mmfleet.backends import Backend, ServerStartup
from mmfleet.handlers import standby as fleet_standby
from mmfleet.handlers.children import INDEXES, deployment_pods, fleet_children, owned_deployment
from mmfleet.handlers.discovery import resolve_cloud
from mmfleet.handlers.reconcile import encode_seen
from mmfleet.handlers.records import (
    Body,
    FleetRecord,
    Key,
    Operator,
    kopf_event,
    last_status,
    log,
    operator_of,
    parse_spec,
    utc_now,
    write_status,
)
from mmfleet.kube import RetryableError, error_text
from mmfleet.render import CONTAINER, SpecError

# A server logs its start first: this much of the beginning of its log holds it (vLLM's, with a model's download
# bars, tens of KiB) and leaves out most of the requests it has logged since.
SERVER_LOG_BYTES = 256 * 1024
SERVER_LOGS_PER_CYCLE = 4  # per fleet and cycle: a large fleet's logs come over several cycles, a few at a time
SERVER_LOG_THREADS = 4  # reads of pods' logs side by side, apart from the cycle's threads
SERVER_LOG_TRIES = 3  # reads of one pod's log that time out or meet a 5xx before it is left whole
# The liveness probe fails when no cycle has finished for this many intervals, plus STALL_MARGIN seconds.
STALL_INTERVALS = 3
STALL_MARGIN = 30.0


@dataclass(frozen=True)
class FleetView:
    """One autoscaled fleet as the indexes showed it at the start of a cycle."""

    key: Key
    body: Body
    deployment: Body | None
    pods: list[Body]
    encode: Body | None = None  # with spec.disaggregation.encode: the encode tier's Deployment
    encode_pods: list[Body] = dataclasses.field(default_factory=list)


def autoscaled_fleets(indexes: Mapping[str, Any]) -> list[FleetView]:
    """A snapshot of the fleets with an autoscaling section, taken on the event loop, where kopf updates the indexes."""
    views = []
    fleets: kopf.Index[Key, Body] = indexes["fleets"]
    for key, found in fleets.items():
        body = next(iter(found), None)
        if body is None or body["metadata"].get("deletionTimestamp") or not body.get("spec", {}).get("autoscaling"):
            continue
        uid = body["metadata"].get("uid")
        view = FleetView(key, body, *fleet_children(indexes, key, uid))
        encode_spec = (body.get("spec", {}).get("disaggregation") or {}).get("encode")
        if encode_spec is not None:
            name = key[1] + render.ENCODE_SUFFIX
            tier = owned_deployment(indexes, key, uid, name)
            view = dataclasses.replace(
                view, encode=tier, encode_pods=deployment_pods(indexes, key, name) if tier else []
            )
        views.append(view)
    return views


# The Deployment and pods of a fleet (key, uid) as the indexes show them now (for the status, written under its lock).
Children = Callable[[Key, str | None], tuple[Body | None, list[Body]]]


def autoscale(
    op: Operator,
    views: list[FleetView],
    prometheus: metrics.Prometheus | None,
    pool: ThreadPoolExecutor,
    children: Children,
) -> None:
    """One cycle over every autoscaled fleet: one batched read of Prometheus, then the fleets side by side."""
    started, now = time.perf_counter(), utc_now()
    fleets: list[tuple[FleetView, MultimodalInference]] = []
    for view in views:
        with contextlib.suppress(SpecError):  # an invalid spec is reported by its reconcile
            record = op.find(view.key, view.body["metadata"].get("uid"))
            if record is None:  # indexed before its watch event made a record: the next cycle takes it
                continue
            inference = parse_spec(op, record, view.body)
            # A fleet whose reconcile applied nothing (a child it does not own, a refused apply) is not scaled:
            # its Deployment may be someone else's.
            if inference.spec.autoscaled and view.deployment is not None and record.refused is None:
                fleets.append((view, inference))
    # Autoscaling turned off (or the fleet gone): start afresh if it comes back. A fleet whose Deployment
    # is missing for a moment, or whose spec is briefly invalid, keeps what it learned.
    autoscaled = {view.key for view in views}
    for key, record in list(op.records.items()):
        if key not in autoscaled:
            record.scaling = None
    metrics_export.forget_others({view.key for view, _ in fleets})
    tracer = telemetry.tracer()
    with tracer.start_as_current_span(telemetry.AUTOSCALE_CYCLE, attributes={telemetry.FLEETS: len(fleets)}):
        with tracer.start_as_current_span(telemetry.OBSERVE) as observe:
            if prometheus is None:
                readings = metrics.Readings(outage="no Prometheus configured (MMFLEET_PROMETHEUS_URL is empty)")
            else:
                readings = _read(prometheus, [inference for _, inference in fleets], now.timestamp())
            telemetry.set_present(observe, {telemetry.QUERIES: readings.queries, telemetry.OUTAGE: readings.outage})
        # The fleets' threads run in kopf's context, which has no span: the cycle's is handed over.
        traced = Traced(otel_context.get_current(), observe.get_span_context())
        # An empty context when no fleet was indexed yet, so there is nothing to post about.
        done = list(
            pool.map(
                lambda f: op.in_kopf_context().run(_autoscale_fleet, op, f[0], f[1], readings, now, children, traced),
                fleets,
            )
        )
    metrics_export.record_cycle(readings, time.perf_counter() - started)
    log.info(
        "autoscaling cycle: %d fleets, %d Prometheus queries%s, %d scaled, %d status writes, in %.0f ms",
        len(fleets), readings.queries, " (failed)" if readings.outage else "", sum(s for s, _ in done),
        sum(w for _, w in done),
        (time.perf_counter() - started) * 1000,
    )  # fmt: skip


def _read(prometheus: metrics.Prometheus, inferences: list[MultimodalInference], at: float) -> metrics.Readings:
    """Prometheus' answers; whatever goes wrong building the queries or reading them holds every fleet, said in
    MetricsAvailable, instead of ending the cycle before any fleet's status is written."""
    try:
        return prometheus.read([metrics.Target.of(inference) for inference in inferences], at)
    except Exception as error:  # a bug or an answer no check foresaw: the fleets hold and say so
        log.exception("reading Prometheus failed")
        metrics_export.error("autoscale_cycle")
        return metrics.Readings(outage=f"reading {prometheus.url} failed: {type(error).__name__}: {error}"[:1000])


@dataclass(frozen=True)
class Traced:
    """Where a fleet's decision span goes: under the cycle's span, linked to the Prometheus read it used."""

    parent: otel_context.Context
    observation: SpanContext


def _autoscale_fleet(
    op: Operator,
    view: FleetView,
    inference: MultimodalInference,
    readings: metrics.Readings,
    now: datetime,
    children: Children,
    traced: Traced | None = None,
) -> tuple[bool, bool]:
    """Decide, scale, write status and post the event for one fleet; whether it scaled, and wrote status.

    The decision is made on the cycle's snapshot; the status from the children as they are under
    the lock, so it never undoes a newer refresh (a pod that turned Ready since the snapshot).
    The decision is a span, linked to the observation (the Prometheus read) it was made on.
    """
    assert view.deployment is not None
    replicas = view.deployment.get("spec", {}).get("replicas")
    if replicas is None:
        return False, False
    meta = inference.metadata
    with telemetry.tracer().start_as_current_span(
        telemetry.DECIDE,
        context=traced.parent if traced else None,
        links=[Link(traced.observation)] if traced else (),
        attributes=telemetry.fleet(meta.namespace, meta.name, meta.generation),
    ) as span:
        return _decide_fleet(op, view, inference, int(replicas), readings, now, children, span)


def _decide_fleet(
    op: Operator,
    view: FleetView,
    inference: MultimodalInference,
    replicas: int,
    readings: metrics.Readings,
    now: datetime,
    children: Children,
    span: Span,
) -> tuple[bool, bool]:
    meta = inference.metadata
    config = op.config
    record = op.find(view.key, meta.uid)
    if record is None:  # deleted since the cycle's snapshot
        return False, False
    try:
        with record.lock:
            # With warm standby the Deployment runs the autoscaler's replicas and the standby's (as last applied).
            spare = status.standby_replicas(view.deployment)
            current = max(0, replicas - spare)
            with record.standby.lock:
                wakes = standby.waking(view.pods, record.standby.busy)
                wake = standby.median_wake(record.standby.wakes)
            counted, signals = _serving_view(view, current, spare, wakes, readings.signals.get(view.key), now)
            counted = cycle.with_server(counted, record.server_logs.read)
            if spare:  # the policy plans with the wake for the replicas asleep (autoscaler.policy)
                counted = dataclasses.replace(counted, asleep=standby.asleep(view.pods), wake=wake)
            seen = cycle.Seen(current, counted, signals, readings.outage)
            memory = record.scaling or _first_memory(last_status(record, view.body))
            outcome = cycle.decide(
                inference,
                seen,
                memory,
                now,
                interval=config.autoscale_interval,
                default_cold_start=config.default_cold_start,
            )
            record.scaling = outcome.memory
            metrics_export.record_decision(view.key, inference, seen, outcome, config.default_cold_start)
            _describe(span, inference, seen, outcome, config.default_cold_start)
            kube = op.get_kube()
            target = outcome.replicas + spare
            if outcome.scaled or target != replicas:
                kube.scale(meta.namespace, meta.name, target)
                log.info("scaled %s/%s: %s", meta.namespace, meta.name, outcome.reason)
            lead = outcome.memory.cold_start if outcome.memory.cold_start is not None else config.default_cold_start
            scaled_encode = _scale_encode(op, record, view, inference, readings, now, lead)
            scaling = dataclasses.replace(outcome.scaling(), replicas=target, encode=scaled_encode)
            previous = last_status(record, view.body)
            encode_metrics = scaled_encode.metrics if scaled_encode is not None else _kept_encode_metrics(previous)
            if encode_metrics is not None and inference.spec.encode_autoscaling is not None:
                scaling = dataclasses.replace(scaling, conditions=(*scaling.conditions, encode_metrics))
            deployment, pods = children(view.key, meta.uid)
            if inference.spec.standby is not None:  # planned on the pods as they are now: a wake may have ended
                args = (op, record, view.key, view.body, inference, pods, outcome.replicas, target)
                scaling = dataclasses.replace(scaling, standby=fleet_standby.tend(*args))
            observed = status.Observed(
                deployment=deployment or view.deployment,
                pod_problems=status.pod_problems(pods),
                cloud=resolve_cloud(op, inference),
                scaling=scaling,
                cache_problem=record.cache_problem,
                tracing=record.tracing,
                retrying=record.retrying,
                encode=encode_seen(op, inference),  # as the indexes show it now, as the serving tier's children
            )
            wrote = write_status(
                op, record, view.body, status.compute_status(inference, observed, previous, now), previous
            )
            if outcome.scaled:
                kopf_event(view.body, "Normal", outcome.event_reason, outcome.reason)
        _read_server_logs_soon(op, record, view, inference, counted)
    except Exception as error:  # one fleet's failure (an API error, a bug) must not stop the others
        log.exception("autoscaling %s/%s failed", meta.namespace, meta.name)
        metrics_export.error("autoscale_fleet")
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, str(error)))
        return False, False
    return outcome.scaled, wrote


def _first_memory(previous: MultimodalInferenceStatus | None) -> cycle.Memory:
    """A fleet's memory on this process's first cycle: a PreprocessingBound the status shows True stays on its lower
    thresholds, so an operator's restart does not turn it off and on again (a Warning each time)."""
    found = next((c for c in (previous.conditions if previous else []) if c.type == "PreprocessingBound"), None)
    return cycle.Memory(preprocessing_bound=found is not None and found.status == "True")


def _kept_encode_metrics(previous: MultimodalInferenceStatus | None) -> status.ConditionRow | None:
    """EncodeMetricsAvailable as last written, for a cycle whose encode step did not decide (its Deployment not in the
    index, a failed call): a cycle's conditions replace the autoscaler's, and it must not vanish for one cycle."""
    found = next((c for c in (previous.conditions if previous else []) if c.type == "EncodeMetricsAvailable"), None)
    if found is None:
        return None
    return ("EncodeMetricsAvailable", {"True": True, "False": False}.get(found.status), found.reason, found.message)


def _scale_encode(
    op: Operator,
    record: FleetRecord,
    view: FleetView,
    inference: MultimodalInference,
    readings: metrics.Readings,
    now: datetime,
    fleet_cold_start: float,
) -> status.EncodeScaling | None:
    """With its autoscaling on, one cycle for the fleet's encode tier (``autoscaler.encode``): decide, scale its
    Deployment, post the event. Its cold start is its own pods' once measured, the serving tier's until then. Its
    failure (an API error, a bug) is logged and leaves the serving tier's status and event to be written."""
    replicas = (view.encode or {}).get("spec", {}).get("replicas")
    if inference.spec.encode_autoscaling is None or replicas is None:
        record.encode_scaling = None  # turned off, or its Deployment not made yet: start afresh
        return None
    meta = inference.metadata
    try:
        pods = cycle.count_pods(view.encode_pods)
        outcome = encode.decide_encode(
            inference,
            int(replicas),
            pods,
            readings.encode.get(view.key),
            readings.outage,
            record.encode_scaling or encode.EncodeMemory(),
            now,
            interval=op.config.autoscale_interval,
            cold_start=pods.cold_start if pods.cold_start is not None else fleet_cold_start,
        )
        if outcome.scaled:
            op.get_kube().scale(meta.namespace, render.encode_name(inference), outcome.replicas)
    except Exception:
        log.exception("autoscaling the encode tier of %s/%s failed", meta.namespace, meta.name)
        metrics_export.error("autoscale_fleet")
        return None
    record.encode_scaling = outcome.memory
    if outcome.scaled:
        log.info("scaled the encode tier of %s/%s: %s", meta.namespace, meta.name, outcome.reason)
        event = "EncodeScaledUp" if outcome.replicas > outcome.current else "EncodeScaledDown"
        kopf_event(view.body, "Normal", event, outcome.reason)
    return status.EncodeScaling(
        outcome.replicas, outcome.scaled, outcome.reason, outcome.latency, outcome.target, outcome.metrics
    )


def _read_server_logs_soon(
    op: Operator, record: FleetRecord, view: FleetView, inference: MultimodalInference, counted: cycle.Pods
) -> None:
    """Queue the reads of new Ready pods' server logs in the server-log threads, one batch per fleet at a time, so
    the cycle never waits on them (after an operator restart at 1,000 fleets, up to 4,000 reads); a later cycle
    sees what they found. Without the loop's threads (a single cycle run by hand), read now."""
    pool = op.server_log_pool
    if pool is None:
        _read_server_logs(op, record, view, inference, counted)
        return
    with record.lock:
        batch = record.server_logs.reading
        if batch is not None and not batch.done():  # a cancelled batch is done: the next cycle queues it again
            return
        backend = backends.get(inference.spec.backend.name)
        names = _unread_logs(record, view, backend, counted)
        if not names:
            return
        with contextlib.suppress(RuntimeError):  # the loop is stopping: its pool takes no more work
            record.server_logs.reading = pool.submit(_read_logs, op, record, view.key, backend, names)
            record.server_logs.reading.add_done_callback(_log_failure)


def _log_failure(batch: Future[None]) -> None:
    """A batch's bug, logged and counted as the cycle's would be; the next cycle reads those pods again."""
    error = None if batch.cancelled() else batch.exception()
    if error is not None:
        log.error("reading server logs failed", exc_info=error)
        metrics_export.error("autoscale_fleet")


def _read_server_logs(
    op: Operator, record: FleetRecord, view: FleetView, inference: MultimodalInference, counted: cycle.Pods
) -> None:
    """Read what new Ready pods' servers logged about their start (``_unread_logs``), now."""
    backend = backends.get(inference.spec.backend.name)
    with record.lock:
        names = _unread_logs(record, view, backend, counted)
    _read_logs(op, record, view.key, backend, names)


def _unread_logs(record: FleetRecord, view: FleetView, backend: Backend, counted: cycle.Pods) -> list[str]:
    """Under the fleet's lock: forget the pods gone, and name the Ready pods whose server log is still to read, once
    per pod, at most ``SERVER_LOGS_PER_CYCLE`` a cycle (after an operator restart a large fleet's pods are read over
    several cycles); none where the backend's start is not in its log (TensorRT-LLM)."""
    logs = record.server_logs
    present = {pod.get("metadata", {}).get("name") for pod in view.pods}
    for gone in (set(logs.read) | set(logs.failures)) - present:
        logs.read.pop(gone, None)
        logs.failures.pop(gone, None)
    if not backend.start_in_log:
        return []
    return sorted({start.pod for start in counted.starts} - set(logs.read))[:SERVER_LOGS_PER_CYCLE]


def _read_logs(op: Operator, record: FleetRecord, key: Key, backend: Backend, names: list[str]) -> None:
    """Read the pods' logs and observe what they say in the operator's metrics; the next cycles show it in status. A
    read that fails for good (the operator's RBAC without pods/log, a node that keeps no log) or ``SERVER_LOG_TRIES``
    times leaves that pod's ready phase whole. The fleet's lock is held to keep what was read, never over a read."""
    logs = record.server_logs
    namespace = key[0]
    for name in names:
        try:
            startup = backend.startup(op.get_kube().pod_log(namespace, name, CONTAINER, SERVER_LOG_BYTES))
        except Exception as error:  # refused (403 without pods/log, 404) or not readable: the phase stays whole
            with record.lock:
                tries = logs.failures[name] = logs.failures.get(name, 0) + 1
            if isinstance(error, RetryableError) and tries < SERVER_LOG_TRIES:  # a timeout, a 5xx: next cycle
                continue
            log.info("pod %s/%s: its server's log was not read (%s)", namespace, name, error_text(error))
            startup = ServerStartup()
        else:
            metrics_export.record_server_startup(key, startup)
        with record.lock:
            logs.read[name] = startup
            logs.failures.pop(name, None)


def _serving_view(
    view: FleetView, current: int, spare: int, waking: int, signals: metrics.Signals | None, now: datetime
) -> tuple[cycle.Pods, metrics.Signals | None]:
    """The pods and signals the policy decides on. Pods a quota refused never exist; like unschedulable ones, they
    stop growth. With warm standby: without the pods out of routing, whose series are zeros that Prometheus still
    scrapes, and with the starting and unschedulable pods the autoscaler's ``current`` can use beside the Ready and
    the ``waking`` ones (the rest are the standby's replacements); cold starts are measured on every pod, so a woken
    one's is not counted twice."""
    serving = standby.serving_pods(view.pods)
    counted = cycle.count_pods(serving)
    refused, why = status.refused_pods(view.deployment)
    if refused:
        why = counted.why_unschedulable or why
        counted = dataclasses.replace(counted, unschedulable=counted.unschedulable + refused, why_unschedulable=why)
    if len(serving) == len(view.pods) and not spare:
        return counted, signals
    every = cycle.count_pods(view.pods)
    counted = standby.active_count(counted, current, waking)
    counted = dataclasses.replace(counted, starts=every.starts, cold_start=every.cold_start)
    resting = standby.reporting_resting(view.pods, now)
    if signals is not None and signals.reporting is not None and resting:
        signals = dataclasses.replace(signals, reporting=max(0, signals.reporting - resting))
    return counted, signals


def _describe(
    span: Span, inference: MultimodalInference, seen: cycle.Seen, outcome: cycle.Outcome, default_cold_start: float
) -> None:
    """The decision and what it was made on: replicas before and after, the reason, the signals, the pods."""
    if not span.is_recording():  # no tracing configured: nothing to build
        return
    signals = seen.signals or metrics.Signals()
    slo = inference.spec.autoscaling.slo if inference.spec.autoscaling else None
    cold_start = outcome.memory.cold_start
    telemetry.set_present(
        span,
        {
            telemetry.REPLICAS_BEFORE: outcome.current,
            telemetry.REPLICAS_AFTER: outcome.replicas,
            telemetry.SCALED: outcome.scaled,
            telemetry.REASON: outcome.reason,
            telemetry.LATENCY: signals.latency,
            telemetry.REQUEST_RATE: signals.request_rate,
            telemetry.WAITING: signals.waiting,
            telemetry.RUNNING: signals.running,
            telemetry.KV_CACHE_USAGE: signals.kv_cache_usage,
            telemetry.MISSING: list(signals.missing) if signals.missing else None,
            telemetry.OUTAGE: seen.outage,
            telemetry.SLO_TARGET: seconds(slo.target) if slo else None,
            telemetry.SLO_PERCENTILE: slo.percentile if slo else None,
            telemetry.PODS_READY: seen.pods.ready,
            telemetry.PODS_STARTING: seen.pods.starting,
            telemetry.PODS_UNSCHEDULABLE: seen.pods.unschedulable,
            telemetry.COLD_START: default_cold_start if cold_start is None else cold_start,
        },
    )


async def autoscale_forever(op: Operator, indexes: Mapping[str, Any]) -> None:
    """Every ``autoscale_interval``: a snapshot of the indexes here, the cycle's blocking I/O in a thread."""
    config = op.config
    prometheus = (
        metrics.Prometheus(config.prometheus_url, config.prometheus_deadline) if config.prometheus_url else None
    )
    pool = ThreadPoolExecutor(config.workers, thread_name_prefix="autoscaler")
    logs = op.server_log_pool = ThreadPoolExecutor(SERVER_LOG_THREADS, thread_name_prefix="server-logs")

    children = functools.partial(fleet_children, indexes)

    try:
        while True:
            started = time.monotonic()
            views = autoscaled_fleets(indexes)
            try:
                await asyncio.to_thread(autoscale, op, views, prometheus, pool, children)
            except Exception:
                log.exception("autoscaling cycle failed")
                metrics_export.error("autoscale_cycle")
            else:
                op.autoscaler_cycled = time.monotonic()
            await asyncio.sleep(max(0.0, config.autoscale_interval - (time.monotonic() - started)))
    finally:  # on cancellation at shutdown: never wait for a cycle on the event loop
        pool.shutdown(wait=False, cancel_futures=True)
        logs.shutdown(wait=False, cancel_futures=True)
        op.server_log_pool = None
        for standby_pool in op.standby_pools or ():  # sleeps and wakes not started yet are dropped; a pod's
            standby_pool.shutdown(wait=False, cancel_futures=True)  # annotation says where it was, for the next leader
        op.standby_pools = None
        if prometheus is not None:
            prometheus.close()


async def start_autoscaler(memo: kopf.Memo, **kwargs: Any) -> None:
    """Start the loop once kopf's indexes exist (they fill as the watches start; the first cycle waits one interval)."""
    op = operator_of(memo)
    indexes = {name: kwargs[name] for name in INDEXES}

    async def run() -> None:
        await asyncio.sleep(op.config.autoscale_interval)
        await autoscale_forever(op, indexes)

    op.autoscaler_cycled = time.monotonic()
    op.autoscaler = asyncio.create_task(run(), name="mmfleet autoscaler")
    log.info("autoscaler: every %gs, Prometheus %s", op.config.autoscale_interval, op.config.prometheus_url or "(none)")


async def stop_autoscaler(memo: kopf.Memo, **_: Any) -> None:
    op = operator_of(memo)
    if op.autoscaler is not None:
        op.autoscaler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await op.autoscaler


async def check_autoscaler(memo: kopf.Memo, **_: Any) -> str:
    """Turn kopf's liveness endpoint red when the autoscaling loop has stopped cycling.

    A probe that raises ``PermanentError`` fails kopf's probing activity, and /healthz answers 500
    (kopf 1.45.2, ``kopf/_core/engines/probing.py``); any other exception would be retried after a
    backoff, holding the probe's request open instead.
    """
    op = operator_of(memo)
    loop = op.autoscaler
    if loop is None:
        return "not started"
    if loop.done():
        raise kopf.PermanentError("the autoscaling loop has ended")
    silent = time.monotonic() - op.autoscaler_cycled
    limit = STALL_INTERVALS * op.config.autoscale_interval + STALL_MARGIN
    if silent > limit:
        raise kopf.PermanentError(f"no autoscaling cycle finished for {silent:.0f}s (limit {limit:.0f}s)")
    return f"last cycle {silent:.0f}s ago"
