"""Property-based: any spec the models accept renders valid Kubernetes; any they reject says where and why."""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mmfleet import render
from mmfleet.render import SpecError
from mmfleet.validation import parse
from tests.helpers.repo import K8S_VERSION

# A problem line: a field path rooted at the document, then what is wrong.
PROBLEM = re.compile(r"^(spec|metadata|kind|apiVersion)(\.[A-Za-z0-9]+|\[\d+\])*: .+")


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


gpu_types = st.sampled_from(["T4", "A10G", "L4", "L40S", "A100", "H100", "H200", "H20", "GH200", "B200", "X1"])
durations = st.sampled_from(["2s", "500ms", "1m", "90s", "2", "fast", "0.5s"])
quantities = st.sampled_from(["200Gi", "1Ti", 1000000, "10Gi", "lots"])

specs = st.fixed_dictionaries(
    {"model": st.fixed_dictionaries({"name": st.sampled_from(["Qwen/Qwen2.5-VL-7B-Instruct", "m", ""])})},
    optional={
        "backend": st.fixed_dictionaries(
            {},
            optional={
                "name": st.sampled_from(["vllm", "tensorrt-llm", "sglang"]),
                "attention": st.sampled_from(["auto", "flash-attn-3", "flash-attn-2", "flashinfer", "triton"]),
                "kvCacheDtype": st.sampled_from(["auto", "fp8", "fp8_e5m2", "nvfp4", "int3"]),
                "maxNumSeqs": st.integers(-1, 5000),
                "maxModelLen": st.integers(0, 2_000_000),
                "gpuMemoryUtilization": st.floats(-0.5, 1.5, allow_nan=False),
                "chunkedPrefill": st.booleans(),
                "extraArgs": st.lists(
                    st.sampled_from(["--enforce-eager", "--port=1", "--trust-remote-code"]), max_size=2
                ),
            },
        ),
        "gpu": st.fixed_dictionaries({}, optional={"count": st.integers(0, 20), "type": gpu_types}),
        "parallelism": st.fixed_dictionaries({}, optional={"tensor": st.integers(0, 9), "pipeline": st.integers(1, 4)}),
        "multimodal": st.fixed_dictionaries(
            {}, optional={"limitPerPrompt": st.fixed_dictionaries({}, optional={"image": st.integers(-1, 300)})}
        ),
        "cloud": st.sampled_from(["auto", "eks", "aks", "ack", "generic", "gcp"]),
        "replicas": st.integers(-1, 5),
        "autoscaling": st.fixed_dictionaries(
            {},
            optional={
                "enabled": st.booleans(),
                "minReplicas": st.integers(0, 10),
                "maxReplicas": st.integers(0, 10),
                "slo": st.fixed_dictionaries(
                    {"target": durations},
                    optional={"metric": st.sampled_from(["e2e", "ttft", "itl", "tpot"]), "window": durations},
                ),
            },
        ),
        "tracing": st.fixed_dictionaries({}, optional={"enabled": st.booleans(), "sampleRatio": st.floats(-1, 2)}),
        "modelCache": st.fixed_dictionaries(
            {},
            optional={
                "size": quantities,
                "volume": st.sampled_from(["emptyDir", "ephemeral", "shared", "hostPath"]),
                "claimName": st.sampled_from(["models-rwx", "Models_RWX", ""]),
            },
        ),
        "service": st.fixed_dictionaries(
            {}, optional={"type": st.sampled_from(["ClusterIP", "LoadBalancer", "NodePort"])}
        ),
    },
)


def document(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "mmfleet.io/v1alpha1", "kind": "MultimodalInference", "metadata": {"name": "p"}, "spec": spec}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs, st.sampled_from(["eks", "aks", "ack", "generic"]))
def test_accepted_specs_render_valid_objects_and_rejected_ones_say_where(spec: dict[str, Any], cloud: str) -> None:
    try:
        inference = parse(document(spec))
    except SpecError as error:
        assert error.problems
        for line in error.problems:
            assert PROBLEM.match(line), line
        return
    for child in render.render(inference, cloud, monitoring_crds=True):
        if child["apiVersion"].startswith("monitoring.coreos.com"):
            continue
        kubernetes_validate.validate(child, K8S_VERSION, strict=True)
