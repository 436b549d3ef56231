"""Leader election (``mmfleet.leader``) judges a Lease's expiry by when this process saw its record change, as client-go
does, so a holder whose clock is hours off neither loses its Lease early nor keeps it for ever; a candidate that loses
a write race says so and tries again; a released Lease is taken at once."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from mmfleet import leader
from mmfleet.config import OperatorConfig
from mmfleet.kube import Kube
from mmfleet.leader import LEASE_SECONDS, Elector, Observed, lease_namespace
from tests.helpers.wait import wait_for


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def record(renew_time: str, holder: str = "pod-a") -> dict[str, object]:
    return {"holderIdentity": holder, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": renew_time}


def test_a_lease_is_held_until_its_record_has_not_changed_for_its_duration_whatever_its_renew_time_says() -> None:
    for renew_time in ("2099-01-01T00:00:00.000000Z", "2001-01-01T00:00:00.000000Z"):  # far ahead, far behind
        clock = Clock()
        observed = Observed(clock)
        assert observed.holder(record(renew_time), "pod-b") == "pod-a"  # first seen: a full duration to wait
        clock.now += LEASE_SECONDS - 0.1
        assert observed.holder(record(renew_time), "pod-b") == "pod-a", renew_time
        clock.now += 0.2
        assert observed.holder(record(renew_time), "pod-b") is None, renew_time  # unchanged for 15 s: expired


def test_each_renewal_restarts_the_wait() -> None:
    clock = Clock()
    observed = Observed(clock)
    for second in range(0, 60, 2):  # the holder renews every 2 s, its renewTime an hour behind this clock
        clock.now = 1000.0 + second
        assert observed.holder(record(f"2026-12-01T11:00:{second:02d}.000000Z"), "pod-b") == "pod-a"
    last_change = clock.now
    clock.now = last_change + LEASE_SECONDS - 0.1
    assert observed.holder(record("2026-12-01T11:00:58.000000Z"), "pod-b") == "pod-a"
    clock.now = last_change + LEASE_SECONDS + 0.1
    assert observed.holder(record("2026-12-01T11:00:58.000000Z"), "pod-b") is None


def test_a_lease_is_free_when_unheld_or_ours() -> None:
    observed = Observed(Clock())
    assert observed.holder(record("2026-12-01T12:00:00.000000Z"), "pod-a") is None  # ours
    assert observed.holder({}, "pod-b") is None
    assert observed.holder({"holderIdentity": "", "leaseDurationSeconds": 1}, "pod-b") is None  # released


def test_leader_election_settings_name_the_variable_and_the_rule() -> None:
    assert OperatorConfig.load().leader_election_lease == ""  # off unless asked for (the chart asks)
    assert OperatorConfig.load(leader_election_lease="mmfleet-operator").leader_election_lease == "mmfleet-operator"
    with pytest.raises(ValueError, match="MMFLEET_LEADER_ELECTION_LEASE: 'Not A Name': not an object name"):
        OperatorConfig.load(leader_election_lease="Not A Name")
    assert lease_namespace("ops") == "ops"


class LeaseKube(Kube):
    """One Lease kept in memory, as the API server keeps it; ``race`` makes the next write lose to another writer."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.race = False

    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.lease

    def _write(self, lease: dict[str, Any], version: str) -> bool:
        if self.race:
            self.race = False
            return False
        self.lease = {**lease, "metadata": {**lease["metadata"], "resourceVersion": version}}
        return True

    def create_lease(self, namespace: str, lease: dict[str, Any]) -> bool:
        return self.lease is None and self._write(lease, "1")

    def replace_lease(self, namespace: str, lease: dict[str, Any]) -> bool:
        version = lease["metadata"]["resourceVersion"]
        assert self.lease is not None and version == self.lease["metadata"]["resourceVersion"]
        return self._write(lease, str(int(version) + 1))


def test_a_candidate_that_loses_a_race_for_the_lease_says_so_and_wins_the_next_attempt() -> None:
    kube = LeaseKube()
    one, two = Elector(kube, "ops", "mmfleet"), Elector(kube, "ops", "mmfleet")
    kube.race = True
    assert one.try_hold() == "another candidate (created at the same moment)"
    assert one.try_hold() is None and kube.lease is not None
    assert kube.lease["spec"]["holderIdentity"] == one.identity and "acquireTime" in kube.lease["spec"]
    kube.race = True
    assert one.try_hold() == "another candidate (updated at the same moment)"
    assert one.try_hold() is None  # renewed: still no transition
    assert "leaseTransitions" not in kube.lease["spec"]
    assert two.try_hold() == one.identity


def test_a_released_lease_is_taken_at_once_and_counts_a_transition() -> None:
    kube = LeaseKube()
    one, two = Elector(kube, "ops", "mmfleet"), Elector(kube, "ops", "mmfleet")
    assert one.try_hold() is None
    assert two.try_hold() == one.identity
    one.release()
    assert kube.lease is not None and "holderIdentity" not in kube.lease["spec"]
    assert two.try_hold() is None
    assert kube.lease["spec"]["holderIdentity"] == two.identity and kube.lease["spec"]["leaseTransitions"] == 1


def test_a_renewal_that_hangs_ends_the_leadership_at_the_renew_deadline_not_at_the_requests_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A renewal stuck in a request for its 30 s timeout left the old leader acting for 12-22 s after a standby took
    the Lease (15 s after its last change): the deadline must be kept while the call still hangs."""
    monkeypatch.setattr(leader, "RENEW_SECONDS", 0.05)
    monkeypatch.setattr(leader, "RENEW_DEADLINE_SECONDS", 0.4)
    monkeypatch.setattr(leader, "DEADLINE_CHECK_SECONDS", 0.05)
    kube = HangingLeaseKube()
    lost: list[tuple[str, float]] = []
    done = threading.Event()

    def on_lost(why: str) -> None:
        lost.append((why, time.monotonic()))
        done.set()

    elector = Elector(kube, "ops", "mmfleet", lost=on_lost)
    assert elector.try_hold() is None
    elector.renewed = time.monotonic()
    elector.keep()
    try:
        wait_for(kube.hung.is_set, 2, "a renewal stuck in its request")
        hung_at = time.monotonic()
        assert done.wait(2), "still the leader while its renewal hangs"
        ((why, at),) = lost
        assert at - hung_at < 0.4 + 0.2, "lost at the renew deadline"
        assert why.startswith("Lease ops/mmfleet not renewed for"), why
        assert not kube.released.is_set(), "the call was still hanging"
    finally:
        kube.released.set()


class HangingLeaseKube(LeaseKube):
    """Answers the first read; every read after it hangs until ``released``, as a request to a stalled API server."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.hung = threading.Event()
        self.released = threading.Event()

    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads += 1
        if self.reads > 1:
            self.hung.set()
            self.released.wait(30)
        return super().get_lease(namespace, name)
