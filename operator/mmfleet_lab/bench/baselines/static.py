"""B0: static provisioning (a fixed replica count)."""

from __future__ import annotations

from dataclasses import dataclass

from mmfleet.api import clamp_replicas
from mmfleet.autoscaler import Decision
from mmfleet_lab.twin.policy import LabObservation


@dataclass(frozen=True)
class StaticPolicy:
    """B0a static-peak / B0b static-mean: a fixed count, the cost and SLO ceilings of no scaling."""

    replicas: int
    name: str = "static"
    interval: float = 60.0

    def initial_state(self) -> None:
        return None

    def decide(self, observation: LabObservation, state: None) -> Decision:
        n = clamp_replicas(self.replicas, observation.min_replicas, observation.max_replicas)
        return Decision(n, f"static {self.replicas} replicas", state)
