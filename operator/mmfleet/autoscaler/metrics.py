"""The autoscaler's signals for every fleet at once, from Prometheus (through prometheus-api-client).

One PromQL query per signal per cycle, whatever the number of fleets: each query groups by the
labels the PodMonitor relabelling stamps on every series (``namespace`` and ``mmfleet_io_inference``),
and fleets on different backends share it through ``or``, each side tagged with its backend by
``label_replace`` so a fleet is never credited with another backend's series. The SLO latency needs
one query per distinct (metric, percentile, window) among the fleets.

Two kinds of silence are kept apart, because the operator says different things about them:
Prometheus giving no answer at all (``Readings.outage``) and Prometheus answering without a series
for one fleet (``Signals.missing``). Either way the autoscaler holds; neither is read as zero.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, get_args

import requests
from prometheus_api_client.exceptions import PrometheusApiClientException
from prometheus_api_client.prometheus_connect import PrometheusConnect
from urllib3.util.retry import Retry

from mmfleet import backends
from mmfleet.api import BackendName, MultimodalInference, SloMetric, seconds
from mmfleet.backends import Signal

# Set on every series by the PodMonitor relabelling (render.build_pod_monitor) and by a plain
# Prometheus with the kubernetes_sd_configs of docs/autoscaling.md.
FLEET_LABELS = ("namespace", "mmfleet_io_inference")
BACKEND_LABEL = "mmfleet_backend"
# Completions per second are averaged over this window, as in the benchmark's twin (twin.sim); it
# should span at least four scrapes.
RATE_WINDOW = "1m"
QUERY_TIMEOUT = 5  # seconds per query
SIGNALS: tuple[Signal, ...] = get_args(Signal)

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


@dataclass(frozen=True)
class Target:
    """One fleet to read."""

    namespace: str
    name: str
    backend: BackendName
    slo: Slo

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
        return cls(meta.namespace, meta.name, inference.spec.backend.name, Slo(slo.metric, slo.percentile, window))


@dataclass(frozen=True)
class Signals:
    """One fleet's signals; a value is None when Prometheus has no series for it (named in ``missing``).

    ``latency`` is also None, but not missing, when the series exist and no request finished over
    the SLO window (``histogram_quantile`` of nothing is NaN).
    """

    latency: float | None = None
    request_rate: float | None = None
    waiting: float | None = None
    running: float | None = None
    kv_cache_usage: float | None = None
    missing: tuple[str, ...] = ()


@dataclass(frozen=True)
class Readings:
    """One cycle's answers: signals per fleet, or why Prometheus gave none (``outage``)."""

    signals: dict[Key, Signals] = field(default_factory=dict)
    outage: str | None = None
    queries: int = 0
    latencies: tuple[float, ...] = ()  # seconds each query sent took, the failed one included


# A query's answer: value per (namespace, fleet, backend).
Found = dict[tuple[str, str, str], float]


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
                backends.get(name), slo.metric, slo.percentile, window, FLEET_LABELS, selector
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


def build_queries(targets: Iterable[Target], rate_window: str = RATE_WINDOW) -> dict[Signal | Slo, str]:
    """Every query of one cycle: one per signal, one per distinct SLO; only the backends in use."""
    targets = list(targets)
    if not targets:
        return {}
    backends_used = {t.backend for t in targets}
    queries: dict[Signal | Slo, str] = {s: signal_query(s, backends_used, rate_window) for s in SIGNALS}
    for slo in dict.fromkeys(t.slo for t in targets):
        queries[slo] = latency_query(slo, {t.backend for t in targets if t.slo == slo})
    return queries


def parse_result(result: list[dict[str, Any]]) -> Found:
    """An instant vector as Prometheus' HTTP API returns it, keyed by fleet and backend."""
    found: Found = {}
    for sample in result:
        labels = sample.get("metric", {})
        key = (labels.get("namespace", ""), labels.get("mmfleet_io_inference", ""), labels.get(BACKEND_LABEL, ""))
        found[key] = float(sample["value"][1])
    return found


def signals_for(target: Target, answers: dict[Signal | Slo, Found]) -> Signals:
    """Pick one fleet's values out of the cycle's answers, naming the series it has none of."""
    metrics = backends.get(target.backend).metrics
    key = (target.namespace, target.name, target.backend)
    latency = answers[target.slo].get(key)
    missing = [] if latency is not None else [f"{metrics.histogram(target.slo.metric)}_bucket"]
    values: dict[Signal, float | None] = {}
    for signal in SIGNALS:
        value = answers[signal].get(key)
        values[signal] = None if value is None or math.isnan(value) else value
        if values[signal] is None:
            missing.append(metrics.series(signal))
    return Signals(
        latency=None if latency is None or math.isnan(latency) else latency,
        request_rate=values["request_rate"],
        waiting=values["waiting"],
        running=values["running"],
        kv_cache_usage=values["kv_cache_usage"],
        missing=tuple(missing),
    )


class Prometheus:
    """The Prometheus the operator reads; synchronous, so callers run it off the event loop."""

    def __init__(self, url: str, timeout: int = QUERY_TIMEOUT, rate_window: str = RATE_WINDOW) -> None:
        self.url = url
        self.rate_window = rate_window
        # No retries within a cycle (the client's default sleeps through three): the next cycle is the retry.
        self._client = PrometheusConnect(url=url, retry=Retry(total=0), timeout=timeout)

    def read(self, targets: Iterable[Target], at: float) -> Readings:
        """Every fleet's signals as of ``at`` (epoch seconds): one query per signal and per SLO.

        Stops at the first failed query: when Prometheus is down, the others would only wait for
        their own timeouts.
        """
        targets = list(targets)
        answers: dict[Signal | Slo, Found] = {}
        latencies: list[float] = []
        for count, (what, query) in enumerate(build_queries(targets, self.rate_window).items(), start=1):
            sent = time.perf_counter()
            outage = None
            try:
                answers[what] = parse_result(self._client.custom_query(query, params={"time": at}))
            except requests.RequestException as error:
                outage = f"{self.url} unreachable: {_cause(error)}"
            except PrometheusApiClientException as error:
                outage = f"{self.url} refused the query {query!r}: {error}"
            latencies.append(time.perf_counter() - sent)
            if outage is not None:
                return Readings(outage=outage, queries=count, latencies=tuple(latencies))
        signals = {t.key: signals_for(t, answers) for t in targets}
        return Readings(signals, queries=len(answers), latencies=tuple(latencies))

    def close(self) -> None:
        self._client.close()


def _cause(error: BaseException) -> str:
    """The innermost reason of a requests error ("[Errno 111] Connection refused"), without the query URL."""
    while error.__context__ is not None:
        error = error.__context__
    return str(error) or type(error).__name__
