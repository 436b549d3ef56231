"""The API server (the CRD's CEL rules) and the operator's parser agree on spec.multimodal's and
spec.disaggregation.encode's cross-field rules: vllm settings only, shm's shared buffer with one API server process
only, no encode tier for a text-only fleet or one that scales to zero, an encode tier autoscaled only on a share of
an SLO on ttft or e2e (issue 27)."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from mmfleet.render import SpecError
from mmfleet.validation import parse
from mmfleet_lab.cluster import Cluster
from mmfleet_lab.cluster.kubectl import run_kubectl

pytestmark = pytest.mark.integration


def resource(namespace: str, spec: str) -> str:
    return (
        "apiVersion: mmfleet.io/v1alpha1\nkind: MultimodalInference\n"
        f"metadata: {{name: mm, namespace: {namespace}}}\nspec: {spec}\n"
    )


def dry_run(cluster: Cluster, text: str) -> subprocess.CompletedProcess[str]:
    return run_kubectl(cluster.kubeconfig, "apply", "--dry-run=server", "-f", "-", stdin=text)


@pytest.mark.parametrize(
    ("spec", "field", "says"),
    [
        (
            "{model: {name: m}, backend: {name: tensorrt-llm}, multimodal: {apiServers: 2}}",
            "spec.multimodal",
            "multimodal is a vllm setting",
        ),
        (
            "{model: {name: m}, multimodal: {processorCache: {type: shm}, apiServers: 2}}",
            "spec.multimodal.processorCache.type",
            "processorCache.type shm works with one API server process",
        ),
        (
            "{model: {name: m}, backend: {name: tensorrt-llm}, disaggregation: {encode: {}}}",
            "spec.disaggregation.encode",
            "needs vllm's encoder disaggregation",
        ),
        (
            "{model: {name: m}, multimodal: {limitPerPrompt: {image: 0, video: 0, audio: 0}}, "
            "disaggregation: {encode: {replicas: 2}}}",
            "spec.disaggregation.encode",
            "a text-only fleet has nothing to encode",
        ),
        (
            "{model: {name: m}, routing: {mode: inferencePool}, disaggregation: {encode: {}}, "
            "autoscaling: {minReplicas: 0, slo: {target: 2s}}}",
            "spec.disaggregation.encode",
            "the encode tier keeps its replicas",
        ),
        (
            "{model: {name: m}, backend: {attention: flash-attn-3}, gpu: {type: H100}, "
            "disaggregation: {encode: {gpu: {type: L4}}}}",
            "spec.disaggregation.encode.gpu.type",
            "flash-attn-3 runs on the encode tier too",
        ),
        (
            "{model: {name: m}, disaggregation: {encode: {autoscaling: {maxReplicas: 4}}}}",
            "spec.disaggregation.encode.autoscaling",
            "needs spec.autoscaling enabled with an SLO on ttft or e2e",
        ),
        (
            "{model: {name: m}, autoscaling: {slo: {metric: itl, target: 50ms}}, "
            "disaggregation: {encode: {autoscaling: {share: 0.3}}}}",
            "spec.disaggregation.encode.autoscaling",
            "an SLO on ttft or e2e",
        ),
    ],
)
def test_what_the_api_server_refuses_the_operator_refuses_too_naming_the_field(
    cluster: Cluster, crd: None, namespace: str, spec: str, field: str, says: str
) -> None:
    text = resource(namespace, spec)
    result = dry_run(cluster, text)
    assert result.returncode != 0, result.stdout
    assert field in result.stderr and says in result.stderr, result.stderr
    with pytest.raises(SpecError) as caught:
        parse(yaml.safe_load(text))
    assert caught.value.problems[0].startswith(field), caught.value.problems


@pytest.mark.parametrize(
    "spec",
    [
        "{model: {name: m}, multimodal: {processorCache: {type: shm, sizeGiB: 2.5}, apiServers: 1}}",
        "{model: {name: m}, multimodal: {processorCache: {type: shm}}}",
        "{model: {name: m}, multimodal: {processorCache: {type: shm}, apiServers: null}}",  # null: unset
        "{model: {name: m}, multimodal: {processorCache: {sizeGiB: 8}, apiServers: 4, encoderTensorParallel: data, "
        "largestItem: {image: {width: 1280, height: 720}, video: {frames: 32}}}}",
        "{model: {name: m}, backend: {name: tensorrt-llm}, multimodal: {}}",
        "{model: {name: m}, disaggregation: {encode: {replicas: 3, gpu: {count: 2, type: L4}, cacheGiB: 0.5}}}",
        "{model: {name: m}, multimodal: {limitPerPrompt: {image: 0, video: 0}}, disaggregation: {encode: {}}}",
        "{model: {name: m}, routing: {mode: inferencePool}, disaggregation: {encode: {}}, "
        "autoscaling: {minReplicas: 0, enabled: false}}",
        "{model: {name: m}, backend: {name: tensorrt-llm}, disaggregation: {}}",
        "{model: {name: m}, backend: {attention: flash-attn-3}, gpu: {type: H100}, disaggregation: {encode: {}}}",
        "{model: {name: m}, autoscaling: {slo: {metric: ttft, target: 1s}}, "
        "disaggregation: {encode: {replicas: 2, autoscaling: {minReplicas: 2, maxReplicas: 6, share: 0.3}}}}",
        "{model: {name: m}, autoscaling: {slo: {target: 8s}}, disaggregation: {encode: {autoscaling: {}}}}",
    ],
)
def test_what_the_operator_serves_the_api_server_accepts(
    cluster: Cluster, crd: None, namespace: str, spec: str
) -> None:
    text = resource(namespace, spec)
    parse(yaml.safe_load(text))
    result = dry_run(cluster, text)
    assert result.returncode == 0, result.stderr
