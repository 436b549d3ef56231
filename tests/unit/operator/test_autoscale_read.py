"""The autoscaling loop's read of Prometheus: an error nobody foresaw holds every fleet with a condition."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from mmfleet.autoscaler import cycle
from mmfleet.autoscaler.metrics import Prometheus
from mmfleet.handlers.autoscale import _read
from mmfleet.validation import parse
from tests.helpers.repo import spec_doc


def test_an_unexpected_error_reading_prometheus_is_an_outage_every_fleet_holds_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prometheus = Prometheus("http://127.0.0.1:9")
    monkeypatch.setattr(prometheus, "read", lambda *_: 1 / 0)  # the fault: a bug in the read
    fleet = parse(spec_doc(autoscaling={"minReplicas": 1, "maxReplicas": 9, "slo": {"target": "2s"}}))
    readings = _read(prometheus, [fleet], 0.0)
    assert readings.outage == "reading http://127.0.0.1:9 failed: ZeroDivisionError: division by zero"
    seen = cycle.Seen(4, cycle.Pods(ready=4), None, readings.outage)
    outcome = cycle.decide(fleet, seen, cycle.Memory(), datetime.now(UTC), interval=15.0, default_cold_start=60.0)
    assert outcome.replicas == 4
    assert outcome.conditions[0][:3] == ("MetricsAvailable", False, "PrometheusUnavailable")
    prometheus.close()
