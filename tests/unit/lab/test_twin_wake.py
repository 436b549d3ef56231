"""The twin's wake time against vLLM 0.33.0's measured on an H200 (``tests/data/vllm_h200_sleep_wake_0.33.0.csv``):
the wake of a sleeping replica is the phase the twin gives its own duration, so it must be the measured one, and far
shorter than the cold start measured on the same host, or warm standby would buy nothing."""

from __future__ import annotations

import csv
import statistics

import numpy as np
import pytest

from mmfleet_lab.twin import H200_QWEN25VL7B_WAKE_S
from tests.helpers.repo import ROOT
from tests.helpers.twin import Script, run, steady

DATA = ROOT / "tests" / "data" / "vllm_h200_sleep_wake_0.33.0.csv"


def measured(phase: str, level: int | None = None, run: str | None = None) -> list[float]:
    with DATA.open() as fh:
        return [
            float(r["seconds"])
            for r in csv.DictReader(fh)
            if r["phase"] == phase and (level is None or int(r["level"]) == level) and (run is None or r["run"] == run)
        ]


def test_the_twins_wake_is_the_median_of_the_measured_level_1_wakes() -> None:
    wakes = measured("wake", level=1)
    assert len(wakes) == 3
    assert statistics.median(wakes) == pytest.approx(H200_QWEN25VL7B_WAKE_S, rel=0.02)


def test_a_wake_is_over_a_hundred_times_shorter_than_the_measured_cold_start() -> None:
    """Even the cold start with the compile cache warm (what mmfleet's shared compile cache gives a new pod)."""
    fastest_cold = min(measured("cold_start"))
    assert fastest_cold == pytest.approx(130.8, abs=0.1)
    assert max(measured("wake")) * 100 < fastest_cold


def test_with_the_measured_wake_a_step_is_served_within_two_seconds_instead_of_a_cold_start() -> None:
    cold_start = min(measured("cold_start"))
    step = steady(1.0, 300.0), Script([(10.0, 2)]), 300.0
    woken = run(*step, initial_replicas=1, cold_start=cold_start, standby=1, wake=H200_QWEN25VL7B_WAKE_S)
    started = run(*step, initial_replicas=1, cold_start=cold_start)
    assert (woken.ready >= 2).any() and (started.ready >= 2).any()
    assert 0 <= int(np.argmax(woken.ready >= 2)) - 10 <= 2
    assert int(np.argmax(started.ready >= 2)) - 10 == pytest.approx(cold_start, abs=1)
