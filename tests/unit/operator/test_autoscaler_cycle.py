"""One autoscaling cycle as pure functions: pods counted, silence held, the policy asked, status and conditions."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from mmfleet.api import AutoscalingSpec, MultimodalInference, MultimodalInferenceStatus, SloSpec
from mmfleet.autoscaler import Observation
from mmfleet.autoscaler.cycle import Memory, Outcome, Pods, Seen, count_pods, decide, policy_for
from mmfleet.autoscaler.metrics import Signals
from mmfleet.status import Observed, compute_status
from tests.helpers.autoscaler import INTERVAL, T0, busy, conditions, fleet, run

# --- pods ------------------------------------------------------------------------------------


def pod(name: str, created: str = "2026-11-29T11:00:00Z", **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "creationTimestamp": created}, "status": status}


def ready_at(when: str) -> dict[str, Any]:
    return {"type": "Ready", "status": "True", "lastTransitionTime": when}


def test_pods_are_counted_as_the_policy_needs_and_cold_start_is_their_median_creation_to_ready() -> None:
    unschedulable = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
    }
    pods = [
        pod("a", conditions=[ready_at("2026-11-29T11:01:30Z")]),  # 90 s
        pod("b", conditions=[ready_at("2026-11-29T11:01:00Z")]),  # 60 s
        pod("c", conditions=[ready_at("2026-11-29T11:03:00Z")]),  # 180 s
        pod("d", phase="Pending", conditions=[{"type": "PodScheduled", "status": "True"}]),
        pod("e", phase="Pending", conditions=[unschedulable]),
        {**pod("f", conditions=[ready_at("2026-11-29T11:00:05Z")]), "metadata": {"deletionTimestamp": "x"}},
        pod("g", phase="Failed"),
    ]
    counted = count_pods(pods)
    assert replace(counted, starts=()) == Pods(
        ready=3,
        starting=1,
        unschedulable=1,
        why_unschedulable="pod e: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
        cold_start=90.0,
        ready_since=tuple(datetime.fromisoformat(f"2026-11-29T11:0{t}Z") for t in ("1:30", "1:00", "3:00")),
    )
    assert [s.total for s in counted.starts] == [90.0, 60.0, 180.0]
    assert count_pods([pod("h", phase="Pending")]).cold_start is None


# --- silence is held -------------------------------------------------------------------------


def test_prometheus_unreachable_holds_the_replicas_and_says_so() -> None:
    outage = "http://prom:9090 unreachable: [Errno 111] Connection refused"
    outcomes, memory, current = run(fleet(min_replicas=1), 5, None, cycles=40, outage=outage)
    assert current == 5, "ten minutes of silence must not take the fleet to minReplicas"
    assert not any(o.scaled for o in outcomes)
    assert memory.policy_state is None, "the policy is not asked when there is nothing to decide on"
    ok, reason, message = conditions(outcomes[-1])["MetricsAvailable"]
    assert (ok, reason) == (False, "PrometheusUnavailable")
    assert message == f"{outage}; holding 5 replicas"
    assert conditions(outcomes[-1])["SLOMet"][:2] == (None, "MetricsUnavailable")


def test_a_missing_series_holds_and_names_the_series_and_the_fleet() -> None:
    signals = replace(busy(4.0), waiting=None, missing=("vllm:num_requests_waiting",))
    outcomes, _, current = run(fleet(), 3, signals, cycles=10)
    assert current == 3
    ok, reason, message = conditions(outcomes[-1])["MetricsAvailable"]
    assert (ok, reason) == (False, "SeriesMissing")
    assert "vllm:num_requests_waiting" in message
    assert "namespace=ml, mmfleet_io_inference=qwen" in message
    assert "holding 3 replicas" in message


def test_no_series_before_any_pod_is_ready_is_unknown_not_a_failure() -> None:
    signals = Signals(missing=("vllm:e2e_request_latency_seconds_bucket",))
    outcomes, _, current = run(fleet(min_replicas=2), 2, signals, cycles=2, pods=Pods(starting=2))
    assert current == 2
    assert conditions(outcomes[-1])["MetricsAvailable"][:2] == (None, "NoPodServing")


# --- the policy decides ----------------------------------------------------------------------


def test_latency_over_target_scales_up_with_the_policy_reason_as_event_text() -> None:
    outcomes, _, current = run(fleet(max_replicas=8), 2, busy(4.0), cycles=12)
    scaled = [o for o in outcomes if o.scaled]
    assert scaled, [o.reason for o in outcomes]
    first = scaled[0]
    assert first.replicas > first.current == 2
    assert first.event_reason == "ScaledUp"
    assert first.reason.startswith("P90 4s > target 2s")
    assert first.reason.endswith(f": 2 -> {first.replicas}")
    assert current >= first.replicas
    assert conditions(first)["SLOMet"] == (False, "TargetMissed", "P90 4s > target 2s over the last 60s")
    assert conditions(first)["MetricsAvailable"][:2] == (True, "SeriesPresent")


def test_at_max_replicas_scaling_is_limited_and_says_what_to_raise() -> None:
    outcomes, _, current = run(fleet(max_replicas=3), 2, busy(4.0), cycles=12)
    assert current == 3
    ok, reason, message = conditions(outcomes[-1])["ScalingLimited"]
    assert (ok, reason) == (True, "AtMaxReplicas")
    assert (
        message == "3 replicas is spec.autoscaling.maxReplicas while P90 4s > target 2s; raise it to let the fleet grow"
    )
    assert conditions(outcomes[0])["ScalingLimited"][:2] == (False, "WithinRange")


def test_unschedulable_pods_stop_growth_and_say_why() -> None:
    why = "pod qwen-1: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    pods = Pods(ready=2, unschedulable=1, why_unschedulable=why)
    outcomes, _, current = run(fleet(max_replicas=8), 3, busy(4.0), cycles=12, pods=pods)
    assert current == 3, "pods that cannot start are not capacity: no more are added"
    ok, reason, message = conditions(outcomes[-1])["ScalingLimited"]
    assert (ok, reason) == (True, "PodsUnschedulable")
    assert message == f"1 pods cannot be scheduled ({why}); not adding more until they start"


def test_an_idle_fleet_meets_its_target_and_returns_to_min_replicas() -> None:
    # A busy hour within the SLO teaches the policy what a replica serves ...
    outcomes, memory, current = run(fleet(min_replicas=1), 4, busy(1.0, rate=8.0, waiting=0.0), cycles=30)
    assert current == 4
    # ... then no request at all: nothing finished, nothing in flight.
    idle = Signals(latency=None, request_rate=0.0, waiting=0.0, running=0.0, kv_cache_usage=0.0)
    later = T0 + timedelta(seconds=INTERVAL * 30)
    outcomes, _, current = run(fleet(min_replicas=1), current, idle, cycles=80, memory=memory, start=later)
    assert conditions(outcomes[0])["SLOMet"] == (True, "NoRequests", "no requests over the last 60s")
    assert current == 1
    assert outcomes[-1].latency is None


def test_nothing_finished_while_requests_are_in_flight_is_unknown_and_held() -> None:
    stuck = Signals(latency=None, request_rate=0.0, waiting=3.0, running=8.0, kv_cache_usage=0.9)
    outcomes, _, current = run(fleet(), 2, stuck, cycles=10)
    assert current == 2
    assert conditions(outcomes[-1])["SLOMet"] == (
        None,
        "NoRequestsFinished",
        "no request finished over the last 60s, 11 in flight",
    )


def test_the_cold_start_measured_on_pods_reaches_the_policy_and_is_kept_when_they_go() -> None:
    """The policy plans over L + one interval; its reason says over how long."""
    within = busy(1.0, waiting=0.0)
    outcomes, memory, current = run(fleet(), 2, within, cycles=14, pods=Pods(ready=2, cold_start=42.0))
    assert memory.cold_start == 42.0
    assert "over 57s" in outcomes[-1].reason
    outcomes, memory, _ = run(fleet(), current, within, cycles=1, pods=Pods(ready=2), memory=memory,
                              start=T0 + timedelta(minutes=2))  # fmt: skip
    assert memory.cold_start == 42.0, "the measurement outlives the pods it was made on"
    assert "over 57s" in outcomes[-1].reason
    outcomes, _, _ = run(fleet(), 2, within, cycles=14, pods=Pods(ready=2))
    assert "over 135s" in outcomes[-1].reason, "no pod seen Ready yet: the configured default, 120 s"


# --- status ----------------------------------------------------------------------------------

DEPLOYMENT = {"metadata": {"generation": 1}, "spec": {"replicas": 2},
              "status": {"observedGeneration": 1, "replicas": 2, "readyReplicas": 2, "updatedReplicas": 2}}  # fmt: skip


def scaled_status(
    inference: MultimodalInference, outcome: Outcome, previous: MultimodalInferenceStatus | None, now: datetime
) -> MultimodalInferenceStatus:
    """The status the autoscaling loop writes after a cycle: compute_status with the cycle's outcome."""
    observed = Observed(deployment=DEPLOYMENT, cloud="eks", scaling=outcome.scaling())
    return compute_status(inference, observed, previous, now)


def test_attainment_is_the_share_of_measured_cycles_in_the_last_hour_that_met_the_target() -> None:
    clock = T0.timestamp()
    memory = Memory(verdicts=((clock - 4000, False), (clock - 100, True), (clock - 50, False), (clock - 20, True)))
    outcome = decide(fleet(), Seen(2, Pods(ready=2), busy(1.0)), memory, T0, interval=INTERVAL, default_cold_start=120)
    assert [met for _, met in outcome.memory.verdicts] == [True, False, True, True]  # the one over an hour ago went
    status = scaled_status(fleet(), outcome, None, T0)
    assert status.slo is not None
    assert status.slo.attainment == 0.75


def test_status_replaces_only_the_autoscaler_fields_and_keeps_the_last_measurement_through_an_outage() -> None:
    inference = fleet()
    previous = MultimodalInferenceStatus.model_validate(
        {
            "phase": "Ready",
            "readyReplicas": 2,
            "conditions": [{"type": "Ready", "status": "True", "reason": "ReplicasReady"}],
        }
    )
    outcomes, _, _ = run(inference, 2, busy(4.0), cycles=12)
    scaled = next(o for o in outcomes if o.scaled)
    status = scaled_status(inference, scaled, previous, T0)
    assert status.ready_replicas == 2
    assert status.desired_replicas == scaled.replicas
    assert (status.last_scale_time, status.last_scale_reason) == (T0, scaled.reason)
    assert status.slo is not None
    assert (status.slo.observed, status.slo.target, status.slo.last_evaluated) == ("4s", "2s", T0)
    kinds = [c.type for c in status.conditions]
    assert kinds == [
        "Ready", "Progressing", "Degraded", "MetricsAvailable", "SLOMet", "ScalingLimited", "PreprocessingBound",
        "DemandSwings",
    ]  # fmt: skip

    later = T0 + timedelta(minutes=1)
    held = decide(inference, Seen(scaled.replicas, Pods(ready=2), None, "down"), scaled.memory, later,
                  interval=INTERVAL, default_cold_start=120)  # fmt: skip
    after = scaled_status(inference, held, status, later)
    assert after.slo is not None
    assert (after.slo.observed, after.slo.last_evaluated) == ("4s", T0), "the last measurement, with its age"
    assert (after.last_scale_time, after.last_scale_reason) == (T0, scaled.reason), "a hold is not a scale"
    by_type = {c.type: c for c in after.conditions}
    assert by_type["MetricsAvailable"].last_transition_time == later
    assert by_type["ScalingLimited"].last_transition_time == T0, "unchanged conditions keep their transition time"
    assert by_type["SLOMet"].status == "Unknown"


def test_scale_down_delay_sets_the_policys_down_window() -> None:
    slo = SloSpec(target="2s")
    probe = Observation(time=0.0, ready=1, starting=0, unschedulable=0, current=1, min_replicas=1,
                        max_replicas=4, slo_target=2.0, slo_percentile=90.0, cold_start=30.0)  # fmt: skip
    quick = AutoscalingSpec(slo=slo, scale_down_delay="90s")
    assert policy_for(quick, slo, 15.0).down_window(probe) == 90.0
    assert policy_for(AutoscalingSpec(slo=slo), slo, 15.0).down_window(probe) == 300.0  # max(5m, cold start)


def test_young_series_are_not_read_until_they_cover_a_rate_window() -> None:
    # rate() over a window the series only partly cover reads low; a fleet must not grow (or learn) on it
    outcomes, memory, current = run(fleet(max_replicas=8), 1, busy(4.0), cycles=4)
    assert current == 1
    assert all("less than the 1m rate window: holding 1" in o.reason for o in outcomes)
    assert memory.policy_state is None
    outcomes, memory, current = run(
        fleet(max_replicas=8), 1, busy(4.0), cycles=8, memory=memory, start=T0 + timedelta(seconds=60)
    )
    assert current > 1  # from a full window on, the policy decides


def test_only_a_gap_in_the_series_longer_than_the_rate_window_restarts_the_warm_up() -> None:
    _, warm, current = run(fleet(max_replicas=8), 1, busy(1.0, waiting=0.0), cycles=8)
    # an outage of a cycle or three leaves the rate window covered: the policy goes on deciding
    _, memory, _ = run(fleet(max_replicas=8), current, None, cycles=3, outage="down", memory=warm,
                       start=T0 + timedelta(seconds=120))  # fmt: skip
    outcomes, _, _ = run(fleet(max_replicas=8), current, busy(4.0), cycles=1, memory=memory,
                         start=T0 + timedelta(seconds=165))  # fmt: skip
    assert outcomes[0].cause != "warming_up", outcomes[0].reason
    # one longer than the rate window leaves a hole in it: the warm-up starts again when the series return
    _, memory, _ = run(fleet(max_replicas=8), current, None, cycles=4, outage="down", memory=warm,
                       start=T0 + timedelta(seconds=120))  # fmt: skip
    outcomes, _, _ = run(fleet(max_replicas=8), current, busy(4.0), cycles=1, memory=memory,
                         start=T0 + timedelta(seconds=180))  # fmt: skip
    assert outcomes[0].cause == "warming_up"
    assert outcomes[0].reason == "series read for 0s, less than the 1m rate window: holding 1"


def swinging(rates: list[float | None], inference: MultimodalInference | None = None) -> list[Outcome]:
    """Cycles at these request rates, each from a fleet of 4 (None: requests in flight, none finished)."""
    memory, outcomes = Memory(), []
    for i, rate in enumerate(rates):
        seen = busy(None, rate=0.0, waiting=0.0, running=5.0) if rate is None else busy(
            1.0 if rate else None, rate=rate, waiting=0.0, running=rate)  # fmt: skip
        outcome = decide(inference or fleet(max_replicas=40), Seen(4, Pods(ready=4), seen), memory,
                         T0 + timedelta(seconds=INTERVAL * i), interval=INTERVAL, default_cold_start=120)  # fmt: skip
        outcomes.append(outcome)
        memory = outcome.memory
    return outcomes


def square(cycles: int, growth: float = 1.0) -> list[float | None]:
    """A minute at 10 req/s, a minute at 30, and so on, the highs growing by ``growth`` each time."""
    return [30.0 * growth ** (i // 8) if (i // 4) % 2 else 10.0 for i in range(cycles)]


def test_demand_swings_is_unknown_then_false_for_a_steady_rate() -> None:
    outcomes = swinging([10.0] * 30)
    first, last = conditions(outcomes[0])["DemandSwings"], conditions(outcomes[-1])["DemandSwings"]
    assert first[:2] == (None, "NotMeasured") and "less than the 1m rate window" in first[2]
    assert last[:2] == (False, "Steady"), last
    assert last[2] == (
        "demand's learned rise within 60s at the SLO's percentile: 1.00x, not over 1.25x in the last 15 minutes: "
        "the fleet follows it"
    )


def test_demand_swings_names_the_peak_the_fleet_is_held_for_as_the_decision_does() -> None:
    """A rate that swings 3x from one minute to the next: below its peak the condition and the decision's reason name
    the same peak; at a new high neither holds anything."""
    outcomes = swinging(square(48, growth=1.2))
    held = [o for o in outcomes if "so held for its peak" in o.reason]
    highs = [o for o in outcomes if conditions(o)["DemandSwings"][0] and "demand is at its peak" in
             conditions(o)["DemandSwings"][2]]  # fmt: skip
    assert held and highs
    for o in held:
        ok, reason, message = conditions(o)["DemandSwings"]
        assert (ok, reason) == (True, "Swinging") and "faster than a pod starts: the fleet is held for its" in message
        peak = re.search(r"held for its peak of the last 15 minutes, (\S+) req/s, instead of following it", message)
        assert peak and f"held for its peak of the last 15 minutes ({peak[1]} req/s)" in o.reason, (message, o.reason)
    for o in highs:
        assert "forecast" in o.reason and "held for its peak" not in o.reason, o.reason


def test_demand_swings_with_a_scale_down_delay_says_the_fleet_follows_it_instead_of_holding_a_peak() -> None:
    """The user's scaleDownDelay alone says how long demand must stay lower: the condition still says the demand
    swings, and why no peak is held; no decision holds one."""
    default = fleet(max_replicas=40)
    autoscaling = default.spec.autoscaling.model_copy(update={"scale_down_delay": "45s"})
    delayed = default.model_copy(update={"spec": default.spec.model_copy(update={"autoscaling": autoscaling})})
    outcomes, held = swinging(square(48, growth=1.2), delayed), swinging(square(48, growth=1.2))
    swings = [conditions(o)["DemandSwings"] for o in outcomes if conditions(o)["DemandSwings"][0]]
    assert swings
    for _, _, message in swings:
        assert (
            "faster than a pod starts: not held for its peak, since spec.autoscaling.scaleDownDelay is set (45s): "
            "the fleet follows it, and removes replicas once demand has stayed lower for 45s" in message
        ), message
    assert not any("held for its peak" in o.reason for o in outcomes)
    # in the low minutes it asks for fewer replicas than the fleet held for the peak
    assert any(o.replicas < h.replicas for o, h in zip(outcomes, held, strict=True))


def test_demand_swings_is_not_measured_in_a_cycle_that_sized_nothing_and_holds_nothing_at_zero_demand() -> None:
    """A cycle with requests in flight and none finished has no latency to size with: the condition does not repeat
    what an earlier cycle saw. No demand at all ends the hold."""
    outcomes = swinging([*square(40), None, 0.0])
    assert conditions(outcomes[39])["DemandSwings"][:2] == (True, "Swinging")
    ok, reason, message = conditions(outcomes[40])["DemandSwings"]
    assert (ok, reason) == (None, "NotMeasured") and message.startswith("not measured this cycle"), message
    ok, reason, message = conditions(outcomes[41])["DemandSwings"]
    assert (ok, reason) == (False, "Steady") and message.endswith("no demand, nothing held"), message
