"""A shared model cache against the real control plane: a statically bound RWX claim, mounted by every replica."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.helpers.fleet import Fleet, mmi
from tests.helpers.operator_process import OperatorProcess
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.integration

CLAIM = "models-rwx"


def make_shared_claim(core: Any, namespace: str, name: str) -> str:
    """A ReadWriteMany hostPath PV bound by name to a claim: what an admin pre-creates on EFS, Azure Files or NAS.
    Returns the PV's name (cluster-scoped: the caller deletes it)."""
    volume = f"{namespace}-{name}"
    core.create_persistent_volume(
        {
            "metadata": {"name": volume},
            "spec": {
                "capacity": {"storage": "100Gi"},
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": f"/tmp/{volume}", "type": "DirectoryOrCreate"},
                "claimRef": {"namespace": namespace, "name": name},
            },
        }
    )
    core.create_namespaced_persistent_volume_claim(
        namespace,
        {
            "metadata": {"name": name},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "volumeName": volume,
                "resources": {"requests": {"storage": "100Gi"}},
            },
        },
    )

    def bound() -> bool:
        return bool(core.read_namespaced_persistent_volume_claim(name, namespace).status.phase == "Bound")

    wait_for(bound, 30, f"{namespace}/{name} Bound")
    return volume


def delete_volume(core: Any, volume: str) -> None:
    try:
        core.delete_persistent_volume(volume)
    except ApiException as error:
        if error.status != 404:
            raise


@pytest.fixture
def shared_claim(api: Any, namespace: str) -> Iterator[str]:
    core = client.CoreV1Api(api)
    volume = make_shared_claim(core, namespace, CLAIM)
    yield CLAIM
    delete_volume(core, volume)


def test_replicas_mount_the_shared_claim_and_turn_ready(
    api: Any, namespace: str, operator: OperatorProcess, shared_claim: str
) -> None:
    fleet = Fleet(api, namespace)
    fleet.create(
        mmi("shared", replicas=2, gpu={"type": "H100"}, modelCache={"volume": "shared", "claimName": shared_claim})
    )
    fleet.wait_ready("shared", replicas=2)
    pods = fleet.core.list_namespaced_pod(namespace, label_selector="mmfleet.io/inference=shared").items
    running = [p for p in pods if p.metadata.deletion_timestamp is None]
    assert len(running) == 2
    for pod in running:
        assert pod.spec.node_name
        claims = [v.persistent_volume_claim.claim_name for v in pod.spec.volumes if v.persistent_volume_claim]
        assert claims == [shared_claim]
        mounts = {m.mount_path for m in pod.spec.containers[0].volume_mounts}
        assert "/shared-cache" in mounts
        env = {e.name: e.value for e in pod.spec.containers[0].env}
        assert env["VLLM_CACHE_ROOT"] == "/shared-cache/vllm"


def test_shared_cache_without_claim_is_rejected_by_the_api_server(api: Any, namespace: str, crd: None) -> None:
    fleet = Fleet(api, namespace)
    with pytest.raises(ApiException) as caught:
        fleet.create(mmi("noclaim", modelCache={"volume": "shared"}))
    assert caught.value.status == 422
    assert "spec.modelCache.claimName" in caught.value.body
    assert "claimName is required when volume is shared" in caught.value.body


def test_a_missing_claim_is_named_in_degraded_until_it_is_created(
    api: Any, namespace: str, operator: OperatorProcess
) -> None:
    """The pods alone would only sit Pending; the status names the field and what would work."""
    fleet = Fleet(api, namespace)
    fleet.create(mmi("late", gpu={"type": "H100"}, modelCache={"volume": "shared", "claimName": CLAIM}))
    condition = fleet.wait_condition("late", "Degraded", reason="ModelCacheClaimMissing")
    assert condition["status"] == "True"
    assert f"spec.modelCache.claimName: {CLAIM}" in condition["message"]
    assert fleet.status("late")["phase"] == "Degraded"

    core = client.CoreV1Api(api)
    volume = make_shared_claim(core, namespace, CLAIM)
    try:
        fleet.wait_ready("late")
        assert fleet.condition("late", "Degraded")["status"] == "False"
    finally:
        delete_volume(core, volume)
