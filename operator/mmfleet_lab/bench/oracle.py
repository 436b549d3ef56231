"""The perfect-foresight oracle that every policy's GPU-hours are normalised to (autoscaling.md §7).

Three pieces, all pure:

- ``fluid_replicas`` / ``fluid_lower_bound``: c_w = ceil(λ_w / μ_SLO) per window and its GPU-hours,
  a bound that ignores cold starts and carried-over queues (§7.2 step 1);
- ``oracle_schedule``: a feasible plan from c_w that starts each needed replica L before its window
  and keeps a replica through idle gaps no longer than L, since restarting would bill L anyway
  (ski rental, §6.3, §7.2 step 2); ``SchedulePolicy`` replays such a plan through the same
  simulator as every other policy, ignoring what it observes;
- ``refine``: simulate, raise c_w where windows still fail, re-plan, repeat, with the simulator and
  the check passed in as callables so this module never needs the twin.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

from mmfleet.autoscaler import Decision, Observation

R = TypeVar("R")
IntArray = npt.NDArray[np.int64]


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
    window: float,
    gpus_per_replica: int = 1,
) -> float:
    """LB = Σ_w c_w · W · g in GPU-hours (§7.2 step 1).

    Only approximately a lower bound: it holds when the steady-state μ_SLO bounds what a replica can
    sustain within one window, and it bills no cold start and no queue carried between windows.
    """
    return float(fluid_replicas(arrival_rate, capacity_per_replica).sum()) * window * gpus_per_replica / 3600.0


def oracle_schedule(
    demand_replicas_per_window: Sequence[float] | npt.NDArray[np.generic], window: float, cold_start: float
) -> IntArray:
    """The replicas to hold (starting or Ready) in each window so that c_w are Ready in window w.

    Replica j is needed wherever c_w >= j. Each of its busy runs is started ``lead`` =
    ceil(L / window) windows early (a run at the start of the trace is taken as already Ready, like
    every policy's initial fleet); an idle gap of at most ``lead`` windows is bridged, because a
    restart would bill as many windows of cold start. Exact when L is a multiple of the window;
    otherwise starts round down to a window boundary, a little early. Use a finer window (the
    demand upsampled) for a finer plan.
    """
    if window <= 0 or cold_start < 0:
        raise ValueError("window must be positive and cold_start non-negative")
    need = _as_counts(demand_replicas_per_window, "demand_replicas_per_window")
    lead = math.ceil(cold_start / window - 1e-9)
    plan = np.zeros(need.shape, dtype=np.int64)
    for level in range(1, int(need.max(initial=0)) + 1):
        busy = np.flatnonzero(need >= level)
        # runs of consecutive busy windows: [start, end)
        breaks = np.flatnonzero(np.diff(busy) > 1)
        starts = np.concatenate(([busy[0]], busy[breaks + 1]))
        ends = np.concatenate((busy[breaks] + 1, [busy[-1] + 1]))
        held_from, held_to = max(0, int(starts[0]) - lead), int(ends[0])
        for start, end in zip(starts[1:], ends[1:], strict=True):
            if start - held_to <= lead:  # bridging the gap costs no more than restarting
                held_to = int(end)
                continue
            plan[held_from:held_to] += 1
            held_from, held_to = int(start) - lead, int(end)
        plan[held_from:held_to] += 1
    return plan


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
        """From ``oracle_schedule``'s output; decides once per step, on the step boundaries."""
        return cls(tuple(int(n) for n in schedule), step, name=name, interval=step)

    def initial_state(self) -> None:
        return None

    def decide(self, observation: Observation, state: None) -> Decision:
        obs = observation
        if not self.replicas:
            return Decision(obs.current, f"empty schedule: holding {obs.current}", state)
        index = min(len(self.replicas) - 1, max(0, math.floor((obs.time - self.start) / self.step + 1e-9)))
        planned = self.replicas[index]
        n = max(obs.min_replicas, min(obs.max_replicas, planned))
        bounded = "" if n == planned else f" (bounded from {planned})"
        return Decision(n, f"schedule step {index}: {n} replicas{bounded}", state)


@dataclass(frozen=True, eq=False)
class Refinement(Generic[R]):
    """The outcome of ``refine``: the raised demand, its last simulation, and whether it passed."""

    demand: IntArray
    result: R
    rounds: int  # bump rounds applied
    passed: bool
    failing: tuple[int, ...]  # windows failing in the last simulation


def refine(
    demand: Sequence[float] | npt.NDArray[np.generic],
    simulate_fn: Callable[[IntArray], R],
    check_fn: Callable[[R], Iterable[int]],
    max_rounds: int = 10,
    *,
    carry_over: bool = True,
    max_replicas: int | None = None,
) -> Refinement[R]:
    """§7.2 step 2's loop: simulate, give failing windows one more replica, re-simulate.

    ``demand`` is c_w; ``simulate_fn(c)`` plans and runs it (usually ``oracle_schedule`` then the
    twin's ``simulate`` with a ``SchedulePolicy``); ``check_fn(result)`` returns the failing window
    indices. With ``carry_over``, a window that fails a second round in a row also raises, once, the
    window before it, where the queue it inherits builds up (this may leave that window one replica
    above its need). Stops when all pass, after ``max_rounds`` raises, or when nothing can be raised below
    ``max_replicas``; ``simulate_fn`` runs at most ``max_rounds + 1`` times.
    """
    c = _as_counts(demand, "demand").copy()
    streak: dict[int, int] = {}
    rounds = 0
    while True:
        result = simulate_fn(c.copy())
        failing = tuple(sorted({int(w) for w in check_fn(result)}))
        if not failing:
            return Refinement(c, result, rounds, True, ())
        if rounds >= max_rounds:
            return Refinement(c, result, rounds, False, failing)
        streak = {w: streak.get(w, 0) + 1 for w in failing}
        raised = False
        for w in failing:
            if not 0 <= w < len(c):
                raise IndexError(f"check_fn returned window {w}, outside 0..{len(c) - 1}")
            for i in (w, w - 1) if carry_over and streak[w] == 2 and w > 0 else (w,):
                if max_replicas is None or c[i] < max_replicas:
                    c[i] += 1
                    raised = True
        if not raised:
            return Refinement(c, result, rounds, False, failing)
        rounds += 1
