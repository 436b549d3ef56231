"""The autoscalers users run today, re-implemented exactly enough to race ours on the same trace.

Each class reproduces one real control law with its shipped defaults, as read from source and
documented in ``shared/reference/autoscaling.md`` (cited per class as §n). They are pure: the
memory each one keeps between cycles (stabilisation windows, moving averages, panic mode) lives
in the frozen state it returns. They see only what an ``Observation`` carries, so where the real
system reads per-pod series we say how the fleet-wide sums stand in for them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from mmfleet.autoscaler import Decision, Observation, Policy

# --------------------------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------------------------

Samples = tuple[tuple[float, float], ...]  # (time, value), oldest first


def _clamp(n: int, low: int, high: int) -> int:
    return max(low, min(high, n))


def _s(seconds: float) -> str:
    """A duration the way a person writes it: 2s, 0.25s, 300s."""
    return f"{seconds:.3g}s"


def _v(value: float) -> str:
    return f"{value:.3g}"


def _recent(samples: Samples, now: float, window: float) -> Samples:
    """Samples strictly newer than ``now - window`` (Go's ``timestamp.After(cutoff)``)."""
    cutoff = now - window
    return tuple(s for s in samples if s[0] > cutoff)


def _mean(samples: Samples) -> float:
    return sum(v for _, v in samples) / len(samples)


def _milli(value: float) -> int:
    """Kubernetes quantities reach the HPA as integer milli-units."""
    return round(value * 1000)


def _within(ratio: float, tolerance: float) -> bool:
    """``tolerances.isWithin``: 1 - down <= ratio <= 1 + up (§1.1)."""
    return 1.0 - tolerance <= ratio <= 1.0 + tolerance


def _inflight(obs: Observation) -> float | None:
    if obs.running is None or obs.waiting is None:
        return None
    return obs.running + obs.waiting


def _little_target(target: float | None, capacity: float | None, obs: Observation) -> float:
    """A per-replica in-flight target: given, or Little's law at the SLO, μ_SLO × target latency (§6.1)."""
    if target is not None:
        return target
    if capacity is None:
        raise ValueError("an in-flight target needs either target= or capacity_per_replica=")
    return capacity * obs.slo_target


def _verdict(obs: Observation, wanted: int, text: str, state: object) -> Decision:
    """The decision with its reason: the evidence, then the change (or that there is none)."""
    if wanted == obs.current:
        return Decision(wanted, f"{text}: holding {wanted}", state)
    return Decision(wanted, f"{text}: {obs.current} -> {wanted}", state)


def _hold(obs: Observation, why: str, state: object) -> Decision:
    return Decision(obs.current, f"{why}: holding {obs.current}", state)


# --------------------------------------------------------------------------------------------
# The HPA (autoscaling/v2), shared by B1, B2 and B6
# --------------------------------------------------------------------------------------------


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


# The v2 defaults (§1.2, pkg/apis/autoscaling/v2/defaults.go): up max(+4, x2) per 15 s at once, down to
# the floor per 15 s after a 300 s window.
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
    """``calcPlainMetricReplicas`` for a Pods metric with an AverageValue target (§1.1, §1.3).

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
    """``GetExternalPerPodMetricReplicas`` (§1.1): ceil(total / target) unless within tolerance of the pods.

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


def _scale_up_limit(current: int, state: HpaState, rules: HpaScalingRules, now: float) -> int:
    """``calculateScaleUpLimitWithScalingRules``: what the policies allow above the period's start."""
    if rules.select == "Disabled":
        return current
    proposals = []
    for p in rules.policies:
        start = (
            current
            - _changes_in_period(state.scale_up_events, p.period, now)
            + _changes_in_period(state.scale_down_events, p.period, now)
        )
        proposals.append(start + p.value if p.type == "Pods" else math.ceil(start * (1 + p.value / 100)))
    return min(proposals) if rules.select == "Min" else max(proposals)


def _scale_down_limit(current: int, state: HpaState, rules: HpaScalingRules, now: float) -> int:
    """``calculateScaleDownLimitWithBehaviors``: the floor the policies allow this period."""
    if rules.select == "Disabled":
        return current
    proposals = []
    for p in rules.policies:
        start = (
            current
            - _changes_in_period(state.scale_up_events, p.period, now)
            + _changes_in_period(state.scale_down_events, p.period, now)
        )
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
    """``normalizeDesiredReplicasWithBehaviors`` (§1.1): stabilise, then rate-limit and clamp.

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


def _hpa_range_check(obs: Observation, low: int, high: int, state: object) -> Decision | None:
    """``reconcileAutoscaler``'s guards before any metric: disabled at 0, or straight back into [min, max]."""
    if obs.current == 0 and low != 0:
        return Decision(0, "scaling is disabled at 0 replicas: holding 0", state)
    if obs.current > high or obs.current < low:
        n = _clamp(obs.current, low, high)
        return Decision(n, f"replicas {obs.current} outside [{low}, {high}]: {obs.current} -> {n}", state)
    return None


def _hpa_decide(
    obs: Observation,
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
    limited = "" if final == _clamp(metric_desired, low, high) else f" (metric wants {metric_desired})"
    return Decision(final, f"{metric_text}{limited}: {obs.current} -> {final}", new)


@dataclass(frozen=True)
class HpaPolicy:
    """B1, the Kubernetes HPA with default behavior on a vLLM Pods metric (§1.1-§1.3, §8.2).

    Law: ``desired = ceil(mean_per_pod / target × ready)`` with tolerance 0.1 and the not-ready rules
    of §1.3, then the v2 default behavior: scale-up stabilisation 0 s and at most max(+4, ×2) per 15 s;
    scale-down to the max recommendation of the last 300 s, 100 % per 15 s. A missing metric is an
    error: the HPA keeps the current count. Pods still starting count as Running-without-metrics
    (missing), unschedulable ones as Pending.

    ``metric="waiting"``: num_requests_waiting per pod, target 5 (vLLM production-stack).
    ``metric="running+waiting"``: in-flight per pod; ``target=None`` takes Little's law,
    ``capacity_per_replica × slo_target``.
    """

    name: str = "hpa"
    interval: float = 15.0  # --horizontal-pod-autoscaler-sync-period
    metric: Literal["waiting", "running+waiting"] = "waiting"
    target: float | None = 5.0
    capacity_per_replica: float | None = None
    tolerance: float = 0.1
    scale_up: HpaScalingRules = HPA_SCALE_UP
    scale_down: HpaScalingRules = HPA_SCALE_DOWN

    def initial_state(self) -> HpaState:
        return HpaState()

    def decide(self, observation: Observation, state: HpaState) -> Decision:
        obs = observation
        low, high = obs.min_replicas, obs.max_replicas
        forced = _hpa_range_check(obs, low, high, state)
        if forced is not None:
            return forced
        total = obs.waiting if self.metric == "waiting" else _inflight(obs)
        if total is None or obs.ready == 0:
            return _hold(obs, f"metric {self.metric} unavailable for any pod (HPA error)", state)
        target = _little_target(self.target, self.capacity_per_replica, obs)
        desired = pods_metric_replicas(
            total, target, obs.ready, obs.starting, obs.unschedulable, obs.current, self.tolerance
        )
        if desired is None:  # pragma: no cover - ready > 0 was checked
            return _hold(obs, "no pod reported the metric", state)
        text = f"{self.metric} {_v(total / obs.ready)}/pod vs target {_v(target)} over {obs.ready} ready"
        return _hpa_decide(obs, state, desired, text, low, high, self.scale_up, self.scale_down)


# --------------------------------------------------------------------------------------------
# B2: KEDA Prometheus scaler -> HPA
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KedaState:
    hpa: HpaState = HpaState()
    last_poll: float | None = None
    last_active: float | None = None


@dataclass(frozen=True)
class KedaPolicy:
    """B2, KEDA's Prometheus scaler feeding its HPA (§2.1-§2.2, §8.2).

    Law: query ``sum(vllm:num_requests_waiting)``; the HPA (sync 15 s, default behavior) gets it as an
    External AverageValue metric with target ``threshold`` = 5: ``desired = ceil(sum / 5)`` unless
    within 0.1 of the pods, with no readiness damping. KEDA itself polls every 30 s for activation
    (``value > activationThreshold`` = 0) and, only when ``min_replica_count`` is 0, scales to zero
    after ``cooldownPeriod`` = 300 s without activity and back to 1 on activity. An absent series
    reads as 0 (``ignoreNullValues`` = true); only a dead Prometheus (every series absent) is an error.

    ``keep_alive`` adds production-stack's second trigger for scale-to-zero,
    ``sum(rate(vllm:num_incoming_requests_total[1m]) > bool 0)`` with threshold 1 (§4.1), read from
    ``arrival_rate`` (the router sees arrivals when no pod exists).
    """

    name: str = "keda"
    interval: float = 15.0  # the HPA's sync drives 1<->N; KEDA's own polling is polling_interval
    threshold: float = 5.0
    activation_threshold: float = 0.0
    polling_interval: float = 30.0
    cooldown_period: float = 300.0
    min_replica_count: int | None = None  # None: the fleet's minimum; 0 turns scale-to-zero on
    keep_alive: bool = False
    tolerance: float = 0.1
    scale_up: HpaScalingRules = HPA_SCALE_UP
    scale_down: HpaScalingRules = HPA_SCALE_DOWN

    def initial_state(self) -> KedaState:
        return KedaState()

    def decide(self, observation: Observation, state: KedaState) -> Decision:
        obs = observation
        if obs.waiting is None and obs.request_rate is None and obs.arrival_rate is None:
            return _hold(obs, "Prometheus unreachable (KEDA scaler error)", state)
        value = obs.waiting if obs.waiting is not None else 0.0
        arrivals = obs.arrival_rate if obs.arrival_rate is not None else (obs.request_rate or 0.0)
        keep_alive = 1.0 if self.keep_alive and arrivals > 0 else 0.0
        min_count = obs.min_replicas if self.min_replica_count is None else self.min_replica_count
        hpa_min = max(1, min_count)

        if state.last_poll is None or obs.time - state.last_poll >= self.polling_interval:
            active = value > self.activation_threshold or keep_alive > self.activation_threshold
            state = replace(state, last_poll=obs.time, last_active=obs.time if active else state.last_active)
            if min_count == 0 and obs.current == 0 and active:
                return Decision(1, f"trigger active (waiting {_v(value)}): scale from zero, 0 -> 1", state)
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

        forced = _hpa_range_check(obs, hpa_min, obs.max_replicas, state)
        if forced is not None:
            return forced
        pods = obs.ready + obs.starting + obs.unschedulable
        desired = max(
            external_average_replicas(value, self.threshold, pods, self.tolerance),
            external_average_replicas(keep_alive, 1.0, pods, self.tolerance) if self.keep_alive else 0,
        )
        text = f"sum(waiting) {_v(value)} vs threshold {_v(self.threshold)} per pod over {pods} pods"
        d = _hpa_decide(obs, state.hpa, desired, text, hpa_min, obs.max_replicas, self.scale_up, self.scale_down)
        return replace(d, state=replace(state, hpa=d.state))


# --------------------------------------------------------------------------------------------
# B3: Knative Pod Autoscaler
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KpaState:
    started: bool = False
    samples: Samples = ()
    panic_time: float | None = None
    max_panic_pods: int = 0
    zero_since: float | None = None


@dataclass(frozen=True)
class KpaPolicy:
    """B3, Knative's KPA decider on concurrency (§3.1-§3.2, knative/serving autoscaler.go).

    Law, every 2 s: target = max(0.01, 0.7 × containerConcurrency) with containerConcurrency =
    max_num_seqs; dspc = ceil(stable avg / target) over 60 s and dppc = ceil(panic avg / target)
    over 6 s, each kept within [floor(ready / 2), ceil(1000 × ready)]. Panic starts or extends when
    dppc / ready >= 2.0 and ends once 60 s pass without that; in panic the count is the max of both
    and never decreases. Concurrency is running + waiting (the queue-proxy sees both). A new decider
    starts in panic at the ready count when more than one pod is ready. Scale to zero (only with a
    fleet minimum of 0) waits the 30 s grace period. The Activator's buffering is routing, not
    sizing, and is left to the simulator.
    """

    name: str = "knative-kpa"
    interval: float = 2.0  # tickInterval
    container_concurrency: int = 256  # max_num_seqs
    target_utilization: float = 0.7
    stable_window: float = 60.0
    panic_window_percentage: float = 10.0
    panic_threshold: float = 2.0
    max_scale_up_rate: float = 1000.0
    max_scale_down_rate: float = 2.0
    scale_to_zero_grace: float = 30.0
    enable_scale_to_zero: bool = True

    def initial_state(self) -> KpaState:
        return KpaState()

    @property
    def panic_window(self) -> float:
        return max(1.0, round(self.stable_window * self.panic_window_percentage / 100.0))

    def decide(self, observation: Observation, state: KpaState) -> Decision:
        obs = observation
        if not state.started:
            state = KpaState(started=True)
            if obs.ready > 1:
                state = replace(state, panic_time=obs.time, max_panic_pods=obs.ready)
        value = _inflight(obs)
        if value is None:
            return _hold(obs, "no concurrency data yet (ErrNoData)", state)
        samples = (*_recent(state.samples, obs.time, self.stable_window), (obs.time, value))
        stable = _mean(samples)
        panic = _mean(_recent(samples, obs.time, self.panic_window))
        ready = max(1.0, float(obs.ready))
        target = max(0.01, self.container_concurrency * self.target_utilization)
        max_up = math.ceil(self.max_scale_up_rate * ready)
        max_down = math.floor(ready / self.max_scale_down_rate)
        dspc = math.ceil(stable / target)
        dppc = math.ceil(panic / target)
        desired_stable = int(min(max(dspc, max_down), max_up))
        desired_panic = int(min(max(dppc, max_down), max_up))
        over = dppc / ready >= self.panic_threshold

        panic_time, max_panic = state.panic_time, state.max_panic_pods
        if over:
            panic_time = obs.time
        elif panic_time is not None and panic_time + self.stable_window < obs.time:
            panic_time, max_panic = None, 0
        desired = desired_stable
        if panic_time is not None:
            desired = max(desired, desired_panic)
            max_panic = max(max_panic, desired)
            desired = max_panic
        mode = "panic" if panic_time is not None else "stable"
        state = replace(state, samples=samples, panic_time=panic_time, max_panic_pods=max_panic)

        low = obs.min_replicas if self.enable_scale_to_zero else max(1, obs.min_replicas)
        wanted = _clamp(desired, low, obs.max_replicas)
        if wanted == 0 and obs.current > 0:
            since = state.zero_since if state.zero_since is not None else obs.time
            state = replace(state, zero_since=since)
            if obs.time - since < self.scale_to_zero_grace:
                wanted = obs.current
        else:
            state = replace(state, zero_since=None)
        text = (
            f"{mode}: concurrency stable {_v(stable)} / panic {_v(panic)} vs target {_v(target)} per pod, "
            f"{obs.ready} ready"
        )
        return _verdict(obs, wanted, text, state)


# --------------------------------------------------------------------------------------------
# B4: AIBrix APA
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AibrixApaState:
    samples: Samples = ()
    recommendations: Samples = ()


@dataclass(frozen=True)
class AibrixApaPolicy:
    """B4, AIBrix's APA (§4.1, §4.3, aibrix algorithm/apa.go and podautoscaler_controller.go).

    Law, every 10 s: r = per-pod metric averaged over the 180 s window / target. If r > 1 + 0.1:
    ceil(current × r) capped at ceil(2 × current); if r < 1 - 0.1: ceil(current × r) floored at
    floor(current / 2); else hold; then clamp to [min, max] and stabilise with a 0 s scale-up and a
    300 s scale-down cooldown, HPA-style (up: min over the up window, down: max over the down
    window). ``inverted_stabilization=True`` is AIBrix's code as shipped, which keeps the max in
    the up window and the *min* in the down window (§4.3), so it scales down early.

    ``metric``: ``kv_cache_usage`` (mean over ready pods, AIBrix's examples use target 0.5) or
    ``running+waiting`` per ready pod (``target=None``: Little's law, μ_SLO × slo_target).
    """

    name: str = "aibrix-apa"
    interval: float = 10.0  # resync
    metric: Literal["kv_cache_usage", "running+waiting"] = "kv_cache_usage"
    target: float | None = 0.5
    capacity_per_replica: float | None = None
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

    def _per_pod(self, obs: Observation) -> float | None:
        if obs.ready == 0:
            return None
        if self.metric == "kv_cache_usage":
            return obs.kv_cache_usage
        inflight = _inflight(obs)
        return None if inflight is None else inflight / obs.ready

    def decide(self, observation: Observation, state: AibrixApaState) -> Decision:
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
            target = _little_target(self.target, self.capacity_per_replica, obs)
        current = obs.current
        ratio = per_pod / target
        if ratio > 1 + self.up_tolerance:
            desired = min(math.ceil(current * ratio), math.ceil(self.max_scale_up_rate * current))
        elif ratio < 1 - self.down_tolerance:
            desired = max(math.ceil(current * ratio), math.floor(current / self.max_scale_down_rate))
        else:
            desired = current
        desired = _clamp(desired, obs.min_replicas, obs.max_replicas)

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


# --------------------------------------------------------------------------------------------
# B5: KubeAI
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KubeAiState:
    history: tuple[float, ...] = ()
    consecutive_scale_downs: int = 0


@dataclass(frozen=True)
class KubeAiPolicy:
    """B5, KubeAI's model autoscaler (§4.1, kubeai modelautoscaler/autoscaler.go, modelclient/scale.go).

    Law, every 10 s: push the in-flight requests (running + waiting) into a simple moving average of
    ceil(600 s / 10 s) = 60 samples; desired = ceil(avg / targetRequests) clamped to [min, max]. A
    scale-down is applied only once ``ceil(scaleDownDelay / interval)`` = 3 consecutive decisions
    wanted it (the fourth), and the counter resets on any decision that is not a scale-down. No
    ready endpoint or no metrics: skip. ``target_requests=None`` takes Little's law (μ_SLO ×
    slo_target); 100 is KubeAI's placeholder. ``warm_start`` fills the window with the first sample,
    as KubeAI does when it reloads its saved averages (state.go); False is a cold controller's zeros.
    """

    name: str = "kubeai"
    interval: float = 10.0
    time_window: float = 600.0
    target_requests: float | None = 100.0
    capacity_per_replica: float | None = None
    scale_down_delay: float = 30.0
    warm_start: bool = True

    def initial_state(self) -> KubeAiState:
        return KubeAiState()

    def decide(self, observation: Observation, state: KubeAiState) -> Decision:
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
        target = _little_target(self.target_requests, self.capacity_per_replica, obs)
        wanted = _clamp(math.ceil(avg / target), obs.min_replicas, obs.max_replicas)
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


# --------------------------------------------------------------------------------------------
# B6: llm-d WVA saturation (v1) actuated by an HPA
# --------------------------------------------------------------------------------------------

WVA_HPA = HpaScalingRules(240.0, (HpaScalingPolicy("Pods", 10, 150.0),))  # the WVA chart's default behavior


@dataclass(frozen=True)
class WvaState:
    hpa: HpaState = HpaState()
    desired: int | None = None  # the last wva_desired_replicas emitted
    last_analysis: float | None = None


@dataclass(frozen=True)
class WvaSaturationPolicy:
    """B6, llm-d WVA saturation analyzer v1 behind its HPA (§4.1, WVA docs/saturation-analyzer.md).

    Law, every 60 s: a replica is saturated when KV >= 0.80 or queue >= 5; over the non-saturated
    ones, scale up +1 when mean spare KV < 0.10 or mean spare queue < 3 (every replica saturated
    counts as no spare), except while pods are pending; scale down -1 only if spreading the load over
    one replica fewer still leaves spare >= both triggers and at least 2 replicas are non-saturated.
    The result, ``wva_desired_replicas``, reaches the Deployment through an HPA on an External
    AverageValue metric with target 1 (tolerance 0.1) and the chart's behavior: 240 s stabilisation
    both ways, 10 pods per 150 s. WVA reads each pod's peak KV and queue; the Observation has the
    fleet's mean KV and summed queue, so every ready replica is taken to carry the mean.
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

    def initial_state(self) -> WvaState:
        return WvaState()

    def analyze(self, obs: Observation) -> tuple[int, str] | None:
        """One saturation analysis: the replicas WVA would emit and why; None without metrics."""
        if obs.kv_cache_usage is None or obs.waiting is None or obs.ready == 0:
            return None
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

    def decide(self, observation: Observation, state: WvaState) -> Decision:
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
        forced = _hpa_range_check(obs, obs.min_replicas, obs.max_replicas, state)
        if forced is not None:
            return forced
        pods = obs.ready + obs.starting + obs.unschedulable
        desired = external_average_replicas(float(state.desired), 1.0, pods, self.tolerance)
        text = f"{note}HPA on wva_desired_replicas {state.desired} over {pods} pods"
        d = _hpa_decide(
            obs, state.hpa, desired, text, obs.min_replicas, obs.max_replicas, self.hpa_behavior, self.hpa_behavior
        )
        return replace(d, state=replace(state, hpa=d.state))


# --------------------------------------------------------------------------------------------
# B7: NVIDIA Dynamo SLA planner, throughput mode
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DynamoPlannerPolicy:
    """B7, Dynamo's SLA planner in throughput mode with the constant predictor (§4.1, §4.2).

    Law, every 180 s, with next = the last interval (constant predictor), requests/s = arrivals (the
    frontend's count) and ISL/OSL = tokens per finished request:
    prefill = ceil(requests/s × ISL × min(1, TTFT / expected TTFT) / prefill tokens/s per replica);
    decode = ceil(requests/s × OSL / decode tokens/s per replica at ITL target / (ITL / expected ITL));
    desired = max(prefill, decode, min_endpoint) within [min, max]. Our replicas serve both phases
    (aggregated), so the larger of the two pools sizes the fleet. The throughputs are per replica at
    the SLA; ``decode_profile`` maps ITL (s) to decode tokens/s per replica for the corrected ITL
    (without one, the correction cannot change decode capacity). Like Dynamo, it holds while a
    previous scaling is still starting and when the interval saw no requests (NaN metrics).
    """

    prefill_tokens_per_replica: float
    decode_tokens_per_replica: float
    name: str = "dynamo-planner"
    interval: float = 180.0  # adjustment_interval
    ttft_target: float = 0.5
    itl_target: float = 0.05
    expected_ttft: float | None = None
    expected_itl: float | None = None
    decode_profile: tuple[tuple[float, float], ...] = ()
    min_endpoint: int = 1

    def initial_state(self) -> None:
        return None

    def _decode_capacity(self, itl: float) -> float:
        if not self.decode_profile:
            return self.decode_tokens_per_replica
        points = sorted(self.decode_profile)
        return float(np.interp(itl, [p[0] for p in points], [p[1] for p in points]))

    def decide(self, observation: Observation, state: None) -> Decision:
        obs = observation
        if obs.starting > 0:
            return _hold(obs, f"{obs.starting} pods from the last adjustment still starting", state)
        prompt, output, finished = obs.prompt_tokens_rate, obs.generation_tokens_rate, obs.request_rate
        if prompt is None or output is None or not finished:
            return _hold(obs, "no requests or token metrics this interval (skipping adjustment)", state)
        # next_requests (the frontend's request count, i.e. arrivals when known) x next_isl / interval.
        requests = obs.arrival_rate if obs.arrival_rate is not None else finished
        isl, osl = prompt / finished, output / finished
        p_corr = obs.mean_ttft / self.expected_ttft if obs.mean_ttft and self.expected_ttft else 1.0
        d_corr = obs.mean_itl / self.expected_itl if obs.mean_itl and self.expected_itl else 1.0
        prefill_load = requests * isl * min(1.0, p_corr)
        prefill = math.ceil(prefill_load / self.prefill_tokens_per_replica)
        corrected_itl = self.itl_target / d_corr
        decode = math.ceil(requests * osl / self._decode_capacity(corrected_itl))
        wanted = _clamp(max(prefill, decode, self.min_endpoint), obs.min_replicas, obs.max_replicas)
        text = (
            f"{_v(requests)} req/s: prefill {_v(prefill_load)} tok/s (correction {_v(p_corr)}) needs {prefill}, "
            f"decode {_v(requests * osl)} tok/s at ITL {_s(corrected_itl)} needs {decode}"
        )
        return _verdict(obs, wanted, text, state)


# --------------------------------------------------------------------------------------------
# B0: static provisioning
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StaticPolicy:
    """B0a static-peak / B0b static-mean (§8.2): a fixed count, the cost and SLO ceilings of no scaling."""

    replicas: int
    name: str = "static"
    interval: float = 60.0

    def initial_state(self) -> None:
        return None

    def decide(self, observation: Observation, state: None) -> Decision:
        n = _clamp(self.replicas, observation.min_replicas, observation.max_replicas)
        return Decision(n, f"static {self.replicas} replicas", state)


# --------------------------------------------------------------------------------------------
# The default set
# --------------------------------------------------------------------------------------------


def baselines(
    capacity_per_replica: float,
    max_num_seqs: int,
    *,
    inflight_per_replica: float | None = None,
    prompt_tokens_per_request: float = 3000.0,
    output_tokens_per_request: float = 150.0,
    demand_replicas: Sequence[int] | np.ndarray | None = None,
) -> list[Policy]:
    """B0-B7 as the benchmark runs them (§8.2), for replicas that each sustain ``capacity_per_replica``
    req/s at the SLO and admit ``max_num_seqs`` sequences.

    ``inflight_per_replica``: the in-flight count per replica at that capacity (Little: μ_SLO × mean
    E2E); None takes μ_SLO × the SLO target, right for an E2E SLO. The token sizes turn μ_SLO into the
    Dynamo planner's token throughputs (its profiling defaults: ISL 3000, OSL 150).
    ``demand_replicas``: the oracle's per-window need c_w; when given, adds static-peak (max) and
    static-mean (ceil of the mean).
    """
    policies: list[Policy] = []
    if demand_replicas is not None:
        c = np.asarray(demand_replicas, dtype=float)
        policies.append(StaticPolicy(int(c.max()), name="static-peak"))
        policies.append(StaticPolicy(math.ceil(float(c.mean()) - 1e-9), name="static-mean"))
    policies += [
        HpaPolicy(name="hpa-waiting", metric="waiting", target=5.0),
        HpaPolicy(
            name="hpa-inflight",
            metric="running+waiting",
            target=inflight_per_replica,
            capacity_per_replica=capacity_per_replica,
        ),
        KedaPolicy(name="keda"),
        KedaPolicy(name="keda-zero", min_replica_count=0, keep_alive=True),
        KpaPolicy(container_concurrency=max_num_seqs),
        AibrixApaPolicy(
            metric="running+waiting", target=inflight_per_replica, capacity_per_replica=capacity_per_replica
        ),
        KubeAiPolicy(target_requests=inflight_per_replica, capacity_per_replica=capacity_per_replica),
        WvaSaturationPolicy(),
        DynamoPlannerPolicy(
            prefill_tokens_per_replica=capacity_per_replica * prompt_tokens_per_request,
            decode_tokens_per_replica=capacity_per_replica * output_tokens_per_request,
        ),
    ]
    return policies
