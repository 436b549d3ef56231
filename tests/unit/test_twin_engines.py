"""The fast (ticked, numpy) engine agrees with the fine (per-step) engine; speed is printed, not asserted."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from mmfleet_lab.twin import traffic
from mmfleet_lab.twin.compiled import CompiledEngine
from mmfleet_lab.twin.engine import Engine, Workload, least_outstanding
from mmfleet_lab.twin.fast import FastEngine
from mmfleet_lab.twin.fine import FineEngine
from mmfleet_lab.twin.replica import H200_QWEN25VL7B
from mmfleet_lab.twin.types import Requests

DATA = Path(__file__).resolve().parents[1] / "data"
P = H200_QWEN25VL7B


def workload(factor: float, seconds: float = 150.0, seed: int = 1) -> Requests:
    rng = np.random.default_rng(seed)
    req = traffic.load_azure(DATA / "azure2023_AzureLLMInferenceTrace_conv.csv").window(0.0, seconds)
    stats = traffic.load_token_stats(DATA / "servegen_client_token_stats_6h.csv")
    return traffic.scale_rate(traffic.add_images(req, stats, rng), factor, seconds, rng)


def drive(engine: Engine, work: Workload, replicas: int, seconds: float) -> float:
    for _ in range(replicas):
        engine.add_replica()
    eligible = np.arange(replicas)
    t0 = time.perf_counter()
    for s in range(int(seconds)):  # the fleet advances engines between 1 s events
        idx = np.nonzero((work.arrival >= s) & (work.arrival < s + 1))[0]
        engine.run(float(s), float(s + 1), idx, eligible)
    engine.run(seconds, seconds + 600.0, np.zeros(0, dtype=np.int64), eligible)
    return time.perf_counter() - t0


@pytest.mark.parametrize("factor", [4.0, 10.0])  # about 5 and 12 req/s per replica (mu_SLO at 10 s is ~17)
def test_fast_agrees_with_fine(factor: float) -> None:
    req = workload(factor)
    work = Workload.build(req, P)
    fine, fast = FineEngine(P, work), FastEngine(P, work)
    w_fine = drive(fine, work, 4, 150.0)
    w_fast = drive(fast, work, 4, 150.0)
    assert np.all(np.isfinite(fine.outcomes.e2e)) and np.all(np.isfinite(fast.outcomes.e2e))
    rows = []
    for metric in ("e2e", "ttft", "itl"):
        a = getattr(fine.outcomes, metric)
        b = getattr(fast.outcomes, metric)
        for q in (50, 90):
            fa, fb = float(np.percentile(a, q)), float(np.percentile(b, q))
            rows.append((metric, q, fa, fb, fb / fa - 1.0))
    for metric, q, fa, fb, err in rows:
        print(f"x{factor:g} {metric} P{q}: fine {fa:.4f} fast {fb:.4f} ({err:+.1%})")
    print(f"x{factor:g} {len(req)} requests on 4 replicas, 150 s: fine {w_fine:.2f} s, fast {w_fast:.2f} s wall")
    for metric, q, _, _, err in rows:
        if metric in ("e2e", "itl"):
            assert abs(err) <= 0.10, (metric, q, err)
    ttft = {q: err for metric, q, _, _, err in rows if metric == "ttft"}
    # TTFT is only ~30-110 ms here, so it gets a little more room
    assert abs(ttft[90]) <= 0.15 and abs(ttft[50]) <= 0.15, ttft
    # the metric books agree too: requests, tokens
    assert fast.book.rows[:, -3].sum() == pytest.approx(fine.book.rows[:, -3].sum())
    assert fast.book.rows[:, -1].sum() == pytest.approx(fine.book.rows[:, -1].sum(), rel=1e-6)


def test_least_outstanding_matches_one_at_a_time() -> None:
    rng = np.random.default_rng(3)
    for _ in range(50):
        counts = rng.integers(0, 6, size=int(rng.integers(1, 9)))
        k = int(rng.integers(0, 200))
        got = least_outstanding(counts, k)
        c = counts.copy()
        want = []
        for _ in range(k):
            j = int(np.argmin(c))
            want.append(j)
            c[j] += 1
        assert got.tolist() == want


@pytest.mark.parametrize("kind", [FastEngine, CompiledEngine])
def test_engine_speed_at_fleet_scale(kind: type[FastEngine] | type[CompiledEngine]) -> None:
    """A 20-replica fleet near mu_SLO for 120 s: printed as simulated seconds per wall second."""
    req = workload(60.0, seconds=120.0)  # ~330 req/s, the scaled Azure conv hour's mean
    work = Workload.build(req, P)
    eng = kind(P, work)
    for _ in range(20):
        eng.add_replica()
    t0 = time.perf_counter()
    for s in range(120):
        idx = np.nonzero((work.arrival >= s) & (work.arrival < s + 1))[0]
        eng.run(float(s), float(s + 1), idx, np.arange(20))
    wall = time.perf_counter() - t0
    print(
        f"{kind.__name__}: {len(req)} requests, 20 replicas, 120 simulated s in {wall:.2f} s wall "
        f"= {120 / wall:.0f} simulated s per wall s ({len(req) / wall:.0f} requests/s)"
    )
    assert np.isfinite(eng.outcomes.e2e).mean() > 0.9


def test_fast_engine_kv_books_match_the_decodes_they_hold() -> None:
    """The KV the engine books for decodes equals what those decodes hold, tick after tick.

    A finished decode used to be charged the tokens of the whole tick, so the books drifted
    by a few tokens per request until, after ~26 simulated minutes of a 31-replica fleet,
    requests stopped finishing.
    """
    req = workload(10.0, seconds=150.0)
    work = Workload.build(req, P)
    eng = FastEngine(P, work)
    for _ in range(4):
        eng.add_replica()
    for s in range(150):
        idx = np.nonzero((work.arrival >= s) & (work.arrival < s + 1))[0]
        eng.run(float(s), float(s + 1), idx, np.arange(4))
        held = np.bincount(eng.d_rid, weights=eng.d_kvb + eng.z[eng.d_rid], minlength=4)
        assert eng.kv_dec == pytest.approx(held, abs=1e-3), s
