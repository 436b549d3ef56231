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


def test_bench_autoscale_on_a_trace_needs_its_timestamp_column(tmp_path: Path) -> None:
    trace = tmp_path / "mine.csv"
    trace.write_text("t\n0\n1\n")
    result = run("bench", "autoscale", "--trace", str(trace))
    assert result.returncode == 2
    assert result.stdout.strip() == f"--time-column: required with --trace {trace} (the name of its timestamp column)"


def test_bench_tune_refuses_a_test_trace_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "tuned.json"
    result = run("bench", "tune", "--scenario", "azure-conv", "--scenario", "azure-code", "--tuned", str(out))
    assert result.returncode == 2
    assert "azure-code: test scenarios, held out from tuning" in result.stderr
    assert not out.exists()


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
    assert result.stderr.strip() == "mmfleet bench: Not available here: the lab needs numpy: pip install 'mmfleet[lab]'"
    assert "{render,run,crd,docs,collector-config}" in run("--help", without=("numpy",)).stdout


def test_twin_profile_prints_the_capacity_as_a_spec_a_fleet_accepts() -> None:
    """The profiling run's answer goes straight into spec.autoscaling.capacityPerReplica."""
    from mmfleet.api import MultimodalInference
    from mmfleet_lab.twin import H200_QWEN25VL7B, capacity_at_slo
    from mmfleet_lab.twin.scenarios import REFERENCE_SLO, scenario

    result = run("twin", "profile", "--mix", "azure-conv", "--profile", "h200", "--target", "10s")
    assert result.returncode == 0, result.stderr
    snippet = yaml.safe_load(result.stdout)
    capacity = snippet["spec"]["autoscaling"]["capacityPerReplica"]
    mix = scenario("azure-conv", params=H200_QWEN25VL7B, reference_slo=REFERENCE_SLO).requests
    assert capacity == pytest.approx(capacity_at_slo(H200_QWEN25VL7B, mix, REFERENCE_SLO), rel=0.01)
    spec = {"model": {"name": "Qwen/Qwen2.5-VL-7B-Instruct"},
            "autoscaling": {"slo": {"target": "10s"}, **snippet["spec"]["autoscaling"]}}  # fmt: skip
    doc = {"apiVersion": "mmfleet.io/v1alpha1", "kind": "MultimodalInference", "metadata": {"name": "p"}, "spec": spec}
    assert MultimodalInference.model_validate(doc).spec.autoscaling
    impossible = run("twin", "profile", "--target", "0.01s")
    assert impossible.returncode == 2
    assert "--target 0.01s: no steady rate meets" in impossible.stderr and "Traceback" not in impossible.stderr


def test_bench_autoscale_refuses_an_unknown_policy_naming_those_it_has(tmp_path: Path) -> None:
    docs = tmp_path / "benchmarks.md"
    result = run("bench", "autoscale", "--quick", "--policy", "mmfleet", "--policy", "hpa2", "--docs", str(docs))
    assert result.returncode == 2
    assert "--policy: hpa2 is not a policy; accepted: mmfleet, mmfleet-profiled, static, hpa" in result.stderr
    assert not docs.exists()


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--scenario", "azure-cod"], "--scenario: azure-cod is not a scenario; accepted: azure-conv"),
        (["--cold-start", "45.5"], "--cold-start: 45.5: the oracle plans in whole seconds"),
        (["--workers", "0"], "--workers: 0; at least 1"),
    ],
)
def test_bench_reachable_refuses_a_bad_flag_naming_it(tmp_path: Path, flags: list[str], said: str) -> None:
    result = run("bench", "reachable", *flags, "--docs", str(tmp_path / "b.md"))
    assert result.returncode == 2 and said in result.stderr and "Traceback" not in result.stderr
