"""The twin's warm standby (``spec.autoscaling.warmStandby``): pods kept asleep holding their GPUs, woken in their
own wake time instead of a cold start, replaced by new pods that go to sleep, and deleted first on a scale-down."""

from __future__ import annotations

import numpy as np
import pytest

from mmfleet_lab.twin import H200_QWEN25VL7B, Requests
from mmfleet_lab.twin.compiled import CompiledEngine
from mmfleet_lab.twin.engine import Workload
from mmfleet_lab.twin.fleet import Fleet
from tests.helpers.twin import Script, run, steady

COLD_START, WAKE = 30.0, 4.0


def standby_fleet(serving: int = 1, standby: int = 1) -> Fleet:
    req = Requests(np.zeros(4), np.full(4, 500), np.full(4, 200), np.zeros(4))
    engine = CompiledEngine(H200_QWEN25VL7B, Workload.build(req, H200_QWEN25VL7B))
    return Fleet(engine, cold_start=COLD_START, initial=serving, standby=standby, wake=WAKE)


def test_the_fleet_starts_with_its_standby_asleep_and_only_the_serving_pods_take_requests() -> None:
    fleet = standby_fleet(serving=1, standby=2)
    assert (fleet.count("ready"), fleet.count("asleep")) == (1, 2)
    assert fleet.eligible().size == 1


def test_a_scale_up_wakes_an_asleep_pod_in_its_wake_time_and_a_new_pod_takes_its_place_asleep() -> None:
    fleet = standby_fleet()
    fleet.scale(2, 10.0)
    assert (fleet.count("waking"), fleet.count("starting")) == (1, 1)
    # As the operator counts it (standby.active_count): the waking pod fills the slot, the new one is its replacement.
    assert fleet.serving_counts() == (1, 0, 0)
    fleet.transitions(10.0 + WAKE)
    assert fleet.count("ready") == 2 and fleet.eligible().size == 2, "serving after the wake, not a cold start"
    fleet.transitions(10.0 + COLD_START)
    assert (fleet.count("ready"), fleet.count("asleep")) == (2, 1)


def test_a_scale_down_puts_the_youngest_to_sleep_and_deletes_an_asleep_pod_first() -> None:
    fleet = standby_fleet(serving=2, standby=1)
    fleet.scale(1, 10.0)
    fleet.transitions(10.0)
    assert (fleet.count("ready"), fleet.count("asleep"), fleet.count("gone")) == (1, 1, 1)


def test_sleeping_pods_hold_their_gpus() -> None:
    with_standby = run(steady(1.0, 100.0), Script([]), 100.0, initial_replicas=1, standby=1, wake=WAKE)
    without = run(steady(1.0, 100.0), Script([]), 100.0, initial_replicas=1)
    assert with_standby.gpu_seconds == pytest.approx(2 * without.gpu_seconds)


def test_a_step_is_served_after_the_wake_time_with_standby_and_after_a_cold_start_without() -> None:
    """The first second of two serving replicas: at the step plus the wake with standby, plus the cold start without."""
    with_standby = run(steady(1.0, 100.0), Script([(10.0, 2)]), 100.0, initial_replicas=1, standby=1, wake=WAKE)
    without = run(steady(1.0, 100.0), Script([(10.0, 2)]), 100.0, initial_replicas=1)
    assert int(np.argmax(with_standby.ready >= 2)) == 10 + WAKE
    assert int(np.argmax(without.ready >= 2)) == 10 + COLD_START


def test_a_replacement_left_pending_does_not_keep_the_other_sleeping_pods_from_waking() -> None:
    req = Requests(np.zeros(4), np.full(4, 500), np.full(4, 200), np.zeros(4))
    engine = CompiledEngine(H200_QWEN25VL7B, Workload.build(req, H200_QWEN25VL7B))
    fleet = Fleet(engine, cold_start=COLD_START, initial=1, standby=2, wake=WAKE, gpus_available=3)
    fleet.scale(2, 10.0)  # one woken; its replacement finds no free GPU
    assert fleet.count("unschedulable") == 1 and fleet.serving_counts()[2] == 0, "no reason to stop growing"
    fleet.scale(3, 11.0)
    assert fleet.count("waking") == 2


def test_a_scale_down_deletes_pending_pods_before_asleep_ones() -> None:
    fleet = standby_fleet(serving=1, standby=1)
    fleet.scale(2, 10.0)  # one waking, one starting
    fleet.scale(1, 11.0)
    assert fleet.count("starting") == 0 and fleet.count("gone") == 1


def test_the_policy_is_told_the_wake_only_once_the_fleet_has_woken_a_pod_as_the_operator_measures_it() -> None:
    fleet = standby_fleet()
    assert fleet.measured_wake() is None
    fleet.scale(2, 10.0)
    assert fleet.measured_wake() == WAKE
