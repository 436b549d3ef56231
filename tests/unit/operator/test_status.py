"""Status from observations: phase, conditions with reasons, and stable transition times."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from mmfleet.api import MultimodalInferenceStatus
from mmfleet.status import (
    InvalidSpec,
    Observed,
    compute_status,
    desired_replicas,
    events,
    pod_problems,
    shared_cache_problem,
)
from tests.helpers.status import NOW, conditions, deployment, inference


def test_no_deployment_yet_is_pending() -> None:
    status = compute_status(inference(), Observed(), None, NOW)
    assert status.phase == "Pending"
    assert conditions(status)["Progressing"] == ("True", "Creating")


def test_all_replicas_ready_is_ready() -> None:
    status = compute_status(inference(replicas=2), Observed(deployment=deployment(2, 2)), None, NOW)
    assert status.phase == "Ready"
    assert (status.replicas, status.ready_replicas, status.desired_replicas) == (2, 2, 2)
    assert conditions(status)["Ready"] == ("True", "ReplicasReady")
    assert conditions(status)["Progressing"][0] == "False"
    assert status.observed_generation == 2
    assert status.selector == "mmfleet.io/inference=qwen,app.kubernetes.io/component=inference-server"
    assert status.endpoint == "http://qwen.ml.svc.cluster.local:8000/v1"


def test_starting_replicas_are_progressing() -> None:
    status = compute_status(inference(replicas=3), Observed(deployment=deployment(3, 1)), None, NOW)
    assert status.phase == "Progressing"
    assert conditions(status)["Ready"] == ("False", "ReplicasNotReady")
    assert "1/3 replicas ready" in next(c.message for c in status.conditions if c.type == "Ready")


def test_rollout_in_progress_is_not_ready_even_if_old_pods_serve() -> None:
    status = compute_status(inference(replicas=2), Observed(deployment=deployment(3, 2, updated=1)), None, NOW)
    assert status.phase == "Progressing"


def test_unschedulable_pod_is_degraded_with_the_scheduler_reason() -> None:
    pods = [
        {
            "metadata": {"name": "qwen-abc"},
            "status": {
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
                    }
                ]
            },
        }
    ]
    status = compute_status(
        inference(replicas=1), Observed(deployment=deployment(1, 0), pod_problems=pod_problems(pods)), None, NOW
    )
    assert status.phase == "Degraded"
    degraded = next(c for c in status.conditions if c.type == "Degraded")
    assert degraded.status == "True"
    assert degraded.reason == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in degraded.message


def test_crash_looping_pod_is_degraded_and_terminating_pods_are_ignored() -> None:
    crashing = {
        "metadata": {"name": "a"},
        "status": {"containerStatuses": [{"state": {"waiting": {"reason": "CrashLoopBackOff", "message": "boom"}}}]},
    }
    leaving = {**crashing, "metadata": {"name": "b", "deletionTimestamp": "2026-11-29T00:00:00Z"}}
    problems = pod_problems([crashing, leaving])
    assert [(p.pod, p.reason) for p in problems] == [("a", "CrashLoopBackOff")]


def test_transition_time_is_kept_while_status_is_unchanged() -> None:
    first = compute_status(inference(), Observed(deployment=deployment(1, 1)), None, NOW)
    later = compute_status(inference(), Observed(deployment=deployment(1, 1)), first, NOW + timedelta(minutes=5))
    assert later == first
    broken = compute_status(inference(), Observed(deployment=deployment(1, 0)), first, NOW + timedelta(minutes=9))
    ready = next(c for c in broken.conditions if c.type == "Ready")
    assert ready.last_transition_time == NOW + timedelta(minutes=9)


def test_autoscaler_conditions_and_slo_are_carried_over_while_autoscaling_is_on() -> None:
    previous = MultimodalInferenceStatus.model_validate(
        {
            "conditions": [{"type": "SLOMet", "status": "True", "reason": "TargetMet"}],
            "slo": {"observed": "1.2s", "target": "2s"},
            "lastScaleReason": "P90 2.8s > target 2s: 4 -> 7",
        }
    )
    auto = inference(autoscaling={"slo": {"target": "2s"}})
    status = compute_status(auto, Observed(deployment=deployment(1, 1)), previous, NOW)
    assert conditions(status)["SLOMet"] == ("True", "TargetMet")
    assert status.slo is not None
    assert status.slo.observed == "1.2s"
    assert status.last_scale_reason == "P90 2.8s > target 2s: 4 -> 7"
    # Turned off: nothing of the autoscaler's stays to mislead (no SLOMet nobody updates any more).
    off = compute_status(inference(), Observed(deployment=deployment(1, 1)), status, NOW)
    assert "SLOMet" not in conditions(off)
    assert (off.slo, off.last_scale_reason) == (None, None)


def test_desired_replicas_with_autoscaling_stays_in_bounds() -> None:
    auto = inference(autoscaling={"minReplicas": 2, "maxReplicas": 4, "slo": {"target": "2s"}})
    assert desired_replicas(auto, None) == 2
    assert desired_replicas(auto, deployment(1, 1)) == 2
    assert desired_replicas(auto, deployment(9, 9)) == 4
    assert desired_replicas(auto, deployment(3, 3)) == 3
    assert desired_replicas(inference(replicas=5), deployment(1, 1)) == 5


def test_invalid_spec_fails_with_the_problem_and_keeps_counts() -> None:
    previous = compute_status(inference(), Observed(deployment=deployment(1, 1)), None, NOW)
    invalid = InvalidSpec(["spec.backend.extraArgs[0]: --port=1 clashes"], 3)
    status = compute_status(invalid, Observed(), previous, NOW)
    assert status.phase == "Failed"
    ready = next(c for c in status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("False", "InvalidSpec")
    assert "extraArgs[0]" in ready.message
    assert status.ready_replicas == 1
    assert status.observed_generation == 3


def test_events_tell_bad_news_and_readiness_once_per_transition() -> None:
    def status_with(**conditions: tuple[str, str]) -> MultimodalInferenceStatus:
        rows = [
            {"type": kind, "status": ok, "reason": why, "message": f"{kind} {why}"}
            for kind, (ok, why) in conditions.items()
        ]
        return MultimodalInferenceStatus.model_validate({"conditions": rows})

    starting = status_with(Ready=("False", "ReplicasNotReady"), Degraded=("False", "AsExpected"))
    stuck = status_with(Ready=("False", "ReplicasNotReady"), Degraded=("True", "Unschedulable"))
    ready = status_with(Ready=("True", "ReplicasReady"), Degraded=("False", "AsExpected"))
    assert events(None, starting) == []
    assert events(starting, stuck) == [("Warning", "Unschedulable", "Degraded Unschedulable")]
    assert events(stuck, stuck) == [], "a condition that stayed is not news again"
    assert events(stuck, ready) == [("Normal", "Ready", "Ready ReplicasReady")]


def claim(*modes: str, phase: str = "Bound") -> dict[str, Any]:
    return {"metadata": {"name": "models"}, "spec": {"accessModes": list(modes)}, "status": {"phase": phase}}


def test_a_shared_cache_claim_that_cannot_serve_every_replica_is_named_in_degraded() -> None:
    shared = inference(modelCache={"volume": "shared", "claimName": "models"})
    missing = shared_cache_problem(shared, None)
    assert missing is not None and missing[0] == "ModelCacheClaimMissing"
    assert "spec.modelCache.claimName: models" in missing[1] and "namespace ml" in missing[1]
    assert "ReadWriteMany" in missing[1] and "volume: emptyDir" in missing[1]
    single = shared_cache_problem(shared, claim("ReadWriteOnce"))
    assert single is not None and single[0] == "ModelCacheClaimNotShared" and "ReadWriteOnce" in single[1]
    lost = shared_cache_problem(shared, claim("ReadWriteMany", phase="Lost"))
    assert lost is not None and lost[0] == "ModelCacheClaimLost"
    assert shared_cache_problem(shared, claim("ReadWriteMany")) is None
    assert shared_cache_problem(shared, claim("ReadWriteMany", phase="Pending")) is None  # binds on first use
    assert shared_cache_problem(inference(), None) is None  # no shared cache, nothing to read

    status = compute_status(shared, Observed(deployment=deployment(1, 0), cache_problem=missing), None, NOW)
    assert status.phase == "Degraded"
    assert conditions(status)["Degraded"] == ("True", "ModelCacheClaimMissing")
    assert conditions(status)["Ready"] == ("False", "ReplicasNotReady")
    fixed = compute_status(shared, Observed(deployment=deployment(1, 1)), status, NOW)
    assert fixed.phase == "Ready" and conditions(fixed)["Degraded"] == ("False", "AsExpected")
