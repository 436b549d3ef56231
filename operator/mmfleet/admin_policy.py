"""What the cluster admin lets a MultimodalInference author make the operator do, and the check of a spec against it.

The operator creates pods, Services and ServiceAccounts with its own rights, so without this an author who may
only create MultimodalInferences could run any image, mount any Secret or claim of the namespace, take any cloud
role, tolerate every taint and open a load balancer to the world (docs/security.md). The policy is part of the
operator's settings (the chart's ``policy`` value, ``MMFLEET_POLICY``), owned by whoever installs the operator, not
by authors. Every default is closed except the images mmfleet itself pins: a fleet that names a Secret, a claim, an
identity, a toleration, a node label, another namespace's Gateway, a load balancer or a warm standby (which turns on
vLLM's unauthenticated development endpoints) is refused until the admin allows it.

Names are matched with shell-style globs (``fnmatch``: ``*`` matches any run of characters, ``/`` included).
Secrets, claims and identities are allowed per namespace, as ``<namespace glob>/<name glob>``: a Secret is a
namespace's own, and so is the trust a cloud role gives one namespace's ServiceAccounts. Gateway namespaces are
namespace globs alone: what is granted is that namespace's proxies reaching a fleet's servers, whichever fleet asks.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from fnmatch import fnmatchcase
from typing import Annotated, get_args

from pydantic import AfterValidator, Field

from mmfleet import backends
from mmfleet.api import BackendName, Model, MultimodalInference
from mmfleet.api.patterns import Cidr

SETTING = "policy"  # the chart value and, upper-cased with MMFLEET_, the environment variable
_OPEN = ("0.0.0.0/0", "::/0")  # what a load balancer with no source ranges admits


def _namespaced(value: str) -> str:
    namespace, slash, name = value.partition("/")
    if not slash or not namespace or not name:
        raise ValueError(f"{value!r} is not <namespace glob>/<name glob>, such as team-a/hf-token or */model-*")
    return value


Glob = Annotated[str, Field(min_length=1, max_length=512)]
NamespacedGlob = Annotated[str, Field(min_length=3, max_length=512), AfterValidator(_namespaced)]


def image_repository(image: str) -> str:
    """An image reference's repository with its registry, as the kubelet pulls it: ``vllm/vllm-openai:v1`` is
    ``docker.io/vllm/vllm-openai``, ``ubuntu`` is ``docker.io/library/ubuntu``; tag and digest are dropped."""
    name = image.partition("@")[0]
    last = name.rfind("/")
    if ":" in name[last + 1 :]:
        name = name[: name.rindex(":")]
    first, slash, _ = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return name
    return f"docker.io/{name}" if slash else f"docker.io/library/{name}"


def pinned_repositories() -> list[str]:
    """The repositories of the images mmfleet pins, one per backend: the default, and the one closed choice."""
    return sorted({image_repository(backends.get(name).image) for name in get_args(BackendName)})


class LoadBalancerPolicy(Model):
    """Whether a fleet may ask for a cloud load balancer, and which clients it may admit."""

    allowed: bool = Field(default=False, description="Whether spec.service.type LoadBalancer is accepted.")
    source_ranges: list[Cidr] = Field(
        default_factory=list,
        max_length=64,
        description=(
            "CIDRs each of a fleet's loadBalancerSourceRanges must lie within; a fleet with none admits every "
            "address, so it needs 0.0.0.0/0 and ::/0 here. Empty: any ranges."
        ),
    )


class AdminPolicy(Model):
    """The admin's policy for MultimodalInferences: what a fleet may name, beyond which it is refused."""

    images: list[Glob] = Field(
        default_factory=pinned_repositories,
        max_length=256,
        description="Image repositories a fleet may run, with the registry: docker.io/vllm/vllm-openai, nvcr.io/x/*.",
    )
    model_images: list[Glob] = Field(
        default_factory=list,
        max_length=256,
        description=(
            "Image repositories a fleet may mount as its weights (spec.model.source oci://...), with the registry; "
            "apart from images, so that a registry of models is not also one of servers. Default none."
        ),
    )
    secrets: list[NamespacedGlob] = Field(
        default_factory=list,
        max_length=256,
        description="Secrets a fleet may name (model credentials, API key), as namespace/name globs.",
    )
    claims: list[NamespacedGlob] = Field(
        default_factory=list,
        max_length=256,
        description="PersistentVolumeClaims a fleet may mount (model cache, pvc:// source), as namespace/name globs.",
    )
    identities: list[NamespacedGlob] = Field(
        default_factory=list,
        max_length=256,
        description="Cloud identities (role ARN, client ID, RAM role) a fleet may take, as namespace/identity globs.",
    )
    toleration_keys: list[Glob] = Field(
        default_factory=list,
        max_length=256,
        description="Taint keys a fleet may tolerate; only '*' allows a toleration with no key (every taint).",
    )
    node_label_keys: list[Glob] = Field(
        default_factory=list,
        max_length=256,
        description="Node label keys a fleet's nodeSelector and node affinity may name (metadata.name: by node name).",
    )
    gateway_namespaces: list[Glob] = Field(
        default_factory=list,
        max_length=256,
        description=(
            "Namespace globs whose Gateways a fleet may route through from another namespace "
            "(spec.routing.gateway.namespace), letting their pods reach its servers; its own is always allowed."
        ),
    )
    warm_standby_namespaces: list[Glob] = Field(
        default_factory=list,
        max_length=256,
        description=(
            "Namespace globs where a fleet may keep a warm standby (spec.autoscaling.warmStandby): its servers then "
            "run vLLM's development endpoints (/sleep, /wake_up, /collective_rpc), unguarded by any API key, for "
            "whoever reaches their port. Default none."
        ),
    )
    load_balancer: LoadBalancerPolicy = Field(
        default_factory=LoadBalancerPolicy, description="Whether and from where a fleet may have a load balancer."
    )


def _matches(value: str, patterns: list[str]) -> bool:
    return any(fnmatchcase(value, pattern) for pattern in patterns)


def _list(patterns: list[str]) -> str:
    return "[" + ", ".join(patterns) + "]" if patterns else "[] (nothing)"


def _refusal(field: str, value: str, setting: str, patterns: list[str], shown: str = "") -> str:
    return (
        f"{field}: {value!r}{shown} is not allowed by the operator's policy: {SETTING}.{setting} is "
        f"{_list(patterns)}; ask the cluster admin to add it"
    )


def _named(inference: MultimodalInference) -> Iterator[tuple[str, str, str]]:
    """(field, value, setting) of each Secret, claim and identity the spec names."""
    spec = inference.spec
    if spec.model.credentials_secret:
        yield "spec.model.credentialsSecret", spec.model.credentials_secret, "secrets"
    if spec.api_key_secret is not None:
        yield "spec.apiKeySecret.name", spec.api_key_secret.name, "secrets"
    if spec.model_cache.claim_name:
        yield "spec.modelCache.claimName", spec.model_cache.claim_name, "claims"
    scheme, _, rest = spec.model.resolved_source().partition("://")
    if scheme == "pvc":  # the weights' claim, mounted read-only (render._model_placement)
        yield "spec.model.source", rest.partition("/")[0], "claims"
    identity = spec.identity
    for field, value in (
        ("awsRoleArn", identity.aws_role_arn),
        ("azureClientId", identity.azure_client_id),
        ("alibabaRoleName", identity.alibaba_role_name),
    ):
        if value:
            yield f"spec.identity.{field}", value, "identities"


def _node_label_keys(inference: MultimodalInference) -> Iterator[tuple[str, str]]:
    """(field, key) of each node label the spec's placement requires or prefers."""
    placement = inference.spec.placement
    for key in placement.node_selector:
        yield "spec.placement.nodeSelector", key
    node = placement.affinity.node_affinity
    if node is None:
        return
    where = "spec.placement.affinity.nodeAffinity"
    terms = []
    if node.required_during_scheduling_ignored_during_execution is not None:
        required = node.required_during_scheduling_ignored_during_execution.node_selector_terms
        terms += [(f"{where}.requiredDuringSchedulingIgnoredDuringExecution", term) for term in required]
    preferred = node.preferred_during_scheduling_ignored_during_execution
    terms += [(f"{where}.preferredDuringSchedulingIgnoredDuringExecution", p.preference) for p in preferred]
    for field, term in terms:
        for expression in term.match_expressions:
            yield field, expression.key
        for selector in term.match_fields:
            yield field, selector.key


def _outside(ranges: list[str], allowed: list[str]) -> list[str]:
    """The ranges that lie within none of ``allowed``."""
    networks = [ipaddress.ip_network(a, strict=False) for a in allowed]
    out = []
    for text in ranges:
        network = ipaddress.ip_network(text, strict=False)
        if not any(network.version == a.version and network.subnet_of(a) for a in networks):  # type: ignore[arg-type]
            out.append(text)
    return out


def refusals(inference: MultimodalInference, policy: AdminPolicy) -> list[str]:
    """Every field of the spec the policy does not allow, each naming the value and the setting that would."""
    spec, namespace = inference.spec, inference.metadata.namespace
    found = []
    image = spec.backend.image or backends.get(spec.backend.name).image
    repository = image_repository(image)
    if not _matches(repository, policy.images):
        field = "spec.backend.image" if spec.backend.image else "spec.backend.name"
        found.append(_refusal(field, image, "images", policy.images, f" (repository {repository})"))
    scheme, _, reference = spec.model.resolved_source().partition("://")
    # An oci:// source is an image the node pulls, with its credentials, and mounts into the server.
    if scheme == "oci":
        weights = image_repository(reference)
        if not _matches(weights, policy.model_images):
            shown = f" (repository {weights})"
            found.append(_refusal("spec.model.source", reference, "modelImages", policy.model_images, shown))
    for field, value, setting in _named(inference):
        patterns: list[str] = getattr(policy, setting)
        if not _matches(f"{namespace}/{value}", patterns):
            found.append(_refusal(field, value, setting, patterns, f" in namespace {namespace}"))
    keys = policy.toleration_keys
    for index, toleration in enumerate(spec.placement.tolerations):
        key = toleration.key or ""
        if not _matches(key, keys):
            shown = "" if key else " (no key: tolerates every taint)"
            found.append(_refusal(f"spec.placement.tolerations[{index}].key", key, "tolerationKeys", keys, shown))
    for field, key in _node_label_keys(inference):
        if not _matches(key, policy.node_label_keys):
            found.append(_refusal(field, key, "nodeLabelKeys", policy.node_label_keys))
    # Another namespace's Gateway opens the fleet's NetworkPolicy to that namespace's pods (render._front_door_peers).
    other = spec.routing.gateway.namespace if spec.routing.gateway is not None else None
    if other is not None and other != namespace and not _matches(other, policy.gateway_namespaces):
        field, shown = "spec.routing.gateway.namespace", f" (not the fleet's own, {namespace})"
        found.append(_refusal(field, other, "gatewayNamespaces", policy.gateway_namespaces, shown))
    # A sleeping server is paused and woken through endpoints with no API key in front (docs/security.md).
    if spec.standby is not None and not _matches(namespace, policy.warm_standby_namespaces):
        found.append(
            f"spec.autoscaling.warmStandby: {{replicas: {spec.standby.replicas}}} in namespace {namespace!r} is not "
            f"allowed by the operator's policy: {SETTING}.warmStandbyNamespaces is "
            f"{_list(policy.warm_standby_namespaces)} (it turns on vLLM's development endpoints, which no API key "
            "guards); remove warmStandby or ask the cluster admin to add the namespace"
        )
    balancer = policy.load_balancer
    if spec.service.type == "LoadBalancer":
        if not balancer.allowed:
            found.append(
                f"spec.service.type: 'LoadBalancer' is not allowed by the operator's policy: "
                f"{SETTING}.loadBalancer.allowed is false; use ClusterIP or ask the cluster admin"
            )
        elif balancer.source_ranges:
            asked = spec.service.load_balancer_source_ranges
            outside = _outside(asked or list(_OPEN), balancer.source_ranges)
            if outside:
                field = "spec.service.loadBalancerSourceRanges"
                shown = ", ".join(outside) + ("" if asked else " (none given: every address)")
                found.append(
                    f"{field}: {shown} not within the operator's policy: {SETTING}.loadBalancer.sourceRanges is "
                    f"{_list(balancer.source_ranges)}; narrow the ranges or ask the cluster admin"
                )
    return found
