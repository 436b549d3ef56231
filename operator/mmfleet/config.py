"""Operator settings, from flags with environment variables as defaults (for the Deployment's env)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from mmfleet.api import seconds

LogFormat = Literal["plain", "json"]
CLOUDS = ("auto", "eks", "aks", "ack", "generic")


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    text = env.get(name)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name}: {text!r} is not a whole number") from None


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    """A duration such as 15s or 2m, or a bare number of seconds."""
    text = env.get(name)
    if text is None:
        return default
    try:
        return float(text) if text.replace(".", "", 1).isdigit() else seconds(text)
    except ValueError:
        raise ValueError(f"{name}: {text!r} is not a duration such as 15s, 2m or 90") from None


@dataclass(frozen=True)
class OperatorConfig:
    """How one operator process runs; the defaults suit a cluster-wide install."""

    namespaces: tuple[str, ...] = field(default_factory=tuple)
    # Empty: no Prometheus, so autoscaled fleets hold their replicas and say why (MetricsAvailable).
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    autoscale_interval: float = 15.0  # s between autoscaling cycles
    # The cold start the autoscaler plans with until one of a fleet's pods has been seen turn Ready.
    default_cold_start: float = 120.0
    default_cloud: str = "auto"
    log_format: LogFormat = "plain"
    workers: int = 16
    # Where kopf serves /healthz for the liveness probe; empty turns it off.
    health_address: str = "0.0.0.0:8080"

    def __post_init__(self) -> None:
        if self.default_cloud not in CLOUDS:
            raise ValueError(f"default cloud: {self.default_cloud!r} is not one of {', '.join(CLOUDS)}")
        if self.workers < 1:
            raise ValueError(f"workers: {self.workers} must be at least 1")
        if self.autoscale_interval < 1:
            raise ValueError(f"autoscale interval: {self.autoscale_interval:g}s must be at least 1s")
        if self.default_cold_start < 0:
            raise ValueError(f"default cold start: {self.default_cold_start:g}s must not be negative")

    @classmethod
    def from_env(cls) -> OperatorConfig:
        env = os.environ
        namespaces = tuple(n for n in env.get("MMFLEET_NAMESPACES", "").split(",") if n)
        log_format: LogFormat = "json" if env.get("MMFLEET_LOG_FORMAT") == "json" else "plain"
        return cls(
            namespaces=namespaces,
            prometheus_url=env.get("MMFLEET_PROMETHEUS_URL", cls.prometheus_url),
            autoscale_interval=_seconds(env, "MMFLEET_AUTOSCALE_INTERVAL", cls.autoscale_interval),
            default_cold_start=_seconds(env, "MMFLEET_COLD_START", cls.default_cold_start),
            default_cloud=env.get("MMFLEET_DEFAULT_CLOUD", cls.default_cloud),
            log_format=log_format,
            workers=_int(env, "MMFLEET_WORKERS", cls.workers),
            health_address=env.get("MMFLEET_HEALTH_ADDRESS", cls.health_address),
        )
