"""The committed CRD, chart CRD and API docs equal what the models generate, and the schema is structural."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate

from mmfleet import apidocs, crd
from tests.helpers.repo import K8S_VERSION

CRD_FILE = "crds/multimodalinferences.mmfleet.io.yaml"


def schema() -> dict[str, Any]:
    root: dict[str, Any] = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return root


def walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every schema node with its path."""
    out: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        out.append((path, node))
        for name, child in node.get("properties", {}).items():
            out += walk(child, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            out += walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            out += walk(node["additionalProperties"], f"{path}{{}}")
    return out


def test_committed_crd_equals_generated(root: Path) -> None:
    committed = (root / CRD_FILE).read_text()
    assert committed == crd.crd_yaml(), "crds/ is stale: run `make crds`"


def test_chart_crd_equals_committed(root: Path) -> None:
    assert (root / "charts/mmfleet/crds/multimodalinferences.mmfleet.io.yaml").read_text() == (
        root / CRD_FILE
    ).read_text(), "charts/mmfleet/crds is stale: run `make crds`"


def test_api_docs_equal_generated(root: Path) -> None:
    assert (root / "docs/api.md").read_text() == apidocs.api_markdown(), "docs/api.md is stale: run `make crds`"


def test_api_docs_give_every_bound_the_api_server_enforces() -> None:
    """README: docs/api.md has every field's bounds; list and map limits too, not only numbers and strings."""
    rows = {line.split(" | ")[0].strip("| `"): line for line in apidocs.api_markdown().splitlines()}
    assert "≤ 32 items" in rows["spec.placement.tolerations"]
    assert "≤ 16 entries" in rows["spec.placement.nodeSelector"]
    assert "≤ 64 items, each ≤ 1024 chars" in rows["spec.backend.extraArgs"]


def test_crd_object_validates_against_apiextensions_schema() -> None:
    kubernetes_validate.validate(crd.build_crd(), K8S_VERSION, strict=True)


def test_schema_is_structural() -> None:
    for path, node in walk(schema()):
        for key in ("$ref", "$defs", "title", "default", "allOf", "oneOf"):
            assert key not in node, f"{path} has {key}"
        if "anyOf" in node:
            assert node.get("x-kubernetes-int-or-string"), f"{path} has anyOf without int-or-string"
        if path.count(".") >= 1 and not path.endswith("metadata") and not node.get("x-kubernetes-int-or-string"):
            assert "type" in node, f"{path} has no type"
        if node.get("type") == "object" and not node.get("x-kubernetes-preserve-unknown-fields"):
            assert "properties" in node or "additionalProperties" in node or path in ("", ".metadata"), path


def test_every_spec_and_status_field_is_described() -> None:
    for path, node in walk(schema()):
        if path.startswith((".spec", ".status")) and not path.endswith(("{}", "[]")):
            assert node.get("description"), f"{path} has no description (kubectl explain would be empty)"


def test_quantities_are_int_or_string_and_durations_have_a_pattern() -> None:
    nodes = dict(walk(schema()))
    assert nodes[".spec.modelCache.size"].get("x-kubernetes-int-or-string") is True
    assert nodes[".spec.resources.memory"].get("x-kubernetes-int-or-string") is True
    assert "pattern" in nodes[".spec.autoscaling.slo.target"]
    assert nodes[".spec.autoscaling.slo.target"]["type"] == "string"


def test_no_keyword_the_api_server_would_drop() -> None:
    """kube-apiserver keeps only OpenAPI v3 keywords; a dropped one (const, propertyNames) would check nothing."""
    dropped = {"const", "propertyNames", "$ref", "$defs", "prefixItems"}
    found = [(path, key) for path, node in walk(schema()) for key in node if key in dropped]
    assert found == []


def test_no_field_is_free_form() -> None:
    """Every field is typed, so no spec nests deeper than the models, and the API server checks all of it."""
    free = [path for path, node in walk(schema()) if node.get("x-kubernetes-preserve-unknown-fields")]
    assert free == []


def test_cross_field_rules_are_cel() -> None:
    rules = [rule for _, node in walk(schema()) for rule in node.get("x-kubernetes-validations", [])]
    messages = " ".join(rule["message"] for rule in rules)
    for needle in ("minReplicas", "gpu.count", "multimodal", "processorCache", "Hopper", "kvCacheDtype", "claimName"):
        assert needle in messages


def test_subresources_and_columns() -> None:
    version = crd.build_crd()["spec"]["versions"][0]
    assert version["subresources"]["status"] == {}
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    for column in ("Backend", "Model", "Replicas", "Ready", "P90", "SLO", "Age"):
        assert column in names
    assert crd.build_crd()["spec"]["names"]["shortNames"] == ["mmi"]
