"""The benchmark's ``mmfleet`` row is the operator's ``cycle.decide`` with its defaults, fed as the loop feeds it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mmfleet.autoscaler import Decision, Observation, cycle
from mmfleet.autoscaler.cycle import WARM_UP_S
from mmfleet.autoscaler.policy import SloPolicy, SloState
from mmfleet_lab.twin import H200_QWEN25VL7B, Requests, Scenario, Shipped, simulate
from mmfleet_lab.twin.shipped import EPOCH
from tests.helpers.twin import SLO, steady


def run(req: Requests, policy: Shipped | SloPolicy, duration: float, **kw: Any) -> Any:
    return simulate(
        Scenario("t", req, duration), policy, params=H200_QWEN25VL7B, slo=SLO, cold_start=30.0, **kw
    )  # fmt: skip


def test_each_cycle_sees_what_the_operators_loop_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Deployment replicas, pods with their measured cold start, and signals (none missing once scraped)."""
    seen: list[tuple[float, cycle.Seen, int]] = []
    decide = cycle.decide

    def spy(inference: Any, what: cycle.Seen, memory: cycle.Memory, now: Any, **kw: Any) -> cycle.Outcome:
        assert inference.spec.autoscaling.slo == SLO and inference.spec.autoscaling.max_replicas == 6
        seen.append((now.timestamp(), what, len(memory.verdicts)))
        return decide(inference, what, memory, now, **kw)

    monkeypatch.setattr(cycle, "decide", spy)
    run(steady(2.0, 120.0), Shipped(), 120.0, initial_replicas=2, max_replicas=6, metrics_outage=(100.0, 200.0))
    times = [t - seen[0][0] for t, _, _ in seen]
    assert times == [0.0, 15.0, 30.0, 45.0, 60.0, 75.0, 90.0, 105.0]  # every 15 s from t = 15 s
    first, later, down = seen[0][1], seen[4][1], seen[-1][1]
    assert first.current == 2 and first.pods == cycle.Pods(ready=2, cold_start=30.0)
    assert later.signals is not None and later.signals.missing == () and later.signals.request_rate
    assert seen[4][2] > seen[1][2]  # the memory is carried: verdicts accumulate
    assert down.signals is None and down.outage


def test_the_policy_is_not_asked_within_the_first_rate_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """The warm-up hold of ``cycle.decide``: the policy is first asked one rate window after the first cycle."""
    asked: list[float] = []
    decide = SloPolicy.decide

    def spy(self: SloPolicy, observation: Observation, state: SloState) -> Decision:
        asked.append(observation.time - EPOCH.timestamp())  # the operator's clock is wall time
        return decide(self, observation, state)

    overload = steady(60.0, 300.0)  # far beyond what one replica serves within 10 s
    monkeypatch.setattr(SloPolicy, "decide", spy)
    shipped = run(overload, Shipped(), 300.0, initial_replicas=1, max_replicas=8)
    assert asked[0] == 15.0 + WARM_UP_S  # first cycle at 15 s, then one rate window of holding
    assert shipped.decisions[0][0] >= asked[0] and shipped.decisions[0][1] > 1
    assert np.all(shipped.desired[: int(asked[0])] == 1)


def test_an_idle_fleet_returns_to_min_replicas() -> None:
    """The idle rule of ``cycle.decide``: once requests stop, the bare policy sees no latency and holds."""
    five_minutes = steady(10.0, 300.0)
    shipped = run(five_minutes, Shipped(), 1200.0, initial_replicas=4, max_replicas=8)
    bare = run(five_minutes, SloPolicy(), 1200.0, initial_replicas=4, max_replicas=8)
    assert shipped.desired[-1] == 1 and bare.desired[-1] >= 4
