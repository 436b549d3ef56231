"""B2: the KEDA Prometheus scaler, which hands an External metric to an HPA."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from mmfleet.autoscaler import Decision
from mmfleet_lab.bench.baselines._shared import (
    _hold,
    _s,
    _v,
)
from mmfleet_lab.bench.baselines.hpa import (
    HPA_SCALE_DOWN,
    HPA_SCALE_UP,
    HpaScalingRules,
    HpaState,
    external_average_replicas,
    hpa_decide,
    hpa_range_check,
)
from mmfleet_lab.twin.policy import LabObservation


@dataclass(frozen=True)
class KedaState:
    hpa: HpaState = field(default_factory=HpaState)
    last_poll: float | None = None
    last_active: float | None = None


@dataclass(frozen=True)
class KedaPolicy:
    """B2, KEDA's Prometheus scaler feeding its HPA (kedacore/keda pkg/scalers/prometheus_scaler.go @0805d72;
    defaults from kedacore/keda-docs content/docs/2.18/reference/scaledobject-spec.md @02c81a5).

    Law: query ``sum(vllm:num_requests_waiting)`` (``metric="waiting"``, production-stack's example) or the
    in-flight ``sum(vllm:num_requests_running + vllm:num_requests_waiting)`` (``"running+waiting"``); the HPA
        (sync 15 s, default behavior) gets it as an External AverageValue metric with target ``threshold`` = 5:
    ``desired = ceil(sum / 5)`` unless
    within 0.1 of the pods, with no readiness damping. KEDA itself polls every 30 s for activation
    (``value > activationThreshold`` = 0) and, only when ``min_replica_count`` is 0, scales to zero
    after ``cooldownPeriod`` = 300 s without activity and back to 1 on activity. An absent series
    reads as 0 (``ignoreNullValues`` = true); only a dead Prometheus (every series absent) is an error.

    ``held_trigger`` adds a trigger on the requests held in front of the servers (the endpoint picker's
    ``inference_extension_flow_control_queue_size``, the signal mmfleet's own scale from zero reads), active above
    ``activation_threshold``: with no pod, the servers' series are absent, and only it can wake the fleet.

    ``keep_alive`` adds production-stack's second trigger for scale-to-zero,
    ``sum(rate(vllm:num_incoming_requests_total[1m]) > bool 0)`` with threshold 1 (vllm-project/production-stack
    docs/source/use_cases/autoscaling-keda.rst @183a136), read from
    ``arrival_rate`` (the router sees arrivals when no pod exists).
    """

    name: str = "keda"
    interval: float = 15.0  # the HPA's sync drives 1<->N; KEDA's own polling is polling_interval
    threshold: float = 5.0
    metric: Literal["waiting", "running+waiting"] = "waiting"
    activation_threshold: float = 0.0
    polling_interval: float = 30.0
    cooldown_period: float = 300.0
    min_replica_count: int | None = None  # None: the fleet's minimum; 0 turns scale-to-zero on
    keep_alive: bool = False
    held_trigger: bool = False
    tolerance: float = 0.1
    scale_up: HpaScalingRules = HPA_SCALE_UP
    scale_down: HpaScalingRules = HPA_SCALE_DOWN

    def initial_state(self) -> KedaState:
        return KedaState()

    def decide(self, observation: LabObservation, state: KedaState) -> Decision:
        obs = observation
        at_zero_on_held = self.held_trigger and obs.current == 0  # no server, so no server series: not an error
        if obs.waiting is None and obs.request_rate is None and obs.arrival_rate is None and not at_zero_on_held:
            return _hold(obs, "Prometheus unreachable (KEDA scaler error)", state)
        value = obs.waiting if obs.waiting is not None else 0.0
        if self.metric == "running+waiting":
            value += obs.running if obs.running is not None else 0.0
        arrivals = obs.arrival_rate if obs.arrival_rate is not None else (obs.request_rate or 0.0)
        keep_alive = 1.0 if self.keep_alive and arrivals > 0 else 0.0
        min_count = obs.min_replicas if self.min_replica_count is None else self.min_replica_count
        hpa_min = max(1, min_count)

        if state.last_poll is None or obs.time - state.last_poll >= self.polling_interval:
            held = obs.held if self.held_trigger else 0.0
            active = max(value, keep_alive, held) > self.activation_threshold
            state = replace(state, last_poll=obs.time, last_active=obs.time if active else state.last_active)
            if min_count == 0 and obs.current == 0 and active:
                return Decision(1, f"trigger active ({self.metric} {_v(value)}): scale from zero, 0 -> 1", state)
            idle_since = state.last_active
            if (
                min_count == 0
                and obs.current > 0
                and not active
                and (idle_since is None or obs.time - idle_since >= self.cooldown_period)
            ):
                return Decision(0, f"no activity for {_s(self.cooldown_period)}: {obs.current} -> 0", state)
        if obs.current == 0:
            return Decision(0, "scaled to zero, trigger inactive: holding 0", state)

        forced = hpa_range_check(obs, hpa_min, obs.max_replicas, state)
        if forced is not None:
            return forced
        pods = obs.ready + obs.starting + obs.unschedulable
        desired = max(
            external_average_replicas(value, self.threshold, pods, self.tolerance),
            external_average_replicas(keep_alive, 1.0, pods, self.tolerance) if self.keep_alive else 0,
        )
        text = f"sum({self.metric}) {_v(value)} vs threshold {_v(self.threshold)} per pod over {pods} pods"
        d = hpa_decide(obs, state.hpa, desired, text, hpa_min, obs.max_replicas, self.scale_up, self.scale_down)
        return replace(d, state=replace(state, hpa=d.state))
