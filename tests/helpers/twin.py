"""Small runs of the twin's fleet with a scripted policy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mmfleet.api import SloSpec
from mmfleet.autoscaler import Decision
from mmfleet_lab.twin import H200_QWEN25VL7B, Requests, Scenario, simulate
from mmfleet_lab.twin.policy import LabObservation

SLO = SloSpec(target="10s")


@dataclass
class Script:
    """Sets the replicas given for the latest time reached; records what it saw."""

    steps: list[tuple[float, int]]
    interval: float = 1.0
    name: str = "script"
    seen: list[LabObservation] = field(default_factory=list)

    def initial_state(self) -> Any:
        return None

    def decide(self, observation: LabObservation, state: Any) -> Decision:
        self.seen.append(observation)
        n = observation.current
        for t, k in self.steps:
            if observation.time >= t - 1e-9:
                n = k
        return Decision(n, f"script {n}", state)


def steady(rate: float, seconds: float, *, inp: int = 500, out: int = 200, seed: int = 0) -> Requests:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate, size=int(rate * seconds * 1.5)))
    t = t[t < seconds]
    n = t.size
    return Requests(t, np.full(n, inp), np.full(n, out), np.zeros(n))


def run(req: Requests, policy: Script, duration: float, **kw: Any) -> Any:
    kw.setdefault("cold_start", 30.0)
    return simulate(Scenario("t", req, duration), policy, params=H200_QWEN25VL7B, slo=SLO, **kw)
