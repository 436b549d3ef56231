"""Issue 23 item 8: a fleet in kube-system, kube-public or kube-node-lease is never served.

Cluster-wide (the chart's clusterWide: true, the kustomize base), the operator's ClusterRole can write Deployments,
ServiceAccounts and ConfigMaps in those namespaces too, and RBAC cannot take them out; the operator refuses the fleet
there instead, saying so in its Ready condition, and applies nothing.
"""

from __future__ import annotations

import pytest

from mmfleet.api import ReadyReason
from mmfleet.handlers import records
from mmfleet.validation import SYSTEM_NAMESPACES
from tests.helpers.operator_state import RecordingKube, fleet_body, operator, reconcile_once, refused_ready


@pytest.mark.parametrize("namespace", SYSTEM_NAMESPACES)
def test_a_fleet_in_a_system_namespace_is_refused_naming_it_and_nothing_is_applied(
    namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(records, "kopf_event", lambda *_: None)
    body = fleet_body(generation=1)
    body["metadata"]["namespace"] = namespace
    ready = refused_ready(body)
    assert (ready["status"], ready["reason"]) == ("False", ReadyReason.POLICY_DENIED)
    assert ready["message"].startswith(f"metadata.namespace: {namespace!r} is not served")
    assert "create the fleet in another namespace" in ready["message"]


def test_the_same_fleet_in_any_other_namespace_is_served() -> None:
    kube = RecordingKube()
    body = fleet_body(generation=1)
    body["metadata"]["namespace"] = "kube-system-ml"
    assert reconcile_once(operator(kube), body).outcome == "ok"
    assert {child["kind"] for child in kube.applied} >= {"Deployment", "ServiceAccount"}
