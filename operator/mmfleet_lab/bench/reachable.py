"""``mmfleet bench reachable``: what the true oracle's GPU-hours ask of a policy that cannot see ahead.

The true oracle (``bench.oracle``) orders each replica one cold start before the window that needs it: it
knows the future. A policy reacting to what it observes cannot. This benchmark estimates the least a family of
reactive sizing rules pays on a cell, granting it far more than metrics show: the exact need of every window
(the oracle's own per-window counts), known the moment the window begins, with no scrape, rate window or
estimate. Ordered then, replicas are Ready ``lead`` = ceil(L / window) windows later, so window w gets
``ceil(h × max(need[w - lead - k .. w - lead]))``: a headroom ``h`` over the largest need of the last ``k + 1``
windows it could have seen, which is the shape of every autoscaler compared here (a target utilisation is a
headroom, a stabilisation window a trailing max), capped at the policies' maxReplicas. Both knobs are then
picked in hindsight, on the cell itself: for each ``k``, the smallest ``h`` that covers every window's need,
raised while the replay still misses a window, then bisected down while it meets them all. The cheapest member
found that meets every window is ``reactive-bound``: tuned on the cell it is scored on, so not a policy. It is
the result of a search, not a proof: a member between the grid's points, or a policy ordering within a window
rather than at its start, could pay less. ``reactive-exact`` is the same rule with no headroom and no lookback.
"""

from __future__ import annotations

import gc
import math
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from mmfleet_lab.bench import autoscale
from mmfleet_lab.bench.oracle import Cell, IntArray, failing_windows, true_oracle
from mmfleet_lab.bench.oracle import replay as replay_counts
from mmfleet_lab.bench.report import table, write_section
from mmfleet_lab.bench.traces import role as role_of
from mmfleet_lab.twin import H200_QWEN25VL7B
from mmfleet_lab.twin.scenarios import REFERENCE_SLO

LOOKBACKS = (0, 1, 2, 4, 8, 16, 32)  # up to half the hour: the peak a fleet that rarely scales down holds
RAISE = 1.05  # the headroom's step when a replay still misses a window
RAISES = 8
LOWEST = 0.5  # the bisection's floor for the headroom
BISECTIONS = 5

Progress = Callable[[str], None]


def lead_windows(cold_start: float, window: float) -> int:
    """Windows between the one whose need is known (at its start) and the first its orders can serve."""
    return max(1, math.ceil(cold_start / window - 1e-9))


def trailing_need(need: IntArray, lead: int, lookback: int) -> IntArray:
    """For each window, the largest need among the ``lookback + 1`` windows that began ``lead`` or more windows
    earlier; windows before ``lead`` keep their own need (no order can land before them, for any policy)."""
    base = need.copy()
    for w in range(lead, need.size):
        base[w] = need[max(0, w - lead - lookback) : w - lead + 1].max()
    np.maximum(base, 1, out=base)
    return base


def reactive_counts(need: IntArray, lead: int, lookback: int, headroom: float, cap: int | None = None) -> IntArray:
    """ceil(headroom × trailing need) from ``lead`` on, at most ``cap`` (the policies' maxReplicas); the need
    itself before."""
    counts: IntArray = np.ceil(headroom * trailing_need(need, lead, lookback) - 1e-9).astype(np.int64)
    if cap is not None:
        np.minimum(counts, cap, out=counts)
    counts[:lead] = need[:lead]
    return counts


def covering_headroom(need: IntArray, lead: int, lookback: int) -> float:
    """The smallest headroom whose counts reach every window's need."""
    base = trailing_need(need, lead, lookback)[lead:]
    return float((need[lead:] / base).max(initial=1.0))


@dataclass(frozen=True)
class Member:
    """One (lookback, headroom) of the family, replayed."""

    lookback: int
    headroom: float
    row: autoscale.Row
    misses: int


def members(cell: Cell, need: IntArray, cold_start: float, initial: int, cap: int | None = None) -> list[Member]:
    """For each lookback, the cheapest headroom found that meets every window (or the last tried, with its
    misses), replayed and scored like every policy: raised from the covering headroom until a replay meets every
    window, then bisected down towards ``LOWEST`` (a window can pass below the oracle's count when earlier
    windows had headroom)."""
    lead = lead_windows(cold_start, cell.window)
    found = []

    def tried(k: int, h: float) -> Member:
        result = replay_counts(cell, reactive_counts(need, lead, k, h, cap), cold_start, "reactive-bound")
        misses = len(failing_windows(cell, result))
        row = autoscale.evaluate(cell.label, cold_start, "reactive-bound", cell.scenario, result, cell.slo, 0.0,
                                 initial)  # fmt: skip
        del result
        gc.collect()  # a run's engine and metric book refer to each other: free each replay (GBs on spikes)
        return Member(k, h, replace(row, note=f"k={k}, h={h:.2f}"), misses)

    for k in LOOKBACKS:
        h = covering_headroom(need, lead, k)
        member = tried(k, h)
        for _ in range(RAISES):
            if not member.misses:
                break
            h *= RAISE
            member = tried(k, h)
        if not member.misses:
            low = LOWEST
            for _ in range(BISECTIONS):
                lower = tried(k, (low + member.headroom) / 2)
                if lower.misses:
                    low = lower.headroom
                else:
                    member = lower
        found.append(member)
    return found


def _cell_seed(name: str, cold_start: float, seed: int) -> list[autoscale.Row]:
    """The oracle and the reactive family's two rows on one cell and seed (the policies' rows are in the
    autoscaling tables: this bound is the trace's, whatever policy runs on it)."""
    params, slo = H200_QWEN25VL7B, REFERENCE_SLO
    _, demand, common = autoscale.cell(name, cold_start, params, slo, None, seed)
    scn = autoscale.scenario_of(name, params, slo, None, seed)
    initial = common["initial_replicas"]
    limit = max(common["max_replicas"], math.ceil(autoscale.ORACLE_PER_PEAK * demand.max()))
    cell = Cell(scn, params, slo, initial, limit, autoscale.WARMUP, autoscale.WINDOW, name)
    began = time.monotonic()
    oracle, _ = true_oracle(cell, cold_start)
    rows = [autoscale.evaluate(name, cold_start, "oracle", scn, oracle.result, slo, time.monotonic() - began, initial)]
    lead = lead_windows(cold_start, cell.window)
    exact = replay_counts(cell, reactive_counts(oracle.ready, lead, 0, 1.0), cold_start, "reactive-exact")
    rows.append(autoscale.evaluate(name, cold_start, "reactive-exact", scn, exact, slo, 0.0, initial))
    meeting = [m for m in members(cell, oracle.ready, cold_start, initial, common["max_replicas"]) if not m.misses]
    if not meeting:
        raise RuntimeError(f"{name}, cold start {cold_start:g} s, seed {seed}: no member met every window")
    rows.append(min(meeting, key=lambda m: m.row.gpu_hours).row)
    hours = rows[0].gpu_hours
    return [replace(r, seed=seed, oracle_ratio=r.gpu_hours / hours) for r in rows]


HEADERS = ("policy", "seeds", "windows met %", "violation-min", "GPU-h", "× oracle", "picked (k, h) per seed")


def cell_table(rows: Sequence[autoscale.Row]) -> str:
    lines = []
    for policy, group in autoscale.by_policy(rows).items():
        notes = "; ".join(r.note for r in group if r.note)
        lines.append([
            policy[2], len(group), autoscale.spread(group, "attainment", autoscale.pct),
            autoscale.spread(group, "violation_minutes", lambda v: autoscale.num(v, 0)),
            autoscale.spread(group, "gpu_hours", lambda v: autoscale.num(v, 1)),
            autoscale.spread(group, "oracle_ratio", lambda v: autoscale.num(v, 2)), notes or "-",
        ])  # fmt: skip
    return table(HEADERS, lines)


def main(
    scenarios: Sequence[str], cold_starts: Sequence[float], seeds: Sequence[int], docs: Path, progress: Progress,
    workers: int = os.cpu_count() or 1,
) -> int:  # fmt: skip
    """Run every cell and seed, print the tables and write them to ``docs``."""
    started = time.monotonic()
    sections = []
    for name in scenarios:
        for cold in cold_starts:
            progress(f"== {name} ({role_of(name)}), cold start {cold:.0f}s, seeds {', '.join(map(str, seeds))}")
            rows: list[autoscale.Row] = []
            with ProcessPoolExecutor(max_workers=workers) as pool:
                jobs = [pool.submit(_cell_seed, name, cold, s) for s in seeds]
                for job in as_completed(jobs):
                    got = job.result()
                    rows += got
                    progress("   seed " + str(got[0].seed) + ": " + ", ".join(
                        f"{r.policy} {r.attainment:.1%} {r.oracle_ratio:.2f}x" for r in got))  # fmt: skip
            rows.sort(key=lambda r: r.seed)
            text = cell_table(rows)
            print(f"\n{name}, cold start {cold:.0f}s\n{text}\n", flush=True)
            sections.append(f"### {name} ({role_of(name)}), cold start {cold:.0f} s\n\n{text}\n")
    command = "mmfleet bench reachable " + " ".join(
        [*(f"--scenario {s}" for s in scenarios), *(f"--cold-start {c:g}" for c in cold_starts),
         *(f"--seed {s}" for s in seeds)]
    )  # fmt: skip
    doc = (__doc__ or "").split("\n\n", 1)[1].strip()
    body = (
        f"Command: `{command}` ({time.monotonic() - started:.0f} s on {os.cpu_count()} shared cores). Same twin, "
        "SLO, windows, warm-up and maxReplicas as the autoscaling tables; `oracle` is the true oracle. "
        f"{doc}\n\nLookbacks tried: {', '.join(map(str, LOOKBACKS))} windows.\n\n" + "\n".join(sections)
    )
    write_section(docs, "autoscale-reachable", "What the oracle asks of a policy that cannot see ahead", body)
    return 0
