"""Generate the CustomResourceDefinition from the pydantic models.

Pydantic emits JSON Schema 2020-12; the API server wants a structural OpenAPI v3 schema.
The rewrites here are the ones kube-custom-resource makes (inline ``$defs``, ``nullable``
instead of ``anyOf: [X, null]``, no titles, no defaults, int-or-string quantities), so that
defaults stay in the models and what the user wrote is what the API server stores.
"""

from __future__ import annotations

from typing import Any

import yaml

from mmfleet import api

JsonSchema = dict[str, Any]

_DROP_KEYS = {"title", "default", "x-mmfleet-duration"}


def _resolve(node: Any, defs: dict[str, JsonSchema]) -> Any:
    if isinstance(node, list):
        return [_resolve(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = dict(defs[node["$ref"].removeprefix("#/$defs/")])
        # A field's own description wins over the referenced model's docstring.
        target.update({k: v for k, v in node.items() if k != "$ref"})
        return _resolve(target, defs)
    return {key: _resolve(value, defs) for key, value in node.items()}


def _structural(node: Any) -> Any:
    if isinstance(node, list):
        return [_structural(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {k: v for k, v in node.items() if k not in _DROP_KEYS}
    if node.pop("x-mmfleet-quantity", False):
        node.pop("type", None)
        nullable = any(branch.get("type") == "null" for branch in node.get("anyOf", []))
        # The one anyOf a structural schema allows; the pattern (top level) applies to strings only.
        node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        node["pattern"] = api.QUANTITY_PATTERN
        node["x-kubernetes-int-or-string"] = True
        if nullable:
            node["nullable"] = True
        return node
    if "anyOf" in node:
        branches = [b for b in node["anyOf"] if b.get("type") != "null"]
        if len(branches) < len(node["anyOf"]):
            node.pop("anyOf")
            if len(branches) == 1:
                inner = dict(branches[0])
                inner.update(node)
                node = inner
            else:
                node["anyOf"] = branches
            node["nullable"] = True
            return _structural(node)
    for bound, flag in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(bound), (int, float)) and not isinstance(node.get(bound), bool):
            node[flag] = node.pop(bound)
            node[bound] = True
    if node.get("x-kubernetes-preserve-unknown-fields"):
        node.pop("additionalProperties", None)
        node["type"] = "object"
    if node.get("type") == "object" and "properties" in node:
        node.pop("additionalProperties", None)
    return {key: _structural(value) for key, value in node.items()}


def openapi_schema(model: type[api.Model]) -> JsonSchema:
    """The structural OpenAPI v3 schema of one model, every $ref inlined."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return dict(_structural(_resolve(raw, defs)))


def _printer_columns() -> list[JsonSchema]:
    return [
        {"name": "Backend", "type": "string", "jsonPath": ".status.backend"},
        {"name": "Model", "type": "string", "jsonPath": ".spec.model.name"},
        {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas"},
        {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
        {"name": "P90", "type": "string", "jsonPath": ".status.slo.observed"},
        {"name": "SLO", "type": "string", "jsonPath": ".status.slo.target"},
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "priority": 1},
        {"name": "Picker", "type": "boolean", "jsonPath": ".status.routing.pickerReady", "priority": 1},
        {"name": "Encoders", "type": "integer", "jsonPath": ".status.encode.readyReplicas", "priority": 1},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]


def build_crd() -> JsonSchema:
    """The whole CRD object, as committed in crds/."""
    spec = openapi_schema(api.MultimodalInferenceSpec)
    status = openapi_schema(api.MultimodalInferenceStatus)
    root = {
        "type": "object",
        "description": "A fleet of GPU inference servers for one multimodal model, scaled on a latency SLO.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "mmfleet.io/v1alpha1"},
            "kind": {"type": "string", "description": "MultimodalInference"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
        "x-kubernetes-validations": [
            api.cel(
                "self.metadata.name.matches('" + api.NAME_PATTERN + "') && self.metadata.name.size() <= 63",
                "metadata.name must be a DNS-1035 label (lowercase letters, digits, '-'; "
                "starts with a letter; at most 63 characters)",
            )
        ],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{api.PLURAL}.{api.GROUP}"},
        "spec": {
            "group": api.GROUP,
            "names": {
                "kind": api.KIND,
                "listKind": f"{api.KIND}List",
                "plural": api.PLURAL,
                "singular": api.SINGULAR,
                "shortNames": list(api.SHORT_NAMES),
                "categories": ["mmfleet", "all"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": _printer_columns(),
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = "# Generated by `mmfleet crd` from mmfleet.api. Do not edit by hand.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=120)
