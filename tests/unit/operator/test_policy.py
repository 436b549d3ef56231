"""mmfleet's SLO policy: its safety rules and the shape of its response to demand."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any

import pytest

from mmfleet.autoscaler import Decision, Observation, policy
from mmfleet.autoscaler.policy import SloPolicy, SloState, projected_backlog, rise_quantile, robust_trend
from mmfleet_lab.twin.policy import Policy

MU = 2.0  # req/s per replica at the SLO


@dataclass(frozen=True)
class Learned(SloPolicy):
    """The shipped policy once it has learned μ_SLO = MU near its knee, so each test reads one rule at a time."""

    def initial_state(self) -> SloState:
        return SloState(learned_capacity=MU, knee_seen=True)


POLICY = Learned()
# Without the per-cycle step cap, for the tests of the sizing rules it would otherwise cut short.
UNCAPPED = Learned(step_pods=10**6)


def obs(**kw: Any) -> Observation:
    base: dict[str, Any] = {
        "time": 0.0,
        "ready": 5,
        "starting": 0,
        "unschedulable": 0,
        "current": 5,
        "min_replicas": 1,
        "max_replicas": 100,
        "slo_target": 2.0,
        "slo_percentile": 90.0,
        "cold_start": 120.0,
        "request_rate": 8.0,
        "arrival_rate": 8.0,
        "latency": 1.0,
        "waiting": 0.0,
    }
    base.update(kw)
    if "running" not in kw and base["arrival_rate"] is not None and base["latency"] is not None:
        base["running"] = base["arrival_rate"] * base["latency"]  # Little's law, as a real fleet would show
    return Observation(**base)


def steady(policy: Policy, seconds: float, step: float = 15.0, **kw: Any) -> tuple[Any, list[Decision]]:
    """Run ``seconds`` of identical observations (times from kw['time'], default 0), fleet following."""
    state = kw.pop("state", policy.initial_state())
    t0 = kw.pop("time", 0.0)
    decisions: list[Decision] = []
    o = obs(time=t0, **kw)
    for i in range(int(seconds / step)):
        o = replace(o, time=t0 + i * step)
        d = policy.decide(o, state)
        state = d.state
        decisions.append(d)
        o = replace(o, current=d.replicas, ready=d.replicas)
    return state, decisions


def test_it_is_a_policy() -> None:
    policy: Policy = SloPolicy()
    assert policy.name == "mmfleet"
    assert isinstance(policy.initial_state(), SloState)


# ---------------------------------------------------------------- silence is not zero


def test_missing_metrics_hold_and_say_so() -> None:
    for missing in ({"latency": None}, {"request_rate": None}, {"waiting": None}):
        d = POLICY.decide(obs(current=8, ready=8, **missing), SloState())
        assert d.replicas == 8
        assert "metrics missing" in d.reason
        assert "holding 8" in d.reason


def test_silence_never_scales_to_the_minimum_and_keeps_the_memory() -> None:
    state, _ = steady(POLICY, 300, arrival_rate=30.0, request_rate=30.0)
    silent = obs(time=300.0, current=17, ready=17, latency=None, request_rate=None, waiting=None, arrival_rate=None)
    d = POLICY.decide(silent, state)
    assert d.replicas == 17
    assert d.state == state


# ---------------------------------------------------------------- feed-forward and scale-up


def test_steady_demand_gets_forecast_over_capacity() -> None:
    _, decisions = steady(POLICY, 600)
    assert decisions[-1].replicas == math.ceil(8.0 / MU) == 4


def test_scale_up_is_immediate_on_a_step_and_sized_for_the_queue_it_will_meet() -> None:
    state, decisions = steady(POLICY, 600)
    assert decisions[-1].replicas == 4
    d = UNCAPPED.decide(obs(time=600.0, current=4, ready=4, arrival_rate=32.0), state)
    # the first observation of the step: 32 req/s needs 32 / 2 = 16, and while the new pods start
    # the 4 Ready ones fall behind by 32 - 8 req/s for 120 s: 2880 requests to drain in 60 s at 2 req/s
    # each would be 24 more, but the backlog sits on the 4 Ready replicas, which alone can serve it: 4 more,
    # while the arrivals get 16 of their own
    assert d.replicas == math.ceil(32.0 / MU) + 4 == 20
    assert "4 -> 20" in d.reason
    smaller = POLICY.decide(obs(time=600.0, current=4, ready=4, arrival_rate=10.0), state)  # under the cap: in full
    assert smaller.replicas == math.ceil(10.0 / MU + (10.0 - 4 * MU) * 120.0 / (MU * 60.0)) == 7


def test_pods_still_starting_are_not_requested_again() -> None:
    state, _ = steady(UNCAPPED, 600)
    first = UNCAPPED.decide(obs(time=600.0, arrival_rate=32.0), state)
    n = first.replicas
    # 15 s later: the queue grew, the new pods are still starting
    later = obs(time=615.0, arrival_rate=32.0, current=n, ready=5, starting=n - 5, waiting=300.0, latency=3.0)
    second = UNCAPPED.decide(later, first.state)
    assert second.replicas == n
    assert f"{n - 5} pods starting" in second.reason
    # the same moment without the memory of that order would look like pods from nowhere: it asks for more,
    # treating them as a full cold start away, but still never adds to what is already starting twice
    blind = UNCAPPED.decide(later, replace(first.state, orders=()))
    assert blind.replicas >= n


def test_a_ramp_is_anticipated_and_a_step_is_not_extrapolated() -> None:
    ramp = [(15.0 * i, 8.0 + 0.2 * 15.0 * i) for i in range(20)]
    slope, spread = robust_trend(tuple(ramp))
    assert math.isclose(slope, 0.2)
    assert spread < 1e-9
    step = [(15.0 * i, 8.0) for i in range(18)] + [(270.0, 32.0), (285.0, 32.0)]
    assert robust_trend(tuple(step)) == (0.0, 0.0)


def test_projected_backlog_counts_pods_on_their_way() -> None:
    # 5 ready at 2 req/s, 32 req/s arriving: +22/s for 120 s
    assert projected_backlog(0.0, 32.0, 5, [], 0.0, 120.0, 2.0) == 22.0 * 120.0
    # 11 more pods Ready at 60 s: +22/s for 60 s, then 32 - 32 = 0
    assert projected_backlog(0.0, 32.0, 5, [60.0] * 11, 0.0, 120.0, 2.0) == 22.0 * 60.0
    # enough on the way drains what is queued
    assert projected_backlog(500.0, 10.0, 5, [0.0] * 10, 0.0, 120.0, 2.0) == 0.0


def test_without_arrival_rate_demand_is_completions_plus_growth_in_flight() -> None:
    policy = Learned()
    first = policy.decide(obs(arrival_rate=None, request_rate=8.0, running=8.0, waiting=0.0), SloState())
    d = policy.decide(obs(time=15.0, arrival_rate=None, request_rate=8.0, running=8.0, waiting=30.0), first.state)
    assert "demand 10 req/s" in d.reason  # 8 finished + 30 more in flight over 15 s


def test_a_drained_backlog_is_not_read_as_demand() -> None:
    """Completions over the rate window include a backlog drained within it; so must the in-flight change."""
    policy, state = Learned(), SloState()
    # 20 req/s arrive throughout; 600 queued requests drain between 15 s and 30 s, so the one-minute completion
    # rate reads 30 req/s for the rest of the minute while in flight stays at its new level.
    for t, inflight, done in ((0.0, 620.0, 20.0), (15.0, 620.0, 20.0), (30.0, 20.0, 30.0), (45.0, 20.0, 30.0),
                              (60.0, 20.0, 30.0)):  # fmt: skip
        d = policy.decide(obs(time=t, arrival_rate=None, request_rate=done, running=inflight, waiting=0.0), state)
        state = d.state
    assert "demand 20 req/s" in d.reason  # 30 finished - 600 drained over the minute; not 30 + 0


# ---------------------------------------------------------------- bounds and unschedulable pods


def test_bounds_are_respected() -> None:
    up = UNCAPPED.decide(obs(arrival_rate=500.0, max_replicas=20), UNCAPPED.initial_state())
    assert up.replicas == 20
    assert "capped at max" in up.reason
    _, idle = steady(POLICY, 900, arrival_rate=0.0, request_rate=0.0, running=0.0, min_replicas=2)
    assert idle[-1].replicas == 2


def test_unschedulable_pods_stop_growth() -> None:
    state, _ = steady(POLICY, 600)
    d = POLICY.decide(obs(time=600.0, arrival_rate=32.0, current=7, ready=5, unschedulable=2), state)
    assert d.replicas == 7
    assert "unschedulable" in d.reason


# ---------------------------------------------------------------- scale-down


def test_scale_down_waits_for_the_window_and_never_goes_below_the_forecast() -> None:
    state, high = steady(POLICY, 900, arrival_rate=30.0, request_rate=30.0)
    assert high[-1].replicas == math.ceil(30.0 / MU) == 15
    _, low = steady(POLICY, 1200, time=900.0, state=state, current=15, ready=15, arrival_rate=7.0, request_rate=7.0)
    times = [900.0 + 15.0 * i for i in range(len(low))]
    window = POLICY.down_window(obs())
    assert window == 300.0
    # the recommendation of 15 made at t=885 holds everything before 885 + 300
    assert all(d.replicas == 15 for t, d in zip(times, low, strict=True) if t < 885.0 + window)
    assert "holding 15 until demand stays lower for 300s" in low[3].reason
    assert low[-1].replicas == math.ceil(7.0 / MU) == 4  # down to what the forecast needs, not below
    assert min(d.replicas for d in low) == 4


def test_a_slow_decline_is_followed_in_few_steps_not_one_pod_at_a_time() -> None:
    policy = Learned(stabilization=60.0)
    state, _ = steady(policy, 300, arrival_rate=36.0, request_rate=36.0)  # 20 replicas
    t, current, times, sizes = 300.0, 20, [], [20]
    for k in range(80):  # demand falls by 0.2 req/s every 15 s: the need drops by a pod per ~2 cycles
        rate = 36.0 - 0.2 * k
        d = policy.decide(obs(time=t, current=current, ready=current, arrival_rate=rate, request_rate=rate), state)
        state = d.state
        if d.replicas != current:
            times.append(t)
            sizes.append(d.replicas)
        current, t = d.replicas, t + 15.0
    steps = [a - b for a, b in itertools.pairwise(sizes)]
    assert sizes[-1] <= 13  # it does follow the decline (the need at the end is 12)
    assert all(step >= 2 for step in steps)  # each step frees at least a tenth of a 20-pod fleet
    assert all(b - a >= 120.0 for a, b in itertools.pairwise(times))  # at most one every two minutes


def test_a_scale_down_that_frees_less_than_a_tenth_of_the_fleet_is_not_worth_a_cold_start() -> None:
    policy = Learned(stabilization=30.0)
    # 19 pods' worth of demand on a fleet of 20: 5% idle, held
    _, ds = steady(policy, 600, current=20, ready=20, arrival_rate=38.0, request_rate=38.0)
    assert all(d.replicas == 20 for d in ds)


def test_down_window_is_at_least_the_cold_start() -> None:
    assert POLICY.down_window(obs(cold_start=420.0)) == 420.0
    assert SloPolicy(stabilization=60.0).down_window(obs(cold_start=420.0)) == 60.0


def test_no_scale_down_while_over_target() -> None:
    policy = Learned(stabilization=30.0)
    state, _ = steady(policy, 600, arrival_rate=30.0, request_rate=30.0)
    _, ds = steady(
        policy, 120, time=600.0, state=state, current=17, ready=17, arrival_rate=8.0, request_rate=8.0, latency=3.0
    )
    assert all(d.replicas == 17 for d in ds)
    assert "while over target" in ds[-1].reason


# ---------------------------------------------------------------- feedback and learning


def test_latency_feedback_without_a_capacity_model() -> None:
    policy = SloPolicy()  # nothing learned: the SLO never held
    state, ds = steady(policy, 60, latency=4.0, waiting=20.0, ready=4, current=4)
    assert ds[-1].replicas == 4  # the first window: latency describes a fleet we have not watched yet
    d = policy.decide(obs(time=60.0, latency=4.0, waiting=20.0, ready=4, current=4), state)
    assert d.replicas == 8  # 4 ready x min(4 / 2, 2)
    assert "latency feedback" in d.reason


def test_no_feedback_while_the_queue_drains() -> None:
    policy = SloPolicy()
    state, _ = steady(policy, 60, latency=4.0, waiting=200.0, ready=4, current=4)
    d = policy.decide(obs(time=60.0, latency=4.0, waiting=50.0, ready=4, current=4), state)
    assert d.replicas == 4


def test_capacity_is_learned_from_windows_within_the_slo() -> None:
    policy = SloPolicy()
    # P90 at 3/4 of the target: near the knee, so what was learned is what the fleet is sized with (no probe)
    state, ds = steady(policy, 300, ready=4, current=4, arrival_rate=8.0, request_rate=8.0, latency=1.5)
    assert state.learned_capacity == 2.0 and state.knee_seen
    assert ds[-1].replicas == 4  # 8 req/s at 2 req/s per replica, no extra headroom on a learned lower bound
    d = policy.decide(obs(time=300.0, ready=4, current=4, arrival_rate=12.0, request_rate=8.0), state)
    assert d.replicas >= 6


def _fixed_demand(policy: SloPolicy, hours: float, replicas: int, demand: float, **kw: Any) -> list[Decision]:
    """A fleet serving a fixed ``demand`` whatever its size (latency as given): what each cycle decides."""
    state, current, decisions = policy.initial_state(), replicas, []
    for i in range(int(hours * 3600 / 15)):
        o = obs(time=15.0 * i, current=current, ready=current, arrival_rate=demand, request_rate=demand,
                running=demand, **kw)  # fmt: skip
        d = policy.decide(o, state)
        state, current = d.state, d.replicas
        decisions.append(d)
    return decisions


def test_an_oversized_fleet_that_never_comes_near_its_knee_probes_down() -> None:
    # 20 replicas for 8 req/s at P90 a quarter of the target: 0.4 req/s per replica is all it ever saw within the
    # SLO, a lower bound that would hold the fleet at 20 for good; the probe assumes more, and says so.
    decisions = _fixed_demand(SloPolicy(), 2.0, 20, 8.0, latency=0.5)
    assert decisions[-1].replicas <= 10, decisions[-1].reason
    assert "the fleet has not come near its knee" in decisions[-1].reason
    assert all(b.replicas <= a.replicas for a, b in itertools.pairwise(decisions)), "no scale-up while it probes"


def test_a_near_empty_fleet_is_not_sized_on_the_capacity_its_idle_replicas_showed() -> None:
    # One replica seen serving 0.05 req/s (all that came), rarely a request in flight: that is its arrivals, not its
    # capacity. A burst to 0.15 req/s, under one request in flight on average and none waiting, is served by it.
    quiet = {"ready": 1, "current": 1, "request_rate": 0.05, "latency": 0.3, "running": 0.0, "slo_target": 10.0}
    state, _ = steady(SloPolicy(), 600, arrival_rate=0.05, **quiet)
    assert state.learned_capacity == pytest.approx(0.05)
    burst = obs(time=600.0, arrival_rate=0.15, **quiet)
    d = SloPolicy().decide(burst, state)
    assert d.replicas == 1, d.reason
    assert "hold under 1 request in flight each" in d.reason
    # A request waiting is the replica at a limit of its own: the forecast sizes the fleet again.
    assert SloPolicy().decide(replace(burst, waiting=1.0), state).replicas > 1
    # So are two requests in flight over a rate window, and a profiled capacity, the user's word, not what arrived.
    _, busier = steady(SloPolicy(), 90, time=600.0, state=state, arrival_rate=0.15, **{**quiet, "running": 2.0})
    assert max(d.replicas for d in busier) > 1
    assert SloPolicy(capacity_per_replica=0.05).decide(burst, state).replicas > 1
    # The latency feedback is not the forecast: a steady replica over target is grown whatever it holds.
    late = SloPolicy().decide(replace(burst, latency=20.0), state)
    assert late.replicas == 2 and "latency feedback on 1 ready" in late.reason, late.reason
    # Once grown (by the feedback, say), the untested capacity does not hold the fleet up on the way down.
    state, ds = steady(
        SloPolicy(), 900, time=600.0, state=state, arrival_rate=0.05, **{**quiet, "ready": 3, "current": 3}
    )
    assert ds[-1].replicas < 3, ds[-1].reason


def test_the_probe_ends_when_the_fleet_comes_near_its_knee_and_does_not_start_again() -> None:
    policy = SloPolicy()
    state, _ = steady(policy, 1800, ready=20, current=20, arrival_rate=8.0, request_rate=8.0, latency=0.5)
    assert state.probe > 1.0
    near = policy.decide(obs(time=1800.0, ready=8, current=8, arrival_rate=8.0, request_rate=8.0, latency=1.2), state)
    assert near.state.probe == 1.0 and near.state.knee_seen
    assert "knee" not in near.reason
    state, _ = steady(policy, 1800, time=1815.0, state=near.state, ready=8, current=8, latency=0.5)
    assert state.probe == 1.0


def test_the_probe_assumes_at_most_half_as_much_again_as_was_learned() -> None:
    state, _ = steady(SloPolicy(), 3600, ready=20, current=20, arrival_rate=8.0, request_rate=8.0, latency=0.5)
    assert state.probe == 1.5
    fleet = {"ready": 20, "current": 20, "arrival_rate": 8.0, "request_rate": 8.0, "latency": 0.5}
    d = SloPolicy().decide(obs(time=3600.0, **fleet), state)
    assert "1.50x the learned" in d.reason


def test_a_queue_the_replicas_cannot_clear_within_half_the_target_ends_the_probe() -> None:
    policy = SloPolicy()
    state, ds = steady(policy, 1800, ready=20, current=20, arrival_rate=8.0, request_rate=8.0, latency=0.5)
    n, learned = ds[-1].replicas, state.learned_capacity
    assert state.probe > 1.0 and learned is not None
    clears = learned * n * 2.0  # what the Ready replicas clear within the 2 s target, at the learned capacity
    fleet = {"ready": n, "current": n, "arrival_rate": 8.0, "request_rate": 8.0, "latency": 0.5}
    below = policy.decide(obs(time=1800.0, waiting=0.4 * clears, **fleet), state)
    assert below.state.probe > 1.0 and not below.state.knee_seen
    queued = policy.decide(obs(time=1800.0, waiting=0.6 * clears, **fleet), state)
    assert queued.state.probe == 1.0 and queued.state.knee_seen


def test_a_fleet_at_min_replicas_does_not_probe() -> None:
    # nothing to shrink: a probe grown there would only size the next ramp smaller
    state, _ = steady(SloPolicy(), 3600, ready=4, current=4, min_replicas=4, arrival_rate=1.0, request_rate=1.0,
                      latency=0.5)  # fmt: skip
    assert state.probe == 1.0


def test_a_profiled_capacity_is_not_probed_even_when_set_while_a_probe_runs() -> None:
    decisions = _fixed_demand(SloPolicy(capacity_per_replica=2.0), 2.0, 20, 8.0, latency=0.5)
    assert decisions[-1].replicas == 4  # 8 req/s at the profile's 2 req/s per replica
    assert decisions[-1].state.probe == 1.0
    probing, _ = steady(SloPolicy(), 1800, ready=20, current=20, arrival_rate=8.0, request_rate=8.0, latency=0.5)
    assert probing.probe > 1.0
    profiled = SloPolicy(capacity_per_replica=2.0).decide(
        obs(time=1800.0, ready=20, current=20, arrival_rate=8.0, request_rate=8.0, latency=0.5), probing
    )
    assert profiled.state.probe == 1.0 and "the learned" not in profiled.reason


def test_a_heavier_mix_than_profiled_lowers_the_capacity_used() -> None:
    # replicas with a standing queue for a whole window serve 1 req/s, not the 2 assumed
    state, _ = steady(POLICY, 60, ready=8, current=8, arrival_rate=8.0, request_rate=8.0, waiting=200.0, latency=5.0)
    d = POLICY.decide(
        obs(time=60.0, ready=8, current=8, arrival_rate=8.0, request_rate=8.0, waiting=200.0, latency=5.0), state
    )
    # what the replicas are believed to serve: μ decays toward what they did serve, the correction does the rest
    assert d.state.learned_capacity * d.state.capacity_scale == pytest.approx(1.0)
    assert d.replicas >= math.ceil(8.0 / (1.0 * 0.9))


def test_a_heavier_request_mix_is_sized_for_before_its_requests_miss_the_slo() -> None:
    # μ_SLO = 2 req/s learned at 1000 prompt and 100 output tokens per request (near the knee: P90 3/4 of the target)
    at = {"ready": 4, "current": 4, "arrival_rate": 8.0, "request_rate": 8.0, "latency": 1.5}
    state, _ = steady(SloPolicy(), 300, request_mix=(1000.0, 100.0), **at)
    assert state.learned_capacity == 2.0 and state.mix == (1000.0, 100.0)
    # The same requests per second, each now with twice the output tokens, P90 just over target (so this cycle teaches
    # nothing): the mean growth of the two is 1.5, less the 0.1 any window varies by, so a replica is taken to serve
    # 2 / 1.4 req/s, and the four Ready ones fall behind by what that leaves.
    over = {**at, "latency": 2.1}
    d = SloPolicy().decide(obs(time=300.0, request_mix=(1000.0, 200.0), **over), state)
    assert (
        "at 1.43 req/s per replica (divided by 1.40: its requests carry 1.50x the tokens it was learned at)" in d.reason
    )
    unknown = SloPolicy().decide(obs(time=300.0, request_mix=None, **over), state)
    assert unknown.replicas == 5, unknown.reason  # the latency feedback alone: 4 x 2.1 / 2
    assert d.replicas >= math.ceil(8.0 / (2.0 / 1.4)) > unknown.replicas, d.reason
    # a mix within the tolerance, a lighter one, or none known: sized on μ_SLO as learned
    for mix in ((1050.0, 110.0), (500.0, 50.0), None):
        assert SloPolicy().decide(obs(time=300.0, request_mix=mix, **at), state).replicas == 4, mix


def test_a_capacity_learned_at_a_heavier_mix_is_replaced_by_what_the_replicas_serve_at_this_one() -> None:
    at = {"ready": 4, "current": 4, "latency": 1.5}
    state, _ = steady(SloPolicy(), 300, arrival_rate=4.0, request_rate=4.0, request_mix=(2000.0, 200.0), **at)
    assert state.learned_capacity == 1.0
    # lighter requests, twice as many on the same replicas within the SLO two cycles in a row: μ_SLO is that, at it
    for t in (300.0, 315.0):
        lighter = obs(time=t, arrival_rate=8.0, request_rate=8.0, request_mix=(1000.0, 100.0), **at)
        state = SloPolicy().decide(lighter, state).state
    assert state.learned_capacity == 2.0 and state.mix == (1000.0, 100.0)


def test_replicas_missing_the_slo_at_a_heavier_mix_teach_a_capacity_at_that_mix() -> None:
    at = {"ready": 4, "current": 4, "arrival_rate": 8.0, "request_rate": 8.0, "latency": 1.5}
    state, _ = steady(SloPolicy(), 300, request_mix=(1000.0, 100.0), **at)
    # twice the output tokens; the replicas, with a standing queue and nothing on order, serve 1 req/s each and miss
    missing = {**at, "request_rate": 4.0, "latency": 3.0, "waiting": 200.0}
    for t in (300.0, 315.0, 330.0, 345.0, 360.0):
        state = SloPolicy().decide(obs(time=t, request_mix=(1000.0, 200.0), **missing), state).state
    assert state.mix == (1000.0, 200.0), "what it falls toward was served at this mix"
    assert 1.0 < state.learned_capacity < 2.0 / 1.4


def test_a_streak_with_one_mix_not_read_keeps_the_mix_it_was_served_at() -> None:
    at = {"ready": 4, "current": 4, "arrival_rate": 8.0, "request_rate": 8.0, "latency": 1.5}
    state, _ = steady(SloPolicy(), 60, request_mix=None, **at)
    for t, mix in ((60.0, (1000.0, 100.0)), (75.0, None)):  # the mix's query refused in the second cycle
        state = SloPolicy().decide(obs(time=t, request_mix=mix, **at), state).state
    assert state.learned_capacity == 2.0 and state.mix == (1000.0, 100.0)


def test_a_profiled_capacity_is_not_divided_by_a_heavier_mix() -> None:
    # The profile is the user's measurement at their own mix, which the operator does not know.
    at = {"ready": 4, "current": 4, "arrival_rate": 8.0, "request_rate": 8.0, "latency": 1.5}
    profiled = SloPolicy(capacity_per_replica=2.0)
    state, _ = steady(profiled, 300, request_mix=(1000.0, 100.0), **at)
    d = profiled.decide(obs(time=300.0, request_mix=(1000.0, 200.0), **{**at, "latency": 2.1}), state)
    assert "divided by" not in d.reason and "at 2 req/s per replica" in d.reason, d.reason


def test_the_first_decision_never_scales_down() -> None:
    # the first rate windows are often half filled; the current size counts as a recommendation
    d = POLICY.decide(obs(current=10, ready=10, arrival_rate=2.0, request_rate=2.0), POLICY.initial_state())
    assert d.replicas == 10
    assert "holding 10 until demand stays lower for 300s" in d.reason


def test_a_latency_window_that_is_not_a_multiple_of_the_interval_still_settles() -> None:
    # The operator's cycle (3 s here) need not divide the SLO window (20 s): the policy must still see
    # a steady fleet, learn its capacity, and answer a step in demand with more replicas.
    policy = SloPolicy(interval=3.0, settle=20.0)
    state, _ = steady(policy, 60, step=3.0, current=1, ready=1, arrival_rate=4.0, request_rate=4.0, latency=2.0)
    assert state.learned_capacity == 4.0
    d = policy.decide(obs(time=60.0, current=1, ready=1, arrival_rate=20.0, request_rate=4.0, latency=2.5), state)
    assert d.replicas >= 4, d.reason


def test_an_over_target_fleet_whose_queue_shrinks_may_scale_down() -> None:
    # After a spike, the queues left on the old pods drain at their own pace and keep the percentile
    # over target; pods added for the spike do not speed that up, so they may go once demand is low.
    policy = Learned(stabilization=60.0)
    state, _ = steady(policy, 300, arrival_rate=36.0, request_rate=36.0)  # 20 replicas
    queue, t, current = 5000.0, 300.0, 20
    for _ in range(12):
        d = policy.decide(obs(time=t, current=current, ready=current, arrival_rate=8.0, request_rate=8.0,
                              latency=30.0, waiting=queue), state)  # fmt: skip
        state, current, queue, t = d.state, d.replicas, queue - 300.0, t + 15.0
    assert current < 20
    held = policy.decide(obs(time=t, current=current, ready=current, arrival_rate=8.0, request_rate=8.0,
                             latency=30.0, waiting=queue + 3000.0), state)  # fmt: skip
    assert held.replicas >= current  # a queue that grows again: no scale-down


# ---------------------------------------------------------------- headroom learned from the fleet's own demand


def noisy(sigma: float, minutes: float = 30.0, seed: int = 0, step: float = 15.0) -> tuple[tuple[float, float], ...]:
    """Demand around 100 req/s whose log wanders like a random walk: sigma per minute, pulled back to 100."""
    import random

    rng = random.Random(seed)
    log, samples = 0.0, []
    for i in range(int(minutes * 60 / step)):
        log = 0.9 * log + rng.gauss(0.0, sigma * math.sqrt(step / 60.0))
        samples.append((i * step, 100.0 * math.exp(log)))
    return tuple(samples)


def test_the_rise_grows_with_the_workloads_variability_and_the_horizon() -> None:
    calm, lively = noisy(0.02), noisy(0.10)
    assert rise_quantile(calm, 105.0, 90.0) < rise_quantile(lively, 105.0, 90.0)
    assert rise_quantile(lively, 105.0, 90.0) < rise_quantile(lively, 435.0, 90.0)  # a longer cold start
    assert rise_quantile(lively, 105.0, 90.0) < rise_quantile(lively, 105.0, 99.0)  # a stricter SLO
    flat = tuple((i * 15.0, 100.0) for i in range(120))
    assert rise_quantile(flat, 105.0, 90.0) == 0.0  # a steady trace gets no headroom
    assert rise_quantile(lively[:5], 105.0, 90.0) == 0.0  # nor does a fleet too young to know its workload


def test_one_spike_in_the_history_does_not_set_the_headroom() -> None:
    """A x4 step for 10 minutes leaves a few changes at ln 4, which a quantile of the changes would follow."""
    base = noisy(0.05)
    spiked = tuple((t, v * (4.0 if 600.0 <= t < 1200.0 else 1.0)) for t, v in base)
    assert rise_quantile(spiked, 105.0, 90.0) < 1.3 * rise_quantile(base, 105.0, 90.0)
    assert rise_quantile(spiked, 105.0, 90.0) < 0.5


def test_a_fleet_whose_demand_wanders_keeps_headroom_over_its_demand() -> None:
    """Sized for today's demand alone, the fleet misses windows each time demand rises within a cold start:
    the last decision covers the last demand grown by the rise learned from the fleet's own history."""
    history = noisy(0.10)
    state, replicas = POLICY.initial_state(), 50
    for t, demand in history:
        o = obs(time=t, arrival_rate=demand, request_rate=demand, current=replicas, ready=replicas, running=demand)
        decision = POLICY.decide(o, state)
        state, replicas = decision.state, decision.replicas
    rise = rise_quantile(history, 120.0 + POLICY.interval, 90.0)
    assert rise > 0.1
    assert replicas >= math.ceil(history[-1][1] * (1.0 + rise) / MU)


def test_a_scale_down_keeps_what_demand_may_rise_to_within_the_reversal_horizon() -> None:
    """Released pods that wandering demand soon needs again are a reversal, each a cold start: a scale-down keeps
    the demand grown by the rise learned over two down windows, more than the rise over one cold start."""
    history = noisy(0.10, minutes=45.0)
    fall = history[len(history) * 2 // 3][0]  # demand halves for the last 15 minutes, still wandering
    state, replicas, downs = POLICY.initial_state(), 50, []
    for t, level in history:
        demand = level / 2 if t >= fall else level
        o = obs(time=t, arrival_rate=demand, request_rate=demand, current=replicas, ready=replicas, running=demand)
        decision = POLICY.decide(o, state)
        if decision.replicas < replicas:
            downs.append((decision.replicas, demand, decision.state.demand))
        state, replicas = decision.state, decision.replicas
    assert downs
    for after, demand, samples in downs:
        horizon_rise = min(rise_quantile(samples, 2 * POLICY.down_window(obs()), 90.0), 1.0)
        assert horizon_rise > rise_quantile(samples, 120.0 + POLICY.interval, 90.0)
        assert after >= math.ceil(demand * (1.0 + horizon_rise) / MU)


def run_demand(policy: SloPolicy, history: tuple[tuple[float, float], ...]) -> list[tuple[float, Decision]]:
    """The fleet following ``policy`` through ``history`` (time, req/s), pods Ready at once, maxReplicas far off."""
    state, replicas, decisions = policy.initial_state(), 50, []
    for t, demand in history:
        o = obs(time=t, arrival_rate=demand, request_rate=demand, current=replicas, ready=replicas, running=demand,
                max_replicas=1000)  # fmt: skip
        decision = policy.decide(o, state)
        decisions.append((demand, decision))
        state, replicas = decision.state, decision.replicas
    return decisions


def test_demand_that_swings_faster_than_a_pod_starts_is_held_for_its_peaks_not_chased(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pods ordered when demand swings up arrive after it has swung back: the fleet holds what the peaks of the last
    15 minutes needed, as a static fleet would, and says so, instead of following each swing up and down."""
    history = noisy(0.30)
    assert rise_quantile(history, 60.0, 90.0) > 0.25  # rises by more than a quarter within a minute, at P90
    held = run_demand(UNCAPPED, history)
    monkeypatch.setattr(policy, "SWING", math.inf)
    chased = run_demand(UNCAPPED, history)
    half = len(history) // 2
    for i, (_, d) in enumerate(held[half:], start=half):
        t = history[i][0]
        peak = max(v for u, v in history[: i + 1] if u > t - 900.0)
        capacity = d.state.learned_capacity
        assert capacity is not None and d.replicas >= math.ceil(peak / capacity - 1e-9), (t, d.reason)
    changes = [sum(a.replicas != b.replicas for (_, a), (_, b) in pairwise(run[half:])) for run in (held, chased)]
    assert changes[0] < changes[1] / 2, changes  # fewer pods ordered and released, each a cold start
    last = held[-1][1]
    assert "it swings within 60s, so held for its peak of the last 15 minutes (" in last.reason, last.reason
    assert last.state.swung is not None and last.state.envelope is not None


def test_a_swinging_demand_at_a_new_high_keeps_the_headroom_for_its_rise() -> None:
    """At its envelope, demand is not held but forecast as usual: a swinging demand that also grows is not sized a
    cold start late."""
    history = tuple((t, v * 2.0 ** (t / 900.0)) for t, v in noisy(0.30))
    decisions = run_demand(UNCAPPED, history)
    highs = [d for (demand, d), (t, _) in zip(decisions, history, strict=True)
             if t > 900.0 and demand >= max(v for u, v in history if t - 900.0 < u <= t)]  # fmt: skip
    assert highs and any("held for its peak" in d.reason for _, d in decisions)  # it swings, and is held below
    for d in highs:
        assert "forecast" in d.reason and "held for its peak" not in d.reason


def test_the_hold_lasts_15_minutes_after_the_last_swing_then_the_fleet_follows_again() -> None:
    """Near the threshold the hold does not flap on and off each cycle; once demand has calmed it is released."""
    swings = noisy(0.30, minutes=20.0)
    calm = tuple((t + 1200.0, v) for t, v in noisy(0.02, minutes=60.0, seed=1))
    decisions = run_demand(UNCAPPED, (*swings, *calm))
    held = [d for _, d in decisions if "so held for its peak" in d.reason]
    assert held and all(d.state.swung is not None and d.state.time - d.state.swung < 900.0 for d in held)
    assert any(d.state.swing is not None and d.state.swing <= policy.SWING for d in held)  # latched, not flapping
    assert "so held for its peak" not in decisions[-1][1].reason and decisions[-1][1].state.envelope is None


def test_a_scale_down_delay_the_user_set_holds_no_swinging_demands_peak() -> None:
    """``scaleDownDelay`` says how long demand must stay lower before replicas go: a demand that swung within a minute
    is held for its peak of 15 minutes by default, and followed where the user set a delay (45 s, as the e2e test
    does), with the forecast's headroom and the reversal floor as for any demand."""
    swings = noisy(0.30, minutes=20.0)
    calm = tuple((t + 1200.0, v) for t, v in noisy(0.02, minutes=10.0, seed=1))
    history = (*swings, *calm)
    default, delayed = (run_demand(p, history) for p in (UNCAPPED, Learned(step_pods=10**6, stabilization=45.0)))
    five = len(swings) + 20  # five minutes into the calm
    peak = max(v for t, v in swings if t > history[five][0] - 900.0)
    assert default[five][1].replicas >= math.ceil(peak / MU - 1e-9), default[five][1].reason
    assert "held for its peak of the last 15 minutes" in default[five][1].reason
    assert delayed[five][1].replicas < 0.8 * default[five][1].replicas, delayed[five][1].reason
    assert not any("held for its peak" in d.reason for _, d in delayed)
    swung = [d.state for _, d in delayed if d.state.swung is not None]
    assert swung and all(s.envelope is None for s in swung)  # it swings, and is not held


def test_a_short_lull_keeps_the_hold_and_a_fleet_woken_from_zero_holds_no_peak_from_before_it() -> None:
    """Bursts with a minute of nothing between them still swing; a fleet the operator took to zero sizes for what
    comes after it, not for the bursts before it."""
    swings = noisy(0.30, minutes=20.0)
    lull = tuple((1200.0 + i * 15.0, 0.0) for i in range(4))
    back = tuple((1260.0 + i * 15.0, 2.0) for i in range(4))
    decisions = run_demand(UNCAPPED, (*swings, *lull, *back))
    assert "so held for its peak" in decisions[-1][1].reason  # a minute of nothing is no reason to let go
    state, replicas = decisions[len(swings) - 1][1].state, 1
    state = replace(state, swung=None, zeroed=1200.0)  # as the operator's cycle leaves it when it scales to zero
    for t, demand in back:
        o = obs(time=t, arrival_rate=demand, request_rate=demand, current=replicas, ready=replicas, running=demand,
                max_replicas=1000)  # fmt: skip
        decision = UNCAPPED.decide(o, state)
        state, replicas = decision.state, decision.replicas
        assert state.envelope is None or state.envelope <= 2.0, decision.reason


def test_demand_that_wanders_within_a_minute_no_more_than_steady_traffic_is_followed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    history = noisy(0.10)
    followed = [d.replicas for _, d in run_demand(UNCAPPED, history)]
    monkeypatch.setattr(policy, "SWING", math.inf)
    assert followed == [d.replicas for _, d in run_demand(UNCAPPED, history)]


# ---------------------------------------------------------------- a profiled capacity (capacityPerReplica)


def test_a_profiled_capacity_sizes_a_young_fleet_from_the_first_decision() -> None:
    """Learning online, a young fleet knows nothing and can only hold; with a profile it sizes at once."""
    young = obs(time=0.0, current=2, ready=2, arrival_rate=20.0, request_rate=8.0, running=8.0)
    assert SloPolicy().decide(young, SloPolicy().initial_state()).replicas == 2
    profiled = SloPolicy(capacity_per_replica=MU, step_pods=10**6)
    assert profiled.decide(young, profiled.initial_state()).replicas >= math.ceil(20.0 / MU)


def test_what_is_learned_online_only_raises_a_profiled_capacity() -> None:
    profiled = SloPolicy(capacity_per_replica=MU)
    state = SloState(learned_capacity=2 * MU)  # replicas were seen serving twice the profile within the SLO
    o = obs(time=0.0, current=4, ready=4, arrival_rate=8 * MU, request_rate=8 * MU, running=8 * MU)
    higher = profiled.decide(o, state)
    assert higher.replicas == 4 and f"at {2 * MU:g} req/s per replica" in higher.reason  # 8 μ over 2 μ each
    lower = profiled.decide(o, SloState(learned_capacity=MU / 2))  # a lower online estimate is not believed
    assert f"at {MU:g} req/s per replica" in lower.reason and lower.replicas >= 8


# ---------------------------------------------------------------- warm standby: the lead of a wake


def ramped(policy: Policy, **kw: Any) -> Decision:
    """The decision after five minutes of demand rising 0.05 req/s each second, the fleet following."""
    state, decision = policy.initial_state(), None
    current = 5
    for i in range(21):
        demand = 8.0 + 0.05 * 15.0 * i
        o = obs(time=15.0 * i, arrival_rate=demand, request_rate=demand, current=current, ready=current, **kw)
        decision = policy.decide(o, state)
        state, current = decision.state, decision.replicas
    assert decision is not None
    return decision


def test_replicas_asleep_stand_in_for_what_a_cold_start_would_have_to_bring_ahead() -> None:
    """Serving replicas for the demand within a wake; with those asleep, for the demand within the cold start."""
    without = ramped(UNCAPPED).replicas
    standby = ramped(UNCAPPED, asleep=2, wake=1.0).replicas
    demand_now = 8.0 + 0.05 * 300.0
    assert without - 2 <= standby < without, "up to the replicas asleep fewer serving, as they come in a second"
    assert standby >= math.ceil(demand_now / MU), "never fewer than today's demand needs"
    assert f"{without - standby} replicas of it asleep (woken in 1s)" in ramped(UNCAPPED, asleep=2, wake=1.0).reason


def test_a_standby_whose_wake_is_not_measured_yet_changes_nothing() -> None:
    assert ramped(UNCAPPED, asleep=2).replicas == ramped(UNCAPPED).replicas
