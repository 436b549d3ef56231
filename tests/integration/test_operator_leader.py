"""Two operator processes at once on the local control plane: one Lease, one actor, one scale per fleet per cycle."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from mmfleet_lab.cluster import Cluster
from tests.integration.fake_pods import FakePod, FakePods, PrometheusServer, prometheus_scraping
from tests.integration.operator_process import OperatorProcess, wait_for
from tests.integration.test_operator import Fleet, mmi

pytestmark = pytest.mark.integration

SLO = {"target": "2s", "window": "10s"}


@pytest.fixture
def pair(
    cluster: Cluster, api: Any, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> Iterator[tuple[list[OperatorProcess], PrometheusServer, FakePods]]:
    """Two operators electing on one Lease (the session's stopped meanwhile), reading one Prometheus every second."""
    with prometheus_scraping(tmp_path) as (server, pods):
        env = {
            "MMFLEET_PROMETHEUS_URL": server.url,
            "MMFLEET_AUTOSCALE_INTERVAL": "1s",
            "MMFLEET_LEADER_ELECTION_LEASE": f"it-{uuid.uuid4().hex[:6]}",
            "MMFLEET_LEADER_ELECTION_NAMESPACE": namespace,
        }
        operator.stop()
        both = [OperatorProcess(cluster.kubeconfig, tmp_path / f"operator-{i}.log", env=env) for i in (0, 1)]
        try:
            for process in both:
                process.start()
            yield both, server, pods
        finally:
            for process in both:
                process.stop()
            operator.start()


def scaled(process: OperatorProcess, namespace: str, name: str) -> list[str]:
    text = process.log.read_text(errors="replace") if process.log.exists() else ""
    return re.findall(rf"scaled {namespace}/{name}: .*", text)


def test_two_operators_one_lease_exactly_one_scale_per_fleet_per_cycle_and_a_standby_that_takes_over(
    api: Any, namespace: str, pair: tuple[list[OperatorProcess], PrometheusServer, FakePods]
) -> None:
    both, server, pods = pair
    fleet = Fleet(api, namespace)
    pods.add(FakePod(namespace, "spike-fake", "spike", rate=5, latency=4.0, waiting=5, running=5))
    server.scrape(pods)
    fleet.create(mmi("spike", autoscaling={"minReplicas": 1, "maxReplicas": 3, "slo": SLO}))
    wait_for(lambda: fleet.deployment("spike") and fleet.deployment("spike").spec.replicas == 3, 180, "spike at 3")

    lease = client.CoordinationV1Api(api).list_namespaced_lease(namespace).items
    assert len(lease) == 1
    holder = lease[0].spec.holder_identity
    leader = next(p for p in both if f"holding Lease {namespace}/{lease[0].metadata.name} as {holder}" in p.tail(400))
    standby = next(p for p in both if p is not leader)
    assert "waiting" in standby.tail(400) and "reconciled" not in standby.log.read_text(errors="replace")
    assert scaled(standby, namespace, "spike") == []
    steps = scaled(leader, namespace, "spike")
    assert [re.findall(r": (\d+ -> \d+)", s)[-1] for s in steps] == ["1 -> 2", "2 -> 3"], steps  # once per cycle
    # The operator's own scales are not hand edits: no "was edited by hand; re-applying" and no re-apply after them.
    assert "was edited by hand" not in leader.log.read_text(errors="replace")
    # Events are posted after the scale, asynchronously: wait for both, then none more.
    def scaled_up() -> int:
        events = fleet.core.list_namespaced_event(namespace, field_selector="involvedObject.name=spike").items
        return sum(e.count or 1 for e in events if e.reason == "ScaledUp")

    wait_for(lambda: scaled_up() >= 2, 30, "two ScaledUp events")
    assert scaled_up() == 2

    # The leader dies without a word: the standby takes the Lease once it expires, and acts.
    leader.kill()
    wait_for(lambda: "holding Lease" in standby.tail(400), 60, "the standby to take the Lease")
    fleet.core.delete_namespaced_service("spike", namespace)
    wait_for(lambda: fleet.core.list_namespaced_service(namespace).items, 60, "the new leader to recreate the Service")
