"""The twin's engines checked against each other, and the prefix-sharing workload the routing tests run."""

from __future__ import annotations

import math

import numpy as np

from mmfleet_lab.twin import Requests, traffic
from mmfleet_lab.twin.compiled import CompiledEngine
from mmfleet_lab.twin.engine import LEAST_OUTSTANDING, Engine, Router, Workload
from mmfleet_lab.twin.observe import HISTOGRAMS
from mmfleet_lab.twin.replica import ReplicaParams
from mmfleet_lab.twin.scenarios import traces_dir
from tests.helpers.twin_reference import FineEngine

RTOL = 1e-9
HIST_SUMS = [off + len(bounds) + 1 for off, bounds in HISTOGRAMS.values()]
MOONCAKE = "mooncake_fast25_conversation_trace_30min.jsonl"


def assert_same_outcomes(fine: Engine, comp: Engine) -> None:
    for metric in ("e2e", "ttft", "itl"):
        a, b = getattr(fine.outcomes, metric), getattr(comp.outcomes, metric)
        assert np.array_equal(np.isfinite(a), np.isfinite(b)), metric
        ok = np.isfinite(a)
        np.testing.assert_allclose(b[ok], a[ok], rtol=RTOL, atol=0, err_msg=metric)


def assert_same_counters(a: np.ndarray, b: np.ndarray) -> None:
    """Bucket counts and token/request counters exactly; histogram ``_sum``s to RTOL."""
    sums = np.zeros(a.shape[-1], dtype=bool)
    sums[HIST_SUMS] = True
    assert np.array_equal(a[..., ~sums], b[..., ~sums])
    np.testing.assert_allclose(b[..., sums], a[..., sums], rtol=RTOL)


def lockstep(
    params: ReplicaParams,
    req: Requests,
    replicas: int,
    seconds: float,
    timeout: float = math.inf,
    router: Router = LEAST_OUTSTANDING,
) -> tuple[FineEngine, CompiledEngine]:
    """Both engines through the same arrivals; every 15 s the scraped counters and gauges must agree."""
    work = Workload.build(req, params, timeout)
    fine, comp = FineEngine(params, work, router), CompiledEngine(params, work, router=router)
    for eng in (fine, comp):
        for _ in range(replicas):
            eng.add_replica()
    eligible = np.arange(replicas)
    for s in range(int(seconds) + 300):
        idx = np.nonzero((work.arrival >= s) & (work.arrival < s + 1))[0]
        for eng in (fine, comp):
            eng.run(float(s), float(s + 1), idx, eligible)
        if s % 15 == 14:
            assert np.array_equal(fine.outstanding(), comp.outstanding()), s
            for rid in range(replicas):
                assert_same_counters(fine.book.export(rid), comp.book.export(rid))
                np.testing.assert_allclose(comp.gauges(rid), fine.gauges(rid), rtol=RTOL)
    return fine, comp


def conversation(seconds: float, seed: int = 1) -> Requests:
    """The Mooncake conversation trace's first ``seconds`` with images on its shared blocks."""
    d = traces_dir()
    req = traffic.load_mooncake(d / MOONCAKE).window(0.0, seconds)
    stats = traffic.load_token_stats(d / "servegen_client_token_stats_6h.csv")
    return traffic.add_shared_images(req, stats, np.random.default_rng(seed))
