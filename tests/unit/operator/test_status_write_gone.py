"""A status write for a fleet deleted meanwhile: a debounced refresh after a pod event, an autoscaling cycle or a
reconcile can race the deletion. Found by ``mmfleet bench fuzz --live`` (9 tracebacks "refreshing the status of ...
failed" in one run, each a 404 on the status subresource of a fleet the run had just deleted)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import NotFoundError

from mmfleet.api import MultimodalInferenceStatus
from mmfleet.handlers.records import FleetRecord, write_status
from mmfleet.kube import Kube
from tests.helpers.operator_state import operator

NOW = datetime(2026, 12, 2, tzinfo=UTC)


class DeletedFleetKube(Kube):
    """The API server's answer once the fleet is gone: 404 on its status subresource."""

    def __init__(self) -> None:
        self.calls = 0

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.calls += 1
        raise NotFoundError(ApiException(status=404, reason="Not Found"))


def test_a_status_write_for_a_deleted_fleet_is_no_error_and_nothing_is_remembered() -> None:
    ready = MultimodalInferenceStatus.model_validate(
        {
            "phase": "Ready",
            "conditions": [{"type": "Ready", "status": "True", "message": "1/1", "lastTransitionTime": NOW}],
        }
    )
    body = {"metadata": {"name": "gone", "namespace": "ml"}}
    kube = DeletedFleetKube()
    op, record = operator(kube), FleetRecord()
    assert write_status(op, record, body, ready, None) is False
    assert record.written is None  # a fleet recreated under the name is written afresh
    assert write_status(op, record, body, ready, None) is False
    assert kube.calls == 2
