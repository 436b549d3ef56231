"""``mmfleet bench cache``: the cold starts it runs come from the measurements and the flags, the saving is the
shared cache's mean over the per-replica cache's, the baseline is the one the fixed rule picks, and a nonsense
flag is refused by name before anything runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from mmfleet_lab.bench.autoscale import Row
from mmfleet_lab.bench.cache import (
    COLD_COMPILE,
    COLD_WARM,
    FlagError,
    best_baseline,
    check_flags,
    cold_starts,
    fmt_ratio,
    ratio,
)
from mmfleet_lab.bench.tune import TUNED
from tests.helpers.cli import run


def test_the_measured_set_is_the_two_measured_starts_whatever_the_bandwidths() -> None:
    for flags in ({}, {"download_mbps": 50.0, "shared_read_mbps": 5000.0}, {"weight_bytes": 1e12}):
        measured, _ = cold_starts(**flags)
        assert (measured.per_replica, measured.shared) == (COLD_COMPILE, COLD_WARM) == (135.0, 105.0)


def test_the_weights_add_their_transfer_at_each_caches_bandwidth() -> None:
    _, assumed = cold_starts(weight_bytes=10e9, download_mbps=100.0, shared_read_mbps=1000.0)
    assert (assumed.per_replica, assumed.shared) == (135.0 + 100.0, 105.0 + 10.0)
    # A faster download shortens only the per-replica cache's cold start.
    _, faster = cold_starts(weight_bytes=10e9, download_mbps=200.0, shared_read_mbps=1000.0)
    assert (faster.per_replica, faster.shared) == (135.0 + 50.0, 105.0 + 10.0)


def test_the_default_cold_starts_are_qwen25_vl_7b_at_500_and_1573_mb_per_s() -> None:
    _, assumed = cold_starts()
    assert (assumed.per_replica, assumed.shared) == (135.0 + 33.0, 105.0 + 11.0)  # 16.58 GB: 33.2 s and 10.5 s


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        ({"download_mbps": 0.0}, "--download-mbps: 0; a finite number above 0"),
        ({"shared_read_mbps": -5.0}, "--shared-read-mbps: -5; a finite number above 0"),
        ({"shared_read_mbps": math.inf}, "--shared-read-mbps: inf; a finite number above 0"),
        ({"weight_bytes": math.nan}, "--weight-bytes: nan; a finite number above 0"),
    ],
)
def test_a_bandwidth_or_size_that_is_not_positive_is_refused_by_name(flags: dict[str, float], said: str) -> None:
    with pytest.raises(FlagError) as refused:
        cold_starts(**flags)
    assert str(refused.value) == said


def test_an_unknown_scenario_a_negative_seed_or_no_worker_is_refused_by_name() -> None:
    for args, said in (
        ((["azure-code", "azure-cod"], [0], 1), "--scenario: azure-cod is not a scenario; accepted: azure-conv"),
        ((["azure-code"], [0, -1], 1), "--seed: -1; a whole number from 0"),
        ((["azure-code"], [0], 0), "--workers: 0; at least 1"),
    ):
        with pytest.raises(FlagError) as refused:
            check_flags(*args)
        assert str(refused.value).startswith(said)
    check_flags(["azure-code", "spike-x4@azure-code"], [0, 4], 1)


def _row(seed: int, gpu_hours: float, violation_minutes: float) -> Row:
    nan = math.nan
    return Row("azure-code", 135.0, "mmfleet", 1.0, nan, 0.0, gpu_hours, nan, 1.0, 0.0, 0.0, nan,
               violation_minutes, 0.0, "", seed)  # fmt: skip


def test_the_saving_is_the_shared_mean_over_the_per_replica_mean() -> None:
    per = [_row(0, 20.0, 4.0), _row(1, 40.0, 2.0)]
    shared = [_row(0, 15.0, 1.0), _row(1, 30.0, 2.0)]
    assert ratio(shared, per, "gpu_hours") == pytest.approx(0.75)
    assert ratio(shared, per, "violation_minutes") == pytest.approx(0.5)
    assert fmt_ratio(ratio(shared, per, "gpu_hours")) == "0.75"


def test_a_ratio_over_nothing_says_so() -> None:
    none = [_row(0, 10.0, 0.0)]
    assert fmt_ratio(ratio(none, none, "violation_minutes")) == "- (0 in both)"
    assert fmt_ratio(ratio([_row(0, 10.0, 3.0)], none, "violation_minutes")) == "∞"


def test_the_baseline_is_the_fixed_rules_pick_from_the_frozen_record() -> None:
    record = json.loads(Path(TUNED).read_text())
    assert best_baseline(record) == "llmd-keda"  # 0 violation-minutes on training (knative-kpa, next, had 1.0)


def test_the_rule_takes_fewest_violation_minutes_then_gpu_hours_and_never_the_static_fleet() -> None:
    def trial(family: str, minutes: float, hours: float) -> dict[str, object]:
        return {"family": family, "setting": {"target": 1.0}, "violation_minutes": minutes, "gpu_hours": hours}

    families = {"static": (0.0, 10.0), "hpa": (2.0, 10.0), "keda": (1.0, 50.0), "knative-kpa": (1.0, 40.0)}
    record = {
        "picked": {f: {"target": 1.0} for f in families},
        "sweeps": {f: [trial(f, 9.0, 1.0) | {"setting": {"target": 2.0}}, trial(f, *v)] for f, v in families.items()},
    }
    assert best_baseline(record) == "knative-kpa"


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--download-mbps", "0"], "--download-mbps: 0; a finite number above 0"),
        (["--scenario", "azure-cod"], "--scenario: azure-cod is not a scenario"),
        (["--workers", "0"], "--workers: 0; at least 1"),
    ],
)
def test_the_command_refuses_a_bad_flag_before_running(tmp_path: Path, flags: list[str], said: str) -> None:
    docs = tmp_path / "b.md"
    result = run("bench", "cache", *flags, "--docs", str(docs))
    assert result.returncode == 2 and said in result.stderr and "Traceback" not in result.stderr
    assert not docs.exists()
