"""Leader election judges a Lease's expiry by when this process saw its record change, as client-go does, so a
holder whose clock is hours off neither loses its Lease early nor keeps it for ever."""

from __future__ import annotations

from mmfleet.kube import LEASE_SECONDS, Observed


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
