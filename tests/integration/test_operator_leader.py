"""Two operator processes at once on the local control plane: one Lease, one actor, one scale per fleet per cycle."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from mmfleet.leader import LEASE_SECONDS, RENEW_SECONDS
from mmfleet_lab.cluster import Cluster
from tests.helpers.fake_pods import FakePod, FakePods, PrometheusServer, prometheus_scraping
from tests.helpers.fleet import Fleet, mmi
from tests.helpers.operator_process import OperatorProcess
from tests.helpers.wait import wait_for

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
    # The whole log: the line is written once, when the Lease is taken, and a busy leader's cycles scroll it away
    # (CI, 2026-12-02: not in the last 400 lines).
    said = f"holding Lease {namespace}/{lease[0].metadata.name} as {holder}"
    leader = next(p for p in both if said in p.log.read_text(errors="replace"))
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


SKEWED = "skewed-holder"


def _micro(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@pytest.mark.parametrize("skew", [timedelta(hours=1), -timedelta(hours=1)], ids=["holder-ahead", "holder-behind"])
def test_a_standby_takes_a_skewed_holders_lease_a_lease_duration_after_its_record_stops_changing(
    cluster: Cluster, api: Any, namespace: str, tmp_path: Path, skew: timedelta
) -> None:
    """A holder whose clock is an hour off renews for 10 s, then dies. Judged by renewTime, the standby would take the
    Lease at once (holder behind) or wait an hour (holder ahead); judged by when it saw the record change, it waits
    while the holder renews and takes the Lease one lease duration after the last renewal."""
    leases = client.CoordinationV1Api(api)
    name = f"skew-{uuid.uuid4().hex[:6]}"

    def renew(resource_version: str | None = None, transitions: int = 0) -> None:
        """Create the Lease, or renew it over ``resource_version`` (a write by the standby in between fails it)."""
        when = _micro(datetime.now(UTC) + skew)
        spec = {"holderIdentity": SKEWED, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": when,
                "acquireTime": when, "leaseTransitions": transitions}  # fmt: skip
        if resource_version is None:
            leases.create_namespaced_lease(namespace, {"metadata": {"name": name}, "spec": spec})
        else:
            body = {"metadata": {"name": name, "resourceVersion": resource_version}, "spec": spec}
            leases.replace_namespaced_lease(name, namespace, body)

    renew()
    # Its own namespace only, so it reconciles nothing of the session operator's.
    env = {"MMFLEET_LEADER_ELECTION_LEASE": name, "MMFLEET_LEADER_ELECTION_NAMESPACE": namespace,
           "MMFLEET_NAMESPACES": namespace}  # fmt: skip
    standby = OperatorProcess(cluster.kubeconfig, tmp_path / "standby.log", env=env)
    standby.start()
    try:
        wait_for(lambda: f"held by {SKEWED}" in standby.tail(), 30, "the standby to see the skewed holder")
        renewing_until = time.monotonic() + 10
        while time.monotonic() < renewing_until:
            time.sleep(RENEW_SECONDS)
            held = leases.read_namespaced_lease(name, namespace)
            assert held.spec.holder_identity == SKEWED, f"taken while its holder renews: {standby.tail()}"
            renew(held.metadata.resource_version, transitions=1)
        last_change = time.monotonic()

        def taken() -> bool:
            return leases.read_namespaced_lease(name, namespace).spec.holder_identity != SKEWED

        wait_for(taken, LEASE_SECONDS + 8 * RENEW_SECONDS, "the standby to take the Lease", interval=0.1)
        waited = time.monotonic() - last_change
        # Not before a lease duration from the last change it saw, and within a few of its polls after (a poll is a
        # renew interval plus a GET, so it sees the change and the expiry each up to a poll late): neither a clock
        # read on the holder's renewTime (0 s or an hour here) nor a wait for more than the lease.
        assert LEASE_SECONDS - 0.5 <= waited <= LEASE_SECONDS + 4 * RENEW_SECONDS, waited
        wait_for(lambda: "holding Lease" in standby.tail(), 10, "the standby to say it holds the Lease")
    finally:
        standby.stop()
