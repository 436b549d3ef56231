"""The policy under bad samples: one outlier can neither hold a fleet small nor send it to maxReplicas.

Issue 13's findings, as the policy sees them (the operator's Observation, no arrival rate): a learned
capacity poisoned by one 30x request-rate sample, a wild queue sample, and a partial scrape.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from mmfleet.autoscaler import Decision, Observation
from mmfleet.autoscaler.policy import SloPolicy, SloState

TARGET = 2.0
MU = 2.0  # req/s one replica serves within the target


def seen(t: float, current: int, **kw: Any) -> Observation:
    base: dict[str, Any] = {
        "time": t, "ready": current, "starting": 0, "unschedulable": 0, "current": current, "min_replicas": 1,
        "max_replicas": 40, "slo_target": TARGET, "slo_percentile": 90.0, "cold_start": 90.0,
        "request_rate": MU * current, "latency": 1.0, "waiting": 0.0, "running": MU * current,
    }  # fmt: skip
    base.update(kw)
    return Observation(**base)


def settled(policy: SloPolicy, replicas: int, until: float) -> tuple[SloState, int]:
    """A fleet of ``replicas`` serving MU each within the target, near its knee (P90 at 3/4 of it), every 15 s until
    ``until``."""
    state = policy.initial_state()
    current = replicas
    for i in range(int(until / 15)):
        d = policy.decide(seen(15.0 * i, current, latency=0.75 * TARGET), state)
        state, current = d.state, d.replicas
    return state, current


def overload(policy: SloPolicy, state: SloState, start: float, minutes: float) -> list[Decision]:
    """3x the demand three replicas serve: they serve what they can, the queue grows, P90 is 3x the target."""
    decisions, current, waiting = [], 3, 0.0
    for i in range(int(minutes * 4)):
        served = MU * current * 1.2  # saturated replicas serve a little more than at the SLO
        waiting = max(0.0, waiting + (3 * MU * 3 - served) * 15.0)
        late = waiting > 0
        d = policy.decide(
            seen(start + 15.0 * i, current, request_rate=served, running=served, waiting=waiting,
                 latency=3 * TARGET if late else 1.0),
            state,
        )  # fmt: skip
        decisions.append(d)
        state, current = d.state, d.replicas
    return decisions


def test_one_outlier_request_rate_teaches_no_capacity() -> None:
    policy = SloPolicy()
    state, current = settled(policy, 3, 600)
    assert current == 3 and state.learned_capacity == MU
    glitch = policy.decide(seen(600.0, 3, request_rate=30 * MU * 3), state)
    assert glitch.state.learned_capacity == MU, "one sample at 30x is not a capacity"
    decisions = overload(policy, glitch.state, 615.0, minutes=15)
    assert max(d.replicas for d in decisions[:8]) >= 9, [d.reason for d in decisions[:8]]


def test_a_capacity_learned_too_high_decays_while_replicas_miss_the_target_with_a_standing_queue() -> None:
    policy = SloPolicy()
    state, _ = settled(policy, 3, 600)
    poisoned = replace(state, learned_capacity=30 * MU)  # as a running maximum kept it after one glitch
    decisions = overload(policy, poisoned, 600.0, minutes=15)
    assert decisions[0].replicas == 3
    grown = next(i for i, d in enumerate(decisions) if d.replicas >= 9)
    assert grown * 15.0 <= 5 * 60, "within five of the fifteen minutes of overload"
    assert decisions[grown].state.learned_capacity < 10 * MU, "the poisoned capacity fell"


def test_one_wild_queue_sample_grows_the_fleet_by_at_most_the_hpa_default_step() -> None:
    policy = SloPolicy()
    state, _ = settled(policy, 3, 600)
    wild = policy.decide(seen(600.0, 3, waiting=50_000.0), state)
    assert wild.replicas == 3 + 4, wild.reason  # max(4 pods, 100 %) per 15 s, as the HPA's default scale-up
    assert "growth capped at max(4 pods, 100%) per 15s" in wild.reason
    assert wild.replicas < 40
    # Ten replicas may double: the cap is a share of the fleet, not a constant.
    state, _ = settled(policy, 10, 600)
    assert policy.decide(seen(600.0, 10, waiting=50_000.0), state).replicas == 20


def test_a_partial_scrape_never_scales_down() -> None:
    policy = SloPolicy()
    state, current = settled(policy, 8, 900)
    assert current == 8
    # Demand falls to a quarter, as a scrape that misses six of the eight pods would also show it.
    quiet: dict[str, Any] = {"request_rate": MU * 2, "running": MU * 2}
    full, partial = state, state
    downs = []
    for i in range(40):
        t = 900.0 + 15.0 * i
        full_d = policy.decide(seen(t, 8, **quiet, reporting=8), full)
        partial_d = policy.decide(seen(t, 8, **quiet, reporting=2), partial)
        full, partial = full_d.state, partial_d.state
        downs.append(full_d.replicas < 8)
        assert partial_d.replicas == 8, partial_d.reason
    assert any(downs), "with every pod reporting, the same numbers do scale down"
    assert "only 2 of 8 Ready pods report metrics" in partial_d.reason


def test_a_standing_queue_while_pods_start_teaches_nothing_about_capacity() -> None:
    """A spike: the fleet has ordered pods and its queue stands until they are Ready; that is not a wrong μ_SLO."""
    policy = SloPolicy()
    state, _ = settled(policy, 3, 600)
    late = {"request_rate": MU * 3 * 0.5, "running": MU * 3, "waiting": 500.0, "latency": 3 * TARGET}
    for i in range(8):
        d = policy.decide(seen(600.0 + 15.0 * i, 9, ready=3, starting=6, **late), state)
        state = d.state
    assert state.learned_capacity == MU
