"""``mmfleet bench reachable``: the reactive family is built from what a reactive policy could have seen, the
forecast from needs known a lead earlier, each reported member meets every window, and none costs less than the
oracle that sees ahead."""

from __future__ import annotations

import numpy as np
import pytest

from mmfleet_lab.bench import autoscale
from mmfleet_lab.bench.oracle import failing_windows, found, replay, true_oracle
from mmfleet_lab.bench.reachable import (
    LOOKBACKS,
    ORDERS,
    covering_headroom,
    forecast_inputs,
    forecast_need,
    forecasters,
    headroom_counts,
    lead_windows,
    members,
    online_forecast,
    reactive_counts,
    trailing_need,
)
from tests.helpers.oracle import make_cell

NEED = np.array([4, 4, 10, 2, 2, 8, 3], dtype=np.int64)


def test_orders_land_one_window_later_per_started_window_of_cold_start() -> None:
    assert [lead_windows(c, 60.0) for c in (30.0, 60.0, 90.0, 420.0)] == [1, 1, 2, 7]


def test_a_window_is_sized_only_from_needs_known_a_lead_earlier() -> None:
    assert trailing_need(NEED, 1, 0).tolist() == [4, 4, 4, 10, 2, 2, 8]
    assert trailing_need(NEED, 2, 1).tolist() == [4, 4, 4, 4, 10, 10, 2]
    # Raising a need can only change the windows that could have seen it.
    later = NEED.copy()
    later[5] = 50
    changed = np.flatnonzero(trailing_need(later, 1, 1) != trailing_need(NEED, 1, 1))
    assert changed.tolist() == [6]


def test_the_covering_headroom_reaches_every_windows_need_and_no_less_does() -> None:
    h = covering_headroom(NEED, trailing_need(NEED, 1, 0), 1)
    assert h == 8 / 2  # window 5 needs 8 where window 4 showed 2
    assert (reactive_counts(NEED, 1, 0, h) >= NEED).all()
    assert not (reactive_counts(NEED, 1, 0, 0.8 * h) >= NEED).all()
    assert reactive_counts(NEED, 2, 0, 3.0)[:2].tolist() == [4, 4], "before an order can land: the need itself"


def test_a_forecast_learns_a_steady_trend_in_hindsight() -> None:
    ramp = np.arange(3, 63, dtype=np.int64)
    lead = 2
    for order in ORDERS:
        forecast = forecast_need(ramp, lead, order)
        assert forecast is not None
        assert np.allclose(forecast[lead:], ramp[lead:]), order
        assert forecast[:lead].tolist() == ramp[:lead].tolist(), "before an order can land: the need itself"


def test_a_forecast_reads_only_needs_known_a_lead_earlier() -> None:
    need = np.arange(100, 130, dtype=np.int64)
    lead, order = 3, 4
    inputs = forecast_inputs(need, lead, order)
    assert inputs.shape == (need.size - lead, order + 1)
    for row, w in zip(inputs, range(lead, need.size), strict=True):
        assert row.tolist() == [1.0, *(float(need[max(w - lead - j, 0)]) for j in range(order))]
    # Whatever the order, a jump in the last window is not foreseen.
    periodic = np.tile(np.array([5, 9, 7], dtype=np.int64), 20)
    periodic[-1] = 60
    for order in ORDERS:
        forecast = forecast_need(periodic, lead, order)
        assert forecast is not None and forecast[-1] < 30, order


def test_a_forecast_is_not_fitted_on_fewer_windows_than_its_coefficients_need() -> None:
    assert forecast_need(np.full(56, 3, dtype=np.int64), 50, 8) is None
    assert forecast_need(np.full(56, 3, dtype=np.int64), 50, 1) is None
    assert forecast_need(np.full(57, 3, dtype=np.int64), 7, 8) is not None, "an hour at a 420 s cold start fits p = 8"
    with pytest.raises(ValueError, match="order: 0 inputs"):
        forecast_need(NEED, 1, 0)


def test_every_reported_member_meets_every_window_and_costs_at_least_the_oracle() -> None:
    cell = make_cell()
    cold = 60.0
    lead = lead_windows(cold, cell.window)
    oracle = found(true_oracle(cell, cold)[0])
    reactive = members(cell, oracle.ready, cold, cell.initial)
    forecasting = forecasters(cell, oracle.ready, cold, cell.initial)
    assert [m.label for m in reactive] == [f"k={k}" for k in LOOKBACKS]
    assert [m.label for m in forecasting] == ["p=1"], "nine windows fit two coefficients, not three"
    bases = {f"k={k}": trailing_need(oracle.ready, lead, k) for k in LOOKBACKS}
    bases["p=1"] = forecast_need(oracle.ready, lead, 1)
    for family in (reactive, forecasting):
        meeting = [m for m in family if not m.misses]
        assert meeting, "the raise loop must find a member that meets every window on this cell"
        for m in meeting:
            counts = headroom_counts(bases[m.label], oracle.ready, lead, m.headroom)
            assert failing_windows(cell, replay(cell, counts, cold, "check")) == []
            oracle_hours = oracle.result.gpu_seconds_from(autoscale.SCORED_FROM) / 3600.0
            assert m.row.gpu_hours >= oracle_hours - 1e-9


def test_the_family_keeps_within_the_policies_max_replicas() -> None:
    assert reactive_counts(NEED, 1, 0, 3.0, cap=9).tolist() == [4, 9, 9, 9, 6, 6, 9]


def test_an_online_forecast_reads_only_needs_known_a_lead_earlier() -> None:
    rng = np.random.default_rng(3)
    need = rng.integers(5, 30, size=60).astype(np.int64)
    lead = 2
    for order in ORDERS:
        before = online_forecast(need, lead, order)
        for k in (20, 45):
            later = need.copy()
            later[k] = 90
            changed = np.flatnonzero(online_forecast(later, lead, order) != before)
            assert changed.size and changed.min() >= k + lead, (order, k)


def test_an_online_forecast_learns_a_steady_trend_once_it_has_seen_enough_of_it() -> None:
    need = np.arange(10, 70, dtype=np.int64)
    lead = 2
    forecast = online_forecast(need, lead, 1)
    assert forecast[lead:10].tolist() == need[: 10 - lead].tolist(), "the last need known until the fit has rows"
    assert np.allclose(forecast[20:], need[20:]), "then the trend, foreseen a lead ahead"
    assert forecast_need(need, lead, 1) is not None
