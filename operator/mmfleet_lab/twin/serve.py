"""``mmfleet twin serve``: the twin as the data plane of the local cluster, in real time.

kwok makes pods Ready but runs no container, so nothing would serve requests or export metrics.
This process stands in for the inference servers of every fleet on a local cluster
(``mmfleet_lab.cluster``):

- Pods: it lists the pods labelled ``mmfleet.io/inference`` once a second (one API request). A Ready pod
  is a serving replica of its fleet's engine; a pod not yet Ready serves nothing (its model is still
  loading, so it exports no metrics either); a Ready pod that is being deleted or turns unready gets no
  new requests and finishes what it holds, as vLLM does with ``--shutdown-timeout``.
- Traffic: each fleet (namespace and ``mmfleet.io/inference`` value) gets its own arrivals, on a clock
  that starts when this process starts: Poisson arrivals at ``rate`` with ServeGen's multimodal mix, or a
  named benchmark scenario (``mmfleet_lab.twin.scenarios``) at that mean rate, times any spikes. A request
  arriving while its fleet has no serving pod is dropped, as a gateway with no endpoint refuses it.
- Engine: one ``CompiledEngine`` per fleet, advanced to the wall clock five times a second; the router sends
  each request to the serving pod with the fewest outstanding requests.
- Metrics: ``/pods/<namespace>/<pod>/metrics`` is that pod's replica in the text format prometheus_client
  writes, with the names, types, labels and buckets of the pod's backend (``exposition``), and
  ``/healthz``. The serving pods are written as file_sd targets into the cluster's Prometheus
  (``mmfleet_lab.cluster.prometheus``), labelled as the rendered PodMonitor labels real pods.

- Spans: given an OTLP endpoint, each finished request of a pod whose spec turns tracing on is a trace
  with its queue, encoder, prefill and decode phases, under that pod's resource (``twin.spans``).

It records itself in the cluster's state, so ``mmfleet cluster down`` stops it, and it ends cleanly
on SIGTERM or SIGINT.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any, Final

import numpy as np
from opentelemetry.sdk.trace.export import SpanExporter
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from mmfleet import backends
from mmfleet.backends import vllm
from mmfleet.kube import Kube
from mmfleet.render import INFERENCE_LABEL
from mmfleet_lab.cluster import ClusterError, attach, get, process
from mmfleet_lab.cluster.prometheus import Target, write_targets
from mmfleet_lab.twin import scenarios, traffic
from mmfleet_lab.twin.compiled import CompiledEngine
from mmfleet_lab.twin.engine import Engine, Workload
from mmfleet_lab.twin.observe import HISTOGRAMS, LAYOUT
from mmfleet_lab.twin.replica import PROFILES, ReplicaParams
from mmfleet_lab.twin.spans import PodTracing, RequestSpans, RequestTiming, otlp_exporter, pod_tracing
from mmfleet_lab.twin.types import Requests

COMPONENT = "twin"  # its name in the cluster's state
POISSON = "poisson"
TRAFFIC_NAMES: Final = (POISSON, *scenarios.NAMES)
DEFAULT_RATE = 2.0  # req/s per fleet
DEFAULT_DURATION = 3600.0
DEFAULT_PROFILE = "h100"  # the local cluster's default node pool is eks:H100
POLL_S = 1.0
STEP_S = 0.2
TARGETS_FILE = "twin.json"
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # the text format that every Prometheus version reads
_BACKEND_LABEL = "app.kubernetes.io/name"  # rendered pods carry the backend's name here
_SERVED_NAME_FLAGS = ("--served-model-name", "--served_model_name")  # vLLM's, TensorRT-LLM's


# ------------------------------------------------------------------------------------ traffic
@dataclass(frozen=True)
class Spike:
    """From ``start`` to ``end`` seconds after the twin starts, the arrival rate is multiplied by ``factor``."""

    start: float
    end: float
    factor: float

    @staticmethod
    def parse(text: str) -> Spike:
        """``START:END:FACTOR``, e.g. ``60:180:4``: x4 from 60 s to 180 s."""
        usage = "expected START:END:FACTOR (seconds, seconds, a multiplier), e.g. 60:180:4"
        parts = text.split(":")
        try:
            start, end, factor = (float(p) for p in parts)
        except ValueError:
            raise ValueError(f"--spike {text!r}: {usage}") from None
        if not 0 <= start < end:
            raise ValueError(f"--spike {text!r}: START must be >= 0 and below END")
        if factor <= 0:
            raise ValueError(f"--spike {text!r}: FACTOR must be more than 0")
        return Spike(start, end, factor)


@dataclass(frozen=True)
class TrafficSpec:
    """What every fleet is sent; each fleet draws its own arrivals (seeded by ``seed`` and its name)."""

    name: str = POISSON
    rate: float = DEFAULT_RATE
    spikes: tuple[Spike, ...] = ()
    duration: float = DEFAULT_DURATION
    seed: int = 0
    traces: Path | None = None  # default: scenarios.traces_dir()

    def __post_init__(self) -> None:
        if self.name not in TRAFFIC_NAMES:
            raise ValueError(f"--scenario {self.name!r}: choose from {', '.join(TRAFFIC_NAMES)}")
        if self.rate <= 0:
            raise ValueError(f"--rate {self.rate:g}: must be more than 0 (requests per second)")
        if self.duration <= 0:
            raise ValueError(f"--duration {self.duration:g}: must be more than 0 (seconds)")


def build_requests(spec: TrafficSpec, fleet: str) -> Requests:
    """One fleet's requests, arrival times in seconds from the twin's start, up to ``spec.duration``."""
    rng = np.random.default_rng([spec.seed, zlib.crc32(fleet.encode())])
    where = scenarios.traces_dir(spec.traces)
    if spec.name == POISSON:
        stats_file = where / scenarios.SERVEGEN_TOKENS
        if not stats_file.exists():
            raise FileNotFoundError(f"{stats_file} is missing; point --traces at a folder with it")
        stats = traffic.load_token_stats(stats_file)
        arrival = traffic.arrivals_from_rate(np.zeros(1), np.array([spec.rate]), spec.duration, rng)
        req = traffic.synth_multimodal(arrival, stats, rng)
    else:
        req = scenarios.scenario(spec.name, replicas=1, seed=spec.seed, traces_dir=where, rate=spec.rate).requests
    req = req.window(0.0, spec.duration)
    for spike in spec.spikes:
        req = _apply_spike(req, spike, rng)
    return req


def _apply_spike(req: Requests, spike: Spike, rng: np.random.Generator) -> Requests:
    """Above 1: independent extra arrivals (``traffic.add_spike``); below 1: arrivals thinned at random."""
    if spike.factor > 1:
        return traffic.add_spike(
            req, spike.start, spike.end, traffic.step_multiplier(spike.start, spike.end, spike.factor), rng
        )
    inside = (req.arrival >= spike.start) & (req.arrival < spike.end)
    keep = ~inside | (rng.uniform(size=len(req)) < spike.factor)
    return req.take(np.nonzero(keep)[0])


# ------------------------------------------------------------------------------------ pods
@dataclass(frozen=True)
class PodView:
    """What the twin needs of a pod, read from the API object."""

    namespace: str
    name: str
    uid: str
    inference: str
    backend: str
    model_name: str
    ready: bool
    deleting: bool
    tracing: PodTracing | None = None  # what its server's OTel SDK would be set up with; None: no spans

    @property
    def serving(self) -> bool:
        """Gets new requests: Ready and not being deleted."""
        return self.ready and not self.deleting


def pod_view(pod: dict[str, Any]) -> PodView:
    """The pod as its server would see itself: the backend from the rendered name label (vLLM unless it
    says TensorRT-LLM), the ``model_name`` label value from its served-model-name flag (else the fleet's name)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    inference = labels.get(INFERENCE_LABEL, "")
    backend = labels.get(_BACKEND_LABEL, "vllm")
    status = pod.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return PodView(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        inference=inference,
        backend=backend if backend in ("vllm", "tensorrt-llm") else "vllm",
        model_name=_served_name([*(containers[0].get("command") or []), *(containers[0].get("args") or [])])
        or inference,
        ready=ready,
        deleting=bool(meta.get("deletionTimestamp")),
        tracing=pod_tracing(pod),
    )


def _served_name(argv: Sequence[str]) -> str | None:
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if flag in _SERVED_NAME_FLAGS:
            return value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return None


# ------------------------------------------------------------------------------------ metrics
@dataclass(frozen=True)
class _Family:
    """How one backend spells what the twin measures."""

    names: backends.MetricNames
    prompt_tokens: str
    generation_tokens: str
    constant: dict[str, str]  # labels besides model_name
    finished_reasons: tuple[str, ...]
    request_tokens: dict[str, str]  # the per-request token histograms it has, by the twin's histogram name


# vLLM 0.33 (v1/metrics/loggers.py; docs/backends.md, "Metrics"): labels model_name and engine (the DP
# rank, "0"); request_success has a series per FinishReason from the start, as the real 0.33.0 server's
# /metrics shows (tests/data/vllm_h200_metrics_0.33.0.txt; test_twin_serve checks the twin against it).
# TensorRT-LLM 1.3 (metrics/collector.py @050f80de; docs/backends.md, "Metrics"): labels model_name and
# engine_type (the --backend), a series per finished_reason as requests finish. The twin leaves out the
# ``_created`` series that real server also exposes: no PromQL the autoscaler runs reads them.
_FAMILIES: Final = {
    "vllm": _Family(
        names=backends.get("vllm").metrics,
        prompt_tokens="vllm:prompt_tokens_total",
        generation_tokens="vllm:generation_tokens_total",
        constant={"engine": "0"},
        finished_reasons=("stop", "length", "abort", "error", "repetition"),
        request_tokens={
            "request_prompt": vllm.REQUEST_PROMPT_TOKENS,
            "request_generation": vllm.REQUEST_GENERATION_TOKENS,
        },
    ),
    "tensorrt-llm": _Family(
        names=backends.get("tensorrt-llm").metrics,
        prompt_tokens="trtllm_prompt_tokens_total",
        generation_tokens="trtllm_generation_tokens_total",
        constant={"engine_type": "pytorch"},
        finished_reasons=("stop",),
        request_tokens={},
    ),
}
_HELP: Final = {
    "running": "Number of requests in model execution batches.",
    "waiting": "Number of requests waiting to be processed.",
    "kv": "KV-cache usage. 1 means 100 percent usage.",
    "e2e": "Histogram of e2e request latency in seconds.",
    "ttft": "Histogram of time to first token in seconds.",
    "itl": "Histogram of inter-token latency in seconds.",
    "request_prompt": "Number of prefill tokens processed.",
    "request_generation": "Number of generation tokens processed.",
}


class _Snapshot:
    """A prometheus_client collector that yields the families it was given."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


def exposition(backend: str, model_name: str, counters: np.ndarray, gauges: tuple[float, float, float]) -> bytes:
    """One replica's ``/metrics`` body: ``counters`` as ``MetricBook.export`` gives them (cumulative buckets),
    ``gauges`` = (running, waiting, KV-cache usage as a fraction)."""
    fam = _FAMILIES[backend]
    names = fam.names
    label_names = [names.model_label, *fam.constant]
    values = [model_name, *fam.constant.values()]
    out: list[Metric] = []
    for name, key, value in (
        (names.running, "running", gauges[0]),
        (names.waiting, "waiting", gauges[1]),
        (names.kv_cache_usage, "kv", gauges[2]),
    ):
        gauge = GaugeMetricFamily(name, _HELP[key], labels=label_names)
        gauge.add_metric(values, value)
        out.append(gauge)
    success = CounterMetricFamily(
        names.requests_finished, "Count of successfully processed requests.", labels=[*label_names, "finished_reason"]
    )
    for reason in fam.finished_reasons:
        success.add_metric([*values, reason], float(counters[LAYOUT.success]) if reason == "stop" else 0.0)
    out.append(success)
    for name, column, text in (
        (fam.prompt_tokens, LAYOUT.prompt, "Number of prefill tokens processed."),
        (fam.generation_tokens, LAYOUT.generation, "Number of generation tokens processed."),
    ):
        counter = CounterMetricFamily(name, text, labels=label_names)
        counter.add_metric(values, float(counters[column]))
        out.append(counter)
    hist_names = {"e2e": names.e2e, "ttft": names.ttft, "itl": names.itl, **fam.request_tokens}
    for hist, (off, bounds) in HISTOGRAMS.items():
        if hist not in hist_names:
            continue
        family = HistogramMetricFamily(hist_names[hist], _HELP[hist], labels=label_names)
        n = len(bounds)
        buckets = [(repr(float(b)), float(counters[off + i])) for i, b in enumerate(bounds)]
        buckets.append(("+Inf", float(counters[off + n])))
        family.add_metric(values, buckets, sum_value=float(counters[off + n + 1]))
        out.append(family)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(out))
    return generate_latest(registry)


# ------------------------------------------------------------------------------------ fleets
class FleetTwin:
    """One fleet's replicas in a ``CompiledEngine``, advanced in wall-clock time (seconds since the twin started)."""

    def __init__(
        self,
        namespace: str,
        inference: str,
        requests: Requests,
        params: ReplicaParams,
        now: float,
        spans: RequestSpans | None = None,
    ) -> None:
        self.namespace = namespace
        self.inference = inference
        self.work = Workload.build(requests, params)
        self.arrival = self.work.arrival
        self.compiled = CompiledEngine(params, self.work, placement=spans is not None)
        self.engine: Engine = self.compiled
        self.clock = now
        self.next = int(np.searchsorted(self.arrival, now, side="left"))  # earlier arrivals had nowhere to go
        self.pods: dict[str, PodView] = {}  # by name, as the API lists them now
        self.replicas: dict[str, int] = {}  # pod uid -> engine replica, from its first Ready
        self.dropped = 0
        # Request spans (twin.spans): the pod behind each replica, and the routed requests not yet finished.
        self.spans = spans
        self.replica_pods: dict[int, PodView] = {}
        self.unreported = np.empty(0, dtype=np.int64)

    def sync(self, pods: Iterable[PodView]) -> None:
        """Take the pods as the API shows them; a pod Ready for the first time becomes a replica."""
        self.pods = {p.name: p for p in pods}
        for pod in self.pods.values():
            if pod.ready and pod.uid not in self.replicas:
                self.replicas[pod.uid] = self.engine.add_replica()
            if pod.uid in self.replicas:
                self.replica_pods[self.replicas[pod.uid]] = pod  # kept after the pod goes: its requests finish
        live = {p.uid for p in self.pods.values()}
        # A pod gone from the API is forgotten here; its replica finishes what it holds in the engine.
        self.replicas = {uid: rid for uid, rid in self.replicas.items() if uid in live}

    def advance(self, now: float) -> None:
        """Route the arrivals up to ``now`` among the serving pods (or drop them: none serves) and run to ``now``."""
        if now <= self.clock:
            return
        end = int(np.searchsorted(self.arrival, now, side="left"))
        idx = np.arange(self.next, end, dtype=np.int64)
        serving = np.array([self.replicas[p.uid] for p in self.pods.values() if p.serving], dtype=np.int64)
        if serving.size == 0:
            self.dropped += idx.size
            idx = idx[:0]
        self.engine.run(self.clock, now, idx, serving)
        self.next = end
        self.clock = now
        if self.spans is not None:
            self.unreported = np.concatenate((self.unreported, idx))
            self._report(now)

    def _report(self, now: float) -> None:
        """A span for each request that finished, from the pod that served it; forget those the client gave up."""
        assert self.spans is not None
        pending = self.unreported
        e2e = self.engine.outcomes.e2e[pending]
        done = pending[np.isfinite(e2e)]
        replicas, started = self.compiled.placement(done)
        work, ttft = self.work, self.engine.outcomes.ttft
        for i, rid, start in zip(done.tolist(), replicas.tolist(), started.tolist(), strict=True):
            pod = self.replica_pods.get(rid)
            if pod is None or pod.tracing is None:
                continue
            timing = RequestTiming(
                request_id=f"twin-{self.namespace}-{self.inference}-{i}",
                arrival=float(work.arrival[i]),
                started=start,
                encoder=self.compiled.params.encoder_alone_ms(float(work.vis_ms[i]), float(work.vis_images[i]))
                / 1000.0,
                ttft=float(ttft[i]),
                e2e=float(self.engine.outcomes.e2e[i]),
                prompt_tokens=int(work.prompt[i]),
                output_tokens=int(work.out[i]),
            )
            self.spans.emit(pod.uid, pod.tracing, timing)
        open_ = pending[~np.isfinite(e2e)]
        self.unreported = open_[work.deadline[open_] > now]

    def metrics(self, pod: str) -> bytes | None:
        """The pod's ``/metrics``; None while it has no replica (not Ready yet) or is unknown."""
        view = self.pods.get(pod)
        rid = self.replicas.get(view.uid) if view is not None else None
        if view is None or rid is None:
            return None
        return exposition(view.backend, view.model_name, self.engine.book.export(rid), self.engine.gauges(rid))

    def targets(self, address: str) -> list[Target]:
        """The pods that serve /metrics, for Prometheus."""
        return [
            Target(address, self.namespace, p.name, self.inference)
            for p in sorted(self.pods.values(), key=lambda p: p.name)
            if p.uid in self.replicas
        ]


class Twin:
    """Every fleet of one cluster; the main thread polls and advances, HTTP threads read metrics."""

    def __init__(
        self,
        kube: Kube,
        spec: TrafficSpec,
        params: ReplicaParams,
        targets: Path | None,
        exporter: Callable[[], SpanExporter] | None = None,
    ) -> None:
        self.kube = kube
        self.spec = spec
        self.params = params
        self.targets = targets
        self.address = ""  # host:port, once the HTTP server is bound
        self.fleets: dict[tuple[str, str], FleetTwin] = {}
        self.lock = threading.Lock()
        self.started = time.monotonic()
        # Request spans go through ``exporter()`` (one per pod), timed on the wall clock of the twin's start.
        self.spans = RequestSpans(exporter, time.time_ns()) if exporter is not None else None
        self._written: list[Target] | None = None
        self._api_down = False

    def now(self) -> float:
        return time.monotonic() - self.started

    def poll(self) -> None:
        """List the labelled pods and hand each fleet its own; rewrite the Prometheus targets if they changed."""
        try:
            pods = [pod_view(p) for p in self.kube.list_objects("v1", "Pod", selector=INFERENCE_LABEL)]
        except Exception as error:  # the API server restarting or gone (say, during cluster down): keep the last view
            if not self._api_down:
                _log(self.now(), f"listing pods failed, keeping the last view: {error}")
            self._api_down = True
            return
        self._api_down = False
        by_fleet: dict[tuple[str, str], list[PodView]] = {}
        for pod in pods:
            by_fleet.setdefault((pod.namespace, pod.inference), []).append(pod)
        for key in by_fleet.keys() - self.fleets.keys():
            requests = build_requests(self.spec, "/".join(key))
            fleet = FleetTwin(*key, requests, self.params, self.now(), self.spans)
            with self.lock:
                self.fleets[key] = fleet
            _log(self.now(), f"fleet {key[0]}/{key[1]}: {len(requests)} requests over {self.spec.duration:g}s")
        with self.lock:
            for key, fleet in self.fleets.items():
                before = sum(p.serving for p in fleet.pods.values())
                fleet.sync(by_fleet.get(key, []))
                after = sum(p.serving for p in fleet.pods.values())
                if after != before:
                    _log(self.now(), f"fleet {key[0]}/{key[1]}: {after} serving pod(s), {fleet.dropped} dropped")
            targets = [t for fleet in self.fleets.values() for t in fleet.targets(self.address)]
        if self.targets is not None and targets != self._written:
            try:
                write_targets(self.targets, targets)
                self._written = targets
            except OSError as error:  # the cluster's state dir went away (cluster down): nothing to scrape
                _log(self.now(), f"could not write {self.targets}: {error}")

    def step(self) -> None:
        now = self.now()
        with self.lock:
            for fleet in self.fleets.values():
                fleet.advance(now)

    def metrics(self, namespace: str, pod: str) -> bytes | None:
        with self.lock:
            for (ns, _), fleet in self.fleets.items():
                if ns == namespace and pod in fleet.pods:
                    return fleet.metrics(pod)
        return None

    def run(self, stop: threading.Event) -> None:
        """Poll every ``POLL_S`` and catch up with the wall clock every ``STEP_S`` until ``stop`` is set."""
        next_poll = 0.0
        while not stop.is_set():
            if self.now() >= next_poll:
                self.poll()
                next_poll = self.now() + POLL_S
            self.step()
            stop.wait(STEP_S)

    def remove_targets(self) -> None:
        if self.targets is not None:
            self.targets.unlink(missing_ok=True)


def _log(now: float, line: str) -> None:
    print(f"[twin {now:8.1f}s] {line}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------ HTTP
def _handler(twin: Twin) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = self.path.split("?", 1)[0].strip("/").split("/")
            if parts == ["healthz"]:
                self._reply(200, b"ok\n", "text/plain; charset=utf-8")
            elif len(parts) == 4 and parts[0] == "pods" and parts[3] == "metrics":
                body = twin.metrics(parts[1], parts[2])
                if body is None:
                    self._reply(404, f"no serving pod {parts[1]}/{parts[2]}\n".encode(), "text/plain; charset=utf-8")
                else:
                    self._reply(200, body, CONTENT_TYPE)
            else:
                self._reply(404, b"try /healthz or /pods/<namespace>/<pod>/metrics\n", "text/plain; charset=utf-8")

        def _reply(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: Prometheus scrapes every pod every few seconds."""

    return Handler


# ------------------------------------------------------------------------------------ main
def serve(
    cluster_name: str,
    spec: TrafficSpec,
    *,
    port: int = 0,
    profile: str = DEFAULT_PROFILE,
    otlp_endpoint: str | None = None,
) -> int:
    """Run the twin against a local cluster until SIGTERM/SIGINT; returns the exit code.

    With ``otlp_endpoint`` (OTLP/gRPC), the pods whose spec turns tracing on send request spans there.
    """
    if profile not in PROFILES:
        raise ValueError(f"--profile {profile!r}: choose from {', '.join(PROFILES)}")
    cluster = get(cluster_name)
    if cluster is None:
        raise ClusterError(f"no cluster named {cluster_name}; start one with: mmfleet cluster up --name {cluster_name}")
    other = next((p for p in cluster.processes if p.component == COMPONENT and process.alive(p)), None)
    if other is not None:
        raise ClusterError(f"a twin (pid {other.pid}) already serves cluster {cluster_name}; stop it first")
    build_requests(spec, "check")  # a missing trace file fails here, before anything starts
    targets = cluster.prometheus_targets / TARGETS_FILE if cluster.prometheus_url else None
    exporter = otlp_exporter(otlp_endpoint) if otlp_endpoint else None
    twin = Twin(Kube(cluster.api_client()), spec, PROFILES[profile], targets, exporter)
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(twin))
    server.daemon_threads = True
    twin.address = f"127.0.0.1:{server.server_address[1]}"
    stop = threading.Event()

    def on_signal(signum: int, _: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    threading.Thread(target=server.serve_forever, name="twin-http", daemon=True).start()
    spikes = ", ".join(f"x{s.factor:g} {s.start:g}-{s.end:g}s" for s in spec.spikes) or "no spikes"
    _log(0.0, f"serving on http://{twin.address} for cluster {cluster_name}: {spec.name} at {spec.rate:g} req/s")
    _log(0.0, f"  per fleet, {spikes}, for {spec.duration:g}s; replicas: {PROFILES[profile].name}")
    if otlp_endpoint:
        _log(0.0, f"  request spans of pods with spec.tracing.enabled: OTLP to {otlp_endpoint}")
    try:
        attach(cluster_name, COMPONENT, os.getpid())  # so that `mmfleet cluster down` stops it
        twin.run(stop)
    finally:
        server.shutdown()
        server.server_close()
        twin.remove_targets()
        if twin.spans is not None:
            twin.spans.shutdown()
            _log(twin.now(), f"sent {twin.spans.sent} request traces")
        _log(twin.now(), "stopped")
    return 0
