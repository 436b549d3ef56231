"""The API client keeps a connection for every thread that may call at once: a thread beyond the pool opens a
connection that is closed when given back, a TLS handshake on both sides for each request it makes."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from mmfleet import kube
from mmfleet.config import OperatorConfig
from mmfleet.handlers import autoscale, records, standby


@pytest.mark.parametrize("workers", [1, 16, 64])
def test_pool_holds_every_thread_that_calls_the_api_server(workers: int) -> None:
    callers = (
        workers  # reconcile
        + workers  # autoscaler
        + kube.LOOKUP_THREADS
        + autoscale.SERVER_LOG_THREADS
        + 2 * standby.WORKERS  # sleepers and wakers
        + 1  # leader election's renewals
    )
    assert kube.pool_size(workers) >= callers


def test_the_operators_client_is_built_with_that_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[int] = []
    monkeypatch.setattr(records, "load_client", lambda connections: asked.append(connections) or object())
    monkeypatch.setattr(kube, "DynamicClient", lambda _: object())
    records.Operator(config=OperatorConfig(workers=24)).get_kube()
    assert asked == [kube.pool_size(24)]


def test_threads_asking_at_once_share_one_client(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[object] = []

    def slow_client(connections: int) -> object:
        time.sleep(0.05)  # discovery and the kubeconfig take a while: every thread arrives before the first is done
        made.append(object())
        return made[-1]

    monkeypatch.setattr(records, "load_client", slow_client)
    monkeypatch.setattr(kube, "DynamicClient", lambda _: object())
    op = records.Operator()
    with ThreadPoolExecutor(8) as pool:
        clients = list(pool.map(lambda _: op.get_kube(), range(8)))
    assert len(made) == 1 and all(c is clients[0] for c in clients)
