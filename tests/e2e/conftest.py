"""The end-to-end tests' own local control plane (one per module: a cluster with two H100 nodes whose pod-ready delay
stands for the cold start) and the operator against it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from mmfleet_lab.cluster import Cluster, NodePool, down, up
from mmfleet_lab.cluster.crds import install_mmfleet_crd
from mmfleet_lab.cluster.process import free_port
from mmfleet_lab.demo import examples_policy
from tests.helpers.operator_process import OperatorProcess
from tests.helpers.spike import CLUSTER, COLD_START, say


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    running = up(
        CLUSTER, pod_ready_delay=COLD_START, nodes=(NodePool(cloud="eks", gpu_type="H100", count=2),),
        scrape_interval="2s", progress=say,
    )  # fmt: skip
    yield running
    down(CLUSTER, progress=say)


@pytest.fixture(scope="module")
def operator(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    install_mmfleet_crd(cluster.api_client(), "mmfleet-tests")
    env = {
        "MMFLEET_PROMETHEUS_URL": cluster.prometheus_url or "",
        "MMFLEET_AUTOSCALE_INTERVAL": "3s",
        "MMFLEET_POLICY": examples_policy("*"),  # examples/admin/policy.yaml, for the tests' namespaces
    }
    # /metrics served, so a failing test can say what the autoscaler decided (mmfleet_autoscaler_decisions_total).
    process = OperatorProcess(
        cluster.kubeconfig, tmp_path_factory.mktemp("e2e") / "operator.log", env=env,
        metrics_address=f"127.0.0.1:{free_port()}",
    )  # fmt: skip
    process.start()
    yield process
    process.stop()
