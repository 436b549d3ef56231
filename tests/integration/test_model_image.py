"""An oci:// model source: the weights come as an OCI image volume (Kubernetes' ImageVolume), which the real API
server accepts in the Deployment the operator applies, and the fleet's pods run with it mounted read-only."""

from __future__ import annotations

import pytest

from tests.helpers.fleet import Fleet, mmi

pytestmark = pytest.mark.integration

REFERENCE = "registry.example.com/models/qwen2.5-vl-7b:v1"


def test_an_oci_source_becomes_an_image_volume_the_pods_run_with(fleet: Fleet) -> None:
    fleet.create(mmi("imaged", model={"name": "Qwen/Qwen2.5-VL-7B-Instruct", "source": f"oci://{REFERENCE}"}))
    fleet.wait_ready("imaged")
    pods = fleet.core.list_namespaced_pod(fleet.namespace, label_selector="mmfleet.io/inference=imaged").items
    assert pods
    for pod in pods:
        volume = next(v for v in pod.spec.volumes if v.name == "model")
        assert (volume.image.reference, volume.image.pull_policy) == (REFERENCE, "IfNotPresent")
        server = pod.spec.containers[0]
        assert server.command[:3] == ["vllm", "serve", "/models/image"]
        mount = next(m for m in server.volume_mounts if m.name == "model")
        assert (mount.mount_path, mount.read_only) == ("/models/image", True)
