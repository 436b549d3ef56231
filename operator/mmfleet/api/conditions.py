"""The conditions of a MultimodalInference's status."""

from __future__ import annotations

from typing import Literal, get_args

ConditionType = Literal[
    "Ready", "Progressing", "Degraded", "ScalingLimited", "SLOMet", "MetricsAvailable", "TracingReady"
]
CONDITION_TYPES: tuple[ConditionType, ...] = get_args(ConditionType)
