"""Issue 23, item 2: the CRD bounds every string, list and map, so that the largest spec it accepts fits in etcd.

Without these, the API server accepted a 310 KB spec (and would a larger one up to its 3 MiB request limit); each
field now names its own bound in the API server's refusal.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from mmfleet.api.patterns import LABEL_KEY_MAX
from mmfleet.crd import build_crd

# etcd's default --max-request-bytes is 1.5 MiB for the whole object: the spec's worst case leaves a third of it to
# metadata (annotations alone may take 256 KiB), the status and managedFields.
SPEC_BYTES_MAX = 1024 * 1024


def _root() -> dict[str, Any]:
    schema: dict[str, Any] = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _unbounded(node: dict[str, Any], path: str) -> Iterator[str]:
    kind = node.get("type")
    if (kind == "string" or node.get("x-kubernetes-int-or-string")) and "maxLength" not in node and "enum" not in node:
        yield f"{path}: no maxLength"
    if kind == "array":
        if "maxItems" not in node:
            yield f"{path}: no maxItems"
        yield from _unbounded(node["items"], f"{path}[]")
    for key, child in node.get("properties", {}).items():
        yield from _unbounded(child, f"{path}.{key}")
    if isinstance(node.get("additionalProperties"), dict):
        if "maxProperties" not in node:
            yield f"{path}: no maxProperties"
        if not any(f"k.size() <= {LABEL_KEY_MAX}" in rule["rule"] for rule in node.get("x-kubernetes-validations", [])):
            yield f"{path}: keys of any length"
        yield from _unbounded(node["additionalProperties"], f"{path}{{}}")


def _largest(node: dict[str, Any]) -> int:
    """The most bytes of JSON a value of this schema can take (every list full, every string at its maxLength)."""
    kind = node.get("type")
    if "enum" in node:
        return max(len(str(value)) for value in node["enum"]) + 2
    if kind == "string" or node.get("x-kubernetes-int-or-string"):
        return int(node["maxLength"]) + 2
    if kind in ("integer", "number", "boolean"):
        return 24
    if kind == "array":
        return int(node["maxItems"]) * (_largest(node["items"]) + 1) + 2
    if isinstance(node.get("additionalProperties"), dict):
        return int(node["maxProperties"]) * (LABEL_KEY_MAX + 4 + _largest(node["additionalProperties"])) + 2
    return sum(len(key) + 4 + _largest(child) for key, child in node.get("properties", {}).items()) + 2


def test_every_string_list_and_map_of_spec_and_status_is_bounded() -> None:
    root = _root()["properties"]
    found = [*_unbounded(root["spec"], "spec"), *_unbounded(root["status"], "status")]
    assert found == []


def test_the_largest_spec_the_crd_accepts_fits_in_one_etcd_request_with_room_to_spare() -> None:
    assert _largest(_root()["properties"]["spec"]) <= SPEC_BYTES_MAX
