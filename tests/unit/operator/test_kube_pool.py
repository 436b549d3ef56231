"""The API client keeps a connection for every thread that may call at once: a thread beyond the pool opens a
connection that is closed when given back, a TLS handshake on both sides for each request it makes."""

from __future__ import annotations

import pytest

from mmfleet import kube
from mmfleet.handlers import autoscale, standby


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
