"""The benchmark's judgement: windows, attainment, recovery and churn, on cases computed by hand."""

from __future__ import annotations

import math

import numpy as np

from mmfleet_lab.bench import slo_metrics as m


def test_a_window_passes_when_ninety_percent_meet_the_target() -> None:
    arrival = np.arange(40, dtype=np.float64)  # 20 requests in [0, 20), 20 in [20, 40) with window 20
    latency = np.ones(40)
    latency[:2] = 5.0  # 2 of 20 late: 90% met -> pass
    latency[20:23] = 5.0  # 3 of 20 late: 85% -> fail
    verdicts = m.windows(arrival, latency, target=2.0, window=20.0, n_min=20)
    assert verdicts.passed.tolist() == [True, False]
    assert verdicts.count.tolist() == [20, 20]
    assert m.attainment(verdicts) == 0.5


def test_thin_windows_merge_forward_and_dropped_requests_fail() -> None:
    arrival = np.array([0.0, 61.0, 62.0, 63.0])
    latency = np.array([1.0, 1.0, np.inf, 1.0])
    verdicts = m.windows(arrival, latency, target=2.0, window=60.0, n_min=3)
    assert verdicts.count.tolist() == [4]  # the single-request first window joined the next
    assert verdicts.passed.tolist() == [False]  # 3 of 4 met: below 90%
    assert math.isinf(verdicts.quantile[0])


def test_spike_windows_and_recovery_time() -> None:
    arrival = np.repeat(np.arange(0, 600, 60, dtype=np.float64), 20) + np.tile(np.arange(20.0), 10)
    latency = np.ones(arrival.size)
    bad = (arrival >= 120) & (arrival < 300)  # windows 2, 3, 4 fail
    latency[bad] = 9.0
    verdicts = m.windows(arrival, latency, target=2.0)
    assert verdicts.passed.tolist() == [True, True, False, False, False, True, True, True, True, True]
    assert m.time_to_recover(verdicts, onset=120.0) == 180.0  # first of three passing windows starts at 300
    assert m.violation_minutes(verdicts) == 3.0
    mask = m.in_spikes(verdicts, [(120.0, 300.0)], after=240.0)
    assert mask.tolist() == [False, False, True, True, True, True, False, False, False, False]
    assert m.attainment(verdicts, mask) == 0.25


def test_no_recovery_is_infinite() -> None:
    verdicts = m.windows(np.arange(100, dtype=np.float64), np.full(100, 9.0), target=1.0, window=20.0)
    assert math.isinf(m.time_to_recover(verdicts, onset=0.0))


def test_share_over_counts_drops() -> None:
    assert m.share_over(np.array([1.0, 3.0, np.inf, 0.5]), 2.0) == 0.5


def test_actions_and_reversals_per_hour() -> None:
    decisions = [(0.0, 2, "start"), (100.0, 4, "up"), (700.0, 3, "down"), (900.0, 5, "up"), (3000.0, 2, "down")]
    actions, reversals = m.actions_and_reversals(decisions, duration=3600.0, horizon=600.0)
    assert actions == 4.0
    assert reversals == 1.0  # 700 down then 900 up; the 3000 down has no later up


def test_reversals_during_a_spike_are_counted_per_spike() -> None:
    decisions = [(0.0, 10, ""), (100.0, 40, ""), (200.0, 30, ""), (260.0, 45, ""), (900.0, 20, ""), (950.0, 25, "")]
    spikes = [(50.0, 500.0)]
    # 200 s: down inside the spike, up again at 260 s; 900 s: down after the spike, up at 950 s
    assert m.reversals(decisions, horizon=600.0) == [200.0, 900.0]
    assert m.reversals_per_spike(decisions, spikes, horizon=600.0) == 1.0
    assert m.reversals_per_spike(decisions[:2], spikes, horizon=600.0) == 0.0
    assert math.isnan(m.reversals_per_spike(decisions, [], horizon=600.0))
