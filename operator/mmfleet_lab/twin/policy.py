"""What a policy under test sees in the twin: the operator's ``Observation`` and the signals only baselines read.

The operator's ``SloPolicy`` reads an ``mmfleet.autoscaler.Observation``; ``LabObservation`` is one
of those, so the shipped policy and every baseline run on the same cycle's data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from mmfleet.autoscaler import Decision, Observation


@dataclass(frozen=True)
class LabObservation(Observation):
    """The operator's view plus token rates (AIBrix, Dynamo), mean latencies (Dynamo's correction
    factors, ai-dynamo/dynamo docs/planner/sla_planner.md @240df6a) and per-metric percentiles in ``extra`` (at
    the SLO's percentile over its window; llm-d's P90 TTFT and TPOT over 1 m, ``p90_ttft_1m``/``p90_tpot_1m``)."""

    prompt_tokens_rate: float | None = None  # tokens/s
    generation_tokens_rate: float | None = None  # tokens/s
    mean_ttft: float | None = None  # seconds, mean over the rate window
    mean_itl: float | None = None  # seconds, mean over the rate window
    extra: dict[str, float] = field(default_factory=dict)
    # Requests held in front of the servers, as last scraped: at the gateway while no pod is Ready (Knative's
    # activator, the endpoint picker's flow control), or in the picker's flow control while the pool is saturated.
    held: float = 0.0


class Policy(Protocol):
    """A scaling policy; ``name`` labels it in benchmark tables.

    ``name`` and ``interval`` are read-only properties so that frozen dataclasses (every policy in
    ``baselines`` and ``oracle``) satisfy the protocol; plain attributes still do.
    """

    @property
    def name(self) -> str: ...

    @property
    def interval(self) -> float:
        """Seconds between decisions (HPA 15, KPA 2, ...); the harness calls decide this often."""

    def initial_state(self) -> Any:
        """The memory before the first observation."""

    def decide(self, observation: LabObservation, state: Any) -> Decision:
        """The replicas to set now; must not do I/O."""
