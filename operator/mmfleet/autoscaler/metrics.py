"""The autoscaler's signals for every fleet at once, from Prometheus (through prometheus-api-client).

One PromQL query per signal per cycle, whatever the number of fleets: each query groups by the
labels the PodMonitor relabelling stamps on every series (``namespace`` and ``mmfleet_io_inference``),
and fleets on different backends share it through ``or``, each side tagged with its backend by
``label_replace`` so a fleet is never credited with another backend's series. The SLO latency needs
one query per distinct (metric, percentile, window) among the fleets; the queries of a cycle go out side
by side, a few at a time, within one deadline (``Prometheus.read`` says why not as one query).

Two kinds of silence are kept apart, because the operator says different things about them:
Prometheus giving no answer at all (``Readings.outage``) and Prometheus answering without a series
for one fleet (``Signals.missing``). Either way the autoscaler holds; neither is read as zero.

Nothing read is trusted blindly, and one fleet's bad answer stays that fleet's: a query Prometheus
refuses, does not answer in time, or answers with what is not a number, marks only the fleets that
needed it (``Signals.failed``); only an unreachable Prometheus, or one silent on the queries every fleet
needs, is an outage for all. Whether the numbers are plausible is judged by ``cycle``, which knows how
many pods are Ready.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any, Final, Literal, NamedTuple, get_args

import requests
from prometheus_api_client.exceptions import PrometheusApiClientException
from prometheus_api_client.prometheus_connect import PrometheusConnect
from urllib3.util.retry import Retry

from mmfleet import backends, routing
from mmfleet.api import BackendName, MultimodalInference, SloMetric, seconds
from mmfleet.backends import Signal, vllm

# Set on every series by the PodMonitor relabelling (render.build_pod_monitor) and by a plain
# Prometheus with the kubernetes_sd_configs of docs/autoscaling.md.
FLEET_LABELS = ("namespace", "mmfleet_io_inference")
BACKEND_LABEL = "mmfleet_backend"
# Completions per second are averaged over this window, as in the benchmark's twin (twin.sim); it
# should span at least four scrapes.
RATE_WINDOW = "1m"
READ_DEADLINE = 5.0  # seconds a whole read may take, unless told (the operator gives half its interval)
# Queries in flight at once: a cycle of 40 distinct SLOs reads in six rounds, and 400 cannot flood Prometheus.
QUERY_CONCURRENCY = 8
SIGNALS: tuple[Signal, ...] = get_args(Signal)
# The pods that report each fleet's series, compared with the Ready ones: a partial scrape under-counts the sums.
REPORTING: Final = "reporting"
# Requests the fleet's endpoint picker holds in flow control, read for fleets that may scale to zero: with no server,
# the only sign of demand (the picker's PodMonitor labels its series as the servers').
HELD: Final = "held"
SHARED: tuple[Query, ...] = (*SIGNALS, REPORTING)  # the queries every fleet needs: silence there is an outage
# The encode tier's signals, read for fleets that scale it (spec.disaggregation.encode.autoscaling): the items the
# serving pods' sidecars sent it and their calls (counted at the serving pods, under the fleet's label), and its own
# pods' queue, running requests and count (its PodMonitor labels them mmfleet_io_encode, kept out of the fleet's sums).
EncodeQuery = Literal[
    "encode_items", "encode_calls", "encode_failures", "encode_waiting", "encode_running", "encode_reporting"
]
ENCODE_QUERIES: tuple[EncodeQuery, ...] = get_args(EncodeQuery)
ENCODE_LABEL = "mmfleet_io_encode"
# For PreprocessingBound, never needed to scale (docs/troubleshooting.md, PreprocessingBound): each vllm fleet's
# mean time to first token outside the engine (less its queue and prefill times, from vLLM's own histograms), its
# mean time to first token, its engines' most waiting requests over the window, and its busiest API server process's
# CPU (prometheus_client's process collector; vLLM exports none with several API server processes).
OUTSIDE: Final = "outside"
TTFT_MEAN: Final = "ttft_mean"
WAITING_MOST: Final = "waiting_most"
API_CPU: Final = "api_cpu"
API_CPU_SERIES = "process_cpu_seconds_total"
PREPROCESSING: tuple[Query, ...] = (OUTSIDE, TTFT_MEAN, WAITING_MOST, API_CPU)
# Each vllm fleet's request mix: prompt and output tokens per request that finished over the rate window (vLLM's
# per-request histograms, _sum over _count). The policy sizes by it when the mix grows heavier; without it, it sizes
# in requests as before, so it is read like the PreprocessingBound signals: never needed, never an outage.
PROMPT_MIX: Final = "prompt_mix"
OUTPUT_MIX: Final = "output_mix"
MIX: tuple[Query, ...] = (PROMPT_MIX, OUTPUT_MIX)

Key = tuple[str, str]


def promql_duration(duration: str) -> str:
    """A spec duration ("1.5s", "1m30s") as PromQL takes it everywhere: whole seconds or milliseconds."""
    value = seconds(duration)
    return f"{value:.0f}s" if value == int(value) else f"{value * 1000:.0f}ms"


@dataclass(frozen=True)
class Slo:
    """What selects a latency query (an ``api.SloSpec`` without its target); fleets that agree on it share one."""

    metric: SloMetric
    percentile: float
    window: str  # a spec duration; ``Target.of`` writes it as PromQL does, so 60s and 1m are one query
    front_door: bool = True  # False: the servers' own histogram only (the serving tier's part of an encode tier's)


@dataclass(frozen=True)
class EncodeLatency:
    """The percentile of the sidecars' calls to the encode tier over the SLO's window; fleets that agree share one."""

    percentile: float
    window: str


@dataclass(frozen=True)
class Target:
    """One fleet to read."""

    namespace: str
    name: str
    backend: BackendName
    slo: Slo
    zero: bool = False  # may scale to zero: its picker's held requests are read too
    encode: EncodeLatency | None = None  # scales its encode tier: that tier's signals are read too

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)

    @classmethod
    def of(cls, inference: MultimodalInference) -> Target:
        """The reading an autoscaled fleet needs: its series, and the latency its SLO names."""
        autoscaling = inference.spec.autoscaling
        assert autoscaling is not None and autoscaling.slo is not None, "only autoscaled fleets are read"
        slo = autoscaling.slo
        meta = inference.metadata
        window = promql_duration(slo.window)
        encode = inference.spec.encode_autoscaling
        slo_read = Slo(slo.metric, slo.percentile, window, front_door=encode is None)
        return cls(
            meta.namespace,
            meta.name,
            inference.spec.backend.name,
            slo_read,
            autoscaling.idle_after is not None,
            None if encode is None else EncodeLatency(slo.percentile, window),
        )


@dataclass(frozen=True)
class Signals:
    """One fleet's signals; a value is None when Prometheus has no series for it (named in ``missing``).

    ``latency`` is also None, but not missing, when the series exist and no request finished over
    the SLO window (``histogram_quantile`` of nothing is NaN). Any other NaN is kept as NaN: a series
    that exists but holds no number is bad data (judged by ``cycle``), not a missing series.
    """

    latency: float | None = None
    request_rate: float | None = None
    waiting: float | None = None
    running: float | None = None
    kv_cache_usage: float | None = None
    missing: tuple[str, ...] = ()
    reporting: int | None = None  # pods with series for this fleet; None when not asked (the twin)
    failed: str | None = None  # why this fleet's answer cannot be used (a query refused or late, a malformed value)
    held: float | None = None  # requests its endpoint picker holds; None when not asked for, or not read
    held_problem: str | None = None  # why ``held`` could not be read, when it was asked for
    preprocessing: Preprocessing | None = None  # vllm only: what PreprocessingBound reads; None when not asked
    failing: float | None = None  # an encode tier's: the share of the calls to it that brought no encoder outputs
    mix: tuple[float, float] | None = None  # vllm: prompt and output tokens per request finished (``mix_queries``)


@dataclass(frozen=True)
class Preprocessing:
    """A vllm fleet's PreprocessingBound signals over the rate window (``preprocessing_queries``); a value is None
    when Prometheus has none (no request got a first token: 0/0; no process series), ``problem`` why a query failed."""

    outside: float | None = None  # mean seconds to first token outside the engine
    ttft_mean: float | None = None
    waiting_most: float | None = None  # the engines' waiting requests at their most, summed over pods
    api_cpu: float | None = None  # CPU cores of the busiest API server process
    problem: str | None = None


class Sent(NamedTuple):
    """One query sent: the seconds until its answer (or until the read gave up on it), and whether it was usable."""

    seconds: float
    ok: bool


@dataclass(frozen=True)
class Readings:
    """One cycle's answers: signals per fleet, or why Prometheus gave none (``outage``)."""

    signals: dict[Key, Signals] = field(default_factory=dict)
    encode: dict[Key, Signals] = field(
        default_factory=dict
    )  # the encode tiers scaled on their own (``encode_signals``)
    outage: str | None = None
    queries: int = 0  # queries sent; one still waiting for a free connection when the read ended is not
    latencies: tuple[Sent, ...] = ()  # each query sent, the failed ones included


# A query's answer: value per (namespace, fleet, backend), or the text Prometheus gave where a number should be.
Found = dict[tuple[str, str, str], float | str]
Query = (
    Signal
    | Slo
    | Literal["reporting", "held", "outside", "ttft_mean", "waiting_most", "api_cpu", "prompt_mix", "output_mix"]
    | EncodeQuery
    | EncodeLatency
)


def _union(parts: dict[str, str]) -> str:
    """One query over several backends: each side tagged with its backend, so none shadows another."""
    return " or ".join(
        f'label_replace({query}, "{BACKEND_LABEL}", "{backend}", "", "")' for backend, query in sorted(parts.items())
    )


def latency_query(slo: Slo, backend_names: Iterable[str], selector: str = "") -> str:
    """The SLO percentile of every fleet on these backends (``selector``: label matchers, for a dashboard)."""
    window = promql_duration(slo.window)
    return _union(
        {
            name: backends.latency_quantile_promql(
                backends.get(name), slo.metric, slo.percentile, window, FLEET_LABELS, selector, slo.front_door
            )
            for name in backend_names
        }
    )


def signal_query(
    signal: Signal, backend_names: Iterable[str], rate_window: str = RATE_WINDOW, selector: str = ""
) -> str:
    """One signal of every fleet on these backends (``selector``: label matchers, for a dashboard)."""
    return _union(
        {
            name: backends.signal_promql(backends.get(name), signal, rate_window, FLEET_LABELS, selector)
            for name in backend_names
        }
    )


def reporting_query(backend_names: Iterable[str]) -> str:
    """How many pods of each fleet have series: distinct ``pod`` labels of the running-requests gauge."""
    by = ", ".join(FLEET_LABELS)
    return _union(
        {
            name: f"count by ({by}) (count by ({by}, pod) ({backends.get(name).metrics.series('running')}))"
            for name in backend_names
        }
    )


def build_queries(targets: Iterable[Target], rate_window: str = RATE_WINDOW) -> dict[Query, str]:
    """Every query of one cycle: one per signal, the pods reporting, one per distinct SLO; only the backends in use."""
    targets = list(targets)
    if not targets:
        return {}
    backends_used = {t.backend for t in targets}
    queries: dict[Query, str] = {s: signal_query(s, backends_used, rate_window) for s in SIGNALS}
    queries[REPORTING] = reporting_query(backends_used)
    for slo in dict.fromkeys(t.slo for t in targets):
        queries[slo] = latency_query(slo, {t.backend for t in targets if t.slo == slo})
    if any(t.zero for t in targets):
        queries[HELD] = held_query()
    for latency in dict.fromkeys(t.encode for t in targets if t.encode is not None):
        queries[latency] = encode_latency_query(latency)
    if any(t.encode is not None for t in targets):
        queries.update({what: encode_query(what, rate_window) for what in ENCODE_QUERIES})
    if "vllm" in backends_used:  # last: advisory, they must not take a slot from an SLO in a flood of them
        queries.update(mix_queries(rate_window))
        queries.update(preprocessing_queries(rate_window))
    return queries


def _vllm(query: str) -> str:
    """Only vLLM has an encode tier: its queries are tagged as the fleets' other vLLM series are."""
    return _union({"vllm": query})


def encode_latency_query(latency: EncodeLatency, selector: str = "") -> str:
    """The percentile of every encode-scaled fleet's sidecar calls to its encode tier."""
    names = backends.get("vllm").metrics
    assert names.encode_call is not None
    matchers = f"{{{selector}}}" if selector else ""
    window = promql_duration(latency.window)
    return _vllm(
        backends.histogram_quantile_promql(names.encode_call, latency.percentile, window, FLEET_LABELS, matchers)
    )


def encode_query(what: EncodeQuery, rate_window: str = RATE_WINDOW) -> str:
    """One encode-tier signal of every fleet: the sidecars' counters under the fleet's label, the encode pods' gauges
    under theirs, relabelled to the fleet's so one fleet's answers share a key."""
    names = backends.get("vllm").metrics
    assert names.encode_call is not None and names.encode_items is not None and names.encode_failures is not None
    by = ", ".join(FLEET_LABELS)
    own = f"namespace, {ENCODE_LABEL}"
    encode_pods = f'{{{ENCODE_LABEL}!=""}}'
    tier = {
        "encode_items": f"sum by ({by}) (rate({names.encode_items}[{rate_window}]))",
        "encode_calls": f"sum by ({by}) (rate({names.encode_call}_count[{rate_window}]))",
        "encode_failures": f"sum by ({by}) (rate({names.encode_failures}[{rate_window}]))",
        "encode_waiting": f"sum by ({own}) ({names.waiting}{encode_pods})",
        "encode_running": f"sum by ({own}) ({names.running}{encode_pods})",
        "encode_reporting": f"count by ({own}) (count by ({own}, pod) ({names.running}{encode_pods}))",
    }[what]
    if what in ("encode_items", "encode_calls", "encode_failures"):
        return _vllm(tier)
    return _vllm(f'label_replace({tier}, "mmfleet_io_inference", "$1", "{ENCODE_LABEL}", "(.+)")')


def preprocessing_queries(rate_window: str = RATE_WINDOW) -> dict[Query, str]:
    """Each vllm fleet's PreprocessingBound signals over the rate window. vLLM times TTFT from the request's arrival
    in the API server, before its images are loaded and processed, and the queue and prefill phases in the engine
    (v1/metrics/stats.py), so TTFT less those two is the time the API server held the request before the engine took
    it. The API server's CPU is ``and``-ed with a vLLM series of the same pod, so the endpoint picker's process and
    the encode pods' stay out."""
    by = ", ".join(FLEET_LABELS)

    # Each phase's mean over its own count: vLLM observes TTFT at the first token, the queue and prefill times when
    # the request ends, so over a window in which load changes the counts differ.
    ttft = _mean(vllm.TTFT, rate_window)
    outside = f"{ttft} - {_mean(vllm.QUEUE_TIME, rate_window)} - {_mean(vllm.PREFILL_TIME, rate_window)}"
    running = backends.get("vllm").metrics.running
    cpu = f"rate({API_CPU_SERIES}[{rate_window}]) and on (namespace, pod) {running}"
    waiting = backends.get("vllm").metrics.waiting
    return {
        OUTSIDE: _vllm(outside),
        TTFT_MEAN: _vllm(ttft),
        WAITING_MOST: _vllm(f"sum by ({by}) (max_over_time({waiting}[{rate_window}]))"),
        API_CPU: _vllm(f"max by ({by}) ({cpu})"),
    }


def mix_queries(rate_window: str = RATE_WINDOW) -> dict[Query, str]:
    """Each vllm fleet's prompt and output tokens per request finished over the rate window. vLLM observes both when a
    request finishes (v1/metrics/loggers.py, from FinishedRequestStats), so a request's tokens count once, whole."""
    return {
        PROMPT_MIX: _vllm(_mean(vllm.REQUEST_PROMPT_TOKENS, rate_window)),
        OUTPUT_MIX: _vllm(_mean(vllm.REQUEST_GENERATION_TOKENS, rate_window)),
    }


def _mean(histogram: str, rate_window: str) -> str:
    """A histogram's mean per fleet over the rate window: ``rate(_sum) / rate(_count)``, each summed over its pods."""
    by = ", ".join(FLEET_LABELS)
    total, count = (f"sum by ({by}) (rate({histogram}_{part}[{rate_window}]))" for part in ("sum", "count"))
    return f"{total} / {count}"


def held_query() -> str:
    """The requests each fleet's endpoint picker holds now, over its flows and priorities; 0 for a picker that has held
    none since it started (its queue gauge has no series until then), and nothing for one Prometheus does not scrape
    (its info gauge is set when it starts, ``cmd/epp/runner/runner.go``): that is not read as no demand."""
    by = ", ".join(FLEET_LABELS)
    return f"sum by ({by}) ({routing.HELD_METRIC}) or 0 * sum by ({by}) ({routing.INFO_METRIC})"


def _held(
    target: Target, answers: dict[Query, Found], errors: dict[Query, str] | None
) -> tuple[float | None, str | None]:
    """A zero-capable fleet's held requests (no series: the picker has held none since it started), or why not."""
    if not target.zero:
        return None, None
    if errors and HELD in errors:
        return None, errors[HELD]
    value = answers.get(HELD, {}).get((target.namespace, target.name, ""))
    if value is None:
        return None, (
            f"Prometheus has no {routing.INFO_METRIC} for namespace={target.namespace}, "
            f"mmfleet_io_inference={target.name}: is the endpoint picker running, and scraped (its PodMonitor)?"
        )
    if isinstance(value, str) or not math.isfinite(value) or value < 0:
        return None, f"Prometheus answered {routing.HELD_METRIC} = {value!r}, not a count"
    return value, None


class MalformedAnswerError(ValueError):
    """Prometheus answered with something that is not an instant vector."""


def parse_result(result: Any) -> Found:
    """An instant vector as Prometheus' HTTP API returns it, keyed by fleet and backend.

    A sample whose value is not a number keeps its text, so only its fleet is affected; a result that is
    not a list of samples at all raises ``MalformedAnswerError``.
    """
    if not isinstance(result, list):
        raise MalformedAnswerError(f"a result of type {type(result).__name__} where an instant vector was expected")
    found: Found = {}
    for sample in result:
        labels = sample.get("metric") if isinstance(sample, dict) else None
        if not isinstance(labels, dict):
            raise MalformedAnswerError(f"a sample without labels: {str(sample)[:200]!r}")
        key = (labels.get("namespace", ""), labels.get("mmfleet_io_inference", ""), labels.get(BACKEND_LABEL, ""))
        value = sample.get("value")
        raw = value[1] if isinstance(value, list) and len(value) == 2 else value
        try:
            found[key] = float(raw)
        except (TypeError, ValueError):
            found[key] = str(raw)[:100]
    return found


def _held_only(target: Target, answers: dict[Query, Found], errors: dict[Query, str]) -> Signals:
    held, problem = _held(target, answers, errors)
    return Signals(held=held, held_problem=problem)


def signals_for(target: Target, answers: dict[Query, Found], errors: dict[Query, str] | None = None) -> Signals:
    """Pick one fleet's values out of the cycle's answers, naming the series it has none of.

    ``errors``: the queries that got no usable answer, and why; a fleet that needs one of them is ``failed``.
    """
    metrics = backends.get(target.backend).metrics
    needed: tuple[Query, ...] = (target.slo, *SIGNALS, REPORTING)
    held, held_problem = _held(target, answers, errors)
    for query in needed:
        if errors and query in errors:
            return Signals(failed=errors[query], held=held, held_problem=held_problem)
    key = (target.namespace, target.name, target.backend)
    names: dict[Query, str] = {
        target.slo: f"{metrics.histogram(target.slo.metric)}_bucket",
        **{signal: metrics.series(signal) for signal in SIGNALS},
    }
    found = {query: answers.get(query, {}).get(key) for query in needed}
    malformed = [f"{names.get(q, 'pods reporting')} = {v!r}" for q, v in found.items() if isinstance(v, str)]
    if malformed:
        failed = f"Prometheus answered a value that is not a number: {', '.join(malformed)}"
        return Signals(failed=failed, held=held, held_problem=held_problem)
    values = {query: value for query, value in found.items() if isinstance(value, float)}
    latency = values.get(target.slo)
    missing = tuple(names[q] for q in (target.slo, *SIGNALS) if q not in values)
    return Signals(
        latency=None if latency is None or math.isnan(latency) else latency,
        request_rate=values.get("request_rate"),
        waiting=values.get("waiting"),
        running=values.get("running"),
        kv_cache_usage=values.get("kv_cache_usage"),
        missing=missing,
        reporting=int(values[REPORTING]) if REPORTING in values and math.isfinite(values[REPORTING]) else None,
        held=held,
        held_problem=held_problem,
        preprocessing=_preprocessing(key, answers, errors),
        mix=_mix(key, answers),
    )


def encode_signals(target: Target, answers: dict[Query, Found], errors: dict[Query, str] | None = None) -> Signals:
    """One fleet's encode tier as the policy reads a tier: the latency is its sidecars' calls to it, the rate the items
    they sent (images/s, its demand), and its pods' queue and running requests in items too (each of its requests
    holds a request's items: the ratio of items to calls sent), so the policy's units agree."""
    assert target.encode is not None
    needed: tuple[Query, ...] = (target.encode, *ENCODE_QUERIES)
    for query in needed:
        if errors and query in errors:
            return Signals(failed=errors[query])
    names = backends.get("vllm").metrics
    series: dict[Query, str] = {
        target.encode: f"{names.encode_call}_bucket",
        "encode_items": str(names.encode_items),
        "encode_calls": f"{names.encode_call}_count",
        "encode_failures": str(names.encode_failures),
        "encode_waiting": f"{names.waiting}{{{ENCODE_LABEL}}}",
        "encode_running": f"{names.running}{{{ENCODE_LABEL}}}",
        "encode_reporting": f"{names.running}{{{ENCODE_LABEL}}} pods",
    }
    key = (target.namespace, target.name, target.backend)
    found = {query: answers.get(query, {}).get(key) for query in needed}
    malformed = [f"{series[q]} = {v!r}" for q, v in found.items() if isinstance(v, str)]
    if malformed:
        return Signals(failed=f"Prometheus answered a value that is not a number: {', '.join(malformed)}")
    values = {query: value for query, value in found.items() if isinstance(value, float)}
    latency, items, calls = values.get(target.encode), values.get("encode_items"), values.get("encode_calls")
    per_call = items / calls if items is not None and calls and math.isfinite(items / calls) else 1.0

    def in_items(query: EncodeQuery) -> float | None:
        value = values.get(query)
        return None if value is None else value * per_call

    reporting = values.get("encode_reporting")
    failures = values.get("encode_failures")
    return Signals(
        failing=failures / calls if failures is not None and calls and math.isfinite(failures / calls) else 0.0,
        latency=None if latency is None or math.isnan(latency) else latency,
        request_rate=items,
        waiting=in_items("encode_waiting"),
        running=in_items("encode_running"),
        # a sidecar of an earlier operator counts no failures: not a reason to hold
        missing=tuple(
            series[q] for q in needed if q not in values and q not in ("encode_reporting", "encode_failures")
        ),
        reporting=int(reporting) if reporting is not None and math.isfinite(reporting) else None,
    )


def request_mix(prompt: float | str | None, output: float | str | None) -> tuple[float, float] | None:
    """Prompt and output tokens per request as read, or None unless both are positive numbers (none finished: 0/0)."""
    mix = [v for v in (prompt, output) if isinstance(v, float) and math.isfinite(v) and v > 0]
    return (mix[0], mix[1]) if len(mix) == 2 else None


def _mix(key: tuple[str, str, str], answers: dict[Query, Found]) -> tuple[float, float] | None:
    """A vllm fleet's request mix, or None: not asked, not answered, or not a pair of positive numbers."""
    return request_mix(*(answers.get(query, {}).get(key) for query in MIX))


def _preprocessing(
    key: tuple[str, str, str], answers: dict[Query, Found], errors: dict[Query, str] | None
) -> Preprocessing | None:
    """A vllm fleet's PreprocessingBound signals, or None when they were not asked for (the twin, no vllm fleet)."""
    if key[2] != "vllm" or not any(query in answers or (errors and query in errors) for query in PREPROCESSING):
        return None
    for query in PREPROCESSING:
        if errors and query in errors:
            return Preprocessing(problem=errors[query])
    values: list[float | None] = []
    for query in PREPROCESSING:
        value = answers.get(query, {}).get(key)
        if isinstance(value, str):
            return Preprocessing(problem=f"Prometheus answered {describe(query)} = {value!r}, not a number")
        values.append(None if value is None or not math.isfinite(value) else value)
    outside, ttft_mean, waiting_most, api_cpu = values
    return Preprocessing(outside, ttft_mean, waiting_most, api_cpu)


def describe(query: Query) -> str:
    """A query as the fleets' owners know it: "P97.3 of ttft over 60s", "waiting", "pods reporting"."""
    if isinstance(query, Slo):
        return f"P{query.percentile:g} of {query.metric} over {query.window}"
    if isinstance(query, EncodeLatency):
        return f"P{query.percentile:g} of the calls to the encode tier over {query.window}"
    if query == HELD:
        return "requests held by the endpoint picker"
    if query in MIX:
        return {PROMPT_MIX: "prompt tokens per request", OUTPUT_MIX: "output tokens per request"}[query]
    if query in PREPROCESSING:
        return {OUTSIDE: "time to first token outside the engine", TTFT_MEAN: "mean time to first token",
                WAITING_MOST: "most waiting requests", API_CPU: "API server CPU"}[query]  # fmt: skip
    return "pods reporting" if query == REPORTING else query


@dataclass(frozen=True)
class _Answer:
    """What one query got: a vector, or why not (``problem``); a ``silent`` query's problem is written by ``read``."""

    kind: Literal["answered", "refused", "silent", "unreachable"]
    seconds: float
    found: Found | None = None
    problem: str | None = None


class Prometheus:
    """The Prometheus the operator reads; synchronous, so callers run it off the event loop."""

    def __init__(self, url: str, deadline: float = READ_DEADLINE, rate_window: str = RATE_WINDOW) -> None:
        self.url = url
        self.deadline = deadline
        self.rate_window = rate_window
        # No retries within a cycle (the client's default sleeps through three): the next cycle is the retry.
        self._client = PrometheusConnect(url=url, retry=Retry(total=0))
        self._pool = ThreadPoolExecutor(QUERY_CONCURRENCY, thread_name_prefix="prometheus")

    def read(self, targets: Iterable[Target], at: float) -> Readings:
        """Every fleet's signals as of ``at`` (epoch seconds), within ``deadline`` seconds whatever Prometheus does.

        The queries go out side by side, ``QUERY_CONCURRENCY`` at a time, the shared ones (signals, pods
        reporting) first. They are not merged into fewer: one ``histogram_quantile`` computes one percentile,
        and percentiles joined by ``or`` in one query are still evaluated one by one, while the slowest would
        hold, and fail, every fleet in it. Apart, a query that Prometheus refuses, answers with what is not an
        instant vector, or does not answer by the deadline fails only the fleets that need it. Prometheus
        unreachable, or silent on a shared query every fleet needs, is an outage for all; the read then ends
        at once, without waiting for the other queries' answers.
        """
        targets = list(targets)
        queries = build_queries(targets, self.rate_window)
        deadline = time.monotonic() + self.deadline
        started: dict[Query, float] = {}
        futures: dict[Future[_Answer | None], Query] = {
            self._pool.submit(self._send, what, query, at, deadline, started): what for what, query in queries.items()
        }
        got: dict[Query, _Answer] = {}
        try:
            for future in as_completed(futures, timeout=max(0.0, deadline - time.monotonic())):
                answer = future.result()
                if answer is not None:
                    got[futures[future]] = answer
                    if answer.kind == "unreachable":
                        break
        except TimeoutError:  # the deadline: what has not answered is silent
            pass
        for future in futures:
            future.cancel()
        ended, sent = time.monotonic(), dict(started)
        latencies = tuple(
            Sent(got[what].seconds, got[what].kind == "answered") if what in got else Sent(ended - since, False)
            for what, since in sent.items()
        )
        silent = {
            what: self._silence(what, what in sent, len(queries))
            for what in queries
            if what not in got or got[what].kind == "silent"
        }
        unreachable = [a.problem for a in got.values() if a.kind == "unreachable" and a.problem]
        # Only the queries every fleet needs: a silent latency, held or encode query fails the fleets that asked for it.
        outage = next(iter(unreachable + [p for w, p in silent.items() if w in SHARED]), None)
        answers = {what: answer.found for what, answer in got.items() if answer.found is not None}
        problems = {**{w: a.problem for w, a in got.items() if a.problem}, **silent}
        if outage is not None:
            # A fleet at zero needs only its picker's held requests: those still count when the servers' did not come.
            at_zero = {t.key: _held_only(t, answers, problems) for t in targets if t.zero}
            return Readings(at_zero, outage=outage, queries=len(sent), latencies=latencies)
        signals = {t.key: signals_for(t, answers, problems) for t in targets}
        encode = {t.key: encode_signals(t, answers, problems) for t in targets if t.encode is not None}
        return Readings(signals, encode, queries=len(sent), latencies=latencies)

    def _send(self, what: Query, query: str, at: float, deadline: float, started: dict[Query, float]) -> _Answer | None:
        """One query, on a pool thread, given what is left of the read's deadline; None if none is left."""
        sent = time.monotonic()
        if sent >= deadline:
            return None
        started[what] = sent
        try:
            left: Any = deadline - sent  # requests takes seconds as a float, whatever the client's hint (int) says
            found = parse_result(self._client.custom_query(query, params={"time": at}, timeout=left))
        except requests.JSONDecodeError as error:  # a RequestException too, but an answer was given
            problem = f"{self.url} answered the query {query!r} with what is not JSON: {error}"
        except requests.RequestException as error:
            # With no retries, urllib3 reports a read timeout as a ConnectionError: the innermost cause tells.
            if isinstance(error, requests.Timeout) or isinstance(_innermost(error), TimeoutError):
                return _Answer("silent", time.monotonic() - sent)
            return _Answer("unreachable", time.monotonic() - sent, problem=f"{self.url} unreachable: {_cause(error)}")
        except PrometheusApiClientException as error:
            problem = f"{self.url} refused the query {query!r}: {str(error)[:500]}"
        except (MalformedAnswerError, KeyError, TypeError) as error:  # KeyError, TypeError: no data.result
            problem = f"{self.url} answered the query {query!r} with {type(error).__name__} {error}"[:800]
        else:
            return _Answer("answered", time.monotonic() - sent, found)
        return _Answer("refused", time.monotonic() - sent, problem=problem)

    def _silence(self, what: Query, sent: bool, count: int) -> str:
        if sent:
            return f"{self.url} did not answer the query for {describe(what)} within {self.deadline:g}s"
        return (
            f"{self.url}: the query for {describe(what)} was not sent within {self.deadline:g}s "
            f"({count} queries this cycle, {QUERY_CONCURRENCY} at a time)"
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()


def _innermost(error: BaseException) -> BaseException:
    while error.__context__ is not None:
        error = error.__context__
    return error


def _cause(error: BaseException) -> str:
    """The innermost reason of a requests error ("[Errno 111] Connection refused"), without the query URL."""
    innermost = _innermost(error)
    return str(innermost) or type(innermost).__name__
