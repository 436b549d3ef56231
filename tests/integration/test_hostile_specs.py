"""What the API server accepts, the operator serves: proved against kube-apiserver 1.34's own validation.

Tricky specs the CRD admits are rendered and every child is sent with ``kubectl apply --dry-run=server`` (and each
inference pod, as a Pod, to a namespace that enforces Pod Security "restricted"): the API server must accept all.
Specs whose children it would refuse must be refused already by the CRD, naming the field.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml
from kubernetes import client

from mmfleet import render
from mmfleet.api import CONDITION_MESSAGE_MAX, TRUNCATED
from mmfleet.validation import parse
from mmfleet_lab.cluster import Cluster
from mmfleet_lab.cluster.kubectl import run_kubectl
from tests.helpers.fleet import Fleet, mmi
from tests.helpers.large import largest_affinity
from tests.helpers.operator_process import OperatorProcess

pytestmark = pytest.mark.integration

TERM = {"matchExpressions": [{"key": "example.com/pool", "operator": "In", "values": ["a", "b"]}]}
AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [TERM, {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]
        },
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 100,
                "preference": {"matchExpressions": [{"key": "gpu-mem", "operator": "Gt", "values": ["40"]}]},
            }
        ],
    },
    "podAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {
                "labelSelector": {"matchLabels": {"app": "cache"}},
                "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "Exists"}]},
                "topologyKey": "topology.kubernetes.io/zone",
            }
        ]
    },
    "podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "podAffinityTerm": {"namespaces": ["ml"], "topologyKey": "kubernetes.io/hostname"}}
        ]
    },
}
ACCEPTED: dict[str, dict[str, Any]] = {
    "typed-placement": {
        "gpu": {"type": "H100"},
        "placement": {
            "nodeSelector": {"example.com/tier": "gold", "plain": ""},
            "tolerations": [
                {"operator": "Exists"},
                {"key": "k", "operator": "Equal", "value": "v", "effect": "NoExecute", "tolerationSeconds": 30},
            ],
            "affinity": AFFINITY,
        },
    },
    "trtllm-ephemeral": {
        "backend": {"name": "tensorrt-llm"},
        "modelCache": {"volume": "ephemeral", "storageClassName": "fast.ssd-1"},
        "model": {"name": "m", "source": "pvc://weights.v2/llava", "credentialsSecret": "hf.token"},
    },
    "api-key-load-balancer": {
        "cloud": "generic",
        "apiKeySecret": {"name": "qwen-key", "key": "api.key"},
        "service": {"type": "LoadBalancer", "loadBalancerSourceRanges": ["10.0.0.0/8", "fd00::/8"]},
        "networkPolicy": {
            "ingressFrom": [{"namespaceSelector": {"matchLabels": {"team": "vision"}}, "podSelector": {}}],
            "metricsFrom": [{"namespaceSelector": {}}],
        },
        "tracing": {"enabled": True, "endpoint": "http://collector.obs:4317"},
    },
}
REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    # Issue 23, item 9: a control character rewrites the log lines that print the name; a look-alike letter names
    # another model than the one a reader sees.
    "model-name-control": ({"model": {"name": "Qwen/Qwen2.5-VL-7B\u001b[2K"}}, "spec.model.name"),
    "model-name-homoglyph": ({"model": {"name": "Qwen/Qw\u0435n2.5-VL-7B-Instruct"}}, "spec.model.name"),
    "served-name-space": (
        {"model": {"name": "Qwen/Qwen2.5-VL-7B-Instruct", "servedName": "my model"}},
        "spec.model.servedName",
    ),
    "node-selector-value": (
        {"placement": {"nodeSelector": {"pool": "not a value"}}},
        "spec.placement.nodeSelector.pool",
    ),
    "toleration-no-key": (
        {"placement": {"tolerations": [{"operator": "Equal", "value": "x"}]}},
        "spec.placement.tolerations[0].operator",
    ),
    "toleration-seconds": (
        {"placement": {"tolerations": [{"key": "k", "tolerationSeconds": 5}]}},
        "spec.placement.tolerations[0].effect",
    ),
    "empty-node-term": (
        {"placement": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}}},
        "spec.placement.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms",
    ),
    "node-field-key": (
        {
            "placement": {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchFields": [{"key": "spec.unschedulable", "operator": "In", "values": ["x"]}]}
                            ]
                        }
                    }
                }
            }
        },
        "matchFields[0].key",
    ),
    "deep-affinity": ({"placement": {"affinity": {"nodeAffinity": {"nodeAffinity": {}}}}}, "nodeAffinity"),
    "storage-class": (
        {"modelCache": {"volume": "ephemeral", "storageClassName": "Fast_SSD"}},
        "spec.modelCache.storageClassName",
    ),
    "cache-size-zero": ({"modelCache": {"volume": "ephemeral", "size": "0"}}, "spec.modelCache.size"),
    "credentials-secret": ({"model": {"name": "m", "credentialsSecret": "HF Token"}}, "spec.model.credentialsSecret"),
    "pvc-claim": ({"model": {"name": "m", "source": "pvc://My_Claim/w"}}, "spec.model.source"),
    "served-name-flag": ({"model": {"name": "m", "servedName": "--api-key=x"}}, "spec.model.servedName"),
    "source-range": (
        {"service": {"type": "LoadBalancer", "loadBalancerSourceRanges": ["999.0.0.0/8"]}, "cloud": "eks"},
        "spec.service.loadBalancerSourceRanges[0]",
    ),
    "public-lb": ({"cloud": "generic", "service": {"type": "LoadBalancer"}}, "spec.service.type"),
    "empty-network-peer": ({"networkPolicy": {"ingressFrom": [{}]}}, "spec.networkPolicy.ingressFrom[0]"),
    "trtllm-api-key": (
        {"backend": {"name": "tensorrt-llm"}, "apiKeySecret": {"name": "k", "key": "k"}},
        "spec.apiKeySecret",
    ),
    # Found by the fuzzer (tests/integration/test_fuzz.py, seed 13): the key pattern admits '..', secretKeyRef does not.
    "dot-dot-secret-key": ({"apiKeySecret": {"name": "k", "key": ".."}}, "spec.apiKeySecret.key"),
    # Issue 23, item 2: every string, list and map is bounded, and the API server says which bound.
    "long-string": ({"backend": {"extraArgs": ["--x=" + "a" * 1021]}}, "spec.backend.extraArgs[0]"),
    "long-list": ({"placement": {"tolerations": [{"operator": "Exists"}] * 33}}, "spec.placement.tolerations"),
    "long-quantity": ({"resources": {"memory": "1" * 65}}, "spec.resources.memory"),
    "many-labels": ({"placement": {"nodeSelector": {f"k{i}": "v" for i in range(17)}}}, "spec.placement.nodeSelector"),
    "long-label-key": ({"placement": {"nodeSelector": {"k" * 318: "v"}}}, "spec.placement.nodeSelector"),
    "many-terms": (
        {
            "placement": {
                "affinity": {
                    "podAntiAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname"}]
                        * 5
                    }
                }
            }
        },
        "spec.placement.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution",
    ),
}


def resource(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    spec = {"model": {"name": "Qwen/Qwen2.5-VL-7B-Instruct"}, **spec}
    return {
        "apiVersion": "mmfleet.io/v1alpha1",
        "kind": "MultimodalInference",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


@pytest.fixture
def restricted(api: Any, namespace: str) -> str:
    """The test namespace, with Pod Security "restricted" enforced by the API server's admission."""
    client.CoreV1Api(api).patch_namespace(
        namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
    )
    return namespace


@pytest.mark.parametrize("name", sorted(ACCEPTED))
@pytest.mark.parametrize("cloud", ["generic", "eks", "aks", "ack"])
def test_children_of_an_accepted_spec_are_accepted_by_the_api_server(
    cluster: Cluster, crd: None, restricted: str, name: str, cloud: str
) -> None:
    doc = resource(name, restricted, ACCEPTED[name])
    created = run_kubectl(cluster.kubeconfig, "apply", "--dry-run=server", "-f", "-", stdin=json.dumps(doc))
    assert created.returncode == 0, created.stderr
    children = render.render(parse(doc), cloud, monitoring_crds=False, prometheus_namespace="monitoring")
    assert "NetworkPolicy" in {c["kind"] for c in children}
    result = run_kubectl(cluster.kubeconfig, "apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump_all(children))
    assert result.returncode == 0, f"{name} on {cloud}: {result.stderr}"
    deployment = next(c for c in children if c["kind"] == "Deployment")
    template = deployment["spec"]["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{name}-pod", "namespace": restricted, "labels": template["metadata"]["labels"]},
        # The ServiceAccount is a child that a dry run does not create; Pod Security does not look at it.
        "spec": {**template["spec"], "serviceAccountName": "default"},
    }
    admitted = run_kubectl(cluster.kubeconfig, "apply", "--dry-run=server", "-f", "-", stdin=json.dumps(pod))
    assert admitted.returncode == 0, f"{name} on {cloud}, Pod Security restricted: {admitted.stderr}"
    assert "would violate PodSecurity" not in admitted.stderr


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_spec_whose_children_the_api_server_would_refuse_is_refused_naming_the_field(
    cluster: Cluster, crd: None, namespace: str, name: str
) -> None:
    spec, field = REFUSED[name]
    document = json.dumps(resource(name, namespace, spec))
    result = run_kubectl(cluster.kubeconfig, "apply", "--dry-run=server", "-f", "-", stdin=document)
    assert result.returncode != 0, f"{name} was accepted"
    assert field in result.stderr, result.stderr


@pytest.fixture
def fleet(api: Any, namespace: str, operator: OperatorProcess) -> Fleet:
    return Fleet(api, namespace)


def test_what_the_crd_admits_but_the_operator_cannot_serve_becomes_a_condition_within_the_size_limit(
    fleet: Fleet,
) -> None:
    """Label keys' pattern in maps is judged by the operator only (no CEL: the cost budget); 512 bad ones, ~200 KB
    of problems, still give a status the API server stores, cut at 32 KiB, and nothing is rendered."""
    keys = {f"{'k' * 250}/bad key {i}!": "v" for i in range(16)}
    term = {"labelSelector": {"matchLabels": keys}, "namespaceSelector": {"matchLabels": keys}, "topologyKey": "k"}
    terms = {
        "requiredDuringSchedulingIgnoredDuringExecution": [term] * 4,
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "podAffinityTerm": term}] * 4,
    }
    spec = {"placement": {"affinity": {"podAffinity": terms, "podAntiAffinity": terms}}}
    fleet.create(mmi("bad-keys", **spec))
    ready = fleet.wait_condition("bad-keys", "Ready", status="False", reason="InvalidSpec")
    assert len(ready["message"]) == CONDITION_MESSAGE_MAX and ready["message"].endswith(TRUNCATED)
    assert ready["message"].startswith(
        "spec.placement.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].labelSelector"
        ".matchLabels"
    )
    assert "is not a label key; accepted:" in ready["message"]
    assert fleet.status("bad-keys")["phase"] == "Failed"
    assert fleet.deployment("bad-keys") is None


def test_a_spec_whose_deployment_would_be_too_large_to_store_is_refused_once_naming_the_field(
    fleet: Fleet, operator: OperatorProcess
) -> None:
    """Issue 23, item 2: the API server accepts the largest affinity its schema allows (~450 KB); the Deployment it
    would make is over 256 KiB, so the operator applies nothing and says which field and the limit, once: the
    refusal is not retried (before: an apply refused for its size, retried for ever)."""
    fleet.create(mmi("huge", placement={"affinity": largest_affinity()}))
    ready = fleet.wait_condition("huge", "Ready", status="False", reason="InvalidSpec")
    assert ready["message"].startswith("spec.placement.affinity: its ")
    assert "over the 262,144 (256 KiB) a child of a MultimodalInference may take" in ready["message"]
    assert fleet.deployment("huge") is None
    logged = operator.log.read_text(errors="replace")
    time.sleep(5)
    again = operator.log.read_text(errors="replace")[len(logged) :]
    assert "huge" not in again and "Traceback" not in again, again
    assert fleet.condition("huge", "Ready")["lastTransitionTime"] == ready["lastTransitionTime"]
