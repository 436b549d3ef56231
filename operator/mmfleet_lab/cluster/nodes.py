"""Fake GPU nodes that look like each cloud's GPU node pools, for kwok to keep Ready.

Labels come from ``gpu_node_labels``, i.e. exactly what each cloud profile's ``gpu_node_affinity``
selects, so a rendered fleet schedules here as it would on EKS, AKS or ACK; ``providerID``s come
from ``provider_id`` so ``clouds.detect`` recognises the cloud.

Nodes are created with their status in the POST (the API server keeps status on Node create),
and kwok's node-initialize stage keeps the capacity, allocatable and addresses given here, adding the port of
its kubelet API.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, get_args

from mmfleet import clouds
from mmfleet.api import PROFILE_NAMES, GpuType, ProfileName
from mmfleet.clouds import GPU_RESOURCE

KWOK_ANNOTATION = "kwok.x-k8s.io/node"  # kwok runs with --manage-nodes-with-annotation-selector=<this>=fake
# Every node's kubelet API is kwok's server on loopback (its port in each node's daemonEndpoints), so the API server
# reaches it for `kubectl logs` (cluster._kwok_args, --kubelet-preferred-address-types=InternalIP).
KUBELET_ADDRESS = "127.0.0.1"
POOL_LABEL = "mmfleet.io/pool"
GPU_TAINT = {"key": GPU_RESOURCE, "effect": "NoSchedule"}

# providerIDs in each cloud's format (see the cloud modules' docstrings); generic nodes carry none.
PROVIDER_ID_TEMPLATES: Mapping[ProfileName, str] = MappingProxyType(
    {
        "eks": "aws:///us-west-2a/i-{index:017x}",
        "aks": (
            "azure:///subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/mc_mmfleet_westus2"
            "/providers/Microsoft.Compute/virtualMachineScaleSets/aks-gpu-00000000-vmss/virtualMachines/{index}"
        ),
        "ack": "cn-hangzhou.i-mmfleet{index:013d}",
        "generic": "",
    }
)


def gpu_node_labels(cloud: ProfileName, gpu_type: GpuType) -> dict[str, str]:
    """Labels that make a node match every term of the cloud's ``gpu_node_affinity`` for this GPU.

    Each selector's first known value is taken: the cloud modules list the most common SKU first.
    """
    labels: dict[str, str] = {}
    for selector in clouds.get(cloud).gpu_selectors:
        if values := selector.values.get(gpu_type):
            for key, value in {**selector.fixed, selector.key: values[0]}.items():
                labels.setdefault(key, value)
    return labels


def provider_id(cloud: ProfileName, index: int) -> str:
    """The ``index``-th node's providerID, which ``clouds.detect`` attributes to ``cloud``; empty for generic."""
    return PROVIDER_ID_TEMPLATES[cloud].format(index=index)


@dataclass(frozen=True)
class NodePool:
    """``count`` identical GPU nodes labelled as ``cloud`` labels nodes carrying ``gpu_type``."""

    cloud: ProfileName = "eks"
    gpu_type: GpuType = "H100"
    count: int = 2
    gpus_per_node: int = 8
    cpu: str = "96"
    memory: str = "1Ti"
    pods: str = "110"
    # GPU node pools usually carry nvidia.com/gpu:NoSchedule (every cloud profile tolerates it); off by
    # default so plain test pods schedule too.
    gpu_taint: bool = False
    labels: dict[str, str] = field(default_factory=dict)
    name: str = ""  # default: "<cloud>-<gpu>", e.g. "eks-h100"

    @property
    def pool_name(self) -> str:
        return self.name or f"{self.cloud}-{self.gpu_type.lower()}"


DEFAULT_POOLS: tuple[NodePool, ...] = (NodePool(),)


def parse_pool(text: str) -> NodePool:
    """``CLOUD:GPU:COUNT`` (e.g. ``aks:A100:1``), for the command line."""
    parts = text.split(":")
    if len(parts) != 3 or not parts[2].isdigit():
        raise ValueError(f"node pool {text!r}: expected CLOUD:GPU:COUNT, e.g. eks:H100:2")
    cloud, gpu, count = parts
    if cloud not in PROFILE_NAMES:
        raise ValueError(f"node pool {text!r}: cloud {cloud!r} is not one of {', '.join(PROFILE_NAMES)}")
    if gpu not in get_args(GpuType):
        raise ValueError(f"node pool {text!r}: GPU type {gpu!r} is not one of {', '.join(get_args(GpuType))}")
    return NodePool(cloud=cloud, gpu_type=gpu, count=int(count))  # type: ignore[arg-type]  # both checked above


def node_manifests(pools: Iterable[NodePool]) -> list[dict[str, Any]]:
    """The Node objects, status included, for every pool; providerIDs are unique per cloud."""
    per_cloud: Counter[str] = Counter()
    nodes: list[dict[str, Any]] = []
    for pool in pools:
        selected = gpu_node_labels(pool.cloud, pool.gpu_type)
        if not selected:
            raise ValueError(f"cloud {pool.cloud!r} has no GPU node label for {pool.gpu_type}")
        resources = {
            "cpu": pool.cpu,
            "memory": pool.memory,
            "pods": pool.pods,
            "ephemeral-storage": "1Ti",
            GPU_RESOURCE: str(pool.gpus_per_node),
        }
        for i in range(pool.count):
            name = f"{pool.pool_name}-{i}"
            index = per_cloud[pool.cloud]
            per_cloud[pool.cloud] += 1
            spec: dict[str, Any] = {}
            if node_provider_id := provider_id(pool.cloud, index):
                spec["providerID"] = node_provider_id
            if pool.gpu_taint:
                spec["taints"] = [dict(GPU_TAINT)]
            nodes.append(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
                        "labels": {
                            **selected,
                            "kubernetes.io/hostname": name,
                            "kubernetes.io/os": "linux",
                            "kubernetes.io/arch": "amd64",
                            "type": "kwok",
                            POOL_LABEL: pool.pool_name,
                            **pool.labels,
                        },
                    },
                    "spec": spec,
                    "status": {
                        "capacity": dict(resources),
                        "allocatable": dict(resources),
                        "addresses": [
                            {"type": "InternalIP", "address": KUBELET_ADDRESS},
                            {"type": "Hostname", "address": name},
                        ],
                    },
                }
            )
    return nodes


def create_nodes(api_client: Any, pools: Sequence[NodePool], timeout: float = 60.0) -> list[str]:
    """Create the pools' nodes (replacing same-named ones) and wait until kwok has made them Ready."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core: Any = client.CoreV1Api(api_client)  # Any: the typed signature wants V1Node, a dict works too
    names: list[str] = []
    for manifest in node_manifests(pools):
        name = manifest["metadata"]["name"]
        try:
            core.create_node(manifest)
        except ApiException as error:
            if error.status != 409:
                raise
            core.delete_node(name)
            _wait_gone(core, name, timeout)
            core.create_node(manifest)
        names.append(name)
    wait_ready(api_client, names, timeout)
    return names


def _wait_gone(core: Any, name: str, timeout: float) -> None:
    from kubernetes.client.exceptions import ApiException

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            core.read_node(name)
        except ApiException as error:
            if error.status == 404:
                return
            raise
        time.sleep(0.2)
    raise TimeoutError(f"node {name} still exists {timeout:.0f}s after deletion")


def node_ready(node: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))


def wait_ready(api_client: Any, names: Sequence[str], timeout: float = 60.0) -> None:
    """Wait until every named node reports Ready=True (kwok's node-initialize stage)."""
    from kubernetes import client

    core: Any = client.CoreV1Api(api_client)
    deadline = time.monotonic() + timeout
    pending = set(names)
    while pending:
        ready = {n.metadata.name for n in core.list_node().items if node_ready(n)}
        pending -= ready
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nodes not Ready after {timeout:.0f}s (is kwok running?): {', '.join(sorted(pending))}")
        time.sleep(0.3)
