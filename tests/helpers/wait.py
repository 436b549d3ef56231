"""The one way a test waits for something to happen (``until``: the same, inside an event loop)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float, what: str | Callable[[], str], interval: float = 0.3) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that; past ``timeout`` seconds, fail naming
    ``what`` was awaited (a callable is asked then, so the message can carry a log tail) and the last value seen."""
    deadline = time.monotonic() + timeout
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {said} (last: {last!r})")
        time.sleep(interval)


async def until(predicate: Callable[[], object], timeout: float = 5.0, what: str = "", interval: float = 0.01) -> None:
    """``wait_for`` for a test running the operator's own loops: sleeps on the event loop, so they run meanwhile."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what or predicate}")
        await asyncio.sleep(interval)
