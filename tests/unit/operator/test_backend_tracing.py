"""The OTel variables both backends' pods get with tracing on, as the SDK and the kubelet will read them."""

from __future__ import annotations

import os
from typing import Any
from unittest import mock

import pytest
from opentelemetry.sdk.resources import Resource

from mmfleet import clouds, render
from mmfleet.api import MultimodalInference
from tests.helpers.repo import spec_doc

BACKENDS = ("vllm", "tensorrt-llm")


def container(backend: str, cloud: str = "aks", **tracing: Any) -> dict[str, Any]:
    doc = spec_doc(
        model={"name": "meta-llama/Llama-3.2-11B-Vision-Instruct,v2"},  # a comma, which must not split the list
        backend={"name": backend},
        tracing={"enabled": True, **tracing},
    )
    deployment = render.build_deployment(MultimodalInference.model_validate(doc), clouds.get(cloud))
    found: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return found


def kubelet_env(env: list[dict[str, Any]], pod: dict[str, str]) -> dict[str, str]:
    """The environment as the kubelet builds it: fieldRefs from the pod, $(VAR) of earlier variables expanded."""
    out: dict[str, str] = {}
    for item in env:
        if "valueFrom" in item:
            out[item["name"]] = pod[item["valueFrom"]["fieldRef"]["fieldPath"]]
            continue
        value = item["value"]
        for name, known in out.items():
            value = value.replace(f"$({name})", known)
        out[item["name"]] = value
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_sdk_in_the_pod_sees_the_resource_a_span_should_carry(backend: str) -> None:
    env = kubelet_env(container(backend)["env"], {"metadata.namespace": "ml", "metadata.name": "qwen-7f9-abcde"})
    with mock.patch.dict(os.environ, env, clear=True):
        attributes = dict(Resource.create({}).attributes)  # what TensorRT-LLM's TracerProvider() builds
    assert attributes["k8s.namespace.name"] == "ml"
    assert attributes["k8s.pod.name"] == "qwen-7f9-abcde"
    assert attributes["mmfleet.inference"] == "qwen"
    assert attributes["mmfleet.model"] == "meta-llama/Llama-3.2-11B-Vision-Instruct,v2"
    assert attributes["mmfleet.backend"] == backend
    assert attributes["mmfleet.cloud"] == "aks"
    assert attributes["service.name"] == "qwen"


@pytest.mark.parametrize("backend", BACKENDS)
def test_sampling_is_parent_based_at_the_spec_ratio(backend: str) -> None:
    from opentelemetry.sdk.trace import sampling

    env = kubelet_env(container(backend, sampleRatio=0.3)["env"], {"metadata.namespace": "ml", "metadata.name": "p"})
    with mock.patch.dict(os.environ, env, clear=True):
        sampler = sampling._get_from_env_or_default()
    assert isinstance(sampler, sampling.ParentBased)
    assert "TraceIdRatioBased{0.3}" in sampler.get_description()


def test_vllm_spawns_its_engine_core_with_tracing_on_and_only_then() -> None:
    env = {e["name"]: e.get("value") for e in container("vllm")["env"]}
    assert env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    doc = spec_doc(tracing={"enabled": False})
    off = render.build_deployment(MultimodalInference.model_validate(doc), clouds.get("aks"))
    names = {e["name"] for e in off["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "VLLM_WORKER_MULTIPROC_METHOD" not in names and "OTEL_RESOURCE_ATTRIBUTES" not in names
