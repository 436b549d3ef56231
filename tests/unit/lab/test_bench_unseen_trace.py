"""``mmfleet bench autoscale --trace`` on a trace no part of the benchmark was built or tuned on: a Markov-modulated
Poisson process, a generator none of the shipped traces comes from. Every row comes back, as a result or marked
failed with its reason, and the section names the command that reproduces it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np

from tests.helpers.operator_process import mmfleet_command
from tests.helpers.repo import ROOT

ROWS = ("oracle", "oracle-L0", "fluid-bound", "mmfleet", "hpa")


def markov_modulated(path: Path, seconds: float, seed: int = 7) -> None:
    """Arrivals whose rate switches between two levels at random moments (mean dwell 90 s) under a 10-minute
    sinusoid: bursts and lulls of no fixed shape, one request per row."""
    rng = np.random.default_rng(seed)
    t, high, times = 0.0, False, []
    while t < seconds:
        high = high != (rng.random() < 1 / 90)
        rate = (6.0 if high else 2.0) * (1 + 0.3 * np.sin(2 * np.pi * t / 600))
        t += rng.exponential(1 / rate)
        times.append(t)
    path.write_text("ts\n" + "".join(f"{x:.3f}\n" for x in times if x < seconds))


def test_bench_autoscale_runs_every_row_on_an_unseen_trace(tmp_path: Path) -> None:
    trace, docs = tmp_path / "mmpp.csv", tmp_path / "benchmarks.md"
    markov_modulated(trace, 780.0)
    command = [*mmfleet_command(()), "bench", "autoscale", "--trace", str(trace), "--time-column", "ts",
               "--cold-start", "30", "--seed", "0", "--policy", "mmfleet", "--policy", "hpa", "--docs", str(docs),
               "--plots", str(tmp_path / "img")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    for policy in ROWS:
        line = next((x for x in done.stdout.splitlines() if re.match(rf"\| {re.escape(policy)}\b", x)), None)
        assert line is not None, (policy, done.stdout)
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert "(failed" in cells[0] or cells[5] != "-", (policy, line)  # a GPU-hours figure, or marked failed
        if policy in ("oracle", "mmfleet"):  # on this trace both serve: the yardstick and the row that ships
            assert "(failed" not in cells[0] and cells[2] != "-", (policy, line)
    text = docs.read_text()
    assert (
        f"`mmfleet bench autoscale --trace {trace} --time-column ts --scenario trace --cold-start 30 --seed 0" in text
    )
    assert "### trace (test), cold start 30 s" in text
