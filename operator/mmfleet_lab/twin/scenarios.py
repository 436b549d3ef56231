"""The named benchmark scenarios (``docs/twin.md``), built from the traces in ``traces/`` beside this module."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

import numpy as np

from mmfleet.api import SloSpec
from mmfleet_lab.twin import traffic
from mmfleet_lab.twin.replica import H200_QWEN25VL7B, ReplicaParams
from mmfleet_lab.twin.sim import capacity_at_slo
from mmfleet_lab.twin.types import Requests, Scenario

AZURE_CONV = "azure2023_AzureLLMInferenceTrace_conv.csv"
AZURE_CODE = "azure2023_AzureLLMInferenceTrace_code.csv"
SERVEGEN_RATE = "servegen_aggregate_rate_10min.csv"
SERVEGEN_TOKENS = "servegen_client_token_stats_6h.csv"
SERVEGEN_DAY = "servegen_language_reason_rate_1day.csv"
GENTD_DAY = "alibaba_gentd26_lora_request_trace_2024-12-03.csv"
WHERE = (
    "Azure/AzurePublicDataset data/AzureLLMInferenceTrace_{conv,code}.csv (CC-BY 4.0), alibaba/ServeGen "
    "(Apache-2.0; aggregated as operator/mmfleet_lab/twin/traces/README.md describes) and alibaba/clusterdata "
    "cluster-trace-v2026-GenAI (research use), whose copies are the default; or put them in a folder and pass "
    "traces_dir= or --traces, or set MMFLEET_TRACES"
)
# ServeGen day series (10-minute rates): the twin plays the hour of the day whose rate varies most (max / min
# of its six windows), a rule fixed before any policy ran on them.
SERVEGEN_DAY_MODELS = {"servegen-language": "language_m-large", "servegen-reason": "reason_deepseek-r1"}
# The diffusion service's busiest day, its 24 hours played as one (a day's shape at a serving fleet's pace).
GENTD_TIME_SCALE = 1.0 / 24.0
# The SLO that "needs N replicas" is measured against when scenario() scales a trace (ASSUMED default).
REFERENCE_SLO = SloSpec(metric="e2e", percentile=90, target="10s", window="60s")
SPIKE_ONSET = 1200.0  # s into the trace
SPIKES: dict[str, tuple[str, float, float, float]] = {
    # name: (kind, height, ramp seconds, length seconds)
    "spike-x2": ("step", 2.0, 0.0, 600.0),
    "spike-x4": ("step", 4.0, 0.0, 600.0),
    "spike-x8": ("step", 8.0, 0.0, 600.0),
    "ramp-x4": ("ramp", 4.0, 60.0, 660.0),  # 60 s ramp to x4, then x4 for 10 min
    "flash-x8": ("step", 8.0, 0.0, 90.0),
    "bursts": ("bursts", 4.0, 0.0, 60.0),  # random bursts, see BURSTS
}
# "bursts": from BURSTS_FROM s on, a Poisson train of bursts (mean gap BURSTS_GAP s), each x1.5 up to the height for
# 20 s up to the length, drawn from the scenario's seed. Real traffic bursts within a minute (the Azure code trace,
# BurstGPT); a burst shorter than the cold start is over before a pod ordered for it is Ready. Scored as a steady
# hour (no spike windows): the bursts are the workload, not an event.
BURSTS_FROM = 300.0
BURSTS_GAP = 180.0
BURSTS_LOW = (1.5, 20.0)  # the least height and length of a burst
# A lasting change of the request mix where a spike would start, the arrival rate unchanged: each later request's
# output or text prompt tokens, or its images, times the factor ("a workload with another token mix", issue 25).
# Scored like a spike from the onset to the end of the trace.
SHIFTS: dict[str, tuple[str, float]] = {
    "outputs-x2": ("output_tokens", 2.0),
    "prompts-x2": ("input_tokens", 2.0),
    "images-x2": ("images", 2.0),
}
BASES = ("azure-conv", "azure-code", "servegen-mm", *SERVEGEN_DAY_MODELS, "gentd-diffusion")
ON = "@"  # "spike-x4@azure-code": a spike on another base than azure-conv
EVENTS = (*SPIKES, *SHIFTS)
NAMES = (*BASES, "trace", *EVENTS, *(f"{s}{ON}{b}" for s in EVENTS for b in BASES if b != "azure-conv"))


def parse(name: str) -> tuple[str, str | None]:
    """(base, spike or mix shift or None) of a scenario name: a plain spike or shift name is on azure-conv."""
    spike, _, base = name.partition(ON)
    if spike in EVENTS:
        return (base or "azure-conv"), spike
    return name, None


def changes_mix(name: str) -> bool:
    """Whether scenario ``name`` is a mix shift (``SHIFTS``) rather than a steady trace or a spike."""
    return parse(name)[1] in SHIFTS


def most_variable_hour(starts: np.ndarray, rates: np.ndarray, hour: float = 3600.0) -> float:
    """The start (s) of the whole hour whose windows' max / min rate is largest (``SERVEGEN_DAY_MODELS``)."""
    best, start = -1.0, float(starts[0])
    for h in np.arange(float(starts[0]), float(starts[-1]), hour):
        m = (starts >= h) & (starts < h + hour)
        if np.any(m) and rates[m].min() > 0 and rates[m].max() / rates[m].min() > best:
            best, start = float(rates[m].max() / rates[m].min()), float(h)
    return start


@dataclass(frozen=True)
class TraceFile:
    """A user's trace: a CSV with one row per request, or (``count_column`` set) a request-count series.

    Column names are the file's own; token and image columns are optional (the ServeGen mix fills in
    what is missing). Times are seconds after ``time_scale`` (e.g. 0.001 for milliseconds) or
    date-times. A count series gives the requests in the window starting at each row's time.
    """

    path: str
    time_column: str
    input_column: str | None = None
    output_column: str | None = None
    images_column: str | None = None
    count_column: str | None = None
    time_scale: float = 1.0

    def requests(self, stats: traffic.TokenStats, rng: np.random.Generator) -> tuple[Requests, float]:
        if self.count_column is not None:
            starts, counts = traffic.load_count_series(self.path, self.time_column, self.count_column, self.time_scale)
            window = float(np.median(np.diff(starts))) if starts.size > 1 else 60.0
            duration = float(starts[-1] - starts[0] + window)
            t = traffic.arrivals_from_rate(starts, counts / window, duration, rng)
            return traffic.synth_multimodal(t, stats, rng), duration
        req = traffic.load_csv(
            self.path,
            time_col=self.time_column,
            input_col=self.input_column,
            output_col=self.output_column,
            images_col=self.images_column,
            time_scale=self.time_scale,
        )
        duration = float(np.ceil(req.arrival[-1])) if len(req) else 0.0
        mix = traffic.synth_multimodal(req.arrival, stats, rng)
        req = Requests(
            arrival=req.arrival,
            input_tokens=req.input_tokens if self.input_column is not None else mix.input_tokens,
            output_tokens=req.output_tokens if self.output_column is not None else mix.output_tokens,
            images=req.images,
            image_tokens=req.image_tokens,
        )
        return (req if self.images_column is not None else traffic.add_images(req, stats, rng)), duration


TRACES: Final = Path(__file__).resolve().parent / "traces"  # the package's copies (traces/README.md)


def traces_dir(given: Path | None = None) -> Path:
    """``given``, else $MMFLEET_TRACES, else the package's own copies (``TRACES``)."""
    if given is not None:
        return Path(given)
    env = os.environ.get("MMFLEET_TRACES")
    if env:
        return Path(env)
    return TRACES


def _need(d: Path, name: str) -> Path:
    p = d / name
    if not p.exists():
        raise FileNotFoundError(f"{p} is missing. Get it from {WHERE}.")
    return p


def base_requests(
    name: str,
    d: Path,
    rng: np.random.Generator,
    *,
    servegen_start: float = 3600.0,
    duration: float = 3600.0,
    trace: TraceFile | None = None,
) -> tuple[Requests, float]:
    """The unscaled workload of a scenario and its duration."""
    stats = traffic.load_token_stats(_need(d, SERVEGEN_TOKENS))
    if name == "trace":
        if trace is None:
            raise ValueError("scenario 'trace' needs a trace file (--trace)")
        return trace.requests(stats, rng)
    if name == "gentd-diffusion":
        return TraceFile(str(_need(d, GENTD_DAY)), "gmt_create", time_scale=GENTD_TIME_SCALE).requests(stats, rng)
    if name in ("servegen-mm", *SERVEGEN_DAY_MODELS):
        if name == "servegen-mm":
            starts, rates = traffic.load_rate_series(_need(d, SERVEGEN_RATE))
        else:
            starts, rates = traffic.load_rate_series(_need(d, SERVEGEN_DAY), SERVEGEN_DAY_MODELS[name])
            servegen_start = most_variable_hour(starts, rates)
        m = (starts >= servegen_start) & (starts < servegen_start + duration)
        if not np.any(m):
            raise ValueError(f"no ServeGen windows in [{servegen_start}, {servegen_start + duration})")
        dur = min(duration, float(starts[m][-1] - starts[m][0] + 600.0))
        t = traffic.arrivals_from_rate(starts[m], rates[m], dur, rng)
        return traffic.synth_multimodal(t, stats, rng), dur
    file = AZURE_CODE if name == "azure-code" else AZURE_CONV
    req = traffic.load_azure(_need(d, file))
    dur = float(np.ceil(req.arrival[-1])) if len(req) else 0.0
    return traffic.add_images(req, stats, rng), dur


def bursts(req: Requests, duration: float, height: float, length: float, rng: np.random.Generator) -> Requests:
    """``req`` with the random bursts of the "bursts" scenario on top (``BURSTS_FROM``, ``BURSTS_GAP``)."""
    low_height, low_length = BURSTS_LOW
    t = BURSTS_FROM
    while True:
        t += rng.exponential(BURSTS_GAP)
        span = rng.uniform(low_length, length)
        if t + span > duration - 60.0:
            return req
        multiplier = traffic.step_multiplier(t, t + span, rng.uniform(low_height, height))
        req = traffic.add_spike(req, t, t + span, multiplier, rng)
        t += span


def scenario(
    name: str,
    *,
    replicas: int = 20,
    seed: int = 0,
    traces_dir: Path | None = None,
    params: ReplicaParams = H200_QWEN25VL7B,
    reference_slo: SloSpec = REFERENCE_SLO,
    rate: float | None = None,
    trace: TraceFile | None = None,
) -> Scenario:
    """A named scenario whose mean load needs ``replicas`` replicas of ``params`` at ``reference_slo``.

    Names: azure-conv, azure-code, servegen-mm (ServeGen mm-image, 01:00-02:00 of its day, Poisson
    arrivals at the 10-minute rates), servegen-language / servegen-reason (ServeGen m-large and
    deepseek-r1, their most variable hour), gentd-diffusion (Alibaba's diffusion service, a day played
    in an hour), and spikes starting at 20 min: spike-x2/x4/x8 (x2/x4/x8 for 10 min), ramp-x4 (60 s
    ramp to x4, held 10 min), flash-x8 (x8 for 90 s), or bursts (x1.5-4 for 20-60 s, every 3 min on average,
    from 5 min on), on azure-conv or, as ``spike@base``, on a base; or a lasting change of the mix from where a
    spike would start (``SHIFTS``: outputs-x2, prompts-x2, images-x2), named the same way; ``info["mu_slo"]`` stays
    the base mix's.
    ``seed`` draws the arrivals of the scaled and spiked traffic and the synthetic mix.
    The rate is scaled so that (mean arrival rate of the base trace) = replicas x mu_SLO, where
    mu_SLO = ``capacity_at_slo(params, mix, reference_slo)``; spikes come on top of that. ``rate``
    (req/s), if given, sets the mean rate directly instead (no capacity search). With ``trace``,
    scenario "trace" replays it, and the spikes come on top of it instead of azure-conv.
    """
    if name not in NAMES:
        raise ValueError(f"unknown scenario {name!r}; choose from {', '.join(NAMES)}")
    d = globals()["traces_dir"](traces_dir)
    rng = np.random.default_rng(seed)
    base_name, spike = parse(name)
    if trace is not None and spike is not None:
        base_name = "trace"
    req, duration = base_requests(base_name, d, rng, trace=trace)
    mu = capacity_at_slo(params, req, reference_slo) if rate is None else rate / max(replicas, 1)
    base_rate = traffic.mean_rate(req, duration)
    factor = replicas * mu / base_rate if base_rate > 0 else 1.0
    req = traffic.scale_rate(req, factor, duration, rng)
    spikes: tuple[tuple[float, float], ...] = ()
    onset = min(SPIKE_ONSET, duration / 3.0)
    if spike in SHIFTS:
        field, times = SHIFTS[spike]
        tokens = getattr(req, field)
        shifted = np.where(req.arrival >= onset, np.round(tokens * times), tokens).astype(tokens.dtype)
        req = replace(req, **{field: shifted})
        spikes = ((onset, duration),)
    elif spike is not None and SPIKES[spike][0] == "bursts":
        req = bursts(req, duration, SPIKES[spike][1], SPIKES[spike][3], rng)
    elif spike is not None:
        kind, height, ramp, length = SPIKES[spike]
        end = min(onset + length, duration)
        mult = (
            traffic.ramp_multiplier(onset, ramp, end, height)
            if kind == "ramp"
            else traffic.step_multiplier(onset, end, height)
        )
        req = traffic.add_spike(req, onset, end, mult, rng)
        spikes = ((onset, end),)
    info: dict[str, float | str] = {
        "base": base_name,
        "rate_factor": factor,
        "mu_slo": mu,
        "mean_rate": len(req) / duration if duration else 0.0,
    }
    return Scenario(name=name, requests=req, duration=duration, spikes=spikes, info=info)
