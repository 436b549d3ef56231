"""The base of every model of the API."""

from __future__ import annotations

from typing import Any

from pydantic import AliasGenerator, BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class Model(BaseModel):
    """Base: camelCase on the wire, snake_case in Python, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=AliasGenerator(alias=to_camel),
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )

    def wire(self) -> dict[str, Any]:
        """The object as it stands in YAML: camelCase, unset fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")
