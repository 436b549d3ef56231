"""PreprocessingBound: a vllm fleet misses its target while its engines queue nothing, most of its time to first token
is spent before the engine takes the request, and its API server process uses a core (vLLM loads and processes images
there, a queue the engine's waiting count does not show). The cases are the real vLLM 0.33 server's, measured on an
H200 with images (../shared/calibration/real-vllm-h200-mm, the scrapes between its load phases), and one made bound."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from mmfleet.api import MultimodalInference, MultimodalInferenceStatus
from mmfleet.autoscaler.cycle import Memory, Pods
from mmfleet.autoscaler.metrics import Preprocessing, Signals
from mmfleet.handlers import autoscale
from mmfleet.status import WARNING_WHEN
from tests.helpers.autoscaler import T0, busy, conditions, fleet, run
from tests.helpers.repo import spec_doc


def bound(
    signals: Signals | None, inference: MultimodalInference | None = None, outage: str | None = None
) -> tuple[bool | None, str, str] | None:
    outcomes, _, _ = run(inference or fleet(), 2, signals, cycles=6, pods=Pods(ready=2), outage=outage)
    return conditions(outcomes[-1]).get("PreprocessingBound")


def timed(latency: float | None, seen: Preprocessing, rate: float = 10.0) -> Signals:
    return replace(busy(latency, rate=rate, waiting=0.0, running=3.0), preprocessing=seen)


# The real server's phases, per request over each load phase: time to first token outside the engine, mean TTFT, the
# most requests waiting in the engine, the API server process's CPU cores.
REAL_20 = Preprocessing(outside=0.0811, ttft_mean=0.2328, waiting_most=0.0, api_cpu=0.46)  # 35% outside
REAL_40 = Preprocessing(outside=1.2224, ttft_mean=2.2935, waiting_most=193.0, api_cpu=0.77)  # past its capacity: 53%
MADE_BOUND = Preprocessing(outside=2.5, ttft_mean=3.0, waiting_most=0.0, api_cpu=0.97)


def test_a_missed_target_held_before_the_engine_by_a_saturated_api_server_is_preprocessing_bound() -> None:
    found = bound(timed(4.0, MADE_BOUND))
    assert found is not None
    status, reason, message = found
    assert (status, reason) == (True, "ApiServerBound")
    assert message.startswith(
        "P90 4s > target 2s with the engines queueing nothing, and 2.5s of the mean time to first token, 3s, before "
        "the engine took the request (83%), the busiest API server process at 0.97 CPU cores"
    )
    assert "spec.multimodal.apiServers" in message and "spec.resources.cpu" in message
    assert WARNING_WHEN["PreprocessingBound"] == "True", "a Warning event when it turns True"


@pytest.mark.parametrize(
    ("latency", "seen", "says"),
    [
        # Past its capacity the real server had 53% of its TTFT outside the engine (its output lagging), but a queue:
        (4.0, REAL_40, "(at most 193 waiting): the GPUs bound the latency"),
        # and with no queue its API server still had CPU to spare.
        (3.0, replace(REAL_40, waiting_most=0.0), "at 0.77 CPU cores: it has CPU to spare"),
        # 60 ms before the engine cannot explain an e2e percentile 4 s over its target, however busy the API server.
        (6.0, Preprocessing(0.06, 0.1, 0.0, 0.95), "less than the 4s by which it misses the target"),
        (4.0, REAL_20, "(35%): the engine's prefill is most of it"),
        (1.5, MADE_BOUND, "P90 1.5s <= target 2s"),
    ],
)
def test_otherwise_it_is_not(latency: float, seen: Preprocessing, says: str) -> None:
    found = bound(timed(latency, seen))
    assert found is not None
    assert found[:2] == (False, "NotApiServerBound")
    assert says in found[2]


@pytest.mark.parametrize(
    ("signals", "outage", "says"),
    [
        (timed(4.0, Preprocessing(problem="the query was refused: bad_data")), None, "refused: bad_data"),
        (timed(4.0, replace(MADE_BOUND, api_cpu=None)), None, "no process_cpu_seconds_total"),
        (timed(4.0, MADE_BOUND, rate=0.2), None, "12 requests finished over the last 1m, fewer than 20"),
        (timed(4.0, replace(MADE_BOUND, ttft_mean=None)), None, "no request had a first token"),
        (timed(4.0, replace(MADE_BOUND, waiting_most=None)), None, "no engine queue"),
        (timed(None, MADE_BOUND), None, "no request finished over the last 1m"),
        (None, "Prometheus is down", "Prometheus is down"),
    ],
)
def test_what_cannot_be_measured_says_why(signals: Signals | None, outage: str | None, says: str) -> None:
    found = bound(signals, outage=outage)
    assert found is not None
    assert found[:2] == (None, "NotMeasured")
    assert says in found[2]


def test_an_itl_slo_is_not_preprocessing_bound() -> None:
    found = bound(timed(4.0, MADE_BOUND), fleet(metric="itl"))
    assert found is not None and found[:2] == (False, "NotApiServerBound") and "an itl SLO" in found[2]


def test_a_tensorrt_llm_fleet_has_no_such_condition() -> None:
    doc = spec_doc(backend={"name": "tensorrt-llm"}, autoscaling={"maxReplicas": 4, "slo": {"target": "2s"}})
    trt = MultimodalInference.model_validate(doc)
    assert bound(timed(4.0, MADE_BOUND), trt) is None


def test_near_its_thresholds_it_does_not_turn_every_cycle() -> None:
    """On at half the TTFT before the engine and 0.9 cores; off only 0.1 below either, so a fleet hovering about a
    threshold posts one Warning, not one every other cycle."""
    hovering = replace(MADE_BOUND, outside=1.35, ttft_mean=3.0, api_cpu=0.85)  # 45%, 0.85 cores: between on and off
    memory = Memory()
    seen: list[bool | None] = []
    steps = [MADE_BOUND, hovering, MADE_BOUND, hovering, replace(hovering, api_cpu=0.79), hovering, MADE_BOUND]
    # then a cycle with too few requests, unmeasured: it keeps what was last measured
    rates = [10.0] * len(steps) + [0.2, 10.0]
    steps += [MADE_BOUND, hovering]
    for i, (preprocessing, rate) in enumerate(zip(steps, rates, strict=True)):
        signals = timed(3.0, preprocessing, rate=rate)
        outcomes, memory, _ = run(fleet(), 2, signals, 1, Pods(ready=2), memory=memory, start=T0 + timedelta(minutes=i))
        seen.append(conditions(outcomes[-1])["PreprocessingBound"][0])
    assert seen == [True, True, True, True, False, False, True, None, True]


HOVERING = replace(MADE_BOUND, outside=1.35, ttft_mean=3.0, api_cpu=0.85)


def hovering_after(memory: Memory, inference: MultimodalInference | None = None) -> bool | None:
    outcomes, _, _ = run(inference or fleet(), 1, timed(3.0, HOVERING), 1, Pods(ready=1), memory=memory, start=T0)
    return conditions(outcomes[-1])["PreprocessingBound"][0]


def test_an_operator_restart_keeps_it_on_its_lower_thresholds() -> None:
    """The first cycle of a new operator process starts from the status: True stays True while hovering."""
    said = {"type": "PreprocessingBound", "reason": "ApiServerBound", "message": "m", "lastTransitionTime": T0}
    for shown, expected in (("True", True), ("False", False)):
        status = MultimodalInferenceStatus.model_validate({"conditions": [{**said, "status": shown}]})
        assert hovering_after(autoscale._first_memory(status)) is expected
    assert hovering_after(autoscale._first_memory(None)) is False


def test_a_fleet_back_from_zero_starts_unbound() -> None:
    """The condition is absent at zero; when the fleet comes back it turns True only on the thresholds to turn on."""
    doc = spec_doc(
        autoscaling={"minReplicas": 0, "maxReplicas": 8, "slo": {"target": "2s"}}, routing={"mode": "inferencePool"}
    )
    zero_capable = MultimodalInference.model_validate(doc)
    _, memory, _ = run(zero_capable, 1, timed(3.0, MADE_BOUND), 1, Pods(ready=1), start=T0)
    assert memory.preprocessing_bound
    _, memory, _ = run(zero_capable, 0, Signals(request_rate=0.0), 1, Pods(), memory=memory, start=T0)
    assert hovering_after(memory, zero_capable) is False
