"""The status of a MultimodalInference: written only by the operator."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import ConfigDict, Field
from pydantic.config import JsonDict

from mmfleet.api.base import Model
from mmfleet.api.conditions import CONDITION_TYPES, ConditionType

# The most a condition's message may hold (Condition.message's maxLength): longer ones are cut with TRUNCATED.
CONDITION_MESSAGE_MAX = 32768
TRUNCATED = " ... (truncated)"
SCALE_REASON_MAX = 4096
# The operator writes these; bounded so that the CRD bounds every string and list. A timestamp is RFC 3339.
_SHORT = 64
_TIME: JsonDict = {"maxLength": _SHORT}


class StatusModel(Model):
    """Base of what ``.status`` holds: fields it does not know are ignored, not refused, because a status written
    by another version of the operator (after a rollback) is still this resource's status."""

    model_config = ConfigDict(extra="ignore")


class Condition(StatusModel):
    """A status condition, as Kubernetes conventions define it."""

    type: ConditionType = Field(description=f"{', '.join(CONDITION_TYPES[:-1])} or {CONDITION_TYPES[-1]}.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(default="", max_length=1024, description="CamelCase reason for the last transition.")
    message: str = Field(default="", max_length=CONDITION_MESSAGE_MAX, description="What happened, for a person.")
    last_transition_time: datetime | None = Field(
        default=None, description="When status last changed.", json_schema_extra=_TIME
    )
    observed_generation: int | None = Field(default=None, description="Generation the condition was computed for.")


class SloStatus(StatusModel):
    """The latency objective as last measured."""

    observed: str | None = Field(
        default=None, max_length=_SHORT, description="Measured percentile latency, e.g. 1.42s."
    )
    target: str | None = Field(default=None, max_length=_SHORT, description="The target from spec.autoscaling.slo.")
    attainment: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Share of the autoscaling cycles of the last hour whose measured percentile met the target.",
    )
    last_evaluated: datetime | None = Field(
        default=None, description="When the latency was last measured.", json_schema_extra=_TIME
    )


class ColdStartStatus(StatusModel):
    """How long the fleet's pods took from creation to Ready, phase by phase, from the timestamps Kubernetes records:
    medians over the Ready pods last measured. The autoscaler plans with ``total`` as the lead time of a new replica."""

    total: str | None = Field(default=None, max_length=_SHORT, description="Creation to Ready, e.g. 95.2s.")
    scheduled: str | None = Field(
        default=None, max_length=_SHORT, description="Creation to PodScheduled: waiting for a node with free GPUs."
    )
    initialized: str | None = Field(
        default=None,
        max_length=_SHORT,
        description="PodScheduled to Initialized: the pod's sandbox, network, volumes and init containers.",
    )
    started: str | None = Field(
        default=None,
        max_length=_SHORT,
        description="Initialized to the server container running: its image pulled, the container created.",
    )
    ready: str | None = Field(
        default=None,
        max_length=_SHORT,
        description="Container running to Ready: weights loaded, kernels compiled, the readiness probe passed.",
    )
    weights: str | None = Field(
        default=None,
        max_length=_SHORT,
        description="Within ready, from the server's log (vLLM): the weights loaded onto the GPUs.",
    )
    engine: str | None = Field(
        default=None,
        max_length=_SHORT,
        description="Within ready, from the server's log (vLLM), after the weights: memory profiled, KV cache "
        "allocated, kernels compiled and warmed up (CUDA graphs captured).",
    )
    compile: str | None = Field(
        default=None,
        max_length=_SHORT,
        description="Within engine, from the server's log (vLLM): torch.compile (short with a warm compile cache).",
    )
    pods: int | None = Field(default=None, ge=0, description="Ready pods the medians are over.")


class StandbyStatus(StatusModel):
    """spec.autoscaling.warmStandby: the replicas kept asleep and how long waking one took."""

    asleep: int | None = Field(default=None, ge=0, description="Replicas asleep now, out of routing.")
    serving: int | None = Field(default=None, ge=0, description="Replicas in routing (awake), Ready.")
    wake: str | None = Field(
        default=None,
        max_length=_SHORT,
        description="Median time vLLM's /wake_up took over the last wakes, e.g. 4.1s (against coldStart.total).",
    )
    wakes: int | None = Field(default=None, ge=0, description="Wakes the median is over.")
    problem: str | None = Field(
        default=None,
        max_length=1000,
        description="The last sleep or wake that failed: the pod, the call and its answer; cleared by one that works.",
    )


Phase = Literal["Pending", "Progressing", "Ready", "Degraded", "Failed"]


class RoutingStatus(StatusModel):
    """Routing mode inferencePool: the InferencePool and its endpoint picker."""

    pool: str | None = Field(default=None, max_length=_SHORT, description="The InferencePool, named like the fleet.")
    picker: str | None = Field(default=None, max_length=_SHORT, description="The endpoint picker's Deployment.")
    picker_ready: bool | None = Field(default=None, description="Whether the endpoint picker serves.")


class EncodeTierStatus(StatusModel):
    """spec.disaggregation.encode: the encode tier's Deployment and its replicas."""

    deployment: str | None = Field(default=None, max_length=_SHORT, description="The encode tier's Deployment.")
    replicas: int | None = Field(default=None, ge=0, description="Encode replicas that exist.")
    ready_replicas: int | None = Field(default=None, ge=0, description="Encode replicas ready to serve.")
    desired_replicas: int | None = Field(
        default=None, ge=0, description="Encode replicas the spec asks for, or its autoscaler."
    )
    latency: str | None = Field(
        default=None,
        max_length=_SHORT,
        description="With its autoscaling: the SLO's percentile of the serving pods' calls to the tier, e.g. 120ms.",
    )
    target: str | None = Field(
        default=None,
        max_length=_SHORT,
        description="With its autoscaling: what that percentile must stay under, its share of the SLO's target.",
    )
    last_scale_reason: str | None = Field(
        default=None, max_length=SCALE_REASON_MAX, description="With its autoscaling: the last decision, and why."
    )


class MultimodalInferenceStatus(StatusModel):
    """What the operator observed; written only by the operator."""

    phase: Phase | None = Field(default=None, description="Pending, Progressing, Ready, Degraded or Failed.")
    observed_generation: int | None = Field(default=None, description="Last spec generation acted on.")
    replicas: int | None = Field(default=None, description="Replicas that exist (scale subresource).")
    ready_replicas: int | None = Field(default=None, description="Replicas ready to serve.")
    desired_replicas: int | None = Field(default=None, description="Replicas the operator wants.")
    selector: str | None = Field(
        default=None, max_length=1024, description="Label selector of the pods (scale subresource)."
    )
    endpoint: str | None = Field(
        default=None, max_length=1024, description="In-cluster URL of the OpenAI-compatible API."
    )
    cloud: str | None = Field(default=None, max_length=_SHORT, description="Cloud profile in use.")
    backend: str | None = Field(
        default=None, max_length=_SHORT, description="Backend in use (spec.backend.name with its default)."
    )
    conditions: list[Condition] = Field(default_factory=list, max_length=16, description="Current conditions.")
    routing: RoutingStatus | None = Field(default=None, description="The InferencePool and its picker, if any.")
    encode: EncodeTierStatus | None = Field(default=None, description="The encode tier, if any.")
    slo: SloStatus | None = Field(default=None, description="Latency objective as last measured.")
    cold_start: ColdStartStatus | None = Field(
        default=None, description="Autoscaled fleets: how long a new replica took to serve, phase by phase."
    )
    standby: StandbyStatus | None = Field(
        default=None, description="With autoscaling.warmStandby: the sleeping replicas and their wake time."
    )
    last_scale_time: datetime | None = Field(
        default=None, description="When the autoscaler last changed the replicas.", json_schema_extra=_TIME
    )
    last_scale_reason: str | None = Field(
        default=None,
        max_length=SCALE_REASON_MAX,
        description="Why the autoscaler last changed the replicas, e.g. P90 2.8s > target 2s, ...: 4 -> 7.",
    )
