"""A keyed work queue with controller-runtime's semantics, on asyncio.

Every trigger of a reconcile only adds a key; workers take keys and run one reconcile each. The
rules are client-go's ``workqueue`` (``k8s.io/client-go/util/workqueue``: ``queue.go``,
``delaying_queue.go``, ``rate_limiting_queue.go``):

- a key is queued once however often it is added before a worker takes it;
- a key is never handed to two workers at once: added while it is processed, it is queued again
  once, when that worker calls ``done``;
- ``add_after`` delays an add; of several delays pending for a key, the earliest stands;
- ``add_rate_limited`` delays by the key's own backoff, which grows with its failures and is
  reset by ``forget``; a ``retry_after`` the server sent is honoured instead of the backoff.

Pure but for the event loop's timers: no Kubernetes, no kopf.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

_log = logging.getLogger("mmfleet")

# Seconds before a key's next try, from its failures so far (0 for the first) and the Retry-After the server sent.
Backoff = Callable[[int, float | None], float]


class ShutDownError(Exception):
    """The queue was shut down: no key will come."""


class WorkQueue(Generic[K]):
    def __init__(self, backoff: Backoff) -> None:
        self._backoff = backoff
        self._queue: collections.deque[K] = collections.deque()
        self._dirty: set[K] = set()  # added and not yet taken (queued, or waiting for its worker's done)
        self._processing: set[K] = set()
        self._waiting: dict[K, tuple[float, asyncio.TimerHandle]] = {}  # delayed adds: due (loop time), timer
        self._failures: collections.Counter[K] = collections.Counter()
        self._ready = asyncio.Event()
        self._shut = False

    def add(self, key: K) -> None:
        if self._shut or key in self._dirty:
            return
        self._dirty.add(key)
        if key in self._processing:  # queued again by done()
            return
        self._queue.append(key)
        self._ready.set()

    def add_after(self, key: K, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        if self._shut:
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        pending = self._waiting.get(key)
        if pending is not None:
            if pending[0] <= due:
                return
            pending[1].cancel()
        self._waiting[key] = (due, loop.call_at(due, self._fire, key))

    def _fire(self, key: K) -> None:
        self._waiting.pop(key, None)
        self.add(key)

    def backoff(self, key: K, retry_after: float | None = None) -> float:
        """The delay ``add_rate_limited`` would use now, without counting a failure (for a status message)."""
        return self._backoff(self._failures[key], retry_after)

    def add_rate_limited(self, key: K, retry_after: float | None = None) -> float:
        """Count a failure of ``key`` and add it after its backoff; the delay chosen."""
        delay = self.backoff(key, retry_after)
        self._failures[key] += 1
        self.add_after(key, delay)
        return delay

    def failures(self, key: K) -> int:
        return self._failures[key]

    def forget(self, key: K) -> None:
        """The key succeeded: its next failure backs off from the start."""
        self._failures.pop(key, None)

    def discard(self, key: K) -> None:
        """The key's object is gone: drop its pending delays and failures (a worker holding it still calls done)."""
        self.forget(key)
        pending = self._waiting.pop(key, None)
        if pending is not None:
            pending[1].cancel()
        if key in self._dirty and key not in self._processing:
            self._dirty.discard(key)
            self._queue.remove(key)

    async def get(self) -> K:
        """The next key, marked as processed until ``done``; raises ``ShutDownError`` once shut down."""
        while not self._queue:
            if self._shut:
                raise ShutDownError
            self._ready.clear()
            await self._ready.wait()
        key = self._queue.popleft()
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.append(key)
            self._ready.set()

    def shut_down(self) -> None:
        self._shut = True
        for _, timer in self._waiting.values():
            timer.cancel()
        self._waiting.clear()
        self._queue.clear()
        self._dirty.clear()
        self._ready.set()

    def __len__(self) -> int:
        """Keys queued now (not those waiting for a delay, nor those being processed)."""
        return len(self._queue)

    def waiting(self) -> int:
        return len(self._waiting)


async def serve(queue: WorkQueue[K], workers: int, process: Callable[[K], Awaitable[None]]) -> None:
    """Run ``workers`` loops, each taking a key, processing it and marking it done, until the queue shuts down.

    ``process`` owns its errors (it decides whether and when the key comes back): one that escapes is a bug, and
    ends only that key's turn, never a worker.
    """

    async def work() -> None:
        while True:
            try:
                key = await queue.get()
            except ShutDownError:
                return
            try:
                await process(key)
            except Exception:
                _log.exception("processing %s failed", key)
            finally:
                queue.done(key)

    await asyncio.gather(*(work() for _ in range(workers)))
