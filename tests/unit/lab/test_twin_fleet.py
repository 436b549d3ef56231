"""Fleet: cold start, GPU accounting, drain, routing, GPU caps, and how simulate applies decisions."""

from __future__ import annotations

import numpy as np
import pytest

from mmfleet_lab.twin import H200_QWEN25VL7B, Requests
from mmfleet_lab.twin.compiled import CompiledEngine
from mmfleet_lab.twin.engine import Workload
from mmfleet_lab.twin.fleet import Fleet
from tests.helpers.twin import Script, run, steady


def test_cold_start_is_measured_from_creation_to_ready_pending_included() -> None:
    """What the operator measures (``cycle.count_pods``); the warm pods were created one cold start ago."""
    req = Requests(np.zeros(8), np.full(8, 500), np.full(8, 200), np.zeros(8))
    fleet = Fleet(CompiledEngine(H200_QWEN25VL7B, Workload.build(req, H200_QWEN25VL7B)), cold_start=30.0, initial=2,
                  gpus_available=2)  # fmt: skip
    assert fleet.measured_cold_start() == 30.0
    fleet.run(0.0, 1.0, np.arange(8))
    fleet.scale(1, 5.0)  # one pod drains what it holds
    fleet.scale(2, 5.0)  # so the new one waits for its GPU
    assert fleet.count("unschedulable") == 1
    fleet.run(5.0, 60.0, np.zeros(0, dtype=np.int64))
    fleet.transitions(60.0)  # drained: the new pod gets the GPU at 60 and is Ready at 90
    fleet.transitions(90.0)
    assert fleet.count("ready") == 2 and fleet.measured_cold_start() == (30.0 + 85.0) / 2


def test_cold_start_delays_readiness_and_is_billed() -> None:
    res = run(steady(2.0, 100.0), Script([(10.0, 3)]), 100.0, initial_replicas=1, gpus_per_replica=2)
    assert res.decisions == [(10.0, 3, "script 3")]
    assert res.ready[9] == 1 and res.starting[9] == 0
    assert res.ready[10] == 1 and res.starting[10] == 2 and res.desired[10] == 3
    assert res.ready[39] == 1 and res.starting[39] == 2
    assert res.ready[40] == 3 and res.starting[40] == 0
    # 2 GPUs per pod: one pod 0..100, two pods 10..100 (30 s of it starting)
    assert res.gpu_seconds == pytest.approx(2 * (100 + 90 + 90))
    assert res.starting_gpu_seconds == pytest.approx(2 * (30 + 30))


def test_gpu_seconds_from_a_time_bill_only_what_is_held_after_it() -> None:
    """What the benchmark scores from its offset: holds spanning the time are cut there, pods still held at the end
    are billed to it, a pod released before it costs nothing, and every GPU of a replica counts."""
    res = run(steady(2.0, 100.0), Script([(10.0, 3), (20.0, 2)]), 100.0, initial_replicas=1, gpus_per_replica=2)
    assert res.gpu_seconds_from(0.0) == pytest.approx(res.gpu_seconds)
    # one pod 0..100 and one 10..100 held to the end; the third, ordered at 10, released while starting at 20
    assert res.gpu_seconds_from(50.0) == pytest.approx(2 * (50 + 50))
    assert res.gpu_seconds_from(15.0) == pytest.approx(2 * (85 + 85 + 5))
    assert res.gpu_seconds_from(100.0) == 0.0


def test_deleting_a_starting_pod_frees_it_at_once() -> None:
    res = run(steady(1.0, 60.0), Script([(10.0, 2), (20.0, 1)]), 60.0, initial_replicas=1)
    assert res.gpu_seconds == pytest.approx(60 + 10)
    assert res.ready.max() == 1


def test_drain_finishes_in_flight_requests_before_releasing() -> None:
    req = steady(6.0, 60.0, inp=2000, out=1500)  # ~1500 tokens at ~10 ms each: 15 s per request
    res = run(req, Script([(20.0, 1)]), 60.0, initial_replicas=2)
    assert np.all(np.isfinite(res.e2e))
    drain = np.nonzero(res.draining)[0]
    assert drain.size and drain[0] == 20 and drain[-1] > 25  # in-flight work took > 5 s to finish
    release = drain[-1] + 1
    assert res.gpu_seconds == pytest.approx(60 + release, abs=1.0)
    # nothing arriving after the scale-down went to the draining pod: it was done before the end
    assert res.draining[-1] == 0


def test_gpu_cap_leaves_pods_pending() -> None:
    res = run(steady(1.0, 60.0), Script([(5.0, 4), (40.0, 2)]), 60.0, initial_replicas=1, gpus_available=2)
    assert res.unschedulable[10] == 2 and res.starting[10] == 1
    assert res.ready[36] == 2 and res.unschedulable[36] == 2
    assert res.unschedulable[45] == 0 and res.ready[45] == 2  # pending pods go first on scale-down
    assert res.gpu_seconds == pytest.approx(60 + 55)


def test_decisions_are_clamped_and_recorded() -> None:
    res = run(
        steady(1.0, 30.0),
        Script([(3.0, 100), (10.0, 0)]),
        30.0,
        max_replicas=5,
        min_replicas=2,
        initial_replicas=2,
        cold_start=0.0,
    )
    assert [(t, n) for t, n, _ in res.decisions] == [(3.0, 5), (10.0, 2)]
    assert res.desired[5] == 5 and res.ready[5] == 5 and res.desired[20] == 2


def test_router_sends_to_fewest_outstanding() -> None:
    req = Requests(np.zeros(10), np.full(10, 100), np.full(10, 50), np.zeros(10))
    eng = CompiledEngine(H200_QWEN25VL7B, Workload.build(req, H200_QWEN25VL7B))
    fleet = Fleet(eng, cold_start=0.0, initial=4)
    fleet.run(0.0, 0.001, np.arange(10))
    assert sorted(eng.outstanding().tolist()) == [2, 2, 3, 3]
    # a busy replica gets nothing until the others catch up
    eng2 = CompiledEngine(H200_QWEN25VL7B, Workload.build(req, H200_QWEN25VL7B))
    for _ in range(3):
        eng2.add_replica()
    eng2.run(0.0, 0.0001, np.arange(6), np.array([0]))
    eng2.run(0.0001, 0.0002, np.arange(6, 10), np.array([0, 1, 2]))
    assert eng2.outstanding().tolist() == [6, 2, 2]


def test_requests_wait_at_the_gateway_without_a_ready_pod() -> None:
    req = steady(2.0, 40.0)
    res = run(req, Script([]), 80.0, initial_replicas=0, min_replicas=0, cold_start=0.0)
    assert np.all(np.isinf(res.e2e))  # never served: no pod ever
    res = run(req, Script([(20.0, 1)]), 80.0, initial_replicas=0, min_replicas=0, cold_start=10.0)
    early = req.arrival < 20
    assert np.all(np.isfinite(res.e2e))
    assert np.all(res.e2e[early] >= 30.0 - req.arrival[early] - 1e-6)  # held until the pod was Ready at 30
