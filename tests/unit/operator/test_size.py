"""Issue 23, item 2: a spec the CRD accepts never renders a child too large to store, and never loops trying.

A 310 KB spec became a 1.24 MB pod (one per replica, up to 1,000) and an apply the API server refused for its size,
retried for ever. Now every field is bounded (tests/contract/test_crd_bounds.py) and a child over
``render.CHILD_BYTES_MAX`` is a spec problem, named by the spec's largest field, before anything is applied.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from mmfleet import render
from mmfleet.api import MultimodalInference
from mmfleet.render import CHILD_BYTES_MAX, SpecError
from mmfleet.validation import parse
from mmfleet_lab.fuzz import PROBLEM
from tests.helpers.cli import run
from tests.helpers.large import label_map, largest_affinity


def resource(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "mmfleet.io/v1alpha1",
        "kind": "MultimodalInference",
        "metadata": {"name": "big", "namespace": "ml"},
        "spec": {"model": {"name": "Qwen/Qwen2.5-VL-7B-Instruct"}, **spec},
    }


def problems_of(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as raised:
        parse(doc)
    return raised.value.problems


@pytest.mark.parametrize("cloud", ["auto", "generic", "eks"])
def test_a_spec_whose_deployment_would_exceed_the_limit_is_refused_naming_its_largest_field(cloud: str) -> None:
    problems = problems_of(resource(cloud=cloud, placement={"affinity": largest_affinity()}))
    assert len(problems) == 1 and PROBLEM.match(problems[0]), problems
    assert problems[0].startswith("spec.placement.affinity: its ")
    assert "make the Deployment big " in problems[0]
    assert f"over the {CHILD_BYTES_MAX:,} (256 KiB)" in problems[0]
    assert problems[0].endswith("shorten spec.placement.affinity")


def test_render_refuses_it_too_so_nothing_is_applied() -> None:
    inference = MultimodalInference.model_validate(resource(placement={"affinity": largest_affinity()}))
    with pytest.raises(SpecError, match=r"^spec\.placement\.affinity: its "):
        render.render(inference, "generic")


def test_a_large_spec_within_the_limit_still_renders_every_child_below_it() -> None:
    affinity = largest_affinity()
    del affinity["podAffinity"], affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    doc = resource(cloud="eks", placement={"affinity": affinity, "nodeSelector": label_map()})
    children = render.render(parse(doc), "eks", monitoring_crds=True)
    sizes = [len(json.dumps(c, separators=(",", ":"))) for c in children]
    assert CHILD_BYTES_MAX // 4 < max(sizes) <= CHILD_BYTES_MAX


def test_mmfleet_render_refuses_it_with_the_same_message(tmp_path: Path) -> None:
    doc = resource(placement={"affinity": largest_affinity()})
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = run("render", "-f", str(path))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == f"{path}: {problems_of(doc)[0]}"


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"placement": {"nodeSelector": label_map(17)}}, "spec.placement.nodeSelector"),
        ({"resources": {"cpu": "1" * 65}}, "spec.resources.cpu"),
        ({"modelCache": {"size": "1" * 65}}, "spec.modelCache.size"),
        ({"networkPolicy": {"ingressFrom": [{"podSelector": {}}] * 9}}, "spec.networkPolicy.ingressFrom"),
    ],
)
def test_the_models_refuse_what_the_crd_bounds_naming_the_field(spec: dict[str, Any], field: str) -> None:
    problems = problems_of(resource(**spec))
    assert problems and problems[0].startswith(f"{field}: "), problems
