"""What an engine is given and gives back: the per-request work, the outcomes, the interface.

``compiled.CompiledEngine`` implements ``Engine``: one vLLM step at a time, exact routing at each
arrival, compiled with numba. ``tests/helpers/twin_reference.py`` is the same algorithm in plain Python, the
oracle ``tests/unit/lab/test_twin_compiled.py`` checks it against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal, Protocol

import numpy as np

from mmfleet_lab.twin.observe import MetricBook
from mmfleet_lab.twin.replica import ReplicaParams
from mmfleet_lab.twin.types import Requests

# A client gives up on a request after this many seconds: the OpenAI Python client's default timeout
# (openai/openai-python @d63ff655, src/openai/_constants.py: DEFAULT_TIMEOUT = httpx.Timeout(timeout=600.0,
# connect=5.0)), the client most callers of an OpenAI-compatible server use. httpx applies it to each
# read, so it bounds the whole request for a non-streaming call, which is what the twin models; a
# gateway may cut sooner (Envoy's route timeout defaults to 15 s: RouteAction.timeout in envoyproxy/envoy
# @33048638, api/envoy/config/route/v3/route_components.proto): pass ``timeout``.
CLIENT_TIMEOUT_S: Final = 600.0


@dataclass(frozen=True)
class Router:
    """How each arriving request picks its replica among the eligible ones.

    - ``least-outstanding``: the fewest running + waiting requests (ties: the first); the twin's default.
    - ``round-robin``: the eligible replicas in turn, blind to load and caches (a Kubernetes Service; kube-proxy's
      iptables mode picks at random per connection, the same spread on average).
    - ``picker``: the Gateway API Inference Extension's endpoint picker (``twin.picker`` builds it from an
      ``EndpointPickerConfig``; the scoring is in ``compiled._pick``). Its fields mean nothing to the others.
    """

    kind: Literal["least-outstanding", "round-robin", "picker"] = "least-outstanding"
    prefix_weight: float = 0.0
    queue_weight: float = 0.0
    kv_weight: float = 0.0
    window_chars: int = 0  # the picker hashes at most this many characters of a request's messages
    block_chars: int = 64  # in blocks of this many (the trailing partial block is not hashed)
    queue_depth: int = 0  # a replica with this many waiting requests is saturated ...
    kv_saturated: float = 1.0  # ... or with this share of its KV cache in use
    # The profile's filter (a utilization-detector listed in it) drops replicas with this many waiting requests (0:
    # no filter) or this share of their KV cache in use, unless that drops them all.
    filter_queue_depth: int = 0
    filter_kv: float = 1.0
    flow_control: bool = False  # while the pool is saturated, requests wait in the picker ...
    request_ttl: float = math.inf  # ... this long at most (then the picker answers 503)
    seed: int = 0  # the picker's tie-break


LEAST_OUTSTANDING: Final = Router()


@dataclass(frozen=True, eq=False)
class Workload:
    """Per-request engine inputs derived once from ``Requests`` and a replica profile."""

    arrival: np.ndarray  # s
    prompt: np.ndarray  # tokens to prefill (text + image tokens), >= 1
    out: np.ndarray  # output tokens, >= 1
    # The request's share of a batched encoder call: its images' kernel time (ms; the call's base and launch are
    # charged once per step), its images, and their tokens (against the step's encoder budget).
    vis_ms: np.ndarray
    vis_images: np.ndarray
    vis_tokens: np.ndarray
    cpu_ms: np.ndarray  # CPU preprocessing on its replica's API server process (one request at a time)
    deadline: np.ndarray  # arrival + timeout: the client abandons the request if it has not finished by then
    # Shared prefixes (``types.PrefixChains``), block ids renumbered 0..n_blocks-1; block_tokens 0: none, and
    # no replica caches anything (the engines then run exactly as without the feature).
    block_tokens: int
    chain_start: np.ndarray  # n + 1: request k's blocks are chain[chain_start[k]:chain_start[k + 1]]
    chain: np.ndarray
    chain_chars: np.ndarray  # each block's characters in the messages' JSON (what the endpoint picker hashes)
    image_end: np.ndarray  # prompt tokens a replica must hold cached to skip the request's encoder call
    n_blocks: int

    @staticmethod
    def build(req: Requests, params: ReplicaParams, timeout: float = CLIENT_TIMEOUT_S) -> Workload:
        """The engine inputs of ``req`` on ``params``; ``timeout`` (s, > 0; ``math.inf``: never) is the client's."""
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        images = np.asarray(req.images, dtype=float)
        per_image = np.rint(req.tokens_per_image)
        prompt = np.maximum(np.rint(np.asarray(req.input_tokens, dtype=float) + images * per_image), 1.0)
        _, v1, v2 = params.vision_ms
        p = 4.0 * per_image / 1000.0  # thousands of 14x14 patches per image (4 per image token)
        vis = np.where(images > 0, v1 * images * p + v2 * images * p * p, 0.0)
        c0, c1 = params.image_cpu_ms
        cpu = np.where(images > 0, images * (c0 + c1 * per_image), 0.0)
        arrival = np.asarray(req.arrival, dtype=float)
        chains = req.prefix
        if chains is None:
            ids, inverse = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
            start, chars, image_end = np.zeros(len(req) + 1, dtype=np.int64), np.zeros(0, dtype=np.int64), prompt
        else:
            ids, inverse = np.unique(chains.ids, return_inverse=True)
            start, chars = chains.offsets.astype(np.int64), chains.chars.astype(np.int64)
            # A request with images but no position for them needs its encoder unless all of it is cached.
            image_end = np.where((images > 0) & (chains.image_end <= 0), prompt, chains.image_end)
        return Workload(
            arrival=arrival,
            prompt=prompt,
            out=np.maximum(np.rint(np.asarray(req.output_tokens, dtype=float)), 1.0),
            vis_ms=vis,
            vis_images=images,
            vis_tokens=np.asarray(images * per_image, dtype=np.int64),
            cpu_ms=cpu,
            deadline=arrival + timeout,
            block_tokens=0 if chains is None else int(chains.block_tokens),
            chain_start=start,
            chain=inverse.astype(np.int64),
            chain_chars=chars,
            image_end=np.asarray(image_end, dtype=np.int64),
            n_blocks=int(ids.size),
        )


class Outcomes:
    """Per-request latencies; np.inf until a request gets there. ``cached``: prompt tokens a replica's prefix cache
    held when it last admitted the request (vLLM's ``prefix_cache_hits``, per request)."""

    def __init__(self, n: int) -> None:
        self.ttft = np.full(n, np.inf)
        self.e2e = np.full(n, np.inf)
        self.itl = np.full(n, np.inf)
        self.cached = np.zeros(n, dtype=np.int64)

    def finish(
        self, idx: np.ndarray | int, t_done: np.ndarray | float, arrival: np.ndarray | float, out: np.ndarray | float
    ) -> None:
        e2e = np.asarray(t_done) - np.asarray(arrival)
        self.e2e[idx] = e2e
        o = np.asarray(out, dtype=float)
        with np.errstate(invalid="ignore", divide="ignore"):
            itl = np.where(o > 1, (e2e - self.ttft[idx]) / np.maximum(o - 1, 1), 0.0)
        self.itl[idx] = itl


class Engine(Protocol):
    """A set of replicas that serve requests routed to them."""

    book: MetricBook
    outcomes: Outcomes

    def add_replica(self) -> int:
        """A new, empty replica; returns its id (ids are never reused)."""

    def outstanding(self) -> np.ndarray:
        """Requests routed to each replica and not finished (running + waiting)."""

    def gauges(self, rid: int) -> tuple[float, float, float]:
        """``num_requests_running``, ``num_requests_waiting``, ``kv_cache_usage_perc`` now."""

    def run(self, t0: float, t1: float, idx: np.ndarray, eligible: np.ndarray) -> None:
        """Route requests ``idx`` (arriving in [t0, t1), or held earlier, in arrival order) among
        ``eligible`` replicas as the engine's ``Router`` picks (least outstanding requests by default), and
        advance every replica to ``t1``.

        A request whose deadline has passed when it would be routed never reaches a replica; one
        whose deadline passes on a replica is abandoned at the next step boundary: it leaves the
        queue or frees its seat and KV, and its latencies stay ``np.inf`` (a TTFT already seen
        stays). As vLLM counts a client's abort: no ``request_success``, no e2e observation
        (``OutputProcessor.abort_requests`` in ``vllm/v1/engine/output_processor.py``,
        vllm-project/vllm @d0782260, drops the request's state without recording finished stats)."""
