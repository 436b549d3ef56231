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

A forecast is outside that family: it can order before the need it expects has been seen. ``forecast-bound`` is
the same search over ``ceil(h × f[w])``, where ``f[w]`` is a linear forecast of window w's need from the ``p``
needs known ``lead`` or more windows earlier and an intercept (so it fits a steady trend too), its coefficients
fitted by least squares on the cell itself: the forecaster a user could only have in hindsight, and fitted to the
very windows it forecasts, which flatters it (at most one coefficient per ``ROWS_PER_COEFFICIENT`` windows keeps
it from reproducing them). Also a search, not a proof: the fit minimises squared error before one headroom is
applied, so a linear forecaster fitted for coverage could pay less. An hour of trace holds no daily cycle to
forecast from, so none is tried.

``forecast-online`` is the forecast a policy can run: the same autoregression refitted before each window on the
needs known by then only (those ``lead`` or more windows back), and until there are ``ROWS_PER_COEFFICIENT``
known rows per coefficient, the last need known (``reactive-exact``'s base). Its headroom and order are still
searched on the cell, as the reactive family's are; only its coefficients are causal.
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
import numpy.typing as npt

from mmfleet_lab.bench import autoscale
from mmfleet_lab.bench.oracle import Cell, IntArray, OracleError, failing_windows, found, true_oracle
from mmfleet_lab.bench.oracle import replay as replay_counts
from mmfleet_lab.bench.report import table, write_section
from mmfleet_lab.bench.traces import role as role_of
from mmfleet_lab.twin import H200_QWEN25VL7B
from mmfleet_lab.twin.scenarios import REFERENCE_SLO, TraceFile

LOOKBACKS = (0, 1, 2, 4, 8, 16, 32)  # up to half the hour: the peak a fleet that rarely scales down holds
ORDERS = (1, 2, 4, 8)  # inputs of the forecast: from the last need known up to the last 8 windows
ROWS_PER_COEFFICIENT = 4  # windows a forecast's fit needs per coefficient (an hour has 57 from the warm-up: p = 8 fits)
RAISE = 1.05  # the headroom's step when a replay still misses a window
RAISES = 8
LOWEST = 0.5  # the bisection's floor for the headroom
BISECTIONS = 5

Progress = Callable[[str], None]
FloatArray = npt.NDArray[np.float64]


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


def forecast_inputs(need: IntArray, lead: int, order: int) -> FloatArray:
    """One row per window from ``lead`` on: 1 and the ``order`` needs known then, need[w - lead - j] for j < order
    (the earliest need where the trace has no such window yet)."""
    windows = np.arange(lead, need.size)
    lags = np.maximum(windows[:, None] - lead - np.arange(order)[None, :], 0)
    return np.column_stack([np.ones(windows.size), need.astype(np.float64)[lags]])


def forecast_need(need: IntArray, lead: int, order: int) -> FloatArray | None:
    """For each window, a linear forecast of its need from ``forecast_inputs`` (an autoregression with an
    intercept, so a steady trend is fitted too), by least squares on the whole cell: coefficients in hindsight,
    inputs only from the past; at least one replica. Windows before ``lead`` keep their own need. None when the
    cell has fewer than ``ROWS_PER_COEFFICIENT`` windows per coefficient: a fit that close to one window per
    coefficient reproduces the need instead of forecasting it."""
    if order < 1:
        raise ValueError(f"order: {order} inputs; at least 1")
    values = need.astype(np.float64)
    inputs = forecast_inputs(need, lead, order)
    if inputs.shape[0] < ROWS_PER_COEFFICIENT * inputs.shape[1]:
        return None
    coefficients, *_ = np.linalg.lstsq(inputs, values[lead:], rcond=None)
    forecast = values.copy()
    forecast[lead:] = inputs @ coefficients
    np.maximum(forecast, 1.0, out=forecast)
    return forecast


def online_forecast(need: IntArray, lead: int, order: int) -> FloatArray:
    """For each window, ``forecast_need``'s autoregression fitted on the rows known when the window's replicas
    must be ordered (windows up to ``lead`` before it); the last known need while there are too few of them."""
    if order < 1:
        raise ValueError(f"order: {order} inputs; at least 1")
    values = need.astype(np.float64)
    inputs = forecast_inputs(need, lead, order)
    forecast = trailing_need(need, lead, 0).astype(np.float64)
    for w in range(lead, need.size):
        known = w - 2 * lead + 1  # rows of windows lead .. w - lead, whose need is known at w - lead
        if known < ROWS_PER_COEFFICIENT * inputs.shape[1]:
            continue
        coefficients, *_ = np.linalg.lstsq(inputs[:known], values[lead : lead + known], rcond=None)
        forecast[w] = float(inputs[w - lead] @ coefficients)
    np.maximum(forecast, 1.0, out=forecast)
    return forecast


def headroom_counts(
    base: IntArray | FloatArray, need: IntArray, lead: int, headroom: float, cap: int | None = None
) -> IntArray:
    """ceil(headroom × base) from ``lead`` on, at most ``cap`` (the policies' maxReplicas); the need itself
    before (no order can land there, for any policy)."""
    counts: IntArray = np.ceil(headroom * base - 1e-9).astype(np.int64)
    if cap is not None:
        np.minimum(counts, cap, out=counts)
    counts[:lead] = need[:lead]
    return counts


def reactive_counts(need: IntArray, lead: int, lookback: int, headroom: float, cap: int | None = None) -> IntArray:
    """The reactive family: ``headroom`` over the trailing need."""
    return headroom_counts(trailing_need(need, lead, lookback), need, lead, headroom, cap)


def covering_headroom(need: IntArray, base: IntArray | FloatArray, lead: int) -> float:
    """The smallest headroom over ``base`` whose counts reach every window's need."""
    return float((need[lead:] / base[lead:]).max(initial=1.0))


@dataclass(frozen=True)
class Member:
    """One member of a family (a lookback, or a forecast's order) at one headroom, replayed."""

    label: str
    headroom: float
    row: autoscale.Row
    misses: int


def cheapest(
    cell: Cell, need: IntArray, base: IntArray | FloatArray, cold_start: float, initial: int, policy: str, label: str,
    cap: int | None = None,
) -> Member:  # fmt: skip
    """The cheapest headroom over ``base`` found that meets every window (or the last tried, with its misses),
    replayed and scored like every policy: raised from the covering headroom until a replay meets every window,
    then bisected down towards ``LOWEST`` (a window can pass below the oracle's count when earlier windows had
    headroom)."""
    lead = lead_windows(cold_start, cell.window)

    def tried(h: float) -> Member:
        result = replay_counts(cell, headroom_counts(base, need, lead, h, cap), cold_start, policy)
        misses = len(failing_windows(cell, result))
        row = autoscale.evaluate(cell.label, cold_start, policy, cell.scenario, result, cell.slo, 0.0)
        del result
        gc.collect()  # a run's engine and metric book refer to each other: free each replay (GBs on spikes)
        return Member(label, h, replace(row, note=f"{label}, h={h:.2f}"), misses)

    h = covering_headroom(need, base, lead)
    member = tried(h)
    for _ in range(RAISES):
        if not member.misses:
            break
        h *= RAISE
        member = tried(h)
    if not member.misses:
        low = LOWEST
        for _ in range(BISECTIONS):
            lower = tried((low + member.headroom) / 2)
            if lower.misses:
                low = lower.headroom
            else:
                member = lower
    return member


def members(cell: Cell, need: IntArray, cold_start: float, initial: int, cap: int | None = None) -> list[Member]:
    """The reactive family's cheapest member per lookback."""
    lead = lead_windows(cold_start, cell.window)
    return [
        cheapest(cell, need, trailing_need(need, lead, k), cold_start, initial, "reactive-bound", f"k={k}", cap)
        for k in LOOKBACKS
    ]


def forecasters(cell: Cell, need: IntArray, cold_start: float, initial: int, cap: int | None = None) -> list[Member]:
    """The forecasting family's cheapest member per order the cell's length can fit."""
    lead = lead_windows(cold_start, cell.window)
    return [
        cheapest(cell, need, base, cold_start, initial, "forecast-bound", f"p={p}", cap)
        for p in ORDERS
        if (base := forecast_need(need, lead, p)) is not None
    ]


def online(cell: Cell, need: IntArray, cold_start: float, initial: int, cap: int | None = None) -> list[Member]:
    """The online forecast's cheapest member per order."""
    lead = lead_windows(cold_start, cell.window)
    return [
        cheapest(cell, need, online_forecast(need, lead, p), cold_start, initial, "forecast-online", f"p={p}", cap)
        for p in ORDERS
    ]


def _best(tried: Sequence[Member], name: str, cold_start: float, seed: int, policy: str) -> autoscale.Row:
    """The cheapest member that met every window, or a failed row naming what was tried."""
    meeting = [m for m in tried if not m.misses]
    if not meeting:
        why = "no member met every window: " + ", ".join(
            f"{m.label} h={m.headroom:.2f} missed {m.misses}" for m in tried
        )
        return autoscale.failed_row(name, cold_start, policy, seed, why)
    return min(meeting, key=lambda m: m.row.gpu_hours).row


def _cell_seed(name: str, cold_start: float, seed: int, trace: TraceFile | None = None) -> list[autoscale.Row]:
    """The oracle, the reactive family's two rows and the forecasts' on one cell and seed (the policies' rows are in
    the autoscaling tables: this bound is the trace's, whatever policy runs on it). An oracle that fails its own
    check is a failed row, and with no needs known the bounds are not run; a family none of whose members meets
    every window is a failed row, and the others stand."""
    params, slo = H200_QWEN25VL7B, REFERENCE_SLO
    _, demand, common = autoscale.cell(name, cold_start, params, slo, trace, seed)
    scn = autoscale.scenario_of(name, params, slo, trace, seed)
    initial = common["initial_replicas"]
    limit = max(common["max_replicas"], math.ceil(autoscale.ORACLE_PER_PEAK * demand.max()))
    cell = Cell(scn, params, slo, initial, limit, autoscale.WARMUP, autoscale.WINDOW, name)
    began = time.monotonic()
    try:
        oracle = found(true_oracle(cell, cold_start)[0])
    except OracleError as error:
        return [autoscale.failed_row(name, cold_start, "oracle", seed, str(error))]
    rows = [autoscale.evaluate(name, cold_start, "oracle", scn, oracle.result, slo, time.monotonic() - began)]
    lead = lead_windows(cold_start, cell.window)
    exact = replay_counts(cell, reactive_counts(oracle.ready, lead, 0, 1.0), cold_start, "reactive-exact")
    rows.append(autoscale.evaluate(name, cold_start, "reactive-exact", scn, exact, slo, 0.0))
    cap = common["max_replicas"]
    for policy, family in (("reactive-bound", members), ("forecast-bound", forecasters), ("forecast-online", online)):
        rows.append(_best(family(cell, oracle.ready, cold_start, initial, cap), name, cold_start, seed, policy))
    hours = rows[0].gpu_hours
    return [replace(r, seed=seed, oracle_ratio=r.gpu_hours / hours) for r in rows]


HEADERS = ("policy", "seeds", "windows met %", "violation-min", "GPU-h", "× oracle", "picked per seed")


def cell_table(rows: Sequence[autoscale.Row]) -> str:
    lines = []
    for policy, group in autoscale.by_policy(rows).items():
        notes = "; ".join(
            f"seed {r.seed} failed: {r.failed}" if r.failed else r.note for r in group if r.note or r.failed
        )
        lines.append([
            policy[2], len(group), autoscale.spread(group, "attainment", autoscale.pct),
            autoscale.spread(group, "violation_minutes", lambda v: autoscale.num(v, 0)),
            autoscale.spread(group, "gpu_hours", lambda v: autoscale.num(v, 1)),
            autoscale.spread(group, "oracle_ratio", lambda v: autoscale.num(v, 2)), notes or "-",
        ])  # fmt: skip
    return table(HEADERS, lines)


def main(
    scenarios: Sequence[str], cold_starts: Sequence[float], seeds: Sequence[int], docs: Path, progress: Progress,
    workers: int = os.cpu_count() or 1, trace: TraceFile | None = None,
) -> int:  # fmt: skip
    """Run every cell and seed (on ``trace`` if given), print the tables and write them to ``docs``."""
    started = time.monotonic()
    sections = []
    for name in scenarios:
        for cold in cold_starts:
            progress(f"== {name} ({role_of(name)}), cold start {cold:.0f}s, seeds {', '.join(map(str, seeds))}")
            rows: list[autoscale.Row] = []
            with ProcessPoolExecutor(max_workers=workers) as pool:
                jobs = [pool.submit(_cell_seed, name, cold, s, trace) for s in seeds]
                for job in as_completed(jobs):
                    got = job.result()
                    rows += got
                    progress("   seed " + str(got[0].seed) + ": " + ", ".join(
                        f"{r.policy} failed" if r.failed else f"{r.policy} {r.attainment:.1%} {r.oracle_ratio:.2f}x"
                        for r in got))  # fmt: skip
            rows.sort(key=lambda r: r.seed)
            text = cell_table(rows)
            print(f"\n{name}, cold start {cold:.0f}s\n{text}\n", flush=True)
            sections.append(f"### {name} ({role_of(name)}), cold start {cold:.0f} s\n\n{text}\n")
    command = "mmfleet bench reachable " + " ".join(
        [*autoscale.trace_flags(trace), *(f"--scenario {s}" for s in scenarios),
         *(f"--cold-start {c:g}" for c in cold_starts), *(f"--seed {s}" for s in seeds)]
    )  # fmt: skip
    doc = (__doc__ or "").split("\n\n", 1)[1].strip()
    body = (
        f"Command: `{command}` ({time.monotonic() - started:.0f} s on {os.cpu_count()} shared cores). Same twin, "
        "SLO, windows, warm-up and maxReplicas as the autoscaling tables; `oracle` is the true oracle. "
        f"{doc}\n\nLookbacks tried (k): {', '.join(map(str, LOOKBACKS))} windows; forecast orders (p): "
        f"{', '.join(map(str, ORDERS))}.\n\n" + "\n".join(sections)
    )
    stem = "" if trace is None else f"-{Path(trace.path).stem}"
    title = "What the oracle asks of a policy that cannot see ahead" + ("" if trace is None else f", {trace.path}")
    write_section(docs, f"autoscale-reachable{stem}", title, body)
    return 0
