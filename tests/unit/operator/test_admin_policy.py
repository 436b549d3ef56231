"""The admin's policy: what an author who may only create MultimodalInferences can make the operator create.

Issue 23's attack: such an author got a pod running an image of their choice, with another application's Secret in
its environment, any claim, any cloud role, tolerating every taint, behind a LoadBalancer open to 0.0.0.0/0. With
the shipped (closed) policy each is refused, naming the field, the value and the setting that would allow it.
"""

from __future__ import annotations

from typing import Any

import pytest

from mmfleet.admin_policy import AdminPolicy, image_repository, refusals
from mmfleet.api import MultimodalInference, ReadyReason
from mmfleet.handlers import records
from mmfleet.validation import PolicyDeniedError, parse
from tests.helpers.operator_state import RecordingKube, fleet_body, operator, reconcile_once, refused_ready

NAMESPACE = "team-a"
ALL_OF_IT: dict[str, Any] = {
    "model": {"name": "Qwen/Qwen2.5-VL-7B-Instruct", "credentialsSecret": "payments-db"},
    "backend": {"image": "evil.example.com/miner:1"},
    "apiKeySecret": {"name": "other-app", "key": "token"},
    "modelCache": {"volume": "shared", "claimName": "finance-archive"},
    "identity": {"awsRoleArn": "arn:aws:iam::123456789012:role/cluster-admin"},
    "placement": {
        "tolerations": [{"operator": "Exists"}],
        "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}
                    ]
                }
            }
        },
    },
    "service": {"type": "LoadBalancer", "loadBalancerSourceRanges": ["0.0.0.0/0"]},
}


def inference(spec: dict[str, Any], namespace: str = NAMESPACE) -> MultimodalInference:
    return parse({
        "apiVersion": "mmfleet.io/v1alpha1",
        "kind": "MultimodalInference",
        "metadata": {"name": "qwen", "namespace": namespace},
        "spec": spec,
    })  # fmt: skip


def fields(found: list[str]) -> list[str]:
    return [line.split(":", 1)[0] for line in found]


def test_the_shipped_policy_refuses_every_escalation_of_the_attack_naming_field_value_and_setting() -> None:
    found = refusals(inference(ALL_OF_IT), AdminPolicy())
    assert fields(found) == [
        "spec.backend.image",
        "spec.model.credentialsSecret",
        "spec.apiKeySecret.name",
        "spec.modelCache.claimName",
        "spec.identity.awsRoleArn",
        "spec.placement.tolerations[0].key",
        "spec.placement.nodeSelector",
        "spec.placement.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution",
        "spec.service.type",
    ]
    assert found[0] == (
        "spec.backend.image: 'evil.example.com/miner:1' (repository evil.example.com/miner) is not allowed by the "
        "operator's policy: policy.images is [docker.io/vllm/vllm-openai, nvcr.io/nvidia/tensorrt-llm/release]; "
        "ask the cluster admin to add it"
    )
    assert "'payments-db' in namespace team-a" in found[1] and "policy.secrets is [] (nothing)" in found[1]
    assert "(no key: tolerates every taint)" in found[5] and "policy.tolerationKeys" in found[5]
    assert "'metadata.name'" in found[7] and "policy.nodeLabelKeys" in found[7]
    assert "policy.loadBalancer.allowed is false" in found[8]


def test_the_shipped_policy_serves_a_fleet_that_names_nothing_of_anyone_elses() -> None:
    assert refusals(inference({"model": {"name": "Qwen/Qwen2.5-VL-7B-Instruct"}}), AdminPolicy()) == []
    trtllm = {"model": {"name": "meta-llama/Llama-3.2-11B-Vision-Instruct"}, "backend": {"name": "tensorrt-llm"}}
    assert refusals(inference(trtllm), AdminPolicy()) == []
    retagged = {"model": {"name": "m"}, "backend": {"image": "docker.io/vllm/vllm-openai:nightly"}}
    assert refusals(inference(retagged), AdminPolicy()) == []


def test_what_the_admin_allows_is_served_and_only_in_the_namespaces_it_names() -> None:
    policy = AdminPolicy.model_validate({
        "images": ["evil.example.com/*"],
        "secrets": ["team-a/payments-db", "*/other-app"],
        "claims": ["team-a/finance-*"],
        "identities": ["team-a/arn:aws:iam::123456789012:role/*"],
        "tolerationKeys": ["*"],
        "nodeLabelKeys": ["node-role.kubernetes.io/*", "metadata.name"],
        "loadBalancer": {"allowed": True},
    })  # fmt: skip
    assert refusals(inference(ALL_OF_IT), policy) == []
    elsewhere = refusals(inference(ALL_OF_IT, namespace="team-b"), policy)
    assert fields(elsewhere) == [
        "spec.model.credentialsSecret",
        "spec.modelCache.claimName",
        "spec.identity.awsRoleArn",
    ]


@pytest.mark.parametrize(
    ("asked", "refused"),
    [
        (["10.1.0.0/16"], None),
        (["10.1.0.0/16", "192.168.0.0/24"], "192.168.0.0/24"),
        (["0.0.0.0/0"], "0.0.0.0/0"),
        ([], "0.0.0.0/0, ::/0 (none given: every address)"),
        (["fd00::/64"], "fd00::/64"),
    ],
)
def test_a_load_balancer_admits_only_clients_within_the_policys_ranges(asked: list[str], refused: str | None) -> None:
    policy = AdminPolicy.model_validate({"loadBalancer": {"allowed": True, "sourceRanges": ["10.0.0.0/8"]}})
    spec = {
        "model": {"name": "m"},
        "cloud": "eks",  # internal load balancers: no ranges is accepted by the spec's own rules
        "service": {"type": "LoadBalancer", "loadBalancerSourceRanges": asked},
    }
    found = refusals(inference(spec), policy)
    if refused is None:
        assert found == []
    else:
        assert found == [
            f"spec.service.loadBalancerSourceRanges: {refused} not within the operator's policy: "
            "policy.loadBalancer.sourceRanges is [10.0.0.0/8]; narrow the ranges or ask the cluster admin"
        ]


def test_a_claim_named_as_the_models_source_is_a_claim_the_policy_must_allow() -> None:
    spec = {"model": {"name": "llava", "source": "pvc://finance-archive/llava"}}
    [line] = refusals(inference(spec), AdminPolicy())
    assert line.startswith("spec.model.source: 'finance-archive' in namespace team-a is not allowed")
    assert "policy.claims" in line
    assert refusals(inference(spec), AdminPolicy.model_validate({"claims": ["team-a/finance-*"]})) == []


def test_an_oci_model_image_is_an_image_the_policy_must_allow() -> None:
    spec = {"model": {"name": "llava", "source": "oci://registry.internal/finance/llava:v2"}}
    [line] = refusals(inference(spec), AdminPolicy())
    assert line.startswith("spec.model.source: 'registry.internal/finance/llava:v2' (repository ")
    assert "policy.modelImages" in line
    allowed = AdminPolicy.model_validate({"modelImages": ["registry.internal/finance/*"]})
    assert refusals(inference(spec), allowed) == []
    as_server = AdminPolicy.model_validate({"images": [*AdminPolicy().images, "registry.internal/finance/*"]})
    assert fields(refusals(inference(spec), as_server)) == ["spec.model.source"], "a server image is not a model's"


def test_a_toleration_of_every_taint_needs_the_star_and_a_named_key_does_not_allow_it() -> None:
    spec = {"model": {"name": "m"}, "placement": {"tolerations": [{"operator": "Exists"}, {"key": "nvidia.com/gpu"}]}}
    named = AdminPolicy.model_validate({"tolerationKeys": ["nvidia.com/*"]})
    assert fields(refusals(inference(spec), named)) == ["spec.placement.tolerations[0].key"]
    assert refusals(inference(spec), AdminPolicy.model_validate({"tolerationKeys": ["*"]})) == []


def routed(namespace: str | None) -> dict[str, Any]:
    gateway = {"name": "inference"} if namespace is None else {"name": "inference", "namespace": namespace}
    return {"model": {"name": "m"}, "routing": {"mode": "inferencePool", "gateway": gateway}}


def test_a_gateway_in_another_namespace_is_refused_naming_field_value_and_setting() -> None:
    """Its namespace's pods would reach the fleet's servers through the fleet's NetworkPolicy."""
    assert refusals(inference(routed("kube-system")), AdminPolicy()) == [
        "spec.routing.gateway.namespace: 'kube-system' (not the fleet's own, team-a) is not allowed by the operator's "
        "policy: policy.gatewayNamespaces is [] (nothing); ask the cluster admin to add it"
    ]
    other = AdminPolicy.model_validate({"gatewayNamespaces": ["gateways"]})
    [line] = refusals(inference(routed("kube-system")), other)
    assert "policy.gatewayNamespaces is [gateways]" in line


@pytest.mark.parametrize("namespace", [None, NAMESPACE])
def test_a_gateway_in_the_fleets_own_namespace_is_always_allowed(namespace: str | None) -> None:
    assert refusals(inference(routed(namespace)), AdminPolicy()) == []


def test_a_gateway_in_another_namespace_is_allowed_when_a_glob_matches_it() -> None:
    policy = AdminPolicy.model_validate({"gatewayNamespaces": ["gateways", "edge-*"]})
    assert refusals(inference(routed("gateways")), policy) == []
    assert refusals(inference(routed("edge-eu")), policy) == []
    assert fields(refusals(inference(routed("payments")), policy)) == ["spec.routing.gateway.namespace"]


@pytest.mark.parametrize(
    ("image", "repository"),
    [
        ("vllm/vllm-openai:v0.33.0", "docker.io/vllm/vllm-openai"),
        ("ubuntu", "docker.io/library/ubuntu"),
        ("localhost:5000/team/server:1", "localhost:5000/team/server"),
        ("registry.example.com:443/a/b@sha256:" + "0" * 64, "registry.example.com:443/a/b"),
        ("nvcr.io/nvidia/tensorrt-llm/release:1.0.0", "nvcr.io/nvidia/tensorrt-llm/release"),
    ],
)
def test_an_image_is_judged_by_its_repository_and_registry_as_the_kubelet_pulls_it(image: str, repository: str) -> None:
    assert image_repository(image) == repository


def test_an_image_that_only_looks_like_an_allowed_one_is_refused() -> None:
    for image in ("docker.io/vllm/vllm-openai-evil:1", "evil.io/docker.io/vllm/vllm-openai:1", "vllm/vllm-openai/x"):
        spec = {"model": {"name": "m"}, "backend": {"image": image}}
        assert fields(refusals(inference(spec), AdminPolicy())) == ["spec.backend.image"], image


def test_a_denied_fleet_gets_policy_denied_on_ready_and_a_warning_and_nothing_is_applied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    posted: list[tuple[str, str]] = []
    monkeypatch.setattr(records, "kopf_event", lambda body, type_, reason, message: posted.append((type_, reason)))
    body = fleet_body(generation=1)
    body["spec"]["model"]["credentialsSecret"] = "payments-db"
    ready = refused_ready(body)
    assert (ready["status"], ready["reason"]) == ("False", ReadyReason.POLICY_DENIED)
    assert ready["message"].startswith("spec.model.credentialsSecret: 'payments-db' in namespace")
    assert ("Warning", "PolicyDenied") in posted


def test_the_same_fleet_is_served_once_the_admin_allows_its_secret() -> None:
    kube = RecordingKube()
    body = fleet_body(generation=1)
    body["spec"]["model"]["credentialsSecret"] = "payments-db"
    op = operator(kube, policy=AdminPolicy.model_validate({"secrets": ["*/payments-db"]}))
    assert reconcile_once(op, body).outcome == "ok"
    assert {child["kind"] for child in kube.applied} >= {"Deployment", "Service"}


def test_parse_without_a_policy_checks_none_and_with_one_raises_policy_denied() -> None:
    document = {
        "apiVersion": "mmfleet.io/v1alpha1",
        "kind": "MultimodalInference",
        "metadata": {"name": "qwen", "namespace": NAMESPACE},
        "spec": ALL_OF_IT,
    }
    assert parse(document).spec.backend.image == "evil.example.com/miner:1"
    with pytest.raises(PolicyDeniedError) as raised:
        parse(document, AdminPolicy())
    assert len(raised.value.problems) == 9


def standby(namespace: str = NAMESPACE) -> MultimodalInference:
    spec = {
        "model": {"name": "m"},
        "routing": {"mode": "inferencePool"},
        "autoscaling": {"slo": {"target": "2s"}, "warmStandby": {"replicas": 2}},
    }
    return inference(spec, namespace=namespace)


def test_a_warm_standby_is_refused_by_default_naming_the_field_and_the_setting() -> None:
    """Its servers run vLLM's development endpoints, which no API key guards: the admin opts in per namespace."""
    assert refusals(standby(), AdminPolicy()) == [
        "spec.autoscaling.warmStandby: {replicas: 2} in namespace 'team-a' is not allowed by the operator's policy: "
        "policy.warmStandbyNamespaces is [] (nothing) (it turns on vLLM's development endpoints, which no API key "
        "guards); remove warmStandby or ask the cluster admin to add the namespace"
    ]


def test_a_warm_standby_is_served_only_in_the_namespaces_the_admin_names() -> None:
    policy = AdminPolicy.model_validate({"warmStandbyNamespaces": ["team-*"]})
    assert refusals(standby(), policy) == []
    assert fields(refusals(standby(namespace="payments"), policy)) == ["spec.autoscaling.warmStandby"]
