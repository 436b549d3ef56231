"""Trace loading, arrival synthesis, multimodal mixes, rate scaling and spikes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mmfleet_lab.twin import traffic
from mmfleet_lab.twin.types import Requests
from tests.helpers.repo import DATA


def conv() -> Requests:
    return traffic.load_azure(DATA / "azure2023_AzureLLMInferenceTrace_conv.csv")


def stats() -> traffic.TokenStats:
    return traffic.load_token_stats(DATA / "servegen_client_token_stats_6h.csv")


def test_load_azure() -> None:
    req = conv()
    assert len(req) == 1445
    assert req.arrival[0] == 0.0 and np.all(np.diff(req.arrival) >= 0)
    assert 290 < req.arrival[-1] < 300
    # first rows: 18:15:46.68059 (374, 44), then 18:15:50.995169 (396, 109)
    assert req.input_tokens[:2].tolist() == [374, 396] and req.output_tokens[:2].tolist() == [44, 109]
    assert req.arrival[1] == pytest.approx(4.314579, abs=1e-6)
    assert not np.any(req.images)


def test_load_csv_generic_columns(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_text("ms,prompt,answer,pics\n2000,10,5,1\n1000,20,,0\n3500,30,7,2\n")
    req = traffic.load_csv(
        f, time_col="ms", input_col="prompt", output_col="answer", images_col="pics", default_output=99, time_scale=1e-3
    )
    assert req.arrival.tolist() == [0.0, 1.0, 2.5]
    assert req.input_tokens.tolist() == [20, 10, 30]
    assert req.output_tokens.tolist() == [99, 5, 7]
    assert req.images.tolist() == [0, 1, 2]
    only_time = traffic.load_csv(f, time_col="ms", default_input=64)
    assert only_time.input_tokens.tolist() == [64, 64, 64] and not np.any(only_time.images)
    with pytest.raises(ValueError, match="no column"):
        traffic.load_csv(f, time_col="when")


def test_arrivals_from_servegen_rate() -> None:
    starts, rates = traffic.load_rate_series(DATA / "servegen_aggregate_rate_10min.csv")
    assert starts.size == 144 and rates[0] == pytest.approx(5.558333)
    rng = np.random.default_rng(0)
    t = traffic.arrivals_from_rate(starts[6:12], rates[6:12], 3600.0, rng)
    expected = float((rates[6:12] * 600).sum())
    assert abs(t.size - expected) < 4 * np.sqrt(expected)
    for k in range(6):  # each 10-minute window gets its own rate
        n = np.sum((t >= 600 * k) & (t < 600 * (k + 1)))
        assert abs(n - rates[6 + k] * 600) < 5 * np.sqrt(rates[6 + k] * 600)
    bursty = traffic.arrivals_from_rate(starts[:1], rates[:1], 3600.0, np.random.default_rng(1), cv=3.0)
    gaps = np.diff(bursty)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.25)


def test_servegen_mix_and_added_images() -> None:
    st = stats()
    rng = np.random.default_rng(0)
    text, out, images, per = st.sample(20000, rng)
    # the table's medians over client-windows: 69 text tokens, 360 tokens per image, 1 image, 41 output tokens
    assert 30 < np.median(text) < 150 and 200 < np.median(per[images > 0]) < 800
    assert np.median(images) == 1 and 20 < np.median(out) < 100
    req = traffic.add_images(conv(), st, np.random.default_rng(1), probability=0.3)
    share = np.mean(req.images > 0)
    assert share == pytest.approx(0.3, abs=0.04)
    assert np.all(req.tokens_per_image[req.images > 0] >= 1) and np.all(req.tokens_per_image[req.images == 0] == 0)
    assert np.all(req.prompt_tokens >= req.input_tokens)


def test_quantile_sampler_matches_mean_and_median() -> None:
    u = np.linspace(0, 1, 200001)
    x = np.interp(u, *traffic._quantile_sampler(120.0, 80.0, 200.0, 400.0))
    assert np.median(x) == pytest.approx(80.0, rel=0.01) and x.mean() == pytest.approx(120.0, rel=0.01)
    # a mean too low for these quantiles cannot be matched: the lower tail is clipped at 1 token
    y = np.interp(u, *traffic._quantile_sampler(60.0, 80.0, 200.0, 400.0))
    assert y.min() == 1.0 and np.median(y) == pytest.approx(80.0, rel=0.01)


def test_scale_rate_keeps_the_mix() -> None:
    req = conv()
    rng = np.random.default_rng(0)
    for factor in (0.5, 3.0, 7.4):
        s = traffic.scale_rate(req, factor, 300.0, rng)
        assert abs(len(s) - factor * len(req)) < 4 * np.sqrt(factor * len(req)) + 1
        assert np.all(np.diff(s.arrival) >= 0) and s.arrival.min() >= 0 and s.arrival.max() < 300
        assert np.mean(s.input_tokens) == pytest.approx(np.mean(req.input_tokens), rel=0.1)


def counts_per_window(req: Requests, edges: np.ndarray) -> np.ndarray:
    return np.histogram(req.arrival, bins=edges)[0].astype(float)


def test_scale_rate_draws_independent_arrivals() -> None:
    """Scaled traffic is Poisson-like second to second (not the trace's bursts multiplied) while
    following the trace's rate curve at minute scale."""
    req = conv()
    factor = 20.0
    s = traffic.scale_rate(req, factor, 300.0, np.random.default_rng(3))
    sec = np.arange(0.0, 301.0, 1.0)
    orig = counts_per_window(req, sec)
    scaled = counts_per_window(s, sec)
    # per-second counts scatter around the smoothed rate like Poisson: CV close to 1 / sqrt(mean)
    lam = factor * traffic.smoothed_rate(req, 300.0)
    z = (scaled - lam) / np.sqrt(lam)
    assert z.std() == pytest.approx(1.0, abs=0.15)
    # copies of the trace would keep its per-second CV (about 0.5 here); independent arrivals average it out
    assert scaled.std() / scaled.mean() < 0.5 * orig.std() / orig.mean()
    # the rate curve per minute follows the original's, times the factor
    minute = np.arange(0.0, 301.0, 60.0)
    ratio = counts_per_window(s, minute) / (factor * counts_per_window(req, minute))
    assert np.all(np.abs(ratio - 1.0) < 0.12), ratio
    # the mix is resampled from the trace's requests
    assert set(np.unique(s.input_tokens)) <= set(np.unique(req.input_tokens))


def test_smoothed_rate_integrates_to_the_trace() -> None:
    req = conv()
    rate = traffic.smoothed_rate(req, 300.0)
    assert rate.size == 300 and np.all(rate >= 0)
    assert rate.sum() == pytest.approx(len(req))


@pytest.mark.parametrize("height", [2.0, 4.0, 8.0])
def test_step_spike_multiplies_rate_only_in_its_window(height: float) -> None:
    base = traffic.scale_rate(conv(), 4.0, 300.0, np.random.default_rng(0))
    spiked = traffic.add_spike(
        base, 100.0, 200.0, traffic.step_multiplier(100.0, 200.0, height), np.random.default_rng(1)
    )
    edges = np.arange(0.0, 301.0, 20.0)
    ratio = counts_per_window(spiked, edges) / counts_per_window(base, edges)
    inside = (edges[:-1] >= 100) & (edges[:-1] < 200)
    assert np.all(ratio[~inside] == 1.0)
    assert np.all(np.abs(ratio[inside] - height) < 0.25 * height), ratio
    extra = spiked.input_tokens.size - base.input_tokens.size
    assert extra == pytest.approx((height - 1) * np.sum(inside * counts_per_window(base, edges)), rel=0.1)
    # the extra arrivals are independent: per-second counts in the spike scatter like Poisson around
    # height x the base's smoothed rate (extras clustered around base arrivals would scatter far more)
    sec = np.arange(100.0, 201.0, 1.0)
    lam = height * traffic.smoothed_rate(base, 300.0)[100:200]
    z = (counts_per_window(spiked, sec) - lam) / np.sqrt(lam)
    assert z.std() < 1.35, z.std()


def test_ramp_and_flash() -> None:
    base = traffic.scale_rate(conv(), 4.0, 300.0, np.random.default_rng(0))
    ramp = traffic.add_spike(
        base, 60.0, 240.0, traffic.ramp_multiplier(60.0, 60.0, 240.0, 4.0), np.random.default_rng(1)
    )
    edges = np.array([0.0, 60.0, 80.0, 100.0, 120.0, 240.0, 300.0])
    r = counts_per_window(ramp, edges) / counts_per_window(base, edges)
    assert r[0] == 1.0 and r[-1] == 1.0
    assert r[1] < r[2] < r[3] < 4.0 * 1.2 and r[4] == pytest.approx(4.0, rel=0.15)
    flash = traffic.add_spike(base, 150.0, 240.0, traffic.step_multiplier(150.0, 240.0, 8.0), np.random.default_rng(2))
    edges = np.array([0.0, 150.0, 240.0, 300.0])
    f = counts_per_window(flash, edges) / counts_per_window(base, edges)
    assert f[0] == 1.0 and f[2] == 1.0 and f[1] == pytest.approx(8.0, rel=0.1)


def test_requests_validation() -> None:
    with pytest.raises(ValueError, match="sorted"):
        Requests(np.array([1.0, 0.0]), np.ones(2), np.ones(2), np.zeros(2))
    with pytest.raises(ValueError, match="entries"):
        Requests(np.array([0.0, 1.0]), np.ones(3), np.ones(2), np.zeros(2))


def test_a_users_request_trace_with_only_timestamps_gets_the_servegen_mix(tmp_path: Path) -> None:
    from mmfleet_lab.twin.scenarios import TraceFile

    path = tmp_path / "mine.csv"
    times_ms = np.sort(np.random.default_rng(0).uniform(0, 600_000, size=3000)).round()
    path.write_text("ts_ms,prompt\n" + "".join(f"{t:.0f},{100 + i % 7}\n" for i, t in enumerate(times_ms)))
    stats = traffic.load_token_stats(DATA / "servegen_client_token_stats_6h.csv")
    trace = TraceFile(str(path), time_column="ts_ms", input_column="prompt", time_scale=0.001)
    req, duration = trace.requests(stats, np.random.default_rng(1))
    assert len(req) == 3000
    assert 590 <= duration <= 600  # seconds, rebased to the first request
    assert set(np.unique(req.input_tokens)) <= set(range(100, 107))  # the file's column is kept
    assert req.output_tokens.std() > 0  # the missing output column comes from the mix, not a constant
    assert 0.1 < np.mean(req.images > 0) < 0.5  # and images at ServeGen's share


def test_a_users_count_series_becomes_arrivals_at_those_counts(tmp_path: Path) -> None:
    from mmfleet_lab.twin.scenarios import TraceFile

    path = tmp_path / "counts.csv"
    counts = [600, 600, 3000, 600]  # requests per minute: 10, 10, 50, 10 req/s
    path.write_text("minute,requests\n" + "".join(f"{60 * i},{c}\n" for i, c in enumerate(counts)))
    stats = traffic.load_token_stats(DATA / "servegen_client_token_stats_6h.csv")
    trace = TraceFile(str(path), time_column="minute", count_column="requests")
    req, duration = trace.requests(stats, np.random.default_rng(2))
    assert duration == 240.0
    per_minute, _ = np.histogram(req.arrival, bins=[0, 60, 120, 180, 240])
    assert np.allclose(per_minute, counts, rtol=0.1)
