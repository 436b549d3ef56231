"""The operator against the real local control plane: reconcile, status, drift, delete, bad input, crashes."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from mmfleet.api import GROUP, PLURAL, VERSION
from mmfleet.render import INFERENCE_LABEL
from mmfleet_lab.cluster import Cluster
from mmfleet_lab.cluster.kubectl import kubectl, run_kubectl
from tests.helpers.fleet import Fleet, mmi
from tests.helpers.operator_process import OperatorProcess
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.integration


def test_create_makes_children_and_reports_ready(fleet: Fleet) -> None:
    fleet.create(mmi("vl", replicas=2, gpu={"count": 2, "type": "H100"}))
    status = fleet.wait_ready("vl", replicas=2)
    assert status["desiredReplicas"] == 2
    assert status["cloud"] == "eks"  # detected from the fake nodes' providerIDs
    assert status["endpoint"] == f"http://vl.{fleet.namespace}.svc.cluster.local:8000/v1"
    assert status["selector"] == "mmfleet.io/inference=vl,app.kubernetes.io/component=inference-server"
    meta = fleet.get("vl")["metadata"]
    owner_uid = meta["uid"]
    # The operator owns status and children only: no bookkeeping of kopf's (it runs no change handler of ours).
    assert not [a for a in meta.get("annotations") or {} if a.startswith("mmfleet.io/")]
    assert not meta.get("finalizers")
    deployment = fleet.deployment("vl")
    assert deployment.metadata.owner_references[0].uid == owner_uid
    assert deployment.spec.template.spec.containers[0].resources.limits["nvidia.com/gpu"] == "2"
    service = fleet.core.read_namespaced_service("vl", fleet.namespace)
    assert service.metadata.owner_references[0].uid == owner_uid
    wait_for(lambda: fleet.events("vl", "Ready"), 30, "the Ready event")


def test_spec_change_rolls_out(fleet: Fleet) -> None:
    fleet.create(mmi("roll"))
    fleet.wait_ready("roll")
    fleet.patch("roll", {"backend": {"maxNumSeqs": 64}})
    fleet.wait_ready("roll")

    def rolled() -> bool:
        command = fleet.deployment("roll").spec.template.spec.containers[0].command
        return command[command.index("--max-num-seqs") + 1] == "64"

    wait_for(rolled, 30, "the Deployment to carry --max-num-seqs 64")
    assert fleet.status("roll")["observedGeneration"] == 2


def test_children_deleted_or_edited_by_hand_come_back(fleet: Fleet) -> None:
    fleet.create(mmi("drift"))
    fleet.wait_ready("drift")
    fleet.core.delete_namespaced_service("drift", fleet.namespace)
    patch = {"spec": {"template": {"spec": {"containers": [{"name": "server", "image": "example.com/evil:1"}]}}}}
    fleet.apps.patch_namespaced_deployment("drift", fleet.namespace, patch)

    def repaired() -> bool:
        try:
            fleet.core.read_namespaced_service("drift", fleet.namespace)
        except ApiException:
            return False
        return bool(fleet.deployment("drift").spec.template.spec.containers[0].image == "vllm/vllm-openai:v0.33.0")

    wait_for(repaired, 30, "the Service to be recreated and the image restored")


def test_a_childs_labels_taken_off_by_hand_come_back(fleet: Fleet) -> None:
    """The watches carry the children's labels as their selector, so the API server sends a child that loses them as
    a deletion, and the fleet applies it again at once (a filter kopf applied itself let it go unseen until the
    fleet's next change)."""
    fleet.create(mmi("unlabelled"))
    fleet.wait_ready("unlabelled")
    managed = "app.kubernetes.io/managed-by"
    fleet.core.patch_namespaced_service("unlabelled", fleet.namespace, {"metadata": {"labels": {managed: None}}})

    def labelled() -> bool:
        labels = fleet.core.read_namespaced_service("unlabelled", fleet.namespace).metadata.labels or {}
        return labels.get(managed) == "mmfleet"

    wait_for(labelled, 30, f"the Service's {managed} label to be applied again")
    # The fleet's own label, the key of kopf's index of Deployments, taken off the Deployment: it comes back too.
    unlabel = {"metadata": {"labels": {INFERENCE_LABEL: None}}}
    fleet.apps.patch_namespaced_deployment("unlabelled", fleet.namespace, unlabel)
    wait_for(
        lambda: (fleet.deployment("unlabelled").metadata.labels or {}).get(INFERENCE_LABEL) == "unlabelled",
        30,
        f"the Deployment's {INFERENCE_LABEL} label to be applied again",
    )
    fleet.wait_ready("unlabelled")


def test_a_network_policy_deleted_or_opened_by_hand_is_restored(fleet: Fleet, api: Any) -> None:
    """Issue 23, item 5: it was applied and never watched, so one deleted stayed gone and one opened to every
    source stayed open (7 minutes, the fleet Ready meanwhile)."""
    net = client.NetworkingV1Api(api)
    fleet.create(mmi("fenced"))
    fleet.wait_ready("fenced")
    rendered = net.read_namespaced_network_policy("fenced", fleet.namespace).to_dict()["spec"]["ingress"]

    def ingress() -> Any:
        try:
            return net.read_namespaced_network_policy("fenced", fleet.namespace).to_dict()["spec"]["ingress"]
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    net.delete_namespaced_network_policy("fenced", fleet.namespace)
    wait_for(lambda: ingress() == rendered, 30, "the deleted NetworkPolicy to be recreated as rendered")
    net.patch_namespaced_network_policy("fenced", fleet.namespace, {"spec": {"ingress": [{}]}})  # from anywhere
    wait_for(lambda: ingress() == rendered, 30, "the NetworkPolicy opened to every source to be restored")


def test_a_sidecar_host_network_or_env_var_added_by_hand_is_removed(cluster: Cluster, fleet: Fleet) -> None:
    """Issue 23, item 5: server-side apply takes back only the fields the operator applies, so fields it never renders
    stayed when added by hand. Each is removed now, in one rollout, and the Deployment then stays as rendered; a
    ``kubectl rollout restart`` is left alone."""
    fleet.create(mmi("tampered"))
    fleet.wait_ready("tampered")
    kubectl(cluster.kubeconfig, "-n", fleet.namespace, "rollout", "restart", "deployment/tampered")

    def template() -> Any:
        return fleet.deployment("tampered").to_dict()["spec"]["template"]

    restarted = "kubectl.kubernetes.io/restartedAt"
    wait_for(lambda: restarted in (template()["metadata"]["annotations"] or {}), 30, "the restart's annotation")
    rendered = template()
    service = fleet.core.read_namespaced_service("tampered", fleet.namespace).metadata.resource_version
    edits = {
        "a sidecar": {"containers": [{"name": "sidecar", "image": "example.com/evil:1"}]},
        "hostNetwork": {"hostNetwork": True},
        "a literal env var": {"containers": [{"name": "server", "env": [{"name": "EVIL", "value": "1"}]}]},
    }
    for what, edit in edits.items():
        generation = fleet.deployment("tampered").metadata.generation
        patch = json.dumps({"spec": {"template": {"spec": edit}}})
        out = kubectl(cluster.kubeconfig, "-n", fleet.namespace, "patch", "deployment", "tampered", "--type",
                      "strategic", "-p", patch, "--field-manager", "kubectl-edit")  # fmt: skip
        assert "patched" in out and "no change" not in out, what
        wait_for(lambda: template() == rendered, 30, f"{what} added by hand to be removed")
        assert fleet.deployment("tampered").metadata.generation == generation + 2  # the edit's and the repair's
    time.sleep(5)
    assert fleet.deployment("tampered").metadata.generation == generation + 2  # settled: the repair is no loop
    # Re-applied at each repair, the Service is never written: its clusterIP, the API server's, is no manager's field.
    assert fleet.core.read_namespaced_service("tampered", fleet.namespace).metadata.resource_version == service
    events = fleet.core.list_namespaced_event(fleet.namespace, field_selector="involvedObject.name=tampered").items
    removed = " ".join(e.message for e in events if e.reason == "ForeignFieldsRemoved")
    for field in ("containers[name=sidecar]", "hostNetwork", "env[name=EVIL]"):
        assert field in removed


def test_delete_removes_children_through_owner_references(fleet: Fleet) -> None:
    fleet.create(mmi("gone"))
    fleet.wait_ready("gone")
    fleet.custom.delete_namespaced_custom_object(GROUP, VERSION, fleet.namespace, PLURAL, "gone")
    wait_for(lambda: fleet.deployment("gone") is None, 60, "the garbage collector to delete the Deployment")
    pods = fleet.core.list_namespaced_pod(fleet.namespace, label_selector="mmfleet.io/inference=gone").items
    wait_for(
        lambda: not fleet.core.list_namespaced_pod(fleet.namespace, label_selector="mmfleet.io/inference=gone").items,
        60,
        f"the pods to go ({len(pods)} left)",
    )


def test_fleet_deletes_while_the_operator_is_down(fleet: Fleet, operator: OperatorProcess) -> None:
    fleet.create(mmi("orphan"))
    fleet.wait_ready("orphan")
    assert not fleet.get("orphan")["metadata"].get("finalizers")
    operator.stop()
    try:
        fleet.custom.delete_namespaced_custom_object(GROUP, VERSION, fleet.namespace, PLURAL, "orphan")

        def gone() -> bool:
            try:
                fleet.get("orphan")
            except ApiException as error:
                return error.status == 404
            return False

        wait_for(gone, 20, "the fleet to be deleted with no operator running (no finalizer holds it)")
    finally:
        operator.start()


def test_scale_subresource_sets_replicas(cluster: Cluster, fleet: Fleet) -> None:
    fleet.create(mmi("scaled"))
    fleet.wait_ready("scaled")
    kubectl(cluster.kubeconfig, "-n", fleet.namespace, "scale", "mmi/scaled", "--replicas", "3")
    fleet.wait_ready("scaled", replicas=3)
    assert fleet.deployment("scaled").spec.replicas == 3


def test_autoscaled_fleet_starts_at_min_replicas(fleet: Fleet) -> None:
    fleet.create(mmi("auto", autoscaling={"minReplicas": 2, "maxReplicas": 4, "slo": {"target": "2s"}}))
    fleet.wait_ready("auto", replicas=2)
    assert fleet.status("auto")["desiredReplicas"] == 2


def test_turning_autoscaling_on_never_drops_serving_replicas(fleet: Fleet) -> None:
    fleet.create(mmi("handover", replicas=3))
    fleet.wait_ready("handover", replicas=3)
    fleet.patch("handover", {"autoscaling": {"minReplicas": 1, "maxReplicas": 4, "slo": {"target": "2s"}}})
    seen = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        seen.append(fleet.deployment("handover").spec.replicas)
        time.sleep(0.1)
    assert min(seen) == 3, f"replicas dipped while the scaler took over: {sorted(set(seen))}"
    fleet.wait_ready("handover", replicas=3)
    # Server-side apply on the scale subresource recorded the owner although the value did not change.
    owners = [
        (f.manager, f.subresource)
        for f in fleet.deployment("handover").metadata.managed_fields
        if "f:replicas" in (f.fields_v1 or {}).get("f:spec", {})
    ]
    assert owners == [("mmfleet-autoscaler", "scale")]


def test_invalid_resource_is_rejected_by_the_api_server_with_field_path(
    cluster: Cluster, crd: None, namespace: str
) -> None:
    bad = (
        "apiVersion: mmfleet.io/v1alpha1\nkind: MultimodalInference\n"
        f"metadata: {{name: bad, namespace: {namespace}}}\n"
        "spec:\n  model: {name: m}\n  gpu: {count: 2}\n  parallelism: {tensor: 3}\n"
        "  autoscaling: {minReplicas: 5, maxReplicas: 2, slo: {target: 2s}}\n"
    )
    result = run_kubectl(cluster.kubeconfig, "apply", "-f", "-", stdin=bad)
    assert result.returncode != 0
    assert "spec.parallelism.tensor" in result.stderr
    assert "parallelism.tensor x parallelism.pipeline must equal gpu.count" in result.stderr
    assert "spec.autoscaling.minReplicas" in result.stderr


def test_spec_only_the_operator_can_judge_becomes_a_condition(fleet: Fleet) -> None:
    fleet.create(mmi("clash", backend={"extraArgs": ["--port=9000"]}))

    def failed() -> bool:
        return fleet.status("clash").get("phase") == "Failed"

    wait_for(failed, 30, "phase Failed")
    ready = fleet.condition("clash", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "spec.backend.extraArgs[0]: --port=9000 clashes with --port" in ready["message"]
    assert fleet.deployment("clash") is None


def test_gpu_request_no_node_can_fit_is_degraded_with_the_scheduler_reason(fleet: Fleet) -> None:
    fleet.create(mmi("huge", gpu={"count": 16}))
    condition = fleet.wait_condition("huge", "Degraded", status="True")
    assert condition["reason"] == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in condition["message"]
    assert fleet.status("huge")["phase"] == "Degraded"


def test_operator_killed_mid_reconcile_converges_without_duplicates(fleet: Fleet, operator: OperatorProcess) -> None:
    names = [f"crash-{i}" for i in range(8)]
    for name in names:
        fleet.create(mmi(name))
    time.sleep(0.7)
    operator.kill()
    operator.start()
    for name in names:
        fleet.wait_ready(name, timeout=90)
    deployments = fleet.apps.list_namespaced_deployment(fleet.namespace).items
    assert sorted(d.metadata.name for d in deployments) == sorted(names)
    replica_sets = fleet.apps.list_namespaced_replica_set(fleet.namespace).items
    assert len(replica_sets) == len(names)  # one rollout each: the restart re-applied the same spec
    services = fleet.core.list_namespaced_service(fleet.namespace).items
    assert len(services) == len(names)
    for deployment in deployments:
        owner = deployment.metadata.owner_references[0]
        assert fleet.get(owner.name)["metadata"]["uid"] == owner.uid
