"""observedGeneration says which spec the fleet's children were applied from: a status written by a refresh or an
autoscaling cycle while a newer spec waits for its apply (a retry after a refused or failed call, or a reconcile not
yet run) keeps the older generation, so Argo CD's health check (``manifests/argocd/health.lua``) and kstatus say
Progressing instead of reporting an unapplied spec as current (found by review: Ready with generation 2 observed
while generation 2's Deployment apply was still being retried)."""

from __future__ import annotations

from datetime import UTC, datetime

from mmfleet.api import MultimodalInferenceStatus
from mmfleet.handlers.records import FleetRecord, write_status
from tests.helpers.operator_state import RecordingKube, operator

NOW = datetime(2026, 12, 2, tzinfo=UTC)


def ready(generation: int, replicas: int = 1) -> MultimodalInferenceStatus:
    condition = {"type": "Ready", "status": "True", "message": f"{replicas}/{replicas}", "lastTransitionTime": NOW}
    return MultimodalInferenceStatus.model_validate(
        {"phase": "Ready", "observedGeneration": generation, "replicas": replicas, "conditions": [condition]}
    )


def test_a_status_written_before_the_new_generation_is_applied_keeps_the_applied_one() -> None:
    body = {"metadata": {"name": "vl", "namespace": "ml", "generation": 2}}
    kube = RecordingKube()
    op, record = operator(kube), FleetRecord(reconciled=1)  # generation 1 was applied; 2 is waiting for its retry
    write_status(op, record, body, ready(2), ready(1, replicas=2))
    assert kube.written[-1]["observedGeneration"] == 1
    record.reconciled = 2  # the retry went through
    write_status(op, record, body, ready(2, replicas=3), None)
    assert kube.written[-1]["observedGeneration"] == 2


def test_after_a_restart_the_status_keeps_its_generation_until_a_reconcile() -> None:
    """A fresh process has reconciled nothing: the generation the status already holds stands."""
    body = {"metadata": {"name": "vl", "namespace": "ml", "generation": 3}}
    kube = RecordingKube()
    write_status(operator(kube), FleetRecord(), body, ready(3, replicas=2), ready(2))
    assert kube.written[-1]["observedGeneration"] == 2
