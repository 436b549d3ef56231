"""``mmfleet bench routing --spike``: does the shipped autoscaler under-react to a burst that the picker's flow control
holds, and would it help to count the picker's held requests as waiting (issue 24)?

The routing bench's fleet (``bench.routing``: the Mooncake conversation trace with images, mmfleet's rendered picker
configuration, the autoscaler as shipped on the same resource), with two changes that make the question askable:

- a burst: the trace's own arrivals of ``SPIKE.factor`` x ``SPIKE.length`` seconds played in ``SPIKE.length``
  seconds from ``SPIKE.onset`` (``compress``), so the burst is the trace's requests with their shared prefixes and
  images, none repeated; everything after comes earlier by the time saved;
- the servers' TTFT histograms count from when a request reached its server, as vLLM's do
  (``CompiledEngine(server_clock=True)``): a request's hold in the picker is in what its client sees, not in what
  the autoscaler reads.

Rows: ``mmfleet`` (``twin.Shipped``, what ships) and ``mmfleet+picker-held`` (``Shipped(picker_held=True)``, a lab
variant: the picker's flow-control queue, as Prometheus last scraped it, added to the servers' waiting requests).
The burst was chosen on the training minutes only (``SPIKE``); the test minutes are run once with it. A second cell,
``overload``, asks the same of a steady overload, where the servers' queues could sit at the picker's saturation
threshold while only its held requests grow: from the burst's onset, the rest of the split's trace played twice as
fast (``overload``), fixed by that rule before it ran (on the training minutes, x2 for 150 s: the two rows scaled
alike and met every window). Each row says how many requests the picker held at most, and for how long any.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from mmfleet.api import seconds
from mmfleet.routing import picker_config
from mmfleet_lab.bench import slo_metrics
from mmfleet_lab.bench.autoscale import Spread, num, pct
from mmfleet_lab.bench.report import table, write_section
from mmfleet_lab.bench.routing import COLD_START, SLO, SPLITS, WARMUP, WINDOW, Progress, Sizing, requests, resource
from mmfleet_lab.bench.traces import Role
from mmfleet_lab.twin import H200_QWEN25VL7B, Requests, Scenario, Shipped, simulate
from mmfleet_lab.twin.compiled import CompiledEngine
from mmfleet_lab.twin.picker import router


@dataclass(frozen=True)
class Spike:
    onset: float  # s after the split's start
    length: float  # s the burst lasts
    factor: float  # the burst plays this many seconds of the trace per second


# Chosen on the training minutes, before the test minutes were run: on them, x3 for 90 s, x6 for 40 s and x10 for 25 s
# left at most 6 requests held in the picker at a scrape; x15 for 20 s (5 minutes of the trace in 20 s) held 28.
SPIKE = Spike(onset=300.0, length=20.0, factor=15.0)
# The routing bench's maxReplicas (twice the fixed fleet) was reached before the burst on the training minutes (the
# first decision took 10 replicas to 19), where no signal could add a replica: four times the fixed fleet here.
MAX_PER_FIXED_SPIKE = 4
OVERLOAD_FACTOR = 2.0
Cell = Literal["burst", "overload"]
CELLS: tuple[Cell, ...] = ("burst", "overload")
VARIANTS = ("mmfleet", "mmfleet+picker-held")


def compress(req: Requests, spike: Spike) -> tuple[Requests, float]:
    """``req`` with its arrivals in [onset, onset + factor x length) played ``factor`` times as fast, and those after
    shifted earlier by the time saved; returns the requests and the time saved. Order, tokens, images and prefixes
    are kept."""
    saved = (spike.factor - 1.0) * spike.length
    t = req.arrival
    end = spike.onset + spike.factor * spike.length
    inside = (t >= spike.onset) & (t < end)
    moved = np.where(t < spike.onset, t, np.where(inside, spike.onset + (t - spike.onset) / spike.factor, t - saved))
    return req.take(np.arange(len(req)), moved), saved


def overload(role: Role) -> Spike:
    """From the burst's onset, the rest of the split's trace played ``OVERLOAD_FACTOR`` times as fast."""
    t0, t1 = SPLITS[role]
    return Spike(SPIKE.onset, (t1 - t0 - SPIKE.onset) / OVERLOAD_FACTOR, OVERLOAD_FACTOR)


def scenario(role: Role, seed: int, spike: Spike) -> Scenario:
    t0, t1 = SPLITS[role]
    req, saved = compress(requests(seed).window(t0, t1), spike)
    onset = spike.onset
    return Scenario(f"mooncake-conv {role} burst", req, t1 - t0 - saved, spikes=((onset, onset + spike.length),))


@dataclass(frozen=True)
class Row:
    cell: Cell
    variant: str
    seed: int
    ttft_p90: float  # as clients see it: the hold in the picker included; a 503 or an abandoned request is inf
    attainment: float
    gpu_hours: float
    rejected: int  # answered 503 by the picker (held past defaultRequestTTL)
    requests: int  # scored
    peak_replicas: int
    held_max: int  # requests held in front of the servers at once, at most (sampled every second)
    held_seconds: int  # seconds with any held
    seconds: float


def run(
    variant: str,
    seed: int,
    size: Sizing,
    role: Role = "test",
    cell: Cell = "burst",
    max_per_fixed: int = MAX_PER_FIXED_SPIKE,
) -> Row:
    scn = scenario(role, seed, SPIKE if cell == "burst" else overload(role))
    policy = Shipped(capacity_per_replica=size.capacity, picker_held=variant == "mmfleet+picker-held")
    picker = router(picker_config(resource(size), COLD_START), seed)
    started = time.monotonic()
    result = simulate(
        scn, policy, params=H200_QWEN25VL7B, cold_start=COLD_START, slo=SLO, min_replicas=1,
        max_replicas=max_per_fixed * size.replicas, initial_replicas=size.replicas, seed=seed, start=WARMUP,
        engine=functools.partial(CompiledEngine, router=picker, server_clock=True),
    )  # fmt: skip
    keep = result.arrival >= WARMUP
    ttft = result.ttft[keep]
    verdicts = slo_metrics.windows(
        result.arrival[keep], ttft, seconds(SLO.target), SLO.percentile, WINDOW, origin=WARMUP
    )
    hours = (result.gpu_seconds - size.replicas * WARMUP) / 3600.0
    return Row(cell, variant, seed, float(np.percentile(ttft, 90, method="higher")), slo_metrics.attainment(verdicts),
               hours, result.rejected, int(keep.sum()), int(result.desired.max()), int(result.held.max()),
               int(np.count_nonzero(result.held)), time.monotonic() - started)  # fmt: skip


def spread(values: Sequence[float], fmt: Callable[[float], str]) -> str:
    s = Spread.of(values)
    return fmt(s.mean) if fmt(s.low) == fmt(s.high) else f"{fmt(s.mean)} ({fmt(s.low)}–{fmt(s.high)})"


def report(rows: Sequence[Row]) -> str:
    headers = ["cell", "autoscaler", "seeds", "TTFT P90 (s)", "windows met %", "GPU-h", "503s", "503 %",
               "peak replicas", "held at most", "s with any held"]  # fmt: skip
    body = []
    for cell, name in itertools.product(CELLS, VARIANTS):
        group = [r for r in rows if (r.cell, r.variant) == (cell, name)]
        if not group:
            continue
        body.append([
            cell, name, str(len(group)),
            spread([r.ttft_p90 for r in group], lambda v: num(v, 3) if math.isfinite(v) else "inf"),
            spread([r.attainment for r in group], pct),
            spread([r.gpu_hours for r in group], lambda v: num(v, 3)),
            spread([float(r.rejected) for r in group], lambda v: f"{v:.0f}"),
            spread([100.0 * r.rejected / r.requests for r in group], lambda v: f"{v:.2f}"),
            spread([float(r.peak_replicas) for r in group], lambda v: f"{v:.1f}"),
            spread([float(r.held_max) for r in group], lambda v: f"{v:.0f}"),
            spread([float(r.held_seconds) for r in group], lambda v: f"{v:.0f}"),
        ])  # fmt: skip
    return table(headers, body)


def main(docs: Path, size: Sizing, progress: Progress, seeds: Sequence[int], workers: int) -> int:
    """The test minutes, once per cell (``CELLS``): the table printed and written to ``docs``."""
    started = time.monotonic()
    jobs = [(c, v, s) for c in CELLS for s in seeds for v in VARIANTS]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(run, v, s, size, cell=c) for c, v, s in jobs]
        rows = []
        for n, future in enumerate(futures, 1):
            row = future.result()
            rows.append(row)
            progress(f"   [{n}/{len(jobs)}] {row.cell} seed {row.seed} {row.variant}: TTFT P90 {row.ttft_p90:.3f}s, "
                     f"{row.attainment:.1%} windows, {row.gpu_hours:.3f} GPU-h, {row.rejected} 503s "
                     f"({row.seconds:.0f}s)")  # fmt: skip
    text = report(rows)
    print(f"\n{text}\n", flush=True)
    command = "mmfleet bench routing --spike " + " ".join(f"--seed {s}" for s in seeds)
    t0 = SPLITS["test"][0]
    steady = overload("test")
    body = (
        f"Command: `{command}` ({time.monotonic() - started:.0f} s on {os.cpu_count()} shared cores). The routing "
        f"bench's fleet with mmfleet's picker configuration (flow control on), autoscaled, on the test minutes in two "
        f"cells: `burst`, from minute {(t0 + SPIKE.onset) / 60:.0f} the trace's next "
        f"{SPIKE.factor * SPIKE.length:.0f} s of arrivals played in {SPIKE.length:.0f} s (x{SPIKE.factor:g}; later "
        f"arrivals come that much earlier), and `overload`, from minute {(t0 + steady.onset) / 60:.0f} the rest of "
        f"the test minutes' trace ({steady.factor * steady.length:.0f} s) played in {steady.length:.0f} s "
        f"(x{steady.factor:g}), where the run ends; "
        f"maxReplicas {MAX_PER_FIXED_SPIKE * size.replicas}; the servers' TTFT histograms count from when a request "
        "reached its server, as vLLM's do, so a hold in the picker is not in what the autoscaler reads. "
        "`mmfleet+picker-held` (a lab variant, not shipped) adds the picker's held requests, as last scraped, to the "
        "servers' waiting requests. TTFT P90 is the clients' (hold included; a 503 counts as infinite); `held` counts "
        "the requests held in front of the servers, sampled every second. The burst "
        "and maxReplicas were chosen on the training minutes, the overload by a rule fixed before it ran (see "
        "`bench/picker_signal.py`); the test minutes were run once per cell.\n\n" + text + "\n"
    )
    write_section(docs, "picker-signal", "Routing: the picker's held requests as an autoscaling signal", body)
    return 0
