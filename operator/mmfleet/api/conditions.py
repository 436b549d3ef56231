"""The conditions of a MultimodalInference's status, and every reason each can give.

One enum per condition type: the reasons are produced from these members (a member is its string on the wire), and
docs/troubleshooting.md is checked to explain each of them.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal, get_args

ConditionType = Literal[
    "Ready",
    "Progressing",
    "Degraded",
    "ScalingLimited",
    "SLOMet",
    "MetricsAvailable",
    "Idle",
    "PreprocessingBound",
    "DemandSwings",
    "TracingReady",
    "RoutingReady",
    "EncodeReady",
    "EncodeMetricsAvailable",
]
CONDITION_TYPES: tuple[ConditionType, ...] = get_args(ConditionType)


class ReadyReason(StrEnum):
    REPLICAS_READY = "ReplicasReady"
    SCALED_TO_ZERO = "ScaledToZero"
    WAKING_UP = "WakingUp"
    CREATING = "Creating"
    REPLICAS_NOT_READY = "ReplicasNotReady"
    INVALID_SPEC = "InvalidSpec"
    POLICY_DENIED = "PolicyDenied"
    CHILD_NOT_OWNED = "ChildNotOwned"
    APPLY_REFUSED = "ApplyRefused"


class ProgressingReason(StrEnum):
    CREATING = "Creating"
    REPLICAS_STARTING = "ReplicasStarting"
    ROLLED_OUT = "RolledOut"
    PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"
    INVALID_SPEC = "InvalidSpec"
    POLICY_DENIED = "PolicyDenied"
    CHILD_NOT_OWNED = "ChildNotOwned"
    APPLY_REFUSED = "ApplyRefused"
    API_SERVER_RETRYING = "ApiServerRetrying"


class DegradedReason(StrEnum):
    """A pod's problem is passed through in the scheduler's or the kubelet's word: the members from UNSCHEDULABLE to
    CREATE_CONTAINER_CONFIG_ERROR are theirs (another scheduler reason, or a ReplicaSet's other than FailedCreate,
    would pass through too)."""

    AS_EXPECTED = "AsExpected"
    UNSCHEDULABLE = "Unschedulable"
    CRASH_LOOP_BACK_OFF = "CrashLoopBackOff"
    IMAGE_PULL_BACK_OFF = "ImagePullBackOff"
    ERR_IMAGE_PULL = "ErrImagePull"
    INVALID_IMAGE_NAME = "InvalidImageName"
    CREATE_CONTAINER_CONFIG_ERROR = "CreateContainerConfigError"
    PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"
    MODEL_CACHE_CLAIM_MISSING = "ModelCacheClaimMissing"
    MODEL_CACHE_CLAIM_NOT_SHARED = "ModelCacheClaimNotShared"
    MODEL_CACHE_CLAIM_LOST = "ModelCacheClaimLost"
    INVALID_SPEC = "InvalidSpec"
    POLICY_DENIED = "PolicyDenied"
    CHILD_NOT_OWNED = "ChildNotOwned"
    APPLY_REFUSED = "ApplyRefused"
    QUOTA_EXCEEDED = "QuotaExceeded"
    FAILED_CREATE = "FailedCreate"


class ScalingLimitedReason(StrEnum):
    WITHIN_RANGE = "WithinRange"
    AT_MAX_REPLICAS = "AtMaxReplicas"
    PODS_UNSCHEDULABLE = "PodsUnschedulable"


class SloMetReason(StrEnum):
    TARGET_MET = "TargetMet"
    TARGET_MISSED = "TargetMissed"
    NO_REQUESTS = "NoRequests"
    NO_REQUESTS_FINISHED = "NoRequestsFinished"
    METRICS_UNAVAILABLE = "MetricsUnavailable"


class MetricsAvailableReason(StrEnum):
    SERIES_PRESENT = "SeriesPresent"
    NO_POD_SERVING = "NoPodServing"
    PROMETHEUS_UNAVAILABLE = "PrometheusUnavailable"
    SERIES_MISSING = "SeriesMissing"
    QUERY_FAILED = "QueryFailed"
    SAMPLES_REJECTED = "SamplesRejected"
    SAMPLE_UNCONFIRMED = "SampleUnconfirmed"
    PARTIAL_SCRAPE = "PartialScrape"


class IdleReason(StrEnum):
    """Only for a fleet that may scale to zero (autoscaling.minReplicas 0)."""

    SERVING = "Serving"
    IDLE = "Idle"
    SCALED_TO_ZERO = "ScaledToZero"
    WAKING_UP = "WakingUp"
    NOT_MEASURED = "NotMeasured"


class PreprocessingBoundReason(StrEnum):
    """Only for an autoscaled vllm fleet: whether the time requests spend in the API server, outside the engine,
    bounds its latency."""

    API_SERVER_BOUND = "ApiServerBound"
    NOT_API_SERVER_BOUND = "NotApiServerBound"
    NOT_MEASURED = "NotMeasured"


class DemandSwingsReason(StrEnum):
    """Only for an autoscaled fleet: whether its demand swings faster than a pod starts, so that the autoscaler holds
    the fleet for the demand's recent peak instead of following it."""

    SWINGING = "Swinging"
    STEADY = "Steady"
    NOT_MEASURED = "NotMeasured"


class TracingReadyReason(StrEnum):
    COLLECTOR_FOUND = "CollectorFound"
    COLLECTOR_NOT_FOUND = "CollectorNotFound"
    COLLECTOR_NOT_READY = "CollectorNotReady"
    ENDPOINT_NOT_CHECKED = "EndpointNotChecked"
    COLLECTOR_LOOKUP_FAILED = "CollectorLookupFailed"
    NOT_CHECKED = "NotChecked"


class RoutingReadyReason(StrEnum):
    PICKER_READY = "PickerReady"
    PICKER_NOT_READY = "PickerNotReady"
    PICKER_FAILING = "PickerFailing"
    INFERENCE_POOL_CRD_MISSING = "InferencePoolCRDMissing"
    GATEWAY_API_MISSING = "GatewayAPIMissing"
    NOT_CHECKED = "NotChecked"


class EncodeReadyReason(StrEnum):
    """Only with spec.disaggregation.encode."""

    REPLICAS_READY = "EncodeReplicasReady"
    REPLICAS_NOT_READY = "EncodeReplicasNotReady"
    REPLICAS_FAILING = "EncodeReplicasFailing"
    NOT_CHECKED = "NotChecked"


class EncodeMetricsAvailableReason(StrEnum):
    """Only with spec.disaggregation.encode.autoscaling: whether the encode tier's signals could be used; it holds
    its replicas when they cannot."""

    SERIES_PRESENT = "SeriesPresent"
    NO_POD_SERVING = "NoPodServing"
    PROMETHEUS_UNAVAILABLE = "PrometheusUnavailable"
    SERIES_MISSING = "SeriesMissing"
    QUERY_FAILED = "QueryFailed"
    SAMPLES_REJECTED = "SamplesRejected"
    CALLS_FAILING = "CallsFailing"


REASONS: dict[ConditionType, type[StrEnum]] = {
    "Ready": ReadyReason,
    "Progressing": ProgressingReason,
    "Degraded": DegradedReason,
    "ScalingLimited": ScalingLimitedReason,
    "SLOMet": SloMetReason,
    "MetricsAvailable": MetricsAvailableReason,
    "Idle": IdleReason,
    "PreprocessingBound": PreprocessingBoundReason,
    "DemandSwings": DemandSwingsReason,
    "TracingReady": TracingReadyReason,
    "RoutingReady": RoutingReadyReason,
    "EncodeReady": EncodeReadyReason,
    "EncodeMetricsAvailable": EncodeMetricsAvailableReason,
}
