"""``mmfleet bench routing``: its splits, the resource its mmfleet row is rendered from, its bound, its section."""

from __future__ import annotations

import functools
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from mmfleet_lab.bench import routing
from mmfleet_lab.bench.baselines.static import StaticPolicy
from mmfleet_lab.twin import H200_QWEN25VL7B, Requests, Scenario, Shipped, simulate
from mmfleet_lab.twin.compiled import CompiledEngine
from mmfleet_lab.twin.types import PrefixChains


def test_splits_are_apart_and_test_is_last() -> None:
    spans = [routing.SPLITS[r] for r in ("train", "validation", "test")]
    assert all(a[1] <= b[0] for a, b in pairwise(spans))
    req = routing.requests(0)
    assert spans[-1][1] - 60.0 < req.arrival[-1] < spans[-1][1]  # the slice ends with the test minutes


def test_resource_takes_every_request_of_the_trace() -> None:
    """The fleet routes through the picker and its maxModelLen takes the trace's longest request."""
    size = routing.Sizing(capacity=0.5, replicas=4)
    inference = routing.resource(size)
    req = routing.requests(0)
    assert inference.spec.routing.mode == "inferencePool"
    assert inference.spec.backend.max_model_len >= float(np.max(req.prompt_tokens + req.output_tokens))
    mmfleet = routing.routers(size, 0)["mmfleet"]
    assert mmfleet.window_chars == 4 * routing.MAX_MODEL_LEN and mmfleet.flow_control
    assert mmfleet.queue_depth == 1  # 0.5 req/s x the 2 s target, at least one


def test_solo_finds_every_earlier_prompt_in_its_cache() -> None:
    """Two requests sharing two 512-token blocks of three: alone, the second finds 1,024 of its 1,536 tokens."""
    chains = PrefixChains(512, np.array([0, 3, 6]), np.array([1, 2, 3, 1, 2, 4]), np.full(6, 2048), np.zeros(2))
    req = Requests(np.array([0.0, 1.0]), np.full(2, 1536.0), np.full(2, 10.0), np.zeros(2), prefix=chains)
    assert list(routing.solo(req, 0).cached) == [0.0, 1024.0]


def test_no_router_beats_solo_on_any_request() -> None:
    """Three minutes of the test trace on the bench's fleet, fixed and autoscaled: every router's TTFT of every
    request is at least its TTFT in ``solo``, and within 5 % of it for most requests, so a bound set too high fails
    and one set far too low fails too."""
    req = routing.requests(0).window(900.0, 1080.0)
    size = routing.Sizing(capacity=0.3, replicas=10)
    floor = routing.solo(req, 0).ttft
    for name, choose in routing.routers(size, 0).items():
        for policy in (StaticPolicy(size.replicas), Shipped(capacity_per_replica=size.capacity)):
            result = simulate(
                Scenario("three minutes", req, 180.0), policy, params=H200_QWEN25VL7B, cold_start=120.0,
                slo=routing.SLO, max_replicas=2 * size.replicas, initial_replicas=size.replicas,
                engine=functools.partial(CompiledEngine, router=choose),
            )  # fmt: skip
            assert np.all(result.ttft >= floor - 1e-9), (name, policy)
            assert np.mean(result.ttft <= 1.05 * floor) > 0.5, (name, policy)


def test_solo_refuses_a_gap_its_requests_overlap() -> None:
    req = routing.requests(0).window(900.0, 960.0)
    with pytest.raises(ValueError, match="not less than the 0 s gap"):
        routing.solo(req, 0, gap=0.01)


def test_bench_writes_its_section(tmp_path: Path) -> None:
    docs = tmp_path / "benchmarks.md"
    assert routing.main(docs, lambda _: None, seeds=(0,), workers=1) == 0
    text = docs.read_text()
    assert "<!-- bench:routing -->" in text and "`mmfleet bench routing --seed 0`" in text
    for name in (*routing.ROUTERS, routing.BOUND):
        assert f"| {name} " in text
