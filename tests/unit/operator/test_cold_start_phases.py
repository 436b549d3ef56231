"""A new replica's cold start, phase by phase, from the timestamps Kubernetes records: what status shows, what the
operator's metrics observe once per pod, and the whole the autoscaler plans with."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from mmfleet import metrics_export
from mmfleet.autoscaler.cycle import PHASES, ColdStart, Memory, Pods, Seen, count_pods, decide
from mmfleet.autoscaler.metrics import Signals
from mmfleet.status import Observed, compute_status
from tests.helpers.autoscaler import INTERVAL, T0, fleet

CREATED = "2026-12-01T00:00:00Z"


def at(seconds: float) -> str:
    return (T0.replace(year=2026, month=12, day=1, hour=0, minute=0) + timedelta(seconds=seconds)).isoformat()


def pod(name: str, scheduled: float, initialized: float, running: float | None, ready: float) -> dict[str, Any]:
    """A Ready pod of the server: scheduled, initialized, its container running and Ready at these seconds after
    creation."""
    status: dict[str, Any] = {
        "phase": "Running",
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": at(scheduled)},
            {"type": "Initialized", "status": "True", "lastTransitionTime": at(initialized)},
            {"type": "Ready", "status": "True", "lastTransitionTime": at(ready)},
        ],
        "containerStatuses": [{"name": "vllm", "state": {"running": {"startedAt": at(running)}} if running else {}}],
    }
    return {"metadata": {"name": name, "creationTimestamp": CREATED}, "status": status}


def test_each_ready_pod_is_split_into_the_phases_kubernetes_timestamps() -> None:
    pods = count_pods([pod("a", 2, 5, 45, 140), pod("b", 4, 6, 65, 150), pod("c", 3, 3, 40, 120)])
    by_pod = {s.pod: s for s in pods.starts}
    assert by_pod["a"].total == 140
    assert by_pod["a"].phases == (2, 3, 40, 95), "scheduled, initialized, image pulled and started, loaded"
    summary = ColdStart.of(pods.starts)
    assert summary is not None
    # The median of each phase, not the phases of the median pod.
    assert (summary.total, summary.phases, summary.pods) == (140, (3, 2, 40, 85), 3)
    assert pods.cold_start == 140, "the autoscaler's lead time is still the median of the whole"


def test_a_phase_without_a_time_counts_in_the_next_one() -> None:
    # No container start recorded (a container still waiting on a second image, say): its time goes to Ready.
    (start,) = count_pods([pod("a", 2, 5, None, 100)]).starts
    assert start.phases == (2, 3, None, 95)
    # An Initialized time before PodScheduled is out of order: ignored, not a negative phase.
    (start,) = count_pods([pod("b", 10, 5, 30, 100)]).starts
    assert start.phases == (10, None, 20, 70)


def _decide(pods: list[dict[str, Any]], memory: Memory) -> Any:
    counted = count_pods(pods)
    signals = Signals(latency=0.5, request_rate=1.0, waiting=0.0, running=1.0, kv_cache_usage=0.1)
    seen = Seen(counted.ready, counted, signals)
    return decide(fleet(), seen, memory, T0, interval=INTERVAL, default_cold_start=120)


def test_status_shows_the_medians_and_keeps_them_when_the_pods_are_gone() -> None:
    first = _decide([pod("a", 2, 5, 45, 140)], Memory())
    status = compute_status(fleet(), Observed(deployment=None, scaling=first.scaling()), None, T0)
    assert status.cold_start is not None
    assert status.cold_start.model_dump(by_alias=True, exclude_none=True) == {
        "total": "140s",
        "scheduled": "2s",
        "initialized": "3s",
        "started": "40s",
        "ready": "95s",
        "pods": 1,
    }
    later = _decide([], first.memory)
    assert later.scaling().cold_start == status.cold_start, "the last measurement stays while no pod is Ready"


def test_each_pod_is_observed_once_by_the_operators_histogram() -> None:
    key = ("ml", "qwen")
    labels = {"namespace": "ml", "mmfleet_io_inference": "qwen"}

    def count(phase: str) -> float:
        found = metrics_export.REGISTRY.get_sample_value(
            "mmfleet_fleet_cold_start_phase_seconds_count", {**labels, "phase": phase}
        )
        return found or 0.0

    before = {phase: count(phase) for phase in ("total", *PHASES)}
    memory = Memory()
    try:
        for pods in ([pod("a", 2, 5, 45, 140)], [pod("a", 2, 5, 45, 140), pod("b", 4, 6, None, 150)]):
            outcome = _decide(pods, memory)
            memory = outcome.memory
            seen = Seen(outcome.current, Pods(ready=outcome.current), None)
            metrics_export.record_decision(key, fleet(), seen, outcome, 120)
        assert count("total") - before["total"] == 2, "a and b, once each, whatever the number of cycles"
        assert count("ready") - before["ready"] == 2
        assert count("started") - before["started"] == 1, "b's container start was not recorded"
    finally:
        metrics_export.forget_others(set())
