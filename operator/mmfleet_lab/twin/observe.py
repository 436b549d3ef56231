"""The observation pipeline as in production: vLLM /metrics per pod -> Prometheus scrapes -> PromQL.

Each simulated pod exports the vLLM 0.33 series the autoscaler reads (``BACKEND.metrics`` in
``mmfleet.backends.vllm``; names and types as ``docs/backends.md``, "Metrics", gives them, default
buckets as the real 0.33.0 server exposed them: ``tests/data/vllm_h200_metrics_0.33.0.txt``).
``Prometheus`` keeps the scraped samples per pod and answers the queries a policy's ``Observation``
is built from, with the semantics of Prometheus' ``rate()`` (``extrapolatedRate`` in promql/functions.go) and
``histogram_quantile()`` (``bucketQuantile`` in promql/quantile.go), written from our knowledge of
that code (not re-read for this work):

- ``rate(c[w])`` at time t uses the samples in (t-w, t] of each series; with fewer than two it
  has no value. The increase (with counter resets added back) is extrapolated to the window
  edges: to each edge if the gap there is under 1.1x the mean sample spacing, else by half a
  spacing; towards the start never past the point where the counter would have been zero.
- ``histogram_quantile(q, sum by (le) (...))``: rank = q x count(+Inf); the first bucket whose
  cumulative count reaches the rank; linear interpolation inside it (lower edge 0 for the first
  bucket); a rank in the +Inf bucket returns the largest finite bound; no observations: NaN.
- Gauges (running, waiting, KV usage) come from each pod's last scrape; a pod's series go stale
  when it stops being scraped.

Simplifications: all pods are scraped at the same instants (every ``scrape_interval`` from t=0);
only Ready and draining pods are scraped (a loading vLLM pod serves no /metrics yet); a failed
query (Prometheus down) yields None for every metric field.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from mmfleet.api import SloMetric
from mmfleet.autoscaler.metrics import SIGNALS
from mmfleet.backends import Signal
from mmfleet.backends.vllm import BACKEND as VLLM

# vLLM 0.33's default buckets, as the real server exposed them (tests/data/vllm_h200_metrics_0.33.0.txt).
E2E_BUCKETS: Final = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
)  # fmt: skip
TTFT_BUCKETS: Final = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS: Final = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
# vllm:request_prompt_tokens and vllm:request_generation_tokens, observed as each request finishes: a 1-2-5 series
# up to the model's length, as the real server exposed them (its max_model_len above 20,000).
REQUEST_TOKEN_BUCKETS: Final = (
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0,
)  # fmt: skip


@dataclass(frozen=True)
class Layout:
    """Column offsets of one pod's counters in a flat vector (histograms as per-bucket counts)."""

    e2e: int
    ttft: int
    itl: int
    request_prompt: int
    request_generation: int
    success: int
    prompt: int
    generation: int
    width: int


def _layout() -> Layout:
    off = 0
    cols: dict[str, int] = {}
    for name, bounds in (
        ("e2e", E2E_BUCKETS),
        ("ttft", TTFT_BUCKETS),
        ("itl", ITL_BUCKETS),
        ("request_prompt", REQUEST_TOKEN_BUCKETS),
        ("request_generation", REQUEST_TOKEN_BUCKETS),
    ):
        cols[name] = off
        off += len(bounds) + 3  # buckets, +Inf, _sum, _count
    for name in ("success", "prompt", "generation"):
        cols[name] = off
        off += 1
    return Layout(width=off, **cols)


LAYOUT: Final = _layout()
HISTOGRAMS: Final[dict[str, tuple[int, tuple[float, ...]]]] = {
    "e2e": (LAYOUT.e2e, E2E_BUCKETS),
    "ttft": (LAYOUT.ttft, TTFT_BUCKETS),
    "itl": (LAYOUT.itl, ITL_BUCKETS),
    "request_prompt": (LAYOUT.request_prompt, REQUEST_TOKEN_BUCKETS),
    "request_generation": (LAYOUT.request_generation, REQUEST_TOKEN_BUCKETS),
}
LATENCIES: Final = ("e2e", "ttft", "itl")  # the histograms of seconds, of which a percentile may be an SLO
EPP_RATE_WINDOW: Final = 60.0  # the [1m] of llm-d's SLO-aware recording rules (baselines/llmd.py)
# Exported names, as Prometheus stores them (the twin's /metrics exporter uses the same).


class MetricBook:
    """Cumulative vLLM counters of every simulated pod (rows), written by the engines.

    Engines call ``observe``/``add`` many times per simulated second; the updates are queued and
    folded into the counters in one pass when someone reads them (a scrape), which keeps an
    engine step cheap.
    """

    def __init__(self) -> None:
        self._rows = np.zeros((0, LAYOUT.width))
        self._obs: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {h: [] for h in HISTOGRAMS}
        self._adds: list[tuple[np.ndarray, np.ndarray]] = []

    def add_replica(self) -> int:
        self._flush()
        self._rows = np.vstack([self._rows, np.zeros((1, LAYOUT.width))])
        return self._rows.shape[0] - 1

    @property
    def rows(self) -> np.ndarray:
        self._flush()
        return self._rows

    def observe(self, hist: str, rid: np.ndarray | int, values: np.ndarray | float) -> None:
        v = np.atleast_1d(np.asarray(values, dtype=float))
        if v.size == 0:
            return
        self._obs[hist].append((np.broadcast_to(np.asarray(rid, dtype=np.int64), v.shape), v))

    def add(self, column: int, rid: np.ndarray | int, amount: np.ndarray | float) -> None:
        r = np.atleast_1d(np.asarray(rid, dtype=np.int64))
        if r.size == 0:
            return
        a = np.broadcast_to(np.asarray(amount, dtype=float), r.shape)
        self._adds.append((r * LAYOUT.width + column, a))

    def _flush(self) -> None:
        flats: list[np.ndarray] = []
        wts: list[np.ndarray] = []
        for hist, items in self._obs.items():
            if not items:
                continue
            off, bounds = HISTOGRAMS[hist]
            nb = len(bounds)
            r = np.concatenate([x[0] for x in items])
            v = np.concatenate([x[1] for x in items])
            ones = np.ones_like(v)
            base = r * LAYOUT.width + off
            b = np.searchsorted(bounds, v, side="left")  # le semantics: value <= bound
            flats += [base + b, base + nb + 1, base + nb + 2]
            wts += [ones, v, ones]
            items.clear()
        for f, a in self._adds:
            flats.append(f)
            wts.append(a)
        self._adds.clear()
        if flats:
            view = self._rows.reshape(-1)
            view += np.bincount(np.concatenate(flats), weights=np.concatenate(wts), minlength=view.size)

    def export(self, rid: int) -> np.ndarray:
        """The pod's counters as scraped: histogram buckets cumulative (``_bucket{le=...}``)."""
        row = self.rows[rid].copy()
        for off, bounds in HISTOGRAMS.values():
            nb = len(bounds) + 1
            row[off : off + nb] = np.cumsum(row[off : off + nb])
        return np.asarray(row)


# ------------------------------------------------------------------------------------ PromQL
def extrapolated_rate(
    times: np.ndarray, values: np.ndarray, t: float, window: float, *, counter: bool = True
) -> np.ndarray | None:
    """Prometheus ``rate(x[window])`` evaluated at ``t`` for one series (``values``: samples x columns).

    ``times`` must already be restricted to (t - window, t]. Returns None with fewer than 2 samples.
    """
    n = times.shape[0]
    if n < 2:
        return None
    v = values
    if counter:  # add back counter resets
        drops = np.where(np.diff(v, axis=0) < 0, v[:-1], 0.0)
        increase = v[-1] - v[0] + drops.sum(axis=0)
    else:
        increase = v[-1] - v[0]
    first_t, last_t = float(times[0]), float(times[-1])
    sampled = last_t - first_t
    if sampled <= 0:
        return None
    avg = sampled / (n - 1)
    threshold = avg * 1.1
    to_start = first_t - (t - window)
    to_end = t - last_t
    if to_start >= threshold:
        to_start = avg / 2.0
    if to_end >= threshold:
        to_end = avg / 2.0
    start = np.full(increase.shape, to_start)
    if counter:
        with np.errstate(divide="ignore", invalid="ignore"):
            to_zero = np.where((increase > 0) & (v[0] >= 0), sampled * (v[0] / increase), np.inf)
        start = np.minimum(start, to_zero)
    factor = (sampled + start + to_end) / sampled
    return np.asarray(increase * factor / window)


def histogram_quantile(q: float, bounds: tuple[float, ...], cumulative: np.ndarray) -> float:
    """Prometheus ``histogram_quantile`` over cumulative bucket values (last one is +Inf)."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    counts = np.maximum.accumulate(np.asarray(cumulative, dtype=float))  # enforce monotonicity, as Prometheus does
    if counts.size < 2:
        return math.nan
    total = float(counts[-1])
    if total == 0 or math.isnan(total):
        return math.nan
    rank = q * total
    b = int(np.searchsorted(counts, rank, side="left"))
    if b >= len(bounds):  # the +Inf bucket
        return float(bounds[-1])
    if b == 0 and bounds[0] <= 0:
        return float(bounds[0])
    start = 0.0 if b == 0 else float(bounds[b - 1])
    end = float(bounds[b])
    count = float(counts[b])
    if b > 0:
        count -= float(counts[b - 1])
        rank -= float(counts[b - 1])
    if count == 0:
        return end
    return start + (end - start) * (rank / count)


@dataclass
class _Series:
    times: list[float] = field(default_factory=list)
    counters: list[np.ndarray] = field(default_factory=list)
    gauges: list[tuple[float, float, float]] = field(default_factory=list)  # running, waiting, kv usage


@dataclass
class Prometheus:
    """Samples scraped from each pod; answers the PromQL the autoscaler runs."""

    series: dict[int, _Series] = field(default_factory=dict)
    scrape_times: list[float] = field(default_factory=list)
    lookback: float = 300.0  # Prometheus' default staleness lookback for instant vectors

    def scrape(self, t: float, pods: list[tuple[int, np.ndarray, tuple[float, float, float]]]) -> None:
        self.scrape_times.append(t)
        for pid, counters, gauges in pods:
            s = self.series.setdefault(pid, _Series())
            s.times.append(t)
            s.counters.append(counters)
            s.gauges.append(gauges)

    def _window(self, s: _Series, t: float, window: float) -> tuple[np.ndarray, np.ndarray] | None:
        times = s.times
        if not times or times[-1] <= t - window:
            return None
        lo = len(times)
        while lo > 0 and times[lo - 1] > t - window:
            lo -= 1
        hi = len(times)
        while hi > lo and times[hi - 1] > t:
            hi -= 1
        if hi - lo < 2:
            return None
        return np.asarray(times[lo:hi]), np.vstack(s.counters[lo:hi])

    def sum_rate(self, t: float, window: float) -> np.ndarray | None:
        """``sum(rate(<every counter column>[window]))`` over pods; None if no series has 2 samples."""
        total: np.ndarray | None = None
        for s in self.series.values():
            w = self._window(s, t, window)
            if w is None:
                continue
            r = extrapolated_rate(w[0], w[1], t, window)
            if r is None:
                continue
            total = r if total is None else total + r
        return total

    def gauges(self, t: float) -> list[tuple[float, float, float]] | None:
        """Each live pod's gauges from its last scrape (a series is live if scraped at the last scrape)."""
        if not self.scrape_times:
            return None
        last = self.scrape_times[-1]
        if last < t - self.lookback:
            return None
        return [s.gauges[-1] for s in self.series.values() if s.times and s.times[-1] == last]

    def queue_growth(self, t: float, window: float) -> float | None:
        """Growth rate of sum(running + waiting) between the first and last scrape in the window."""
        pts = [x for x in self.scrape_times if t - window < x <= t]
        if len(pts) < 2:
            return None
        first, last = pts[0], pts[-1]
        q0 = q1 = 0.0
        for s in self.series.values():
            for tt, g in zip(s.times, s.gauges, strict=True):
                if tt == first:
                    q0 += g[0] + g[1]
                elif tt == last:
                    q1 += g[0] + g[1]
        return (q1 - q0) / (last - first)


def quantile_from_rates(rates: np.ndarray, hist: str, q: float) -> float:
    off, bounds = HISTOGRAMS[hist]
    return histogram_quantile(q, bounds, rates[off : off + len(bounds) + 1])


@dataclass(frozen=True)
class MetricView:
    """The metric fields of an ``Observation`` (None when Prometheus has no answer)."""

    request_rate: float | None = None
    arrival_rate: float | None = None
    latency: float | None = None
    waiting: float | None = None
    running: float | None = None
    kv_cache_usage: float | None = None
    prompt_tokens_rate: float | None = None
    generation_tokens_rate: float | None = None
    # Prompt and output tokens per request finished over the rate window; None when none finished.
    prompt_per_request: float | None = None
    output_per_request: float | None = None
    mean_ttft: float | None = None
    mean_itl: float | None = None
    extra: dict[str, float] = field(default_factory=dict)
    # The series Prometheus has none of, named as the operator names them (``metrics.signals_for``):
    # a missing series is not the same as a NaN latency (series present, no request finished).
    missing: tuple[str, ...] = ()


def _names(latency_metric: SloMetric | None, signals: Iterable[Signal]) -> tuple[str, ...]:
    """vLLM's names for a missing latency histogram and missing signals, in the operator's order."""
    names = VLLM.metrics
    histogram = () if latency_metric is None else (f"{names.histogram(latency_metric)}_bucket",)
    return (*histogram, *(names.series(s) for s in signals))


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def mean_from_rates(rates: np.ndarray, hist: str) -> float | None:
    """``rate(<hist>_sum) / rate(<hist>_count)``: None when nothing was observed in the window."""
    off, bounds = HISTOGRAMS[hist]
    total, count = rates[off + len(bounds) + 1], rates[off + len(bounds) + 2]
    return float(total / count) if count > 0 else None


def query(
    prom: Prometheus,
    t: float,
    *,
    slo_metric: SloMetric,
    slo_percentile: float,
    slo_window: float,
    rate_window: float,
    up: bool = True,
) -> MetricView:
    """What the autoscaler's one batched PromQL per cycle returns at time ``t``.

    ``latency`` = ``histogram_quantile(p, sum by (le) (rate(<slo metric>_bucket[slo_window])))``;
    ``request_rate`` = ``sum(rate(vllm:request_success_total[rate_window]))``; ``arrival_rate`` adds the
    growth of ``sum(running + waiting)`` over the rate window (clamped at 0). NaN results (no request
    finished in the window) are None: the policy must hold rather than read silence as zero latency.
    """
    if not up:
        return MetricView(extra={"prometheus_up": 0.0}, missing=_names(slo_metric, SIGNALS))
    rates = prom.sum_rate(t, rate_window)
    slo_rates = rates if slo_window == rate_window else prom.sum_rate(t, slo_window)
    gauges = prom.gauges(t)
    extra: dict[str, float] = {"prometheus_up": 1.0}
    request_rate = arrival_rate = prompt_rate = gen_rate = mean_ttft = mean_itl = None
    prompt_per_request = output_per_request = None
    if rates is not None:
        mean_ttft, mean_itl = mean_from_rates(rates, "ttft"), mean_from_rates(rates, "itl")
        prompt_per_request = mean_from_rates(rates, "request_prompt")
        output_per_request = mean_from_rates(rates, "request_generation")
        mean_e2e = mean_from_rates(rates, "e2e")
        if mean_e2e is not None:  # for a time-averaged concurrency (Little's law): Knative's queue-proxy measures it
            extra["mean_e2e"] = mean_e2e
        request_rate = float(rates[LAYOUT.success])
        prompt_rate = float(rates[LAYOUT.prompt])
        gen_rate = float(rates[LAYOUT.generation])
        growth = prom.queue_growth(t, rate_window)
        arrival_rate = max(request_rate + (growth or 0.0), 0.0)
    # llm-d's SLO-aware recording rules: histogram_quantile(0.9, sum by (le) (rate(<ttft|tpot>_bucket[1m]))),
    # on the servers' histograms where the router's stand in (baselines/llmd.py says how they differ).
    epp_rates = rates if rate_window == EPP_RATE_WINDOW else prom.sum_rate(t, EPP_RATE_WINDOW)
    if epp_rates is not None:
        for name, key in (("ttft", "p90_ttft_1m"), ("itl", "p90_tpot_1m")):
            p90 = _finite(quantile_from_rates(epp_rates, name, 0.9))
            if p90 is not None:
                extra[key] = p90
    latency = None
    if slo_rates is not None:
        latency = _finite(quantile_from_rates(slo_rates, slo_metric, slo_percentile / 100.0))
        for name in LATENCIES:
            v = _finite(quantile_from_rates(slo_rates, name, slo_percentile / 100.0))
            if v is not None:
                extra[f"{name}_p{slo_percentile:g}"] = v
    waiting = running = kv = None
    if gauges:
        running = float(sum(g[0] for g in gauges))
        waiting = float(sum(g[1] for g in gauges))
        kv = float(sum(g[2] for g in gauges) / len(gauges))
    absent = [s for s in SIGNALS if (rates is None if s == "request_rate" else not gauges)]
    missing = _names(slo_metric if slo_rates is None else None, absent)
    return MetricView(
        request_rate=request_rate,
        arrival_rate=arrival_rate,
        latency=latency,
        waiting=waiting,
        running=running,
        kv_cache_usage=kv,
        prompt_tokens_rate=prompt_rate,
        generation_tokens_rate=gen_rate,
        prompt_per_request=prompt_per_request,
        output_per_request=output_per_request,
        mean_ttft=mean_ttft,
        mean_itl=mean_itl,
        extra=extra,
        missing=missing,
    )
