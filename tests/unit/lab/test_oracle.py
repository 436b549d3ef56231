"""The benchmark's oracle (``mmfleet_lab.bench.oracle``): it meets every window it reports, sits above the
fluid bound and above the zero-cold-start oracle, keeps replicas through short gaps, and fails loudly."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from mmfleet.api import seconds
from mmfleet_lab.bench import autoscale, slo_metrics
from mmfleet_lab.bench.oracle import (
    Cell,
    Oracle,
    OracleError,
    SchedulePolicy,
    _smallest,
    fluid_lower_bound,
    fluid_replicas,
    found,
    held_plan,
    initial_fleet,
    true_oracle,
    verified,
)
from mmfleet_lab.twin import H200_QWEN25VL7B, Requests, Scenario, capacity_at_slo, simulate
from mmfleet_lab.twin.policy import LabObservation
from tests.helpers.oracle import RATES, SLO, START, WINDOW, make_cell, piecewise


@pytest.fixture(scope="module")
def cell() -> Cell:
    return make_cell()


@pytest.fixture(scope="module")
def oracles(cell: Cell) -> tuple[Oracle, Oracle]:
    at_cold_start, at_zero = true_oracle(cell, 60.0)
    return found(at_cold_start), found(at_zero)


def scored_hours(cell: Cell, oracle: Oracle) -> float:
    """GPU-hours after the cell's start (the oracle's search and its check begin there)."""
    return oracle.result.gpu_seconds_from(cell.start) / 3600.0


def test_the_oracle_meets_every_window_it_reports(cell: Cell, oracles: tuple[Oracle, Oracle]) -> None:
    for oracle in oracles:
        keep = oracle.result.arrival >= START
        verdicts = slo_metrics.windows(
            oracle.result.arrival[keep], oracle.result.e2e[keep], seconds(SLO.target), SLO.percentile, WINDOW
        )
        assert verdicts.passed.size == len(RATES) - 1
        assert verdicts.passed.all()
    ready = oracles[0].ready
    assert ready.size == len(RATES) - 1
    assert ready.max() < cell.max_replicas  # it found counts, not the limit
    assert ready[2] > ready[5]  # and follows the load (70 req/s against 5 req/s)
    assert oracles[0].evaluations >= ready.size


def test_the_oracle_is_minimal_window_by_window(cell: Cell, oracles: tuple[Oracle, Oracle]) -> None:
    # one replica fewer in the busiest window, everything else kept, fails that window
    oracle = oracles[1]  # zero cold start: the plan is the Ready counts
    busiest = int(np.argmax(oracle.ready))
    fewer = oracle.ready.copy()
    fewer[busiest] -= 1
    plan = held_plan(fewer, initial=cell.initial, start=START, window=WINDOW, cold_start=0.0, horizon=600.0)
    result = simulate(
        cell.scenario, SchedulePolicy.from_schedule(plan, WINDOW), params=cell.params, cold_start=0.0, slo=SLO,
        max_replicas=cell.max_replicas, initial_replicas=cell.initial,
    )  # fmt: skip
    keep = (result.arrival >= START + busiest * WINDOW) & (result.arrival < START + (busiest + 1) * WINDOW)
    met = np.count_nonzero(result.e2e[keep] <= seconds(SLO.target))
    assert met < 0.9 * np.count_nonzero(keep)


def test_the_oracle_is_never_below_the_fluid_bound(cell: Cell, oracles: tuple[Oracle, Oracle]) -> None:
    mu = capacity_at_slo(cell.params, cell.scenario.requests, SLO)
    bound = fluid_lower_bound(np.asarray(RATES[1:]), mu, WINDOW)
    for oracle in oracles:
        assert scored_hours(cell, oracle) >= bound


def test_zero_cold_start_is_never_above_the_cold_start_oracle(cell: Cell, oracles: tuple[Oracle, Oracle]) -> None:
    with_cold, without = oracles
    assert scored_hours(cell, without) <= scored_hours(cell, with_cold)
    assert with_cold.result.starting_gpu_seconds > 0.0  # billed from the order
    assert without.result.starting_gpu_seconds == 0.0


def test_replicas_are_ordered_one_cold_start_ahead_and_billed_from_then(oracles: tuple[Oracle, Oracle]) -> None:
    oracle = oracles[0]
    for w, need in enumerate(oracle.ready):  # the replay has the counts Ready through each window
        second = int(START + w * WINDOW)
        assert (oracle.result.ready[second : second + int(WINDOW)] >= need).all()
    assert oracle.result.ready.max() == oracle.ready.max()
    # every pod ordered is billed its whole cold start (60 s), none is cancelled while starting
    desired = [2, *(n for _, n, _ in oracle.result.decisions)]
    orders = sum(max(0, b - a) for a, b in itertools.pairwise(desired))
    assert orders > 0
    assert oracle.result.starting_gpu_seconds == pytest.approx(60.0 * orders)


def test_a_replica_is_kept_through_an_idle_gap_no_longer_than_the_cold_start() -> None:
    kw: dict[str, Any] = {"initial": 1, "start": 0.0, "window": 60.0, "horizon": 660.0}
    # replica 2 is needed in windows 3, 5 and 8: its 60 s gap is bridged with L = 60 s, its 120 s gap is not
    ready = [1, 1, 1, 2, 1, 2, 1, 1, 2, 1, 1]
    assert held_plan(ready, cold_start=60.0, **kw).tolist() == [1, 1, 2, 2, 2, 2, 1, 2, 2, 1, 1]
    assert held_plan(ready, cold_start=120.0, **kw).tolist() == [1, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1]
    assert held_plan(ready, cold_start=0.0, **kw).tolist() == ready


def test_orders_lead_by_exactly_the_cold_start_on_a_finer_step() -> None:
    # L = 90 s, 60 s windows: the plan steps by 30 s and orders replica 2 at 90 s for Ready at 180 s
    plan = held_plan([1, 1, 1, 2], initial=1, start=0.0, window=60.0, cold_start=90.0, horizon=240.0)
    assert plan.tolist() == [1, 1, 1, 2, 2, 2, 2, 2]
    with pytest.raises(ValueError, match="before it can be ordered"):  # Ready at 60 s needs an order at -30 s
        held_plan([1, 2], initial=1, start=0.0, window=60.0, cold_start=90.0, horizon=120.0)
    with pytest.raises(ValueError, match="whole seconds"):
        held_plan([1], initial=1, start=0.0, window=60.0, cold_start=90.5, horizon=60.0)


def test_the_initial_fleet_is_ready_from_the_start() -> None:
    plan = held_plan([1, 1], initial=3, start=120.0, window=60.0, cold_start=60.0, horizon=240.0)
    assert plan.tolist() == [3, 3, 1, 1]


def test_it_raises_when_no_count_up_to_the_limit_meets_a_window() -> None:
    with pytest.raises(OracleError, match=r"synthetic, cold start 60 s: window 2 \(180-240 s\).* up to 3 replicas"):
        true_oracle(make_cell(max_replicas=3), 60.0)


def test_a_replayed_plan_that_misses_windows_is_raised_there_or_fails_loudly(
    cell: Cell, oracles: tuple[Oracle, Oracle]
) -> None:
    short = np.maximum(oracles[1].ready - 1, 1)
    counts, result, repairs = verified(cell, short, 0.0, "short")
    assert repairs > 0
    assert (counts >= short).all()
    keep = result.arrival >= START
    verdicts = slo_metrics.windows(result.arrival[keep], result.e2e[keep], seconds(SLO.target), 90.0, WINDOW)
    assert verdicts.passed.all()
    with pytest.raises(OracleError, match="synthetic, cold start 0 s: the oracle's plan still misses windows"):
        verified(make_cell(max_replicas=3), np.ones(len(RATES) - 1, dtype=np.int64), 0.0, "ones")


def test_every_raise_is_replayed_before_the_oracle_gives_up(cell: Cell, monkeypatch: pytest.MonkeyPatch) -> None:
    """A window that needs one more replica each round passes after REPAIR_ROUNDS raises, each checked by a replay;
    one that needs more fails naming as many raises as were replayed (none kept unchecked)."""
    from mmfleet_lab.bench import oracle as module

    replayed: list[int] = []
    needed = {"count": 0}

    def replay(cell: Cell, counts: np.ndarray, cold_start: float, name: str) -> object:
        replayed.append(int(counts[0]))
        return counts.copy()

    monkeypatch.setattr(module, "replay", replay)
    monkeypatch.setattr(module, "failing_windows", lambda cell, counts: [0] if counts[0] < needed["count"] else [])
    ready = np.ones(3, dtype=np.int64)
    needed["count"] = 1 + module.REPAIR_ROUNDS
    counts, _, repairs = verified(cell, ready, 0.0, "raised")
    assert (counts[0], repairs, replayed[-1]) == (needed["count"], module.REPAIR_ROUNDS, needed["count"])
    replayed.clear()
    needed["count"] = 2 + module.REPAIR_ROUNDS
    with pytest.raises(OracleError, match=f"still misses windows \\[0\\] after {module.REPAIR_ROUNDS} raises"):
        verified(cell, ready, 0.0, "short")
    assert replayed == list(range(1, 2 + module.REPAIR_ROUNDS))


def test_smallest_searches_out_from_the_guess_then_bisects() -> None:
    for need in (1, 4, 9, 17, 30):
        for guess in (1, 8, 40):
            asked: list[int] = []

            def passes(k: int, need: int = need, asked: list[int] = asked) -> bool:
                asked.append(k)
                return k >= need

            assert _smallest(passes, guess, 1, 30) == need
            assert len(asked) <= 12
    assert _smallest(lambda k: k >= 31, 5, 1, 30) is None


def obs(time: float, **kw: Any) -> LabObservation:
    base: dict[str, Any] = {
        "time": time, "ready": 1, "starting": 0, "unschedulable": 0, "current": 1, "min_replicas": 1,
        "max_replicas": 100, "slo_target": 2.0, "slo_percentile": 90.0, "cold_start": 60.0,
    }  # fmt: skip
    base.update(kw)
    return LabObservation(**base)


def test_schedule_policy_replays_the_plan_and_ignores_what_it_sees() -> None:
    policy = SchedulePolicy.from_schedule([1, 3, 3, 3, 1], 60.0)
    assert policy.name == "oracle"
    assert policy.interval == 60.0
    seen = [policy.decide(obs(t), None).replicas for t in (0.0, 59.9, 60.0, 180.0, 240.0, 1000.0)]
    assert seen == [1, 1, 3, 3, 1, 1]
    blind = obs(60.0, latency=None, request_rate=None, waiting=500.0, current=9)
    assert policy.decide(blind, None).replicas == 3
    assert policy.decide(obs(60.0, max_replicas=2), None).replicas == 2


def test_fluid_bound_is_ceil_of_rate_over_capacity_times_window() -> None:
    assert fluid_replicas([3.0, 4.1, 0.0, 4.0], 2.0).tolist() == [2, 3, 0, 2]
    assert fluid_lower_bound([3.0, 4.1, 0.0, 4.0], 2.0, 60.0) == pytest.approx(7 * 60 / 3600)
    assert fluid_lower_bound([3.0, 4.1], [1.0, 4.1], 60.0, gpus_per_replica=2) == pytest.approx(4 * 2 * 60 / 3600)
    assert fluid_lower_bound([3.0, 4.0], 2.0, [60.0, 30.0]) == pytest.approx((2 * 60 + 2 * 30) / 3600)
    with pytest.raises(ValueError):
        fluid_replicas([1.0], 0.0)


def row(policy: str, gpu_hours: float, attainment: float = 1.0) -> autoscale.Row:
    nan = float("nan")
    return autoscale.Row("s", 90.0, policy, attainment, nan, 0.0, gpu_hours, nan, 0.0, 0.0, nan, nan, 0.0, 0.0)


def test_the_tables_show_the_references_beside_the_oracle_and_never_as_policies() -> None:
    fluid = replace(row("fluid-bound", 8.0), attainment=float("nan"), over_share=float("nan"))
    rows = [autoscale._with_ratio(r, 10.0) for r in (row("oracle", 10.0), row("oracle-L0", 9.0), fluid)]
    text = autoscale.cell_table([*rows, autoscale._with_ratio(row("mmfleet", 12.0, 0.95), 10.0)])
    cells = [[c.strip() for c in line.split("|")] for line in text.splitlines()[2:]]
    assert cells[2][1:4] == ["fluid-bound", "1", "-"]  # one seed; no attainment for a bound
    assert [c[7] for c in cells] == ["1.00", "0.90", "0.80", "1.20"]
    # references cheaper and better than ours do not make it Pareto-dominated
    assert autoscale.dominated_by(row("mmfleet", 12.0, 0.95), [*rows, row("static", 11.0)]) == ["static"]


def test_the_fluid_bound_covers_the_scored_windows_the_last_one_as_long_as_it_is() -> None:
    # 150 s scored from SCORED_FROM: windows of 60, 60 and 30 s with 40, 0 and 35 arrivals; those before it not
    t = autoscale.SCORED_FROM
    arrival = np.r_[np.linspace(0.0, t - 20, 50), np.linspace(t, t + 59, 40), np.linspace(t + 120, t + 149, 35)]
    n = arrival.size
    scn = Scenario("s", Requests(arrival, np.ones(n), np.ones(n), np.zeros(n)), t + 150)
    # c = ceil(40/60 / 0.5) = 2, ceil(0) = 0, ceil(35/30 / 0.5) = 3
    assert autoscale._fluid_hours(scn, 0.5) == pytest.approx((2 * 60 + 0 * 60 + 3 * 30) / 3600)


def silent_then_busy(silence: float) -> Scenario:
    """Warm-up traffic, no request for ``silence`` seconds after the start, then a busy stretch."""
    busy = piecewise((30.0, 150.0, 150.0, 150.0, 150.0))
    keep = (busy.arrival < START) | (busy.arrival >= START + silence)
    picked = Requests(busy.arrival[keep], busy.input_tokens[keep], busy.output_tokens[keep], busy.images[keep])
    return Scenario("silent", picked, WINDOW * 5)


def test_windows_sit_on_the_scoring_grid_when_the_trace_is_silent_after_the_start() -> None:
    """azure-code is silent from 120 to 153 s: windows anchored at the first arrival were shifted 33 s against
    the oracle's plan, and the oracle failed window 0 with every count."""
    scn = silent_then_busy(33.0)
    initial = initial_fleet(scn, H200_QWEN25VL7B, SLO, start=START, window=WINDOW, cold_start=60.0, guess=2, limit=40)
    cell = Cell(scn, H200_QWEN25VL7B, SLO, initial, max_replicas=40, start=START, window=WINDOW, label="silent")
    oracle = found(true_oracle(cell, 60.0)[0])
    keep = oracle.result.arrival >= START
    verdicts = slo_metrics.windows(oracle.result.arrival[keep], oracle.result.e2e[keep], seconds(SLO.target),
                                   SLO.percentile, WINDOW, origin=START)  # fmt: skip
    assert verdicts.start[0] == START  # not the first arrival, 33 s later
    assert verdicts.passed.all()
    with pytest.raises(ValueError, match="precede"):
        slo_metrics.windows(np.array([1.0, 2.0]), np.array([0.1, 0.1]), 1.0, origin=5.0)


def test_the_initial_fleet_meets_every_window_before_a_first_order_can_land() -> None:
    """Every policy starts from it; the windows before ``start + cold start`` are beyond any decision."""
    scn = Scenario("burst", piecewise((30.0, 30.0, 200.0, 30.0)), WINDOW * 4)
    guess = int(fluid_replicas([30.0], capacity_at_slo(H200_QWEN25VL7B, scn.requests, SLO))[0])
    n = initial_fleet(scn, H200_QWEN25VL7B, SLO, start=START, window=WINDOW, cold_start=90.0, guess=guess, limit=64)
    assert n > guess  # the burst in the second window (90 s after the start) is covered, not just the first

    def met(replicas: int) -> bool:
        result = simulate(scn, SchedulePolicy((replicas,), 60.0), params=H200_QWEN25VL7B, cold_start=0.0, slo=SLO,
                          min_replicas=1, max_replicas=64, initial_replicas=replicas, start=0.0)  # fmt: skip
        keep = (result.arrival >= START) & (result.arrival < START + 2 * WINDOW)
        verdicts = slo_metrics.windows(result.arrival[keep], result.e2e[keep], seconds(SLO.target), SLO.percentile,
                                       WINDOW, origin=START)  # fmt: skip
        return bool(verdicts.passed.all())

    assert met(n) and not met(n - 1)
    with pytest.raises(OracleError, match="no fleet of up to 2 replicas"):
        initial_fleet(scn, H200_QWEN25VL7B, SLO, start=START, window=WINDOW, cold_start=90.0, guess=1, limit=2)
