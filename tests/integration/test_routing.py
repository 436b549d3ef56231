"""Routing mode inferencePool on the lab cluster, with the Gateway API Inference Extension's released CRDs: without
them the fleet serves through its Service and says why there is no pool; with them it gets its InferencePool and
endpoint picker, and loses them when it returns to mode service."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from mmfleet_lab.cluster.inference_extension import INFERENCE_POOL_CRD, inference_extension_crds
from tests.helpers.chart import crd_served_to
from tests.helpers.fleet import Fleet, mmi
from tests.helpers.operator_process import OperatorProcess
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.integration

POOL = {"mode": "inferencePool"}
POOL_API = ("inference.networking.k8s.io", "v1")
PICKER_KINDS = ("Deployment", "Service", "ServiceAccount", "ConfigMap", "RoleBinding")


def test_without_the_inference_pool_crd_the_fleet_serves_through_its_service_and_says_so(fleet: Fleet) -> None:
    fleet.create(mmi("nopool", routing=POOL))
    fleet.wait_ready("nopool")
    routing = fleet.wait_condition("nopool", "RoutingReady", status="False", reason="InferencePoolCRDMissing")
    assert "install the Gateway API Inference Extension's CRDs (v1.5.0)" in routing["message"]
    with pytest.raises(ApiException) as missing:
        fleet.apps.read_namespaced_deployment("nopool-epp", fleet.namespace)
    assert missing.value.status == 404


@pytest.fixture
def operator_with_pool_crd(api: Any, operator: OperatorProcess) -> Iterator[OperatorProcess]:
    with crd_served_to(api, operator, inference_extension_crds() / f"{INFERENCE_POOL_CRD}.yaml") as restarted:
        yield restarted


def test_a_fleet_in_pool_mode_gets_its_pool_and_picker_and_loses_them_in_service_mode(
    operator_with_pool_crd: OperatorProcess, fleet: Fleet, api: Any
) -> None:
    custom, rbac = client.CustomObjectsApi(api), client.RbacAuthorizationV1Api(api)
    fleet.create(mmi("pooled", routing=POOL))
    fleet.wait_ready("pooled")
    # kwok makes the picker's pod Ready like any other: the condition follows its Deployment.
    fleet.wait_condition("pooled", "RoutingReady", status="True", reason="PickerReady", timeout=90)
    assert fleet.status("pooled")["routing"] == {"pool": "pooled", "picker": "pooled-epp", "pickerReady": True}
    pool = custom.get_namespaced_custom_object(*POOL_API, fleet.namespace, "inferencepools", "pooled")
    assert pool["spec"]["selector"]["matchLabels"]["mmfleet.io/inference"] == "pooled"
    assert pool["spec"]["endpointPickerRef"]["name"] == "pooled-epp"
    binding = rbac.read_namespaced_role_binding("pooled-epp", fleet.namespace)
    assert binding.role_ref.name == "mmfleet-endpoint-picker"
    picker = fleet.apps.read_namespaced_deployment("pooled-epp", fleet.namespace)
    assert picker.spec.template.spec.containers[0].image.endswith("/epp:v1.5.0")
    # The fleet's own Deployment is still the one its status reads.
    assert (
        fleet.status("pooled")["selector"] == "mmfleet.io/inference=pooled,app.kubernetes.io/component=inference-server"
    )

    fleet.patch("pooled", {"routing": {"mode": "service"}})

    def gone() -> bool:
        reads = [
            lambda: fleet.apps.read_namespaced_deployment("pooled-epp", fleet.namespace),
            lambda: fleet.core.read_namespaced_service("pooled-epp", fleet.namespace),
            lambda: fleet.core.read_namespaced_service_account("pooled-epp", fleet.namespace),
            lambda: fleet.core.read_namespaced_config_map("pooled-epp", fleet.namespace),
            lambda: rbac.read_namespaced_role_binding("pooled-epp", fleet.namespace),
            lambda: custom.get_namespaced_custom_object(*POOL_API, fleet.namespace, "inferencepools", "pooled"),
        ]
        for read in reads:
            try:
                read()
            except ApiException as error:
                if error.status != 404:
                    raise
                continue
            return False
        return True

    wait_for(gone, 60, "the pool and its picker pruned after the return to mode service")
    fleet.wait_ready("pooled")
    assert "routing" not in fleet.status("pooled")
    assert not [c for c in fleet.status("pooled")["conditions"] if c["type"] == "RoutingReady"]


def test_a_renamed_picker_cluster_role_rebinds_the_picker(
    operator_with_pool_crd: OperatorProcess, fleet: Fleet, api: Any
) -> None:
    """The install's picker ClusterRole renamed (kustomize to Helm, another release name): the API server refuses any
    change to a RoleBinding's roleRef, so the operator replaces the binding rather than being refused for ever."""
    rbac = client.RbacAuthorizationV1Api(api)

    def bound_to() -> str | None:
        """The binding's ClusterRole; None between the old binding's deletion and the new one's creation."""
        try:
            return str(rbac.read_namespaced_role_binding("rebound-epp", fleet.namespace).role_ref.name)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    fleet.create(mmi("rebound", routing=POOL))
    fleet.wait_condition("rebound", "RoutingReady", status="True", reason="PickerReady", timeout=90)
    assert bound_to() == "mmfleet-endpoint-picker"
    operator_with_pool_crd.stop()
    operator_with_pool_crd.env["MMFLEET_PICKER_CLUSTER_ROLE"] = "ops-endpoint-picker"
    try:
        operator_with_pool_crd.start()
        fleet.patch("rebound", {"backend": {"maxNumSeqs": 64}})  # a new generation: every child applied again
        wait_for(
            lambda: bound_to() == "ops-endpoint-picker",
            60,
            lambda: f"the picker's RoleBinding bound to the renamed ClusterRole\n{operator_with_pool_crd.tail()}",
        )
        fleet.wait_ready("rebound")
        assert "ApplyRefused" not in str(fleet.status("rebound")["conditions"])
    finally:  # operator_with_pool_crd restarts it as the test ends
        del operator_with_pool_crd.env["MMFLEET_PICKER_CLUSTER_ROLE"]
