"""B6: the llm-d workload variant autoscaler (WVA), saturation mode (v1), actuated by an HPA."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

from mmfleet.autoscaler import Decision
from mmfleet_lab.bench.baselines._shared import (
    _hold,
    _v,
)
from mmfleet_lab.bench.baselines.hpa import (
    HpaScalingPolicy,
    HpaScalingRules,
    HpaState,
    external_average_replicas,
    hpa_decide,
    hpa_range_check,
)
from mmfleet_lab.twin.policy import LabObservation

WVA_HPA = HpaScalingRules(240.0, (HpaScalingPolicy("Pods", 10, 150.0),))  # the WVA chart's default behavior


@dataclass(frozen=True)
class WvaState:
    hpa: HpaState = field(default_factory=HpaState)
    desired: int | None = None  # the last wva_desired_replicas emitted
    last_analysis: float | None = None


@dataclass(frozen=True)
class WvaSaturationPolicy:
    """B6, llm-d WVA saturation analyzer v1 behind its HPA (llm-d/llm-d-workload-variant-autoscaler @b08b1c7:
    docs/saturation-analyzer.md, docs/saturation-scaling-config.md, docs/integrations/hpa-integration.md).

    Law, every 60 s: a replica is saturated when KV >= 0.80 or queue >= 5; over the non-saturated
    ones, scale up +1 when mean spare KV < 0.10 or mean spare queue < 3 (every replica saturated
    counts as no spare), except while pods are pending; scale down -1 only if spreading the load over
    one replica fewer still leaves spare >= both triggers and at least 2 replicas are non-saturated.
    The result, ``wva_desired_replicas``, reaches the Deployment through an HPA on an External
    AverageValue metric with target 1 (tolerance 0.1) and the chart's behavior: 240 s stabilisation
    both ways, 10 pods per 150 s. WVA reads each pod's peak KV and queue; the LabObservation has the
    fleet's mean KV and summed queue, so every ready replica is taken to carry the mean.

    v1's +1 is inside the HPA's tolerance from 10 replicas on (11 / 10 = 1.1), so on a fleet of 20 it never
    acts. ``analyzer="v2"`` is the saturation analyzer that replaced it (same repository and commit,
    internal/engines/analyzers/saturation_v2/analyzer.go; defaults in internal/interfaces/saturation_scaling.go):
    demand = KV tokens in use + queue × mean input tokens, supply = ``kv_threshold`` × each replica's KV
    tokens; required = demand / ``scale_up_threshold`` (0.85) - supply of the replicas and the pending ones,
    spare = supply - demand / ``scale_down_boundary`` (0.70), turned into whole replicas. Its compute-bound
    capacity k2 is not modelled: ``kv_threshold`` is the knob a user lowers when a replica saturates on compute
    before its KV cache fills.
    """

    name: str = "wva-saturation"
    interval: float = 15.0  # the HPA's sync; the analyzer runs every analyzer_interval
    analyzer_interval: float = 60.0  # GLOBAL_OPT_INTERVAL
    kv_threshold: float = 0.80
    queue_threshold: float = 5.0
    kv_spare_trigger: float = 0.10
    queue_spare_trigger: float = 3.0
    tolerance: float = 0.1
    hpa_behavior: HpaScalingRules = WVA_HPA
    analyzer: Literal["v1", "v2"] = "v1"
    scale_up_threshold: float = 0.85
    scale_down_boundary: float = 0.70
    kv_capacity_tokens: float = 1.0e6  # vllm:cache_config_info of the replica (ReplicaParams.kv_capacity_tokens)

    def initial_state(self) -> WvaState:
        return WvaState()

    def analyze(self, obs: LabObservation) -> tuple[int, str] | None:
        """One saturation analysis: the replicas WVA would emit and why; None without metrics."""
        if obs.kv_cache_usage is None or obs.waiting is None or obs.ready == 0:
            return None
        if self.analyzer == "v2":
            return self._analyze_v2(obs, obs.kv_cache_usage, obs.waiting)
        kv, queue = obs.kv_cache_usage, obs.waiting / obs.ready
        non_saturated = obs.ready if (kv < self.kv_threshold and queue < self.queue_threshold) else 0
        spare_kv = self.kv_threshold - kv if non_saturated else 0.0
        spare_queue = self.queue_threshold - queue if non_saturated else 0.0
        scale_up = spare_kv < self.kv_spare_trigger or spare_queue < self.queue_spare_trigger
        down_safe = False
        if non_saturated >= 2:
            left = non_saturated - 1
            down_safe = (
                self.kv_threshold - kv * non_saturated / left >= self.kv_spare_trigger
                and self.queue_threshold - queue * non_saturated / left >= self.queue_spare_trigger
            )
        pending = obs.starting + obs.unschedulable
        text = f"KV {_v(kv)}, queue {_v(queue)}/replica, spare KV {_v(spare_kv)} / queue {_v(spare_queue)}"
        if scale_up:
            if pending:
                return obs.current, f"{text}: saturated but {pending} pods pending, no scale-up"
            return obs.current + 1, f"{text}: saturated, +1"
        if down_safe:
            return max(1, obs.current - 1), f"{text}: spare after removing one, -1"
        return obs.current, f"{text}: no capacity action"

    def _analyze_v2(self, obs: LabObservation, kv: float, waiting: float) -> tuple[int, str]:
        isl = obs.prompt_tokens_rate / obs.request_rate if obs.prompt_tokens_rate and obs.request_rate else 0.0
        per_replica = self.kv_threshold * self.kv_capacity_tokens
        demand = (obs.ready * kv * self.kv_capacity_tokens + waiting * isl) / per_replica  # in replicas
        pending = obs.starting + obs.unschedulable
        required = demand / self.scale_up_threshold - (obs.ready + pending)
        spare = obs.ready - demand / self.scale_down_boundary
        text = f"demand {_v(demand)} replicas of KV at {_v(self.kv_threshold)}, supply {obs.ready} (+{pending} pending)"
        if required > 0:
            return obs.current + math.ceil(required), f"{text}: required {_v(required)}"
        if spare >= 1:
            return max(1, obs.current - math.floor(spare)), f"{text}: spare {_v(spare)}"
        return obs.current, f"{text}: no capacity action"

    def decide(self, observation: LabObservation, state: WvaState) -> Decision:
        obs = observation
        note = ""
        if state.last_analysis is None or obs.time - state.last_analysis >= self.analyzer_interval:
            result = self.analyze(obs)
            if result is not None:
                state = replace(state, desired=result[0], last_analysis=obs.time)
                note = f"WVA: {result[1]}; "
            else:
                state = replace(state, last_analysis=obs.time)
                note = "WVA: KV or queue metrics missing, keeps its last value; "
        if state.desired is None:
            return _hold(obs, f"{note}no wva_desired_replicas yet (HPA metric error)", state)
        forced = hpa_range_check(obs, obs.min_replicas, obs.max_replicas, state)
        if forced is not None:
            return forced
        pods = obs.ready + obs.starting + obs.unschedulable
        desired = external_average_replicas(float(state.desired), 1.0, pods, self.tolerance)
        text = f"{note}HPA on wva_desired_replicas {state.desired} over {pods} pods"
        d = hpa_decide(
            obs, state.hpa, desired, text, obs.min_replicas, obs.max_replicas, self.hpa_behavior, self.hpa_behavior
        )
        return replace(d, state=replace(state, hpa=d.state))
