"""The compiled engine reproduces the reference engine (``tests/helpers/twin_reference.py``): per-request
latencies, metric books, gauges, scaling.

The comparisons allow 1e-9 relative: on x86-64 the two are bit-identical, but a platform whose C
compiler fuses multiply-adds (numpy's ``interp`` on aarch64) may differ in the last bits. Speed is
printed, not asserted.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest

from mmfleet_lab.twin import H200_QWEN25VL7B, Requests, Scenario, simulate, traffic
from mmfleet_lab.twin.compiled import CompiledEngine
from mmfleet_lab.twin.engine import Workload
from mmfleet_lab.twin.replica import GIB
from tests.helpers.repo import DATA
from tests.helpers.twin import SLO, Script, steady
from tests.helpers.twin_checks import RTOL, assert_same_counters, assert_same_outcomes, lockstep
from tests.helpers.twin_reference import FineEngine, ReplicaEngine

P = H200_QWEN25VL7B


def workload(factor: float, seconds: float = 150.0, seed: int = 1) -> Requests:
    """The Azure conversation trace's first ``seconds`` with ServeGen's images, ``factor`` times as fast."""
    rng = np.random.default_rng(seed)
    req = traffic.load_azure(DATA / "azure2023_AzureLLMInferenceTrace_conv.csv").window(0.0, seconds)
    stats = traffic.load_token_stats(DATA / "servegen_client_token_stats_6h.csv")
    return traffic.scale_rate(traffic.add_images(req, stats, rng), factor, seconds, rng)


@pytest.mark.parametrize("factor", [4.0, 16.0, 25.0])  # ~4, ~16 (mu_SLO 14) and ~25 req/s per replica (overload)
def test_compiled_matches_fine(factor: float) -> None:
    req = workload(factor)
    t0 = time.perf_counter()
    fine, comp = lockstep(P, req, 4, 150.0)
    wall = time.perf_counter() - t0
    assert_same_outcomes(fine, comp)
    assert_same_counters(fine.book.rows, comp.book.rows)
    for metric in ("e2e", "ttft", "itl"):
        a, b = getattr(fine.outcomes, metric), getattr(comp.outcomes, metric)
        ok = np.isfinite(a)
        worst = float(np.max(np.abs(b[ok] / a[ok] - 1.0), initial=0.0, where=a[ok] > 0))
        p = np.percentile(a[ok], [50, 90])
        print(f"x{factor:g} {metric}: fine P50 {p[0]:.4f} P90 {p[1]:.4f}; largest relative difference {worst:.1e}")
    print(f"x{factor:g} {len(req)} requests on 4 replicas, 150 s: both engines {wall:.2f} s wall")


def test_compiled_matches_fine_with_two_api_processes() -> None:
    """Two API processes per replica, each with its own CPU queue and pass grid (spaced by the replica's running
    requests / 2): the engines agree, and the pass holds image requests back (TTFT against no pass)."""
    params = replace(P, api_server_count=2)
    req = workload(16.0, seconds=60.0)
    fine, comp = lockstep(params, req, 4, 60.0)
    assert_same_outcomes(fine, comp)
    assert_same_counters(fine.book.rows, comp.book.rows)
    _, bare = lockstep(replace(params, api_pass_ms=0.0), req, 4, 60.0)
    image = req.images > 0
    assert comp.outcomes.ttft[image].mean() > bare.outcomes.ttft[image].mean() + 0.005


def test_compiled_matches_fine_under_kv_pressure(monkeypatch: pytest.MonkeyPatch) -> None:
    """A small KV cache, few seats and a small token budget: chunked prompts, preemption by recompute,
    and prompts that can never fit (dropped, latency inf)."""
    params = replace(P, gpu_memory_bytes=21.5 * GIB, max_num_seqs=256, max_num_batched_tokens=2048)
    req = workload(4.0, seconds=60.0)
    preempted = 0
    preempt = ReplicaEngine._preempt

    def counting(self: ReplicaEngine) -> None:
        nonlocal preempted
        before = len(self.running)
        preempt(self)
        preempted += before - len(self.running)

    monkeypatch.setattr(ReplicaEngine, "_preempt", counting)
    fine, comp = lockstep(params, req, 2, 60.0)
    assert preempted > 1000
    too_big = Workload.build(req, params).prompt > params.kv_capacity_tokens
    assert too_big.any() and np.all(np.isinf(comp.outcomes.e2e[too_big]))
    assert_same_outcomes(fine, comp)
    assert_same_counters(fine.book.rows, comp.book.rows)


def test_compiled_matches_fine_with_timeouts() -> None:
    """Overload with a 4 s client timeout: requests abandoned while queued and after their first token."""
    req = workload(25.0, seconds=60.0)
    fine, comp = lockstep(P, req, 2, 60.0, timeout=4.0)
    e2e, ttft = comp.outcomes.e2e, comp.outcomes.ttft
    assert np.isinf(e2e).sum() > 1000  # abandoned ...
    assert (np.isfinite(ttft) & np.isinf(e2e)).sum() > 100  # ... some after their first token
    assert np.all(e2e[np.isfinite(e2e)] < 4.0 + 0.5)  # nothing finishes long after its deadline
    assert_same_outcomes(fine, comp)
    assert_same_counters(fine.book.rows, comp.book.rows)


def test_simulate_with_scaling_matches_fine() -> None:
    """Through the fleet: pods added past the engine's initial room, drained, and held at the gateway
    (from 45 s to 54 s, with a 6 s client timeout: those that arrived before 48 s give up there, most of
    the rest in the burst on two fresh replicas; from 53 s all are served)."""
    req = steady(40.0, 60.0, inp=800, out=150)
    script = [(5.0, 10), (30.0, 3), (45.0, 0), (50.0, 2)]
    runs = {
        kind: simulate(
            Scenario("t", req, 60.0),
            Script(list(script)),
            params=P,
            slo=SLO,
            cold_start=4.0,
            initial_replicas=2,
            min_replicas=0,
            timeout=6.0,
            engine=kind,
        )
        for kind in (FineEngine, CompiledEngine)
    }
    a, b = runs[FineEngine], runs[CompiledEngine]
    assert a.ready.max() == 10 and a.decisions == b.decisions
    gave_up = (req.arrival >= 45.0) & (req.arrival < 48.0)
    assert gave_up.sum() > 100 and np.isinf(a.e2e[gave_up]).all() and np.isfinite(a.e2e[req.arrival >= 53.0]).all()
    assert np.array_equal(a.ready, b.ready) and np.array_equal(a.draining, b.draining)
    for metric in ("e2e", "ttft", "itl"):
        x, y = getattr(a, metric), getattr(b, metric)
        assert np.array_equal(np.isfinite(x), np.isfinite(y))
        np.testing.assert_allclose(y[np.isfinite(x)], x[np.isfinite(x)], rtol=RTOL)
    assert a.gpu_seconds == b.gpu_seconds


def test_speed_at_fleet_scale() -> None:
    """A 20-replica fleet near mu_SLO for 120 s: printed as simulated seconds per wall second."""
    req = workload(60.0, seconds=120.0)  # ~330 req/s, the scaled Azure conv hour's mean
    work = Workload.build(req, P)
    eng = CompiledEngine(P, work)
    for _ in range(20):
        eng.add_replica()
    t0 = time.perf_counter()
    for s in range(120):
        idx = np.nonzero((work.arrival >= s) & (work.arrival < s + 1))[0]
        eng.run(float(s), float(s + 1), idx, np.arange(20))
    wall = time.perf_counter() - t0
    print(f"{len(req)} requests, 20 replicas, 120 simulated s in {wall:.2f} s wall ({120 / wall:.0f}x real time)")
    assert np.isfinite(eng.outcomes.e2e).mean() > 0.9
