"""The operator on the local control plane against objects it does not own, refusals, quotas and old finalizers."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import NotFoundError

from mmfleet_lab.cluster.discovery import dynamic_client
from tests.helpers.fake_pods import FakePod, prometheus_scraping
from tests.helpers.fleet import Fleet, mmi
from tests.helpers.operator_process import OperatorProcess
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.integration
SLO = {"target": "2s", "window": "10s"}  # a short window: the policy's latency feedback waits one window


def test_a_same_named_service_account_is_never_adopted_nor_deleted_and_the_fleet_converges_once_it_goes(
    fleet: Fleet,
) -> None:
    fleet.core.create_namespaced_service_account(fleet.namespace, {"metadata": {"name": "taken"}})
    fleet.create(mmi("taken"))
    degraded = fleet.wait_condition("taken", "Degraded", status="True", reason="ChildNotOwned", timeout=30)
    assert f"ServiceAccount {fleet.namespace}/taken already exists with no controller" in degraded["message"]
    assert fleet.status("taken")["phase"] == "Degraded"
    assert fleet.deployment("taken") is None, "no Deployment may run as someone else's ServiceAccount"
    account = fleet.core.read_namespaced_service_account("taken", fleet.namespace)
    assert not account.metadata.owner_references
    wait_for(lambda: fleet.events("taken", "ChildNotOwned", "Warning"), 30, "the ChildNotOwned warning")

    # Level-triggered: no event tells the operator the name is free again; its retry finds out.
    fleet.core.delete_namespaced_service_account("taken", fleet.namespace)
    fleet.wait_ready("taken", timeout=90)
    account = fleet.core.read_namespaced_service_account("taken", fleet.namespace)
    assert account.metadata.owner_references[0].uid == fleet.get("taken")["metadata"]["uid"]


def test_deleting_a_fleet_leaves_the_object_it_refused_to_adopt(fleet: Fleet) -> None:
    fleet.core.create_namespaced_service(
        fleet.namespace, {"metadata": {"name": "shared"}, "spec": {"ports": [{"port": 80}]}}
    )
    fleet.create(mmi("shared"))
    fleet.wait_condition("shared", "Degraded", status="True", reason="ChildNotOwned", timeout=30)
    fleet.custom.delete_namespaced_custom_object(
        "mmfleet.io", "v1alpha1", fleet.namespace, "multimodalinferences", "shared"
    )
    time.sleep(5)  # the garbage collector's time to act, were anything owned
    service = fleet.core.read_namespaced_service("shared", fleet.namespace)
    assert not service.metadata.owner_references


def test_decoys_with_a_fleets_labels_are_not_its_children_before_or_after_an_operator_restart(
    fleet: Fleet, operator: OperatorProcess
) -> None:
    """Issue 23, item 6: status was computed from the pods and Deployments carrying the fleet's label, so a decoy
    pod made the fleet Degraded, and after a restart a decoy Deployment (listed first) was read as the fleet's: its
    replicas were handed over to the fleet's Deployment, and status and the autoscaler read its counts."""
    ns = fleet.namespace
    fleet.create(mmi("real", autoscaling={"minReplicas": 2, "maxReplicas": 4, "slo": SLO}))  # no Prometheus: holds
    fleet.wait_ready("real", replicas=2)
    labels = {
        "mmfleet.io/inference": "real",
        "app.kubernetes.io/component": "inference-server",
        "app.kubernetes.io/managed-by": "mmfleet",
    }
    container = {"name": "c", "image": "example.com/c:1"}
    nowhere = {"nodeSelector": {"example.com/no-such-pool": "x"}, "containers": [container]}
    fleet.core.create_namespaced_pod(ns, {"metadata": {"name": "decoy", "labels": labels}, "spec": nowhere})
    decoy = {
        "metadata": {"name": "decoy", "labels": labels},  # listed before "real" when the operator starts
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"decoy": "yes"}},
            "template": {"metadata": {"labels": {**labels, "decoy": "yes"}}, "spec": nowhere},
        },
    }
    fleet.apps.create_namespaced_deployment(ns, decoy)

    def unschedulable() -> int:
        pods = fleet.core.list_namespaced_pod(ns, label_selector="mmfleet.io/inference=real").items
        return sum(
            1 for p in pods if any(c.type == "PodScheduled" and c.status == "False" for c in p.status.conditions or [])
        )

    wait_for(lambda: unschedulable() == 4, 30, "the decoy pods to be unschedulable")

    def holds_as_its_own(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            status = fleet.status("real")
            counts = (status.get("phase"), status.get("replicas"), status.get("readyReplicas"))
            assert counts == ("Ready", 2, 2) and status.get("desiredReplicas") == 2, status
            assert fleet.condition("real", "Degraded")["status"] == "False", fleet.condition("real", "Degraded")
            assert fleet.deployment("real").spec.replicas == 2
            time.sleep(0.5)

    holds_as_its_own(5)  # the decoy pods' events each refresh the fleet's status a second later

    saved = operator.env
    operator.stop()
    operator.env = {**saved, "MMFLEET_AUTOSCALE_INTERVAL": "1s"}
    reconciled = f"reconciled {ns}/real in"
    before = operator.log.read_text(errors="replace").count(reconciled)
    operator.start()
    try:
        wait_for(
            lambda: operator.log.read_text(errors="replace").count(reconciled) > before,
            60,
            lambda: f"the fleet's first reconcile after the restart\n{operator.tail()}",
        )
        holds_as_its_own(6)  # status refreshes from the indexes, and autoscaling cycles every second
    finally:
        operator.stop()
        operator.env = saved
        operator.start()


@pytest.fixture
def refusing_policy(api: Any, namespace: str) -> Iterator[str]:
    """A ValidatingAdmissionPolicy that refuses (422 Invalid) Deployments labelled ``mmfleet.io/inference: refused``
    in ``namespace``, as a cluster's own policy may; the policy's name is yielded, deleted after."""
    name = f"it-refuse-{uuid.uuid4().hex[:6]}"
    dyn = dynamic_client(api)
    policies = dyn.resources.get(api_version="admissionregistration.k8s.io/v1", kind="ValidatingAdmissionPolicy")
    bindings = dyn.resources.get(api_version="admissionregistration.k8s.io/v1", kind="ValidatingAdmissionPolicyBinding")
    label = "object.metadata.labels"
    policies.create(
        body={
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": ["apps"],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE", "UPDATE"],
                            "resources": ["deployments"],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": f"!has({label}) || {label}[?'mmfleet.io/inference'].orValue('') != 'refused'",
                        "message": "spec.template.spec.nodeSelector: this cluster admits no fleet named refused",
                        "reason": "Invalid",
                    }
                ],
            },
        }
    )
    bindings.create(
        body={
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}},
            },
        }
    )
    apps = client.AppsV1Api(api)
    probe = {
        "metadata": {"name": "probe", "labels": {"mmfleet.io/inference": "refused"}},
        "spec": {
            "selector": {"matchLabels": {"app": "probe"}},
            "template": {
                "metadata": {"labels": {"app": "probe"}},
                "spec": {"containers": [{"name": "c", "image": "example.com/c:1"}]},
            },
        },
    }

    def enforced() -> bool:
        try:
            apps.create_namespaced_deployment(namespace, probe, dry_run="All")
        except ApiException as error:
            return error.status == 422
        return False

    wait_for(enforced, 30, "the admission policy to be enforced")
    yield name
    with contextlib.suppress(NotFoundError):  # a test may have lifted the policy already
        bindings.delete(name=name)
    policies.delete(name=name)


def test_a_child_the_api_server_refuses_is_a_condition_quoting_it_and_converges_when_admitted(
    fleet: Fleet, api: Any, refusing_policy: str
) -> None:
    fleet.create(mmi("refused"))
    condition = fleet.wait_condition("refused", "Degraded", status="True", reason="ApplyRefused", timeout=30)
    assert f"(422): applying Deployment {fleet.namespace}/refused" in condition["message"]
    assert "this cluster admits no fleet named refused" in condition["message"]
    assert fleet.condition("refused", "Ready")["reason"] == "ApplyRefused"
    dynamic_client(api).resources.get(
        api_version="admissionregistration.k8s.io/v1", kind="ValidatingAdmissionPolicyBinding"
    ).delete(name=refusing_policy)
    fleet.wait_ready("refused", timeout=90)  # retried with backoff, without a spec change
    assert fleet.condition("refused", "Degraded")["reason"] == "AsExpected"


def test_a_gpu_quota_that_refuses_pods_is_named_and_the_fleet_grows_when_it_is_raised(fleet: Fleet) -> None:
    quota = {"metadata": {"name": "gpus"}, "spec": {"hard": {"requests.nvidia.com/gpu": "1"}}}
    fleet.core.create_namespaced_resource_quota(fleet.namespace, quota)
    fleet.create(mmi("quota", replicas=2))
    condition = fleet.wait_condition("quota", "Degraded", status="True", reason="QuotaExceeded", timeout=60)
    assert "exceeded quota: gpus" in condition["message"] and "nvidia.com/gpu" in condition["message"]
    assert fleet.status("quota")["phase"] == "Degraded"
    fleet.core.patch_namespaced_resource_quota(
        "gpus", fleet.namespace, {"spec": {"hard": {"requests.nvidia.com/gpu": "2"}}}
    )
    fleet.wait_ready("quota", replicas=2, timeout=120)
    assert fleet.condition("quota", "Degraded")["reason"] == "AsExpected"


def test_a_finalizer_an_earlier_version_left_is_removed_so_deleting_never_hangs(fleet: Fleet) -> None:
    body = mmi("legacy")
    body["metadata"]["finalizers"] = ["mmfleet.io/finalizer"]
    fleet.create(body)
    wait_for(lambda: not fleet.get("legacy")["metadata"].get("finalizers"), 30, "the old finalizer to be removed")
    fleet.wait_ready("legacy")


@pytest.fixture
def scaling_fleet(api: Any, namespace: str, operator: OperatorProcess, tmp_path: Path) -> Iterator[tuple[Fleet, Any]]:
    """The session's operator, restarted to read this test's Prometheus every second; restored after."""
    with prometheus_scraping(tmp_path) as scraped:
        saved = operator.env
        operator.stop()
        operator.env = {**saved, "MMFLEET_PROMETHEUS_URL": scraped[0].url, "MMFLEET_AUTOSCALE_INTERVAL": "1s"}
        operator.start()
        try:
            yield Fleet(api, namespace), scraped
        finally:
            operator.stop()
            operator.env = saved
            operator.start()


def test_a_gpu_quota_stops_the_autoscalers_growth_says_so_and_growth_resumes_when_it_is_raised(
    scaling_fleet: tuple[Fleet, Any],
) -> None:
    fleet, (server, pods) = scaling_fleet
    ns = fleet.namespace
    quota = {"metadata": {"name": "gpus"}, "spec": {"hard": {"requests.nvidia.com/gpu": "1"}}}
    fleet.core.create_namespaced_resource_quota(ns, quota)
    pods.add(FakePod(ns, "capped-fake", "capped", rate=5, latency=4.0, waiting=5, running=5))
    server.scrape(pods)
    fleet.create(mmi("capped", autoscaling={"minReplicas": 1, "maxReplicas": 3, "slo": SLO}))

    def replicas() -> int | None:
        found = fleet.deployment("capped")
        return None if found is None else int(found.spec.replicas)

    wait_for(lambda: replicas() == 2, 150, "the first scale-up, 1 -> 2")
    limited = fleet.wait_condition("capped", "ScalingLimited", status="True", reason="PodsUnschedulable", timeout=60)
    assert "exceeded quota: gpus" in limited["message"], limited
    assert fleet.condition("capped", "Degraded")["reason"] == "QuotaExceeded"
    deadline = time.monotonic() + 10  # ten cycles over target: no replica beyond what the quota refuses
    while time.monotonic() < deadline:
        assert replicas() == 2
        time.sleep(0.5)
    fleet.core.patch_namespaced_resource_quota("gpus", ns, {"spec": {"hard": {"requests.nvidia.com/gpu": "3"}}})
    fleet.wait_ready("capped", replicas=3, timeout=150)
