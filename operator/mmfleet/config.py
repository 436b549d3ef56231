"""Operator settings, from flags with environment variables as defaults (for the Deployment's env)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

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


@dataclass(frozen=True)
class OperatorConfig:
    """How one operator process runs; the defaults suit a cluster-wide install."""

    namespaces: tuple[str, ...] = field(default_factory=tuple)
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
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

    @classmethod
    def from_env(cls) -> OperatorConfig:
        env = os.environ
        namespaces = tuple(n for n in env.get("MMFLEET_NAMESPACES", "").split(",") if n)
        log_format: LogFormat = "json" if env.get("MMFLEET_LOG_FORMAT") == "json" else "plain"
        return cls(
            namespaces=namespaces,
            prometheus_url=env.get("MMFLEET_PROMETHEUS_URL", cls.prometheus_url),
            default_cloud=env.get("MMFLEET_DEFAULT_CLOUD", cls.default_cloud),
            log_format=log_format,
            workers=_int(env, "MMFLEET_WORKERS", cls.workers),
            health_address=env.get("MMFLEET_HEALTH_ADDRESS", cls.health_address),
        )
