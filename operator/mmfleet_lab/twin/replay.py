"""A fleet serving a scenario that can be copied mid-run, for searches over replica schedules.

The benchmark's oracle picks the replica count of each window given the windows before it: trying
a count from a copy taken at the window's start costs one window of simulation, where replaying the
trace from the start would cost the whole prefix. The fleet has no cold start (a replica is Ready
the moment it is asked for, as one ordered a cold start ahead would be) and no metrics pipeline; it
serves in the same one-second steps as ``sim.simulate``, so a schedule replayed through ``simulate``
routes and serves the same requests the same way.
"""

from __future__ import annotations

import copy
import math

import numpy as np

from mmfleet_lab.twin.compiled import CompiledEngine
from mmfleet_lab.twin.engine import Workload
from mmfleet_lab.twin.fleet import Fleet
from mmfleet_lab.twin.replica import ReplicaParams
from mmfleet_lab.twin.types import Scenario


class Replay:
    """A fleet of ``initial`` Ready replicas serving ``scenario`` from t = 0; see the module docstring."""

    def __init__(self, scenario: Scenario, params: ReplicaParams, initial: int) -> None:
        work = Workload.build(scenario.requests, params)
        self.engine = CompiledEngine(params, work)
        self.fleet = Fleet(self.engine, cold_start=0.0, initial=initial)
        self.arrival = work.arrival
        self.t = 0.0
        self._pos = 0

    def scale(self, replicas: int) -> None:
        """Set the Ready replicas now: new ones serve at once, removed ones drain (``Fleet.scale``)."""
        self.fleet.scale(replicas, self.t)

    def advance(self, until: float) -> None:
        """Serve arrivals up to ``until`` in the one-second steps ``simulate`` takes."""
        while self.t < until - 1e-9:
            t_next = min(math.floor(self.t + 1e-9) + 1.0, until)
            end = int(np.searchsorted(self.arrival, t_next, side="left"))
            self.fleet.run(self.t, t_next, np.arange(self._pos, end, dtype=np.int64))
            self._pos = end
            self.t = t_next
            self.fleet.transitions(self.t)

    def latency(self, metric: str) -> np.ndarray:
        """Per request so far: ``np.inf`` until it has got there."""
        out = self.engine.outcomes
        return {"e2e": out.e2e, "ttft": out.ttft, "itl": out.itl}[metric]

    def copy(self) -> Replay:
        """An independent copy of the run's state; the workload and the replica profile, read-only, are shared."""
        eng = self.engine
        shared = (self.arrival, eng.params, eng._w, eng._c)
        return copy.deepcopy(self, memo={id(x): x for x in shared})
