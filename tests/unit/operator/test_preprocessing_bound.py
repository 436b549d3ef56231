"""PreprocessingBound: a vllm fleet misses its target while its requests spend a large share of their time outside
the engine, in the API server (loading and preprocessing images, a queue the engine's waiting count does not show)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mmfleet.api import MultimodalInference
from mmfleet.autoscaler.cycle import OUTSIDE_SHARE, Pods
from mmfleet.autoscaler.metrics import Signals
from mmfleet.status import WARNING_WHEN
from tests.helpers.autoscaler import busy, conditions, fleet, run
from tests.helpers.repo import spec_doc


def bound(
    signals: Signals | None, inference: MultimodalInference | None = None, outage: str | None = None
) -> tuple[bool | None, str, str] | None:
    outcomes, _, _ = run(inference or fleet(), 2, signals, cycles=6, pods=Pods(ready=2), outage=outage)
    return conditions(outcomes[-1]).get("PreprocessingBound")


def timed(latency: float, outside: float, e2e: float) -> Signals:
    return replace(busy(latency, waiting=0.0, running=3.0), outside=outside, e2e_mean=e2e)


def test_a_missed_target_with_most_of_the_time_outside_the_engine_is_api_server_bound() -> None:
    # As the real vLLM 0.33 server at 40 req/s with images: 3.3 s of a mean 11.3 s outside the engine.
    found = bound(timed(12.0, 3.34, 11.3))
    assert found is not None
    status, reason, message = found
    assert (status, reason) == (True, "ApiServerBound")
    assert message.startswith(
        "P90 12s > target 2s, and requests spent 3.34s of their mean 11.3s outside the engine (30%)"
    )
    assert "spec.multimodal.apiServers" in message and "spec.resources.cpu" in message
    assert WARNING_WHEN["PreprocessingBound"] == "True", "a Warning event when it turns True"


@pytest.mark.parametrize(
    ("latency", "outside", "e2e", "why"),
    [
        (4.0, 0.083, 3.48, "the real server at 20 req/s: 2% outside the engine, the GPUs bound it"),
        (1.5, 3.0, 4.0, "the target is met"),
        (4.0, OUTSIDE_SHARE * 4.0 - 0.01, 4.0, "just under the share"),
    ],
)
def test_otherwise_it_is_not(latency: float, outside: float, e2e: float, why: str) -> None:
    found = bound(timed(latency, outside, e2e))
    assert found is not None
    assert found[:2] == (False, "NotApiServerBound"), why
    assert "outside the engine" in found[2]


@pytest.mark.parametrize(
    ("signals", "outage", "says"),
    [
        (replace(timed(4.0, 3.0, 4.0), outside_problem="the query was refused: bad_data"), None, "refused: bad_data"),
        (busy(4.0, waiting=0.0), None, "no request finished over the last 1m"),
        (None, "Prometheus is down", "Prometheus is down"),
    ],
)
def test_what_cannot_be_measured_says_why(signals: Signals | None, outage: str | None, says: str) -> None:
    found = bound(signals, outage=outage)
    assert found is not None
    assert found[:2] == (None, "NotMeasured")
    assert says in found[2]


def test_a_tensorrt_llm_fleet_has_no_such_condition() -> None:
    doc = spec_doc(backend={"name": "tensorrt-llm"}, autoscaling={"maxReplicas": 4, "slo": {"target": "2s"}})
    trt = MultimodalInference.model_validate(doc)
    assert bound(timed(4.0, 3.0, 4.0), trt) is None
