"""Warm standby's I/O: pods put to sleep and woken (vLLM's ``/sleep`` and ``/wake_up``) and moved out of and into
routing (the ``mmfleet.io/serving`` label), each in a thread of its own, off the autoscaler's cycle: a wake at level 2
reloads the weights, and a sleep waits for the pod's running requests.

The order keeps requests away from a paused engine: a pod leaves routing before ``/sleep`` and comes back only after
``/wake_up`` answered. What the plan decides is in ``autoscaler.standby``.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mmfleet import backends, metrics_export
from mmfleet.api import MultimodalInference, StandbyStatus, duration_text
from mmfleet.autoscaler import standby
from mmfleet.autoscaler.standby import FAILED_EVENT, SLEEP_ANNOTATION, WOKE_EVENT, PodView
from mmfleet.handlers.records import Body, FleetRecord, Key, Operator, kopf_event, log
from mmfleet.render import DRAIN_SECONDS, SERVING_LABEL, STARTUP_BUDGET_SECONDS

# The Service's EndpointSlices and the picker follow a label within about a second; a sleep starts after this, so
# requests already on their way are in the engine and finished by mode=wait, not refused by a paused one.
SETTLE_SECONDS = 2.0
# A sleep waits for the pod's running requests, as long as a drain; a wake at level 2 reloads the weights.
SLEEP_TIMEOUT = float(DRAIN_SECONDS)
WAKE_TIMEOUT = float(STARTUP_BUDGET_SECONDS)
WORKERS = 8


def tend(
    op: Operator,
    record: FleetRecord,
    key: Key,
    body: Body,
    inference: MultimodalInference,
    pods: list[Body],
    serving: int,
) -> StandbyStatus:
    """Start this cycle's sleeps and wakes for a fleet that should have ``serving`` replicas in routing; what its
    status shows of the standby."""
    spec = inference.spec.standby
    assert spec is not None
    memory = record.standby
    with memory.lock:
        plan = standby.plan(pods, serving, frozenset(memory.busy))
        for pod in (*plan.sleep, *plan.wake):
            memory.busy.add(pod.name)
        shown = standby.status(pods, memory.wakes, memory.problem)
    if not plan.empty:
        pool = op.standby_pool = op.standby_pool or ThreadPoolExecutor(WORKERS, thread_name_prefix="standby")
        port = backends.get(inference.spec.backend.name).port
        for pod in plan.label:
            pool.submit(op.in_kopf_context().run, _label, op, key, pod)
        for pod in plan.sleep:
            pool.submit(op.in_kopf_context().run, _sleep, op, record, key, body, pod, port, spec.level)
        for pod in plan.wake:
            pool.submit(op.in_kopf_context().run, _wake, op, record, key, body, pod, port)
    return shown


def _post(url: str, timeout: float) -> Mapping[str, Any]:
    """POST with no body; the JSON answer ({} for none). Raises OSError (HTTPError included) or ValueError."""
    request = urllib.request.Request(url, data=b"", method="POST")
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
    except Exception:  # the next cycle labels it again
        log.exception("labelling pod %s/%s as serving failed", key[0], pod.name)


def _sleep(op: Operator, record: FleetRecord, key: Key, body: Body, pod: PodView, port: int, level: int) -> None:
    kube = op.get_kube()
    call = f"POST /sleep?level={level}&mode=wait"
    try:
        kube.mark_pod(key[0], pod.name, {SERVING_LABEL: "false"}, {SLEEP_ANNOTATION: "sleeping"})
        time.sleep(SETTLE_SECONDS)
        _post(f"http://{pod.ip}:{port}/sleep?level={level}&mode=wait", SLEEP_TIMEOUT)
        kube.mark_pod(key[0], pod.name, {}, {SLEEP_ANNOTATION: "asleep"})
    except Exception as error:
        _problem(record, key, body, f"pod {pod.name}: {call} failed: {_failed(error)}; it serves instead")
        try:  # awake after all: back in routing rather than idle out of it
            kube.mark_pod(key[0], pod.name, {SERVING_LABEL: "true"}, {SLEEP_ANNOTATION: None})
        except Exception:
            log.exception("putting pod %s/%s back in routing failed", key[0], pod.name)
    else:
        _problem(record, key, body, None)
        log.info("pod %s/%s asleep (level %d), out of routing", key[0], pod.name, level)
    finally:
        with record.standby.lock:
            record.standby.busy.discard(pod.name)


def _wake(op: Operator, record: FleetRecord, key: Key, body: Body, pod: PodView, port: int) -> None:
    kube = op.get_kube()
    try:
        kube.mark_pod(key[0], pod.name, {}, {SLEEP_ANNOTATION: "waking"})
        started = time.perf_counter()
        answer = _post(f"http://{pod.ip}:{port}/wake_up", WAKE_TIMEOUT)
        took = time.perf_counter() - started
        if answer.get("status", "awake") != "awake":  # vLLM answers "sleeping" while a tag is still down
            raise ValueError(f"it answered {json.dumps(answer)[:200]}")
        kube.mark_pod(key[0], pod.name, {SERVING_LABEL: "true"}, {SLEEP_ANNOTATION: None})
    except Exception as error:
        _problem(record, key, body, f"pod {pod.name}: POST /wake_up failed: {_failed(error)}; it stays asleep")
        try:
            kube.mark_pod(key[0], pod.name, {}, {SLEEP_ANNOTATION: "asleep"})
        except Exception:
            log.exception("marking pod %s/%s asleep again failed", key[0], pod.name)
    else:
        with record.standby.lock:
            record.standby.wakes.append(took)
        metrics_export.record_wake(key, took)
        _problem(record, key, body, None)
        kopf_event(body, "Normal", WOKE_EVENT, f"woke pod {pod.name} in {duration_text(took)}: it serves")
    finally:
        with record.standby.lock:
            record.standby.busy.discard(pod.name)


def _problem(record: FleetRecord, key: Key, body: Body, problem: str | None) -> None:
    """Remember the last failure for the status (None: one worked), and say a new one once as a Warning event."""
    with record.standby.lock:
        new = problem is not None and problem != record.standby.problem
        record.standby.problem = problem
    if new and problem is not None:
        log.warning("warm standby of %s/%s: %s", key[0], key[1], problem)
        kopf_event(body, "Warning", FAILED_EVENT, problem)
