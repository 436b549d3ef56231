"""Workloads: trace loading, arrival synthesis, multimodal mixes, rate scaling and synthetic spikes.

Sources (with attribution in ``traces/README.md`` beside this module, and in ``tests/data/README.md``):
- Azure LLM inference trace 2023 (``TIMESTAMP, ContextTokens, GeneratedTokens``; CC-BY 4.0).
- Mooncake's FAST'25 conversation trace (``timestamp, input_length, output_length, hash_ids``; Apache-2.0).
- ServeGen (Apache-2.0): the per-10-minute aggregate rate of ``multimodal_mm-image`` and the
  per-client token statistics (mean, p50, p90, p99 of text tokens, tokens per image, images per
  request, output tokens per 6-hour window).

Choices that are ours (ASSUMED, documented in ``docs/twin.md``):
- A token distribution known only by mean/p50/p90/p99 is sampled from a piecewise-linear quantile
  function through (0.5, p50), (0.9, p90), (0.99, p99), flat to 1.0, with the value at 0 chosen so
  the mean matches (clipped to [1, p50]).
- Text traces get images with probability ``IMAGE_PROBABILITY``; counts and sizes from ServeGen. On a trace with
  shared prefixes, a request's images go at the start of the part no earlier request shared (its new message),
  so a later turn that shares those blocks carries the same images (``add_shared_images``).
- Rate scaling draws independent arrivals (a non-homogeneous Poisson process, as from many
  independent users) at ``factor`` x the trace's rate averaged over ``RATE_SMOOTH_S`` s, with each
  request's tokens and images resampled from the trace. Stacking time-shifted copies of the trace
  instead would multiply its bursts ``factor``-fold rather than average them out.
- Spikes add independent (Poisson) arrivals in the spike window at (m(t) - 1) x the workload's
  smoothed rate, with tokens and images resampled from the whole trace.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mmfleet_lab.twin.types import PrefixChains, Requests

IMAGE_PROBABILITY = 0.3  # ASSUMED share of requests that carry images when a text trace is replayed
MAX_IMAGE_TOKENS = 16384  # Qwen2.5-VL's default max_pixels (12,845,056 px) / (28 x 28)
# Characters of an image's base64 data URL per image token: the calibration run's JPEGs at quality 90, 51 KB for 256
# tokens (448x448) and 230 KB for 1,196 (1280x720), x 4/3 (tests/data/README.md, "with images").
URL_CHARS_PER_IMAGE_TOKEN = 260
TEXT_CHARS_PER_TOKEN = 4  # what the endpoint picker assumes (twin.picker.CHARS_PER_TOKEN)
RATE_SMOOTH_S = 60.0  # ASSUMED: scaled traffic follows the trace's rate averaged over this window
SPIKE_STEP_S = 0.1  # resolution of the spike's rate curve


# ------------------------------------------------------------------------------------ loading
def _table(path: Path | str, columns: Sequence[str | None]) -> list[dict[str, str]]:
    """The CSV's rows, with every column named in ``columns`` present; a byte-order mark (spreadsheets write one) is
    not part of the first column's name."""
    with open(path, newline="", encoding="utf-8-sig") as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        raise ValueError(f"{path}: no rows")
    for c in columns:
        if c is not None and c not in rows[0]:
            raise ValueError(f"{path}: no column {c!r} (have {sorted(rows[0])})")
    return rows


def _numbers(path: Path | str, rows: list[dict[str, str]], column: str, default: float) -> np.ndarray:
    """``column`` of every row as a number at least 0 (``default`` where empty), or an error naming the first row
    that is not one."""
    raw = [r[column] for r in rows]

    def number(x: str) -> float:
        try:
            return default if x in ("", None) else float(x)
        except ValueError:
            return math.nan

    values = np.asarray([number(x) for x in raw], dtype=float)
    bad = np.flatnonzero(~np.isfinite(values) | (values < 0))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{path}: row {i + 2}: {column} {raw[i]!r}: expected a number at least 0")
    return values


def _parse_times(path: Path | str, rows: list[dict[str, str]], column: str) -> np.ndarray:
    """Seconds: numbers as they are, or date-times (any ISO-like form numpy parses) since the epoch."""
    raw = [r[column] for r in rows]
    try:
        t = np.asarray([float(x) for x in raw])
    except ValueError:
        try:
            t = np.asarray([_stamp(x) for x in raw], dtype="datetime64[ns]").astype("int64").astype(float) / 1e9
        except ValueError:
            kinds = [_time_kind(x) for x in raw]
            i = next((i for i, k in enumerate(kinds) if k is None), None)
            if i is None:  # each parses, as numbers and date-times mixed: which one is the odd kind
                i = kinds.index("a number" if kinds[0] == "a date-time" else "a date-time")
                raise ValueError(
                    f"{path}: row {i + 2}: {column} {raw[i]!r}: {kinds[i]}, where row 2 holds {kinds[0]}; expected "
                    "one kind of time in the whole column"
                ) from None
            raise ValueError(
                f"{path}: row {i + 2}: {column} {raw[i]!r}: expected a number of seconds or a date-time"
            ) from None
    bad = np.flatnonzero(~np.isfinite(t))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{path}: row {i + 2}: {column} {raw[i]!r}: expected a number of seconds or a date-time")
    return t


def _stamp(x: str) -> str:
    """A date-time as numpy reads it: a space between date and time becomes a T."""
    return x.strip().replace(" ", "T", 1)


def _time_kind(x: str) -> str | None:
    """What kind of time ``x`` is, or None if neither."""
    try:
        float(x)
        return "a number"
    except ValueError:
        pass
    try:
        np.datetime64(_stamp(x), "ns")
        return "a date-time"
    except ValueError:
        return None


def load_csv(
    path: Path | str,
    *,
    time_col: str,
    input_col: str | None = None,
    output_col: str | None = None,
    images_col: str | None = None,
    image_tokens_col: str | None = None,
    default_input: int = 1024,
    default_output: int = 128,
    time_scale: float = 1.0,
) -> Requests:
    """Requests from any CSV with a timestamp column; token and image columns are optional.

    Times are numbers (multiplied by ``time_scale`` to get seconds) or date-times, and are rebased so
    the first request arrives at 0. Missing columns take the defaults (no images).
    """
    rows = _table(path, [time_col, input_col, output_col, images_col, image_tokens_col])
    t = _parse_times(path, rows, time_col) * time_scale
    n = len(rows)

    def col(name: str | None, default: float) -> np.ndarray:
        return np.full(n, float(default)) if name is None else _numbers(path, rows, name, default)

    order = np.argsort(t, kind="stable")
    t = t[order] - t[order[0]]
    images = col(images_col, 0.0)[order]
    return Requests(
        arrival=t,
        input_tokens=col(input_col, default_input)[order],
        output_tokens=col(output_col, default_output)[order],
        images=images,
        image_tokens=None if image_tokens_col is None else col(image_tokens_col, 0.0)[order],
    )


def load_azure(path: Path | str) -> Requests:
    """The Azure LLM inference trace 2023 (conv or code)."""
    return load_csv(path, time_col="TIMESTAMP", input_col="ContextTokens", output_col="GeneratedTokens")


def load_mooncake(path: Path | str, block_tokens: int = 512) -> Requests:
    """Mooncake's FAST'25 trace format (kvcache-ai/Mooncake, FAST25-release/README.md): one JSON object a line with
    ``timestamp`` (ms), ``input_length``, ``output_length`` and ``hash_ids``, one per ``block_tokens`` of the
    input (the last block partial); equal ids are shared prefix blocks. Text only: no images."""
    with open(path) as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    if not rows:
        raise ValueError(f"{path}: no rows")
    t = np.asarray([r["timestamp"] for r in rows], dtype=float) / 1000.0
    order = np.argsort(t, kind="stable")
    rows = [rows[k] for k in order]
    lengths = np.asarray([len(r["hash_ids"]) for r in rows], dtype=np.int64)
    ids = np.asarray([b for r in rows for b in r["hash_ids"]], dtype=np.int64)
    inputs = np.asarray([r["input_length"] for r in rows], dtype=float)
    text_chars = TEXT_CHARS_PER_TOKEN * np.asarray(
        [min(block_tokens, int(r["input_length"]) - j * block_tokens) for r in rows for j in range(len(r["hash_ids"]))]
    )
    return Requests(
        arrival=t[order] - t[order[0]],
        input_tokens=inputs,
        output_tokens=np.asarray([r["output_length"] for r in rows], dtype=float),
        images=np.zeros(len(rows)),
        prefix=PrefixChains(
            block_tokens=block_tokens,
            offsets=np.r_[0, np.cumsum(lengths)].astype(np.int64),
            ids=ids,
            chars=text_chars.astype(np.int64),
            image_end=np.zeros(len(rows), dtype=np.int64),
        ),
    )


def add_shared_images(
    req: Requests, stats: TokenStats, rng: np.random.Generator, probability: float = IMAGE_PROBABILITY
) -> Requests:
    """Images on a trace with shared prefixes, kept consistent with its sharing.

    In arrival order, a request's new part (its blocks after the longest run an earlier request already had, and
    never the first block, the system prompt every conversation of the trace starts with) is its new message:
    with ``probability`` it starts with images (count and tokens per image drawn from ServeGen ``stats``, as many
    as fit in it with a text token left). They belong to the block they start in, so every later
    request that shares that block carries them too: a repeated image. Image tokens replace text tokens (the
    trace's prompt lengths stay); each image's block gains its data URL's characters (``URL_CHARS_PER_IMAGE_TOKEN``)
    and loses the text it replaces. A request's ``image_tokens`` is the mean over its images.
    """
    chains = req.prefix
    if chains is None:
        raise ValueError("add_shared_images needs a trace with shared prefixes")
    bt = chains.block_tokens
    _, _, count, per = stats.sample(len(req), rng)
    has = rng.uniform(size=len(req)) < probability
    message: dict[int, tuple[int, float]] = {}  # first block of a message with images: (images, their tokens)
    block_chars: dict[int, int] = {}  # each block's characters, fixed where it first appears
    chars = chains.chars.copy()
    images = np.zeros(len(req))
    image_tokens = np.zeros(len(req))
    image_end = np.zeros(len(req), dtype=np.int64)
    seen: set[int] = set()
    for k in range(len(req)):
        s0, s1 = int(chains.offsets[k]), int(chains.offsets[k + 1])
        blocks = [int(b) for b in chains.ids[s0:s1]]
        m = 0
        while m < len(blocks) and blocks[m] in seen:
            m += 1
        for j in range(m, len(blocks)):
            block_chars.setdefault(blocks[j], int(chains.chars[s0 + j]))
        m = max(m, 1)  # never in the first block: the system prompt every conversation starts with
        room = int(req.input_tokens[k]) - m * bt - 1
        n_img = max(int(count[k]), 1) if has[k] else 0
        size = float(per[k]) if per[k] > 0 else float(np.median(per[per > 0]))
        n_img = min(n_img, max(room, 0) // max(int(size), 1))
        if m < len(blocks) and n_img > 0:
            message[blocks[m]] = (n_img, n_img * size)
            block_chars[blocks[m]] += int(URL_CHARS_PER_IMAGE_TOKEN * n_img * size)
            covered = int(n_img * size)
            for j in range(m, len(blocks)):  # the text the images replace
                if covered <= 0:
                    break
                text = int(chains.chars[s0 + j]) // TEXT_CHARS_PER_TOKEN
                block_chars[blocks[j]] -= TEXT_CHARS_PER_TOKEN * min(covered, text)
                covered -= bt
        seen.update(blocks[m:])
        total = 0.0
        for j, b in enumerate(blocks):
            chars[s0 + j] = block_chars.get(b, chars[s0 + j])
            if b in message:
                n, tokens = message[b]
                images[k] += n
                total += tokens
                image_end[k] = max(image_end[k], j * bt + math.ceil(tokens))
        image_tokens[k] = total / images[k] if images[k] else 0.0
    return Requests(
        arrival=req.arrival,
        input_tokens=np.maximum(req.input_tokens - images * np.rint(image_tokens), 1.0),
        output_tokens=req.output_tokens,
        images=images,
        image_tokens=image_tokens,
        prefix=PrefixChains(bt, chains.offsets, chains.ids, chars, image_end),
    )


def load_count_series(
    path: Path | str, time_col: str, count_col: str, time_scale: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """(window starts in s from the first, requests in each window) from any CSV of request counts."""
    rows = _table(path, [time_col, count_col])
    t = _parse_times(path, rows, time_col) * time_scale
    counts = _numbers(path, rows, count_col, 0.0)
    order = np.argsort(t, kind="stable")
    repeats = np.flatnonzero(np.diff(t[order]) == 0)
    if repeats.size:
        i = int(order[repeats[0] + 1])
        raise ValueError(
            f"{path}: row {i + 2}: {time_col} {rows[i][time_col]!r} repeats another row's; expected one row per window"
        )
    return t[order] - t[order[0]], counts[order]


def load_rate_series(path: Path | str, model: str = "multimodal_mm-image") -> tuple[np.ndarray, np.ndarray]:
    """(window starts in s, rate in req/s) of one model in ServeGen's aggregate 10-minute series."""
    starts: list[float] = []
    rates: list[float] = []
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            if r["model"] == model:
                starts.append(float(r["timestamp"]))
                rates.append(float(r["rate_sum"]))
    if not starts:
        raise ValueError(f"{path}: no rows for model {model!r}")
    o = np.argsort(starts)
    return np.asarray(starts)[o], np.asarray(rates)[o]


def arrivals_from_rate(
    starts: np.ndarray, rates: np.ndarray, duration: float, rng: np.random.Generator, *, cv: float = 1.0
) -> np.ndarray:
    """Arrival times of a renewal process with Gamma gaps (CV ``cv``; 1 = Poisson) time-changed to a
    piecewise-constant rate (``rates[i]`` from ``starts[i]``, times relative to ``starts[0]``)."""
    s = np.asarray(starts, dtype=float) - float(starts[0])
    edges = np.r_[s, max(duration, s[-1] + (s[-1] - s[-2] if s.size > 1 else duration))]
    lam = np.asarray(rates, dtype=float)
    cum = np.r_[0.0, np.cumsum(lam * np.diff(edges))]  # the integrated rate at each edge
    total = float(np.interp(duration, edges, cum))
    shape = 1.0 / (cv * cv)
    n_guess = int(total * 1.2 + 10 * math.sqrt(total + 1) + 10)
    u = np.cumsum(rng.gamma(shape, 1.0 / shape, size=n_guess))
    while u[-1] < total:
        u = np.r_[u, u[-1] + np.cumsum(rng.gamma(shape, 1.0 / shape, size=n_guess))]
    u = u[u < total]
    return np.interp(u, cum, edges)  # invert the integrated rate


# ------------------------------------------------------------------------------------ mixes
def _quantile_sampler(mean: float, p50: float, p90: float, p99: float) -> tuple[np.ndarray, np.ndarray]:
    """Knots (u, value) of a piecewise-linear quantile function with these statistics."""
    rest = 0.25 * p50 + 0.2 * (p50 + p90) + 0.045 * (p90 + p99) + 0.01 * p99
    v0 = (mean - rest) / 0.25 if math.isfinite(mean) else p50 / 2
    v0 = min(max(v0, min(1.0, p50)), p50)
    return np.array([0.0, 0.5, 0.9, 0.99, 1.0]), np.array([v0, p50, p90, p99, p99])


@dataclass(frozen=True, eq=False)
class TokenStats:
    """Per client-window statistics of one ServeGen model: arrays of shape (rows, 4) = mean, p50, p90, p99."""

    text: np.ndarray
    image_tokens: np.ndarray
    image_count: np.ndarray
    output: np.ndarray

    def _draw(self, stats: np.ndarray, rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        u = rng.uniform(size=rows.size)
        out = np.empty(rows.size)
        for k in np.unique(rows):
            m = rows == k
            knots, vals = _quantile_sampler(*stats[k])
            out[m] = np.interp(u[m], knots, vals)
        return out

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(text tokens, output tokens, images, tokens per image) for n requests; one client-window each."""
        rows = rng.integers(0, self.text.shape[0], size=n)
        text = np.maximum(np.rint(self._draw(self.text, rows, rng)), 1.0)
        out = np.maximum(np.rint(self._draw(self.output, rows, rng)), 1.0)
        images = np.maximum(np.rint(self._draw(self.image_count, rows, rng)), 0.0)
        per = np.clip(np.rint(self._draw(self.image_tokens, rows, rng)), 1.0, MAX_IMAGE_TOKENS)
        return text, out, images, np.where(images > 0, per, 0.0)


def load_token_stats(path: Path | str, model: str = "multimodal_mm-image") -> TokenStats:
    """ServeGen per-client token statistics (rows with an image-token p50 for multimodal models)."""
    keys = {
        "text": "text_tokens",
        "image_tokens": "image_tokens",
        "image_count": "image_count",
        "output": "output_tokens",
    }
    cols: dict[str, list[list[float]]] = {k: [] for k in keys}
    stats = ("mean", "p50", "p90", "p99")
    rows = _table(path, ["model", *(f"{f}_{s}" for f in keys.values() for s in stats)])
    for i, r in enumerate(rows):
        if r["model"] != model or r["image_tokens_p50"] in ("", None) or r["text_tokens_p50"] in ("", None):
            continue
        for k, field_ in keys.items():
            try:
                cols[k].append([float(r[f"{field_}_{s}"] or "nan") for s in stats])
            except ValueError:
                raise ValueError(f"{path}: row {i + 2}: {field_}_*: expected numbers or empty cells") from None
    if not cols["text"]:
        raise ValueError(f"{path}: no multimodal token rows for {model!r}")
    return TokenStats(**{k: np.asarray(v) for k, v in cols.items()})


def add_images(
    req: Requests, stats: TokenStats, rng: np.random.Generator, probability: float = IMAGE_PROBABILITY
) -> Requests:
    """Give a text trace images: each request carries images with ``probability`` (counts >= 1 and
    tokens per image drawn from ServeGen ``stats``); its text tokens are kept."""
    n = len(req)
    has = rng.uniform(size=n) < probability
    _, _, count, per = stats.sample(n, rng)
    count = np.where(has, np.maximum(count, 1.0), 0.0)
    per = np.where(has, np.where(per > 0, per, np.median(per[per > 0]) if np.any(per > 0) else 360.0), 0.0)
    return Requests(
        arrival=req.arrival,
        input_tokens=req.input_tokens,
        output_tokens=req.output_tokens,
        images=count,
        image_tokens=per,
    )


def synth_multimodal(arrival: np.ndarray, stats: TokenStats, rng: np.random.Generator) -> Requests:
    """Requests at ``arrival`` with a ServeGen multimodal token and image mix."""
    text, out, images, per = stats.sample(arrival.size, rng)
    return Requests(arrival=np.sort(arrival), input_tokens=text, output_tokens=out, images=images, image_tokens=per)


# ------------------------------------------------------------------------------------ scaling and spikes
def mean_rate(req: Requests, duration: float | None = None) -> float:
    span = duration if duration is not None else (float(req.arrival[-1]) if len(req) else 0.0)
    return len(req) / span if span > 0 else 0.0


def smoothed_rate(req: Requests, duration: float, smooth: float = RATE_SMOOTH_S) -> np.ndarray:
    """The trace's arrival rate (req/s) in each second of [0, duration): per-second counts averaged over a
    centred window of ``smooth`` s (shrunk at the edges), rescaled so it integrates to ``len(req)``."""
    n_sec = max(math.ceil(duration), 1)
    counts = np.histogram(req.arrival, bins=np.arange(n_sec + 1, dtype=float))[0].astype(float)
    half = max(round(smooth / 2.0), 0)
    cum = np.r_[0.0, np.cumsum(counts)]
    lo = np.clip(np.arange(n_sec) - half, 0, n_sec)
    hi = np.clip(np.arange(n_sec) + half + 1, 0, n_sec)
    rate = (cum[hi] - cum[lo]) / (hi - lo)
    total = float(rate.sum())
    out: np.ndarray = rate * (counts.sum() / total) if total > 0 else rate
    return out


def scale_rate(req: Requests, factor: float, duration: float, rng: np.random.Generator) -> Requests:
    """Multiply the arrival rate by ``factor`` with independent arrivals: a non-homogeneous Poisson
    process whose rate is ``factor`` x the trace's ``smoothed_rate`` (its per-minute curve, bursts
    shorter than ``RATE_SMOOTH_S`` averaged out), each request's tokens and images drawn with
    replacement from the trace's requests."""
    if factor <= 0:
        raise ValueError("factor must be positive")
    if len(req) == 0:
        return req
    rate = smoothed_rate(req, duration) * factor
    t = arrivals_from_rate(np.arange(rate.size, dtype=float), rate, float(duration), rng)
    t = t[(t >= 0.0) & (t < duration)]
    mix = rng.integers(0, len(req), size=t.size)
    return req.take(mix, t)


Multiplier = Callable[[np.ndarray], np.ndarray]


def step_multiplier(onset: float, end: float, height: float) -> Multiplier:
    def m(t: np.ndarray) -> np.ndarray:
        return np.where((t >= onset) & (t < end), height, 1.0)

    return m


def ramp_multiplier(onset: float, ramp: float, end: float, height: float) -> Multiplier:
    """1 before ``onset``, linear to ``height`` over ``ramp`` s, ``height`` until ``end``, then 1."""

    def m(t: np.ndarray) -> np.ndarray:
        up = 1.0 + (height - 1.0) * np.clip((t - onset) / ramp, 0.0, 1.0)
        return np.where((t >= onset) & (t < end), up, 1.0)

    return m


def add_spike(req: Requests, onset: float, end: float, multiplier: Multiplier, rng: np.random.Generator) -> Requests:
    """Multiply the arrival rate by ``multiplier(t)`` inside [onset, end): independent extra arrivals
    (Poisson, rate ``(multiplier(t) - 1)`` x the requests' ``smoothed_rate``), with tokens and images
    resampled from the whole of ``req``."""
    if len(req) == 0 or end <= onset:
        return req
    base = smoothed_rate(req, float(req.arrival[-1]) + 1.0)
    starts = np.arange(onset, end, SPIKE_STEP_S)
    sec = np.clip(np.floor(starts).astype(np.int64), 0, base.size - 1)
    extra = np.maximum(multiplier(starts + SPIKE_STEP_S / 2.0) - 1.0, 0.0) * base[sec]
    t = onset + arrivals_from_rate(starts, extra, end - onset, rng)
    t = t[(t >= onset) & (t < end)]
    mix = rng.integers(0, len(req), size=t.size)
    return Requests.concat([req, req.take(mix, t)])
