"""``mmfleet bench cache``: what a shared model cache's shorter cold start is worth to the autoscaled fleet.

With the default per-replica cache (``spec.modelCache.volume: emptyDir``) every new pod downloads the weights
into its own empty volume and compiles again. With ``volume: shared`` every replica mounts one ReadWriteMany claim
holding the Hugging Face cache and vLLM's compile cache (``VLLM_CACHE_ROOT``, docs/backends.md), so a new pod reads
the weights from the claim and finds the compiled graphs. Each test cell runs at both cold starts, in the same twin
and harness as the autoscaling tables (``bench.autoscale.run_cell``), for the shipped autoscaler and the best
train-tuned baseline, on the same seeds (so the same arrivals) with either cache.

Two sets of cold starts, so that measured and assumed stay apart:

- *compile cache only*: 135 s (empty compile cache) against 105 s (warm), both measured to a healthy ``/health`` on
  an H200 with dummy weights, no weight download and no image pull (``../shared/calibration/real-vllm-h200``);
- *with the weights*: the same plus the weights' transfer, 135 s + size / download bandwidth against 105 s +
  size / the claim's read bandwidth. The size is looked up, the two bandwidths are assumptions (flags).

The image pull is the same with either cache and is left out of both. Cold starts are rounded to whole seconds.
"""

from __future__ import annotations

import math
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mmfleet_lab.bench import autoscale
from mmfleet_lab.bench.autoscale import Profiled, Progress, Row
from mmfleet_lab.bench.report import table, write_section
from mmfleet_lab.bench.traces import role as role_of
from mmfleet_lab.twin import H200_QWEN25VL7B, Shipped
from mmfleet_lab.twin.scenarios import NAMES, REFERENCE_SLO

# Measured: to a healthy /health on one H200, vLLM 0.33.0, dummy weights (../shared/calibration/real-vllm-h200).
COLD_COMPILE = 135.0  # empty compile cache (torch.compile 29 s of it)
COLD_WARM = 105.0  # compile cache warm
# Looked up: Qwen/Qwen2.5-VL-7B-Instruct in bf16, 8,292,166,656 parameters x 2 bytes, the `total_size` of the
# safetensors index of checkpoints of this architecture (see WEIGHT_SOURCE).
WEIGHT_BYTES = 16_584_333_312
WEIGHT_SOURCE = (
    "`total_size` 16,584,333,312 bytes in the safetensors index of Qwen2.5-VL-7B checkpoints, as copied in public "
    "code (exo's model card for Qwen/Qwen-Image, whose text encoder is Qwen2.5-VL-7B; a Lingshu-7B footprint script: "
    "8,292,166,656 parameters, 16,584,333,312 bytes), matching the Hub's '8.29B params, BF16' for this architecture "
    "and the twin's 16.6 GB (text 15.2 + vision 1.35, from the shapes); the official index itself was not reachable "
    "from here"
)
# Assumed: per-pod download from the Hub, and one pod's read from the claim, in MB/s (10^6 bytes).
DOWNLOAD_MBPS = 500.0
DOWNLOAD_SOURCE = (
    "the rate huggingface_hub's Python download reaches on a fast network (hf_transfer's README: a tool 'to go "
    "beyond ~500MB/s ... where Python cannot cap out the available bandwidth'); optimistic for a pod pulling from the "
    "Hub, so it understates what the shared cache saves"
)
SHARED_READ_MBPS = 1573.0
SHARED_READ_SOURCE = (
    "Amazon EFS's per-client read limit with Elastic throughput, 1,500 MiB/s = 1,573 MB/s "
    "(docs.aws.amazon.com/efs/latest/ug/performance.html; 500 MiB/s with Provisioned or Bursting throughput); "
    "Azure Files and NAS on ACK differ"
)
COMPILE_ONLY, WITH_WEIGHTS = "compile cache only (measured)", "with the weights (assumed bandwidths)"
# The best train-tuned baseline, a rule fixed before this benchmark ran: among the frozen picks of the scaling
# baselines (a static fleet never orders a pod, so its cold start changes nothing), the fewest violation-minutes
# on the training runs of `tuned.json`, then the fewest GPU-hours.
BASELINE_RULE = (
    "among the scaling baselines' frozen picks (not the static fleet, which never orders a pod), the fewest "
    "violation-minutes on the training runs recorded in `tuned.json`, then the fewest GPU-hours"
)


class FlagError(ValueError):
    """A flag value the benchmark cannot use; the message names the flag, the value and what is accepted."""


@dataclass(frozen=True)
class ColdStarts:
    """One set of cold starts: the per-replica cache's and the shared cache's, in whole seconds."""

    basis: str
    per_replica: float
    shared: float


def cold_starts(
    weight_bytes: float = WEIGHT_BYTES, download_mbps: float = DOWNLOAD_MBPS, shared_read_mbps: float = SHARED_READ_MBPS
) -> tuple[ColdStarts, ColdStarts]:
    """The measured set (compile cache only) and the set with the weights' transfer at the given bandwidths."""
    for flag, value in (("--weight-bytes", weight_bytes), ("--download-mbps", download_mbps),
                        ("--shared-read-mbps", shared_read_mbps)):  # fmt: skip
        if not (math.isfinite(value) and value > 0):
            raise FlagError(f"{flag}: {value:g}; a finite number above 0")
    download, read = weight_bytes / (download_mbps * 1e6), weight_bytes / (shared_read_mbps * 1e6)
    return (
        ColdStarts(COMPILE_ONLY, COLD_COMPILE, COLD_WARM),
        ColdStarts(WITH_WEIGHTS, float(round(COLD_COMPILE + download)), float(round(COLD_WARM + read))),
    )


def check_flags(scenarios: Sequence[str], seeds: Sequence[int], workers: int) -> None:
    """Refuse, before anything runs, what a worker would only fail on later."""
    unknown = [s for s in scenarios if s not in NAMES]
    if unknown:
        raise FlagError(f"--scenario: {', '.join(unknown)} is not a scenario; accepted: {', '.join(NAMES)}")
    negative = [s for s in seeds if s < 0]
    if negative:
        raise FlagError(f"--seed: {', '.join(map(str, negative))}; a whole number from 0")
    if workers < 1:
        raise FlagError(f"--workers: {workers}; at least 1")


def best_baseline(record: Mapping[str, Any]) -> str:
    """The baseline ``BASELINE_RULE`` picks from the frozen record (``tuned.json``)."""
    scores: list[tuple[float, float, str]] = []
    for family, setting in record["picked"].items():
        if family == "static":
            continue
        trial = next(t for t in record["sweeps"][family] if t["setting"] == setting)
        scores.append((trial["violation_minutes"], trial["gpu_hours"], family))
    if not scores:
        raise ValueError("tuned.json: no scaling baseline was picked")
    return min(scores)[2]


def ratio(shared: Sequence[Row], per_replica: Sequence[Row], field: str) -> float:
    """Mean over the seeds with the shared cache / the same with the per-replica cache: NaN when both are 0, inf
    when only the per-replica mean is."""
    num = float(np.mean([getattr(r, field) for r in shared]))
    den = float(np.mean([getattr(r, field) for r in per_replica]))
    if den == 0:
        return math.nan if num == 0 else math.inf
    return num / den


def fmt_ratio(value: float) -> str:
    return "- (0 in both)" if math.isnan(value) else ("∞" if math.isinf(value) else f"{value:.2f}")


@dataclass(frozen=True)
class Comparison:
    """One policy on one cell at one set of cold starts: its runs with each cache, seed by seed."""

    scenario: str
    starts: ColdStarts
    policy: str
    per_replica: list[Row]
    shared: list[Row]


def compare(
    scenario: str, starts: ColdStarts, policies: Sequence[Shipped | Profiled], seeds: Sequence[int], workers: int,
    progress: Progress,
) -> list[Comparison]:  # fmt: skip
    """Both cold starts of ``starts`` on one cell, through the autoscaling benchmark's own ``run_cell``."""
    runs: dict[float, list[Row]] = {}
    for cold in sorted({starts.per_replica, starts.shared}):
        progress(f"== {scenario} ({role_of(scenario)}), {starts.basis}, cold start {cold:.0f}s")
        rows, _ = autoscale.run_cell(scenario, cold, H200_QWEN25VL7B, REFERENCE_SLO, progress, workers, policies,
                                     seeds, oracle=False)  # fmt: skip
        runs[cold] = rows
    return [
        Comparison(
            scenario,
            starts,
            p.name,
            sorted((r for r in runs[starts.per_replica] if r.policy == p.name), key=lambda r: r.seed),
            sorted((r for r in runs[starts.shared] if r.policy == p.name), key=lambda r: r.seed),
        )
        for p in policies
    ]


_DOC = (__doc__ or "").split("\n\n", 1)[1]
HEADERS = ("cold starts", "cache", "L (s)", "policy", "seeds", "windows met %", "GPU-h", "violation-min",
           "worst recovery (s)", "GPU-h shared / per-replica", "violation-min shared / per-replica")  # fmt: skip


def cell_table(comparisons: Sequence[Comparison]) -> str:
    """Per policy and set of cold starts: each cache's mean (range over the seeds), and the ratios."""
    body = []
    for c in comparisons:
        for cache, rows, cold in (("per-replica", c.per_replica, c.starts.per_replica),
                                  ("shared", c.shared, c.starts.shared)):  # fmt: skip
            shared = cache == "shared"
            body.append([
                c.starts.basis, cache, f"{cold:.0f}", c.policy, str(len(rows)),
                autoscale.spread(rows, "attainment", autoscale.pct),
                autoscale.spread(rows, "gpu_hours", lambda v: autoscale.num(v, 1)),
                autoscale.spread(rows, "violation_minutes", lambda v: autoscale.num(v, 1)),
                _worst(rows),
                fmt_ratio(ratio(c.shared, c.per_replica, "gpu_hours")) if shared else "",
                fmt_ratio(ratio(c.shared, c.per_replica, "violation_minutes")) if shared else "",
            ])  # fmt: skip
    return table(HEADERS, body)


def _worst(rows: Sequence[Row]) -> str:
    worst = autoscale.summarize(rows).recover_seconds
    return "-" if math.isnan(worst) else ("never" if math.isinf(worst) else f"{worst:.0f}")


SUMMARY = ("cell", "policy", "cold starts", "L per-replica → shared (s)", "GPU-h per-replica → shared (ratio)",
           "violation-min per-replica → shared (ratio)", "windows met % per-replica → shared")  # fmt: skip


def summary_table(comparisons: Sequence[Comparison]) -> str:
    """One line per cell, policy and set of cold starts: the means and the ratios."""
    body = []
    for c in comparisons:
        per, sh = autoscale.summarize(c.per_replica), autoscale.summarize(c.shared)
        body.append([
            c.scenario, c.policy, c.starts.basis, f"{c.starts.per_replica:.0f} → {c.starts.shared:.0f}",
            f"{per.gpu_hours:.1f} → {sh.gpu_hours:.1f} ({fmt_ratio(ratio(c.shared, c.per_replica, 'gpu_hours'))})",
            f"{per.violation_minutes:.1f} → {sh.violation_minutes:.1f} "
            f"({fmt_ratio(ratio(c.shared, c.per_replica, 'violation_minutes'))})",
            f"{autoscale.pct(per.attainment)} → {autoscale.pct(sh.attainment)}",
        ])  # fmt: skip
    return table(SUMMARY, body)


def commit() -> str:
    """The commit of the code that ran (this file's checkout), marked when its operator/ tree differs from it."""
    here = Path(__file__).resolve().parent
    head = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False).stdout.strip()  # fmt: skip
    if not head:
        return "unknown (not a git checkout)"
    dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--", str(here.parents[1])],
                           capture_output=True, text=True, check=False).stdout.strip()  # fmt: skip
    return f"{head} with uncommitted changes under operator/" if dirty else head


def command_line(
    scenarios: Sequence[str], seeds: Sequence[int], weight_bytes: float, download_mbps: float, shared_read_mbps: float,
    workers: int,
) -> str:  # fmt: skip
    """The command that reproduces the section."""
    return " ".join([
        "mmfleet bench cache", *(f"--scenario {s}" for s in scenarios), *(f"--seed {s}" for s in seeds),
        f"--weight-bytes {weight_bytes:.0f}", f"--download-mbps {download_mbps:g}",
        f"--shared-read-mbps {shared_read_mbps:g}", f"--workers {workers}",
    ])  # fmt: skip


def main(
    scenarios: Sequence[str], seeds: Sequence[int], docs: Path, progress: Progress, baselines: Sequence[Profiled],
    record: Mapping[str, Any], tuned_from: str, weight_bytes: float = WEIGHT_BYTES,
    download_mbps: float = DOWNLOAD_MBPS, shared_read_mbps: float = SHARED_READ_MBPS, workers: int = 2,
) -> int:  # fmt: skip
    """Run every cell at both sets of cold starts, print the tables and write the section."""
    started = time.monotonic()
    sets = cold_starts(weight_bytes, download_mbps, shared_read_mbps)
    baseline = best_baseline(record)
    policies: list[Shipped | Profiled] = [Shipped(), *(b for b in baselines if b.name == baseline)]
    comparisons: list[Comparison] = []
    sections = []
    for name in scenarios:
        got = [c for s in sets for c in compare(name, s, policies, seeds, workers, progress)]
        comparisons += got
        text = cell_table(got)
        print(f"\n{name}\n{text}\n", flush=True)
        sections.append(f"### {name} ({role_of(name)})\n\n{text}\n")
    summary = summary_table(comparisons)
    print(summary, flush=True)
    command = command_line(scenarios, seeds, weight_bytes, download_mbps, shared_read_mbps, workers)
    measured, assumed = sets
    body = (
        f"Command: `{command}` ({time.monotonic() - started:.0f} s on {os.cpu_count()} shared cores), at commit "
        f"{commit()}: the `mmfleet` row is the shipped autoscaler (`twin.Shipped`, `autoscaler.cycle.decide` with "
        f"the operator's defaults) with that commit's `autoscaler/policy.py`.\n\n{_DOC}"
        "\n**Measured and assumed.**\n\n"
        f"- Measured: {COLD_COMPILE:.0f} s to healthy with an empty compile cache, {COLD_WARM:.0f} s with it warm "
        "(one H200, vLLM 0.33.0, a Qwen2.5-7B-shaped text model with dummy weights: no vision encoder, no weight "
        "download, no image pull; one start each).\n"
        f"- Looked up: the weights, {weight_bytes / 1e9:.2f} GB: {WEIGHT_SOURCE}.\n"
        f"- Assumed, `--download-mbps {download_mbps:g}`: per-pod download from the Hub, "
        f"{weight_bytes / (download_mbps * 1e6):.1f} s: {DOWNLOAD_SOURCE}.\n"
        f"- Assumed, `--shared-read-mbps {shared_read_mbps:g}`: one pod reading the weights from the claim, "
        f"{weight_bytes / (shared_read_mbps * 1e6):.1f} s: {SHARED_READ_SOURCE}.\n"
        "- Not modelled: the image pull (the same with either cache), loading the downloaded weights from the "
        "node's disk (taken as free after the download), the first pod that fills the claim (the shared rows "
        "assume it is filled), and several pods reading the claim at once (each gets the per-client rate).\n\n"
        f"Cold starts: {measured.basis} {measured.per_replica:.0f} s → {measured.shared:.0f} s; {assumed.basis} "
        f"{assumed.per_replica:.0f} s → {assumed.shared:.0f} s.\n\n"
        f"Policies: `mmfleet`, and `{baseline}`, the best train-tuned baseline by a rule fixed before this ran: "
        f"{BASELINE_RULE} ({tuned_from}). Same twin, SLO (P{REFERENCE_SLO.percentile:g} {REFERENCE_SLO.metric} ≤ "
        f"{REFERENCE_SLO.target} over {autoscale.WINDOW:.0f} s windows), warm-up, initial fleet (sized for each "
        "cold start) and maxReplicas as the autoscaling tables; no oracle. Means over the seeds, the range in "
        "brackets; a ratio is the shared cache's mean over the per-replica cache's (the same seeds, so the same "
        "arrivals).\n\n" + summary + "\n\n" + "\n".join(sections)
    )
    write_section(docs, "cache", "What a shared model cache's shorter cold start is worth (digital twin)", body)
    return 0
