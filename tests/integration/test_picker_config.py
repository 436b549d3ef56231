"""Every configuration the operator renders for an endpoint picker is one the real picker accepts: the Gateway API
Inference Extension's EPP v1.5.0, built from its Go module (``ensure_epp``), started on each against the lab cluster
with the InferencePool CRD served. It decodes its configuration strictly, so an unknown field, plugin or reference
would end it, naming what it refused (``Failed to parse configuration``).

The picker binds its metrics, health and ext_proc servers to every interface (no flag says otherwise), so the test
holds those three ports on 127.0.0.1 first: the picker then loads its configuration, contacts the cluster, and ends
when it cannot listen, before it serves anything.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from mmfleet import render
from mmfleet.validation import parse
from mmfleet_lab.cluster import Cluster, ensure_epp
from mmfleet_lab.cluster.crds import install_crd
from mmfleet_lab.cluster.inference_extension import INFERENCE_POOL_CRD, inference_extension_crds
from tests.helpers.chart import not_terminating
from tests.helpers.repo import spec_doc
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.integration

SPECS = {
    "vllm": {},
    "tensorrt-llm": {"backend": {"name": "tensorrt-llm"}},
    "slo-and-capacity": {"autoscaling": {"slo": {"target": "2s"}, "capacityPerReplica": 4.5}},
    "long-prompts": {"backend": {"maxModelLen": 131072}},
}


@pytest.fixture(scope="module")
def pool_crd(api: Any) -> Iterator[None]:
    body = yaml.safe_load((inference_extension_crds() / f"{INFERENCE_POOL_CRD}.yaml").read_text())
    install_crd(api, body, "mmfleet-tests", timeout=30)
    yield
    client.ApiextensionsV1Api(api).delete_custom_resource_definition(body["metadata"]["name"])
    wait_for(lambda: not_terminating(api, body["metadata"]["name"]), 120, "the InferencePool CRD's deletion")


@contextlib.contextmanager
def held_ports(count: int) -> Iterator[list[int]]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for held in sockets:
            held.bind(("127.0.0.1", 0))
            held.listen()
        yield [held.getsockname()[1] for held in sockets]
    finally:
        for held in sockets:
            held.close()


def picker_command(child: dict[str, Any], config: Path, ports: list[int]) -> list[str]:
    """The rendered container's arguments, with the configuration at ``config`` and the ports held."""
    args: list[str] = list(child["spec"]["template"]["spec"]["containers"][0]["args"])
    for flag, value in zip(("--config-file", "--grpc-port", "--grpc-health-port", "--metrics-port"),
                           (str(config), *map(str, ports)), strict=True):  # fmt: skip
        args[args.index(flag) + 1] = value
    return [str(ensure_epp()), *args]


@pytest.mark.parametrize("name", list(SPECS))
def test_the_real_picker_accepts_the_rendered_configuration(
    name: str, cluster: Cluster, pool_crd: None, tmp_path: Path
) -> None:
    doc = spec_doc(routing={"mode": "inferencePool"}, **SPECS[name])
    children = {(c["kind"], c["metadata"]["name"]): c for c in render.render(parse(doc), "generic")}
    config = tmp_path / "config.yaml"
    config.write_text(children["ConfigMap", "qwen-epp"]["data"]["config.yaml"])
    with held_ports(3) as ports:
        done = subprocess.run(
            picker_command(children["Deployment", "qwen-epp"], config, ports),
            env={"KUBECONFIG": str(cluster.kubeconfig), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    lines = [json.loads(line) for line in done.stderr.splitlines() + done.stdout.splitlines() if line.startswith("{")]
    said = [line.get("msg", "") for line in lines]
    log = "\n".join(json.dumps(line)[:400] for line in lines)
    assert "Failed to parse configuration" not in said, log
    assert "loaded configuration from file/text successfully" in said, log
    assert "Initializing experimental Flow Control layer" in said, log  # the feature gate was read
    assert done.returncode != 0 and "address already in use" in log, log  # it stopped at the held ports
