"""``mmfleet bench mix``: which unit a replica's capacity holds in when the request mix changes (issue 25)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mmfleet_lab.bench import mix
from mmfleet_lab.twin.scenarios import REFERENCE_SLO
from tests.helpers.cli import run


def _mix(name: str, costs: tuple[float, ...], prompt: float, output: float, images: float) -> mix.Mix:
    f = (1.0, prompt, output, images)
    return mix.Mix(name, 1.0 / float(np.dot(costs, f)), f)


def test_the_fit_recovers_linear_costs_and_never_a_negative_one() -> None:
    costs = (0.0, 3e-5, 1.2e-4, 0.035)
    mixes = [_mix(f"m{i}", costs, p, o, im) for i, (p, o, im) in
             enumerate([(1400, 211, 0.4), (1400, 105, 0.4), (1400, 422, 0.4), (830, 211, 0.4), (2560, 211, 0.8),
                        (1155, 211, 0.0)])]  # fmt: skip
    assert mix.fit_costs(mixes) == pytest.approx(costs, abs=1e-9)
    # A per-request cost that least squares would make negative is held at zero, and the others refitted: the
    # non-negative optimum, better than the unconstrained solution with its negative cost clipped.
    skewed = [*mixes[:-1], mix.Mix("odd", mixes[-1].mu * 3.0, mixes[-1].features)]
    y = np.array([1.0 / m.mu for m in skewed])
    x = np.array([m.features for m in skewed]) / y[:, None]
    unconstrained = np.linalg.lstsq(x, np.ones_like(y), rcond=None)[0]
    assert unconstrained[0] < 0

    def error(w: np.ndarray) -> float:
        return float(np.sum((x @ w - 1.0) ** 2))

    fitted = mix.fit_costs(skewed)
    assert np.all(fitted >= 0.0) and fitted[0] == 0.0
    assert error(fitted) < error(np.maximum(unconstrained, 0.0)) - 1e-6


def test_each_unit_carries_the_training_capacity_its_own_way() -> None:
    costs = np.array([0.0, 3e-5, 1.2e-4, 0.035])
    base = _mix("base", tuple(costs), 1400, 200, 0.5)
    longer = _mix("longer outputs", tuple(costs), 1400, 400, 0.5)
    assert mix.predict("requests", base, costs, longer) == base.mu
    assert mix.predict("tokens", base, costs, longer) == pytest.approx(base.mu * 1600 / 1800)
    assert mix.predict("work", base, costs, longer) == pytest.approx(longer.mu)
    # Anchored on what was measured on the training mix, whatever the costs' scale.
    assert mix.predict("work", base, costs * 3.0, longer) == pytest.approx(longer.mu)
    with pytest.raises(ValueError, match="unit 'joules': one of requests, tokens, work"):
        mix.predict("joules", base, costs, longer)


def test_in_the_twin_work_units_overpromise_less_than_requests_when_the_mix_changes() -> None:
    """The section's finding, on seed 0 at the reference SLO: a capacity learned in req/s on the training mix
    promises over 1.5x what a replica serves once outputs or prompts double; carried in fitted work units, under
    1.35x, and on the held-out traces at most what the replica serves (within the 3 % bisection)."""
    result = mix.run_seed(0, REFERENCE_SLO)
    base = result.train[0]

    def worst(unit: str, mixes: tuple[mix.Mix, ...]) -> float:
        return max(mix.predict(unit, base, result.costs, m) / m.mu for m in mixes)

    assert worst("requests", result.train) > 1.5
    assert worst("work", result.train) < 1.35
    assert worst("work", result.held_out) < 1.03
    assert all(c >= 0 for c in result.costs)


def test_bench_mix_writes_its_section_with_the_command(tmp_path: Path) -> None:
    docs = tmp_path / "benchmarks.md"
    result = run("bench", "mix", "--seed", "0", "--docs", str(docs))
    assert result.returncode == 0, result.stderr
    text = docs.read_text()
    assert "<!-- bench:mix -->" in text and "<!-- /bench:mix -->" in text
    assert "Command: `mmfleet bench mix --seed 0`" in text
    for name in (*mix.HELD_OUT, "output x2", "images x0"):
        assert name in text
