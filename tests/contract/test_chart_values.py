"""values.schema.json is generated from mmfleet.chart_values; values.yaml and the templates agree with it."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from mmfleet.chart_values import ChartValues, values_schema_json
from tests.helpers.repo import ROOT

CHART = ROOT / "charts" / "mmfleet"


def test_committed_schema_is_the_generators_output() -> None:
    committed = (CHART / "values.schema.json").read_text()
    assert committed == values_schema_json(), "run `make crds` to regenerate charts/mmfleet/values.schema.json"


def test_values_yaml_holds_exactly_the_models_defaults() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert ChartValues.model_validate(values).wire() == values
    assert ChartValues().wire() == values


def _schema_paths(node: dict[str, Any], defs: dict[str, Any], prefix: str = "") -> set[str]:
    if "$ref" in node:
        node = defs[node["$ref"].removeprefix("#/$defs/")]
    paths = set()
    for key, child in node.get("properties", {}).items():
        path = f"{prefix}{key}"
        paths.add(path)
        paths |= _schema_paths(child, defs, f"{path}.")
    return paths


def test_every_value_a_template_reads_is_in_the_schema() -> None:
    schema = json.loads(values_schema_json())
    known = _schema_paths(schema, schema["$defs"])
    used = {
        match
        for template in (CHART / "templates").iterdir()
        for match in re.findall(r"\.Values\.([A-Za-z0-9_.]+[A-Za-z0-9_])", template.read_text())
    }
    assert used, "no .Values references found: the pattern is wrong"
    assert used - known == set()


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"defaultCloud": "gcp"}, "defaultCloud"),
        ({"autoscaleInterval": "-5s"}, "autoscaleInterval"),
        ({"autoscaleInterval": "500ms"}, "autoscaleInterval"),  # below the operator's 1s
        ({"defaultColdStart": "2 minutes"}, "defaultColdStart"),
        ({"workers": 0}, "workers"),
        ({"collector": {"awsRegion": "US West"}}, "collector.awsRegion"),
        ({"monitoring": {"dashboards": {"enabeld": True}}}, "monitoring.dashboards.enabeld"),
    ],
)
def test_model_refuses_a_wrong_value_naming_the_field(values: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as refused:
        ChartValues.model_validate(values)
    assert [".".join(map(str, e["loc"])) for e in refused.value.errors()] == [field]
