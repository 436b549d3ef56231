"""How a run is judged: window SLO attainment, requests over the SLO, churn, recovery after spikes.

Definitions as docs/benchmarks.md states them (the autoscale section): windows group requests by
arrival; a window passes when at least the SLO's percentile of its requests met the target;
windows with fewer than ``n_min`` requests are merged into the next one; a dropped, unfinished or
abandoned request (its client timed out: the twin's latency ``inf``) counts as a violation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Windows:
    """Per-window verdicts, in arrival order."""

    start: Array  # window start times, s
    end: Array
    passed: npt.NDArray[np.bool_]
    quantile: Array  # the window's observed percentile latency, s (inf when any request never finished)
    count: npt.NDArray[np.int64]


def windows(
    arrival: Array,
    latency: Array,
    target: float,
    percentile: float = 90.0,
    window: float = 60.0,
    n_min: int = 20,
    origin: float | None = None,
) -> Windows:
    """Fixed windows by arrival time from ``origin`` (default: the first arrival); thin windows are merged
    forward so one request cannot fail a window.

    The benchmark anchors the grid where scoring starts, the same for every policy and for the oracle, whose
    schedule is planned on that grid: anchored at the first arrival instead, a trace that is silent for a while
    after the start would shift every window against the plan (seen: azure-code, silent from 120 to 153 s).
    """
    if arrival.size == 0:
        empty = np.zeros(0)
        return Windows(empty, empty, np.zeros(0, dtype=bool), empty, np.zeros(0, dtype=np.int64))
    origin = float(arrival.min()) if origin is None else origin
    if arrival.min() < origin:
        raise ValueError(f"arrivals from {arrival.min():g} s precede the windows' origin {origin:g} s")
    index = np.floor((arrival - origin) / window).astype(np.int64)
    edges = np.flatnonzero(np.diff(index)) + 1
    groups = np.split(np.arange(arrival.size), edges)
    starts, ends, passed, quantiles, counts = [], [], [], [], []
    pending: list[npt.NDArray[np.int64]] = []
    for group in groups:
        pending.append(group)
        members = np.concatenate(pending)
        if members.size < n_min and group is not groups[-1]:
            continue
        values = latency[members]
        met = np.count_nonzero(values <= target)
        starts.append(arrival[members].min() - (arrival[members].min() - origin) % window)
        ends.append(arrival[members].max())
        passed.append(met >= np.ceil(percentile / 100 * members.size - 1e-9))
        quantiles.append(float(np.percentile(values, percentile, method="higher")))
        counts.append(members.size)
        pending = []
    return Windows(
        np.asarray(starts, dtype=np.float64),
        np.asarray(ends, dtype=np.float64),
        np.asarray(passed, dtype=bool),
        np.asarray(quantiles, dtype=np.float64),
        np.asarray(counts, dtype=np.int64),
    )


def attainment(verdicts: Windows, mask: npt.NDArray[np.bool_] | None = None) -> float:
    """Share of windows that met the SLO (optionally only those selected by ``mask``)."""
    passed = verdicts.passed if mask is None else verdicts.passed[mask]
    return float(passed.mean()) if passed.size else float("nan")


def in_spikes(verdicts: Windows, spikes: Sequence[tuple[float, float]], after: float = 600.0) -> npt.NDArray[np.bool_]:
    """Windows that start within ``after`` seconds of a spike's onset."""
    mask = np.zeros(verdicts.start.size, dtype=bool)
    for onset, _ in spikes:
        mask |= (verdicts.start >= onset - 1e-9) & (verdicts.start < onset + after)
    return mask


def share_over(latency: Array, target: float) -> float:
    return float(np.count_nonzero(~(latency <= target)) / latency.size) if latency.size else float("nan")


def violation_minutes(verdicts: Windows, window: float = 60.0) -> float:
    """Failing windows at their nominal length, in minutes (a merged window counts once)."""
    return float(np.count_nonzero(~verdicts.passed) * window / 60.0)


def time_to_recover(verdicts: Windows, onset: float, k: int = 3) -> float:
    """Seconds from a spike's onset to the start of the first run of ``k`` passing windows after it."""
    after = np.flatnonzero(verdicts.start >= onset - 1e-9)
    run = 0
    for position, i in enumerate(after):
        run = run + 1 if verdicts.passed[i] else 0
        if run == k:
            return float(max(0.0, verdicts.start[after[position - k + 1]] - onset))
    return float("inf")


def reversals(decisions: Sequence[tuple[float, int, str]], horizon: float) -> list[float]:
    """When each reversal's scale-down happened: a scale-down followed within ``horizon`` by a scale-up."""
    steps = [(t1, n1 - n0) for (t0, n0, _), (t1, n1, _) in pairwise(decisions) if n1 != n0]
    ups = [t for t, delta in steps if delta > 0]
    return [t for t, delta in steps if delta < 0 and any(t < up <= t + horizon for up in ups)]


def actions_and_reversals(
    decisions: Sequence[tuple[float, int, str]], duration: float, horizon: float
) -> tuple[float, float]:
    """Replica changes per hour, and reversals (``reversals``) per hour."""
    hours = max(duration / 3600.0, 1e-9)
    steps = sum(1 for (_, n0, _), (_, n1, _) in pairwise(decisions) if n1 != n0)
    return steps / hours, len(reversals(decisions, horizon)) / hours


def reversals_per_spike(
    decisions: Sequence[tuple[float, int, str]], spikes: Sequence[tuple[float, float]], horizon: float
) -> float:
    """Reversals whose scale-down came while a spike was on, per spike: each costs a cold start when it is
    least affordable (issue 10 asks for none)."""
    if not spikes:
        return float("nan")
    downs = reversals(decisions, horizon)
    return sum(1 for t in downs for onset, end in spikes if onset <= t <= end) / len(spikes)
