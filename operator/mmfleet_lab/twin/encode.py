"""The encode tier of an E/PD fleet: encoder-only replicas whose embeddings the serving replicas consume.

vLLM 0.33 runs it as ``--mm-encoder-only`` instances beside prefill/decode instances that take the encoder outputs
through an EC connector (``ECCPUConnector``: a CPU region, with NIXL moving it between hosts) instead of running
the encoder. A request with images goes to an encode replica first: its API process preprocesses the images (one
request at a time, as in the serving tier), its engine encodes every image ready in one batched call per step (the
serving tier's call: kernels, eager launch, encoder budget; ``ReplicaParams``), and the embeddings travel to the
serving tier (``Transfer``). There the request is preprocessed again (the serving replica computes the images' hashes
and placeholders itself) and prefilled without an encoder call (``CompiledEngine.encoded``). Text-only requests go
past the tier.

``EncodeEngine`` is an ``Engine`` for ``fleet.Fleet``: routing to the least-loaded encode replica, drain and cold
start come with it; ``sim.simulate(..., encode=EncodeTier(...))`` runs the two tiers side by side.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import numpy as np

from mmfleet_lab.twin.compiled import CompiledEngine
from mmfleet_lab.twin.engine import Outcomes, Workload
from mmfleet_lab.twin.fleet import Fleet
from mmfleet_lab.twin.observe import MetricBook
from mmfleet_lab.twin.replica import ReplicaParams
from mmfleet_lab.twin.types import Requests

# ASSUMED (nothing measured them yet): the transfer of one request's embeddings from the encode tier to the serving
# tier. Bytes are its image tokens x the text model's hidden size (3,584 for Qwen2.5-VL-7B) x 2 (bf16). The fixed
# part is the connector's round of control messages, the encoder's copy to the CPU region and the serving worker's
# load (ZMQ on one host, a NIXL read across hosts); the bandwidth is an effective 10 GB/s, below one PCIe Gen5 x16
# link (about 50 GB/s) and one 400 Gb/s NIC (50 GB/s), since the data crosses host memory twice.
TRANSFER_FIXED_S: Final = 0.005
TRANSFER_BYTES_PER_S: Final = 10e9
EMBEDDING_BYTES_PER_TOKEN: Final = 3584 * 2


@dataclass(frozen=True)
class Transfer:
    """Embeddings from the encode tier to the serving tier: a fixed latency per request plus bytes / bandwidth."""

    fixed_s: float = TRANSFER_FIXED_S
    bytes_per_s: float = TRANSFER_BYTES_PER_S
    bytes_per_token: int = EMBEDDING_BYTES_PER_TOKEN

    def seconds(self, image_tokens: float) -> float:
        return self.fixed_s + image_tokens * self.bytes_per_token / self.bytes_per_s


class _Replica:
    """One encoder-only replica: its API processes, its queue (by readiness), its clock."""

    def __init__(self, procs: int) -> None:
        self.clock = 0.0
        self.cpu_free = [0.0] * procs
        self.cpu_turn = 0
        self.queue: deque[int] = deque()


class EncodeEngine:
    """Encoder-only replicas serving the image requests routed to them (see the module docstring).

    ``delivered[i]``: when request ``i``'s embeddings reach the serving tier (inf until known); ``outcomes.e2e``
    holds that latency from its arrival. The replicas' ``book`` stays empty: the twin models no metrics of an
    encoder-only server.
    """

    def __init__(self, params: ReplicaParams, work: Workload, transfer: Transfer = Transfer()) -> None:
        self.params, self.work, self.transfer = params, work, transfer
        n = work.arrival.shape[0]
        self.book = MetricBook()
        self.outcomes = Outcomes(n)
        self.delivered = np.full(n, np.inf)
        self.avail = np.zeros(n)
        self.replicas: list[_Replica] = []

    def add_replica(self) -> int:
        self.replicas.append(_Replica(self.params.api_server_count))
        return self.book.add_replica()

    def outstanding(self) -> np.ndarray:
        return np.array([len(r.queue) for r in self.replicas], dtype=np.int64)

    def gauges(self, rid: int) -> tuple[float, float, float]:
        return 0.0, float(len(self.replicas[rid].queue)), 0.0

    def run(self, t0: float, t1: float, idx: np.ndarray, eligible: np.ndarray) -> None:
        """Route ``idx`` (arrival order) to the eligible replica with the shortest queue (ties: the first), each
        after every replica has been advanced to its arrival; then advance every replica to ``t1``."""
        for i in idx.tolist():
            t = max(float(self.work.arrival[i]), t0)
            for r in self.replicas:
                self._advance(r, t)
            if self.work.deadline[i] <= t:
                continue
            best = min(eligible.tolist(), key=lambda e: len(self.replicas[e].queue))
            self._submit(self.replicas[best], i, t)
        for r in self.replicas:
            self._advance(r, t1)

    def _submit(self, r: _Replica, i: int, t: float) -> None:
        w, p = self.work, r.cpu_turn % len(r.cpu_free)
        r.cpu_turn += 1
        done = max(t, r.cpu_free[p]) + float(w.cpu_ms[i]) / 1000.0
        r.cpu_free[p] = done
        self.avail[i] = done + self.params.request_overhead_s
        if not r.queue:
            r.clock = max(r.clock, t)
        pos = len(r.queue)
        while pos > 0 and self.avail[r.queue[pos - 1]] > self.avail[i]:
            pos -= 1
        r.queue.insert(pos, i)

    def _advance(self, r: _Replica, until: float) -> None:
        """Encoder calls until the clock reaches ``until`` (the last may end after it): each takes the ready requests
        in order within the encoder budget; one whose client has given up leaves the queue instead."""
        p, w = self.params, self.work
        v0 = p.vision_ms[0]
        a, b = p.encoder_launch_ms if p.vision_eager else (0.0, 0.0)
        while r.clock < until:
            batch: list[int] = []
            tokens = 0
            while r.queue and self.avail[r.queue[0]] <= r.clock:
                i = r.queue[0]
                if w.deadline[i] <= r.clock:
                    r.queue.popleft()
                    continue
                if batch and tokens + int(w.vis_tokens[i]) > p.encoder_budget_tokens:
                    break
                batch.append(r.queue.popleft())
                tokens += int(w.vis_tokens[i])
            if not batch:
                nxt = self.avail[r.queue[0]] if r.queue else math.inf
                r.clock = nxt if r.clock < nxt < until else until
                continue
            gpu = v0 + float(w.vis_ms[batch].sum())
            images = float(w.vis_images[batch].sum())
            r.clock += (gpu + a + b * images + p.host_ms_base) / 1000.0
            for i in batch:
                self.delivered[i] = r.clock + self.transfer.seconds(float(w.vis_tokens[i]))
                self.outcomes.e2e[i] = self.delivered[i] - float(w.arrival[i])


@dataclass(frozen=True)
class EncodeObservation:
    """What an encode tier's autoscaling policy sees at ``time``: its pods, its queue, the images coming in."""

    time: float
    desired: int
    ready: int
    starting: int
    waiting: int  # image requests not yet encoded: queued on the replicas or held at the tier's gateway
    image_rate: float  # images per second that arrived over the last interval (``EncodeTier.rate_window``)
    latency_p90: float  # s from arrival to embeddings delivered, of those delivered over the last interval (nan: none)
    # (``EncodeTier.latency_window``)
    waiting_items: float = 0.0  # the images of the ``waiting`` requests


@dataclass(frozen=True)
class EncodeTier:
    """The encode tier of an E/PD fleet in ``simulate``: ``initial`` replicas, then what ``policy`` says every
    ``interval`` s (clamped to [``min_replicas``, ``max_replicas``]; None: fixed). ``params``: the encoder's GPU
    profile (None: the serving tier's); ``cold_start``: its pods' (None: the run's)."""

    initial: int
    policy: Callable[[EncodeObservation], int] | None = None
    interval: float = 15.0
    min_replicas: int = 0
    max_replicas: int = 64
    params: ReplicaParams | None = None
    transfer: Transfer = Transfer()
    cold_start: float | None = None
    rate_window: float | None = None  # what ``image_rate`` averages over (None: ``interval``), as rate()[1m] does
    latency_window: float | None = None  # what ``latency_p90`` spans (None: ``interval``), as the SLO's window does


class EncodeFleet:
    """An encode tier's pods in front of the serving pods, as ``simulate`` runs them: each interval, image requests
    go to the tier, and those whose embeddings have arrived go on to the serving fleet with the text-only ones."""

    def __init__(self, tier: EncodeTier, params: ReplicaParams, req: Requests, timeout: float, cold_start: float):
        p = tier.params or params
        self.tier = tier
        self.engine = EncodeEngine(p, Workload.build(req, p, timeout), tier.transfer)
        initial = min(max(tier.initial, tier.min_replicas), tier.max_replicas)
        cold = cold_start if tier.cold_start is None else tier.cold_start
        self.pods = Fleet(self.engine, cold_start=cold, initial=initial)
        self.images = np.asarray(req.images, dtype=float)
        self.pending = np.zeros(0, dtype=np.int64)  # sent to the tier, embeddings not yet at the serving tier

    def run(self, serving: Fleet, engine: CompiledEngine, t0: float, t1: float, idx: np.ndarray) -> None:
        """Serve arrivals ``idx`` (in [t0, t1)) through both tiers up to ``t1``."""
        w = self.engine.work
        img = idx[self.images[idx] > 0]
        self.pods.run(t0, t1, img)
        pending = np.r_[self.pending, img]
        delivered = self.engine.delivered[pending]
        ready = pending[delivered < t1]
        self.pending = pending[(delivered >= t1) & (w.deadline[pending] > t1)]
        engine.encoded(ready, self.engine.delivered[ready])
        txt = idx[self.images[idx] <= 0]
        both = np.r_[txt, ready]
        order = np.argsort(np.r_[w.arrival[txt], self.engine.delivered[ready]], kind="stable")
        serving.run(t0, t1, both[order])

    def busy(self) -> bool:
        """Image requests still on their way through the tier."""
        return bool(self.pending.size or self.pods.held.size)

    def observe(self, t: float) -> EncodeObservation:
        w, tier = self.engine.work, self.tier
        rate_window = tier.rate_window or tier.interval
        latency_window = tier.latency_window or tier.interval
        lo, hi = np.searchsorted(w.arrival, [t - rate_window, t], side="right")
        delivered = self.engine.delivered
        recent = (delivered > t - latency_window) & (delivered <= t)
        lat = delivered[recent] - w.arrival[recent]
        queued = [i for r in self.engine.replicas for i in r.queue]
        waiting_items = float(self.images[queued].sum()) + float(self.images[self.pods.held].sum())
        return EncodeObservation(
            time=t,
            desired=self.pods.desired,
            ready=self.pods.count("ready"),
            starting=self.pods.count("starting"),
            waiting=int(self.engine.outstanding().sum()) + int(self.pods.held.size),
            image_rate=float(self.images[lo:hi].sum()) / rate_window,
            latency_p90=float(np.percentile(lat, 90)) if lat.size else math.nan,
            waiting_items=waiting_items,
        )

    def decide(self, t: float) -> int | None:
        """The policy's replicas at ``t``, clamped, applied; None when nothing changed."""
        if self.tier.policy is None:
            return None
        want = min(max(int(self.tier.policy(self.observe(t))), self.tier.min_replicas), self.tier.max_replicas)
        if want == self.pods.desired:
            return None
        self.pods.scale(want, t)
        return want
