"""The yardstick every policy's GPU-hours are divided by: a true oracle, computed in the twin.

The benchmark's section of ``docs/benchmarks.md`` reports it beside two relaxations:

- ``fluid_replicas`` / ``fluid_lower_bound``: c_w = ceil(λ_w / μ_SLO) per window and its GPU-hours, which
  bill no cold start and no queue carried between windows;
- the zero-cold-start oracle: ``true_oracle``'s schedule with replicas Ready the moment they are ordered.

``true_oracle`` knows the whole trace. ``ready_counts`` walks the scored windows in order and, for each,
searches the fewest Ready replicas that meet the SLO in that window given the counts already fixed for
the windows before it, each candidate simulated from a copy of the twin taken at the window's start
(``twin.replay.Replay``). ``held_plan`` orders every replica one cold start before it must be Ready,
billed from the order (a fleet pays from the moment its pod holds GPUs), and keeps a replica through an
idle gap of at most one cold start (ski rental: releasing and re-ordering it would bill a whole cold
start). The plan is then replayed through ``simulate`` with the cold start, as every policy is scored,
and each window must pass: a failing window gets one more replica and the plan is replayed again (the
search judged each window before the counts after it were fixed); if windows still fail, or no count up
to the limit meets one, ``OracleError`` says which.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from mmfleet.api import SloSpec, clamp_replicas, seconds
from mmfleet.autoscaler import Decision
from mmfleet_lab.bench import slo_metrics
from mmfleet_lab.twin import ReplicaParams, RunResult, Scenario, simulate
from mmfleet_lab.twin.policy import LabObservation
from mmfleet_lab.twin.replay import Replay

IntArray = npt.NDArray[np.int64]
ORACLES = ("oracle", "oracle-L0")  # at the cell's cold start, and with replicas Ready when ordered
REPAIR_ROUNDS = 6  # rounds of raising the failing windows, each replayed, before giving up


class OracleError(RuntimeError):
    """No schedule the oracle can build meets every window."""


def _as_counts(values: Sequence[float] | npt.NDArray[np.generic], what: str) -> IntArray:
    array = np.asarray(values, dtype=float)
    if array.ndim != 1:
        raise ValueError(f"{what} must be one-dimensional, got shape {array.shape}")
    if np.any(~np.isfinite(array)) or np.any(array < 0):
        raise ValueError(f"{what} must be finite and non-negative")
    return np.ceil(array - 1e-9).astype(np.int64)


def fluid_replicas(
    arrival_rate: Sequence[float] | npt.NDArray[np.floating],
    capacity_per_replica: float | Sequence[float] | npt.NDArray[np.floating],
) -> IntArray:
    """c_w = ceil(λ_w / μ_SLO(mix_w)) per window; ``capacity_per_replica`` is one μ or one per window."""
    rate = np.asarray(arrival_rate, dtype=float)
    capacity = np.broadcast_to(np.asarray(capacity_per_replica, dtype=float), rate.shape)
    if np.any(capacity <= 0):
        raise ValueError("capacity_per_replica must be positive")
    return _as_counts(rate / capacity, "arrival_rate / capacity")


def fluid_lower_bound(
    arrival_rate: Sequence[float] | npt.NDArray[np.floating],
    capacity_per_replica: float | Sequence[float] | npt.NDArray[np.floating],
    window: float | Sequence[float] | npt.NDArray[np.floating],
    gpus_per_replica: int = 1,
) -> float:
    """LB = Σ_w c_w · W_w · g in GPU-hours (``window``: one length, or one per window for a short last one).

    Only approximately a lower bound: it holds when the steady-state μ_SLO bounds what a replica can
    sustain within one window, and it bills no cold start and no queue carried between windows.
    """
    replicas = fluid_replicas(arrival_rate, capacity_per_replica)
    return float((replicas * np.broadcast_to(np.asarray(window, dtype=float), replicas.shape)).sum()) * (
        gpus_per_replica / 3600.0
    )


@dataclass(frozen=True)
class SchedulePolicy:
    """Replays a per-step replica plan with perfect foresight; it ignores every observation.

    ``replicas[k]`` holds from ``start + k × step``; past the end the last value holds. Kept within
    the fleet's [min, max] like any other policy.
    """

    replicas: tuple[int, ...]
    step: float
    name: str = "oracle"
    interval: float = 15.0
    start: float = 0.0

    @classmethod
    def from_schedule(
        cls, schedule: Sequence[int] | npt.NDArray[np.integer], step: float, *, name: str = "oracle"
    ) -> SchedulePolicy:
        """From ``held_plan``'s output; decides once per step, on the step boundaries."""
        return cls(tuple(int(n) for n in schedule), step, name=name, interval=step)

    def initial_state(self) -> None:
        return None

    def decide(self, observation: LabObservation, state: None) -> Decision:
        obs = observation
        if not self.replicas:
            return Decision(obs.current, f"empty schedule: holding {obs.current}", state)
        index = min(len(self.replicas) - 1, max(0, math.floor((obs.time - self.start) / self.step + 1e-9)))
        planned = self.replicas[index]
        n = clamp_replicas(planned, obs.min_replicas, obs.max_replicas)
        bounded = "" if n == planned else f" (bounded from {planned})"
        return Decision(n, f"schedule step {index}: {n} replicas{bounded}", state)


def plan_step(window: float, cold_start: float, start: float) -> float:
    """The plan's time step: the largest whole number of seconds that divides all three."""
    values = (window, cold_start, start)
    if any(v < 0 or abs(v - round(v)) > 1e-9 for v in values) or window <= 0:
        raise ValueError(f"the oracle plans in whole seconds: window, cold start and start were {values}")
    return float(math.gcd(*(round(v) for v in values)))


def held_plan(
    ready: Sequence[int] | IntArray, *, initial: int, start: float, window: float, cold_start: float,
    horizon: float,
) -> IntArray:  # fmt: skip
    """Replicas holding GPUs in each ``plan_step`` from t = 0, so that ``ready[w]`` are Ready from
    ``start + w × window`` (and ``initial`` before ``start``, Ready at t = 0 like every policy's fleet).

    Replica j is needed wherever the Ready count is at least j. It is ordered ``cold_start`` before each
    of its busy runs and held from then; a gap of at most ``cold_start`` between two runs is bridged,
    since re-ordering would bill as long. ``ValueError`` if a replica beyond ``initial`` would have to be
    ordered before the first step, when no decision can be taken yet.
    """
    step = plan_step(window, cold_start, start)
    counts = _as_counts(ready, "ready")
    if counts.size == 0:
        raise ValueError("ready must name at least one window")
    t = np.arange(math.ceil(horizon / step - 1e-9)) * step
    index = np.clip(np.floor((t - start) / window + 1e-9).astype(np.int64), 0, counts.size - 1)
    need = np.where(t < start - 1e-9, initial, counts[index])
    lead = round(cold_start / step)
    plan = np.zeros(need.shape, dtype=np.int64)
    for level in range(1, int(need.max(initial=0)) + 1):
        busy = np.flatnonzero(need >= level)
        breaks = np.flatnonzero(np.diff(busy) > lead + 1)  # a gap of more than ``lead`` steps
        starts = np.concatenate(([busy[0]], busy[breaks + 1]))
        ends = np.concatenate((busy[breaks] + 1, [busy[-1] + 1]))
        for first, end in zip(starts, ends, strict=True):
            warm = first == 0 and level <= initial  # Ready since t = 0
            ordered = 0 if warm else int(first) - lead
            if not warm and ordered < 1:
                raise ValueError(f"replica {level} must be Ready at {first * step:g} s, before it can be ordered")
            plan[ordered:end] += 1
    return plan


def _smallest(passes: Callable[[int], bool], guess: int, lowest: int, highest: int) -> int | None:
    """The smallest count in [lowest, highest] that passes, searched from ``guess`` outwards then bisected
    (passing is taken to be monotone in the count); None if ``highest`` fails."""
    guess = min(max(guess, lowest), highest)
    failed, passed = lowest - 1, None
    if passes(guess):
        passed, stride = guess, 1
        while passed - stride > failed:
            if not passes(passed - stride):
                failed = passed - stride
                break
            passed, stride = passed - stride, 2 * stride
    else:
        failed, stride = guess, 1
        while passed is None:
            k = min(failed + stride, highest)
            if passes(k):
                passed = k
            elif k == highest:
                return None
            else:
                failed, stride = k, 2 * stride
    while passed - failed > 1:
        mid = (failed + passed) // 2
        if passes(mid):
            passed = mid
        else:
            failed = mid
    return passed


def initial_fleet(
    scenario: Scenario, params: ReplicaParams, slo: SloSpec, *, start: float, window: float, cold_start: float,
    guess: int, limit: int,
) -> int:  # fmt: skip
    """The fewest replicas that, Ready from t = 0, meet every window no decision can change: those that begin
    before ``start + cold_start``, when the first replica a policy orders at ``start`` is Ready (the first
    window at least). Every policy starts from it; a per-minute fluid estimate instead missed bursts within a
    minute (azure-code, 180-240 s: 52 replicas by the fluid rule, 59 needed), which no count could then repair.
    ``OracleError`` if not even ``limit`` replicas meet them."""
    arrival = scenario.requests.arrival
    end = start + max(window, window * math.ceil(cold_start / window - 1e-9))
    lo, hi = np.searchsorted(arrival, [start, end], side="left")
    if hi == lo:
        return max(1, guess)

    def passes(n: int) -> bool:
        run = Replay(scenario, params, n)
        run.advance(min(end, scenario.duration) + seconds(slo.target))
        latency = run.latency(slo.metric)[lo:hi]
        verdict = slo_metrics.windows(
            arrival[lo:hi], latency, seconds(slo.target), slo.percentile, window, origin=start
        )
        return bool(verdict.passed.all())

    found = _smallest(passes, guess, 1, limit)
    if found is None:
        raise OracleError(
            f"{scenario.name}: no fleet of up to {limit} replicas meets the windows from {start:g} to {end:g} s"
        )
    return found


@dataclass(frozen=True)
class Cell:
    """What the oracle needs of one benchmark cell; ``label`` names it in errors."""

    scenario: Scenario
    params: ReplicaParams
    slo: SloSpec
    initial: int  # Ready replicas from t = 0 until ``start``
    max_replicas: int  # the limit of the search
    start: float  # scoring starts here (the benchmark's warm-up)
    window: float
    label: str


def _window_passes(arrival: np.ndarray, latency: np.ndarray, slo: SloSpec, window: float, origin: float) -> bool:
    verdict = slo_metrics.windows(arrival, latency, seconds(slo.target), slo.percentile, window, origin=origin)
    return bool(verdict.passed.all())


def ready_counts(cell: Cell, cold_start: float) -> tuple[IntArray, int]:
    """Ready replicas per scored window, fewest first window by window (see the module docstring), and
    the number of window simulations it took.

    A window is judged on the requests arriving in it, each simulated until it has finished or has been
    in flight longer than the target, with the candidate count held until then. Before the first step
    plus ``cold_start`` no replica beyond ``initial`` can be Ready, so the count is capped there.
    """
    scn, slo = cell.scenario, cell.slo
    arrival = scn.requests.arrival
    target = seconds(slo.target)
    if int(np.searchsorted(arrival, cell.start, side="left")) == arrival.size:
        raise ValueError(f"{cell.label}: no request arrives after {cell.start:g} s")
    earliest = plan_step(cell.window, cold_start, cell.start) + cold_start
    run = Replay(scn, cell.params, cell.initial)
    run.advance(cell.start)
    counts: list[int] = []
    evaluations = 0
    n = cell.initial
    gc.freeze()
    try:
        for w in range(math.ceil((scn.duration - cell.start) / cell.window - 1e-9)):
            t0 = cell.start + w * cell.window
            t1 = min(t0 + cell.window, scn.duration)
            lo, hi = np.searchsorted(arrival, [t0, t0 + cell.window], side="left")
            tried: dict[int, bool] = {}

            def passes(
                k: int, lo: int = lo, hi: int = hi, t0: float = t0, t1: float = t1, tried: dict[int, bool] = tried
            ) -> bool:
                nonlocal evaluations
                if k not in tried:
                    trial = run.copy()
                    trial.scale(k)
                    trial.advance(t1 + target)
                    evaluations += 1
                    latency = trial.latency(slo.metric)[lo:hi]
                    tried[k] = _window_passes(arrival[lo:hi], latency, slo, cell.window, t0)
                    # The engine and its metric book refer to each other, so only the cycle collector frees a
                    # copy: collect now (what existed before the search is frozen, so this is quick), or
                    # copies of the whole run's state pile up by the gigabyte.
                    del trial
                    gc.collect()
                return tried[k]

            limit = cell.initial if t0 < earliest - 1e-9 else cell.max_replicas
            found = _smallest(passes, n, 1, limit) if hi > lo else 1
            if found is None:
                raise OracleError(
                    f"{cell.label}, cold start {cold_start:g} s: window {w} ({t0:g}-{t1:g} s) misses the SLO "
                    f"with every count up to {limit} replicas"
                )
            n = found
            run.scale(n)
            run.advance(t1)
            counts.append(n)
    finally:
        gc.unfreeze()
    return np.asarray(counts, dtype=np.int64), evaluations


@dataclass(frozen=True, eq=False)
class Oracle:
    """A schedule that meets every scored window, and its replay through ``simulate``."""

    name: str
    ready: IntArray  # Ready replicas per scored window
    result: RunResult
    evaluations: int  # window simulations of the search
    repairs: int  # windows raised after a replay
    seconds: float  # wall time


def replay(cell: Cell, ready: IntArray, cold_start: float, name: str) -> RunResult:
    """``held_plan`` of ``ready`` run through ``simulate`` with the cold start, as every policy is scored.
    ``ValueError`` if a replica would have to be ordered before the first step."""
    plan = held_plan(
        ready, initial=cell.initial, start=cell.start, window=cell.window, cold_start=cold_start,
        horizon=cell.scenario.duration,
    )  # fmt: skip
    return simulate(
        cell.scenario, SchedulePolicy.from_schedule(plan, plan_step(cell.window, cold_start, cell.start), name=name),
        params=cell.params, cold_start=cold_start, slo=cell.slo, min_replicas=1,
        max_replicas=max(cell.max_replicas, int(plan.max())), initial_replicas=cell.initial, start=0.0,
    )  # fmt: skip


def failing_windows(cell: Cell, result: RunResult) -> list[int]:
    """The scored windows of ``result`` that miss the SLO, by index from ``cell.start``."""
    keep = result.arrival >= cell.start
    arrival = result.arrival[keep]
    verdicts = slo_metrics.windows(
        arrival, result.latency(cell.slo.metric)[keep], seconds(cell.slo.target), cell.slo.percentile, cell.window,
        origin=cell.start,
    )  # fmt: skip
    return [
        math.floor((s - cell.start) / cell.window + 1e-9) for s, ok in zip(verdicts.start, verdicts.passed, strict=True)
        if not ok
    ]  # fmt: skip


def verified(cell: Cell, ready: IntArray, cold_start: float, name: str) -> tuple[IntArray, RunResult, int]:
    """``replay`` of ``ready``; failing windows raised (see the module docstring) until every window passes.
    Returns the raised counts, their run and the raises."""
    counts = ready.copy()
    repairs = 0
    where = f"{cell.label}, cold start {cold_start:g} s"
    for round_ in range(REPAIR_ROUNDS + 1):
        try:
            result = replay(cell, counts, cold_start, name)
        except ValueError as err:  # a raise that would need a replica before it can be ordered
            raise OracleError(f"{where}: {err}") from err
        failing = failing_windows(cell, result)
        if not failing:
            return counts, result, repairs
        if round_ == REPAIR_ROUNDS or any(not 0 <= w < counts.size or counts[w] >= cell.max_replicas for w in failing):
            break
        counts[failing] += 1  # replayed on the next round: a raise is only kept once a replay has checked it
        repairs += len(failing)
    raise OracleError(f"{where}: the oracle's plan still misses windows {failing} after {repairs} raises")


def true_oracle(cell: Cell, cold_start: float) -> tuple[Oracle | OracleError, Oracle | OracleError]:
    """The oracle at ``cold_start`` and at zero cold start, both from one search (the cap on early
    windows, the only place the search depends on the cold start, can only bind for the larger one).
    ``OracleError`` if the search finds no count for a window; a plan whose replay still misses after its
    raises comes back as its ``OracleError``, so the other one stands."""
    began = time.monotonic()
    ready, evaluations = ready_counts(cell, cold_start)
    searched = time.monotonic() - began
    oracles: list[Oracle | OracleError] = []
    for cold, name in zip((cold_start, 0.0), ORACLES, strict=True):
        began = time.monotonic()
        try:
            counts, result, repairs = verified(cell, ready, cold, name)
        except OracleError as error:
            oracles.append(error)
            continue
        wall = time.monotonic() - began + searched
        oracles.append(Oracle(name, counts, result, evaluations, repairs, wall))
    return oracles[0], oracles[1]


def found(outcome: Oracle | OracleError) -> Oracle:
    """The oracle, or its error raised: for a caller with no use for a failed one."""
    if isinstance(outcome, OracleError):
        raise outcome
    return outcome
