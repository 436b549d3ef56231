"""One autoscaling cycle over made-up fleets and signals, at a fixed time (``mmfleet.autoscaler.cycle``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from mmfleet.api import MultimodalInference
from mmfleet.autoscaler.cycle import Memory, Outcome, Pods, Seen, decide
from mmfleet.autoscaler.metrics import Signals
from tests.helpers.repo import spec_doc

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
INTERVAL = 15.0


def fleet(min_replicas: int = 1, max_replicas: int = 8, **slo: Any) -> MultimodalInference:
    doc = spec_doc(
        autoscaling={
            "minReplicas": min_replicas,
            "maxReplicas": max_replicas,
            "slo": {"target": "2s", "window": "60s", **slo},
        }
    )
    doc["metadata"]["generation"] = 3
    return MultimodalInference.model_validate(doc)


def conditions(outcome: Outcome) -> dict[str, tuple[bool | None, str, str]]:
    return {kind: (ok, reason, message) for kind, ok, reason, message in outcome.conditions}


def busy(latency: float | None, rate: float = 10.0, waiting: float = 20.0, running: float = 10.0) -> Signals:
    return Signals(latency=latency, request_rate=rate, waiting=waiting, running=running, kv_cache_usage=0.6)


def run(
    inference: MultimodalInference,
    current: int,
    signals: Signals | None,
    cycles: int,
    pods: Pods | None = None,
    outage: str | None = None,
    memory: Memory | None = None,
    start: datetime = T0,
) -> tuple[list[Outcome], Memory, int]:
    """Cycles every 15 s with the same view, actuating each decision as the controller would."""
    memory = memory or Memory()
    outcomes = []
    for i in range(cycles):
        ready = pods or Pods(ready=current)
        seen = Seen(current, ready, signals, outage)
        outcome = decide(
            inference, seen, memory, start + timedelta(seconds=INTERVAL * i), interval=INTERVAL, default_cold_start=120
        )
        outcomes.append(outcome)
        memory, current = outcome.memory, outcome.replicas
    return outcomes, memory, current
