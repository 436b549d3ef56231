"""PreprocessingBound: a vllm fleet misses its target while its engines' queues are empty and its busiest API server
process uses a whole core, so image preprocessing (one thread per API server process), not the GPUs, bounds it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mmfleet.api import MultimodalInference
from mmfleet.autoscaler.cycle import Pods
from mmfleet.autoscaler.metrics import Signals
from mmfleet.status import WARNING_WHEN
from tests.helpers.autoscaler import busy, conditions, fleet, run
from tests.helpers.repo import spec_doc


def bound(signals: Signals, inference: MultimodalInference | None = None) -> tuple[bool | None, str, str] | None:
    outcomes, _, _ = run(inference or fleet(), 2, signals, cycles=6, pods=Pods(ready=2))
    return conditions(outcomes[-1]).get("PreprocessingBound")


def test_a_missed_target_with_empty_engine_queues_and_a_saturated_api_server_is_preprocessing_bound() -> None:
    found = bound(replace(busy(4.0, waiting=0.0, running=3.0), api_cpu=0.97))
    assert found is not None
    status, reason, message = found
    assert (status, reason) == (True, "CpuSaturated")
    assert message.startswith("P90 4s > target 2s with the busiest API server process at 0.97 CPU cores, 0 waiting")
    assert "spec.multimodal.apiServers" in message and "spec.resources.cpu" in message
    assert WARNING_WHEN["PreprocessingBound"] == "True", "a Warning event when it turns True"


@pytest.mark.parametrize(
    ("latency", "waiting", "cpu", "why"),
    [
        (4.0, 5.0, 0.97, "requests wait in the engines: the GPUs are the bound"),
        (4.0, 0.0, 0.40, "the API servers have CPU to spare"),
        (1.5, 0.0, 0.97, "the target is met"),
    ],
)
def test_otherwise_it_is_not(latency: float, waiting: float, cpu: float, why: str) -> None:
    found = bound(replace(busy(latency, waiting=waiting, running=3.0), api_cpu=cpu))
    assert found is not None
    assert found[:2] == (False, "NotCpuBound"), why
    assert f"at {cpu:.2f} CPU cores, {waiting:g} waiting in the engines" in found[2]


def test_without_the_api_servers_cpu_it_is_not_measured_and_says_why() -> None:
    found = bound(busy(4.0, waiting=0.0))
    assert found is not None
    assert found[:2] == (None, "NotMeasured")
    assert "process_cpu_seconds_total" in found[2] and "spec.multimodal.apiServers" in found[2]


def test_a_tensorrt_llm_fleet_has_no_such_condition() -> None:
    doc = spec_doc(backend={"name": "tensorrt-llm"}, autoscaling={"maxReplicas": 4, "slo": {"target": "2s"}})
    trt = MultimodalInference.model_validate(doc)
    assert bound(replace(busy(4.0, waiting=0.0), api_cpu=0.97), trt) is None
