"""Client timeouts: an abandoned request leaves its replica (queue, seat, KV), is not counted as a
success, and is an SLO miss in the benchmark's scoring."""

from __future__ import annotations

import math

import numpy as np

from mmfleet_lab.bench.slo_metrics import share_over, windows
from mmfleet_lab.twin import H200_QWEN25VL7B as P
from mmfleet_lab.twin.compiled import CompiledEngine
from mmfleet_lab.twin.engine import Workload
from mmfleet_lab.twin.observe import E2E_BUCKETS, LAYOUT
from tests.helpers.twin import Script, run, steady

REQ = steady(50.0, 60.0, inp=1000, out=200)


def overloaded(timeout: float) -> CompiledEngine:
    """One replica fed 60 s of about twice what it serves, then left alone for 30 s."""
    req = REQ
    eng = CompiledEngine(P, Workload.build(req, P, timeout))
    eng.add_replica()
    eng.run(0.0, 60.0, np.arange(len(req)), np.array([0]))
    eng.run(60.0, 90.0, np.zeros(0, dtype=np.int64), np.array([0]))
    return eng


def test_abandoned_requests_leave_the_replica_and_are_not_counted_as_successes() -> None:
    eng = overloaded(timeout=10.0)
    e2e = eng.outcomes.e2e
    finished = np.isfinite(e2e)
    assert 0 < finished.sum() < 0.6 * e2e.size  # overloaded: many abandoned
    assert np.all(e2e[finished] < 10.0 + 0.5)  # one step at most past the deadline
    assert eng.outstanding().tolist() == [0] and eng.gauges(0) == (0.0, 0.0, 0.0)  # queue, seats, KV freed
    row = eng.book.export(0)
    assert row[LAYOUT.success] == finished.sum()  # as vLLM: a client abort is no request_success ...
    assert row[LAYOUT.e2e + len(E2E_BUCKETS) + 2] == finished.sum()  # ... and no e2e observation (_count)


def test_without_a_timeout_the_queue_stays() -> None:
    eng = overloaded(timeout=math.inf)
    assert eng.outstanding()[0] > 500


def test_a_request_held_at_the_gateway_past_its_deadline_is_never_served() -> None:
    """No Ready pod until 30 s: what arrived more than ``timeout`` before that gave up at the gateway."""
    req = steady(2.0, 60.0)
    res = run(req, Script([(0.0, 1)]), 60.0, initial_replicas=0, min_replicas=0, cold_start=30.0, timeout=10.0)
    gave_up = req.arrival <= 20.0 - 1e-6
    assert gave_up.sum() > 20 and np.all(np.isinf(res.e2e[gave_up]))
    served = req.arrival > 25.0  # held at most 5 s, then served in a few
    assert np.all(np.isfinite(res.e2e[served]))


def test_an_abandoned_request_is_an_slo_miss() -> None:
    e2e = overloaded(timeout=10.0).outcomes.e2e
    verdicts = windows(REQ.arrival, e2e, target=1000.0)  # a target every finished request meets
    assert not verdicts.passed.any()
    assert share_over(e2e, 1000.0) == np.isinf(e2e).mean()
