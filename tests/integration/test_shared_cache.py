"""A shared model cache against the real control plane: a statically bound RWX claim, mounted by every replica."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.integration.operator_process import OperatorProcess, wait_for
from tests.integration.test_operator import Fleet, mmi

pytestmark = pytest.mark.integration

CLAIM = "models-rwx"


@pytest.fixture
def shared_claim(api: Any, namespace: str) -> Iterator[str]:
    """A ReadWriteMany hostPath PV bound by name to a claim: what an admin pre-creates on EFS, Azure Files or NAS."""
    core = client.CoreV1Api(api)
    volume = f"{namespace}-{CLAIM}"
    core.create_persistent_volume(
        {
            "metadata": {"name": volume},
            "spec": {
                "capacity": {"storage": "100Gi"},
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": f"/tmp/{volume}", "type": "DirectoryOrCreate"},
                "claimRef": {"namespace": namespace, "name": CLAIM},
            },
        }
    )
    core.create_namespaced_persistent_volume_claim(
        namespace,
        {
            "metadata": {"name": CLAIM},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "volumeName": volume,
                "resources": {"requests": {"storage": "100Gi"}},
            },
        },
    )

    def bound() -> bool:
        return core.read_namespaced_persistent_volume_claim(CLAIM, namespace).status.phase == "Bound"

    wait_for(bound, 30, f"{namespace}/{CLAIM} Bound")
    yield CLAIM
    try:
        core.delete_persistent_volume(volume)
    except ApiException as error:
        if error.status != 404:
            raise


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
