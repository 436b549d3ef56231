"""What the baselines share: sample windows, Little's-law targets, formatting, hold and verdict."""

from __future__ import annotations

from mmfleet.autoscaler import Decision
from mmfleet_lab.twin.policy import LabObservation

Samples = tuple[tuple[float, float], ...]  # (time, value), oldest first


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
    """``tolerances.isWithin``: 1 - down <= ratio <= 1 + up.

    From kubernetes/kubernetes pkg/controller/podautoscaler/replica_calculator.go @19e8ce76.
    """
    return 1.0 - tolerance <= ratio <= 1.0 + tolerance


def _inflight(obs: LabObservation) -> float | None:
    if obs.running is None or obs.waiting is None:
        return None
    return obs.running + obs.waiting


def _little_target(target: float | None, capacity: float | None, mean_latency: float | None) -> float:
    """A per-replica in-flight target: given, or Little's law at capacity, μ_SLO × the *mean* latency there.

    The mean, not the SLO's target: a P90 target is well above the mean, so μ_SLO × target overstates the
    in-flight count a replica holds at μ_SLO (2.1× on azure-conv).
    """
    if target is not None:
        return target
    if capacity is None or mean_latency is None:
        raise ValueError("an in-flight target needs target=, or capacity_per_replica= and mean_latency=")
    return capacity * mean_latency


def _verdict(obs: LabObservation, wanted: int, text: str, state: object) -> Decision:
    """The decision with its reason: the evidence, then the change (or that there is none)."""
    if wanted == obs.current:
        return Decision(wanted, f"{text}: holding {wanted}", state)
    return Decision(wanted, f"{text}: {obs.current} -> {wanted}", state)


def _hold(obs: LabObservation, why: str, state: object) -> Decision:
    return Decision(obs.current, f"{why}: holding {obs.current}", state)
