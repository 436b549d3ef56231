"""A new fleet's first status: one write when its rollout ends within FIRST_STATUS_WAIT, and bad news at once."""

from __future__ import annotations

import time
from typing import Any

import pytest

from mmfleet.handlers.records import FIRST_STATUS_WAIT
from tests.helpers.operator_state import KEY, RecordingKube, fleet_body, operator, reconcile_once

UNSCHEDULABLE = {
    "metadata": {"name": "qwen-0", "labels": {"mmfleet.io/inference": "qwen"}},
    "status": {
        "phase": "Pending",
        "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."},
        ],
    },
}  # fmt: skip


def test_a_rollout_done_within_the_wait_is_written_once_as_ready() -> None:
    kube = RecordingKube()
    op = operator(kube)
    body = fleet_body(generation=1)
    reconcile_once(op, body)
    result = reconcile_once(op, body, deployment=_deployment(kube, ready=2))  # its pods' events, within the wait
    assert [(s["phase"], s["observedGeneration"]) for s in kube.written] == [("Ready", 1)]
    assert result.requeue_after is None


def test_a_rollout_under_way_is_written_when_the_wait_ends() -> None:
    kube = RecordingKube()
    kube.ready = False
    op = operator(kube)
    body = fleet_body(generation=1)
    result = reconcile_once(op, body)
    assert kube.written == []
    assert result.requeue_after == pytest.approx(FIRST_STATUS_WAIT, abs=1.0)

    deployment = _deployment(kube, ready=0)
    early = reconcile_once(op, body, deployment=deployment)
    assert kube.written == []  # a pod's event before the wait ends writes nothing either
    assert early.requeue_after is not None and 0 < early.requeue_after <= FIRST_STATUS_WAIT

    record = op.find(KEY, "u-1")
    assert record is not None
    record.first_status_due = time.monotonic() - 0.1  # the wait is over
    reconcile_once(op, body, deployment=deployment)
    assert [(s["phase"], s["observedGeneration"]) for s in kube.written] == [("Progressing", 1)]


def test_bad_news_is_never_held() -> None:
    kube = RecordingKube()
    kube.ready = False
    reconcile_once(operator(kube), fleet_body(generation=1), pods=[UNSCHEDULABLE])
    assert [s["phase"] for s in kube.written] == ["Degraded"]


def test_a_fleet_with_a_status_is_told_of_its_new_generation_at_once() -> None:
    kube = RecordingKube()
    kube.ready = False
    body = fleet_body(generation=3)
    body["status"] = {"phase": "Ready", "observedGeneration": 2, "conditions": []}
    reconcile_once(operator(kube), body)
    assert [(s["phase"], s["observedGeneration"]) for s in kube.written] == [("Progressing", 3)]


def _deployment(kube: RecordingKube, ready: int) -> dict[str, Any]:
    """The fleet's Deployment as its watch shows it once rolled out to 2 replicas, ``ready`` of them ready."""
    applied = next(m for m in kube.applied if m["kind"] == "Deployment")
    rolled_out = {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "readyReplicas": ready}
    return {**applied, "metadata": {**applied["metadata"], "generation": 1}, "status": rolled_out}
