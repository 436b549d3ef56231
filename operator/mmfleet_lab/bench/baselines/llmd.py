"""B6: llm-d's recommended autoscaling, KEDA on the router's (EPP's) metrics; it replaced the Workload Variant
Autoscaler, which llm-d deprecated with v0.9.0 its last release (llm-d/llm-d guides/workload-autoscaling/README.md
@05bfbcb, "The Workload Variant Autoscaler (WVA) is deprecated")."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from mmfleet.autoscaler import Decision
from mmfleet_lab.bench.baselines._shared import Samples, _hold, _mean, _recent, _v
from mmfleet_lab.bench.baselines.hpa import (
    HpaScalingPolicy,
    HpaScalingRules,
    HpaState,
    external_average_replicas,
    hpa_decide,
    hpa_range_check,
)
from mmfleet_lab.twin.policy import LabObservation

# The SLO-aware ScaledObject's behavior: up max(100 %, 4 pods) per 60 s after a 30 s window, down 1 pod per 120 s
# after a 180 s window (sources in LlmdSloPolicy's docstring).
SLO_UP = HpaScalingRules(30.0, (HpaScalingPolicy("Percent", 100, 60.0), HpaScalingPolicy("Pods", 4, 60.0)))
SLO_DOWN = HpaScalingRules(180.0, (HpaScalingPolicy("Pods", 1, 120.0),))
# The queue overlay's behavior, both ways: 100 % per 15 s after a 300 s window (LlmdQueuePolicy's docstring).
QUEUE_BEHAVIOR = HpaScalingRules(300.0, (HpaScalingPolicy("Percent", 100, 15.0),))


def _pods(obs: LabObservation) -> int:
    """``kube_deployment_status_replicas``: every pod of the Deployment, Ready or not."""
    return obs.ready + obs.starting + obs.unschedulable


def _prometheus_down(obs: LabObservation) -> bool:
    return obs.extra.get("prometheus_up", 1.0) == 0.0


@dataclass(frozen=True)
class LlmdSloState:
    hpa: HpaState = field(default_factory=HpaState)
    clamped: Samples = ()  # epp:saturation:clamped, one sample per rule evaluation


@dataclass(frozen=True)
class LlmdSloPolicy:
    """B6, llm-d's SLO-aware autoscaling: a Prometheus recording rule of P90 TTFT and TPOT over their SLOs, fed to a
    KEDA ``scalingModifiers`` formula (llm-d/llm-d guides/workload-autoscaling/README.slo-aware.md @d38c9f0, "How it
    works — the control law" and "Tunables"; its manifests, read at the same path in the fork zetxqx/llm-d @c397e67:
    guides/workload-autoscaling/slo-aware/prometheus-rule.yaml and scaledobject.yaml).

    Law, every 15 s (rule ``interval``, KEDA ``pollingInterval``, HPA sync): ``s_raw = max(P90 TTFT / S_ttft,
    P90 TPOT / S_tpot)``, each P90 ``histogram_quantile(0.9, sum(rate(..._bucket[1m])) by (le))`` and 0 without
    traffic; ``s`` = ``avg_over_time(clamp_max(s_raw, C)[45s])``, C = 2.0. With n the Deployment's pods
    (``kube_deployment_status_replicas``) and r the Ready ones, ``d = n + ceil(n (s c / 0.55 - 1))`` if s > 0.55,
    where the credit c = r / n when 0 < r < n else 1; ``d = n - floor(n (1 - s / 0.40))`` if s < 0.40; else n.
    ``d`` reaches the HPA as an External AverageValue metric with target 1 (tolerance 0.1), with the behavior
    ``SLO_UP``/``SLO_DOWN``. The guide benchmarked S_ttft = 3 s and S_tpot = 0.1 s for its own SLOs and says to
    set them to yours; its pool bounds (3 / 8) give way to the fleet's here, as every baseline's do.

    Where the twin differs: the EPP's TTFT and streaming-TPOT histograms (``llm_d_epp_request_ttft_seconds``,
    ``llm_d_epp_request_streaming_tpot_seconds``; the predicted ones are optional and absent here, so the rule's
    fallback is what runs) are stood in for by the servers' vLLM histograms summed over pods: TTFT alike, and
    vLLM's per-token inter-token latency for the EPP's per-request TPOT (``extra["p90_ttft_1m"]``,
    ``extra["p90_tpot_1m"]``, from ``twin.observe.query``). Rule, poll and HPA run at the same instant, so the
    pipeline adds no lag of up to 15 s per stage.
    """

    name: str = "llmd-keda"
    interval: float = 15.0
    ttft_slo: float = 3.0  # S_ttft, seconds
    tpot_slo: float = 0.1  # S_tpot, seconds
    cap: float = 2.0  # C
    smoothing: float = 45.0  # avg_over_time window
    up_threshold: float = 0.55  # θ_up
    down_boundary: float = 0.40  # θ_dn
    tolerance: float = 0.1
    scale_up: HpaScalingRules = SLO_UP
    scale_down: HpaScalingRules = SLO_DOWN

    def initial_state(self) -> LlmdSloState:
        return LlmdSloState()

    def saturation_raw(self, obs: LabObservation) -> float:
        """``epp:saturation:raw``: an absent quantile (no traffic in the minute) reads 0, as ``or vector(0)``."""
        ttft, tpot = obs.extra.get("p90_ttft_1m", 0.0), obs.extra.get("p90_tpot_1m", 0.0)
        return max(ttft / self.ttft_slo, tpot / self.tpot_slo)

    def formula(self, s: float, n: int, r: int) -> int:
        """The ``scalingModifiers`` formula: the desired replicas from smoothed saturation, pods and Ready pods."""
        if s > self.up_threshold:
            credit = r / n if 0 < r < n else 1.0
            return n + math.ceil(n * (s * credit / self.up_threshold - 1))
        if s < self.down_boundary:
            return n - math.floor(n * (1 - s / self.down_boundary))
        return n

    def decide(self, observation: LabObservation, state: LlmdSloState) -> Decision:
        obs = observation
        if _prometheus_down(obs):
            return _hold(obs, "Prometheus unreachable (KEDA scaler error)", state)
        sample = (obs.time, min(self.saturation_raw(obs), self.cap))
        clamped = (*_recent(state.clamped, obs.time, self.smoothing), sample)
        state = replace(state, clamped=clamped)
        forced = hpa_range_check(obs, obs.min_replicas, obs.max_replicas, state)
        if forced is not None:
            return forced
        s, n = _mean(clamped), _pods(obs)
        d = self.formula(s, n, obs.ready)
        desired = external_average_replicas(float(d), 1.0, n, self.tolerance)
        text = f"saturation {_v(s)} (band {_v(self.down_boundary)}-{_v(self.up_threshold)}), formula {d} over {n} pods"
        dec = hpa_decide(obs, state.hpa, desired, text, obs.min_replicas, obs.max_replicas, self.scale_up,
                         self.scale_down)  # fmt: skip
        return replace(dec, state=replace(state, hpa=dec.state))


@dataclass(frozen=True)
class LlmdQueueState:
    hpa: HpaState = field(default_factory=HpaState)


@dataclass(frozen=True)
class LlmdQueuePolicy:
    """B6 alternative, llm-d's default KEDA + EPP path, the queue overlay (llm-d/llm-d
    guides/workload-autoscaling/keda-epp/optimized-baseline/overlays/k8s/queue/scaledobject.yaml @057abb4).

    Law: two Prometheus triggers raced by the HPA (the larger desired count wins), each an External AverageValue
    metric: ``sum(llm_d_epp_flow_control_queue_size)`` with target 1 per replica and
    ``sum(llm_d_epp_request_running)`` with target 16; ``pollingInterval`` 15 s; behavior 100 % per 15 s after a
    300 s stabilisation window, both ways. The twin has no EPP flow-control queue in front of the servers, so the
    servers' waiting requests stand in for it and their running requests for the EPP's running count.
    """

    name: str = "llmd-keda"
    interval: float = 15.0
    queue_target: float = 1.0
    running_target: float = 16.0
    tolerance: float = 0.1
    behavior: HpaScalingRules = QUEUE_BEHAVIOR

    def initial_state(self) -> LlmdQueueState:
        return LlmdQueueState()

    def decide(self, observation: LabObservation, state: LlmdQueueState) -> Decision:
        obs = observation
        if _prometheus_down(obs) or obs.waiting is None or obs.running is None:
            return _hold(obs, "Prometheus unreachable (KEDA scaler error)", state)
        forced = hpa_range_check(obs, obs.min_replicas, obs.max_replicas, state)
        if forced is not None:
            return forced
        n = _pods(obs)
        desired = max(
            external_average_replicas(obs.waiting, self.queue_target, n, self.tolerance),
            external_average_replicas(obs.running, self.running_target, n, self.tolerance),
        )
        text = (f"queue {_v(obs.waiting)} vs {_v(self.queue_target)}, running {_v(obs.running)} vs "
                f"{_v(self.running_target)} per pod over {n} pods")  # fmt: skip
        dec = hpa_decide(obs, state.hpa, desired, text, obs.min_replicas, obs.max_replicas, self.behavior,
                         self.behavior)  # fmt: skip
        return replace(dec, state=replace(state, hpa=dec.state))
