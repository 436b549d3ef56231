"""The lab's sub-commands of mmfleet (bench, twin): their answers, and bad flags refused naming them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.helpers.cli import run


def test_bench_autoscale_on_a_trace_needs_its_timestamp_column(tmp_path: Path) -> None:
    trace = tmp_path / "mine.csv"
    trace.write_text("t\n0\n1\n")
    result = run("bench", "autoscale", "--trace", str(trace))
    assert result.returncode == 2
    assert result.stderr.strip() == f"--time-column: required with --trace {trace} (the name of its timestamp column)"


def test_bench_tune_refuses_a_test_trace_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "tuned.json"
    result = run("bench", "tune", "--scenario", "azure-conv", "--scenario", "azure-code", "--tuned", str(out))
    assert result.returncode == 2
    assert "azure-code: test scenarios, held out from tuning" in result.stderr
    assert not out.exists()


def test_twin_profile_prints_the_capacity_as_a_spec_a_fleet_accepts() -> None:
    """The profiling run's answer goes straight into spec.autoscaling.capacityPerReplica."""
    from mmfleet.api import MultimodalInference
    from mmfleet_lab.twin import H200_QWEN25VL7B, capacity_at_slo
    from mmfleet_lab.twin.scenarios import REFERENCE_SLO, base_requests, traces_dir

    result = run("twin", "profile", "--mix", "azure-conv", "--profile", "h200", "--target", "10s")
    assert result.returncode == 0, result.stderr
    snippet = yaml.safe_load(result.stdout)
    capacity = snippet["spec"]["autoscaling"]["capacityPerReplica"]
    mix, _ = base_requests("azure-conv", traces_dir(None), np.random.default_rng(0))  # the command's mix, seed 0
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


@pytest.mark.parametrize("value", ["0.5", "nan", "inf"])
def test_bench_autoscale_refuses_a_start_smaller_than_the_warm_up_fleet(tmp_path: Path, value: str) -> None:
    docs = tmp_path / "benchmarks.md"
    result = run("bench", "autoscale", "--quick", "--start-oversized", value, "--docs", str(docs))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"--start-oversized: {value}; from 1 to 100 (times the warm-up fleet)" in result.stderr
    assert not docs.exists()


def test_an_oversized_start_multiplies_the_warm_up_fleet_and_its_maxreplicas_holds_it() -> None:
    from mmfleet_lab.bench.autoscale import H200_QWEN25VL7B, REFERENCE_SLO, cell

    usual = cell("azure-conv", 90.0, H200_QWEN25VL7B, REFERENCE_SLO)[2]
    big = cell("azure-conv", 90.0, H200_QWEN25VL7B, REFERENCE_SLO, oversize=2.5)[2]
    assert big["initial_replicas"] == -(-usual["initial_replicas"] * 5 // 2)
    assert big["max_replicas"] >= big["initial_replicas"]


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


def test_bench_autoscale_runs_mix_shift_cells_apart_from_the_others() -> None:
    result = run("bench", "autoscale", "--scenario", "outputs-x2", "--scenario", "azure-conv", "--no-oracle")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "--scenario: outputs-x2 change the request mix and are written to a section of their own; run them apart "
        "from azure-conv"
    )
