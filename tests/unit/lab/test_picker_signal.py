"""The picker-signal bench (``bench.picker_signal``) and what it needs of the twin: the burst, the servers' clock,
the picker's held and refused requests, and the lab variant's signal."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from mmfleet.api import SloSpec
from mmfleet.routing import picker_config
from mmfleet_lab.bench import picker_signal
from mmfleet_lab.bench.routing import SPLITS, Sizing
from mmfleet_lab.twin import H200_QWEN25VL7B, Requests
from mmfleet_lab.twin.compiled import CompiledEngine
from mmfleet_lab.twin.engine import Workload
from mmfleet_lab.twin.observe import LAYOUT, TTFT_BUCKETS, MetricView
from mmfleet_lab.twin.picker import router
from mmfleet_lab.twin.shipped import fleet, signals
from tests.helpers.twin_checks import conversation

P = H200_QWEN25VL7B
SLO = SloSpec(metric="ttft", target="2s")


def test_compress_plays_the_window_faster_and_keeps_every_request() -> None:
    req = Requests(np.arange(10.0) * 10.0, np.full(10, 100.0), np.full(10, 10.0), np.zeros(10))
    out, saved = picker_signal.compress(req, picker_signal.Spike(onset=20.0, length=10.0, factor=3.0))
    assert saved == 20.0 and len(out) == len(req)
    # 20, 30, 40 (the trace's [20, 50)) come in [20, 30); the rest 20 s earlier
    np.testing.assert_allclose(out.arrival, [0, 10, 20, 20 + 10 / 3, 20 + 20 / 3, 30, 40, 50, 60, 70])
    np.testing.assert_array_equal(out.input_tokens, req.input_tokens)


def overloaded(server_clock: bool) -> CompiledEngine:
    """One replica, three times the trace's rate, mmfleet's picker with flow control and a 5 s TTL."""
    req = conversation(60.0).take(np.arange(150))
    req = Requests(req.arrival / 3.0, req.input_tokens, req.output_tokens, req.images, req.image_tokens, req.prefix)
    rt = replace(router(picker_config(fleet(SLO, 1, 8, 0.3), 120.0)), request_ttl=5.0)
    eng = CompiledEngine(P, Workload.build(req, P), placement=True, router=rt, server_clock=server_clock)
    eng.add_replica()
    eng.run(0.0, 20.0, np.arange(len(req)), np.array([0]))
    assert eng.held() > 0  # mid-burst, the picker holds requests
    eng.run(20.0, 400.0, np.zeros(0, dtype=np.int64), np.array([0]))
    return eng


def test_server_clock_leaves_the_hold_out_of_the_servers_histogram() -> None:
    """The clients see the same TTFTs either way; the servers' TTFT sum lacks the hold in the picker with it."""
    sums, ttft = {}, {}
    for clock in (False, True):
        eng = overloaded(clock)
        served, _ = eng.placement(np.arange(150))
        refused = int((served < 0).sum())
        assert eng.held() == 0 and eng.rejected() == refused > 0  # the TTL refused the never-sent ones
        sums[clock] = float(eng.book.export(0)[LAYOUT.ttft + len(TTFT_BUCKETS) + 1])
        ttft[clock] = eng.outcomes.ttft.copy()
    np.testing.assert_array_equal(ttft[False], ttft[True])
    assert sums[True] < sums[False] == pytest.approx(float(np.sum(ttft[False][np.isfinite(ttft[False])])))


def test_picker_held_counts_as_waiting() -> None:
    view = MetricView(latency=1.0, request_rate=2.0, waiting=3.0, running=4.0, kv_cache_usage=0.5)
    assert signals(view).waiting == 3.0
    assert signals(view, 5.0).waiting == 8.0
    assert signals(MetricView(), 5.0).waiting is None


def test_the_overload_plays_the_rest_of_each_split_twice_as_fast() -> None:
    for role in ("train", "test"):
        steady = picker_signal.overload(role)
        assert steady.onset + steady.factor * steady.length == SPLITS[role][1] - SPLITS[role][0]
        assert steady.factor == 2.0


def test_bench_writes_both_cells(tmp_path: Path) -> None:
    """One seed of each cell, each cell and variant on a row of its own, with the requests it held."""
    docs = tmp_path / "benchmarks.md"
    assert picker_signal.main(docs, Sizing(capacity=0.3, replicas=10), lambda _: None, [0], 1) == 0
    text = docs.read_text()
    assert "`mmfleet bench routing --spike --seed 0`" in text and "played in 300 s (x2)" in text
    rows = [line for line in text.splitlines() if line.startswith("| burst") or line.startswith("| overload")]
    cells = {tuple(c.strip() for c in row.strip("|").split("|")[:2]) for row in rows}
    assert cells == {(c, v) for c in picker_signal.CELLS for v in picker_signal.VARIANTS}
    burst = next(row for row in rows if row.startswith("| burst"))
    assert int(burst.strip("|").split("|")[-2]) > 0, "the burst's x15 holds requests in the picker"
