"""The API client keeps a connection for every thread that may call at once: a thread beyond the pool opens a
connection that is closed when given back, a TLS handshake on both sides for each request it makes."""

from __future__ import annotations

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
