"""``mmfleet bench idle``: its days, its tuning rule and its rows, as the benchmark section states them."""

from __future__ import annotations

import numpy as np
import pytest

from mmfleet_lab.bench import idle
from mmfleet_lab.bench.baselines.keda import KedaPolicy
from mmfleet_lab.bench.baselines.knative import KpaPolicy
from mmfleet_lab.twin import Shipped
from mmfleet_lab.twin.policy import LabObservation


def test_each_day_is_played_whole_at_its_own_pace() -> None:
    scn = idle.day_scenario("2024-12-07", seed=0)
    assert scn.duration == idle.DAY
    assert len(scn.requests) == 400, "every request of the day (the trace's count for 2024-12-07)"
    assert scn.requests.arrival.min() >= 0 and scn.requests.arrival.max() < idle.DAY
    gaps = np.diff(scn.requests.arrival)
    assert (gaps >= idle.IDLE_GAP).sum() >= 10, "the day has idle gaps: what the benchmark is for"
    with pytest.raises(ValueError, match="no request on 2024-12-09"):
        idle.day_scenario("2024-12-09", seed=0)


def test_train_and_test_days_are_apart() -> None:
    assert not set(idle.SPLITS["train"]) & set(idle.SPLITS["test"])


def row(knob: float, violation: float, gpu: float) -> idle.Row:
    return idle.Row("keda-zero", "d", 0, knob, gpu, violation, 1.0, 0.0, 0.0, 0.0, 0, 0.0)


def test_the_tuning_rule_takes_the_cheapest_setting_near_the_fewest_violations() -> None:
    trials = [row(60, 40, 9), row(600, 11, 12), row(2400, 10, 15), row(3600, 10.5, 16)]
    assert idle.pick(trials) == 600, "11 <= 1.1 x 10, and the cheapest of those"
    assert idle.pick([row(60, 40, 9), row(2400, 10, 15)]) == 2400


def test_every_row_may_go_to_zero_but_the_reference() -> None:
    shipped, low, asleep = idle.policy("mmfleet")
    assert isinstance(shipped, Shipped) and (low, asleep) == (0, 0)
    assert idle.policy("always-on")[1] == 1
    keda, _, _ = idle.policy("keda-zero", 300.0)
    assert isinstance(keda, KedaPolicy) and keda.min_replica_count == 0 and keda.cooldown_period == 300.0
    kpa, _, _ = idle.policy("knative-zero", 300.0)
    assert isinstance(kpa, KpaPolicy) and kpa.scale_to_zero_grace == 300.0
    standby, low, asleep = idle.policy("mmfleet+standby")
    assert isinstance(standby, Shipped) and (low, asleep) == (0, 1), "the shipped autoscaler, one replica asleep"


def _at_zero(held: float) -> LabObservation:
    return LabObservation(time=100.0, ready=0, starting=0, unschedulable=0, current=0, min_replicas=0, max_replicas=4,
                          slo_target=10.0, slo_percentile=90.0, cold_start=90.0, held=held)  # fmt: skip


def test_the_zero_capable_baselines_wake_on_requests_held_in_front_of_the_servers() -> None:
    keda, _, _ = idle.policy("keda-zero", 300.0)
    kpa, _, _ = idle.policy("knative-zero", 300.0)
    for baseline in (keda, kpa):
        assert baseline.decide(_at_zero(0.0), baseline.initial_state()).replicas == 0
        assert baseline.decide(_at_zero(2.0), baseline.initial_state()).replicas >= 1, baseline.name


def measured(name: str, day: str, gpu: float, violation: float, seed: int = 0) -> idle.Row:
    return idle.Row(name, day, seed, None, gpu, violation, 1.0, 0.0, 0.0, 0.0, 0, 0.0)


def test_the_goal_needs_fewer_gpu_hours_beyond_the_seeds_spread_and_no_more_violations() -> None:
    day = idle.SPLITS["test"][0]
    rows = [
        measured("mmfleet", day, 10.0, 1.0), measured("mmfleet", day, 12.0, 1.0, seed=1),
        measured("keda-zero", day, 11.0, 1.0), measured("knative-zero", day, 20.0, 1.0),
    ]  # fmt: skip
    keda, knative = [line for line in idle.verdicts(rows) if line.startswith(f"- {day}")]
    assert keda.endswith("not shown (the GPU-hours' seed ranges overlap)"), "11 lies within 10-12"
    assert knative.endswith("the goal is met")
    worse = [*rows[:2], measured("keda-zero", day, 30.0, 0.5), rows[3]]
    assert idle.verdicts(worse)[0].endswith("not met (more violation-minutes)")


def test_the_day_table_names_each_rows_setting() -> None:
    rows = [
        idle.Row(name, "d", 0, knob, 1.0, 0.0, 1.0, 0.0, 0.5, 1.0, 0, 0.0)
        for name, knob in (("mmfleet", None), ("keda-zero", 600.0), ("always-on", None), ("mmfleet+standby", None))
    ]
    text = idle.day_table(rows)
    for setting in ("| auto ", "| 600 s to zero", "| minReplicas 1", "| auto, 1 asleep"):
        assert setting in text, setting
