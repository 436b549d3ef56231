"""``mmfleet bench routing``: its splits, the resource its mmfleet row is rendered from, its bound, its section."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import numpy as np

from mmfleet_lab.bench import routing
from mmfleet_lab.twin import Requests
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


def test_reuse_bound() -> None:
    """Two requests sharing two 512-token blocks of three: the second finds 1,024 of its 1,536 tokens."""
    chains = PrefixChains(512, np.array([0, 3, 6]), np.array([1, 2, 3, 1, 2, 4]), np.full(6, 2048), np.zeros(2))
    req = Requests(np.array([0.0, 1.0]), np.full(2, 1536.0), np.full(2, 10.0), np.zeros(2), prefix=chains)
    assert routing.reuse_bound(req, start=0.0) == 1024 / 3072
    assert routing.reuse_bound(req, start=0.5) == 1024 / 1536


def test_bench_writes_its_section(tmp_path: Path) -> None:
    docs = tmp_path / "benchmarks.md"
    assert routing.main(docs, lambda _: None, seeds=(0,), workers=1) == 0
    text = docs.read_text()
    assert "<!-- bench:routing -->" in text and "`mmfleet bench routing --seed 0`" in text
    for name in routing.ROUTERS:
        assert f"| {name} " in text
