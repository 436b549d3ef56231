"""The command line: render prints manifests; bad input exits 2 with one line per problem, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.cli import run
from tests.helpers.operator_process import LAB_MODULES
from tests.helpers.repo import EXAMPLES, load_example


def test_render_prints_children_of_an_example() -> None:
    result = run("render", "-f", str(EXAMPLES[0]), "--cloud", "eks")
    assert result.returncode == 0, result.stderr
    kinds = [doc["kind"] for doc in yaml.safe_load_all(result.stdout)]
    assert "Deployment" in kinds
    assert "Service" in kinds


def test_invalid_spec_exits_2_with_field_paths(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: mmfleet.io/v1alpha1\nkind: MultimodalInference\nmetadata: {name: x}\n"
        "spec:\n  model: {name: m}\n  gpu: {count: 2}\n  parallelism: {tensor: 3}\n"
    )
    result = run("render", "-f", str(bad))
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"{bad}: spec.parallelism.tensor: 3 does not divide spec.gpu.count: 2"
    ]
    assert "Traceback" not in result.stderr


def test_every_problem_in_a_file_is_listed(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: mmfleet.io/v1alpha1\nkind: MultimodalInference\nmetadata: {name: x}\n"
        "spec:\n  model: {name: m}\n  backend: {name: sglang, maxNumSeqs: 0}\n"
    )
    lines = run("render", "-f", str(bad)).stderr.strip().splitlines()
    assert len(lines) == 2
    assert any("spec.backend.name: 'sglang'" in line for line in lines)
    assert any("spec.backend.maxNumSeqs: 0" in line for line in lines)


def test_not_yaml_and_missing_file_are_one_line_each(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec: [unclosed\n")
    result = run("render", "-f", str(broken))
    assert result.returncode == 2
    assert "not valid YAML" in result.stderr
    missing = run("render", "-f", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2
    assert "No such file" in missing.stderr
    assert "Traceback" not in broken.read_text() + result.stderr + missing.stderr


def test_render_sends_spans_where_the_operators_collector_setting_says() -> None:
    doc = load_example(EXAMPLES[0])
    doc["spec"]["tracing"] = {"enabled": True}
    text = yaml.safe_dump(doc)
    result = run("render", "-f", "-", "--collector-endpoint", "http://otel.observability.svc:4317", stdin=text)
    assert result.returncode == 0, result.stderr
    assert "http://otel.observability.svc:4317" in result.stdout
    bad = run("render", "-f", "-", "--collector-endpoint", "not an endpoint", stdin=text)
    assert bad.returncode == 2
    assert "--collector-endpoint: 'not an endpoint': not an OTLP/gRPC endpoint" in bad.stderr


def test_render_reads_stdin() -> None:
    result = run("render", "-f", "-", stdin=EXAMPLES[0].read_text())
    assert result.returncode == 0, result.stderr


def test_crd_command_prints_the_crd() -> None:
    result = run("crd")
    assert result.returncode == 0
    assert yaml.safe_load(result.stdout)["metadata"]["name"] == "multimodalinferences.mmfleet.io"


@pytest.mark.parametrize("args", [("render", "-f", "examples/minimal.yaml"), ("crd",), ("docs", "api")])
def test_operator_commands_work_without_the_lab_and_its_dependencies(args: tuple[str, ...]) -> None:
    """As `pip install .` (no extra) leaves it: the output is the same as with the lab installed."""
    without = run(*args, without=LAB_MODULES)
    assert (without.returncode, without.stderr) == (0, ""), without.stderr
    assert without.stdout == run(*args).stdout


def test_help_without_the_lab_lists_the_operator_commands_only() -> None:
    result = run("--help", without=LAB_MODULES)
    assert result.returncode == 0, result.stderr
    assert "{render,run,crd,docs,collector-config}" in result.stdout


def test_the_handlers_import_without_the_lab_and_its_dependencies() -> None:
    code = f"import sys; sys.modules.update(dict.fromkeys({list(LAB_MODULES)!r})); import mmfleet.handlers"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_a_lab_command_without_the_lab_dependencies_says_what_to_install() -> None:
    """`pip install .` puts the lab's code on disk without its dependencies: say so, no traceback."""
    result = run("bench", "autoscale", without=("numpy",))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "mmfleet bench: Not available here: the lab needs numpy: from a checkout, pip install -e '.[lab]' -e ./lab "
        "(make install does)"
    )
    assert "{render,run,crd,docs,collector-config}" in run("--help", without=("numpy",)).stdout
