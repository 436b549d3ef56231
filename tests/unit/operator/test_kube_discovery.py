"""The dynamic client's discovery cache is shared by the operator's threads and is not thread-safe: a lookup and an
invalidation at once broke a reconcile in the fuzz test's live leg (KeyError 'resources')."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from mmfleet import kube as kube_module
from mmfleet.kube import Kube


class OneAtATime:
    """Discovery that fails as the real cache does when two threads are inside it at once."""

    def __init__(self) -> None:
        self.inside = 0
        self.guard = threading.Lock()

    def _enter(self) -> None:
        with self.guard:
            self.inside += 1
            overlapped = self.inside > 1
        time.sleep(0.01)
        with self.guard:
            self.inside -= 1
        if overlapped:
            raise KeyError("resources")

    def get(self, **kwargs: Any) -> object:
        self._enter()
        return object()

    def invalidate_cache(self) -> None:
        self._enter()


def test_discovery_is_asked_one_thread_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube_module, "DynamicClient", lambda _: type("Dynamic", (), {"resources": OneAtATime()})())
    kube = Kube(api_client=object())  # type: ignore[arg-type]
    kinds = [("v1", f"Kind{i}") for i in range(16)]
    with ThreadPoolExecutor(8) as pool:
        looked_up = list(pool.map(lambda k: kube._resource(*k), kinds))
        answers = list(pool.map(lambda k: kube.has_api(*k), kinds))
    assert len(looked_up) == 16 and all(answers)
