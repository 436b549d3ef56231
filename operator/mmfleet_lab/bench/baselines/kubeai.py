"""B5: KubeAI's autoscaler."""

from __future__ import annotations

import math
from dataclasses import dataclass

from mmfleet.api import clamp_replicas
from mmfleet.autoscaler import Decision
from mmfleet_lab.bench.baselines._shared import (
    _hold,
    _inflight,
    _little_target,
    _s,
    _v,
)
from mmfleet_lab.twin.policy import LabObservation


@dataclass(frozen=True)
class KubeAiState:
    history: tuple[float, ...] = ()
    consecutive_scale_downs: int = 0


@dataclass(frozen=True)
class KubeAiPolicy:
    """B5, KubeAI's model autoscaler (substratusai/kubeai @2f32ef4: internal/modelautoscaler/autoscaler.go,
    internal/modelclient/scale.go, defaults in internal/config/system.go).

    Law, every 10 s: push the in-flight requests (running + waiting) into a simple moving average of
    ceil(600 s / 10 s) = 60 samples; desired = ceil(avg / targetRequests) clamped to [min, max]. A
    scale-down is applied only once ``ceil(scaleDownDelay / interval)`` = 3 consecutive decisions
    wanted it (the fourth), and the counter resets on any decision that is not a scale-down. No
    ready endpoint or no metrics: skip. ``target_requests=None`` takes Little's law (μ_SLO ×
    mean latency); 100 is KubeAI's placeholder. ``warm_start`` fills the window with the first sample,
    as KubeAI does when it reloads its saved averages (state.go); False is a cold controller's zeros.
    """

    name: str = "kubeai"
    interval: float = 10.0
    time_window: float = 600.0
    target_requests: float | None = 100.0
    capacity_per_replica: float | None = None
    mean_latency: float | None = None  # s, at capacity_per_replica: Little's law without a target
    scale_down_delay: float = 30.0
    warm_start: bool = True

    def initial_state(self) -> KubeAiState:
        return KubeAiState()

    def decide(self, observation: LabObservation, state: KubeAiState) -> Decision:
        obs = observation
        active = _inflight(obs)
        if obs.ready == 0:
            return _hold(obs, "no ready endpoints", state)
        if active is None:
            return _hold(obs, "no metrics for the model", state)
        count = math.ceil(self.time_window / self.interval)
        if state.history:
            history = (*state.history[1:], active)
        else:  # the first sample: a warm window is full of it, a cold one of zeros
            history = (*((active if self.warm_start else 0.0),) * (count - 1), active)
        avg = sum(history) / len(history)
        target = _little_target(self.target_requests, self.capacity_per_replica, self.mean_latency)
        wanted = clamp_replicas(math.ceil(avg / target), obs.min_replicas, obs.max_replicas)
        required = math.ceil(self.scale_down_delay / self.interval)
        text = f"avg in-flight {_v(avg)} over {_s(self.time_window)} / target {_v(target)} = {wanted}"
        if wanted < obs.current:
            if state.consecutive_scale_downs < required:
                n = state.consecutive_scale_downs + 1
                new = KubeAiState(history, n)
                return Decision(obs.current, f"{text}; scale-down {n} of {required} needed: holding {obs.current}", new)
            # The counter is not reset by the scale-down itself, so the next one goes straight through.
            new = KubeAiState(history, state.consecutive_scale_downs)
            return Decision(wanted, f"{text}: {obs.current} -> {wanted}", new)
        new = KubeAiState(history, 0)
        if wanted == obs.current:
            return Decision(wanted, f"{text}: holding {wanted}", new)
        return Decision(wanted, f"{text}: {obs.current} -> {wanted}", new)
