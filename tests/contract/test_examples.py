"""Every example parses, renders on every cloud, and each object is valid Kubernetes of the version we target."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from mmfleet import render
from mmfleet.admin_policy import AdminPolicy, refusals
from mmfleet.validation import parse
from tests.helpers.repo import EXAMPLES, K8S_VERSION, ROOT, load_example

CLOUDS = ["eks", "aks", "ack", "generic"]
CRD_GROUPS = ("monitoring.coreos.com", "inference.networking.k8s.io", "gateway.networking.k8s.io")


def test_there_are_examples_for_each_backend_and_cloud() -> None:
    docs = [load_example(p) for p in EXAMPLES]
    assert {d["spec"].get("backend", {}).get("name", "vllm") for d in docs} == {"vllm", "tensorrt-llm"}
    assert {"eks", "aks", "ack"} <= {d["spec"].get("cloud", "auto") for d in docs}


@pytest.mark.parametrize("cloud", CLOUDS)
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_renders_valid_kubernetes(path: Path, cloud: str) -> None:
    inference = parse(load_example(path))
    for child in render.render(inference, cloud, monitoring_crds=True):
        if child["apiVersion"].split("/")[0] in CRD_GROUPS:
            continue  # not in the core OpenAPI: the fuzz has the API server validate them against their released CRDs
        kubernetes_validate.validate(child, K8S_VERSION, strict=True)


def test_the_examples_admin_policy_serves_every_example_and_the_shipped_policy_refuses_what_they_name() -> None:
    """examples/admin/policy.yaml is what an admin grants for the examples: with it every one is served; without it
    (the chart's closed default) each that names a Secret, claim, identity, another namespace's Gateway or load balancer
    is refused."""
    values = yaml.safe_load((ROOT / "examples" / "admin" / "policy.yaml").read_text())
    granted = AdminPolicy.model_validate(values["policy"])
    refused = {}
    for path in EXAMPLES:
        inference = parse(load_example(path))
        assert refusals(inference, granted) == [], path.name
        refused[path.name] = sorted({line.split(":", 1)[0] for line in refusals(inference, AdminPolicy())})
    assert refused == {
        "internvl-ack.yaml": ["spec.model.credentialsSecret"],
        "llama-vision-trtllm-aks.yaml": ["spec.model.credentialsSecret", "spec.service.type"],
        "minimal.yaml": [],
        "qwen-vl-eks.yaml": ["spec.identity.awsRoleArn", "spec.model.credentialsSecret"],
        "qwen-vl-encode-tier.yaml": [],
        "qwen-vl-oci-weights.yaml": ["spec.model.source"],
        "qwen-vl-routed.yaml": ["spec.routing.gateway.namespace"],
        "qwen-vl-scale-to-zero.yaml": [],
        "qwen-vl-shared-cache.yaml": ["spec.model.credentialsSecret", "spec.modelCache.claimName"],
        "qwen-vl-warm-standby.yaml": ["spec.autoscaling.warmStandby"],
    }
