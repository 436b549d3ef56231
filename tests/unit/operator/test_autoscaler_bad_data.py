"""A cycle trusts nothing it reads: bad samples hold the fleet, and MetricsAvailable quotes what was seen."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import timedelta

import pytest

from mmfleet.autoscaler.cycle import Pods
from mmfleet.autoscaler.metrics import Signals
from tests.helpers.autoscaler import T0, busy, conditions, fleet, run


@pytest.mark.parametrize(
    ("bad", "quoted"),
    [
        ({"latency": math.inf}, "P90 latency = inf"),  # histogram_quantile in the +Inf bucket
        ({"waiting": 1e9}, "vllm:num_requests_waiting = 1e+09"),  # scaled 3 -> max in one step
        ({"waiting": math.nan}, "vllm:num_requests_waiting = nan"),
        ({"running": -math.inf}, "vllm:num_requests_running = -inf"),
        ({"request_rate": -5.0}, "vllm:request_success_total = -5"),
        ({"kv_cache_usage": 1.7}, "vllm:kv_cache_usage_perc = 1.7"),
    ],
)
def test_an_implausible_sample_holds_the_fleet_and_is_quoted(bad: dict[str, float], quoted: str) -> None:
    signals = replace(busy(4.0, waiting=40.0), reporting=3, **bad)
    outcomes, _, current = run(fleet(min_replicas=1, max_replicas=20), 3, signals, cycles=12)
    assert current == 3 and not any(o.scaled for o in outcomes), "neither minReplicas nor maxReplicas on bad data"
    ok, reason, message = conditions(outcomes[-1])["MetricsAvailable"]
    assert (ok, reason) == (False, "SamplesRejected")
    assert quoted in message and message.endswith("holding 3 replicas")
    assert outcomes[-1].cause == "metrics_unavailable"


def test_the_plausible_range_grows_with_the_pods() -> None:
    """100,000 waiting is implausible on one pod, not on three hundred."""
    signals = replace(busy(1.0, waiting=150_000.0), reporting=300)
    outcomes, _, _ = run(fleet(max_replicas=400), 300, signals, cycles=1, pods=Pods(ready=300))
    assert conditions(outcomes[-1])["MetricsAvailable"][:2] == (True, "SeriesPresent")


def test_a_query_prometheus_refused_holds_the_fleet_and_quotes_prometheus() -> None:
    failed = Signals(failed="http://prom:9090 refused the query 'x[0s]': HTTP Status Code 400 (bad_data)")
    outcomes, _, current = run(fleet(), 4, failed, cycles=6)
    assert current == 4
    ok, reason, message = conditions(outcomes[-1])["MetricsAvailable"]
    assert (ok, reason) == (False, "QueryFailed")
    assert message == f"{failed.failed}; holding 4 replicas"


def test_a_partial_scrape_says_so_and_never_scales_down() -> None:
    full = replace(busy(1.0, rate=12.0, waiting=0.0, running=12.0), reporting=6)
    _, learned, _ = run(fleet(), 6, full, cycles=20, pods=Pods(ready=6))  # 2 req/s per replica within the target
    quiet = replace(full, request_rate=2.0, running=2.0, reporting=1)  # what a scrape of one pod in six sums to
    outcomes, _, current = run(fleet(), 6, quiet, cycles=60, pods=Pods(ready=6), memory=learned)
    assert current == 6, "a scrape missing five of six pods reads as a quiet fleet"
    ok, reason, message = conditions(outcomes[-1])["MetricsAvailable"]
    assert (ok, reason) == (False, "PartialScrape")
    assert message.startswith("1 of 6 Ready pods report series")
    _, _, current = run(fleet(), 6, replace(quiet, reporting=6), cycles=60, pods=Pods(ready=6), memory=learned)
    assert current < 6, "the same numbers from every pod do scale down"


def test_pods_ready_for_less_than_a_scrape_interval_are_not_yet_expected_to_report() -> None:
    """Right after a scale-up, new pods are Ready before Prometheus has scraped them: not a partial scrape."""
    signals = replace(busy(1.0, waiting=0.0), reporting=3)
    just_ready = Pods(ready=5, ready_since=(T0 - timedelta(minutes=10),) * 3 + (T0 - timedelta(seconds=10),) * 2)
    outcomes, _, _ = run(fleet(), 5, signals, cycles=1, pods=just_ready)
    assert conditions(outcomes[-1])["MetricsAvailable"][:2] == (True, "SeriesPresent")
    outcomes, _, _ = run(fleet(), 5, signals, cycles=1, pods=just_ready, start=T0 + timedelta(minutes=2))
    assert conditions(outcomes[-1])["MetricsAvailable"][:3] == (
        False, "PartialScrape", "3 of 5 Ready pods report series, so the sums miss pods: the fleet may grow, not "
        "shrink (does Prometheus scrape every pod?)",
    )  # fmt: skip
