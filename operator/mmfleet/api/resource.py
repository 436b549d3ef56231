"""The whole MultimodalInference resource: its group, version and names, and the object as read."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, ValidatorFunctionWrapHandler, field_validator

from mmfleet.api.base import Model
from mmfleet.api.patterns import NAME_PATTERN
from mmfleet.api.spec import MultimodalInferenceSpec
from mmfleet.api.status import MultimodalInferenceStatus

GROUP = "mmfleet.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "MultimodalInference"
PLURAL = "multimodalinferences"
SINGULAR = "multimodalinference"
SHORT_NAMES = ["mmi"]


class ObjectMeta(Model):
    """The metadata fields rendering reads.

    Only fields that change with the generation or never: the operator caches what it parses and
    renders by uid and generation, and labels or annotations change without a new generation.
    """

    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1, max_length=63, pattern=NAME_PATTERN)
    namespace: str = Field(default="default")
    uid: str | None = None
    generation: int | None = None


class MultimodalInference(Model):
    """The whole resource as read from YAML or the API server."""

    model_config = ConfigDict(extra="ignore")

    api_version: Literal["mmfleet.io/v1alpha1"] = "mmfleet.io/v1alpha1"
    kind: Literal["MultimodalInference"] = "MultimodalInference"
    metadata: ObjectMeta
    spec: MultimodalInferenceSpec
    status: MultimodalInferenceStatus | None = None

    @field_validator("status", mode="wrap")
    @classmethod
    def _any_status(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> MultimodalInferenceStatus | None:
        """A status this version cannot read (another version wrote it) is no reason to refuse the spec."""
        try:
            status: MultimodalInferenceStatus | None = handler(value)
        except ValidationError:
            return None
        return status

    @property
    def served_name(self) -> str:
        return self.spec.model.served_name or self.metadata.name
