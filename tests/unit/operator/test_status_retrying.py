"""An apply the API server asked to retry (409, 429, 5xx, no answer) shows in Progressing, not as a failed fleet."""

from __future__ import annotations

from mmfleet.status import Observed, compute_status
from tests.helpers.status import NOW, conditions, deployment, inference


def test_a_retried_apply_says_so_in_progressing_and_ready_says_what_runs() -> None:
    message = "the API server asked to retry: 503 Service Unavailable; next in 5 s"
    status = compute_status(inference(replicas=2), Observed(deployment=deployment(1, 1), retrying=message), None, NOW)
    assert conditions(status)["Progressing"] == ("False", "ApiServerRetrying")
    assert next(c.message for c in status.conditions if c.type == "Progressing") == message
    assert conditions(status)["Ready"] == ("False", "ReplicasNotReady")
    assert conditions(status)["Degraded"] == ("False", "AsExpected")


def test_without_a_retry_progressing_is_the_rollout() -> None:
    status = compute_status(inference(replicas=2), Observed(deployment=deployment(2, 2)), None, NOW)
    assert conditions(status)["Progressing"] == ("False", "RolledOut")
