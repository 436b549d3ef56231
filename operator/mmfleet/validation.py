"""Turn any input into a MultimodalInference or into one line per problem.

Each line names the field path, the value and what would be accepted, because that is what
a person fixing a YAML file needs; the CLI and the operator's conditions print the same lines.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ValidationError

from mmfleet import admin_policy, render
from mmfleet.admin_policy import AdminPolicy
from mmfleet.api import MultimodalInference
from mmfleet.render import SpecError

# Messages from our own validators start with the field path relative to where they are raised.
_RELATIVE_PATH = re.compile(r"^([A-Za-z][A-Za-z0-9]*(?:\.[A-Za-z][A-Za-z0-9]*|\[\d+\])*): ")


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _model_at(loc: tuple[int | str, ...], root: type[BaseModel]) -> type[BaseModel] | None:
    """The pydantic model that owns the last element of loc, to list the accepted fields."""
    model: Any = root
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        fields = {f.alias or name: f for name, f in model.model_fields.items()}
        if part not in fields:
            return None
        annotation = fields[part].annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        nested = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
        if not nested:
            return None
        model = nested[0]
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def describe(error: ValidationError, root: type[BaseModel] = MultimodalInference) -> list[str]:
    """One line per problem of ``error``, raised validating ``root``."""
    lines = []
    for item in error.errors(include_url=False):
        loc = tuple(item["loc"])
        message = str(item["msg"]).removeprefix("Value error, ")
        relative = _RELATIVE_PATH.match(message)
        if item["type"] in ("value_error", "assertion_error") and relative:
            prefix = _path(loc)
            lines.append(f"{prefix}.{message}" if prefix else message)
            continue
        where = _path(loc) or "(document)"
        if item["type"] == "extra_forbidden":
            owner = _model_at(loc, root)
            accepted = ", ".join(f.alias or n for n, f in owner.model_fields.items()) if owner else ""
            lines.append(f"{where}: unknown field" + (f" (accepted: {accepted})" if accepted else ""))
        elif item["type"] == "missing":
            lines.append(f"{where}: required field is missing")
        else:
            lines.append(f"{where}: {item['input']!r} is not accepted: {message[0].lower()}{message[1:]}")
    return lines


class PolicyDeniedError(SpecError):
    """A spec that could be served, but names what the admin's policy does not allow."""


# Never served, whatever the operator watches: cluster-wide, its rights to write Deployments, ServiceAccounts and
# ConfigMaps reach these namespaces too, and no RBAC rule can take them out of a ClusterRole.
SYSTEM_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease")


def refuse_system_namespace(namespace: str) -> None:
    """Raise ``PolicyDeniedError`` for a fleet in one of ``SYSTEM_NAMESPACES``, before anything of it is read."""
    if namespace in SYSTEM_NAMESPACES:
        raise PolicyDeniedError([
            f"metadata.namespace: {namespace!r} is not served: the operator never acts in "
            f"{', '.join(SYSTEM_NAMESPACES)}; create the fleet in another namespace"
        ])  # fmt: skip


def parse(document: Any, policy: AdminPolicy | None = None) -> MultimodalInference:
    """Validate a whole resource (as loaded from YAML or read from the API server), and hold it to ``policy``."""
    if not isinstance(document, dict):
        raise SpecError([f"(document): expected a MultimodalInference mapping, got {type(document).__name__}"])
    try:
        inference = MultimodalInference.model_validate(document, strict=True)
    except ValidationError as error:
        raise SpecError(describe(error)) from None
    found = render.problems(inference)
    if found:
        raise SpecError(found)
    denied = admin_policy.refusals(inference, policy) if policy is not None else []
    if denied:
        raise PolicyDeniedError(denied)
    return inference
