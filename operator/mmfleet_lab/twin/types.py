"""The twin's data: requests, scenarios and a run's result (the SLO is the API's ``mmfleet.api.SloSpec``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mmfleet_lab.twin.replica import DEFAULT_IMAGE_TOKENS


@dataclass(frozen=True, eq=False)
class PrefixChains:
    """What each request shares with others, for the replicas' prefix caches and the endpoint picker's index.

    Request ``k``'s prompt is the chain of blocks ``ids[offsets[k]:offsets[k + 1]]``, ``block_tokens`` tokens each
    (the last may be partial): equal ids at the same place of two chains are the same tokens after the same prefix,
    as vLLM's block hashes (which include an image's hash) and Mooncake's ``hash_ids`` say. ``chars`` is each
    block's length in the request's messages as JSON (text about 4 characters a token, an image its data URL), what
    the picker hashes; ``image_end`` the prompt position after a request's last image token (0: no image): a
    replica holding that much of the prompt in its cache needs no encoder call.
    """

    block_tokens: int
    offsets: np.ndarray  # n + 1
    ids: np.ndarray
    chars: np.ndarray  # per block, like ids
    image_end: np.ndarray  # per request

    def take(self, idx: np.ndarray) -> PrefixChains:
        idx = np.asarray(idx, dtype=np.int64)
        lengths = self.offsets[idx + 1] - self.offsets[idx]
        flat = np.concatenate([np.arange(self.offsets[k], self.offsets[k + 1]) for k in idx]) if idx.size else idx
        return PrefixChains(
            block_tokens=self.block_tokens,
            offsets=np.r_[0, np.cumsum(lengths)].astype(np.int64),
            ids=self.ids[flat],
            chars=self.chars[flat],
            image_end=self.image_end[idx],
        )


@dataclass(frozen=True, eq=False)
class Requests:
    """A workload, one entry per request, sorted by arrival (seconds from the start).

    ``input_tokens`` are text tokens; each of a request's ``images`` adds ``image_tokens`` prompt
    tokens (None: ``DEFAULT_IMAGE_TOKENS`` per image) and one vision-encoder pass.
    """

    arrival: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    images: np.ndarray
    image_tokens: np.ndarray | None = None  # per image, per request (added field)
    prefix: PrefixChains | None = None  # shared prefixes (None: nothing is shared, no replica caches anything)

    def __post_init__(self) -> None:
        n = self.arrival.shape[0]
        for name in ("input_tokens", "output_tokens", "images"):
            if getattr(self, name).shape[0] != n:
                raise ValueError(f"Requests.{name} has {getattr(self, name).shape[0]} entries, arrival has {n}")
        if self.image_tokens is not None and self.image_tokens.shape[0] != n:
            raise ValueError("Requests.image_tokens length differs from arrival")
        if self.prefix is not None and self.prefix.offsets.shape[0] != n + 1:
            raise ValueError("Requests.prefix has chains for a different number of requests")
        if n > 1 and np.any(np.diff(self.arrival) < 0):
            raise ValueError("Requests.arrival must be sorted")

    def __len__(self) -> int:
        return int(self.arrival.shape[0])

    @property
    def tokens_per_image(self) -> np.ndarray:
        if self.image_tokens is None:
            return np.where(self.images > 0, float(DEFAULT_IMAGE_TOKENS), 0.0)
        return np.asarray(self.image_tokens, dtype=float)

    @property
    def prompt_tokens(self) -> np.ndarray:
        """Tokens the LLM prefills: text plus image tokens."""
        return np.asarray(np.asarray(self.input_tokens, dtype=float) + self.images * self.tokens_per_image)

    def take(self, idx: np.ndarray, arrival: np.ndarray | None = None) -> Requests:
        """A subset, or a resample with new arrival times (then sorted by them)."""
        if arrival is not None:
            order = np.argsort(arrival, kind="stable")
            idx, arrival = np.asarray(idx)[order], np.asarray(arrival)[order]
        return Requests(
            arrival=self.arrival[idx] if arrival is None else arrival,
            input_tokens=self.input_tokens[idx],
            output_tokens=self.output_tokens[idx],
            images=self.images[idx],
            image_tokens=None if self.image_tokens is None else self.image_tokens[idx],
            prefix=None if self.prefix is None else self.prefix.take(np.asarray(idx)),
        )

    def window(self, t0: float, t1: float) -> Requests:
        """Requests arriving in [t0, t1), re-based to start at 0."""
        m = (self.arrival >= t0) & (self.arrival < t1)
        idx = np.nonzero(m)[0]
        return self.take(idx, self.arrival[idx] - t0)

    @staticmethod
    def concat(parts: list[Requests]) -> Requests:
        """Merge and sort by arrival (stable); shared prefixes are not carried (their ids are each trace's own)."""
        arr = np.concatenate([p.arrival for p in parts])
        order = np.argsort(arr, kind="stable")
        it = np.concatenate([p.tokens_per_image for p in parts])
        return Requests(
            arrival=arr[order],
            input_tokens=np.concatenate([p.input_tokens for p in parts])[order],
            output_tokens=np.concatenate([p.output_tokens for p in parts])[order],
            images=np.concatenate([p.images for p in parts])[order],
            image_tokens=it[order],
        )


@dataclass(frozen=True, eq=False)
class Scenario:
    """A named workload for the benchmark; ``spikes`` are (onset, end) of injected surges, seconds."""

    name: str
    requests: Requests
    duration: float
    spikes: tuple[tuple[float, float], ...] = ()
    info: dict[str, float | str] = field(default_factory=dict)  # added: how it was built (rate scale, source)


@dataclass(frozen=True, eq=False)
class RunResult:
    """What one simulated run produced."""

    arrival: np.ndarray
    e2e: np.ndarray  # per request, s; np.inf for dropped / never finished
    ttft: np.ndarray
    itl: np.ndarray  # per request mean inter-token latency (TPOT), s; 0 for one-token outputs
    times: np.ndarray  # timeline, every second
    ready: np.ndarray
    starting: np.ndarray
    desired: np.ndarray
    gpu_seconds: float
    decisions: list[tuple[float, int, str]]
    unschedulable: np.ndarray = field(default_factory=lambda: np.zeros(0))  # added: timeline of Pending pods
    draining: np.ndarray = field(default_factory=lambda: np.zeros(0))  # added: timeline of draining pods
    held: np.ndarray = field(default_factory=lambda: np.zeros(0))  # added: timeline of requests held before the servers
    starting_gpu_seconds: float = 0.0  # added: the part of gpu_seconds spent before Ready
    cached: np.ndarray = field(default_factory=lambda: np.zeros(0))  # added: prompt tokens found cached, per request
    rejected: int = 0  # added: requests the picker's flow control answered 503 (held past defaultRequestTTL)
    holds: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))  # added: (from, to) of each pod's GPUs
    gpus_per_replica: int = 1
    # With an encode tier (``simulate(..., encode=)``): its GPU-seconds up to the horizon, its Ready and desired pods
    # every second, and its decisions (time, replicas).
    encode_gpu_seconds: float = 0.0
    encode_ready: np.ndarray = field(default_factory=lambda: np.zeros(0))
    encode_desired: np.ndarray = field(default_factory=lambda: np.zeros(0))
    encode_decisions: list[tuple[float, int]] = field(default_factory=list)

    def latency(self, metric: str) -> np.ndarray:
        return {"e2e": self.e2e, "ttft": self.ttft, "itl": self.itl}[metric]

    def gpu_seconds_from(self, t: float) -> float:
        """The GPU-seconds billed after ``t``: what a benchmark scores when it starts counting there."""
        if not self.holds.size:
            raise ValueError("this run recorded no GPU holds to bill from a time")
        held = np.clip(self.holds[:, 1] - np.maximum(self.holds[:, 0], t), 0.0, None)
        return float(held.sum()) * self.gpus_per_replica
