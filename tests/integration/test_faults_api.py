"""API server faults (issue 13): the operator talks to kube-apiserver through a fault-injecting proxy.

For each fault of ``faults_api.CASES`` (409, 429 with Retry-After, 500, 503, hung requests, connection resets,
dropped watches), fleets made Ready through the proxy are scaled (an autoscaled one has its spec changed) while
the fault lasts; after it ends every fleet converges with a clean audit, and the operator sent at most
``MAX_REQUESTS_PER_FLEET_SECOND`` requests a second and fleet during the fault (backoff, not a busy loop; watches
are not counted). When every watch is cut soon after it opens, the fleets converge while the fault lasts. Where every
call of a kind fails, every fleet's Progressing says which call and what it met, and keeps saying it through
status refreshes and the autoscaler's cycles. A Retry-After sets the retries' pace. One trial each;
``mmfleet bench faults --api-trials N`` runs more.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from mmfleet_lab.cluster import Cluster
from mmfleet_lab.faults_api import (
    AUTOSCALED,
    CASES,
    FIXED,
    MAX_REQUESTS_PER_FLEET_SECOND,
    OPERATOR_ENV,
    WATCH_DROP_AFTER,
    WRITES,
    Fault,
    FaultProxy,
    converge,
    create_fleets,
    run_trial,
    scale_fleets,
)
from mmfleet_lab.faults_crash import Namespace
from tests.helpers.operator_process import OperatorProcess
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def proxied(
    own_operator_only: None, cluster: Cluster, crd: None, namespace: str, tmp_path: Path
) -> Iterator[tuple[FaultProxy, OperatorProcess]]:
    """The operator through the proxy, watching the trial's namespace only: a cluster-wide one also served the fleets
    of earlier trials whose namespaces were terminating (re-applying children the namespace controller had removed,
    refused with 403), and those requests counted against this trial's bound (CI, 2026-12-01: 3.1 per s and fleet)."""
    proxy = FaultProxy(cluster.server, cluster.kubeconfig).start()
    env = {**OPERATOR_ENV, "MMFLEET_NAMESPACES": namespace}
    process = OperatorProcess(proxy.kubeconfig(tmp_path / "kubeconfig"), tmp_path / "operator.log", env)
    process.start()
    try:
        yield proxy, process
    finally:
        process.stop()
        proxy.stop()


@pytest.mark.parametrize("name", list(CASES))
def test_every_fleet_converges_after_an_api_server_fault_without_a_busy_loop(
    name: str, proxied: tuple[FaultProxy, OperatorProcess], api: Any, namespace: str
) -> None:
    proxy, process = proxied
    ns = Namespace(api, namespace)
    create_fleets(ns)
    assert converge(ns, 120)[0] is not None, process.tail()

    trial = run_trial(ns, proxy, name)
    print(
        f"\n{name}: {trial.requests} requests and {sum(trial.watch_opens.values())} watches in {trial.seconds:.1f}s"
        f" ({trial.counts.faulted} faulted), converged {trial.converge}s after;"
        f" Deployment applies per fleet: {[trial.applies(namespace, n) for n in [*FIXED, AUTOSCALED]]};"
        f" Progressing seen: {trial.said}; top: {trial.counts.during_fault.most_common(5)}"
    )
    assert trial.converge is not None, (trial.audit.problems, process.tail())
    assert not trial.elsewhere(namespace), trial.elsewhere(namespace)
    assert trial.bounded(), (f"over {MAX_REQUESTS_PER_FLEET_SECOND}/s and fleet", trial.counts.during_fault)
    case = CASES[name]
    if case.says is not None:  # every call of a kind fails for the whole fault; the status write passes
        assert all(trial.says(case, namespace).values()), trial.said
        assert all(trial.kept().values()), trial.said
    if case.fault.kind == "drop-watch":
        # Every stream cut 0.5 s after it opens, yet the changes made as the fault began are served while it lasts:
        # kopf reopens a cut stream from its last resourceVersion, without a re-list, so a lost event would leave a
        # fleet unserved until the 300 s resync. The fault must have cut watches, and no path may reopen in a storm.
        assert trial.counts.faulted > 0 and trial.watch_opens, trial.counts.during_fault
        assert trial.during is not None and trial.during.clean, trial.during
        assert max(trial.watch_opens.values()) <= trial.seconds / WATCH_DROP_AFTER + 2, trial.watch_opens
    if case.fault.retry_after is not None and case.says is not None:
        # Each retry waits the Retry-After (so at most one apply per that many seconds, plus the first), and not much
        # longer: the doubling backoff (5, 10 s) allows 3 applies in the fault's 15 s.
        most = trial.seconds / case.fault.retry_after + 1
        for fleet in FIXED:  # the autoscaled fleet's first write, its scale, is the one refused
            assert most / 2 <= trial.applies(namespace, fleet) <= most, trial.counts.during_fault


def test_a_change_reverted_while_its_reconcile_fails_is_undone_after_the_fault(
    proxied: tuple[FaultProxy, OperatorProcess], api: Any, namespace: str
) -> None:
    """The Deployment takes 2 replicas but the PodDisruptionBudget's apply after it fails; the spec goes back to 1
    during the fault. kopf then sees nothing to handle (the spec is what it last handled) and drops its retry: only
    the operator's own retry loop brings the Deployment back to 1 (before it did, 2 replicas ran for ever)."""
    proxy, process = proxied
    ns = Namespace(api, namespace)
    create_fleets(ns)
    assert converge(ns, 120)[0] is not None, process.tail()
    proxy.set_fault(Fault("500", methods=WRITES, path="/poddisruptionbudgets"))
    scale_fleets(ns, FIXED, 2)
    apps = client.AppsV1Api(api)

    def scaled() -> bool:
        return all(apps.read_namespaced_deployment(n, namespace).spec.replicas == 2 for n in FIXED)

    wait_for(scaled, 30, "the Deployments at 2 replicas while the PodDisruptionBudgets' applies fail")
    scale_fleets(ns, FIXED, 1)
    time.sleep(10)
    proxy.clear()
    took, audit = converge(ns, 60)
    print(f"\nreverted during the fault: converged {took}s after it; {audit.problems}")
    assert took is not None, (audit.problems, process.tail())
