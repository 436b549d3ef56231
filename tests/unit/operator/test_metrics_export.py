"""The operator's own metrics move when it works, and its server answers /metrics on its own port."""

from __future__ import annotations

import functools
import math
import socket
import tracemalloc
import urllib.request
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mmfleet import metrics_export
from mmfleet.autoscaler import cycle, metrics
from mmfleet.handlers import autoscale, records
from mmfleet.handlers.records import Operator, utc_now
from mmfleet_lab.cluster.process import free_port
from tests.helpers.operator_state import FakePrometheus, RecordingKube, fleet_body, operator, reconcile_once

KEY = ("ml", "qwen")
FLEET = {"namespace": "ml", "mmfleet_io_inference": "qwen"}


body = functools.partial(fleet_body, generation=3, replicas=1, capacity_per_replica=2.0)


@pytest.fixture
def op(monkeypatch: pytest.MonkeyPatch) -> Iterator[Operator]:
    monkeypatch.setattr(autoscale, "kopf_event", lambda *args: None)  # kopf's posting needs its own context
    monkeypatch.setattr(records, "kopf_event", lambda *args: None)
    yield operator(RecordingKube())
    metrics_export.forget_others(set())


def value(name: str, **labels: str) -> float | None:
    """A sample as a scrape of the registry shows it; None when the series does not exist."""
    return metrics_export.REGISTRY.get_sample_value(name, labels)


def _cycle(op: Operator, prometheus: metrics.Prometheus, views: Iterable[Any] | None = None) -> None:
    """One autoscaling cycle over ml/qwen at 2 Ready replicas whose series have been read for two minutes."""
    record = op.record(KEY)
    record.scaling = record.scaling or cycle.Memory(metrics_since=(utc_now() - timedelta(minutes=2)).timestamp())
    pod = {
        "metadata": {"name": "qwen-1", "creationTimestamp": "2026-12-01T00:00:00+00:00"},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T00:01:30+00:00"}],
        },
    }
    deployment = {"metadata": {"generation": 1}, "spec": {"replicas": 2}, "status": {}}
    if views is None:
        views = [autoscale.FleetView(KEY, body(autoscaling=True), deployment, [pod, pod])]
    with ThreadPoolExecutor(2) as pool:
        autoscale.autoscale(op, list(views), prometheus, pool, lambda *_: (deployment, [pod, pod]))


def test_a_cycle_that_scales_moves_the_fleets_series_and_the_cycle_counters(op: Operator) -> None:
    cycles = value("mmfleet_autoscaler_cycle_duration_seconds_count") or 0.0
    busy = metrics.Signals(latency=9.0, request_rate=12.0, waiting=40.0, running=16.0, kv_cache_usage=0.9)
    _cycle(op, FakePrometheus(busy))
    assert value("mmfleet_autoscaler_cycle_duration_seconds_count") == cycles + 1
    desired = value("mmfleet_fleet_desired_replicas", **FLEET)
    assert desired is not None and desired > 2, "the test needs a cycle that scales up"
    assert value("mmfleet_fleet_scale_events_total", **FLEET, direction="up") == 1
    assert value("mmfleet_fleet_scale_events_total", **FLEET, direction="down") == 0  # present, so increase() is 0
    assert value("mmfleet_autoscaler_decisions_total", **FLEET, decision="scaled_up") == 1
    assert value("mmfleet_fleet_ready_replicas", **FLEET) == 2
    assert value("mmfleet_fleet_unschedulable_replicas", **FLEET) == 0
    assert value("mmfleet_fleet_slo_target_seconds", **FLEET) == 2.0
    assert value("mmfleet_fleet_slo_observed_seconds", **FLEET) == 9.0
    assert value("mmfleet_fleet_slo_evaluations_total", **FLEET, result="missed") == 1
    assert value("mmfleet_fleet_slo_attainment_ratio", **FLEET) == 0.0
    assert value("mmfleet_fleet_cold_start_seconds", **FLEET) == 90.0  # creation to Ready of its pods
    assert value("mmfleet_fleet_metrics_available", **FLEET) == 1
    assert value("mmfleet_fleet_max_replicas", **FLEET) == 8


def test_an_outage_counts_a_failed_query_and_a_hold_and_no_slo_verdict(op: Operator) -> None:
    class Down(FakePrometheus):
        def read(self, targets: Iterable[metrics.Target], at: float) -> metrics.Readings:
            return metrics.Readings(
                outage="http://prometheus:9090 unreachable", queries=1, latencies=(metrics.Sent(5.0, ok=False),)
            )

    failed = value("mmfleet_prometheus_query_duration_seconds_count", result="error") or 0.0
    _cycle(op, Down(None))
    assert value("mmfleet_prometheus_query_duration_seconds_count", result="error") == failed + 1
    assert value("mmfleet_autoscaler_decisions_total", **FLEET, decision="metrics_unavailable") == 1
    assert value("mmfleet_fleet_metrics_available", **FLEET) == 0
    assert value("mmfleet_fleet_slo_evaluations_total", **FLEET, result="met") == 0
    assert value("mmfleet_fleet_slo_evaluations_total", **FLEET, result="missed") == 0
    observed = value("mmfleet_fleet_slo_observed_seconds", **FLEET)
    assert observed is not None and math.isnan(observed), "unmeasured is NaN, not 0"


def test_a_fleet_no_longer_autoscaled_loses_its_series(op: Operator) -> None:
    _cycle(op, FakePrometheus(metrics.Signals(latency=1.0, request_rate=1.0, waiting=0.0, running=1.0)))
    assert value("mmfleet_fleet_desired_replicas", **FLEET) is not None
    _cycle(op, FakePrometheus(None), views=[])
    assert value("mmfleet_fleet_desired_replicas", **FLEET) is None
    assert value("mmfleet_fleet_scale_events_total", **FLEET, direction="up") is None


def test_a_failing_fleet_counts_an_error(op: Operator, monkeypatch: pytest.MonkeyPatch) -> None:
    errors = value("mmfleet_errors_total", where="autoscale_fleet") or 0.0

    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(autoscale.cycle, "decide", broken)
    _cycle(op, FakePrometheus(metrics.Signals(latency=1.0)))
    assert value("mmfleet_errors_total", where="autoscale_fleet") == errors + 1


def test_reconciles_are_counted_by_how_they_ended(op: Operator, monkeypatch: pytest.MonkeyPatch) -> None:
    def count(result: str) -> float:
        return value("mmfleet_reconciles_total", result=result) or 0.0

    before = {r: count(r) for r in metrics_export.RECONCILE_RESULTS}
    errors = value("mmfleet_errors_total", where="reconcile") or 0.0
    reconcile_once(op, body())
    invalid = body(generation=5)  # a new generation: parsed afresh
    invalid["spec"]["gpu"] = {"count": 0}
    assert not reconcile_once(op, invalid).retry, "only a new spec helps"

    def fails(*_: Any, **__: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(op.get_kube(), "apply", fails)
    assert reconcile_once(op, body(generation=6)).retry
    after = {r: count(r) for r in metrics_export.RECONCILE_RESULTS}
    changes = {"ok": 1, "invalid_spec": 1, "retry": 0, "refused": 0, "error": 1}
    assert {r: after[r] - before[r] for r in after} == changes
    assert value("mmfleet_errors_total", where="reconcile") == errors + 1


# --- the server ---------------------------------------------------------------------------------------------------


def get(port: int, path: str) -> tuple[int, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
        return answer.status, answer.read().decode()


def test_metrics_are_served_in_the_text_format_on_their_own_port(op: Operator) -> None:
    _cycle(op, FakePrometheus(metrics.Signals(latency=1.0, request_rate=1.0, waiting=0.0, running=1.0)))
    port = free_port()
    stop = metrics_export.serve(f"127.0.0.1:{port}")
    try:
        status, text = get(port, "/metrics")
    finally:
        stop()
    assert status == 200
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert {"mmfleet_reconciles", "mmfleet_autoscaler_cycle_duration_seconds", "process_cpu_seconds"} <= set(families)
    desired = [s for s in families["mmfleet_fleet_desired_replicas"].samples if s.labels == FLEET]
    assert len(desired) == 1


def test_a_cold_start_histogram_scrapes_with_cumulative_buckets_sum_and_count(op: Operator) -> None:
    _cycle(op, FakePrometheus(metrics.Signals(latency=1.0, request_rate=1.0, waiting=0.0, running=1.0)))
    metrics_export.record_wake(KEY, 3.0)
    metrics_export.record_wake(KEY, 700.0)
    text = generate_latest(metrics_export.REGISTRY).decode()
    family = next(f for f in text_string_to_metric_families(text) if f.name == "mmfleet_fleet_cold_start_phase_seconds")
    wake = {(s.name, s.labels.get("le")): s.value for s in family.samples if s.labels.get("phase") == "wake"}
    assert wake[("mmfleet_fleet_cold_start_phase_seconds_bucket", "2.5")] == 0
    assert wake[("mmfleet_fleet_cold_start_phase_seconds_bucket", "5.0")] == 1
    assert wake[("mmfleet_fleet_cold_start_phase_seconds_bucket", "600.0")] == 1
    assert wake[("mmfleet_fleet_cold_start_phase_seconds_bucket", "+Inf")] == 2
    assert wake[("mmfleet_fleet_cold_start_phase_seconds_count", None)] == 2
    assert wake[("mmfleet_fleet_cold_start_phase_seconds_sum", None)] == 703


def test_a_thousand_fleets_series_take_a_few_megabytes(op: Operator, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every per-fleet series of 1,000 fleets, each with a cold start observed in every phase: 47 MB with
    prometheus_client's labelled children (near a quarter of the operator's 200 MB budget at that scale), 4.5 MB
    now on Python 3.11."""
    decided: list[tuple[Any, ...]] = []
    record = metrics_export.record_decision
    monkeypatch.setattr(metrics_export, "record_decision", lambda *args: decided.append(args))
    _cycle(op, FakePrometheus(metrics.Signals(latency=1.0, request_rate=1.0, waiting=0.0, running=1.0)))
    ((_, *decision),) = decided  # one fleet's cycle, replayed for 1,000 fleets
    phases = ("total", *cycle.PHASES, *cycle.SERVER_PHASES, metrics_export.WAKE_PHASE)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for key in (("bench", f"fleet-{i:04d}") for i in range(1000)):
            record(key, *decision)
            for phase in phases:
                metrics_export.COLD_START_PHASES.observe((*key, phase), 30.0)
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert value("mmfleet_fleet_desired_replicas", namespace="bench", mmfleet_io_inference="fleet-0999") is not None
    assert used < 8e6, f"{used / 1e6:.1f} MB"


def test_a_port_in_use_fails_before_the_operator_starts() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError):
            metrics_export.serve(f"127.0.0.1:{port}")


@pytest.mark.parametrize(("address", "expected"), [("0.0.0.0:8081", ("0.0.0.0", 8081)), ("[::]:9", ("::", 9))])
def test_addresses_as_the_setting_takes_them(address: str, expected: tuple[str, int]) -> None:
    assert metrics_export.split_address(address) == expected
