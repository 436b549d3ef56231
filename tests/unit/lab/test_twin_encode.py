"""The twin's images (issue 27): one batched encoder call per engine step, CPU preprocessing queued per API server
process, and the encode tier of an E/PD fleet (encoder-only replicas, the transfer, the serving replicas skipping
the encoder, its own replica count)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from mmfleet_lab.twin import H200_QWEN25VL7B, Requests
from mmfleet_lab.twin.compiled import CompiledEngine
from mmfleet_lab.twin.encode import EncodeEngine, EncodeObservation, EncodeTier, Transfer
from mmfleet_lab.twin.engine import Workload
from mmfleet_lab.twin.replica import ReplicaParams
from tests.helpers.twin import Script, run

P = H200_QWEN25VL7B
TEXT, IMAGE = 229, 256  # the calibration run's prompt without its image; a 448x448 image's tokens
KERNEL = P.vision_graph_ms([4 * IMAGE]) - P.vision_ms[0]  # one 448x448 image's share of a call's kernels


def images(n: int, arrival: float = 0.0) -> Requests:
    """``n`` requests with one 448x448 image each and one output token, all arriving at ``arrival``."""
    return Requests(np.full(n, arrival), np.full(n, TEXT), np.ones(n), np.ones(n), np.full(n, IMAGE))


def ttft(req: Requests, params: ReplicaParams = P, encoded_at: float | None = None) -> np.ndarray:
    """TTFT of each request on one replica (``encoded_at``: all reach it then with their embeddings)."""
    eng = CompiledEngine(params, Workload.build(req, params))
    eng.add_replica()
    idx = np.arange(len(req))
    if encoded_at is not None:
        eng.encoded(idx, np.full(len(req), encoded_at))
    eng.run(0.0, float(req.arrival[-1]) + 120.0, idx, np.array([0]))
    return eng.outcomes.ttft


def ready_s(params: ReplicaParams) -> float:
    """When a lone 448x448 request arriving at 0 is ready for the engine: preprocessed, plus the request overhead."""
    c0, c1 = params.image_cpu_ms
    return (c0 + c1 * IMAGE) / 1000.0 + params.request_overhead_s


def test_two_requests_images_in_one_step_cost_one_call() -> None:
    """Two requests ready together (two API processes) are prefilled in one step with one encoder call: the step
    pays the call's launch once and each image's kernels, not two calls."""
    two_procs = replace(P, api_server_count=2)
    a, b = P.encoder_launch_ms
    one = ttft(images(1), two_procs)[0]
    pair = ttft(images(2), two_procs)
    assert pair[0] == pair[1]
    step = P.step_gpu_ms([], [(TEXT + IMAGE, 0)] * 2) + P.vision_ms[0] + 2 * KERNEL + a + 2 * b + P.host_ms(2)
    assert pair[0] == pytest.approx(ready_s(P) + step / 1000.0, rel=1e-9)
    alone = P.step_gpu_ms([], [(TEXT + IMAGE, 0)]) + P.vision_ms[0] + KERNEL + a + b + P.host_ms(1)
    assert one == pytest.approx(ready_s(P) + alone / 1000.0, rel=1e-9)
    assert pair[0] - one < a / 1000.0  # a second call would have cost a launch more


def test_an_image_request_waits_for_its_images_to_fit_the_encoder_budget() -> None:
    """A step encodes at most ``encoder_budget_tokens`` of images: the request that does not fit waits a step."""
    small = replace(P, api_server_count=2, encoder_budget_tokens=IMAGE)
    t = ttft(images(2), small)
    assert t[1] > t[0]


def test_cpu_preprocessing_saturates_per_api_process() -> None:
    """Each API process preprocesses one request at a time: at 100 ms of CPU per image, one process serves 10 images a
    second, so 12 a second queue up in front of the engine; two processes keep up."""
    slow = replace(P, image_cpu_ms=(100.0, 0.0), max_num_seqs=64)
    rng = np.random.default_rng(0)
    arrival = np.cumsum(rng.exponential(1.0 / 12.0, size=240))
    req = Requests(arrival, np.full(240, TEXT), np.full(240, 2), np.ones(240), np.full(240, IMAGE))
    one = ttft(req, slow)
    two = ttft(req, replace(slow, api_server_count=2))
    assert np.percentile(one[-24:], 50) > 2.0  # a backlog of about 20 s x 2 images a second over capacity
    assert np.percentile(two, 90) < 0.5
    # the queue is the CPU's: the first request, alone, pays its 100 ms once
    assert one[0] == pytest.approx(two[0])


def test_serving_replica_skips_the_encoder_for_requests_encoded_elsewhere() -> None:
    """A request whose embeddings come from the encode tier is preprocessed again (hashes and placeholders) but
    prefilled without an encoder call: exactly one call's cost less."""
    a, b = P.encoder_launch_ms
    here = ttft(images(1))[0]
    there = ttft(images(1), encoded_at=0.0)[0]
    assert here - there == pytest.approx((P.vision_ms[0] + KERNEL + a + b) / 1000.0, rel=1e-9)


def test_encode_replica_batches_its_calls_and_charges_the_transfer() -> None:
    """An encoder-only replica encodes what is ready in one call per step; the embeddings reach the serving tier
    after the transfer: a fixed latency plus image tokens x 3,584 x 2 bytes over the bandwidth."""
    p = replace(P, api_server_count=2)
    transfer = Transfer(fixed_s=0.004, bytes_per_s=2e9)
    assert transfer.seconds(IMAGE) == pytest.approx(0.004 + IMAGE * 3584 * 2 / 2e9)
    enc = EncodeEngine(p, Workload.build(images(2), p), transfer)
    enc.add_replica()
    enc.run(0.0, 10.0, np.arange(2), np.array([0]))
    a, b = p.encoder_launch_ms
    call = p.vision_ms[0] + 2 * KERNEL + a + 2 * b + p.host_ms_base
    expected = ready_s(p) + call / 1000.0 + transfer.seconds(IMAGE)
    assert enc.delivered == pytest.approx([expected, expected], rel=1e-9)
    assert enc.outstanding().tolist() == [0]


def test_e_pd_fleet_scales_its_encode_tier_on_its_own() -> None:
    """An E/PD run: the encode tier's policy sets its replicas (3 from 20 s), the serving tier keeps its own (1);
    each tier's GPU time is billed apart; every request finishes, an image request after its embeddings arrived and
    a text-only one past the tier, as fast as without it."""
    rng = np.random.default_rng(1)
    arrival = np.sort(rng.uniform(0.0, 60.0, size=300))
    imgs = (np.arange(300) % 2).astype(float)
    req = Requests(arrival, np.full(300, TEXT), np.full(300, 20), imgs, np.full(300, IMAGE))
    seen: list[EncodeObservation] = []

    def policy(obs: EncodeObservation) -> int:
        seen.append(obs)
        return 3 if obs.time >= 20.0 else 1

    tier = EncodeTier(initial=1, policy=policy, interval=10.0)
    res = run(req, Script([]), 60.0, initial_replicas=1, cold_start=10.0, encode=tier)
    assert np.isfinite(res.e2e).all()
    assert res.encode_decisions == [(20.0, 3)]
    assert res.encode_desired[25] == 3 and res.encode_ready[25] == 1 and res.encode_ready[35] == 3
    assert res.desired.max() == 1
    assert res.encode_gpu_seconds == pytest.approx(60.0 + 2 * 40.0)
    assert res.gpu_seconds == pytest.approx(60.0)
    assert seen[0].image_rate == pytest.approx(imgs[arrival < 10.0].sum() / 10.0)
    base = run(req, Script([]), 60.0, initial_replicas=1, cold_start=10.0)
    text = imgs == 0
    assert res.ttft[~text].min() > P.encoder_launch_ms[0] / 1000.0  # after an encoder call elsewhere
    assert not imgs[0] and res.ttft[0] == base.ttft[0]  # the first request, text only, meets an idle replica
