"""``mmfleet bench autoscale``: our autoscaler beside the autoscalers users run today, on real traces.

Every policy runs in the same digital twin (``mmfleet_lab.twin``) on the same requests, seeing only
what Prometheus and the API server would show, with the same cold start. The ``mmfleet`` row is the
configuration that ships (``twin.Shipped``: ``autoscaler.cycle.decide`` with the operator's defaults,
learning the capacity per replica online); each baseline runs the setting frozen in ``bench/tuned.json``,
tuned on the training traces only (``bench.tune``). Every cell runs once per seed (the arrivals of the
scaled and spiked traffic, the synthetic mix and the scrape phase). The GPU-hours yardstick is the true
oracle (``bench.oracle.true_oracle``): the fewest replicas window by window, searched in the twin, ordered a cold
start ahead and checked to meet
every window; the zero-cold-start oracle and the fluid bound are reported beside it.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from mmfleet.api import SloSpec, seconds
from mmfleet_lab.bench import slo_metrics
from mmfleet_lab.bench.baselines import Profile
from mmfleet_lab.bench.baselines.static import StaticPolicy
from mmfleet_lab.bench.oracle import (
    ORACLES,
    Cell,
    Oracle,
    OracleError,
    fluid_lower_bound,
    fluid_replicas,
    initial_fleet,
    true_oracle,
)
from mmfleet_lab.bench.report import table, write_section
from mmfleet_lab.bench.traces import role as role_of
from mmfleet_lab.twin import H200_QWEN25VL7B, ReplicaParams, RunResult, Scenario, Shipped, scenario, simulate
from mmfleet_lab.twin.policy import Policy
from mmfleet_lab.twin.scenarios import REFERENCE_SLO, TraceFile, changes_mix, parse

WINDOW = 60.0
COLD_STARTS = (30.0, 90.0, 180.0, 420.0)
REACTIVE = ("hpa", "keda", "knative-kpa")
SEEDS = (0, 1, 2, 3, 4)
# maxReplicas, the same for every policy: twice the fluid bound's peak need of the cell, as a user sizes a
# budget from a known peak (the old 4 x gave reactive policies room to overshoot 4-fold).
MAX_REPLICAS_PER_PEAK = 2.0
ORACLE_PER_PEAK = 4.0
REFERENCES = ("oracle", "oracle-L0", "fluid-bound")  # yardsticks, not policies
# Every run starts from a fleet that has served for this long at its initial size: Prometheus' rate
# windows are full by then, so no policy mistakes the first minute's half-empty windows for a ramp.
# Windows and GPU-hours are scored from here on, for every policy and the oracle alike. The shipped
# autoscaler starts then too, as an operator (re)started on a serving fleet: its memory empty, its
# own warm-up hold ahead. Scoring starts SCORE_OFFSET later.
WARMUP = 120.0
# Windows and GPU-hours are scored from this long after the warm-up, for every policy and the oracles alike: a
# policy starts with an empty memory at WARMUP, and at a 30 s cold start the first window after it (which the
# initial fleet need not cover) once set a whole cell's figure (azure-code).
SCORE_OFFSET = 300.0
SCORED_FROM = WARMUP + SCORE_OFFSET

Progress = Callable[[str], None]
PROFILE_SECONDS = 900.0  # the one-replica run that measures the mean latency at μ_SLO
PROFILE_COLD_START = 90.0  # the profiling run's cold start; one replica serves throughout, so it never shows


@dataclass(frozen=True)
class Profiled:
    """A policy configured from the one-replica profile of the workload it is scored on (``profile_of``): every
    baseline (its frozen relative setting made absolute) and ``mmfleet-profiled``."""

    name: str
    make: Callable[[Profile], Policy | Shipped]


def resolve(policies: Sequence[Policy | Shipped | Profiled], profile: Profile) -> list[Policy | Shipped]:
    """The runnable policies, each ``Profiled`` one built in the parent, so workers get no closures to pickle."""
    return [p.make(profile) if isinstance(p, Profiled) else p for p in policies]


@dataclass(frozen=True)
class Row:
    scenario: str
    cold_start: float
    policy: str
    attainment: float
    spike_attainment: float
    over_share: float
    gpu_hours: float
    oracle_ratio: float
    actions_per_hour: float
    reversals_per_hour: float
    spike_reversals: float  # reversals whose scale-down came during a spike, per spike
    recover_seconds: float
    violation_minutes: float
    seconds: float  # wall time of the simulation
    note: str = ""  # how a yardstick was computed
    seed: int = 0
    failed: str = ""  # why the row is not a result (an oracle that misses its own check, an inert baseline)


def inert(row: Row, demand: np.ndarray) -> str:
    """Why a scaling policy's row is not a result when it made no change on a cell whose per-window need varies
    (a broken model, not a setting), or "" when it acted."""
    varies = demand.size > 0 and int(demand.max()) > int(demand.min())
    ours = row.policy.startswith("mmfleet")  # what ships never scaling is a result to report, not a broken model
    if varies and not ours and row.policy != "static" and row.policy not in REFERENCES and row.actions_per_hour == 0:
        return (
            f"{row.policy} never scaled on {row.scenario} (L={row.cold_start:.0f}s, seed {row.seed}) although "
            f"the need varies from {int(demand.min())} to {int(demand.max())} replicas"
        )
    return ""


def failed_row(name: str, cold_start: float, policy: str, seed: int, why: str) -> Row:
    """A row with no result, saying why; the other rows of its cell stand."""
    nan = math.nan
    return Row(name, cold_start, policy, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, 0.0, "", seed, why)


def _scored(result: RunResult, slo: SloSpec) -> tuple[np.ndarray, np.ndarray]:
    """Arrivals and latencies from ``SCORED_FROM`` on."""
    keep = result.arrival >= SCORED_FROM
    return result.arrival[keep], result.latency(slo.metric)[keep]


def evaluate(
    name: str, cold_start: float, policy: str, scn: Scenario, result: RunResult, slo: SloSpec, wall: float
) -> Row:
    arrival, latency = _scored(result, slo)
    verdicts = slo_metrics.windows(arrival, latency, seconds(slo.target), slo.percentile, WINDOW, origin=SCORED_FROM)
    spike_mask = slo_metrics.in_spikes(verdicts, scn.spikes)
    horizon = max(600.0, 2 * cold_start)
    actions, reversals = slo_metrics.actions_and_reversals(result.decisions, scn.duration, horizon)
    recover = max((slo_metrics.time_to_recover(verdicts, onset) for onset, _ in scn.spikes), default=float("nan"))
    return Row(
        scenario=name,
        cold_start=cold_start,
        policy=policy,
        attainment=slo_metrics.attainment(verdicts),
        spike_attainment=slo_metrics.attainment(verdicts, spike_mask) if scn.spikes else float("nan"),
        over_share=slo_metrics.share_over(latency, seconds(slo.target)),
        gpu_hours=result.gpu_seconds_from(SCORED_FROM) / 3600.0,
        oracle_ratio=float("nan"),
        actions_per_hour=actions,
        reversals_per_hour=reversals,
        spike_reversals=slo_metrics.reversals_per_spike(result.decisions, scn.spikes, horizon),
        recover_seconds=recover,
        violation_minutes=slo_metrics.violation_minutes(verdicts, WINDOW),
        seconds=wall,
    )


def _demand(scn: Scenario, capacity: float) -> np.ndarray:
    """c_w: replicas each window needs at the per-replica capacity at the SLO (the fluid bound)."""
    edges = np.arange(0.0, scn.duration + WINDOW, WINDOW)
    counts, _ = np.histogram(scn.requests.arrival, bins=edges)
    result: np.ndarray = fluid_replicas(counts / WINDOW, capacity)
    return result


@functools.lru_cache(maxsize=4)
def scenario_of(
    name: str, params: ReplicaParams, slo: SloSpec, trace: TraceFile | None = None, seed: int = 0
) -> Scenario:
    """Built once per process: workers get a name, not megabytes of arrays."""
    return scenario(name, params=params, reference_slo=slo, trace=trace, seed=seed)


def _fluid_hours(scn: Scenario, capacity: float) -> float:
    """The fluid bound over the scored windows (the last one as long as the trace leaves it)."""
    edges = np.r_[np.arange(SCORED_FROM, scn.duration, WINDOW), scn.duration]
    counts, _ = np.histogram(scn.requests.arrival, bins=edges)
    lengths = np.diff(edges)
    return fluid_lower_bound(counts / lengths, capacity, lengths)


@functools.lru_cache(maxsize=8)
def profile_of(name: str, params: ReplicaParams, slo: SloSpec, trace: TraceFile | None = None) -> Profile:
    """What a user measures on their workload ``name`` before configuring a baseline: μ_SLO, and one replica fed
    Poisson arrivals at μ_SLO from the workload's mix (seed 0, as a profiler does) for its mean latency, so
    Little's law gives the in-flight count per replica at capacity, and its P90 TTFT and TPOT; the mean tokens
    per request; the replica's vLLM limits. Measured once per scenario and process. It reads the workload's request
    mix and μ_SLO, never its arrival times: ``mean_replicas`` is left unknown (``tune.training_profile`` sets it
    from the training trace, the only place a static fleet is sized). For a cell whose mix changes (``SHIFTS``), the
    profile is of the mix before the change, as the user profiled it then."""
    scn = scenario_of(name, params, slo, trace)
    capacity, req = float(scn.info["mu_slo"]), scn.requests
    if changes_mix(name):
        req = req.take(np.flatnonzero(req.arrival < scn.spikes[0][0]))
    rng = np.random.default_rng(0)
    arrival = np.cumsum(rng.exponential(1.0 / capacity, size=int(capacity * PROFILE_SECONDS)))
    probe = Scenario(f"{name}-profile", req.take(rng.integers(0, len(req), arrival.size), arrival), PROFILE_SECONDS)
    one = simulate(probe, StaticPolicy(1), params=params, cold_start=PROFILE_COLD_START, slo=slo,
                   min_replicas=1, max_replicas=1, initial_replicas=1, seed=0)  # fmt: skip
    steady = (one.arrival >= PROFILE_SECONDS / 5) & np.isfinite(one.e2e)
    return Profile(
        capacity=capacity,
        mean_latency=float(np.mean(one.e2e[steady])),
        isl=float(np.mean(req.input_tokens + req.images * np.asarray(req.tokens_per_image))),
        osl=float(np.mean(req.output_tokens)),
        max_num_seqs=params.max_num_seqs,
        kv_capacity_tokens=float(params.kv_capacity_tokens),
        mean_replicas=math.nan,
        p90_ttft=float(np.percentile(one.ttft[steady], 90)),
        p90_tpot=float(np.percentile(one.itl[steady & (one.itl > 0)], 90)),  # one-token outputs have no TPOT
    )


def _run_oracle(
    name: str, cold_start: float, common: dict[str, Any], trace: TraceFile | None = None, keep: bool = True
) -> list[tuple[Row, RunResult | None]]:
    """The true oracle and the zero-cold-start oracle, scored like every policy; their runs only with ``keep``."""
    scn = scenario_of(name, common["params"], common["slo"], trace, common["seed"])
    slo, initial = common["slo"], common["initial_replicas"]
    # A yardstick, not a policy: it searches up to ORACLE_PER_PEAK x the peak need, past the policies' budget.
    limit = max(common["max_replicas"], math.ceil(ORACLE_PER_PEAK * _demand(scn, float(scn.info["mu_slo"])).max()))
    oracle_cell = Cell(scn, common["params"], slo, initial, limit, WARMUP, WINDOW, name)
    try:
        outcomes: tuple[Oracle | OracleError, ...] = true_oracle(oracle_cell, cold_start)
    except OracleError as error:
        outcomes = (error, error)
    rows: list[tuple[Row, RunResult | None]] = []
    for policy, oracle in zip(ORACLES, outcomes, strict=True):
        if isinstance(oracle, OracleError):
            rows.append((failed_row(name, cold_start, policy, common["seed"], str(oracle)), None))
            continue
        row = evaluate(name, cold_start, oracle.name, scn, oracle.result, slo, oracle.seconds)
        note = (f"{oracle.evaluations} window simulations in the search, windows raised after the replay: "
                f"{oracle.repairs}, {oracle.seconds:.0f} s")  # fmt: skip
        rows.append((replace(row, note=note, seed=common["seed"]), oracle.result if keep else None))
    return rows


def _run_policy(
    name: str,
    cold_start: float,
    policy: Policy | Shipped,
    common: dict[str, Any],
    trace: TraceFile | None = None,
    check: bool = True,
    keep: bool = True,
) -> list[tuple[Row, RunResult | None]]:
    """One run of ``policy``, as a list like ``_run_oracle``'s (the run itself only with ``keep``); with ``check``, a
    baseline that never acts on a varying trace is marked failed (a sweep records its actions instead, and never
    picks it)."""
    scn = scenario_of(name, common["params"], common["slo"], trace, common["seed"])
    started = time.monotonic()
    result = simulate(scn, policy, **common)
    wall = time.monotonic() - started
    row = evaluate(name, cold_start, policy.name, scn, result, common["slo"], wall)
    row = replace(row, seed=common["seed"])
    if check:
        row = replace(row, failed=inert(row, _demand(scn, float(scn.info["mu_slo"]))[int(SCORED_FROM // WINDOW) :]))
    return [(row, result if keep else None)]


def cell(
    name: str,
    cold_start: float,
    params: ReplicaParams,
    slo: SloSpec,
    trace: TraceFile | None = None,
    seed: int = 0,
    oversize: float = 1.0,
) -> tuple[float, np.ndarray, dict[str, Any]]:
    """One cell's per-replica capacity at the SLO, per-window demand, and ``simulate`` arguments; ``oversize``
    multiplies the warm-up fleet, as a user's first size or a fleet sized for a peak would."""
    scn = scenario_of(name, params, slo, trace, seed)
    capacity = float(scn.info["mu_slo"])
    demand = _demand(scn, capacity)
    fluid_initial = max(1, int(demand[: max(1, math.ceil((WARMUP + cold_start) / WINDOW))].max()))
    initial = initial_fleet(
        scn, params, slo, start=WARMUP, window=WINDOW, cold_start=cold_start, guess=fluid_initial,
        limit=math.ceil(ORACLE_PER_PEAK * max(1, demand.max())),
    )  # fmt: skip
    initial = math.ceil(initial * oversize - 1e-9)
    common: dict[str, Any] = {
        "params": params,
        "cold_start": cold_start,
        "slo": slo,
        "min_replicas": 1,
        "max_replicas": int(max(math.ceil(MAX_REPLICAS_PER_PEAK * demand.max()), 8, initial)),
        "initial_replicas": initial,
        "start": WARMUP,
        "seed": seed,
    }
    return capacity, demand, common


def run_cell(
    name: str,
    cold_start: float,
    params: ReplicaParams,
    slo: SloSpec,
    progress: Progress,
    workers: int,
    policies: Sequence[Policy | Shipped | Profiled],
    seeds: Sequence[int] = SEEDS,
    trace: TraceFile | None = None,
    oracle: bool = True,
    oversize: float = 1.0,
) -> tuple[list[Row], dict[str, RunResult]]:
    """``policies`` (the shipped autoscaler and the frozen baselines, each ``Profiled`` one configured from this
    scenario's ``profile_of``) and, with ``oracle``, the oracles on one scenario at one cold start, once per seed,
    spread over ``workers`` processes, with the fluid bound.
    Returns one row per policy and seed (× oracle against that seed's oracle) and the first seed's runs."""
    runnable = resolve(policies, profile_of(name, params, slo, trace))
    commons = {seed: cell(name, cold_start, params, slo, trace, seed, oversize)[2] for seed in seeds}
    total = len(seeds) * (len(runnable) + (1 if oracle else 0))
    # Only the first seed's runs are kept (for the plots): a run holds every request's timings, and keeping all of
    # them (gentd-diffusion: 3.7 M requests a run) grew the process past the machine's memory.
    first = seeds[0]
    done: dict[tuple[str, int], Row] = {}
    runs: dict[str, RunResult] = {}
    with ProcessPoolExecutor(max_workers=workers) as pool:
        jobs = [pool.submit(_run_oracle, name, cold_start, commons[s], trace, s == first) for s in seeds if oracle]
        jobs += [pool.submit(_run_policy, name, cold_start, p, commons[s], trace, True, s == first)
                 for s in seeds for p in runnable]  # fmt: skip
        for n, job in enumerate(as_completed(jobs), 1):
            for row, result in job.result():
                done[(row.policy, row.seed)] = row
                if result is not None:
                    runs[row.policy] = result
                got = (f"failed: {row.failed}" if row.failed else
                       f"{row.attainment:.1%} windows, {row.gpu_hours:.1f} GPU-h ({row.seconds:.0f}s)")  # fmt: skip
                progress(f"   [{n}/{total}] {name} L={cold_start:.0f}s seed {row.seed} {row.policy}: {got}")
    nan = math.nan
    rows: list[Row] = []
    for seed in seeds:
        scn = scenario_of(name, params, slo, trace, seed)
        capacity = float(scn.info["mu_slo"])
        note = f"ceil(λ_w / μ_SLO) replicas per window, μ_SLO = {capacity:.1f} req/s"
        fluid = Row(name, cold_start, "fluid-bound", nan, nan, nan, _fluid_hours(scn, capacity), nan, nan, nan, nan,
                    nan, nan, 0.0, note, seed)  # fmt: skip
        oracle_hours = done[("oracle", seed)].gpu_hours if oracle else math.nan
        order = [*(("oracle", "oracle-L0") if oracle else ()), *(p.name for p in runnable)]
        rows += [_with_ratio(r, oracle_hours) for r in (*(done[(n, seed)] for n in order[:2] if oracle), fluid)]
        rows += [_with_ratio(done[(n, seed)], oracle_hours) for n in order[2 if oracle else 0 :]]
    return rows, runs


@dataclass(frozen=True)
class Spread:
    """A metric over the seeds of a cell: mean, min and max."""

    mean: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        a = np.asarray(values, dtype=float)
        if a.size == 0 or np.all(np.isnan(a)):
            return cls(math.nan, math.nan, math.nan)
        return cls(float(np.nanmean(a)), float(np.nanmin(a)), float(np.nanmax(a)))


def summarize(rows: Sequence[Row]) -> Row:
    """One row for the seeds of a (scenario, cold start, policy): the mean of each metric over the seeds that did not
    fail (recovery: the worst); failed only when every seed did."""
    good = [r for r in rows if not r.failed] or list(rows)
    mean: dict[str, Any] = {f: Spread.of([getattr(r, f) for r in good]).mean for f in _METRICS}
    mean["recover_seconds"] = Spread.of([r.recover_seconds for r in good]).high
    failed = "" if len(good) < len(rows) or not rows[0].failed else "; ".join(r.failed for r in rows)
    return replace(good[0], **mean, failed=failed)


_METRICS = ("attainment", "spike_attainment", "over_share", "gpu_hours", "oracle_ratio", "actions_per_hour",
            "reversals_per_hour", "spike_reversals", "violation_minutes", "seconds")  # fmt: skip


def by_policy(rows: Sequence[Row]) -> dict[tuple[str, float, str], list[Row]]:
    """Rows grouped by (scenario, cold start, policy), in first-seen order."""
    groups: dict[tuple[str, float, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.scenario, r.cold_start, r.policy), []).append(r)
    return groups


def _with_ratio(row: Row, oracle_gpu_hours: float) -> Row:
    return replace(row, oracle_ratio=row.gpu_hours / oracle_gpu_hours if oracle_gpu_hours else math.nan)


def pct(value: float) -> str:
    return "-" if math.isnan(value) else f"{100 * value:.1f}"


def _secs(value: float) -> str:
    return "-" if math.isnan(value) else ("never" if math.isinf(value) else f"{value:.0f}")


def num(value: float, digits: int) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def spread(rows: Sequence[Row], field: str, fmt: Callable[[float], str]) -> str:
    """``mean (min-max)`` over the seeds, or the value alone when they agree or there is one seed."""
    return spread_values([getattr(r, field) for r in rows], fmt)


def spread_values(values: Sequence[float], fmt: Callable[[float], str]) -> str:
    """``spread`` of plain values: ``-`` when none is a number."""
    s = Spread.of(values)
    if math.isnan(s.mean):
        return "-"
    if fmt(s.low) == fmt(s.high):
        return fmt(s.mean)
    return f"{fmt(s.mean)} ({fmt(s.low)}–{fmt(s.high)})"


def cell_table(rows: Sequence[Row]) -> str:
    """One line per policy: the mean over the seeds and, for the scores, their range."""
    headers = ["policy", "seeds", "windows met %", "spike windows met %", "requests over SLO %", "GPU-h",
               "× oracle", "actions/h", "reversals/h", "reversals per spike", "worst recovery (s)",
               "violation-min"]  # fmt: skip
    body = []
    for (_, _, policy), group in by_policy(rows).items():
        m = summarize(group)
        failures = sum(1 for r in group if r.failed)
        label = f"{policy} (failed in {failures} of {len(group)})" if failures else policy
        body.append([
            label, str(len(group)), spread(group, "attainment", pct), pct(m.spike_attainment),
            spread(group, "over_share", pct), spread(group, "gpu_hours", lambda v: num(v, 1)),
            spread(group, "oracle_ratio", lambda v: num(v, 2)), num(m.actions_per_hour, 0),
            num(m.reversals_per_hour, 1), num(m.spike_reversals, 1), _secs(m.recover_seconds),
            spread(group, "violation_minutes",
            lambda v: num(v, 0)),
        ])  # fmt: skip
    return table(headers, body)


def _is_baseline(row: Row) -> bool:
    """A competitor's row that is a result: not a yardstick, not one of our own variants (such as the profiled row),
    not failed on every seed."""
    return row.policy not in REFERENCES and not row.failed and not row.policy.startswith("mmfleet")


def dominated_by(ours: Row, rows: Sequence[Row]) -> list[str]:
    """Baselines at least as good on both GPU-hours and attainment, and strictly better on one."""
    return [
        r.policy
        for r in rows
        if _is_baseline(r)
        and r.gpu_hours <= ours.gpu_hours
        and r.attainment >= ours.attainment
        and (r.gpu_hours < ours.gpu_hours or r.attainment > ours.attainment)
    ]


def verdicts(rows: Sequence[Row]) -> list[str]:
    """Our numbers against the issue's targets, per cell; reported whether met or not."""
    lines = []
    for key in sorted({(r.scenario, r.cold_start) for r in rows}, key=lambda k: (k[0], k[1])):
        cell = [r for r in rows if (r.scenario, r.cold_start) == key]
        ours = next((r for r in cell if r.policy == "mmfleet"), None)
        if ours is None:  # ``--policy`` left the shipped row out: nothing to judge
            continue
        name, cold = key
        parts = [f"{name} L={cold:.0f}s: {pct(ours.attainment)}% windows at {num(ours.oracle_ratio, 2)}× oracle"]
        peak = next((r for r in cell if r.policy == "static"), None)
        if peak is not None:
            saved = 1 - ours.gpu_hours / peak.gpu_hours
            parts.append(f"{100 * abs(saved):.0f}% {'fewer' if saved >= 0 else 'more'} GPU-h than the tuned static "
                         f"fleet ({pct(peak.attainment)}% windows)")  # fmt: skip
        baselines = [r for r in cell if _is_baseline(r) and not math.isnan(r.violation_minutes)]
        if not math.isnan(ours.spike_attainment) and baselines:
            # The spike target: at most half the violation-minutes of the baseline with the fewest, at no more than
            # 1.1 x its GPU-hours, and no reversal inside a spike. Only a cell with spikes has it: `bursts` and the
            # mix shifts are scored as steady hours.
            best = min(baselines, key=lambda r: (r.violation_minutes, r.gpu_hours))
            if best.violation_minutes:
                shown = f"{ours.violation_minutes / best.violation_minutes:.2f}×"
            else:  # no half of nothing to reach: as few is all there is
                shown = "∞×" if ours.violation_minutes else "as few"
            parts.append(f"violation-minutes {ours.violation_minutes:.1f} vs {best.policy}'s "
                         f"{best.violation_minutes:.1f} (the fewest of any baseline; {shown}) at "
                         f"{ours.gpu_hours / best.gpu_hours:.2f}× its GPU-h; {ours.spike_reversals:.1f} reversals "
                         "per spike")  # fmt: skip
        dominated = dominated_by(ours, cell)
        parts.append("Pareto-dominated by " + ", ".join(dominated) if dominated else "not Pareto-dominated")
        lines.append("- " + "; ".join(parts))
    return lines


def plot_spike(results: dict[str, RunResult], slo: SloSpec, title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    target = seconds(slo.target)
    for name, result in results.items():
        top.plot(result.times / 60, result.ready + result.starting, label=name, linewidth=1.2)
        verdict = slo_metrics.windows(
            result.arrival, result.latency(slo.metric), target, slo.percentile, WINDOW, origin=0
        )
        bottom.step(verdict.start / 60, np.minimum(verdict.quantile, 10 * target), where="post", label=name)
    bottom.axhline(target, color="black", linestyle="--", label=f"target {slo.target}")
    top.set_ylabel("replicas holding GPUs")
    bottom.set_ylabel(f"P{slo.percentile:g} {slo.metric} per minute (s)")
    bottom.set_yscale("log")
    bottom.set_xlabel("minutes")
    top.set_title(title)
    top.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_pareto(rows: Sequence[Row], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    for row in (r for r in rows if not math.isnan(r.attainment)):
        marker = "*" if row.policy == "mmfleet" else ("D" if row.policy in REFERENCES else "o")
        ax.scatter(row.oracle_ratio, 100 * row.attainment, marker=marker, s=120 if marker == "*" else 40)
        ax.annotate(row.policy, (row.oracle_ratio, 100 * row.attainment), fontsize=7, xytext=(4, 2),
                    textcoords="offset points")  # fmt: skip
    ax.set_xlabel("GPU-hours / oracle")
    ax.set_ylabel("windows meeting the SLO (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(
    scenarios: Sequence[str],
    cold_starts: Sequence[float],
    docs: Path,
    plots: Path,
    progress: Progress,
    policies: Sequence[Policy | Shipped | Profiled],
    seeds: Sequence[int] = SEEDS,
    workers: int = os.cpu_count() or 1,
    trace: TraceFile | None = None,
    oracle: bool = True,
    tuned_from: str = "",
    only: Sequence[str] = (),
    oversize: float = 1.0,
) -> int:
    """Run every cell, print its table, write the section and the plots; ``tuned_from`` says where the
    baselines' settings came from, ``only`` which policies were asked for (for the reproduce line), ``oversize``
    how much larger than the warm-up fleet every fleet starts (a section of its own)."""
    slo = REFERENCE_SLO
    params = H200_QWEN25VL7B
    shipped = Shipped()
    all_rows: list[Row] = []
    sections = []
    started = time.monotonic()
    shown_spike = next((n for n in scenarios if parse(n)[1] is not None), scenarios[0])
    shifts = all(changes_mix(n) for n in scenarios)  # mix-shift cells only: a section of their own
    stem = ("" if trace is None else f"-{Path(trace.path).stem}") + ("" if oversize == 1.0 else f"-start{oversize:g}x")
    stem += "-mix-shift" if shifts else ""
    shown = [r for r in ("oracle", "mmfleet", *REACTIVE)]
    for name in scenarios:
        for cold in cold_starts:
            progress(f"== {name} ({role_of(name)}), cold start {cold:.0f}s, seeds {', '.join(map(str, seeds))}")
            rows, results = run_cell(name, cold, params, slo, progress, workers, policies, seeds, trace, oracle,
                                     oversize)  # fmt: skip
            all_rows += rows
            text = cell_table(rows)
            print(f"\n{name}, cold start {cold:.0f}s\n{text}\n", flush=True)
            notes = "".join(f"- {r.policy} (seed {r.seed}): {r.note}\n" for r in rows if r.note and r.seed == seeds[0])
            notes += "".join(f"- {r.policy} (seed {r.seed}) **failed**: {r.failed}\n" for r in rows if r.failed)
            sections.append(f"### {name} ({role_of(name)}), cold start {cold:.0f} s\n\n{text}\n\n{notes}")
            if name == shown_spike and cold == sorted(cold_starts)[len(cold_starts) // 2]:
                title = f"{name}{stem}, cold start {cold:.0f}s, seed {seeds[0]}"
                plot_spike(
                    {k: v for k, v in results.items() if k in shown}, slo, title, plots / f"autoscale{stem}-spike.png"
                )
                means = [summarize(g) for g in by_policy(rows).values()]
                plot_pareto(means, f"{name}{stem}, cold start {cold:.0f}s, mean of {len(seeds)} seeds",
                            plots / f"autoscale{stem}-pareto.png")  # fmt: skip
    summary = verdicts([summarize(g) for g in by_policy(all_rows).values()])
    print("\n".join(summary))
    command = "mmfleet bench autoscale " + " ".join(
        [*trace_flags(trace), *(f"--scenario {s}" for s in scenarios), *(f"--cold-start {c:g}" for c in cold_starts),
         *(f"--seed {s}" for s in seeds), *(() if oracle else ("--no-oracle",)), *(f"--policy {p}" for p in only),
         *(() if oversize == 1.0 else (f"--start-oversized {oversize:g}",))]
    )  # fmt: skip
    body = (
        f"Command: `{command}` ({time.monotonic() - started:.0f} s on {os.cpu_count()} shared cores). "
        f"Twin: {params.name}; SLO P{slo.percentile:g} {slo.metric} ≤ {slo.target} over {WINDOW:.0f} s windows (a "
        "window groups requests by arrival and passes when that share of them met the target; one with fewer than "
        "20 requests joins the next; a request never finished counts as a miss); "
        "each scenario scaled so its mean load needs 20 replicas. Each cell runs once per seed (the arrivals of "
        "the scaled and spiked traffic, the synthetic request mix, the scrape phase); tables give the mean and, "
        "in brackets, the range over the seeds. Every policy gets the same maxReplicas, "
        f"{MAX_REPLICAS_PER_PEAK:g} × the cell's peak fluid need. Every fleet (the oracles' too) serves the first "
        f"{WARMUP:.0f} s with the fewest replicas that meet every window before a replica ordered at "
        f"{WARMUP:.0f} s can be Ready (searched in the twin, `oracle.initial_fleet`)"
        + ("" if oversize == 1.0 else f" times {oversize:g}, rounded up (`--start-oversized`)")
        + ", with no decisions, "
        f"so the rate windows are full when policies start; windows and GPU-hours are scored from {SCORE_OFFSET:.0f} s "
        f"later ({SCORED_FROM:.0f} s) for every policy and the oracles alike, so that no policy's figure is set by "
        "the first window after it starts with an empty memory. A row that is not a result (an oracle whose "
        "replayed plan still misses a window after its raises, a baseline that never scaled on a varying trace) is "
        "marked failed with the reason, and the cell's other rows stand. Policies "
        "see only scraped metrics (15 s scrape, 1 m rate window). The `mmfleet` row is the autoscaler `mmfleet run` "
        f"ships: `autoscaler.cycle.decide` every {shipped.interval:g} s with the operator's default cold start "
        f"({shipped.default_cold_start:g} s until a pod has been seen turn Ready), learning the capacity per replica "
        "online, starting with an empty memory at the end of the warm-up; `mmfleet-profiled` is the same with "
        "`spec.autoscaling.capacityPerReplica` set to μ_SLO of the scored scenario's one-replica profile (one "
        f"replica fed Poisson arrivals at μ_SLO from the scenario's mix for {PROFILE_SECONDS:.0f} s, `profile_of`), "
        "the profile every baseline is configured from. Each baseline runs its setting frozen on the training "
        f"traces ({tuned_from}), relative to that profile (an in-flight target as a multiple of Little's law per "
        "replica, say), made absolute for the scored scenario's profile as a user re-derives a manifest from a "
        "profiling run of their own traffic; the static fleet keeps its absolute size from the training traces. "
        "Nothing else measured on the scored scenario reaches a policy.\n\n"
        "The yardstick (`× oracle`) is the true oracle of the same seed (window by window the fewest Ready "
        "replicas that meet the SLO, ordered one cold start ahead, replayed and checked to meet every window); "
        "`oracle-L0` is the same with replicas Ready when ordered; `fluid-bound` bills ceil(λ_w / μ_SLO).\n\n"
        "Against the issue's targets (means over the seeds, measured, met or not):\n\n" + "\n".join(summary) + "\n\n"
        f"![replicas and P90 through a spike](img/autoscale{stem}-spike.png)\n\n"
        f"![GPU-hours against attainment](img/autoscale{stem}-pareto.png)\n\n" + "\n".join(sections)
    )
    # An oversized start is a section of its own, whatever the scenarios' roles (its tables name each one's).
    held_out = " on held-out traces" if oversize == 1.0 and not shifts else ""
    title = f"Autoscaling policies{held_out} (digital twin)" + ("" if trace is None else f", {trace.path}")
    title += "" if oversize == 1.0 else f", every fleet started at {oversize:g}x the warm-up fleet"
    title += ", the token mix changed where a spike would start" if shifts else ""
    write_section(docs, f"autoscale{stem}", title, body)
    return 0


def trace_flags(trace: TraceFile | None) -> list[str]:
    """The command-line flags that name ``trace``, for the reproduce line."""
    if trace is None:
        return []
    flags = [f"--trace {trace.path}", f"--time-column {trace.time_column}"]
    for flag, value in (
        ("--input-column", trace.input_column),
        ("--output-column", trace.output_column),
        ("--images-column", trace.images_column),
        ("--count-column", trace.count_column),
    ):
        if value is not None:
            flags.append(f"{flag} {value}")
    if trace.time_scale != 1.0:
        flags.append(f"--time-scale {trace.time_scale:g}")
    return flags
