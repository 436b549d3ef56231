"""Every example parses, renders on every cloud, and each object is valid Kubernetes of the version we target."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest

from mmfleet import render
from mmfleet.validation import parse
from tests.helpers.repo import EXAMPLES, K8S_VERSION, load_example

CLOUDS = ["eks", "aks", "ack", "generic"]


def test_there_are_examples_for_each_backend_and_cloud() -> None:
    docs = [load_example(p) for p in EXAMPLES]
    assert {d["spec"].get("backend", {}).get("name", "vllm") for d in docs} == {"vllm", "tensorrt-llm"}
    assert {"eks", "aks", "ack"} <= {d["spec"].get("cloud", "auto") for d in docs}


@pytest.mark.parametrize("cloud", CLOUDS)
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_renders_valid_kubernetes(path: Path, cloud: str) -> None:
    inference = parse(load_example(path))
    for child in render.render(inference, cloud, monitoring_crds=True):
        if child["apiVersion"].startswith("monitoring.coreos.com"):
            continue  # not in the core OpenAPI; its shape is covered by the unit tests
        kubernetes_validate.validate(child, K8S_VERSION, strict=True)
