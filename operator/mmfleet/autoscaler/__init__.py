"""Autoscaling: what the policy sees (``Observation``), what it says (``Decision``), and the policy.

The policy is pure: ``decide(observation, state) -> Decision`` with its memory carried in ``state``,
so the same code runs in the operator and in the digital twin (``mmfleet_lab.twin``, which extends
``Observation`` with what the benchmark's baselines read), and any run can be replayed from its
observations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Observation:
    """One autoscaling cycle's view of a fleet, exactly what Prometheus and the API server would show.

    Metric fields are None when the series is missing (no scrape yet, Prometheus down); a policy
    must then hold, never read silence as zero load.
    """

    time: float  # seconds since the start of the run
    ready: int  # pods Ready (serving)
    starting: int  # pods holding GPUs but not Ready yet (scheduled, pulling, loading)
    unschedulable: int  # pods Pending for lack of a node with free GPUs
    current: int  # the Deployment's replicas as last set
    min_replicas: int
    max_replicas: int
    slo_target: float  # seconds, for the SLO's metric and percentile
    slo_percentile: float  # e.g. 90
    cold_start: float  # seconds, the policy's estimate of L
    request_rate: float | None = None  # finished requests/s over the rate window, summed over pods
    arrival_rate: float | None = None  # running+waiting growth + finished: the demand estimate, req/s
    latency: float | None = None  # observed percentile of the SLO metric over the SLO window, s
    waiting: float | None = None  # sum of num_requests_waiting over pods
    running: float | None = None  # sum of num_requests_running over pods
    kv_cache_usage: float | None = None  # mean over ready pods, 0..1
    # prompt and output tokens per request finished over the rate window; None when not known (not vLLM, none finished)
    request_mix: tuple[float, float] | None = None
    reporting: int | None = None  # pods whose series were read; None when not known (the twin)
    asleep: int = 0  # warm-standby pods asleep, which a scale-up wakes before it starts any
    wake: float | None = None  # seconds, the fleet's measured wake; None until a wake was measured

    @property
    def metrics_available(self) -> bool:
        return self.latency is not None and self.request_rate is not None


@dataclass(frozen=True)
class Decision:
    """The replica count to set, why, and the memory the next cycle needs."""

    replicas: int
    reason: str
    state: Any = None
