"""The autoscalers users run today, re-implemented exactly enough to race ours on the same trace;
one module per competitor, and here the knobs their users turn (``grid``) and how a setting becomes a
policy (``build``).

Each class reproduces one real control law with its shipped defaults, as read from the upstream
source its docstring names (repository, path and commit). They are pure: the
memory each one keeps between cycles (stabilisation windows, moving averages, panic mode) lives
in the frozen state it returns. They see only what an ``Observation`` carries, so where the real
system reads per-pod series we say how the fleet-wide sums stand in for them.

A setting is a flat mapping of absolute values (an in-flight target of 48, not "0.7 × μ_SLO"): what a
user writes in a manifest, frozen once tuned on the training traces and used as is on every other.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from mmfleet_lab.bench.baselines.aibrix import AibrixApaPolicy
from mmfleet_lab.bench.baselines.dynamo import DynamoPlannerPolicy
from mmfleet_lab.bench.baselines.hpa import HpaPolicy, HpaScalingPolicy, HpaScalingRules
from mmfleet_lab.bench.baselines.keda import KedaPolicy
from mmfleet_lab.bench.baselines.knative import KpaPolicy
from mmfleet_lab.bench.baselines.kubeai import KubeAiPolicy
from mmfleet_lab.bench.baselines.static import StaticPolicy
from mmfleet_lab.bench.baselines.wva import WvaSaturationPolicy
from mmfleet_lab.twin.policy import Policy

Setting = Mapping[str, float | str]
FAMILIES = ("static", "hpa", "keda", "knative-kpa", "aibrix-apa", "kubeai", "wva-saturation", "dynamo-planner")
TARGET_STEPS = (0.5, 0.7, 1.0, 1.4)  # × the Little's-law in-flight per replica, a user's first guesses
# HPA/KEDA scale-down: the v2 default, and the gentler one the issue found (10 % per 60 s after a 60 s window).
SCALE_DOWN: tuple[tuple[float, float, float], ...] = ((300.0, 100.0, 15.0), (60.0, 10.0, 60.0))


@dataclass(frozen=True)
class Profile:
    """What a user measures on the training trace before configuring a baseline.

    ``capacity``: req/s one replica sustains at the SLO (μ_SLO); ``mean_latency``: the mean latency at
    that load, so Little's law gives the in-flight count per replica there; ``isl``/``osl``: mean tokens
    per request; the replica's ``max_num_seqs`` and KV-cache tokens come from its vLLM configuration.
    """

    capacity: float
    mean_latency: float
    isl: float
    osl: float
    max_num_seqs: int
    kv_capacity_tokens: float
    mean_replicas: float  # the training trace's mean need, where a static fleet's sweep starts

    @property
    def inflight(self) -> float:
        return self.capacity * self.mean_latency


def _down(window: float, percent: float, period: float) -> HpaScalingRules:
    return HpaScalingRules(window, (HpaScalingPolicy("Percent", int(percent), period),))


def build(family: str, k: Setting, profile: Profile) -> Policy:
    """The policy ``family`` with setting ``k`` (a mapping from ``grid``, or read back from tuned.json)."""
    f = {key: float(v) for key, v in k.items() if not isinstance(v, str)}
    s = {key: v for key, v in k.items() if isinstance(v, str)}
    if family == "static":
        return StaticPolicy(int(f["replicas"]), name="static")
    if family in ("hpa", "keda"):
        metric: Literal["waiting", "running+waiting"] = (
            "running+waiting" if s["metric"] == "running+waiting" else "waiting"
        )
        down = _down(f["down_window"], f["down_percent"], f["down_period"])
        if family == "hpa":
            return HpaPolicy(name="hpa", metric=metric, target=f["target"], scale_down=down)
        return KedaPolicy(name="keda", metric=metric, threshold=f["target"], scale_down=down)
    if family == "knative-kpa":
        return KpaPolicy(
            container_concurrency=profile.max_num_seqs,
            target=f["target"],
            stable_window=f["stable_window"],
            scale_down_delay=f["scale_down_delay"],
        )
    if family == "aibrix-apa":
        metric_a: Literal["kv_cache_usage", "running+waiting"] = (
            "kv_cache_usage" if s["metric"] == "kv_cache_usage" else "running+waiting"
        )
        return AibrixApaPolicy(metric=metric_a, target=f["target"], scale_down_cooldown=f["down_cooldown"])
    if family == "kubeai":
        return KubeAiPolicy(target_requests=f["target"], time_window=f["time_window"])
    if family == "wva-saturation":
        return WvaSaturationPolicy(
            analyzer="v2" if s["analyzer"] == "v2" else "v1",
            kv_threshold=f["kv_threshold"],
            scale_up_threshold=f["scale_up_threshold"],
            scale_down_boundary=f["scale_down_boundary"],
            kv_capacity_tokens=profile.kv_capacity_tokens,
        )
    if family == "dynamo-planner":
        return DynamoPlannerPolicy(
            prefill_tokens_per_replica=f["prefill_tokens"],
            decode_tokens_per_replica=f["decode_tokens"],
            interval=f["interval"],
        )
    raise ValueError(f"unknown baseline {family!r}; choose from {', '.join(FAMILIES)}")


def grid(family: str, p: Profile) -> list[Setting]:
    """The settings a user of ``family`` would try on the training traces; the first is its default
    (with Little's-law targets where the default is a placeholder)."""
    little = [round(m * p.inflight, 1) for m in (1.0, *(x for x in TARGET_STEPS if x != 1.0))]
    if family == "static":
        base = math.ceil(p.mean_replicas)
        return [{"replicas": math.ceil(base * m)} for m in (1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0)]
    if family in ("hpa", "keda"):
        waiting: list[Setting] = [{"metric": "waiting", "target": 5.0, "down_window": 300.0, "down_percent": 100.0,
                                   "down_period": 15.0}]  # fmt: skip
        return waiting + [
            {"metric": "running+waiting", "target": t, "down_window": w, "down_percent": pc, "down_period": pe}
            for t in little
            for w, pc, pe in SCALE_DOWN
        ]
    if family == "knative-kpa":
        return [
            {"target": t, "stable_window": sw, "scale_down_delay": d}
            for t in little[:3]
            for sw, d in ((60.0, 0.0), (180.0, 0.0), (60.0, 300.0))
        ]
    if family == "aibrix-apa":
        kv: list[Setting] = [{"metric": "kv_cache_usage", "target": 0.5, "down_cooldown": 300.0}]
        return kv + [
            {"metric": "running+waiting", "target": t, "down_cooldown": c} for t in little for c in (300.0, 60.0)
        ]
    if family == "kubeai":
        return [{"target": t, "time_window": w} for t in little for w in (600.0, 120.0)]
    if family == "wva-saturation":
        v1: list[Setting] = [{"analyzer": "v1", "kv_threshold": 0.8, "scale_up_threshold": 0.85,
                              "scale_down_boundary": 0.7}]  # fmt: skip
        return v1 + [
            {"analyzer": "v2", "kv_threshold": kv_t, "scale_up_threshold": up, "scale_down_boundary": down}
            for kv_t in (0.8, 0.2, 0.05)
            for up, down in ((0.85, 0.7), (0.7, 0.5))
        ]
    if family == "dynamo-planner":
        return [
            {"prefill_tokens": round(m * p.capacity * p.isl), "decode_tokens": round(m * p.capacity * p.osl),
             "interval": i}
            for m in (1.0, 0.8, 0.6)
            for i in (180.0, 60.0)
        ]  # fmt: skip
    raise ValueError(f"unknown baseline {family!r}; choose from {', '.join(FAMILIES)}")


def baselines(profile: Profile) -> list[Policy]:
    """B0-B7 at their defaults (each family's first ``grid`` setting): what an untuned user runs."""
    return [build(f, grid(f, profile)[0], profile) for f in FAMILIES]


__all__ = ["FAMILIES", "Profile", "Setting", "baselines", "build", "grid"]
