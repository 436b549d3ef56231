"""The local control plane behaves like a cluster: real API server, scheduler, controllers, kwok GPU nodes."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from mmfleet import clouds
from mmfleet.api import GpuSpec, seconds
from mmfleet_lab.cluster import READY_DELAY_ANNOTATION, Cluster, attach, env, get, process, up
from mmfleet_lab.cluster.build import K8S_VERSION
from mmfleet_lab.cluster.nodes import POOL_LABEL
from tests.helpers.cluster import (
    CLUSTER_NAME,
    POD_READY_DELAY,
    POOLS,
    SCRAPE_INTERVAL,
    sleeper,
)
from tests.helpers.repo import ROOT
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.integration
DATA = ROOT / "tests" / "data"


def condition(pod: Any, kind: str) -> Any:
    return next((c for c in pod.status.conditions or [] if c.type == kind), None)


def gpu_deployment(name: str, gpus: int, cloud: str, gpu_type: str, annotations: dict[str, str]) -> dict[str, Any]:
    """A Deployment placed the way mmfleet renders it: the cloud profile's GPU affinity and tolerations."""
    profile = clouds.get(cloud)
    affinity = profile.gpu_node_affinity(GpuSpec(count=gpus, type=gpu_type))  # type: ignore[arg-type]
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": annotations},
                "spec": {
                    "affinity": {"nodeAffinity": affinity},
                    "tolerations": profile.gpu_tolerations(),
                    "containers": [
                        {
                            "name": "server",
                            "image": "vllm/vllm-openai:v0.9.0",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ],
                },
            },
        },
    }


def test_api_server_reports_the_built_version(api: Any) -> None:
    assert client.VersionApi(api).get_code().git_version == f"v{K8S_VERSION}"


def test_fake_gpu_nodes_are_ready_with_gpus(api: Any) -> None:
    nodes = client.CoreV1Api(api).list_node(label_selector="type=kwok").items
    assert len(nodes) == sum(p.count for p in POOLS)
    for node in nodes:
        assert condition(node, "Ready").status == "True", node.metadata.name
        assert node.status.allocatable["nvidia.com/gpu"] == "8"
        assert node.status.capacity["cpu"] == "96"
    by_pool = {p.pool_name: p.cloud for p in POOLS}
    for node in nodes:  # each node's providerID is recognised as its pool's cloud
        assert clouds.detect([node.spec.provider_id or ""]) == by_pool[node.metadata.labels[POOL_LABEL]]


def test_components_listen_on_loopback_only(cluster: Cluster) -> None:
    recorded = get(CLUSTER_NAME)  # not the fixture's: Prometheus may have been restarted since
    assert recorded is not None and "prometheus" in recorded.pids
    listening = _listening_addresses(p.pid for p in recorded.processes if process.alive(p))
    assert listening, "found no listening sockets of the components"
    assert {address for address, _ in listening} == {"127.0.0.1"}, listening


def test_gpu_deployment_is_scheduled_and_turns_ready_after_the_delay(api: Any, namespace: str) -> None:
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    # One pod with the cluster's default delay, one with its own, both placed by the EKS profile.
    apps.create_namespaced_deployment(namespace, gpu_deployment("default-delay", 1, "eks", "H100", {}))
    apps.create_namespaced_deployment(
        namespace, gpu_deployment("own-delay", 1, "eks", "H100", {READY_DELAY_ANNOTATION: "5s"})
    )

    def ready_pod(app: str) -> Any:
        pods = core.list_namespaced_pod(namespace, label_selector=f"app={app}").items
        ready = [p for p in pods if (c := condition(p, "Ready")) is not None and c.status == "True"]
        return ready[0] if ready else None

    eks_nodes = {n.metadata.name for n in core.list_node(label_selector=f"{POOL_LABEL}=eks-h100").items}
    for app, delay in (("default-delay", seconds(POD_READY_DELAY)), ("own-delay", 5.0)):
        pod = wait_for(partial(ready_pod, app), 60, f"pod of {app} Ready")
        assert pod.spec.node_name in eks_nodes
        assert pod.status.phase == "Running"
        assert pod.status.pod_ip
        scheduled = condition(pod, "PodScheduled").last_transition_time
        became_ready = condition(pod, "Ready").last_transition_time
        # API timestamps have one-second resolution; kwok starts the clock when it sees the bound pod,
        # so allow for watch latency and kwok's queue on a busy two-core machine.
        waited = (became_ready - scheduled).total_seconds()
        assert delay - 1 <= waited <= delay + 10, (app, waited)
        assert pod.metadata.owner_references[0].kind == "ReplicaSet"  # kcm made the ReplicaSet and the pod

    # Garbage collection: deleting the Deployment takes its ReplicaSet and pods with it.
    apps.delete_namespaced_deployment("own-delay", namespace, propagation_policy="Background")
    wait_for(
        lambda: (
            not core.list_namespaced_pod(namespace, label_selector="app=own-delay").items
            and not apps.list_namespaced_replica_set(namespace, label_selector="app=own-delay").items
        ),
        30,
        "ReplicaSet and pod of own-delay collected",
    )


@pytest.mark.parametrize("pool", POOLS, ids=lambda p: p.pool_name)
def test_cloud_gpu_affinity_lands_on_that_clouds_nodes(api: Any, namespace: str, pool: Any) -> None:
    core = client.CoreV1Api(api)
    client.AppsV1Api(api).create_namespaced_deployment(
        namespace, gpu_deployment("fleet", 1, pool.cloud, pool.gpu_type, {})
    )
    pod = wait_for(
        lambda: next((p for p in core.list_namespaced_pod(namespace).items if p.spec.node_name), None), 30, "pod bound"
    )
    node = core.read_node(pod.spec.node_name)
    assert node.metadata.labels[POOL_LABEL] == pool.pool_name


def test_pod_asking_for_more_gpus_than_a_node_has_stays_pending(api: Any, namespace: str) -> None:
    core = client.CoreV1Api(api)
    pod = {
        "metadata": {"name": "too-big"},
        "spec": {"containers": [{"name": "server", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "9"}}}]},
    }
    core.create_namespaced_pod(namespace, pod)

    def unschedulable() -> Any:
        found = condition(core.read_namespaced_pod("too-big", namespace), "PodScheduled")
        return found if found is not None and found.reason == "Unschedulable" else None

    scheduled = wait_for(unschedulable, 30, "PodScheduled=False/Unschedulable")
    assert scheduled.status == "False"
    assert "Insufficient nvidia.com/gpu" in scheduled.message
    events = wait_for(
        lambda: [
            e
            for e in core.list_namespaced_event(namespace, field_selector="involvedObject.name=too-big").items
            if e.reason == "FailedScheduling"
        ],
        30,
        "FailedScheduling event",
    )
    assert "Insufficient nvidia.com/gpu" in events[0].message
    assert core.read_namespaced_pod("too-big", namespace).status.phase == "Pending"


def test_deleting_a_namespace_removes_it_and_its_pods(api: Any) -> None:
    core = client.CoreV1Api(api)
    name = "it-doomed"
    core.create_namespace({"metadata": {"name": name}})
    wait_for(
        lambda: _exists(lambda: core.read_namespaced_service_account("default", name)), 30, "default ServiceAccount"
    )
    client.AppsV1Api(api).create_namespaced_deployment(name, gpu_deployment("fleet", 1, "eks", "H100", {}))
    wait_for(
        lambda: [p for p in core.list_namespaced_pod(name).items if p.status.phase == "Running"], 30, "a running pod"
    )
    core.delete_namespace(name)
    wait_for(lambda: not _exists(lambda: core.read_namespace(name)), 90, "namespace gone")
    assert not core.list_pod_for_all_namespaces(field_selector=f"metadata.namespace={name}").items


def test_second_up_returns_the_running_cluster(cluster: Cluster) -> None:
    # A dead attached process (say, an operator that crashed) must not make ``up`` restart the cluster.
    recorded = get(CLUSTER_NAME)  # not the fixture's: Prometheus may have been restarted since
    assert recorded is not None
    attached = sleeper()
    attach(CLUSTER_NAME, "sleeper", attached.pid)
    attached.kill()
    attached.wait()
    started = time.monotonic()
    again = up(CLUSTER_NAME, pod_ready_delay=POD_READY_DELAY, nodes=POOLS, scrape_interval=SCRAPE_INTERVAL)
    assert {k: v for k, v in again.pids.items() if k != "sleeper"} == recorded.pids
    assert again.kubeconfig == cluster.kubeconfig
    assert time.monotonic() - started < 5
    assert env(CLUSTER_NAME) == (
        f"export KUBECONFIG={cluster.kubeconfig}\nexport MMFLEET_PROMETHEUS_URL={cluster.prometheus_url}"
    )


def _exists(read: Callable[[], object]) -> bool:
    try:
        read()
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


def _listening_addresses(pids: Any) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket the given processes listen on, from /proc/net/tcp{,6}."""
    inodes: set[str] = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found: set[tuple[str, int]] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: LISTEN
                host, port = local.split(":")
                found.add((_address(host), int(port, 16)))
    return found


def _address(hex_host: str) -> str:
    raw = bytes.fromhex(hex_host)
    if len(raw) == 4:
        return ".".join(str(b) for b in reversed(raw))
    return raw.hex()  # IPv6: only needs to differ from "127.0.0.1"
