"""The offline oracle (autoscaling.md §7): schedules solvable by hand, the bound, replay and refinement."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mmfleet.autoscaler import Observation
from mmfleet_lab.bench.oracle import (
    SchedulePolicy,
    fluid_lower_bound,
    fluid_replicas,
    oracle_schedule,
    refine,
)


def obs(time: float, **kw: Any) -> Observation:
    base: dict[str, Any] = {
        "time": time,
        "ready": 1,
        "starting": 0,
        "unschedulable": 0,
        "current": 1,
        "min_replicas": 1,
        "max_replicas": 100,
        "slo_target": 2.0,
        "slo_percentile": 90.0,
        "cold_start": 60.0,
    }
    base.update(kw)
    return Observation(**base)


def test_units_start_one_cold_start_before_their_window() -> None:
    # replicas 2 and 3 are needed in windows 2-3: started at 60 s (window 1), stopped after window 3
    assert oracle_schedule(np.array([1, 1, 3, 3, 1]), 60.0, 60.0).tolist() == [1, 3, 3, 3, 1]


def test_ski_rental_keeps_a_replica_through_a_gap_no_longer_than_the_cold_start() -> None:
    assert oracle_schedule([2, 1, 2], 60.0, 60.0).tolist() == [2, 2, 2]  # gap 60 s <= L: keep
    assert oracle_schedule([2, 1, 1, 2], 60.0, 60.0).tolist() == [2, 1, 2, 2]  # gap 120 s > L: stop, restart
    assert oracle_schedule([2, 1, 1, 2], 60.0, 120.0).tolist() == [2, 2, 2, 2]  # gap 120 s <= L = 120 s


def test_without_cold_start_the_schedule_is_the_demand() -> None:
    demand = [0, 2, 0, 5, 5, 1, 0, 3]
    assert oracle_schedule(demand, 60.0, 0.0).tolist() == demand


def test_a_cold_start_between_windows_rounds_the_start_down() -> None:
    # L = 90 s on 60 s windows: start 2 windows ahead, i.e. at 60 s for a need at 180 s
    assert oracle_schedule([1, 1, 1, 3], 60.0, 90.0).tolist() == [1, 3, 3, 3]


def test_needs_at_the_start_of_the_trace_are_the_initial_fleet() -> None:
    assert oracle_schedule([3, 1, 1, 1], 60.0, 120.0).tolist() == [3, 1, 1, 1]


def test_every_need_is_covered_from_a_cold_start_ahead() -> None:
    rng = np.random.default_rng(7)
    for _ in range(50):
        demand = rng.integers(0, 6, size=40)
        lead = int(rng.integers(0, 4))
        plan = oracle_schedule(demand, 30.0, 30.0 * lead)
        for w, need in enumerate(demand):
            assert (plan[max(0, w - lead) : w + 1] >= need).all()
        assert plan.sum() >= demand.sum()


def test_bad_input_is_rejected() -> None:
    with pytest.raises(ValueError):
        oracle_schedule([1, -1], 60.0, 60.0)
    with pytest.raises(ValueError):
        oracle_schedule([1, 1], 0.0, 60.0)
    with pytest.raises(ValueError):
        fluid_replicas([1.0], 0.0)


def test_fluid_bound_is_ceil_of_rate_over_capacity_times_window() -> None:
    assert fluid_replicas([3.0, 4.1, 0.0, 4.0], 2.0).tolist() == [2, 3, 0, 2]
    assert fluid_lower_bound([3.0, 4.1, 0.0, 4.0], 2.0, 60.0) == pytest.approx(7 * 60 / 3600)
    assert fluid_lower_bound([3.0, 4.1], [1.0, 4.1], 60.0, gpus_per_replica=2) == pytest.approx(4 * 2 * 60 / 3600)


def test_schedule_policy_replays_the_plan_and_ignores_what_it_sees() -> None:
    policy = SchedulePolicy.from_schedule(oracle_schedule([1, 1, 3, 3, 1], 60.0, 60.0), 60.0)
    assert policy.name == "oracle"
    assert policy.interval == 60.0
    seen = [policy.decide(obs(t), None).replicas for t in (0.0, 59.9, 60.0, 180.0, 240.0, 1000.0)]
    assert seen == [1, 1, 3, 3, 1, 1]
    blind = obs(60.0, latency=None, request_rate=None, waiting=500.0, current=9)
    assert policy.decide(blind, None).replicas == 3
    assert policy.decide(obs(60.0, max_replicas=2), None).replicas == 2


def test_refine_raises_failing_windows_until_they_pass() -> None:
    truth = np.array([1, 2, 4, 2])
    calls: list[list[int]] = []

    def simulate(c: np.ndarray) -> list[int]:
        calls.append(c.tolist())
        return [w for w in range(len(c)) if c[w] < truth[w]]

    out = refine([1, 1, 1, 1], simulate, lambda failing: failing, max_rounds=10, carry_over=False)
    assert out.passed
    assert out.demand.tolist() == [1, 2, 4, 2]
    assert out.rounds == 3
    assert calls == [[1, 1, 1, 1], [1, 2, 2, 2], [1, 2, 3, 2], [1, 2, 4, 2]]
    # with carry-over, window 2's second failure also raises window 1
    assert refine([1, 1, 1, 1], simulate, lambda failing: failing).demand.tolist() == [1, 3, 4, 2]


def test_refine_raises_the_previous_window_when_a_window_keeps_failing() -> None:
    # window 2 passes only once window 1 has a third replica (the queue it carries over)
    def simulate(c: np.ndarray) -> list[int]:
        return [2] if c[1] < 3 else []

    out = refine([2, 2, 2], simulate, lambda failing: failing, max_rounds=5)
    assert out.passed
    assert out.demand.tolist() == [2, 3, 4]  # round 1 raised window 2; round 2 raised 2 and 1


def test_refine_stops_after_max_rounds_or_at_the_cap() -> None:
    out = refine([1, 1], lambda c: [0], lambda failing: failing, max_rounds=3)
    assert not out.passed
    assert out.rounds == 3
    assert out.failing == (0,)
    capped = refine([1, 1], lambda c: [0], lambda failing: failing, max_rounds=50, max_replicas=4)
    assert not capped.passed
    assert capped.demand.tolist() == [4, 1]
    with pytest.raises(IndexError):
        refine([1, 1], lambda c: [5], lambda failing: failing)
