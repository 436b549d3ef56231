"""B3: the Knative Pod Autoscaler (KPA): stable and panic windows over concurrency."""

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
    _mean,
    _recent,
    _v,
    _verdict,
)
from mmfleet_lab.twin.policy import LabObservation


@dataclass(frozen=True)
class KpaState:
    started: bool = False
    samples: Samples = ()
    panic_time: float | None = None
    max_panic_pods: int = 0
    zero_since: float | None = None
    desired: Samples = ()  # for scale_down_delay


@dataclass(frozen=True)
class KpaPolicy:
    """B3, Knative's KPA decider on concurrency (knative/serving @98e5ef9: pkg/autoscaler/scaling/autoscaler.go,
    defaults in pkg/autoscaler/config/config.go).

    Law, every 2 s: target = max(0.01, 0.7 × the per-pod target), the target being the
    ``autoscaling.knative.dev/target`` annotation (``target``; None: containerConcurrency = max_num_seqs,
    which is a hard limit on a vLLM pod's batch, far above what it serves within an SLO);
        dspc = ceil(stable avg / target) over 60 s and dppc = ceil(panic avg / target) over 6 s, each kept within
    [floor(ready / 2), ceil(1000 × ready)]. Panic starts or extends when
    dppc / ready >= 2.0 and ends once 60 s pass without that; in panic the count is the max of both
    and never decreases. Concurrency is running + waiting (the queue-proxy sees both). A new decider
    starts in panic at the ready count when more than one pod is ready. Scale to zero (only with a
    fleet minimum of 0) waits the 30 s grace period. ``scale_down_delay`` (``autoscaling.knative.dev/scale-down-delay``,
    default 0) applies the max of the desired counts over that window (pkg/autoscaler/scaling/autoscaler.go's
    ``delayWindow``). The Activator's buffering is routing, not
    sizing, and is left to the simulator.
    """

    name: str = "knative-kpa"
    interval: float = 2.0  # tickInterval
    container_concurrency: int = 256  # max_num_seqs
    target: float | None = None  # autoscaling.knative.dev/target, in-flight per pod
    scale_down_delay: float = 0.0
    target_utilization: float = 0.7
    stable_window: float = 60.0
    panic_window_percentage: float = 10.0
    panic_threshold: float = 2.0
    max_scale_up_rate: float = 1000.0
    max_scale_down_rate: float = 2.0
    scale_to_zero_grace: float = 30.0
    enable_scale_to_zero: bool = True
    # "gauge": running + waiting as last scraped; "averaged": the time-weighted concurrency the queue-proxy reports,
    # request rate x mean latency over the rate window (Little's law), which a short request does not slip between.
    concurrency: Literal["gauge", "averaged"] = "gauge"

    def initial_state(self) -> KpaState:
        return KpaState()

    @property
    def panic_window(self) -> float:
        return max(1.0, round(self.stable_window * self.panic_window_percentage / 100.0))

    def decide(self, observation: LabObservation, state: KpaState) -> Decision:
        obs = observation
        if not state.started:
            state = KpaState(started=True)
            if obs.ready > 1:
                state = replace(state, panic_time=obs.time, max_panic_pods=obs.ready)
        value = _inflight(obs)
        mean = obs.extra.get("mean_e2e")
        if self.concurrency == "averaged" and obs.request_rate is not None and mean is not None:
            value = obs.request_rate * mean
        held = obs.extra.get("held_now", obs.held)
        if obs.ready == 0 and held > 0:
            # No pod Ready: the activator is in the request path, buffers the requests and reports them as the
            # revision's concurrency (knative/serving pkg/activator), which is what brings a revision back from zero.
            value = (value or 0.0) + held
        if value is None:
            return _hold(obs, "no concurrency data yet (ErrNoData)", state)
        samples = (*_recent(state.samples, obs.time, self.stable_window), (obs.time, value))
        stable = _mean(samples)
        panic = _mean(_recent(samples, obs.time, self.panic_window))
        ready = max(1.0, float(obs.ready))
        per_pod = float(self.container_concurrency) if self.target is None else self.target
        target = max(0.01, per_pod * self.target_utilization)
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
        delayed: Samples = ()
        if self.scale_down_delay > 0:
            delayed = (*_recent(state.desired, obs.time, self.scale_down_delay), (obs.time, float(desired)))
            desired = int(max(value for _, value in delayed))
        state = replace(state, samples=samples, panic_time=panic_time, max_panic_pods=max_panic, desired=delayed)

        low = obs.min_replicas if self.enable_scale_to_zero else max(1, obs.min_replicas)
        wanted = clamp_replicas(desired, low, obs.max_replicas)
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
