"""The held-out protocol's harness: the split is enforced, baselines must act, the sweep picks by its rule,
seeds are summarised with their spread."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from mmfleet_lab.bench import autoscale, traces, tune
from mmfleet_lab.bench.baselines import FAMILIES
from mmfleet_lab.bench.traces import HeldOutError
from mmfleet_lab.bench.tune import Trial, pick
from mmfleet_lab.twin import Shipped, scenario
from mmfleet_lab.twin.scenarios import BASES, changes_mix, most_variable_hour, parse


def test_every_base_trace_has_a_role_and_a_spike_takes_its_bases() -> None:
    assert set(traces.ROLES) == {*BASES, "trace"}
    assert traces.role("azure-conv") == traces.role("spike-x4") == traces.role("bursts") == "train"
    assert traces.role("spike-x4@servegen-mm") == "validation"
    assert traces.role("azure-code") == traces.role("flash-x8@azure-code") == traces.role("bursts@azure-code") == "test"
    assert all(traces.role(n) == "test" for n in traces.TEST)
    assert {traces.role(n) for n in traces.TRAIN} == {"train"}
    with pytest.raises(ValueError, match="unknown scenario"):
        traces.role("spike-x3")


def test_tuning_refuses_a_test_trace_before_running_anything(tmp_path: Path) -> None:
    assert traces.tuning_scenarios(["azure-conv", "servegen-mm"]) == ("azure-conv", "servegen-mm")
    with pytest.raises(HeldOutError, match="spike-x4@azure-code"):
        traces.tuning_scenarios(["azure-conv", "spike-x4@azure-code"])
    out = tmp_path / "tuned.json"
    with pytest.raises(HeldOutError, match="azure-code"):
        tune.tune(["hpa"], ["azure-code"], [0], lambda _: None, "test", path=out)
    assert not out.exists()
    with pytest.raises(HeldOutError, match="gentd-diffusion"):
        tune.score(Shipped(), ["gentd-diffusion"])


def trial(
    gpu_hours: float, attainment: float, worst: float | None = None, name: str = "x", actions: float = 4.0
) -> Trial:
    return Trial("hpa", {"name": name}, attainment, attainment if worst is None else worst, gpu_hours, 0.0, actions)


def test_the_pick_is_the_cheapest_that_meets_99_percent_on_every_run_else_the_best_attainment() -> None:
    cheap_miss = trial(10.0, 0.98, name="cheap")
    mid = trial(20.0, 0.995, name="mid")
    dear = trial(30.0, 1.0, name="dear")
    mean_only = trial(15.0, 0.995, worst=0.97, name="mean-only")  # meets on average, not on every run
    inert = trial(5.0, 1.0, name="inert", actions=0.0)  # never scaled in one run: never picked
    assert pick([cheap_miss, dear, mid, mean_only, inert]).setting == {"name": "mid"}
    with pytest.raises(ValueError, match="no setting scaled"):
        pick([inert])
    worse, better = trial(5.0, 0.90, name="worse"), trial(50.0, 0.95, name="better")
    assert pick([worse, better]).setting == {"name": "better"}


def row(policy: str, actions: float, scenario: str = "s", seed: int = 0) -> autoscale.Row:
    nan = math.nan
    return autoscale.Row(scenario, 90.0, policy, 1.0, nan, 0.0, 1.0, nan, actions, 0.0, nan, nan, 0.0, 0.0, "", seed)


def test_a_baseline_with_zero_actions_on_a_varying_trace_is_marked_failed() -> None:
    varying, flat = np.array([18, 20, 44, 21]), np.array([20, 20, 20])
    assert "keda never scaled on s (L=90s, seed 0) although the need varies from 18 to 44" in autoscale.inert(
        row("keda", 0.0), varying
    )
    assert autoscale.inert(row("keda", 3.0), varying) == ""
    assert autoscale.inert(row("keda", 0.0), flat) == ""
    assert autoscale.inert(row("static", 0.0), varying) == ""


def test_seeds_are_summarised_as_mean_and_range() -> None:
    rows = [replace_att(row("hpa", 2.0, seed=s), a) for s, a in enumerate((0.9, 1.0, 0.95))]
    text = autoscale.cell_table(rows)
    assert "| hpa    | 3     | 95.0 (90.0–100.0)" in text
    assert autoscale.summarize(rows).attainment == pytest.approx(0.95)


def replace_att(r: autoscale.Row, attainment: float) -> autoscale.Row:
    from dataclasses import replace

    return replace(r, attainment=attainment)


def test_seeds_change_the_arrivals_and_the_new_traces_load() -> None:
    a, b = (scenario("gentd-diffusion", seed=s, replicas=2) for s in (0, 1))
    assert len(a.requests) != len(b.requests) or not np.array_equal(a.requests.arrival, b.requests.arrival)
    assert parse("ramp-x4@servegen-reason") == ("servegen-reason", "ramp-x4")
    assert parse("spike-x2") == ("azure-conv", "spike-x2")
    spiked = scenario("spike-x4@servegen-language", replicas=2)
    assert spiked.spikes and spiked.info["base"] == "servegen-language"


def test_most_variable_hour_is_the_hour_with_the_largest_max_over_min() -> None:
    starts = np.arange(0.0, 3 * 3600.0, 600.0)
    rates = np.ones(starts.size)
    rates[7] = 3.0  # second hour: max / min = 3
    assert most_variable_hour(starts, rates) == 3600.0


def test_the_frozen_file_builds_every_baseline_and_records_how_it_was_made() -> None:
    policies, record = tune.frozen()
    assert [p.name for p in policies] == [
        "static", "hpa", "keda", "knative-kpa", "aibrix-apa", "kubeai", "llmd-keda", "dynamo-planner"
    ]  # fmt: skip
    assert set(record["picked"]) == set(FAMILIES)
    assert record["command"].startswith("mmfleet bench tune")
    assert set(record["commands"]) == set(FAMILIES) and "relative" in record
    assert all(traces.role(n) == "train" for n in record["scenarios"])
    for family, trials in tune.trials_of(record).items():
        assert pick(trials).setting == record["picked"][family]


def test_a_failed_row_is_labelled_and_no_baseline_wins_with_it() -> None:
    ok = row("hpa", 2.0, seed=0)
    failed = autoscale.failed_row("s", 90.0, "hpa", 1, "hpa never scaled on s")
    text = autoscale.cell_table([ok, failed])
    assert "| hpa (failed in 1 of 2) | 2 " in text
    cheap_inert = replace(row("keda", 0.0), gpu_hours=0.5, failed="keda never scaled on s")
    ours = replace(row("mmfleet", 2.0), gpu_hours=1.0)
    assert autoscale.dominated_by(ours, [cheap_inert]) == []
    assert autoscale.dominated_by(ours, [replace(cheap_inert, failed="")]) == ["keda"]


def test_verdicts_skip_a_cell_run_without_the_shipped_row() -> None:
    assert autoscale.verdicts([row("hpa", 2.0), row("keda", 1.0)]) == []
    assert len(autoscale.verdicts([row("hpa", 2.0), row("mmfleet", 1.0)])) == 1


def test_a_seed_that_failed_neither_hides_a_baseline_nor_counts_in_its_means() -> None:
    good = [replace(row("hpa", 2.0, seed=s), gpu_hours=1.5, attainment=0.99) for s in range(4)]
    inert = replace(row("hpa", 0.0, seed=4), gpu_hours=9.0, attainment=0.5, failed="hpa never scaled")
    summary = autoscale.summarize([*good, inert])
    assert (summary.gpu_hours, summary.attainment, summary.failed) == (1.5, 0.99, "")
    ours = replace(row("mmfleet", 2.0), gpu_hours=2.0, attainment=0.95)
    assert autoscale.dominated_by(ours, [summary]) == ["hpa"]
    assert autoscale.summarize([inert]).failed == "hpa never scaled"


def test_the_shipped_rows_never_scaling_is_a_result_not_a_failure() -> None:
    varying = np.array([18, 20, 44, 21])
    assert autoscale.inert(row("mmfleet", 0.0), varying) == ""
    assert autoscale.inert(row("mmfleet-profiled", 0.0), varying) == ""


def test_a_spike_verdict_names_the_baseline_with_the_fewest_violation_minutes() -> None:
    def spiky(policy: str, minutes: float, hours: float) -> autoscale.Row:
        spiked = replace(row(policy, 2.0, scenario="spike-x4@azure-code"), spike_attainment=0.9, spike_reversals=0.0)
        return replace(spiked, violation_minutes=minutes, gpu_hours=hours)

    rows = [spiky("mmfleet", 2.0, 11.0), spiky("hpa", 8.0, 9.0), spiky("llmd-keda", 4.0, 10.0),
            replace(spiky("keda", 0.0, 5.0), failed="keda never scaled")]  # fmt: skip
    (line,) = autoscale.verdicts(rows)
    assert "violation-minutes 2.0 vs llmd-keda's 4.0 (the fewest of any baseline; 0.50×) at 1.10× its GPU-h" in line
    (none,) = autoscale.verdicts([spiky("mmfleet", 0.0, 11.0), spiky("llmd-keda", 0.0, 10.0)])
    assert "violation-minutes 0.0 vs llmd-keda's 0.0 (the fewest of any baseline; as few) at 1.10×" in none
    (worse,) = autoscale.verdicts([spiky("mmfleet", 1.0, 11.0), spiky("llmd-keda", 0.0, 10.0)])
    assert "(the fewest of any baseline; ∞×)" in worse


def test_a_cell_without_spikes_gets_no_spike_verdict() -> None:
    """`bursts` is scored as a steady hour: its verdict is the steady one, with no reversals per spike to show."""

    def bursty(policy: str, minutes: float) -> autoscale.Row:
        return replace(row(policy, 2.0, scenario="bursts"), violation_minutes=minutes, gpu_hours=10.0)

    (line,) = autoscale.verdicts([bursty("mmfleet", 2.0), bursty("static", 0.0)])
    assert "violation-minutes" not in line and "per spike" not in line, line
    assert line.endswith("not Pareto-dominated"), line


def test_a_mix_shift_takes_its_base_traces_role_and_stays_out_of_the_default_matrix() -> None:
    assert traces.role("outputs-x2") == traces.role("prompts-x2") == "train"
    assert traces.role("outputs-x2@azure-code") == "test"
    assert not any(changes_mix(n) for n in (*traces.TRAIN, *traces.VALIDATION, *traces.TEST))


def test_a_mix_shift_cell_configures_the_baselines_from_the_mix_before_the_change() -> None:
    """A user profiled the workload they had: the profile of outputs-x2 is azure-conv's, not a replica overloaded by
    the doubled outputs at the capacity of the old mix."""
    from mmfleet_lab.twin import H200_QWEN25VL7B
    from mmfleet_lab.twin.scenarios import REFERENCE_SLO

    before = autoscale.profile_of("azure-conv", H200_QWEN25VL7B, REFERENCE_SLO)
    shifted = autoscale.profile_of("outputs-x2", H200_QWEN25VL7B, REFERENCE_SLO)
    assert shifted.capacity == before.capacity
    assert shifted.osl == pytest.approx(before.osl, rel=0.05)
    assert shifted.mean_latency < 2 * before.mean_latency
