"""One local control plane per test session (``mmfleet_lab.cluster``), shared by every integration test.

It is a cluster of its own name, so a developer's ``mmfleet cluster up`` cluster is left alone. The
first run on a machine builds the binaries (minutes); later sessions start in about ten seconds.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mmfleet_lab.cluster import Cluster, down, up
from mmfleet_lab.cluster.cluster import clusters_dir
from mmfleet_lab.demo import examples_policy
from tests.helpers.chart import (  # noqa: F401 (fixtures: the chart installed, run, and the CRDs it needs served)
    chart_run,
    has_default_sa,
    installed,
    pod_monitor_crd,
    routing_crds,
    settled_pod_monitor_crd,
    watch_mode,
)
from tests.helpers.cluster import (
    CLUSTER_NAME,
    CLUSTER_PREFIX,
    POD_READY_DELAY,
    POOLS,
    SCRAPE_INTERVAL,
    down_leaves_nothing_behind,
)
from tests.helpers.fleet import Fleet
from tests.helpers.operator_process import OperatorProcess
from tests.helpers.wait import wait_for


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
    try:
        yield running
        down_leaves_nothing_behind(running)  # the cluster's end, checked as a user's ``mmfleet cluster down`` would
    finally:
        down(CLUSTER_NAME, progress=_progress)  # a no-op once the check above took it down


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
    wait_for(lambda: has_default_sa(api, name), 30, f"namespace {name}'s default ServiceAccount")
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


# The session's operator once a test has asked for it (it serves every namespace).
_SESSION_OPERATOR: list[OperatorProcess] = []


@pytest.fixture(scope="session")
def operator(cluster: Cluster, crd: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    # The admin's policy of examples/admin/policy.yaml, for the tests' namespaces (one per test).
    env = {"MMFLEET_POLICY": examples_policy("*")}
    process = OperatorProcess(cluster.kubeconfig, tmp_path_factory.mktemp("operator") / "operator.log", env=env)
    process.start()
    _SESSION_OPERATOR.append(process)
    yield process
    _SESSION_OPERATOR.remove(process)
    process.stop()


@pytest.fixture
def own_operator_only() -> Iterator[None]:
    """The session's operator stopped while a test runs an operator of its own, and started again after: two
    operators on one fleet write each other's status and children (the API-fault trials failed behind a test that had
    started the session operator, in a clean-clone run on 2026-12-05), whatever order the test files run in."""
    running = list(_SESSION_OPERATOR)
    for process in running:
        process.stop()
    try:
        yield
    finally:
        for process in running:
            process.start()


@pytest.fixture
def fleet(api: Any, namespace: str, operator: OperatorProcess) -> Fleet:
    return Fleet(api, namespace)


# The operator's MMFLEET_COLD_START for the modules that route requests through a real picker: the picker's request
# TTL is the next 30 s step above it (mmfleet.routing.request_ttl), so held requests are answered after 30 s, not 150.
POOL_COLD_START = "1"


@pytest.fixture(scope="module")
def pool_operator(routing_crds: None, operator: OperatorProcess) -> Iterator[OperatorProcess]:  # noqa: F811
    """The session's operator restarted to see the routing CRDs, with a short cold start (so a 30 s request TTL);
    restarted as it was at the end."""
    operator.env["MMFLEET_COLD_START"] = POOL_COLD_START
    operator.stop()
    operator.start()
    try:
        yield operator
    finally:
        del operator.env["MMFLEET_COLD_START"]
        operator.stop()
        operator.start()
