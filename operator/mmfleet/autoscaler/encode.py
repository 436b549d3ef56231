"""The encode tier's cycle (spec.disaggregation.encode.autoscaling): the fleet's own policy, on that tier's signal.

The encode tier is a fleet of its own to ``SloPolicy``: its demand is the items (images, videos, audio clips) per
second the serving pods' sidecars send it, so the capacity it learns is items per second per encode replica, which
holds across request mixes where requests per second would not; its latency is the SLO's percentile of those calls
as the sidecars wait for them (the hop, the encode server's preprocessing and queue, the encoder: what a request's
TTFT holds of the tier, including the API server's queue that vLLM's own histograms leave out); its target is its
share of the SLO's target; its queue and running requests are its pods', counted in items. The serving tier is held
to the rest of the target on its servers' own histogram (``cycle.serving_target``, ``metrics.Target.of``). Two tiers
that each hold their part at the percentile do not strictly bound the whole's percentile (at P90 an image request
exceeds the sum of the parts at most 20% of the time, by the union bound): the split makes each tier answer for what
it can fix, and the whole, as clients see it, is the front door's histogram (docs/autoscaling.md, The encode tier).

As the serving tier's cycle (``cycle``), it holds on silence and on bad data (said in ``EncodeMetricsAvailable``), and
decides only once its series have covered a rate window. It also holds while most calls to it bring no encoder
outputs: the servers then encode those items themselves, and its latency and demand read low. Unlike the serving
tier's, a sample far beyond what it has shown is not held for confirmation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from mmfleet.api import ConditionType, EncodeMetricsAvailableReason, MultimodalInference, clamp_replicas, seconds
from mmfleet.autoscaler import Observation
from mmfleet.autoscaler.cycle import RATE_WINDOW_S, Pods, policy_for, series_since, should_report
from mmfleet.autoscaler.metrics import RATE_WINDOW, Signals
from mmfleet.status import ConditionRow

# The share of calls to the encode tier that brought no encoder outputs (errors, timeouts) above which its signal says
# nothing of what it can serve: the servers encoded those items themselves, so its latency and demand read low.
FAILING = 0.5


@dataclass(frozen=True)
class EncodeMemory:
    """What the loop keeps about one fleet's encode tier between cycles."""

    policy_state: Any = None
    metrics_since: float | None = None  # since when its series were read with no gap longer than the rate window
    series_read: float | None = None


@dataclass(frozen=True)
class EncodeOutcome:
    """One cycle's decision for an encode tier, and what status says of it."""

    current: int
    replicas: int
    reason: str
    memory: EncodeMemory
    latency: float | None  # the percentile of the waits for the tier, None when none was measured
    target: float
    metrics: ConditionRow  # EncodeMetricsAvailable

    @property
    def scaled(self) -> bool:
        return self.replicas != self.current


def encode_target(inference: MultimodalInference) -> float:
    """Seconds the encode tier's percentile may take: its share of the SLO's target."""
    scaling, autoscaling = inference.spec.encode_autoscaling, inference.spec.autoscaling
    assert scaling is not None and autoscaling is not None and autoscaling.slo is not None
    return scaling.share * seconds(autoscaling.slo.target)


def _bad(signals: Signals) -> list[str]:
    """The values no encode tier produces (an infinity, a negative; NaN fails both), quoted."""
    values = (
        ("latency", signals.latency),
        ("items/s", signals.request_rate),
        ("waiting", signals.waiting),
        ("running", signals.running),
    )
    return [f"{name} = {value:g}" for name, value in values if value is not None and not 0.0 <= value < math.inf]


def _unusable(
    inference: MultimodalInference, signals: Signals | None, outage: str | None, ready: int
) -> ConditionRow | None:
    """EncodeMetricsAvailable when the encode tier's signals cannot be used (it then holds), else None."""
    kind: ConditionType = "EncodeMetricsAvailable"
    why = EncodeMetricsAvailableReason
    if outage is not None:
        return (kind, False, why.PROMETHEUS_UNAVAILABLE, outage)
    if signals is None:
        return (kind, None, why.QUERY_FAILED, "not read this cycle")
    if signals.failed is not None:
        return (kind, False, why.QUERY_FAILED, signals.failed)
    if signals.missing:
        if ready == 0:
            return (kind, None, why.NO_POD_SERVING, "no encode pod is Ready, so none is scraped yet")
        meta = inference.metadata
        return (
            kind,
            False,
            why.SERIES_MISSING,
            f"Prometheus has no {', '.join(signals.missing)} for namespace={meta.namespace}, fleet {meta.name} (does "
            "Prometheus scrape the serving and the encode pods?)",
        )
    bad = _bad(signals)
    if bad:
        return (kind, False, why.SAMPLES_REJECTED, f"not trusted: {'; '.join(bad)}")
    if (signals.failing or 0.0) >= FAILING:
        return (
            kind,
            False,
            why.CALLS_FAILING,
            f"{signals.failing:.0%} of the calls to the encode tier brought no encoder outputs over the last "
            f"{RATE_WINDOW} (the servers encoded those items themselves): its latency and demand say nothing of what "
            "it serves (see its pods' logs and EncodeReady)",
        )
    return None


def decide_encode(
    inference: MultimodalInference,
    current: int,
    pods: Pods,
    signals: Signals | None,
    outage: str | None,
    memory: EncodeMemory,
    now: datetime,
    *,
    interval: float,
    cold_start: float,
) -> EncodeOutcome:
    """One cycle for one fleet's encode tier: hold on silence, bad data or failing calls, else ask the policy."""
    scaling, autoscaling = inference.spec.encode_autoscaling, inference.spec.autoscaling
    assert scaling is not None and autoscaling is not None and autoscaling.slo is not None
    slo = autoscaling.slo
    target = encode_target(inference)
    low, high = scaling.min_replicas, scaling.max_replicas
    held = clamp_replicas(current, low, high)
    clock = now.timestamp()
    present: ConditionRow = (
        "EncodeMetricsAvailable",
        True,
        EncodeMetricsAvailableReason.SERIES_PRESENT,
        "the waits for the encode tier, the items sent to it, and its pods' queue read",
    )

    def hold(why: str, metrics: ConditionRow = present, latency: float | None = None) -> EncodeOutcome:
        moved = f"{current} -> {held}, within minReplicas and maxReplicas" if held != current else f"holding {held}"
        return EncodeOutcome(current, held, f"{why}: {moved}", memory, latency, target, metrics)

    unusable = _unusable(inference, signals, outage, pods.ready)
    if unusable is not None:
        return hold(f"encode tier metrics unavailable ({unusable[3]})", unusable)
    assert signals is not None
    since = series_since(memory.metrics_since, memory.series_read, clock)
    memory = replace(memory, metrics_since=since, series_read=clock)
    in_flight = (signals.waiting or 0.0) + (signals.running or 0.0)
    idle = signals.latency is None and signals.request_rate == 0 and in_flight == 0
    if clock - since < RATE_WINDOW_S:
        why = f"encode tier series read for {clock - since:.0f}s, less than the {RATE_WINDOW} rate window"
        return hold(why, latency=signals.latency)
    # The fleet's scale-down delay and SLO window; not its capacityPerReplica, which counts the serving replicas'
    # requests, not the items an encode replica takes.
    policy = replace(policy_for(autoscaling, slo, interval), capacity_per_replica=None)
    state = memory.policy_state if memory.policy_state is not None else policy.initial_state()
    expected = should_report(pods, now)
    observation = Observation(
        time=clock,
        ready=pods.ready,
        starting=pods.starting,
        unschedulable=pods.unschedulable,
        current=current,
        min_replicas=low,
        max_replicas=high,
        slo_target=target,
        slo_percentile=slo.percentile,
        cold_start=cold_start,
        request_rate=signals.request_rate,
        latency=0.0 if idle else signals.latency,
        waiting=signals.waiting,
        running=signals.running,
        # pods too newly Ready to have been scraped count as reporting, as the serving tier's
        reporting=None if signals.reporting is None else signals.reporting + pods.ready - expected,
    )
    decision = policy.decide(observation, state)
    reason = decision.reason.replace(" req/s", " items/s") + f" (encode tier: {scaling.share:.0%} of {slo.target})"
    memory = replace(memory, policy_state=decision.state)
    return EncodeOutcome(current, decision.replicas, reason, memory, signals.latency, target, present)
