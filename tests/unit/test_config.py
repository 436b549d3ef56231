"""Operator settings from the environment: the autoscaler's, and the errors a user sees."""

from __future__ import annotations

import pytest

from mmfleet.config import OperatorConfig


@pytest.mark.parametrize(("text", "seconds"), [("15s", 15.0), ("1m30s", 90.0), ("90", 90.0), ("2.5", 2.5)])
def test_autoscale_interval_and_cold_start_take_durations_or_seconds(
    monkeypatch: pytest.MonkeyPatch, text: str, seconds: float
) -> None:
    monkeypatch.setenv("MMFLEET_AUTOSCALE_INTERVAL", text)
    monkeypatch.setenv("MMFLEET_COLD_START", text)
    config = OperatorConfig.from_env()
    assert (config.autoscale_interval, config.default_cold_start) == (seconds, seconds)


def test_defaults_and_no_prometheus(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MMFLEET_AUTOSCALE_INTERVAL", "MMFLEET_COLD_START"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MMFLEET_PROMETHEUS_URL", "")
    config = OperatorConfig.from_env()
    assert (config.autoscale_interval, config.default_cold_start, config.prometheus_url) == (15.0, 120.0, "")


def test_a_bad_duration_names_the_variable_the_value_and_what_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MMFLEET_AUTOSCALE_INTERVAL", "fast")
    with pytest.raises(ValueError, match=r"MMFLEET_AUTOSCALE_INTERVAL: 'fast' is not a duration such as 15s, 2m or 90"):
        OperatorConfig.from_env()
    monkeypatch.setenv("MMFLEET_AUTOSCALE_INTERVAL", "500ms")
    with pytest.raises(ValueError, match=r"autoscale interval: 0.5s must be at least 1s"):
        OperatorConfig.from_env()
