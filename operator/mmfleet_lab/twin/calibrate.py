"""Held-out calibration of the twin's fitted overheads against a real vLLM 0.33.0 server on one H200.

The overheads (``host_ms_base``, ``host_ms_per_seq``, ``request_overhead_s``) are fitted on one part of
the real measurements and judged on the other, so that the band the tests assert is a prediction, not a
restatement of the fit. The split was fixed before any result was looked at (``docs/twin.md``):

- **fit**: the text runs at 2 and 10 req/s, and batch-1 run 1's lone 512-token decodes;
- **held out**: the text runs at 5 and 20 req/s, batch-1 run 2's decodes, and the image (one JPEG per
  request) load phases below saturation: 2, 5, 10, 20 req/s at 448x448 with the default settings,
  10 and 20 req/s at 448x448 and 5 req/s at 1280x720 with the processor cache off. 40 req/s is left
  out: its e2e grows through the phase (7.5 s, 12.7 s, 14.1 s medians by thirds) and the server
  served 34 req/s of 40, so it is past saturation; the text runs saturate between 20 and 30 req/s.
  (The text overheads were not fitted on the image phases; since issue 27 the encoder's launch is, on those of the
  default start: ``calibrate_mm``.)

Replays feed the same requests, at the same send offsets and with the same token and image counts, to
one replica of the compiled engine, as ``compare.py`` and ``compare_mm.py`` next to the data did.
"""

from __future__ import annotations

import csv
import itertools
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from mmfleet_lab.twin.compiled import CompiledEngine
from mmfleet_lab.twin.engine import Workload
from mmfleet_lab.twin.replica import ReplicaParams
from mmfleet_lab.twin.types import Requests

TEXT_FILE = "vllm_h200_requests_rates_2_5_10_20.csv"
MM_FILE = "vllm_h200_mm_load_below_saturation.csv"
FIT_TEXT_RATES = (2.0, 10.0)
HELD_OUT_TEXT_RATES = (5.0, 20.0)
FIT_BATCH1_RUN = 1
HELD_OUT_BATCH1_RUN = 2
# The grid of the fit: ms per sequence per step, and s per request before it can be scheduled.
PER_SEQ_GRID = tuple(0.0025 * i for i in range(25))  # 0 to 0.06 ms
REQUEST_OVERHEAD_GRID = tuple(0.0025 * i for i in range(41))  # 0 to 100 ms
BATCH1_GAP_S = 60.0  # lone requests are replayed this far apart, so none overlaps another


@dataclass(frozen=True)
class Phase:
    """Requests as the client sent them and what the real server took (e2e and TTFT, client clock)."""

    name: str
    send: np.ndarray  # seconds from the first request
    input_tokens: np.ndarray  # text tokens of the prompt (image tokens apart)
    output_tokens: np.ndarray
    images: np.ndarray
    image_tokens: np.ndarray  # per image
    ttft: np.ndarray
    e2e: np.ndarray


def make_phase(
    name: str, rows: list[dict[str, str]], text: list[float], images: list[float], per_image: list[float]
) -> Phase:
    send = np.array([float(r["t_send"]) for r in rows])
    order = np.argsort(send, kind="stable")
    first = np.array([float(r["t_first"]) for r in rows])[order]
    end = np.array([float(r["t_end"]) for r in rows])[order]
    s = send[order]
    return Phase(
        name=name,
        send=s - s[0],
        input_tokens=np.asarray(text, dtype=float)[order],
        output_tokens=np.array([float(r["n_out_req"]) for r in rows])[order],
        images=np.asarray(images, dtype=float)[order],
        image_tokens=np.asarray(per_image, dtype=float)[order],
        ttft=first - s,
        e2e=end - s,
    )


def text_phases(data: Path) -> dict[float, Phase]:
    """The text-only open-loop runs below saturation (2, 5, 10, 20 req/s), by offered rate."""
    with open(data / TEXT_FILE, newline="") as fh:
        rows = list(csv.DictReader(fh))
    out: dict[float, Phase] = {}
    for ph in sorted({r["phase"] for r in rows}):
        rs = [r for r in rows if r["phase"] == ph]
        zeros = [0.0] * len(rs)
        rate = float(rs[0]["rate"])
        out[rate] = make_phase(f"text {rate:g} req/s", rs, [float(r["n_in"]) for r in rs], zeros, zeros)
    return out


def image_tokens(w: int, h: int, factor: int = 28) -> int:
    """Qwen2-VL's resize to multiples of 28 pixels, one token per 28x28 block (our images need no clamp)."""
    return max(factor, round(h / factor) * factor) // factor * (max(factor, round(w / factor) * factor) // factor)


def mm_phases(data: Path) -> list[Phase]:
    """The image load phases below saturation; text tokens are the server's prompt tokens less the image's."""
    with open(data / MM_FILE, newline="") as fh:
        rows = list(csv.DictReader(fh))
    out = []
    for key in sorted({(r["server"], r["phase"]) for r in rows}):
        rs = [r for r in rows if (r["server"], r["phase"]) == key]
        n = [float(r["n_img"]) for r in rs]
        tpi = [float(image_tokens(int(r["img_w"]), int(r["img_h"]))) for r in rs]
        text = [float(r["prompt_tokens"]) - a * b for r, a, b in zip(rs, n, tpi, strict=True)]
        name = f"image {rs[0]['img_w']}x{rs[0]['img_h']} {float(rs[0]['rate']):g} req/s ({key[0]})"
        out.append(make_phase(name, rs, text, n, tpi))
    return out


def batch1_decodes(data: Path, run: int) -> Phase:
    """A batch-1 run's lone 512-token decodes (128-token prompts), replayed one at a time."""
    with open(data / f"vllm_h200_batch1_run{run}.csv", newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["kind"] == "decode512"]
    n = len(rows)
    send = BATCH1_GAP_S * np.arange(n, dtype=float)
    return Phase(
        name=f"batch-1 run {run}, 512-token decodes",
        send=send,
        input_tokens=np.array([float(r["n_in"]) for r in rows]),
        output_tokens=np.array([float(r["n_out"]) for r in rows]),
        images=np.zeros(n),
        image_tokens=np.zeros(n),
        ttft=np.array([float(r["ttft"]) for r in rows]),
        e2e=np.array([float(r["e2e"]) for r in rows]),
    )


def replay_engine(params: ReplicaParams, phase: Phase) -> CompiledEngine:
    """One replica of the twin after the phase's requests went through it."""
    req = Requests(phase.send, phase.input_tokens, phase.output_tokens, phase.images, phase.image_tokens)
    eng = CompiledEngine(params, Workload.build(req, params))
    eng.add_replica()
    eng.run(0.0, float(phase.send[-1]) + 600.0, np.arange(len(req)), np.array([0]))
    return eng


def replay(params: ReplicaParams, phase: Phase) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(TTFT, e2e, inter-token latency) of the phase's requests through one replica of the twin."""
    eng = replay_engine(params, phase)
    return eng.outcomes.ttft.copy(), eng.outcomes.e2e.copy(), eng.outcomes.itl.copy()


def e2e_ratios(params: ReplicaParams, phase: Phase) -> tuple[float, float]:
    """Real over twin e2e at P50 and P90 (0 if the twin does not finish every request)."""
    _, e2e, _ = replay(params, phase)
    if not np.isfinite(e2e).all():
        return (0.0, 0.0)
    p50, p90 = (float(np.percentile(phase.e2e, q) / np.percentile(e2e, q)) for q in (50, 90))
    return (p50, p90)


def fit(base: ReplicaParams, data: Path) -> ReplicaParams:
    """The overheads fitted on the fit part only.

    ``host_ms_base`` is what makes the twin's lone decode step the real one (batch-1 run 1, median TPOT);
    then ``host_ms_per_seq`` and ``request_overhead_s`` are the grid point that minimises the sum of
    squared log ratios of real over twin e2e P50 and P90 at 2 and 10 req/s (text), with
    ``host_ms_base`` re-derived at each point so the lone decode stays matched.
    """
    decodes = batch1_decodes(data, FIT_BATCH1_RUN)
    real_tpot = float(np.median((decodes.e2e - decodes.ttft) / (decodes.output_tokens - 1.0)))
    bare = replace(base, host_ms_base=0.0, host_ms_per_seq=0.0, request_overhead_s=0.0)
    gpu_ms = 1e3 * float(np.median(replay(bare, decodes)[2]))  # the modelled step of a lone decode
    phases = [text_phases(data)[rate] for rate in FIT_TEXT_RATES]
    best, best_err = base, math.inf
    for per_seq, overhead in itertools.product(PER_SEQ_GRID, REQUEST_OVERHEAD_GRID):
        host_base = round(1e3 * real_tpot - gpu_ms - per_seq, 3)
        cand = replace(base, host_ms_base=host_base, host_ms_per_seq=per_seq, request_overhead_s=overhead)
        err = sum(math.log(r) ** 2 if r > 0 else math.inf for p in phases for r in e2e_ratios(cand, p))
        if err < best_err:
            best, best_err = cand, err
    return best


def held_out(data: Path) -> list[Phase]:
    """The held-out phases, all below saturation, in the order the docs' table lists them."""
    texts = text_phases(data)
    return [texts[r] for r in HELD_OUT_TEXT_RATES] + [batch1_decodes(data, HELD_OUT_BATCH1_RUN)] + mm_phases(data)
