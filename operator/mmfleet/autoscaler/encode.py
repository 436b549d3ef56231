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

As the serving tier's cycle (``cycle``), it holds on silence and on bad data, and decides only once its series have
covered a rate window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from mmfleet.api import MultimodalInference, clamp_replicas, seconds
from mmfleet.autoscaler import Observation
from mmfleet.autoscaler.cycle import RATE_WINDOW_S, Pods, policy_for
from mmfleet.autoscaler.metrics import RATE_WINDOW, Signals


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
    latency: float | None  # the percentile of the calls to the tier, None when none was measured
    target: float

    @property
    def scaled(self) -> bool:
        return self.replicas != self.current


def encode_target(inference: MultimodalInference) -> float:
    """Seconds the encode tier's percentile may take: its share of the SLO's target."""
    scaling, autoscaling = inference.spec.encode_autoscaling, inference.spec.autoscaling
    assert scaling is not None and autoscaling is not None and autoscaling.slo is not None
    return scaling.share * seconds(autoscaling.slo.target)


def _bad(signals: Signals) -> list[str]:
    """The values no encode tier produces (NaN, an infinity, a negative), quoted."""
    values = (
        ("latency", signals.latency),
        ("items/s", signals.request_rate),
        ("waiting", signals.waiting),
        ("running", signals.running),
    )
    return [f"{name} = {value:g}" for name, value in values if value is not None and not 0.0 <= value < math.inf]


def decide_encode(
    inference: MultimodalInference,
    current: int,
    pods: Pods,
    signals: Signals | None,
    outage: str | None,
    memory: EncodeMemory,
    clock: float,
    *,
    interval: float,
    cold_start: float,
) -> EncodeOutcome:
    """One cycle for one fleet's encode tier: hold on silence or bad data, else ask the policy."""
    scaling, autoscaling = inference.spec.encode_autoscaling, inference.spec.autoscaling
    assert scaling is not None and autoscaling is not None and autoscaling.slo is not None
    slo = autoscaling.slo
    target = encode_target(inference)
    low, high = scaling.min_replicas, scaling.max_replicas
    held = clamp_replicas(current, low, high)

    def hold(why: str, latency: float | None = None) -> EncodeOutcome:
        moved = f"{current} -> {held}, within minReplicas and maxReplicas" if held != current else f"holding {held}"
        return EncodeOutcome(current, held, f"{why}: {moved}", memory, latency, target)

    problem = outage or (signals.failed if signals is not None else "not read")
    if problem is not None:
        return hold(f"encode tier metrics unavailable ({problem})")
    assert signals is not None
    if signals.missing:
        if pods.ready == 0:
            return hold("no encode pod is Ready, so none is scraped yet")
        meta = inference.metadata
        return hold(
            f"Prometheus has no {', '.join(signals.missing)} for namespace={meta.namespace}, fleet {meta.name} "
            "(does Prometheus scrape the serving and the encode pods?)"
        )
    bad = _bad(signals)
    if bad:
        return hold(f"encode tier samples not trusted ({'; '.join(bad)})")
    gap = memory.series_read is not None and clock - memory.series_read > RATE_WINDOW_S
    since = clock if memory.metrics_since is None or gap else memory.metrics_since
    memory = replace(memory, metrics_since=since, series_read=clock)
    in_flight = (signals.waiting or 0.0) + (signals.running or 0.0)
    idle = signals.latency is None and signals.request_rate == 0 and in_flight == 0
    latency = 0.0 if idle else signals.latency
    if clock - since < RATE_WINDOW_S:
        return hold(f"encode tier series read for {clock - since:.0f}s, less than the {RATE_WINDOW} rate window")
    # The fleet's scale-down delay and SLO window; not its capacityPerReplica, which counts the serving replicas'
    # requests, not the items an encode replica takes.
    policy = replace(policy_for(autoscaling, slo, interval), capacity_per_replica=None)
    state = memory.policy_state if memory.policy_state is not None else policy.initial_state()
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
        latency=latency,
        waiting=signals.waiting,
        running=signals.running,
        reporting=signals.reporting,
    )
    decision = policy.decide(observation, state)
    reason = decision.reason.replace(" req/s", " items/s") + f" (encode tier: {scaling.share:.0%} of {slo.target})"
    return EncodeOutcome(
        current,
        decision.replicas,
        reason,
        replace(memory, policy_state=decision.state),
        signals.latency,
        target,
    )
