"""API server faults (issue 13): the operator talks to kube-apiserver through a fault-injecting proxy.

For each fault (409, 429 with Retry-After, 500, 503, hung requests, connection resets, dropped watches),
fleets made Ready through the proxy are scaled while the fault lasts ``FAULT_SECONDS``; after it ends
every fleet converges, and the operator sent at most ``MAX_REQUESTS_PER_SECOND`` requests a second
during the fault (backoff, not a busy loop; watches, which kopf reopens when a stream ends, are
bounded separately: no kind reopened faster than the proxy cuts it).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mmfleet_lab.cluster import Cluster
from mmfleet_lab.faults_api import WATCH_DROP_AFTER, Fault, FaultProxy
from mmfleet_lab.faults_crash import Namespace
from tests.integration.operator_process import OperatorProcess, wait_for
from tests.integration.test_operator import Fleet, mmi

pytestmark = pytest.mark.integration

FLEETS = 3
FAULT_SECONDS = 15.0
CONVERGE_TIMEOUT = 120.0
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
FAULTS = {
    "409-on-apply": Fault("409", methods=WRITES, path="/deployments"),
    "429-half": Fault("429", share=0.5),
    "500-on-apply": Fault("500", methods=WRITES, path="/deployments"),
    "503-half": Fault("503", share=0.5),
    "hang-on-apply": Fault("hang", methods=WRITES, path="/deployments"),
    "reset-half": Fault("reset", share=0.5),
    "drop-watch": Fault("drop-watch"),
}
MAX_REQUESTS_PER_SECOND = 10.0
SAYS_WHAT_FAILED = ("409-on-apply", "500-on-apply")


@pytest.fixture
def proxied(cluster: Cluster, crd: None, tmp_path: Path) -> Iterator[tuple[FaultProxy, OperatorProcess]]:
    proxy = FaultProxy(cluster.server, cluster.kubeconfig).start()
    process = OperatorProcess(proxy.kubeconfig(tmp_path / "kubeconfig"), tmp_path / "operator.log")
    process.start()
    try:
        yield proxy, process
    finally:
        process.stop()
        proxy.stop()


@pytest.mark.parametrize("name", list(FAULTS))
def test_every_fleet_converges_after_an_api_server_fault_without_a_busy_loop(
    name: str, proxied: tuple[FaultProxy, OperatorProcess], api: Any, namespace: str
) -> None:
    proxy, process = proxied
    fleet = Fleet(api, namespace)
    names = [f"api-{i}" for i in range(FLEETS)]
    for fleet_name in names:
        fleet.create(mmi(fleet_name, replicas=1))
    for fleet_name in names:
        fleet.wait_ready(fleet_name, replicas=1)

    proxy.set_fault(FAULTS[name])
    began = time.monotonic()
    for fleet_name in names:
        fleet.patch(fleet_name, {"replicas": 2})
    seen: dict[str, set[tuple[str, str]]] = {n: set() for n in names}
    while time.monotonic() - began < FAULT_SECONDS:
        for fleet_name in names:
            for c in fleet.status(fleet_name).get("conditions", []):
                if c["status"] != "True" or c["type"] == "Degraded":
                    seen[fleet_name].add((c["type"], f"{c['reason']}: {c.get('message', '')[:120]}"))
        time.sleep(0.5)
    proxy.clear()
    calls = {k: n for k, n in proxy.counts.during_fault.items() if not k.endswith(" watch")}
    watches = {k: n for k, n in proxy.counts.during_fault.items() if k.endswith(" watch")}
    during = sum(calls.values())
    faulted = proxy.counts.faulted
    elapsed = time.monotonic() - began
    cleared = time.monotonic()
    for fleet_name in names:
        fleet.wait_ready(fleet_name, replicas=2, timeout=CONVERGE_TIMEOUT)
    converge = time.monotonic() - cleared
    wait_for(lambda: Namespace(api, namespace).audit().clean, 30, "a clean audit")
    print(
        f"\n{name}: {during} requests and {sum(watches.values())} watches in {elapsed:.1f}s ({faulted} faulted),"
        f" converged {converge:.1f}s after;"
        f" conditions seen: {seen}; top: {proxy.counts.during_fault.most_common(5)}"
    )
    assert during <= MAX_REQUESTS_PER_SECOND * elapsed, process.tail()
    if name in SAYS_WHAT_FAILED:  # status writes pass; the Deployment's apply fails for the whole fault
        for fleet_name in names:
            assert any(reason.startswith("ApiServerRetrying: ") for _, reason in seen[fleet_name]), seen[fleet_name]
    # A watch is reopened when its stream ends; never faster than the proxy cuts it.
    assert max(watches.values(), default=0) <= elapsed / WATCH_DROP_AFTER, watches
