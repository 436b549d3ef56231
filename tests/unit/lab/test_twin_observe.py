"""The observation pipeline: PromQL semantics, scrape timing, missing data and Prometheus outages."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mmfleet_lab.twin import H200_QWEN25VL7B, Scenario, simulate
from mmfleet_lab.twin.observe import (
    E2E_BUCKETS,
    LAYOUT,
    MetricBook,
    MetricView,
    Prometheus,
    extrapolated_rate,
    histogram_quantile,
    query,
)
from tests.helpers.twin import SLO, Script, steady


def test_histogram_quantile_hand_computed() -> None:
    bounds = (1.0, 2.0, 4.0)
    cum = np.array([2.0, 6.0, 8.0, 10.0])  # le=1: 2, le=2: 6, le=4: 8, +Inf: 10
    assert histogram_quantile(0.5, bounds, cum) == pytest.approx(1.75)  # rank 5: 1 + (2-1) * (5-2)/(6-2)
    assert histogram_quantile(0.1, bounds, cum) == pytest.approx(0.5)  # rank 1 in the first bucket, from 0
    assert histogram_quantile(0.7, bounds, cum) == pytest.approx(3.0)  # rank 7: 2 + 2 * (7-6)/(8-6)
    assert histogram_quantile(0.9, bounds, cum) == 4.0  # rank 9 is in +Inf: the largest finite bound
    assert math.isnan(histogram_quantile(0.5, bounds, np.zeros(4)))
    assert histogram_quantile(1.5, bounds, cum) == math.inf and histogram_quantile(-1, bounds, cum) == -math.inf


def test_rate_extrapolates_like_prometheus() -> None:
    times = np.array([0.0, 15.0, 30.0, 45.0])
    # a counter starting at 0: extrapolation to the window start stops at zero, 5 s to the end
    r = extrapolated_rate(times, np.array([[0.0], [15.0], [30.0], [45.0]]), t=50.0, window=60.0)
    assert r is not None and r[0] == pytest.approx(45.0 * (45.0 + 0.0 + 5.0) / 45.0 / 60.0)
    # from 100: 10 s back to the window start (under 1.1 x 15 s), 5 s to the end
    r = extrapolated_rate(times, np.array([[100.0], [115.0], [130.0], [145.0]]), t=50.0, window=60.0)
    assert r is not None and r[0] == pytest.approx(45.0 * 60.0 / 45.0 / 60.0)
    # 25 s after the last sample is more than 1.1 x the spacing: only half a spacing (7.5 s) at the end
    r = extrapolated_rate(times, np.array([[100.0], [115.0], [130.0], [145.0]]), t=70.0, window=80.0)
    assert r is not None and r[0] == pytest.approx(45.0 * (45.0 + 10.0 + 7.5) / 45.0 / 80.0)
    # counter reset (pod restart): the drop is added back
    r = extrapolated_rate(times, np.array([[0.0], [15.0], [5.0], [20.0]]), t=45.0, window=45.0)
    assert r is not None and r[0] == pytest.approx(35.0 / 45.0)
    assert extrapolated_rate(times[:1], np.array([[1.0]]), t=45.0, window=60.0) is None


def test_book_and_prometheus_sum_over_pods() -> None:
    book = MetricBook()
    a, b = book.add_replica(), book.add_replica()
    prom = Prometheus()
    for t in (0.0, 15.0, 30.0, 45.0, 60.0):
        prom.scrape(t, [(a, book.export(a), (1.0, 2.0, 0.5)), (b, book.export(b), (3.0, 0.0, 0.1))])
        book.observe("e2e", np.array([a, b]), np.array([0.4, 3.0]))  # one request each per 15 s
        book.observe("ttft", np.array([a, b]), np.array([0.1, 0.3]))
        book.add(LAYOUT.success, np.array([a, b]), 1.0)
    view = query(prom, 60.0, slo_metric="e2e", slo_percentile=50, slo_window=60.0, rate_window=60.0)
    assert view.request_rate == pytest.approx(2 * 3.0 / 45.0 * (45.0 + 15.0) / 45.0 * 45.0 / 60.0, rel=1e-9)
    assert view.running == 4.0 and view.waiting == 2.0 and view.kv_cache_usage == pytest.approx(0.3)
    # half the observations in (0.3, 0.5], half in (2.5, 5]: the median is the top of the (0.3, 0.5] bucket
    assert view.latency == pytest.approx(0.5)
    assert E2E_BUCKETS[1] == 0.5
    # Dynamo's correction reads the mean, rate(_sum) / rate(_count), not a bucket bound
    assert view.mean_ttft == pytest.approx(0.2) and view.mean_itl is None


def test_missing_names_the_absent_series_as_the_operator_does() -> None:
    """A NaN latency (series present, nothing finished) is not missing; no series is."""
    book = MetricBook()
    pod = book.add_replica()
    prom = Prometheus()

    def ask(t: float) -> MetricView:
        return query(prom, t, slo_metric="e2e", slo_percentile=90, slo_window=60.0, rate_window=60.0)

    assert ask(0.0).missing == (
        "vllm:e2e_request_latency_seconds_bucket", "vllm:request_success_total", "vllm:num_requests_waiting",
        "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
    )  # fmt: skip
    prom.scrape(0.0, [(pod, book.export(pod), (0.0, 0.0, 0.0))])
    one = ask(0.0)  # gauges from the first scrape; a rate needs two
    assert one.missing == ("vllm:e2e_request_latency_seconds_bucket", "vllm:request_success_total")
    prom.scrape(15.0, [(pod, book.export(pod), (0.0, 0.0, 0.0))])
    idle = ask(15.0)
    assert idle.missing == () and idle.latency is None and idle.request_rate == 0.0


def test_missing_until_two_scrapes_and_outage() -> None:
    pol = Script([], interval=5.0)
    simulate(
        Scenario("t", steady(4.0, 200.0), 200.0),
        pol,
        params=H200_QWEN25VL7B,
        cold_start=30.0,
        slo=SLO,
        initial_replicas=1,
        metrics_outage=(60.0, 120.0),
    )
    by_t = {o.time: o for o in pol.seen}
    for t in (5.0, 10.0):  # one scrape (t=0) only
        assert by_t[t].request_rate is None and by_t[t].latency is None and not by_t[t].metrics_available
        assert by_t[t].running is not None  # gauges exist from the first scrape
    assert by_t[15.0].request_rate is not None and by_t[30.0].metrics_available
    assert by_t[55.0].metrics_available
    for t in (60.0, 90.0, 115.0):  # Prometheus down: nothing at all
        o = by_t[t]
        assert o.request_rate is None and o.latency is None and o.waiting is None and o.kv_cache_usage is None
        assert o.extra["prometheus_up"] == 0.0 and o.ready == 1
    assert by_t[120.0].request_rate is None  # back, but a single fresh scrape in the window
    assert by_t[135.0].metrics_available
    lat = by_t[150.0].latency
    assert lat is not None and 0.3 < lat < 10.0
