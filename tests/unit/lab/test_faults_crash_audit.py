"""The crash test's audit finds each thing a converged namespace may not hold (else the test proves nothing)."""

from __future__ import annotations

from typing import Any

from mmfleet.render import INFERENCE_LABEL
from mmfleet_lab.faults_crash import audit


def fleet(name: str, uid: str, replicas: int = 1, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": uid, "generation": 2, **meta},
        "spec": {"replicas": replicas},
        "status": {"observedGeneration": 2, "phase": "Ready", "readyReplicas": replicas},
    }


def child(name: str, fleet_name: str, owner_uid: str | None, replicas: int = 1, **meta: Any) -> dict[str, Any]:
    refs = [{"uid": owner_uid, "controller": True}] if owner_uid else []
    return {
        "metadata": {"name": name, "labels": {INFERENCE_LABEL: fleet_name}, "ownerReferences": refs, **meta},
        "spec": {"replicas": replicas},
        "status": {"readyReplicas": replicas},
    }


def test_a_converged_namespace_is_clean() -> None:
    assert audit([fleet("a", "u-a")], {"deployments": [child("a", "a", "u-a")]}).clean


def test_each_fault_is_counted() -> None:
    fleets = [fleet("a", "u-a"), fleet("b", "u-b"), fleet("gone", "u-g", deletionTimestamp="2026-12-01T00:00:00Z")]
    children = {
        "deployments": [child("a", "a", "u-a"), child("a2", "a", "u-a"), child("b", "b", "u-b")],
        "services": [child("x", "deleted", "u-deleted"), child("b", "b", "u-a"), child("n", "b", None)],
        "configmaps": [child("c", "a", "u-a", deletionTimestamp="2026-12-01T00:00:00Z")],
    }
    result = audit(fleets, children)
    assert (result.orphaned, result.duplicated, result.adopted, result.stuck_deletions) == (2, 2, 1, 2)
    assert result.lost == 1, "fleet a has no Service (a ConfigMap is not every fleet's)"


def test_status_behind_or_wrong_is_counted() -> None:
    behind = fleet("a", "u-a")
    behind["status"]["observedGeneration"] = 1
    ready_without_pods = fleet("b", "u-b")
    deployments = [child("a", "a", "u-a"), child("b", "b", "u-b")]
    deployments[1]["status"]["readyReplicas"] = 0
    assert audit([behind, ready_without_pods], {"deployments": deployments}).status_wrong == 2


def test_a_fleet_still_starting_is_not_converged_but_not_wrong() -> None:
    starting = fleet("a", "u-a")
    starting["status"].update(phase="Progressing", readyReplicas=0)
    deployment = child("a", "a", "u-a")
    deployment["status"]["readyReplicas"] = 0
    result = audit([starting], {"deployments": [deployment]})
    assert not result.clean and result.status_wrong == 0
