"""B4: the AIBrix APA."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from mmfleet.api import clamp_replicas
from mmfleet.autoscaler import Decision
from mmfleet_lab.bench.baselines._shared import (
    Samples,
    _hold,
    _inflight,
    _little_target,
    _mean,
    _recent,
    _s,
    _v,
)
from mmfleet_lab.twin.policy import LabObservation


@dataclass(frozen=True)
class AibrixApaState:
    samples: Samples = ()
    recommendations: Samples = ()


@dataclass(frozen=True)
class AibrixApaPolicy:
    """B4, AIBrix's APA (vllm-project/aibrix @e3e10f9: pkg/controller/podautoscaler/algorithm/apa.go and
    pkg/controller/podautoscaler/podautoscaler_controller.go).

    Law, every 10 s: r = per-pod metric averaged over the 180 s window / target. If r > 1 + 0.1:
    ceil(current × r) capped at ceil(2 × current); if r < 1 - 0.1: ceil(current × r) floored at
    floor(current / 2); else hold; then clamp to [min, max] and stabilise with a 0 s scale-up and a
    300 s scale-down cooldown, HPA-style (up: min over the up window, down: max over the down
    window). ``inverted_stabilization=True`` is AIBrix's code as shipped, which keeps the max in
    the up window and the *min* in the down window (``stabilizeRecommendation``), so it scales down early.

    ``metric``: ``kv_cache_usage`` (mean over ready pods, AIBrix's examples use target 0.5) or
    ``running+waiting`` per ready pod (``target=None``: Little's law, μ_SLO × mean latency).
    """

    name: str = "aibrix-apa"
    interval: float = 10.0  # resync
    metric: Literal["kv_cache_usage", "running+waiting"] = "kv_cache_usage"
    target: float | None = 0.5
    capacity_per_replica: float | None = None
    mean_latency: float | None = None  # s, at capacity_per_replica: Little's law without a target
    up_tolerance: float = 0.1
    down_tolerance: float = 0.1
    max_scale_up_rate: float = 2.0
    max_scale_down_rate: float = 2.0
    window: float = 180.0
    scale_up_cooldown: float = 0.0
    scale_down_cooldown: float = 300.0
    inverted_stabilization: bool = False

    def initial_state(self) -> AibrixApaState:
        return AibrixApaState()

    def _per_pod(self, obs: LabObservation) -> float | None:
        if obs.ready == 0:
            return None
        if self.metric == "kv_cache_usage":
            return obs.kv_cache_usage
        inflight = _inflight(obs)
        return None if inflight is None else inflight / obs.ready

    def decide(self, observation: LabObservation, state: AibrixApaState) -> Decision:
        obs = observation
        value = self._per_pod(obs)
        if value is None:
            return _hold(obs, f"metric {self.metric} unavailable (fetch error)", state)
        samples = (*_recent(state.samples, obs.time, self.window), (obs.time, value))
        per_pod = _mean(samples)
        if self.metric == "kv_cache_usage":
            if self.target is None:
                raise ValueError("kv_cache_usage needs a target (AIBrix's examples use 0.5)")
            target = self.target
        else:
            target = _little_target(self.target, self.capacity_per_replica, self.mean_latency)
        current = obs.current
        ratio = per_pod / target
        if ratio > 1 + self.up_tolerance:
            desired = min(math.ceil(current * ratio), math.ceil(self.max_scale_up_rate * current))
        elif ratio < 1 - self.down_tolerance:
            desired = max(math.ceil(current * ratio), math.floor(current / self.max_scale_down_rate))
        else:
            desired = current
        desired = clamp_replicas(desired, obs.min_replicas, obs.max_replicas)

        keep = max(self.scale_up_cooldown, self.scale_down_cooldown)
        recs = (*_recent(state.recommendations, obs.time, keep), (obs.time, float(desired)))
        final = desired
        if desired > current:  # up: HPA takes the window's min, AIBrix as shipped its max
            values = [int(v) for _, v in _recent(recs, obs.time, self.scale_up_cooldown)] or [desired]
            final = max(values) if self.inverted_stabilization else min(values)
        elif desired < current:  # down: HPA takes the window's max, AIBrix as shipped its min
            values = [int(v) for _, v in _recent(recs, obs.time, self.scale_down_cooldown)] or [desired]
            final = min(current, min(values) if self.inverted_stabilization else max(values))
        state = AibrixApaState(samples=samples, recommendations=recs)
        text = f"{self.metric} {_v(per_pod)}/pod over {_s(self.window)} vs target {_v(target)}"
        if final == current:
            return Decision(final, f"{text}: holding {final}", state)
        return Decision(final, f"{text}: {current} -> {final}", state)
