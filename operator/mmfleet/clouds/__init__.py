"""Cloud profiles: how GPU nodes, identity, storage, load balancers and tracing look on each cloud.

A profile is data plus pure functions; ``detect`` picks one from the nodes' ``providerID``s.
The four cloud modules hold only data (label keys, instance types, annotations, exporter
config); the one ``Profile`` dataclass below turns that data into manifests, so a fix to how
affinity or identity is built lands on every cloud at once.

Shared facts (sources):

- ``nvidia.com/gpu`` is the resource the NVIDIA device plugin registers for whole GPUs
  (NVIDIA/k8s-device-plugin ``internal/lm/resource.go``: ``fullGPUResourceName``).
- ``nvidia.com/gpu.product`` is set by GPU feature discovery (GPU Operator) to the NVML device
  name with spaces replaced by dashes (same file, ``productLabel``). ``NVIDIA_PRODUCTS`` lists
  the values seen on real nodes: Tesla-T4, NVIDIA-A10, NVIDIA-L4, NVIDIA-L40S,
  NVIDIA-A100-SXM4-80GB, NVIDIA-A100-80GB-PCIe, NVIDIA-A100-PCIE-40GB, NVIDIA-H100-80GB-HBM3,
  NVIDIA-H200-NVL, NVIDIA-GH200-480GB (a 247-node ``kubectl get nodes -l nvidia.com/gpu.product``
  dump of the NRP Nautilus cluster); NVIDIA-A10G (a g5.xlarge node dump); A100-SXM4-40GB (the
  GFD README example, older drivers). NVIDIA-A100-SXM4-40GB, NVIDIA-H200, NVIDIA-B200,
  NVIDIA-H20, NVIDIA-H100-PCIe appear only in third-party configs; NVIDIA-H100-NVL is
  UNCONFIRMED (derived from the NVML name "NVIDIA H100 NVL").
- Workload identity needs no default service account token, so inference pods mount none
  (``automountServiceAccountToken: false``): the IRSA webhook injects its own projected ``aws-iam-token``
  volume (aws/amazon-eks-pod-identity-webhook ``pkg/handler/handler.go`` @0048675f), Azure's its own
  ``azure-identity-token`` (Azure/azure-workload-identity ``pkg/webhook/webhook.go`` @0042363d,
  ``addProjectedVolume``); ACK RRSA's webhook does the same per its docs (source not read: UNCONFIRMED).
- The usual GPU taint is ``nvidia.com/gpu:NoSchedule``; no cloud here adds it by itself, but
  Karpenter/EKS node pools and GPU Operator installs conventionally do, so every profile
  tolerates it.
"""

from __future__ import annotations

import copy
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from mmfleet.api import PROFILE_NAMES, GpuSpec, GpuType, IdentitySpec, ProfileName

JsonObj = dict[str, object]

GPU_RESOURCE = "nvidia.com/gpu"
GFD_PRODUCT_LABEL = "nvidia.com/gpu.product"
# The collector the kustomize base installs (it forwards to the cloud's tracing service): the default of the
# operator's setting collector_endpoint (mmfleet.config), which the chart sets to where its collector really is.
COLLECTOR_ENDPOINT = "http://mmfleet-otel-collector.mmfleet-system.svc:4317"
GPU_TAINT_TOLERATION: Mapping[str, str] = MappingProxyType(
    {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
)

# NVML product names as GPU feature discovery and ACK label them (see the module docstring).
NVIDIA_PRODUCTS: Mapping[GpuType, tuple[str, ...]] = MappingProxyType(
    {
        "T4": ("Tesla-T4",),
        "A10": ("NVIDIA-A10",),
        "A10G": ("NVIDIA-A10G",),
        "L4": ("NVIDIA-L4",),
        "L40S": ("NVIDIA-L40S",),
        "A100": (
            "NVIDIA-A100-SXM4-80GB",
            "NVIDIA-A100-SXM4-40GB",
            "NVIDIA-A100-80GB-PCIe",
            "NVIDIA-A100-PCIE-40GB",
            "A100-SXM4-40GB",
        ),
        "H100": ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe", "NVIDIA-H100-NVL"),
        "H200": ("NVIDIA-H200", "NVIDIA-H200-NVL"),
        "H20": ("NVIDIA-H20",),
        "GH200": ("NVIDIA-GH200-480GB",),
        "B200": ("NVIDIA-B200",),
    }
)


@dataclass(frozen=True)
class IdentityWiring:
    """What workload identity adds to the ServiceAccount and to the pod template."""

    service_account_annotations: dict[str, str]
    pod_labels: dict[str, str]


class CloudProfile(Protocol):
    @property
    def name(self) -> ProfileName: ...

    @property
    def gpu_resource(self) -> str: ...

    @property
    def storage_class(self) -> str | None: ...

    @property
    def internal_lb_annotations(self) -> Mapping[str, str]: ...

    @property
    def tracing_endpoint(self) -> str: ...

    def gpu_node_affinity(self, gpu: GpuSpec) -> JsonObj | None:
        """A required nodeAffinity that lands pods on nodes with this GPU, or None for any node."""

    def gpu_tolerations(self) -> list[JsonObj]:
        """Tolerations for the taints this cloud's GPU nodes carry."""

    def identity(self, identity: IdentitySpec) -> IdentityWiring:
        """Workload identity wiring; empty when the spec names no identity for this cloud."""

    def owns_provider_id(self, provider_id: str) -> bool:
        """Whether a node providerID comes from this cloud."""

    def collector_exporter(self) -> JsonObj:
        """The collector's ``exporters:`` and ``extensions:`` that send traces to this cloud's service."""


@dataclass(frozen=True)
class GpuSelector:
    """One nodeSelectorTerm: ``key In values[gpu.type]``, ANDed with fixed ``key In [value]`` labels."""

    key: str
    values: Mapping[GpuType, tuple[str, ...]]
    fixed: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def term(self, gpu_type: GpuType) -> JsonObj | None:
        """The term, or None when this cloud has no node with this GPU under this label."""
        values = self.values.get(gpu_type)
        if not values:
            return None
        expressions: list[JsonObj] = [{"key": k, "operator": "In", "values": [v]} for k, v in self.fixed.items()]
        expressions.append({"key": self.key, "operator": "In", "values": list(values)})
        return {"matchExpressions": expressions}


GFD_SELECTOR = GpuSelector(key=GFD_PRODUCT_LABEL, values=NVIDIA_PRODUCTS)


@dataclass(frozen=True)
class IdentityRule:
    """Which IdentitySpec field this cloud reads, and where its value goes."""

    value: Callable[[IdentitySpec], str | None]
    service_account_annotation: str
    pod_labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


# eq=False: profiles are singletons compared by identity, and their mapping fields are unhashable.
@dataclass(frozen=True, kw_only=True, eq=False)
class Profile:
    """A cloud as data; implements ``CloudProfile``."""

    name: ProfileName
    gpu_selectors: tuple[GpuSelector, ...]
    provider_id_pattern: str | None
    exporter: Mapping[str, object]
    storage_class: str | None = None
    internal_lb_annotations: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    extra_tolerations: tuple[Mapping[str, str], ...] = ()
    identity_rule: IdentityRule | None = None
    gpu_resource: str = GPU_RESOURCE
    tracing_endpoint: str = COLLECTOR_ENDPOINT

    def gpu_node_affinity(self, gpu: GpuSpec) -> JsonObj | None:
        if gpu.type is None:
            return None
        terms = [t for t in (s.term(gpu.type) for s in self.gpu_selectors) if t is not None]
        if not terms:
            return None
        return {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}

    def gpu_tolerations(self) -> list[JsonObj]:
        return [dict(t) for t in (GPU_TAINT_TOLERATION, *self.extra_tolerations)]

    def identity(self, identity: IdentitySpec) -> IdentityWiring:
        rule = self.identity_rule
        value = rule.value(identity) if rule else None
        if rule is None or not value:
            return IdentityWiring(service_account_annotations={}, pod_labels={})
        return IdentityWiring(
            service_account_annotations={rule.service_account_annotation: value},
            pod_labels=dict(rule.pod_labels),
        )

    def owns_provider_id(self, provider_id: str) -> bool:
        return self.provider_id_pattern is not None and re.fullmatch(self.provider_id_pattern, provider_id) is not None

    def collector_exporter(self) -> JsonObj:
        return copy.deepcopy(dict(self.exporter))


def profiles() -> dict[str, Profile]:
    """One profile per name in ``mmfleet.api.ProfileName``, each from the module of that name."""
    from importlib import import_module

    return {name: import_module(f"{__name__}.{name}").PROFILE for name in PROFILE_NAMES}


def get(name: str) -> Profile:
    return profiles()[name]


def detect(provider_ids: Iterable[str]) -> ProfileName:
    """The cloud most nodes run on; generic when none is recognised (kind, bare metal, kwok)."""
    candidates = [p for p in profiles().values() if p.name != "generic"]
    votes: Counter[ProfileName] = Counter()
    for provider_id in provider_ids:
        for profile in candidates:
            if provider_id and profile.owns_provider_id(provider_id):
                votes[profile.name] += 1
                break
    return votes.most_common(1)[0][0] if votes else "generic"
