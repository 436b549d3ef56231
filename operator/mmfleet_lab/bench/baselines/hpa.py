"""B1: the Kubernetes HPA (autoscaling/v2) on a Pods metric, with its scale-up and scale-down behavior; also
the actuator behind KEDA (B2) and llm-d's KEDA paths (B6)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from mmfleet.api import clamp_replicas
from mmfleet.autoscaler import Decision
from mmfleet_lab.bench.baselines._shared import (
    Samples,
    _hold,
    _inflight,
    _little_target,
    _milli,
    _recent,
    _v,
    _within,
)
from mmfleet_lab.twin.policy import LabObservation


@dataclass(frozen=True)
class HpaScalingPolicy:
    """One ``behavior.scaleUp/scaleDown.policies`` entry."""

    type: Literal["Pods", "Percent"]
    value: int
    period: float  # periodSeconds


@dataclass(frozen=True)
class HpaScalingRules:
    """``behavior.scaleUp`` or ``behavior.scaleDown``."""

    stabilization: float  # stabilizationWindowSeconds
    policies: tuple[HpaScalingPolicy, ...]
    select: Literal["Max", "Min", "Disabled"] = "Max"


# The v2 defaults (kubernetes/kubernetes pkg/apis/autoscaling/v2/defaults.go @1adaa753; the 300 s
# window and the 15 s sync from pkg/controller/podautoscaler/config/v1alpha1/defaults.go @85643c0f):
# up max(+4, x2) per 15 s at once, down to the floor per 15 s after a 300 s window.
HPA_SCALE_UP = HpaScalingRules(0.0, (HpaScalingPolicy("Pods", 4, 15.0), HpaScalingPolicy("Percent", 100, 15.0)))
HPA_SCALE_DOWN = HpaScalingRules(300.0, (HpaScalingPolicy("Percent", 100, 15.0),))


@dataclass(frozen=True)
class HpaState:
    """The HPA controller's per-object memory: recommendations and scale events with their times."""

    recommendations: Samples = ()
    scale_up_events: Samples = ()
    scale_down_events: Samples = ()


def pods_metric_replicas(
    total: float, target: float, ready: int, missing: int, unready: int, current: int, tolerance: float = 0.1
) -> int | None:
    """``calcPlainMetricReplicas`` for a Pods metric with an AverageValue target (kubernetes/kubernetes
    pkg/controller/podautoscaler/replica_calculator.go @19e8ce76).

    ``ready`` pods report the metric (its sum is ``total``); ``missing`` are Running without a sample
    (a vLLM pod still loading has no /metrics); ``unready`` are Pending. Missing pods count as 0 when
    the ratio says up and as the target when it says down; Pending pods come back as 0 only on the
    way up; a recount that lands within tolerance or flips direction holds. None: no pod reported.
    """
    if ready <= 0:
        return None
    target_m = _milli(target)
    metrics_total = _milli(total)
    ratio = (metrics_total // ready) / target_m
    scale_up_with_unready = unready > 0 and ratio > 1.0
    if not scale_up_with_unready and missing == 0:
        if _within(ratio, tolerance):
            return current
        return math.ceil(ratio * ready)
    count = ready
    if missing > 0:
        if ratio < 1.0:
            metrics_total += target_m * missing
            count += missing
        elif ratio > 1.0:
            count += missing
    if scale_up_with_unready:
        count += unready
    new_ratio = (metrics_total // count) / target_m
    if _within(new_ratio, tolerance) or (ratio < 1.0 < new_ratio) or (ratio > 1.0 > new_ratio):
        return current
    new = math.ceil(new_ratio * count)
    if (new_ratio < 1.0 and new > current) or (new_ratio > 1.0 and new < current):
        return current
    return new


def external_average_replicas(total: float, target: float, status_replicas: int, tolerance: float = 0.1) -> int:
    """``GetExternalPerPodMetricReplicas`` (replica_calculator.go, above): ceil(total / target) unless within
    tolerance of the pods.

    No readiness damping: pods still starting simply do not lower ``total``.
    """
    usage = _milli(total)
    target_m = _milli(target)
    # Go divides by zero pods into +Inf (or NaN for 0/0), which no tolerance contains.
    ratio = (math.inf if usage > 0 else math.nan) if status_replicas == 0 else usage / (target_m * status_replicas)
    if _within(ratio, tolerance):
        return status_replicas
    return math.ceil(usage / target_m)


def _changes_in_period(events: Samples, period: float, now: float) -> int:
    return int(sum(v for t, v in events if t > now - period))


def _period_start(current: int, state: HpaState, period: float, now: float) -> int:
    """The replicas at the start of a policy's period: the HPA's base for both of its limits."""
    return (
        current
        - _changes_in_period(state.scale_up_events, period, now)
        + _changes_in_period(state.scale_down_events, period, now)
    )


def _scale_up_limit(current: int, state: HpaState, rules: HpaScalingRules, now: float) -> int:
    """``calculateScaleUpLimitWithScalingRules``: what the policies allow above the period's start."""
    if rules.select == "Disabled":
        return current
    proposals = []
    for p in rules.policies:
        start = _period_start(current, state, p.period, now)
        proposals.append(start + p.value if p.type == "Pods" else math.ceil(start * (1 + p.value / 100)))
    return min(proposals) if rules.select == "Min" else max(proposals)


def _scale_down_limit(current: int, state: HpaState, rules: HpaScalingRules, now: float) -> int:
    """``calculateScaleDownLimitWithBehaviors``: the floor the policies allow this period."""
    if rules.select == "Disabled":
        return current
    proposals = []
    for p in rules.policies:
        start = _period_start(current, state, p.period, now)
        proposals.append(start - p.value if p.type == "Pods" else int(start * (1 - p.value / 100)))
    return max(proposals) if rules.select == "Min" else min(proposals)


def hpa_normalize(
    desired: int,
    current: int,
    low: int,
    high: int,
    now: float,
    state: HpaState,
    up: HpaScalingRules = HPA_SCALE_UP,
    down: HpaScalingRules = HPA_SCALE_DOWN,
) -> tuple[int, HpaState]:
    """``normalizeDesiredReplicasWithBehaviors`` (kubernetes/kubernetes
    pkg/controller/podautoscaler/horizontal.go @bba5ea77): stabilise, then rate-limit and clamp.

    Stabilisation bounds the change by the min recommendation over the up window and the max over the
    down window, so the HPA always takes the most conservative move; the first call seeds the history
    with the current count, as the controller does. The raw recommendation and any resulting scale
    event are recorded in the returned state.
    """
    if not state.recommendations:  # recordInitialRecommendation: the first sync counts the current replicas
        state = replace(state, recommendations=((now, float(current)),))
    up_rec = down_rec = desired
    for t, rec in state.recommendations:
        if t > now - up.stabilization:
            up_rec = min(up_rec, int(rec))
        if t > now - down.stabilization:
            down_rec = max(down_rec, int(rec))
    stabilized = current
    stabilized = max(stabilized, up_rec)
    stabilized = min(stabilized, down_rec)

    final = stabilized
    if stabilized > current:
        allowed = min(high, max(current, _scale_up_limit(current, state, up, now)))
        final = min(stabilized, allowed)
    elif stabilized < current:
        floor = max(low, min(current, _scale_down_limit(current, state, down, now)))
        final = max(stabilized, floor)

    keep = max(up.stabilization, down.stabilization)
    longest_period = max([p.period for p in up.policies + down.policies], default=0.0)
    new = HpaState(
        recommendations=(*_recent(state.recommendations, now, keep), (now, float(desired))),
        scale_up_events=_recent(state.scale_up_events, now, longest_period),
        scale_down_events=_recent(state.scale_down_events, now, longest_period),
    )
    if final > current:
        new = replace(new, scale_up_events=(*new.scale_up_events, (now, float(final - current))))
    elif final < current:
        new = replace(new, scale_down_events=(*new.scale_down_events, (now, float(current - final))))
    return final, new


def hpa_range_check(obs: LabObservation, low: int, high: int, state: object) -> Decision | None:
    """``reconcileAutoscaler``'s guards before any metric: disabled at 0, or straight back into [min, max]."""
    if obs.current == 0 and low != 0:
        return Decision(0, "scaling is disabled at 0 replicas: holding 0", state)
    if obs.current > high or obs.current < low:
        n = clamp_replicas(obs.current, low, high)
        return Decision(n, f"replicas {obs.current} outside [{low}, {high}]: {obs.current} -> {n}", state)
    return None


def hpa_decide(
    obs: LabObservation,
    state: HpaState,
    metric_desired: int,
    metric_text: str,
    low: int,
    high: int,
    up: HpaScalingRules,
    down: HpaScalingRules,
) -> Decision:
    final, new = hpa_normalize(metric_desired, obs.current, low, high, obs.time, state, up, down)
    if final == obs.current:
        held = "" if metric_desired == final else f" (metric wants {metric_desired}; stabilised or rate-limited)"
        return Decision(final, f"{metric_text}{held}: holding {final}", new)
    limited = "" if final == clamp_replicas(metric_desired, low, high) else f" (metric wants {metric_desired})"
    return Decision(final, f"{metric_text}{limited}: {obs.current} -> {final}", new)


@dataclass(frozen=True)
class HpaPolicy:
    """B1, the Kubernetes HPA with default behavior on a vLLM Pods metric (replica_calculator.go and
    horizontal.go, above).

    Law: ``desired = ceil(mean_per_pod / target × ready)`` with tolerance 0.1 and the not-ready rules
    of ``calcPlainMetricReplicas``, then the v2 default behavior: scale-up stabilisation 0 s and at most
    max(+4, ×2) per 15 s; scale-down to the max recommendation of the last 300 s, 100 % per 15 s. A
    missing metric is an error: the HPA keeps the current count. Pods still starting count as
    Running-without-metrics (missing), unschedulable ones as Pending.

    ``metric="waiting"``: num_requests_waiting per pod, target 5 (vLLM production-stack).
    ``metric="running+waiting"``: in-flight per pod; ``target=None`` takes Little's law,
    ``capacity_per_replica × mean_latency``.
    """

    name: str = "hpa"
    interval: float = 15.0  # --horizontal-pod-autoscaler-sync-period
    metric: Literal["waiting", "running+waiting"] = "waiting"
    target: float | None = 5.0
    capacity_per_replica: float | None = None
    mean_latency: float | None = None  # s, at capacity_per_replica: Little's law without a target
    tolerance: float = 0.1
    scale_up: HpaScalingRules = HPA_SCALE_UP
    scale_down: HpaScalingRules = HPA_SCALE_DOWN

    def initial_state(self) -> HpaState:
        return HpaState()

    def decide(self, observation: LabObservation, state: HpaState) -> Decision:
        obs = observation
        low, high = obs.min_replicas, obs.max_replicas
        forced = hpa_range_check(obs, low, high, state)
        if forced is not None:
            return forced
        total = obs.waiting if self.metric == "waiting" else _inflight(obs)
        if total is None or obs.ready == 0:
            return _hold(obs, f"metric {self.metric} unavailable for any pod (HPA error)", state)
        target = _little_target(self.target, self.capacity_per_replica, self.mean_latency)
        desired = pods_metric_replicas(
            total, target, obs.ready, obs.starting, obs.unschedulable, obs.current, self.tolerance
        )
        if desired is None:  # pragma: no cover - ready > 0 was checked
            return _hold(obs, "no pod reported the metric", state)
        text = f"{self.metric} {_v(total / obs.ready)}/pod vs target {_v(target)} over {obs.ready} ready"
        return hpa_decide(obs, state, desired, text, low, high, self.scale_up, self.scale_down)
