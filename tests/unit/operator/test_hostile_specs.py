"""Specs the API server used to accept but the operator could not serve, and secrets and flags in the wrong place.

Each case was a finding of issue 13: it crashed ``render``, rendered a child the API server refuses (a 422 on
every reconcile), put a secret in plain text, or ran a pod as root. Now each is refused naming the field, or
rendered into children the API server accepts (``tests/integration/test_hostile_specs.py`` sends them to it).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from mmfleet import render, status
from mmfleet.api import CONDITION_MESSAGE_MAX, TRUNCATED, Condition, MultimodalInferenceStatus
from mmfleet.render import SpecError
from mmfleet.validation import parse
from tests.helpers.repo import spec_doc


def problems_of(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as caught:
        render.render(parse(doc), "generic")
    return caught.value.problems


def pod_spec(doc: dict[str, Any], cloud: str = "generic") -> dict[str, Any]:
    deployment = next(c for c in render.render(parse(doc), cloud) if c["kind"] == "Deployment")
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


# Affinity shapes that raised out of render (AttributeError, TypeError, KeyError) when affinity was free-form.
CRASHING_AFFINITIES = [
    {"nodeAffinity": "x"},
    {"nodeAffinity": []},
    {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": "x"}},
    {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": "x"}}},
    {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": ["x"]}}},
    {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchFields": 1}]}}},
    {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []}},
]


@pytest.mark.parametrize("affinity", CRASHING_AFFINITIES)
def test_an_affinity_of_the_wrong_shape_is_refused_naming_the_field(affinity: dict[str, Any]) -> None:
    lines = problems_of(spec_doc(placement={"affinity": affinity}))
    assert lines and all(line.startswith("spec.placement.affinity.nodeAffinity") for line in lines), lines


def test_affinity_nested_a_thousand_levels_deep_is_refused_not_walked() -> None:
    deep: dict[str, Any] = {}
    for _ in range(1000):
        deep = {"nodeAffinity": deep}
    lines = problems_of(spec_doc(placement={"affinity": deep}))
    assert lines[0].startswith("spec.placement.affinity.nodeAffinity.nodeAffinity: unknown field")


@pytest.mark.parametrize(
    ("placement", "field"),
    [
        ({"nodeSelector": {"bad key!": "x"}}, "spec.placement.nodeSelector"),
        ({"nodeSelector": {"pool": "not a value"}}, "spec.placement.nodeSelector.pool"),
        ({"nodeSelector": {"a" * 254 + "/x": "y"}}, "spec.placement.nodeSelector"),
        ({"tolerations": [{"operator": "Equal", "value": "x"}]}, "spec.placement.tolerations[0].operator"),
        ({"tolerations": [{"key": "k", "tolerationSeconds": 5}]}, "spec.placement.tolerations[0].effect"),
        ({"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}, "spec.placement.tolerations[0].value"),
        ({"tolerations": [{"key": "bad key"}]}, "spec.placement.tolerations[0].key"),
        (
            {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 0}]}}},
            "spec.placement.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight",
        ),
        (
            {
                "affinity": {
                    "podAntiAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {
                                "labelSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]},
                                "topologyKey": "h",
                            }
                        ]
                    }
                }
            },
            "spec.placement.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"
            ".labelSelector.matchExpressions[0].values",
        ),
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [{"matchExpressions": [{"key": "n", "operator": "Gt", "values": []}]}]
                        }
                    }
                }
            },
            "spec.placement.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
            ".matchExpressions[0].values",
        ),
    ],
)
def test_what_the_api_server_refuses_in_the_pod_is_refused_in_the_spec(placement: dict[str, Any], field: str) -> None:
    lines = problems_of(spec_doc(placement=placement))
    assert any(line.startswith(field) for line in lines), lines


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"modelCache": {"volume": "ephemeral", "storageClassName": "Fast_SSD"}}, "spec.modelCache.storageClassName"),
        ({"modelCache": {"volume": "ephemeral", "size": "0Gi"}}, "spec.modelCache.size"),
        ({"modelCache": {"size": 0}}, "spec.modelCache.size"),
        ({"model": {"name": "m", "credentialsSecret": "HF Token"}}, "spec.model.credentialsSecret"),
        ({"model": {"name": "m", "source": "pvc://My_Claim/weights"}}, "spec.model.source"),
        ({"model": {"name": "m", "servedName": "--api-key=x"}}, "spec.model.servedName"),
        ({"tracing": {"enabled": True, "endpoint": "--disable-log-stats"}}, "spec.tracing.endpoint"),
        ({"backend": {"image": " vllm/vllm-openai:v0.33.0"}}, "spec.backend.image"),
        (
            {"service": {"type": "LoadBalancer", "loadBalancerSourceRanges": ["999.0.0.0/8"]}, "cloud": "eks"},
            "spec.service.loadBalancerSourceRanges[0]",
        ),
    ],
)
def test_names_and_arguments_the_children_cannot_take_are_refused(spec: dict[str, Any], field: str) -> None:
    lines = problems_of(spec_doc(**spec))
    assert any(line.startswith(field) for line in lines), lines


def test_a_valid_user_affinity_still_narrows_the_cloud_gpu_selection() -> None:
    term = {"matchExpressions": [{"key": "example.com/pool", "operator": "In", "values": ["a"]}]}
    affinity = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}},
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 10, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}
            ]
        },
    }
    spec = pod_spec(spec_doc(gpu={"type": "H100"}, placement={"affinity": affinity}), "eks")
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms and all(term["matchExpressions"][-1]["key"] == "example.com/pool" for term in terms)
    assert spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"] == 10


@pytest.mark.parametrize(
    ("flag", "field"), [("--api-key=sk-123", "spec.apiKeySecret"), ("--hf-token", "spec.model.credentialsSecret")]
)
def test_secrets_in_extra_args_are_refused_pointing_to_the_secret_field(flag: str, field: str) -> None:
    (line,) = problems_of(spec_doc(backend={"extraArgs": [flag, "hf_x"]}))
    assert line.startswith(f"spec.backend.extraArgs[0]: {flag} is refused:")
    assert field in line


def test_api_key_comes_from_the_secret_and_never_stands_in_the_pod_spec() -> None:
    spec = pod_spec(spec_doc(apiKeySecret={"name": "qwen-key", "key": "token"}))
    env = {e["name"]: e for e in spec["containers"][0]["env"]}
    assert env["VLLM_API_KEY"] == {
        "name": "VLLM_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "qwen-key", "key": "token"}},
    }
    assert not any("api-key" in arg for arg in spec["containers"][0]["command"])


def test_tensorrt_llm_refuses_an_api_key_it_cannot_check() -> None:
    (line,) = problems_of(spec_doc(backend={"name": "tensorrt-llm"}, apiKeySecret={"name": "k", "key": "k"}))
    assert line.startswith("spec.apiKeySecret: set, but spec.backend.name: tensorrt-llm has no API-key option")


def test_a_generic_load_balancer_is_neither_public_nor_unauthenticated_by_default() -> None:
    (line,) = problems_of(spec_doc(service={"type": "LoadBalancer"}, cloud="generic"))
    assert line.startswith("spec.service.type: LoadBalancer on cloud generic would be public and unauthenticated")
    doc = spec_doc(service={"type": "LoadBalancer", "loadBalancerSourceRanges": ["10.0.0.0/8"]}, cloud="generic")
    service = next(c for c in render.render(parse(doc), "generic") if c["kind"] == "Service")
    assert service["spec"]["loadBalancerSourceRanges"] == ["10.0.0.0/8"]
    assert parse(spec_doc(service={"type": "LoadBalancer"}, apiKeySecret={"name": "k", "key": "k"}))


@pytest.mark.parametrize("backend", ["vllm", "tensorrt-llm"])
def test_inference_pods_run_non_root_without_an_api_token(backend: str) -> None:
    spec = pod_spec(spec_doc(backend={"name": backend}))
    assert spec["automountServiceAccountToken"] is False
    context = spec["containers"][0]["securityContext"]
    assert context["runAsNonRoot"] is True and context["runAsUser"] > 0
    assert spec["securityContext"]["fsGroup"] == context["runAsUser"]


def test_tensorrt_llm_gets_a_writable_tmp() -> None:
    spec = pod_spec(spec_doc(backend={"name": "tensorrt-llm"}))
    mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mounts["/tmp"]]["emptyDir"] == {}


def test_a_status_message_never_exceeds_what_the_api_server_accepts() -> None:
    problems = [f"spec.placement.nodeSelector.key{i}: {'x' * 100!r} is not accepted" for i in range(500)]
    new = status.compute_status(status.InvalidSpec(problems, 1), status.Observed(), None, datetime.now(UTC))
    ready = next(c for c in new.conditions if c.type == "Ready")
    assert len(ready.message) == CONDITION_MESSAGE_MAX and ready.message.endswith(TRUNCATED)
    assert Condition.model_validate(ready.wire()) == ready


def test_unknown_status_fields_from_another_version_do_not_fail_the_fleet() -> None:
    doc = spec_doc()
    doc["status"] = {"phase": "Ready", "shards": 3, "conditions": [{"type": "Ready", "status": "True", "extra": 1}]}
    inference = parse(doc)
    assert inference.status == MultimodalInferenceStatus.model_validate(
        {"phase": "Ready", "conditions": [{"type": "Ready", "status": "True"}]}
    )
    doc["status"] = {"phase": "Sharding"}  # a value this version does not know
    assert parse(doc).status is None


def network_policy(doc: dict[str, Any], prometheus_namespace: str | None = "monitoring") -> dict[str, Any]:
    children = render.render(parse(doc), "generic", prometheus_namespace=prometheus_namespace)
    policy: dict[str, Any] = next(c for c in children if c["kind"] == "NetworkPolicy")["spec"]
    return policy


def test_the_serving_port_admits_the_namespace_and_prometheus_only_by_default() -> None:
    policy = network_policy(spec_doc())
    assert policy["podSelector"]["matchLabels"] == render.selector_labels(parse(spec_doc()))
    assert policy["policyTypes"] == ["Ingress"]
    clients, scrapers = policy["ingress"]
    assert clients == {"ports": [{"port": "http", "protocol": "TCP"}], "from": [{"podSelector": {}}]}
    assert scrapers["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    assert len(network_policy(spec_doc(), prometheus_namespace=None)["ingress"]) == 1
    # Prometheus in the fleet's own namespace still scrapes when ingressFrom names only other clients.
    team = {"namespaceSelector": {"matchLabels": {"team": "vision"}}}
    _, scrapers = network_policy(spec_doc(networkPolicy={"ingressFrom": [team]}), prometheus_namespace="ml")["ingress"]
    assert scrapers["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ml"}}}]


def test_the_user_names_clients_and_scrapers_and_a_load_balancer_opens_the_port() -> None:
    team = {"namespaceSelector": {"matchLabels": {"team": "vision"}}, "podSelector": {}}
    doc = spec_doc(
        networkPolicy={"ingressFrom": [team], "metricsFrom": [{"namespaceSelector": {}}]},
        service={"type": "LoadBalancer", "loadBalancerSourceRanges": ["10.0.0.0/8"]},
        cloud="generic",
    )
    clients, scrapers, balancer = network_policy(doc)["ingress"]
    assert clients["from"] == [team]
    assert scrapers["from"][0] == {"namespaceSelector": {}}
    # Every source: behind SNAT no rule can tell the balancer's clients apart; its own source ranges guard them.
    assert balancer == {"ports": [{"port": "http", "protocol": "TCP"}]}


def test_a_network_peer_names_namespaces_or_pods() -> None:
    (line,) = problems_of(spec_doc(networkPolicy={"ingressFrom": [{}]}))
    assert line.startswith("spec.networkPolicy.ingressFrom[0].namespaceSelector: give namespaceSelector, podSelector")


@pytest.mark.parametrize("key", [".", ".."])
def test_a_secret_key_of_dots_alone_is_refused_naming_the_field(key: str) -> None:
    (line,) = problems_of(spec_doc(apiKeySecret={"name": "k", "key": key}))
    assert line.startswith("spec.apiKeySecret.key:") and "not '.' or '..' alone" in line, line


@pytest.mark.parametrize(
    ("model", "field", "quoted"),
    [
        ({"name": "Qwen/Qwen2.5-VL-7B\u001b[2K"}, "spec.model.name", "'\\x1b' (U+001B)"),
        ({"name": "Qwen/Qw\u0435n2.5-VL-7B-Instruct"}, "spec.model.name", "'е' (U+0435)"),
        ({"name": "Qwen/Qwen2.5-VL-7B-Instruct", "servedName": "my model"}, "spec.model.servedName", "' ' (U+0020)"),
    ],
)
def test_a_models_names_are_printable_ascii(model: dict[str, str], field: str, quoted: str) -> None:
    """Issue 23, item 9: a control character in a name rewrites the log lines that print it; a look-alike letter
    names another model than the one a reader sees. Refused naming the field, the character and what is accepted."""
    with pytest.raises(SpecError) as caught:
        parse(spec_doc(model=model))
    (problem,) = caught.value.problems
    assert problem.startswith(f"{field}: "), problem
    assert quoted in problem and "printable ASCII with no space" in problem, problem


def test_a_models_usual_names_are_accepted() -> None:
    for name in ("Qwen/Qwen2.5-VL-7B-Instruct", "/mnt/models/qwen2.5-vl", "org/model:v1.2@sha_3+x"):
        assert parse(spec_doc(model={"name": name, "servedName": name.rsplit("/", 1)[-1]})).spec.model.name == name


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"replicas": "2"}, "spec.replicas"),
        ({"replicas": 2.0}, "spec.replicas"),
        ({"tracing": {"enabled": "true"}}, "spec.tracing.enabled"),
        ({"model": {"name": 7}}, "spec.model.name"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_as_the_api_server_refuses_it(spec: dict[str, Any], field: str) -> None:
    """Issue 23, item 9: `mmfleet render` coerced what the API server's schema refuses ("2" for an integer), so a
    file it rendered could not be applied. The models take no coercion now, in the CLI and in the operator alike."""
    with pytest.raises(SpecError) as caught:
        parse(spec_doc(**spec))
    assert any(p.startswith(f"{field}: ") for p in caught.value.problems), caught.value.problems
