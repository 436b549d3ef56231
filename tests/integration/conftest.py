"""One local control plane per test session (``mmfleet_lab.cluster``), shared by every integration test.

It is a cluster of its own name, so a developer's ``mmfleet cluster up`` cluster is left alone. The
first run on a machine builds the binaries (minutes); later sessions start in about ten seconds.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mmfleet_lab.cluster import Cluster, NodePool, down, up
from mmfleet_lab.cluster.cluster import clusters_dir
from tests.integration.operator_process import OperatorProcess

# One cluster per pytest process, so sessions running side by side (two developers' shells, two agents)
# never share, or tear down, each other's cluster; the pid in the name lets a later session clean up
# after one that was killed.
CLUSTER_PREFIX = "mmfleet-it-"
CLUSTER_NAME = f"{CLUSTER_PREFIX}{os.getpid()}"
POD_READY_DELAY = "2s"
SCRAPE_INTERVAL = "2s"  # Prometheus'; short, so a test sees a full rate() window within seconds
POOLS = (
    NodePool(cloud="eks", gpu_type="H100", count=2),
    NodePool(cloud="aks", gpu_type="A100", count=1),
    NodePool(cloud="ack", gpu_type="H20", count=1),
)
LAST = "test_down_stops_every_process"  # tears the session cluster down, so it must run last


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.name == LAST)  # stable: only moves that test to the end


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _remove_orphans() -> None:
    """Take down test clusters whose pytest process is gone (killed sessions leave them running)."""
    for state in clusters_dir().glob(f"{CLUSTER_PREFIX}*.json"):
        pid = state.stem.removeprefix(CLUSTER_PREFIX)
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            down(state.stem, progress=_progress)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    _remove_orphans()
    running = up(
        CLUSTER_NAME, pod_ready_delay=POD_READY_DELAY, nodes=POOLS, progress=_progress, scrape_interval=SCRAPE_INTERVAL
    )
    yield running
    down(CLUSTER_NAME, progress=_progress)  # a no-op when the last test already took it down


@pytest.fixture(scope="session")
def api(cluster: Cluster) -> Iterator[Any]:
    client = cluster.api_client()
    yield client
    client.close()


@pytest.fixture
def namespace(api: Any) -> Iterator[str]:
    """A fresh namespace with its default ServiceAccount (pods are refused until kcm creates it)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api)
    name = f"it-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    deadline = time.monotonic() + 30
    while True:
        try:
            core.read_namespaced_service_account("default", name)
            break
        except ApiException as error:
            if error.status != 404 or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    yield name
    try:
        core.delete_namespace(name)
    except ApiException as error:
        if error.status != 404:
            raise


@pytest.fixture(scope="session")
def crd(cluster: Cluster, api: Any) -> None:
    """The generated CRD, installed as a user would (server-side apply), and served."""
    from mmfleet_lab.cluster.crds import install_mmfleet_crd

    install_mmfleet_crd(api, "mmfleet-tests")


@pytest.fixture(scope="session")
def operator(cluster: Cluster, crd: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    process = OperatorProcess(cluster.kubeconfig, tmp_path_factory.mktemp("operator") / "operator.log")
    process.start()
    yield process
    process.stop()
