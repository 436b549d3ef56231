"""The twin with images against a real vLLM 0.33.0 server on one H200 (issue 27): replays, the fit, the ratio table.

The same method as ``compare_mm.py`` in the calibration notes: each request the server served is fed to one replica of
the compiled engine with its text tokens (the server's prompt tokens less the image tokens), its images and its 150
output tokens; batch-1 requests one at a time, a load phase at the same send offsets. Ratios are real / twin.

The split, fixed before the fit was run: **fit** on the default server start (its batch-1 cells, its load phases at
2, 5, 10 and 20 req/s); **held out**: the start with the processor cache off (its batch-1 cells, 10 and 20 req/s at
448x448, 5 req/s at 1280x720). 40 req/s (cache off) is past saturation: reported, with no goal.

What is fitted: the encoder call's launch (``ENCODER_LAUNCH_MS``) and the API process's event-loop pass per running
request (``API_PASS_MS``), together, on one grid.

``python -m mmfleet_lab.twin.calibrate_mm [--fit]`` prints the table of ``docs/twin.md`` (with ``--fit``, the grid
fit first, then the table at its point).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final, Literal

import numpy as np

from mmfleet_lab.twin.calibrate import BATCH1_GAP_S, Phase, image_tokens, make_phase, replay
from mmfleet_lab.twin.replica import H200_QWEN25VL7B, ReplicaParams

BATCH1_FILE: Final = "vllm_h200_mm_batch1.csv"
LOAD_FILES: Final = ("vllm_h200_mm_load_below_saturation.csv", "vllm_h200_mm_load_overload.csv")
FIT_SERVER: Final = "default"
OVERLOAD_RATE: Final = 40.0
BAND: Final = (0.9, 1.1)
# The grid of the fit: the API process's event-loop pass per running request, ms, and an encoder call's launch, ms
# (base, per image).
API_PASS_GRID: Final = tuple(0.25 * i for i in range(13))  # 0 to 3 ms
LAUNCH_BASE_GRID: Final = tuple(2.5 * i for i in range(33))  # 0 to 80 ms
LAUNCH_PER_IMAGE_GRID: Final = tuple(1.0 * i for i in range(9))  # 0 to 8 ms
METRICS: Final = ("ttft_p50", "ttft_p90", "e2e_p50", "e2e_p90")


@dataclass(frozen=True)
class Cell:
    """One batch-1 cell (images of one size, one count) or one load phase of one server start."""

    server: str  # "default" or "mm_cache_off"
    part: Literal["batch1", "load"]
    size: str  # "448x448", "1280x720"; "-" for text only
    images: int
    rate: float  # offered req/s (0 for batch 1)
    phase: Phase

    @property
    def name(self) -> str:
        what = f"{self.images} x {self.size}" if self.images else "text only"
        where = "batch 1" if self.part == "batch1" else f"{self.rate:g} req/s"
        return f"{self.server}: {where}, {what}"

    @property
    def fit(self) -> bool:
        return self.server == FIT_SERVER

    @property
    def overload(self) -> bool:
        return self.rate >= OVERLOAD_RATE


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _tokens(rs: list[dict[str, str]]) -> tuple[list[float], list[float], list[float]]:
    n = [float(r["n_img"]) for r in rs]
    tpi = [float(image_tokens(int(r["img_w"]), int(r["img_h"]))) if k else 0.0 for r, k in zip(rs, n, strict=True)]
    text = [float(r["prompt_tokens"]) - a * b for r, a, b in zip(rs, n, tpi, strict=True)]
    return text, n, tpi


def cells(data: Path) -> list[Cell]:
    """The batch-1 cells of fresh JPEG images (0, 1, 2, 4 at each size) and the load phases, from ``data``."""
    out: list[Cell] = []
    batch1 = [r for r in _rows(data / BATCH1_FILE) if r["kind"] == "fresh"]
    for server, w, h, n in sorted({(r["server"], r["img_w"], r["img_h"], int(r["n_img"])) for r in batch1}):
        rs = [r for r in batch1 if (r["server"], r["img_w"], r["img_h"], int(r["n_img"])) == (server, w, h, n)]
        text, imgs, tpi = _tokens(rs)
        ph = make_phase(f"{server} batch 1", rs, text, imgs, tpi)
        ph = replace(ph, send=BATCH1_GAP_S * np.arange(len(rs), dtype=float))  # one at a time
        out.append(Cell(server, "batch1", f"{w}x{h}" if n else "-", n, 0.0, ph))
    load = [r for f in LOAD_FILES for r in _rows(data / f)]
    for server, phase in sorted({(r["server"], r["phase"]) for r in load}):
        rs = [r for r in load if (r["server"], r["phase"]) == (server, phase)]
        text, imgs, tpi = _tokens(rs)
        r0 = rs[0]
        ph = make_phase(f"{server} load {phase}", rs, text, imgs, tpi)
        out.append(Cell(server, "load", f"{r0['img_w']}x{r0['img_h']}", int(r0["n_img"]), float(r0["rate"]), ph))
    return out


def ratios(params: ReplicaParams, cell: Cell) -> dict[str, float]:
    """Real / twin TTFT and e2e at P50 and P90 (0 where the twin leaves a request unfinished)."""
    ttft, e2e, _ = replay(params, cell.phase)
    out = {}
    for name, real, twin in (("ttft", cell.phase.ttft, ttft), ("e2e", cell.phase.e2e, e2e)):
        for q in (50, 90):
            ok = bool(np.isfinite(twin).all())
            out[f"{name}_p{q}"] = float(np.percentile(real, q) / np.percentile(twin, q)) if ok else 0.0
    return out


def fit_error(params: ReplicaParams, fit_cells: list[Cell]) -> float:
    """Sum over the fit cells of the squared log ratios of the goal's metrics (TTFT and e2e, P50 and P90)."""
    err = 0.0
    for c in fit_cells:
        r = ratios(params, c)
        for k in METRICS:
            err += math.log(r[k]) ** 2 if r[k] > 0 else math.inf
    return err


def fit(base: ReplicaParams, data: Path) -> ReplicaParams:
    """The API pass and the encoder launch (base, per image) at the grid point of least ``fit_error`` on the fit
    part."""
    fit_cells = [c for c in cells(data) if c.fit and c.images and not c.overload]
    best, best_err = base, math.inf
    for g, a, b in itertools.product(API_PASS_GRID, LAUNCH_BASE_GRID, LAUNCH_PER_IMAGE_GRID):
        cand = replace(base, api_pass_ms=g, encoder_launch_ms=(a, b))
        err = fit_error(cand, fit_cells)
        if err < best_err:
            best, best_err = cand, err
    return best


def table(params: ReplicaParams, data: Path) -> str:
    """The ratio table of ``docs/twin.md``: one row per cell, bold outside the band (not asked in overload)."""
    lines = [
        "| cell | part | requests | TTFT P50 | TTFT P90 | e2e P50 | e2e P90 |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for c in cells(data):
        r = ratios(params, c)
        part = "overload" if c.overload else ("fit" if c.fit else "held out")

        def show(v: float, c: Cell = c) -> str:
            s = f"{v:.2f}"
            return s if c.overload or BAND[0] <= v <= BAND[1] else f"**{s}**"

        lines.append(f"| {c.name} | {part} | {c.phase.send.size} | " + " | ".join(show(r[k]) for k in METRICS) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("tests/data"), help="the directory of the CSVs (tests/data)")
    ap.add_argument("--fit", action="store_true", help="run the grid fit first and show the table at its point")
    args = ap.parse_args()
    params = H200_QWEN25VL7B
    if args.fit:
        params = fit(params, args.data)
        print(f"fitted: api_pass_ms {params.api_pass_ms}, encoder_launch_ms {params.encoder_launch_ms}")
    print(table(params, args.data))


if __name__ == "__main__":
    main()
