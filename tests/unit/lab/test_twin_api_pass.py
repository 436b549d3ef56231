"""The API pass (``API_PASS_MS``, issue 27): a request with images reaches the engine on the next point of its API
process's pass grid, spaced ``api_pass_ms`` x the replica's running requests / ``api_server_count``; a text-only
request does not wait for it, and image requests ready within one pass share one encoder call."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from mmfleet_lab.twin import H200_QWEN25VL7B, Requests
from mmfleet_lab.twin.compiled import CompiledEngine
from mmfleet_lab.twin.engine import Workload
from mmfleet_lab.twin.replica import ReplicaParams

P = H200_QWEN25VL7B
TEXT, IMAGE = 229, 256  # the calibration run's prompt without its image; a 448x448 image's tokens
RUNNING = 9  # text requests decoding throughout


def busy_replica(params: ReplicaParams, later: list[tuple[float, float]]) -> CompiledEngine:
    """One replica: ``RUNNING`` long text requests from 0 s, then ``later``'s (arrival, images) requests with one
    448x448 image each (or none) and one output token, all run to the end."""
    arrival = np.array([0.0] * RUNNING + [t for t, _ in later])
    n = arrival.size
    out = np.array([2000.0] * RUNNING + [1.0] * len(later))
    imgs = np.array([0.0] * RUNNING + [k for _, k in later])
    req = Requests(arrival, np.full(n, TEXT), out, imgs, np.full(n, IMAGE))
    eng = CompiledEngine(params, Workload.build(req, params))
    eng.add_replica()
    eng.run(0.0, 60.0, np.arange(n), np.array([0]))
    return eng


def preprocessed_s(params: ReplicaParams) -> float:
    """A lone 448x448 image's CPU preprocessing plus the request overhead, s."""
    c0, c1 = params.image_cpu_ms
    return (c0 + c1 * IMAGE) / 1000.0 + params.request_overhead_s


@pytest.mark.parametrize("procs", [1, 2])
def test_an_image_request_lands_on_the_pass_grid_and_a_text_request_does_not_wait(procs: int) -> None:
    """With ``RUNNING`` requests running, the image request arriving at 1 s is ready on the first grid point after its
    preprocessing (the grid from 0, spaced ``api_pass_ms`` x running / processes); the text one at 1.5 s right after
    the request overhead."""
    params = replace(P, api_server_count=procs)
    eng = busy_replica(params, [(1.0, 1.0), (1.5, 0.0)])
    image, text = eng.ready_at(np.array([RUNNING, RUNNING + 1]))
    period = params.api_pass_ms * RUNNING / procs / 1000.0
    done = 1.0 + preprocessed_s(params)
    assert image == pytest.approx(math.ceil(done / period) * period, rel=1e-12, abs=0.0)
    assert image > done + 1e-4  # on the grid, not when its preprocessing ended
    assert text == 1.5 + params.request_overhead_s


def test_image_requests_ready_within_one_pass_share_one_encoder_call() -> None:
    """Two image requests 2 ms apart on one API process, the first preprocessed 1 ms after a grid point, the second
    11 ms later (behind it on the CPU): both reach the engine at the next grid point and get their first token in the
    same step, hence one encoder call. Without the pass the first's call (over 50 ms of launch) would run alone."""
    period = P.api_pass_ms * RUNNING / 1000.0
    grid = 56 * period
    first = grid + 0.001 - preprocessed_s(P)
    eng = busy_replica(P, [(first, 1.0), (first + 0.002, 1.0)])
    idx = np.array([RUNNING, RUNNING + 1])
    a, b = eng.ready_at(idx)
    assert a == b == pytest.approx(grid + period, rel=1e-12, abs=0.0)
    first_token = np.array([first, first + 0.002]) + eng.outcomes.ttft[idx]
    assert first_token[0] == pytest.approx(first_token[1], rel=0.0, abs=1e-12)
