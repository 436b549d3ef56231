"""When a fleet is reconciled: every trigger only adds its key to one work queue, and a fixed number of workers
run ``reconcile`` (mmfleet.handlers.reconcile) for the keys they take.

The triggers:

- the fleet's watch events, when they carry a generation this process has not queued yet (a new fleet, a changed
  spec, a spec changed back to an earlier value: each is a new generation); never its own status writes;
- a child deleted or edited by hand (the next reconcile applies again), now;
- a pod or Deployment of the fleet changing, ``STATUS_DEBOUNCE`` later (a pod's way to Ready brings several events:
  one status write for them, not one each);
- a failed reconcile, after the key's backoff (or the API server's Retry-After);
- the resync tick, every ``RESYNC_SECONDS``: a safety net for a missed event.

kopf stays the watch, index and event layer; it runs no change handler of ours, so it writes no annotation on
fleets and keeps no per-fleet retry of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf

from mmfleet import workqueue
from mmfleet.handlers.children import INDEXES, edited_by_hand, first, fleet_children
from mmfleet.handlers.reconcile import Snapshot, api_retry_delay, reconcile
from mmfleet.handlers.records import Key, Operator, log, operator_of
from mmfleet.render import INFERENCE_LABEL

# Pod and Deployment events refresh their fleet's status at most once in this many seconds.
STATUS_DEBOUNCE = 1.0
# Status is event-driven; this periodic reconcile of every fleet only catches a missed event.
RESYNC_SECONDS = 300


async def on_fleet_event(
    event: kopf.RawEvent, namespace: str | None, name: str, meta: kopf.Meta, memo: kopf.Memo, **_: Any
) -> None:
    """A fleet's watch event: a generation not queued yet is queued; a deleted fleet is forgotten.

    A watch event, not kopf's change handlers: no annotation to write per fleet, and a spec returning to an
    earlier value is a new generation like any other. With no finalizer on fleets, a deleted fleet's
    children go with their owner references, and its namesake created later starts afresh.
    """
    op = operator_of(memo)
    key = (namespace or "", name)
    if event["type"] == "DELETED":
        op.forget(key, meta.get("uid"))
        return
    if meta.get("deletionTimestamp"):
        return
    record = op.record(key, meta.get("uid"))
    generation = int(meta.get("generation") or 0)
    if record.queued != generation:
        record.queued = generation
        enqueue(op, key)


async def on_child_event(
    event: kopf.RawEvent, namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **kwargs: Any
) -> None:
    """A child changed: deleted, edited or its labels taken off by hand (the watch's label selector then sends it as a
    deletion), its fleet is reconciled now (and applies again); a pod or the
    Deployment changed, its fleet's status is refreshed ``STATUS_DEBOUNCE`` later.

    Judged on the event loop, so the thousands of events a burst of creations brings never wait for a worker.
    """
    op = operator_of(memo)
    key = (namespace or "", labels.get(INFERENCE_LABEL, ""))
    parent = first(kwargs, "fleets", key)
    if parent is None or parent.get("metadata", {}).get("deletionTimestamp") or op.queue is None:
        return
    obj = event["object"]
    kind = obj.get("kind", "")
    meta = obj.get("metadata", {})
    record = op.record(key, parent["metadata"].get("uid"))
    deleted = event["type"] == "DELETED"
    edited = (
        event["type"] == "MODIFIED"
        and kind != "Pod"
        and not meta.get("deletionTimestamp")
        and edited_by_hand(obj, record.applied.get(meta.get("uid", "")))
    )
    if kind != "Pod" and (deleted or edited):
        log.info("%s %s/%s was %s by hand; re-applying", kind, key[0], meta.get("name"),
                 "deleted (or its labels taken off)" if deleted else "edited")  # fmt: skip
        record.applied.pop(meta.get("uid", ""), None)
        if deleted:
            record.owned.discard((kind, meta.get("name", "")))
        record.drifted = True
        op.queue.add(key)
    elif kind in ("Pod", "Deployment"):
        op.queue.add_after(key, STATUS_DEBOUNCE)


def enqueue(op: Operator, key: Key) -> None:
    if op.queue is not None:
        op.queue.add(key)


async def _process(op: Operator, pool: ThreadPoolExecutor, key: Key) -> None:
    """One reconcile of ``key`` in a worker thread, from the indexes as they are now; its result decides the key's
    next turn: back after its backoff when it failed, else only when a trigger adds it again."""
    queue = op.queue
    assert queue is not None
    body = first(op.indexes, "fleets", key)
    if body is None:  # deleted since it was queued (a reconcile racing the deletion may have made a record again)
        op.forget(key)
        return
    seen = Snapshot(key, body, *fleet_children(op.indexes, key, body["metadata"].get("uid")))
    next_delay = functools.partial(queue.backoff, key)
    task = functools.partial(op.in_kopf_context().run, reconcile, op, seen, next_delay)
    result = await asyncio.get_running_loop().run_in_executor(pool, task)
    if result.retry:
        record = op.find(key, body["metadata"].get("uid"))
        delay = queue.add_rate_limited(key, result.retry_after)
        if record is not None:
            record.retry_due = time.monotonic() + delay
    elif result.requeue_after is not None:
        queue.add_after(key, result.requeue_after)
    else:
        queue.forget(key)


async def _resync(op: Operator) -> None:
    while True:
        await asyncio.sleep(RESYNC_SECONDS)
        for key in list(op.indexes["fleets"].keys()):
            enqueue(op, key)


async def start_workers(memo: kopf.Memo, **kwargs: Any) -> None:
    """The queue, its workers and the resync tick, once kopf's indexes exist (they fill as the watches start)."""
    op = operator_of(memo)
    op.indexes = {name: kwargs[name] for name in INDEXES}
    queue: workqueue.WorkQueue[Key] = workqueue.WorkQueue(api_retry_delay)
    op.queue = queue
    op.pool = pool = ThreadPoolExecutor(op.config.workers, thread_name_prefix="reconcile")
    process = functools.partial(_process, op, pool)
    workers = asyncio.create_task(workqueue.serve(queue, op.config.workers, process), name="mmfleet workers")
    op.tasks += [workers, asyncio.create_task(_resync(op), name="mmfleet resync")]


async def stop_workers(memo: kopf.Memo, **_: Any) -> None:
    op = operator_of(memo)
    if op.queue is not None:
        op.queue.shut_down()
    for task in op.tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    op.tasks.clear()
    if op.pool is not None:  # the reconciles under way finish (each call is bounded by the request timeout)
        await asyncio.to_thread(op.pool.shutdown, wait=True, cancel_futures=True)
        op.pool = None
