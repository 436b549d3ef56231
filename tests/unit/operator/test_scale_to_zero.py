"""Scale to zero: the spec's rules, the idle rule (ski rental over the fleet's own idle gaps), and the cycle that lets
the last replica go and brings one back on the first request the endpoint picker holds."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from mmfleet.api import MultimodalInference, seconds
from mmfleet.autoscaler.cycle import Memory, Outcome, Pods, Seen, decide
from mmfleet.autoscaler.idle import GAPS_KEPT, MIN_GAPS, WAIT_PRICE, IdleMemory, cold_start_price, idle_rule
from mmfleet.autoscaler.metrics import HELD, Signals, Target, build_queries, signals_for
from mmfleet.handlers.records import render_children
from mmfleet.routing import RoutingCrds
from mmfleet.status import Observed, PodProblem, compute_status
from tests.helpers.autoscaler import INTERVAL, T0, conditions, fleet
from tests.helpers.operator_state import RecordingKube, operator
from tests.helpers.repo import spec_doc

COLD_START = 120.0
PRICE = COLD_START * (1 + WAIT_PRICE)


def zero_fleet(after: str | None = None, routing: str = "inferencePool") -> MultimodalInference:
    autoscaling: dict[str, Any] = {"minReplicas": 0, "maxReplicas": 8, "slo": {"target": "2s", "window": "60s"}}
    if after is not None:
        autoscaling["scaleToZero"] = {"after": after}
    doc = spec_doc(autoscaling=autoscaling, routing={"mode": routing})
    doc["metadata"]["generation"] = 3
    return MultimodalInference.model_validate(doc)


def quiet(held: float | None = 0.0) -> Signals:
    """Series present, no request finished over the window, none in flight; ``held`` by the picker."""
    return Signals(latency=None, request_rate=0.0, waiting=0.0, running=0.0, kv_cache_usage=0.0, held=held)


def serving(held: float | None = 0.0) -> Signals:
    return Signals(latency=0.5, request_rate=2.0, waiting=0.0, running=1.0, kv_cache_usage=0.2, held=held)


def at_zero(held: float | None) -> Signals:
    """No server, so none of the servers' series; the picker's held requests."""
    return Signals(missing=("vllm:e2e_request_latency_seconds_bucket",), held=held)


def drive(
    inference: MultimodalInference,
    current: int,
    signals: Callable[[int, int], Signals],
    cycles: int,
    memory: Memory | None = None,
) -> tuple[list[Outcome], Memory, int]:
    """Cycles every 15 s; every replica asked for is Ready by the next cycle; ``signals(cycle, current)``."""
    memory = memory or Memory(cold_start=COLD_START)
    outcomes = []
    for i in range(cycles):
        seen = Seen(current, Pods(ready=current), signals(i, current))
        outcome = decide(
            inference, seen, memory, T0 + timedelta(seconds=INTERVAL * i), interval=INTERVAL, default_cold_start=120
        )
        outcomes.append(outcome)
        memory, current = outcome.memory, outcome.replicas
    return outcomes, memory, current


# --- the spec -------------------------------------------------------------------------------------


def test_min_replicas_zero_needs_the_endpoint_picker_and_says_so() -> None:
    with pytest.raises(ValidationError) as refused:
        zero_fleet(routing="service")
    assert "autoscaling.minReplicas: 0 needs spec.routing.mode inferencePool, but it is service" in str(refused.value)
    assert zero_fleet().spec.autoscaling is not None
    assert zero_fleet().spec.autoscaling.idle_after == "auto"  # type: ignore[union-attr]


def test_scale_to_zero_is_refused_without_min_replicas_zero_and_out_of_range_waits_are_named() -> None:
    doc = spec_doc(
        autoscaling={"minReplicas": 1, "slo": {"target": "2s"}, "scaleToZero": {"after": "10m"}},
        routing={"mode": "inferencePool"},
    )
    with pytest.raises(ValidationError, match="scaleToZero: set, but minReplicas is 1"):
        MultimodalInference.model_validate(doc)
    for bad in ("30s", "25h", "soon"):
        with pytest.raises(ValidationError, match=f"spec.autoscaling.scaleToZero.after: '{bad}' is not accepted"):
            zero_fleet(after=bad)
    assert zero_fleet(after="45m").spec.autoscaling.idle_after == "45m"  # type: ignore[union-attr]


# --- the idle rule --------------------------------------------------------------------------------


def test_with_few_gaps_seen_the_fleet_waits_one_cold_start_price() -> None:
    rule = idle_rule("auto", (600.0,) * (MIN_GAPS - 1), COLD_START, None)
    assert rule.wait == cold_start_price(COLD_START) == PRICE
    assert "fewer than 5 to learn from" in rule.why


def test_long_gaps_send_the_fleet_to_zero_at_once_and_short_ones_never() -> None:
    assert idle_rule("auto", (4 * PRICE,) * 8, COLD_START, None).wait == 0.0
    short = idle_rule("auto", (0.3 * PRICE, 0.5 * PRICE) * 4, COLD_START, None)
    assert short.wait >= 0.5 * PRICE, "each of its gaps ends before the fleet would go to zero"


def test_a_mix_of_gaps_picks_the_wait_that_would_have_cost_least() -> None:
    # Most gaps are short (a few minutes between bursts), a few are nights: waiting out the short ones and going to
    # zero after them costs less than either extreme.
    gaps = (300.0,) * 8 + (8 * 3600.0,) * 2
    wait = idle_rule("auto", gaps, COLD_START, None).wait
    assert wait == 300.0


def test_a_fixed_wait_is_taken_as_written() -> None:
    assert idle_rule("20m", (1.0,) * 10, COLD_START, 1200.0).wait == 1200.0


def test_idle_gaps_are_remembered_when_they_end_and_only_the_last_ones() -> None:
    memory = IdleMemory()
    for start in range(GAPS_KEPT + 3):
        memory = memory.seen(True, start * 100.0).seen(True, start * 100.0 + 30).seen(False, start * 100.0 + 40)
    assert memory.since is None
    assert memory.gaps == (40.0,) * GAPS_KEPT


# --- the cycle ------------------------------------------------------------------------------------


def test_an_idle_fleet_goes_to_zero_after_the_wait_and_says_why() -> None:
    outcomes, _, current = drive(zero_fleet(after="5m"), 1, lambda i, n: quiet(), cycles=24)
    assert current == 0
    down = next(o for o in outcomes if o.scaled)
    assert down.replicas == 0
    assert down.reason == "no request for 300s (scaleToZero.after 5m): 1 -> 0"
    assert outcomes.index(down) == 20, "300 s of idleness from the first idle cycle, at 15 s a cycle"
    assert conditions(outcomes[3])["Idle"][:2] == (True, "Idle")
    assert "the last replica goes after 300s idle (scaleToZero.after 5m)" in conditions(outcomes[3])["Idle"][2]
    assert conditions(outcomes[-1])["Idle"][:2] == (True, "ScaledToZero")


def test_a_busy_fleet_with_min_replicas_zero_keeps_one_replica_whatever_its_policy_says() -> None:
    outcomes, _, current = drive(zero_fleet(after="1m"), 1, lambda i, n: serving(), cycles=60)
    assert current == 1
    assert conditions(outcomes[-1])["Idle"][:2] == (False, "Serving")


def test_the_first_held_request_brings_one_replica_back_within_the_cycle() -> None:
    def view(i: int, current: int) -> Signals:
        if current == 0:
            return at_zero(held=2.0 if i >= 32 else 0.0)
        return serving() if i < 2 else quiet()

    outcomes, memory, current = drive(zero_fleet(after="5m"), 1, view, cycles=33)
    assert current == 1
    up = outcomes[-1]
    assert (up.current, up.replicas, up.event_reason) == (0, 1, "ScaledUp")
    assert up.reason.startswith("2 requests held by the endpoint picker after ")
    assert conditions(up)["Idle"][:2] == (False, "WakingUp")
    assert memory.idle.since is None and len(memory.idle.gaps) == 1, "the gap ended and is remembered"
    assert conditions(outcomes[-2])["MetricsAvailable"][:2] == (None, "NoPodServing")
    assert conditions(outcomes[-2])["SLOMet"][:2] == (True, "NoRequests")


def test_at_zero_a_picker_that_cannot_be_read_holds_zero_and_says_why() -> None:
    signals = Signals(held=None, held_problem="http://prom:9090 refused the query 'sum by ...'")
    outcomes, _, current = drive(zero_fleet(), 0, lambda i, n: signals, cycles=3)
    assert current == 0
    ok, reason, message = conditions(outcomes[-1])["MetricsAvailable"]
    assert (ok, reason) == (False, "QueryFailed")
    assert "held requests could not be read: http://prom:9090 refused" in message
    assert conditions(outcomes[-1])["SLOMet"][:2] == (None, "MetricsUnavailable"), "silence is not an idle fleet"
    assert conditions(outcomes[-1])["Idle"][:2] == (None, "NotMeasured")


def test_at_zero_the_held_requests_wake_the_fleet_even_when_the_servers_queries_went_unanswered() -> None:
    seen = Seen(0, Pods(), Signals(held=5.0), outage="http://prom:9090 did not answer the query for waiting")
    outcome = decide(zero_fleet(), seen, Memory(), T0, interval=INTERVAL, default_cold_start=120)
    assert (outcome.replicas, outcome.cause) == (1, "scaled_up")


def test_a_fleet_whose_picker_cannot_be_read_is_never_idle_and_its_gap_is_neither_ended_nor_learned() -> None:
    def view(i: int, current: int) -> Signals:
        return replace(quiet(), held=None, held_problem="the query timed out") if i % 10 == 9 else quiet()

    outcomes, memory, current = drive(zero_fleet(), 1, view, cycles=40)
    assert current == 1, "auto waits one cold start's price at first (1320 s), far beyond these 10 minutes"
    assert memory.idle.gaps == (), "a failed read of the picker ends no gap"
    assert memory.idle.since == T0.timestamp()
    ok, reason, message = conditions(outcomes[9])["Idle"]
    assert (ok, reason) == (None, "NotMeasured")
    assert "the query timed out" in message


def test_gaps_around_the_price_do_not_make_the_fleet_flap() -> None:
    """Idle gaps alternately a little under and a little over one cold start's price: once it has seen five, the
    fleet stays warm through them instead of paying a cold start for every other gap."""
    busy_cycles = 8
    pattern = [round(0.9 * PRICE / INTERVAL), round(1.1 * PRICE / INTERVAL)] * 10
    timeline: list[bool] = []  # True: a request arrives in that cycle
    for gap in pattern:
        timeline += [True] * busy_cycles + [False] * gap

    def view(i: int, current: int) -> Signals:
        arriving = timeline[i]
        if current == 0:
            return at_zero(held=1.0 if arriving else 0.0)
        return serving() if arriving else quiet()

    outcomes, _, _ = drive(zero_fleet(), 1, view, cycles=len(timeline))
    trips = [i for i, o in enumerate(outcomes) if o.replicas == 0 and o.current > 0]
    first_learned = sum(busy_cycles + g for g in pattern[:MIN_GAPS])
    assert trips, "before it has seen enough gaps, the fleet goes to zero after one cold start's price"
    assert all(i < first_learned for i in trips), f"went to zero after it had learned the gaps: cycles {trips}"


def test_several_replicas_go_to_zero_only_after_the_policys_scale_down_window() -> None:
    outcomes, _, current = drive(zero_fleet(after="1m"), 3, lambda i, n: quiet(), cycles=30)
    assert current == 0
    down = next(i for i, o in enumerate(outcomes) if o.replicas == 0)
    assert down == 20, "300 s, the default scale-down window (longer than the 1m wait), from the first quiet read"
    assert outcomes[down].reason.endswith(": 3 -> 0")


def test_a_partial_scrape_or_a_starting_pod_is_not_an_idle_fleet() -> None:
    seen = Seen(2, Pods(ready=2), replace(quiet(), reporting=1))
    memory = Memory(cold_start=COLD_START)
    for i in range(40):
        when = T0 + timedelta(seconds=INTERVAL * i)
        outcome = decide(zero_fleet(after="1m"), seen, memory, when, interval=INTERVAL, default_cold_start=1)
        memory = outcome.memory
        assert outcome.replicas >= 1
    assert memory.idle.since is None
    first = drive(zero_fleet(after="1m"), 1, lambda i, n: serving(), cycles=1)[1]
    when = T0 + timedelta(minutes=5)
    starting = Seen(1, Pods(ready=1, starting=1), quiet())
    outcome = decide(zero_fleet(after="1m"), starting, first, when, interval=INTERVAL, default_cold_start=120)
    assert outcome.replicas >= 1 and outcome.memory.idle.since is None


def test_a_long_slo_window_does_not_lengthen_the_idle_wait() -> None:
    inference = zero_fleet(after="1m")
    autoscaling = inference.spec.autoscaling
    assert autoscaling is not None and autoscaling.slo is not None
    slo = autoscaling.slo.model_copy(update={"window": "10m"})
    spec = inference.spec.model_copy(update={"autoscaling": autoscaling.model_copy(update={"slo": slo})})
    stale = replace(quiet(), latency=0.5)  # a request finished within the 10m window, none in the last minute
    _, _, current = drive(inference.model_copy(update={"spec": spec}), 1, lambda i, n: stale, cycles=6)
    assert current == 0


def test_turning_min_replicas_zero_off_forgets_the_idle_gap() -> None:
    _, memory, current = drive(zero_fleet(after="5m"), 1, lambda i, n: quiet(), cycles=10)
    assert current == 1 and memory.idle.since is not None
    _, memory, _ = drive(fleet(), 1, lambda i, n: quiet(), cycles=1, memory=memory)
    assert memory.idle == IdleMemory()


def test_a_gap_already_going_on_when_the_operator_started_is_not_learned() -> None:
    def view(i: int, current: int) -> Signals:
        return at_zero(held=1.0 if i >= 3 else 0.0) if current == 0 else quiet()

    _, memory, current = drive(zero_fleet(), 0, view, cycles=4)  # a new memory, the fleet already at zero
    assert current == 1
    assert memory.idle.gaps == ()


# --- the picker's held requests -------------------------------------------------------------------


def test_the_held_query_is_sent_only_for_fleets_that_may_scale_to_zero_and_read_by_fleet() -> None:
    zero, plain = Target.of(zero_fleet()), Target.of(fleet())
    assert HELD not in build_queries([plain])
    query = build_queries([plain, zero])[HELD]
    assert query == (
        "sum by (namespace, mmfleet_io_inference) (inference_extension_flow_control_queue_size) or "
        "0 * sum by (namespace, mmfleet_io_inference) (inference_extension_info)"
    )
    answers: dict[Any, Any] = {HELD: {(zero.namespace, zero.name, ""): 3.0}}
    assert signals_for(zero, answers).held == 3.0
    unscraped = signals_for(zero, {HELD: {}})
    assert unscraped.held is None, "a picker Prometheus does not scrape is not a picker holding nothing"
    assert "no inference_extension_info for namespace=ml, mmfleet_io_inference=qwen" in str(unscraped.held_problem)
    assert signals_for(plain, answers).held is None
    failed = signals_for(zero, {}, {HELD: "did not answer"})
    assert (failed.held, failed.held_problem) == (None, "did not answer")


# --- status ---------------------------------------------------------------------------------------


def test_a_fleet_at_zero_is_ready_and_says_it_scaled_to_zero() -> None:
    inference = zero_fleet()
    outcome = drive(inference, 0, lambda i, n: at_zero(held=0.0), cycles=1)[0][0]
    deployment = {
        "metadata": {"generation": 2},
        "spec": {"replicas": 0},
        "status": {"observedGeneration": 2, "replicas": 0, "readyReplicas": 0, "updatedReplicas": 0},
    }
    status = compute_status(inference, Observed(deployment=deployment, scaling=outcome.scaling()), None, T0)
    by_type = {c.type: c for c in status.conditions}
    assert (by_type["Ready"].status, by_type["Ready"].reason) == ("True", "ScaledToZero")
    assert (by_type["Idle"].status, by_type["Idle"].reason) == ("True", "ScaledToZero")
    assert status.phase == "Ready"


# --- the picker's request TTL ---------------------------------------------------------------------


def _ttl(inference: MultimodalInference, measured: float | None) -> float:
    op = operator(RecordingKube())
    children = render_children(op, op.record(("ml", "qwen")), inference, "eks", False, RoutingCrds(), measured)
    (config,) = [c for c in children if c["kind"] == "ConfigMap" and c["metadata"]["name"].endswith("-epp")]
    return seconds(json.loads(config["data"]["config.yaml"])["flowControl"]["defaultRequestTTL"])


def test_a_fleet_at_zero_holds_its_first_request_through_the_measured_cold_start_and_the_wake() -> None:
    # 200 s measured, plus the autoscaler's 15 s interval and the picker's 15 s scrape: 230 s, the next 30 s step up.
    assert _ttl(zero_fleet(), 200.0) == 240
    assert _ttl(zero_fleet(), None) == 180, "the operator's default cold start (120 s) and the wake, 150 s"
    doc = spec_doc(autoscaling={"minReplicas": 1, "slo": {"target": "2s"}}, routing={"mode": "inferencePool"})
    routed = MultimodalInference.model_validate(doc)
    assert _ttl(routed, 200.0) == 150, "a fleet that never goes to zero keeps the default's TTL (no picker restarts)"


def test_a_fleet_woken_from_zero_stays_ready_while_its_replica_starts_unless_something_is_wrong() -> None:
    inference = zero_fleet()
    at_rest = {"metadata": {"generation": 2}, "spec": {"replicas": 0}, "status": {"observedGeneration": 2}}
    asleep = compute_status(inference, Observed(deployment=at_rest), None, T0)
    starting = {
        "metadata": {"generation": 2},
        "spec": {"replicas": 1},
        "status": {"observedGeneration": 2, "replicas": 1},
    }
    woken = compute_status(inference, Observed(deployment=starting), asleep, T0)
    ready = next(c for c in woken.conditions if c.type == "Ready")
    assert (ready.status, ready.reason, woken.phase) == ("True", "WakingUp", "Ready")
    crashing = Observed(deployment=starting, pod_problems=[PodProblem("qwen-1", "CrashLoopBackOff", "back-off")])
    broken = compute_status(inference, crashing, woken, T0)
    assert next(c for c in broken.conditions if c.type == "Ready").status == "False"
    first = compute_status(inference, Observed(deployment=starting), None, T0)
    assert next(c for c in first.conditions if c.type == "Ready").status == "False", "a new fleet is not waking"


def test_a_fleet_woken_from_zero_is_not_held_for_the_peak_its_demand_swung_to_before() -> None:
    """Demand that swung 3x a minute held the fleet for its peak; after the fleet went to zero and a request woke it,
    it sizes for what comes now."""

    def signals(i: int, current: int) -> Signals:
        if i < 40:  # a minute at 10 req/s, a minute at 30
            rate = 30.0 if (i // 4) % 2 else 10.0
            return Signals(latency=0.5, request_rate=rate, waiting=0.0, running=rate, kv_cache_usage=0.2, held=0.0)
        if current == 0:
            return at_zero(held=1.0)
        return quiet() if i < 72 else serving()

    outcomes, memory, _ = drive(zero_fleet(after="1m"), 4, signals, cycles=90)
    assert any("so held for its peak" in o.reason for o in outcomes[:40])
    down = next(i for i, o in enumerate(outcomes) if o.replicas == 0)
    before = [
        float(m[1])
        for o in outcomes[:down]
        if (m := re.search(r"held for its peak of the last 15 minutes \((\S+) req/s", o.reason))
    ]
    after = [
        float(m[1])
        for o in outcomes[down:]
        if (m := re.search(r"held for its peak of the last 15 minutes \((\S+) req/s", o.reason))
    ]
    assert before and max(before) > 25.0
    assert all(peak <= 2.1 for peak in after), after  # only what came after the wake (2 req/s)
    assert memory.policy_state.zeroed is not None
