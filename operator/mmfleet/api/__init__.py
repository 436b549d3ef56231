"""The MultimodalInference API (mmfleet.io/v1alpha1): the single source of truth.

The CRD schema is generated from these models (``mmfleet.crd``), so every field carries a
description, bounds and enums here. Defaults live in the models, not in the schema, so a
spec read back from the API server stays exactly what the user (or Argo CD) wrote.
Importers take every name from here, not from the modules, which are split by concern only.
"""

from mmfleet.api.base import Model
from mmfleet.api.conditions import (
    CONDITION_TYPES,
    ConditionType,
)
from mmfleet.api.patterns import (
    DNS_SUBDOMAIN_PATTERN,
    DURATION_PATTERN,
    NAME_PATTERN,
    QUANTITY_PATTERN,
    SPEC_DURATION_PATTERN,
    Quantity,
    cel,
    duration_text,
    seconds,
)
from mmfleet.api.resource import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    MultimodalInference,
    ObjectMeta,
)
from mmfleet.api.scheduling import Affinity, Toleration
from mmfleet.api.spec import (
    CLOUD_NAMES,
    PROFILE_NAMES,
    Attention,
    AutoscalingSpec,
    BackendName,
    CloudName,
    GpuSpec,
    GpuType,
    IdentitySpec,
    ModelSpec,
    MultimodalInferenceSpec,
    NetworkPeer,
    ProfileName,
    SloMetric,
    SloSpec,
    clamp_replicas,
)
from mmfleet.api.status import (
    CONDITION_MESSAGE_MAX,
    SCALE_REASON_MAX,
    TRUNCATED,
    Condition,
    MultimodalInferenceStatus,
    Phase,
    SloStatus,
)

__all__ = [
    "API_VERSION",
    "CLOUD_NAMES",
    "CONDITION_MESSAGE_MAX",
    "CONDITION_TYPES",
    "DNS_SUBDOMAIN_PATTERN",
    "DURATION_PATTERN",
    "GROUP",
    "KIND",
    "NAME_PATTERN",
    "PLURAL",
    "PROFILE_NAMES",
    "QUANTITY_PATTERN",
    "SCALE_REASON_MAX",
    "SHORT_NAMES",
    "SINGULAR",
    "SPEC_DURATION_PATTERN",
    "TRUNCATED",
    "VERSION",
    "Affinity",
    "Attention",
    "AutoscalingSpec",
    "BackendName",
    "CloudName",
    "Condition",
    "ConditionType",
    "GpuSpec",
    "GpuType",
    "IdentitySpec",
    "Model",
    "ModelSpec",
    "MultimodalInference",
    "MultimodalInferenceSpec",
    "MultimodalInferenceStatus",
    "NetworkPeer",
    "ObjectMeta",
    "Phase",
    "ProfileName",
    "Quantity",
    "SloMetric",
    "SloSpec",
    "SloStatus",
    "Toleration",
    "cel",
    "clamp_replicas",
    "duration_text",
    "seconds",
]
