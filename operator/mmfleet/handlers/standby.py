"""Warm standby's I/O: pods put to sleep and woken (vLLM's ``/sleep`` and ``/wake_up``) and moved out of and into
routing (the ``mmfleet.io/serving`` label), each in a thread of its own, off the autoscaler's cycle: a sleep waits for
the pod's running requests.

The order keeps requests away from a paused engine, which queues them until it wakes: a pod leaves routing before
``/sleep`` and comes back only once ``/wake_up`` answered, or, when a sleep failed, once the server says it is awake
(``GET /is_sleeping``). A pod whose call failed is left alone for a backoff that doubles up to ``BACKOFF_MAX``. What
the plan decides is in ``autoscaler.standby``.
"""

from __future__ import annotations

import ipaddress
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mmfleet import backends, metrics_export
from mmfleet.api import MultimodalInference, StandbyStatus, duration_text
from mmfleet.autoscaler import standby
from mmfleet.autoscaler.standby import (
    ASLEEP_DELETION_COST,
    DELETION_COST_ANNOTATION,
    FAILED_EVENT,
    SLEEP_ANNOTATION,
    WOKE_EVENT,
    PodView,
)
from mmfleet.handlers.records import Body, FleetRecord, Key, Operator, kopf_event, log
from mmfleet.render import DRAIN_SECONDS, SERVING_LABEL, STARTUP_BUDGET_SECONDS

# The Service's EndpointSlices and the picker follow a label within about a second; a sleep starts after this, so
# requests already on their way are in the engine and finished by mode=wait.
SETTLE_SECONDS = 2.0
# A sleep waits for the pod's running requests, as long as a drain; a wake copies the weights back (bounded like a
# start, which it replaces).
SLEEP_TIMEOUT = float(DRAIN_SECONDS)
WAKE_TIMEOUT = float(STARTUP_BUDGET_SECONDS)
PROBE_TIMEOUT = 5.0
BACKOFF_FIRST, BACKOFF_MAX = 15.0, 600.0
WORKERS = 8


def tend(
    op: Operator,
    record: FleetRecord,
    key: Key,
    body: Body,
    inference: MultimodalInference,
    pods: list[Body],
    serving: int | None,
    total: int,
) -> StandbyStatus:
    """Start this cycle's sleeps and wakes for a fleet that should have ``serving`` replicas in routing (None: wake
    every pod, standby is off) out of ``total``; what its status shows of the standby."""
    memory = record.standby
    now = time.monotonic()
    names = {str(pod.get("metadata", {}).get("name")) for pod in pods}
    with memory.lock:
        for gone in set(memory.retry_at) - names:  # pods gone: their backoff with them
            memory.retry_at.pop(gone, None)
            memory.failures.pop(gone, None)
        blocked = {pod for pod, due in memory.retry_at.items() if due > now}
        plan = standby.plan(pods, serving, total, dict(memory.busy), blocked)
        for pod in plan.sleep:
            memory.busy[pod.name] = "sleep"
        for pod in plan.wake:
            memory.busy[pod.name] = "wake"
        shown = standby.status(pods, memory.wakes, memory.problem)
    if not plan.empty:
        sleeps, wakes = _pools(op)
        port = backends.get(inference.spec.backend.name).port
        for pod in plan.label:
            sleeps.submit(op.in_kopf_context().run, _label, op, key, pod)
        for pod in plan.sleep:
            sleeps.submit(op.in_kopf_context().run, _sleep, op, record, key, body, pod, port)
        for pod in plan.wake:
            wakes.submit(op.in_kopf_context().run, _wake, op, record, key, body, pod, port)
    return shown


_POOLS_LOCK = threading.Lock()


def _pools(op: Operator) -> tuple[ThreadPoolExecutor, ThreadPoolExecutor]:
    """The threads of sleeps (and labels) and, apart, those of wakes: a wake never waits behind the sleeps of a
    scale-down, which each wait for their pod's running requests."""
    with _POOLS_LOCK:
        if op.standby_pools is None:
            op.standby_pools = (
                ThreadPoolExecutor(WORKERS, thread_name_prefix="standby-sleep"),
                ThreadPoolExecutor(WORKERS, thread_name_prefix="standby-wake"),
            )
        return op.standby_pools


def _url(pod: PodView, port: int, path: str) -> str:
    host = f"[{pod.ip}]" if ipaddress.ip_address(pod.ip).version == 6 else pod.ip
    return f"http://{host}:{port}{path}"


def _call(url: str, timeout: float, method: str = "POST") -> Mapping[str, Any]:
    """The JSON answer ({} for none). Raises OSError (HTTPError included) or ValueError."""
    request = urllib.request.Request(url, data=b"" if method == "POST" else None, method=method)
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        text = answer.read().decode("utf-8", "replace").strip()
    found = json.loads(text) if text else {}
    return found if isinstance(found, dict) else {}


def _failed(error: BaseException) -> str:
    if isinstance(error, urllib.error.HTTPError):
        detail = error.read().decode("utf-8", "replace").strip()[:300]
        return f"HTTP {error.code}{': ' + detail if detail else ''}"
    if isinstance(error, ValueError):  # an answer that was not the one wanted: the message quotes it
        return str(error)
    return f"{type(error).__name__}: {error}"


def _label(op: Operator, key: Key, pod: PodView) -> None:
    try:
        op.get_kube().mark_pod(key[0], pod.name, {SERVING_LABEL: "true"}, {})
    except Exception as error:  # the next cycle labels it again
        log.warning("labelling pod %s/%s as serving failed: %s", key[0], pod.name, _failed(error))


def _sleep(op: Operator, record: FleetRecord, key: Key, body: Body, pod: PodView, port: int) -> None:
    kube = op.get_kube()
    call = "POST /sleep?level=1&mode=wait"
    try:
        kube.mark_pod(key[0], pod.name, {SERVING_LABEL: "false"}, {SLEEP_ANNOTATION: "sleeping"})
        time.sleep(SETTLE_SECONDS)
        _call(_url(pod, port, "/sleep?level=1&mode=wait"), SLEEP_TIMEOUT)
        kube.mark_pod(
            key[0], pod.name, {}, {SLEEP_ANNOTATION: "asleep", DELETION_COST_ANNOTATION: ASLEEP_DELETION_COST}
        )
    except Exception as error:
        _done(record, key, body, pod, f"pod {pod.name}: {call} failed: {_failed(error)}")
        _back_in_routing_if_awake(op, key, pod, port)
    else:
        _done(record, key, body, pod, None)
        log.info("pod %s/%s asleep, out of routing", key[0], pod.name)


def _back_in_routing_if_awake(op: Operator, key: Key, pod: PodView, port: int) -> None:
    """After a failed sleep: back in routing only if the server says it is awake (a sleep that timed out may still
    have happened); otherwise it stays out, and the next try finishes the sleep."""
    try:
        if _call(_url(pod, port, "/is_sleeping"), PROBE_TIMEOUT, "GET").get("is_sleeping") is False:
            op.get_kube().mark_pod(key[0], pod.name, {SERVING_LABEL: "true"}, {SLEEP_ANNOTATION: None})
    except Exception as error:  # it stays out of routing; the next try finishes the sleep or finds it awake
        log.warning(
            "pod %s/%s: after a failed sleep, asking whether it sleeps failed too: %s", key[0], pod.name, _failed(error)
        )


def _wake(op: Operator, record: FleetRecord, key: Key, body: Body, pod: PodView, port: int) -> None:
    kube = op.get_kube()
    try:
        kube.mark_pod(key[0], pod.name, {}, {SLEEP_ANNOTATION: "waking"})
        started = time.perf_counter()
        answer = _call(_url(pod, port, "/wake_up"), WAKE_TIMEOUT)
        took = time.perf_counter() - started
        if answer.get("status", "awake") != "awake":  # vLLM answers "sleeping" while a tag is still down
            raise ValueError(f"it answered {json.dumps(answer)[:200]}")
        kube.mark_pod(
            key[0], pod.name, {SERVING_LABEL: "true"}, {SLEEP_ANNOTATION: None, DELETION_COST_ANNOTATION: None}
        )
    except Exception as error:
        _done(record, key, body, pod, f"pod {pod.name}: POST /wake_up failed: {_failed(error)}; it stays asleep")
        try:
            kube.mark_pod(key[0], pod.name, {}, {SLEEP_ANNOTATION: "asleep"})
        except Exception as error:
            log.warning("marking pod %s/%s asleep again failed: %s", key[0], pod.name, _failed(error))
    else:
        with record.standby.lock:
            record.standby.wakes.append(took)
        metrics_export.record_wake(key, took)
        _done(record, key, body, pod, None)
        kopf_event(body, "Normal", WOKE_EVENT, f"woke pod {pod.name} in {duration_text(took)}: it serves")


def _done(record: FleetRecord, key: Key, body: Body, pod: PodView, problem: str | None) -> None:
    """The pod's call is over: free it, and on a failure back it off, remember the failure for the status and say a
    new one once as a Warning event (None: it worked)."""
    memory = record.standby
    with memory.lock:
        memory.busy.pop(pod.name, None)
        if problem is None:
            memory.failures.pop(pod.name, None)
            memory.retry_at.pop(pod.name, None)
        else:
            failures = memory.failures[pod.name] = memory.failures.get(pod.name, 0) + 1
            backoff = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** (failures - 1))
            memory.retry_at[pod.name] = time.monotonic() + backoff
        new = problem is not None and problem != memory.failure
        memory.failure = problem
        if problem is not None:
            tries = memory.failures[pod.name]
            problem += f" (tried {tries} time{'s' if tries > 1 else ''}; next in {duration_text(backoff)})"
        memory.problem = problem
    if new and problem is not None:  # once per new failure, not per try
        log.warning("warm standby of %s/%s: %s", key[0], key[1], problem)
        kopf_event(body, "Warning", FAILED_EVENT, problem)
