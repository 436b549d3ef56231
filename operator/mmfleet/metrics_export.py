"""The operator's own metrics (prometheus_client), served on ``/metrics`` at ``MMFLEET_METRICS_ADDRESS``.

``/healthz`` is kopf's own liveness endpoint, on ``MMFLEET_HEALTH_ADDRESS``: a port each, as kopf's
liveness server serves one path only (kopf 1.45.2, ``kopf/_core/engines/probing.py``).

Per fleet, what a dashboard needs and Prometheus cannot get from the pods: the replicas the
autoscaler set and the pods it counted, the SLO target and the percentile it read, its verdicts,
scale events and the cold start it plans with. The fleet labels are the ones the backends' series
carry (``namespace``, ``mmfleet_io_inference``), so one dashboard variable selects both; the
PodMonitor scraping the operator honours them (``honorLabels``).
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import astuple
from typing import Generic, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from mmfleet.api import MultimodalInference, seconds
from mmfleet.autoscaler.cycle import CAUSES, PHASES, SERVER_PHASES, Outcome, Seen
from mmfleet.autoscaler.metrics import FLEET_LABELS, Readings
from mmfleet.backends import ServerStartup

Key = tuple[str, str]
V = TypeVar("V")
LE: Callable[[float], str] = floatToGoString  # a bucket bound as prometheus_client writes it: 1.0, 2.5, +Inf

REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)
GCCollector(registry=REGISTRY)

# ok; invalid_spec (only a new spec helps); retry (the API server may answer next time); refused (a write refused
# or a child's name taken, tried again after a backoff); error (a bug, tried again after a backoff).
RECONCILE_RESULTS = ("ok", "invalid_spec", "retry", "refused", "error")
RECONCILES = Counter(
    "mmfleet_reconciles", "Reconciles of a MultimodalInference, by result.", ["result"], registry=REGISTRY
)
RECONCILE_SECONDS = Histogram(
    "mmfleet_reconcile_duration_seconds",
    "Time one reconcile took (apply when needed, observe, status).",
    registry=REGISTRY,
)
ERROR_PLACES = ("reconcile", "autoscale_fleet", "autoscale_cycle")
ERRORS = Counter(
    "mmfleet_errors", "Unexpected exceptions the operator logged, by where they happened.", ["where"], registry=REGISTRY
)
CYCLE_SECONDS = Histogram(
    "mmfleet_autoscaler_cycle_duration_seconds",
    "Time one autoscaling cycle took for all fleets (Prometheus read, decisions, scaling, status).",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
QUERY_SECONDS = Histogram(
    "mmfleet_prometheus_query_duration_seconds",
    "Time one autoscaler query to Prometheus took, by result.",
    ["result"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
    registry=REGISTRY,
)


class _PerFleet(Collector, Generic[V]):
    """One per-fleet family, its values plain numbers read at each scrape. prometheus_client's labelled children keep
    each value in an object with its own lock and a creation time: 47 MB of the operator's memory at 1,000 autoscaled
    fleets, near a quarter of its 200 MB budget (docs/benchmarks.md, Operator at scale). Written by the fleets'
    cycles, read by the scrape: a value is replaced whole, never changed in place, so a scrape sees each one either
    before or after a write."""

    def __init__(self, name: str, documentation: str, extra: tuple[str, ...] = ()) -> None:
        self.name, self.documentation = name, documentation
        self.labelnames = (*FLEET_LABELS, *extra)
        self.values: dict[tuple[str, ...], V] = {}
        self.lock = threading.Lock()  # a read-modify-write (inc, observe) is one
        REGISTRY.register(self)

    def family(self) -> Metric:
        raise NotImplementedError

    def describe(self) -> list[Metric]:
        return [self.family()]

    def remove(self, labels: tuple[str, ...]) -> None:
        with self.lock:
            self.values.pop(labels, None)

    def rows(self) -> list[tuple[tuple[str, ...], V]]:
        with self.lock:
            return list(self.values.items())


class _Scalar(_PerFleet[float]):
    kind: type[GaugeMetricFamily | CounterMetricFamily]

    def family(self) -> GaugeMetricFamily | CounterMetricFamily:
        return self.kind(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = self.family()
        for labels, value in self.rows():
            family.add_metric(labels, value)
        yield family


class FleetGauge(_Scalar):
    kind = GaugeMetricFamily

    def set(self, labels: tuple[str, ...], value: float) -> None:
        with self.lock:
            self.values[labels] = float(value)


class FleetCounter(_Scalar):
    """Exposed as ``<name>_total``, without prometheus_client's ``_created`` series (nothing here reads it)."""

    kind = CounterMetricFamily

    def __init__(self, name: str, documentation: str, label: str) -> None:
        super().__init__(name, documentation, (label,))

    def zero(self, labels: tuple[str, ...]) -> None:
        with self.lock:
            self.values.setdefault(labels, 0.0)

    def inc(self, labels: tuple[str, ...]) -> None:
        with self.lock:
            self.values[labels] = self.values.get(labels, 0.0) + 1.0


class FleetHistogram(_PerFleet[tuple[float, ...]]):
    """Per label set, the observations in each bucket (not cumulative), then their sum."""

    def __init__(self, name: str, documentation: str, label: str, buckets: tuple[float, ...]) -> None:
        super().__init__(name, documentation, (label,))
        self.buckets = (*buckets, math.inf)

    def family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def observe(self, labels: tuple[str, ...], seconds: float) -> None:
        index = next(
            (i for i, bound in enumerate(self.buckets) if seconds <= bound), len(self.buckets) - 1
        )  # NaN: +Inf
        with self.lock:
            counts = list(self.values.get(labels, (0.0,) * (len(self.buckets) + 1)))
            counts[index] += 1.0
            counts[-1] += seconds
            self.values[labels] = tuple(counts)

    def collect(self) -> Iterator[Metric]:
        family = self.family()
        for labels, counts in self.rows():
            cumulative = itertools.accumulate(counts[:-1])
            family.add_metric(labels, [(LE(b), n) for b, n in zip(self.buckets, cumulative, strict=True)], counts[-1])
        yield family


DECISIONS = FleetCounter(
    "mmfleet_autoscaler_decisions", "Autoscaling decisions per fleet, by what the cycle did (autoscaler.cycle.Cause).",
    "decision",
)  # fmt: skip
SCALE_EVENTS = FleetCounter(
    "mmfleet_fleet_scale_events", "Replica changes the autoscaler made, by direction.", "direction"
)
SLO_EVALUATIONS = FleetCounter(
    "mmfleet_fleet_slo_evaluations",
    "Cycles that measured the SLO percentile, by whether it met the target (the SLI of the burn-rate alerts).",
    "result",
)


DESIRED = FleetGauge("mmfleet_fleet_desired_replicas", "The replicas the autoscaler set.")
READY = FleetGauge("mmfleet_fleet_ready_replicas", "The fleet's Ready pods, as the autoscaler counted them.")
STARTING = FleetGauge("mmfleet_fleet_starting_replicas", "The fleet's pods not Ready yet and not unschedulable.")
UNSCHEDULABLE = FleetGauge("mmfleet_fleet_unschedulable_replicas", "The fleet's pods the scheduler cannot place.")
MIN_REPLICAS = FleetGauge("mmfleet_fleet_min_replicas", "spec.autoscaling.minReplicas.")
MAX_REPLICAS = FleetGauge("mmfleet_fleet_max_replicas", "spec.autoscaling.maxReplicas.")
SLO_TARGET = FleetGauge(
    "mmfleet_fleet_slo_target_seconds",
    "spec.autoscaling.slo.target (the serving tier's part of it when the encode tier scales on its own share).",
)
SLO_PERCENTILE = FleetGauge("mmfleet_fleet_slo_percentile", "spec.autoscaling.slo.percentile, e.g. 90.")
SLO_OBSERVED = FleetGauge(
    "mmfleet_fleet_slo_observed_seconds", "The SLO percentile the autoscaler last read; NaN when nothing was measured."
)
ATTAINMENT = FleetGauge(
    "mmfleet_fleet_slo_attainment_ratio", "Share of the last hour's measured cycles whose percentile met the target."
)
COLD_START = FleetGauge(
    "mmfleet_fleet_cold_start_seconds", "The cold start the autoscaler plans with (measured or default)."
)
METRICS_AVAILABLE = FleetGauge("mmfleet_fleet_metrics_available", "1 when every signal was read this cycle, else 0.")
WAKE_PHASE = "wake"
# Each Ready pod's cold start, once, whole and by phase (autoscaler.cycle.PHASES): where a new replica's time goes.
COLD_START_PHASES = FleetHistogram(
    "mmfleet_fleet_cold_start_phase_seconds",
    "Each new replica's time from creation to Ready (phase total), in each phase Kubernetes timestamps, and within "
    "ready what its server logged (weights, engine, compile); with warm standby, each wake of a sleeping replica "
    "(phase wake).",
    "phase",
    (1, 2.5, 5, 10, 20, 30, 60, 90, 120, 180, 300, 600, 1200),
)

FLEET_GAUGES = (
    DESIRED, READY, STARTING, UNSCHEDULABLE, MIN_REPLICAS, MAX_REPLICAS, SLO_TARGET, SLO_PERCENTILE, SLO_OBSERVED,
    ATTAINMENT, COLD_START, METRICS_AVAILABLE,
)  # fmt: skip
for _result in RECONCILE_RESULTS:  # every series exists from the start, so rate() and alerts see zeros
    RECONCILES.labels(_result)
for _where in ERROR_PLACES:
    ERRORS.labels(_where)
for _result in ("ok", "error"):
    QUERY_SECONDS.labels(_result)


def reconciled(result: str, seconds: float) -> None:
    """One reconcile, by how it ended (one of ``RECONCILE_RESULTS``), and how long it took."""
    RECONCILES.labels(result).inc()
    RECONCILE_SECONDS.observe(seconds)


def error(where: str) -> None:
    """One unexpected exception at ``where`` (one of ``ERROR_PLACES``), already logged by the caller."""
    ERRORS.labels(where).inc()


def record_cycle(readings: Readings, duration: float) -> None:
    CYCLE_SECONDS.observe(duration)
    for sent in readings.latencies:
        QUERY_SECONDS.labels("ok" if sent.ok else "error").observe(sent.seconds)


def _first_seen(key: Key) -> None:
    """Zero every counter of a new fleet, so increase() reads 0 rather than nothing before the first event."""
    for cause in CAUSES:
        DECISIONS.zero((*key, cause))
    for direction in ("up", "down"):
        SCALE_EVENTS.zero((*key, direction))
    for result in ("met", "missed"):
        SLO_EVALUATIONS.zero((*key, result))


_KNOWN: set[Key] = set()  # fleets with series, so forget() ends them
# Held to end a fleet's series, and by what observes a fleet off the cycle (server logs, wakes): a late observation
# must not bring back a fleet's series once they ended.
_FORGETTING = threading.Lock()


def record_decision(
    key: Key, inference: MultimodalInference, seen: Seen, outcome: Outcome, default_cold_start: float
) -> None:
    """One fleet's cycle: what it counted, read and decided."""
    autoscaling = inference.spec.autoscaling
    assert autoscaling is not None and autoscaling.slo is not None, "only autoscaled fleets are decided"
    if key not in _KNOWN:
        _KNOWN.add(key)
        _first_seen(key)
    slo = autoscaling.slo
    cold_start = outcome.memory.cold_start
    values = {
        DESIRED: outcome.replicas,
        READY: seen.pods.ready,
        STARTING: seen.pods.starting,
        UNSCHEDULABLE: seen.pods.unschedulable,
        MIN_REPLICAS: autoscaling.min_replicas,
        MAX_REPLICAS: autoscaling.max_replicas,
        SLO_TARGET: inference.spec.serving_slo_target or seconds(slo.target),
        SLO_PERCENTILE: slo.percentile,
        SLO_OBSERVED: math.nan if outcome.latency is None else outcome.latency,
        ATTAINMENT: math.nan if (attained := outcome.scaling().attainment) is None else attained,
        COLD_START: default_cold_start if cold_start is None else cold_start,
        METRICS_AVAILABLE: 1 if outcome.conditions[0][1] is True else 0,
    }
    for gauge, value in values.items():
        gauge.set(key, value)
    DECISIONS.inc((*key, outcome.cause))
    if outcome.scaled:
        SCALE_EVENTS.inc((*key, "up" if outcome.replicas > outcome.current else "down"))
    if outcome.latency is not None:
        met = outcome.latency <= (inference.spec.serving_slo_target or 0.0)
        SLO_EVALUATIONS.inc((*key, "met" if met else "missed"))
    for start in outcome.new_starts:
        COLD_START_PHASES.observe((*key, "total"), start.total)
        for phase, took in zip(PHASES, start.phases, strict=True):
            if took is not None:
                COLD_START_PHASES.observe((*key, phase), took)


def record_server_startup(key: Key, startup: ServerStartup) -> None:
    """What a new replica's server logged about its start (read once per pod): inside its ``ready`` phase. Read after
    the cycle that asked for it, so dropped for a fleet whose series ended meanwhile."""
    with _FORGETTING:
        if key not in _KNOWN:
            return
        for phase, took in zip(SERVER_PHASES, astuple(startup), strict=True):
            if took is not None:
                COLD_START_PHASES.observe((*key, phase), took)


def record_wake(key: Key, seconds: float) -> None:
    """A sleeping replica woken (warm standby): how long vLLM's /wake_up took, beside the cold starts it saves. Dropped
    for a fleet whose series ended while it woke."""
    with _FORGETTING:
        if key in _KNOWN:
            COLD_START_PHASES.observe((*key, WAKE_PHASE), seconds)


def forget_others(keep: set[Key]) -> None:
    """Fleets no longer autoscaled (or gone): their series end, rather than repeat their last value."""
    with _FORGETTING:
        for key in _KNOWN - keep:
            _forget(key)


def _forget(key: Key) -> None:
    _KNOWN.discard(key)
    for gauge in FLEET_GAUGES:
        gauge.remove(key)
    for counter, labels in (
        (DECISIONS, CAUSES), (SCALE_EVENTS, ("up", "down")), (SLO_EVALUATIONS, ("met", "missed")),
        (COLD_START_PHASES, ("total", *PHASES, *SERVER_PHASES, WAKE_PHASE)),
    ):  # fmt: skip
        for label in labels:
            counter.remove((*key, label))


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[::]:8081`` for IPv6) as a listening host and port."""
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


def serve(address: str) -> Callable[[], None]:
    """Serve ``/metrics`` on ``address`` from now on, in a thread (a port in use fails here); the way to stop it."""
    host, port = split_address(address)
    server, thread = start_http_server(port, host, registry=REGISTRY)

    def stop() -> None:
        server.shutdown()
        thread.join(timeout=5)

    return stop
