"""A real Prometheus scraping fake inference pods: the autoscaler's data plane, without the twin.

``FakePods`` serves, per pod, the series a vLLM 0.33 (or TensorRT-LLM) server exports, with the
names from ``mmfleet.backends``, made with ``prometheus_client`` as the servers make them, at
``/pods/<namespace>/<pod>/metrics``. A background thread keeps requests finishing at a set rate and
latency, so ``rate()`` and ``histogram_quantile()`` have something to work on. ``PrometheusServer``
is Debian's ``prometheus`` started with the local cluster's own configuration helpers
(``mmfleet_lab.cluster.prometheus``): file_sd targets labelled with ``namespace``, ``pod`` and
``mmfleet_io_inference``, as the rendered PodMonitor's relabelling labels a real pod's series.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from mmfleet import backends
from mmfleet.backends import vllm
from mmfleet_lab.cluster import process
from mmfleet_lab.cluster import prometheus as prom
from mmfleet_lab.cluster.process import Proc

# vLLM 0.33's e2e buckets (v1/metrics/buckets.py; the twin uses the same).
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0)
TICK = 0.1  # s between batches of finished requests


@dataclass
class FakePod:
    """One pod's load: requests finishing per second at one latency, and its gauges."""

    namespace: str
    name: str
    inference: str
    backend: str = "vllm"
    rate: float = 10.0
    latency: float = 0.7
    waiting: float = 3.0
    running: float = 5.0
    kv_cache_usage: float = 0.2
    # With an encode tier: the latency its sidecar measures from the request's arrival at the pod (the front door's
    # histogram, beside the server's).
    front_door_latency: float | None = None
    front_door_share: float = 1.0  # of the finished requests, those the front door timed
    # With an encode tier's autoscaling: the sidecar's wait for the encode tier per request, and the items it sends.
    encode_call_latency: float | None = None
    items_per_request: int = 1
    encode_pod: bool = False  # an encode tier's pod: its series labelled mmfleet_io_encode, not the fleet's label
    # vLLM's time to first token, and its engine phases before it: none queued, the rest but ``outside`` in prefill;
    # and the API server process's CPU cores (prometheus_client's process collector). For PreprocessingBound.
    ttft: float | None = None
    outside: float = 0.0
    api_cpu: float | None = None
    # vLLM's per-request prompt and output tokens, observed as each request finishes (the autoscaler's request mix).
    mix: tuple[float, float] | None = None
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    _due: float = 0.0
    _front_due: float = 0.0

    def __post_init__(self) -> None:
        names = backends.get(self.backend).metrics
        labels = {"model_name": "qwen", "engine": "0"}
        self._e2e = Histogram(names.e2e, "e2e", list(labels), buckets=E2E_BUCKETS, registry=self.registry)
        # prometheus_client appends _total to a counter's samples, as the servers' exposition shows it.
        self._done = Counter(
            names.requests_finished.removesuffix("_total"), "done", list(labels), registry=self.registry
        )
        self._gauges = {
            name: Gauge(name, name, list(labels), registry=self.registry)
            for name in (names.waiting, names.running, names.kv_cache_usage)
        }
        self._labels = labels
        front = names.front_door("e2e")
        self._front = (
            Histogram(front.removesuffix("_seconds"), "front door", unit="seconds", buckets=E2E_BUCKETS,
                      registry=self.registry)
            if front is not None and self.front_door_latency is not None
            else None
        )  # fmt: skip
        self._calls: Histogram | None = None
        self._items: Counter | None = None
        if self.encode_call_latency is not None and names.encode_call and names.encode_items:
            self._calls = Histogram(names.encode_call.removesuffix("_seconds"), "calls", unit="seconds",
                                    buckets=E2E_BUCKETS, registry=self.registry)  # fmt: skip
            self._items = Counter(names.encode_items.removesuffix("_total"), "items", registry=self.registry)
        phases = (vllm.TTFT, vllm.QUEUE_TIME, vllm.PREFILL_TIME) if self.ttft is not None else ()
        self._phases = [Histogram(name.removesuffix("_seconds"), name, list(labels), unit="seconds",
                                  registry=self.registry) for name in phases]  # fmt: skip
        self._cpu = Counter("process_cpu_seconds", "cpu", registry=self.registry) if self.api_cpu is not None else None
        tokens = (vllm.REQUEST_PROMPT_TOKENS, vllm.REQUEST_GENERATION_TOKENS) if self.mix is not None else ()
        self._mix = [Histogram(name, name, list(labels), registry=self.registry) for name in tokens]
        self._set_gauges()  # every series from the start, as the servers export them: a scrape before the first
        self._done.labels(**labels)  # tick that found none would mark the pod's series stale for one interval
        self._e2e.labels(**labels)
        for phase in self._phases:
            phase.labels(**labels)

    def _set_gauges(self) -> None:
        names = backends.get(self.backend).metrics
        for name, value in ((names.waiting, self.waiting), (names.running, self.running),
                            (names.kv_cache_usage, self.kv_cache_usage)):  # fmt: skip
            self._gauges[name].labels(**self._labels).set(value)

    def tick(self, elapsed: float) -> None:
        """The requests finished and the CPU used over ``elapsed`` seconds (the wall time since the last tick: a
        late wake of the ticking thread on a busy machine must not lower the rates)."""
        self._due += self.rate * elapsed
        finished = int(self._due)
        self._due -= finished
        for _ in range(finished):
            self._e2e.labels(**self._labels).observe(self.latency)
        if self._front is not None and self.front_door_latency is not None:
            self._front_due += finished * self.front_door_share
            for _ in range(int(self._front_due)):
                self._front.observe(self.front_door_latency)
            self._front_due -= int(self._front_due)
        if self._calls is not None and self._items is not None and self.encode_call_latency is not None:
            for _ in range(finished):
                self._calls.observe(self.encode_call_latency)
            self._items.inc(finished * self.items_per_request)
        if self.ttft is not None:
            for _ in range(finished):
                for phase, took in zip(self._phases, (self.ttft, 0.0, self.ttft - self.outside), strict=True):
                    phase.labels(**self._labels).observe(took)
        if self._cpu is not None and self.api_cpu is not None:
            self._cpu.inc(self.api_cpu * elapsed)
        if self.mix is not None:
            for _ in range(finished):
                for histogram, tokens in zip(self._mix, self.mix, strict=True):
                    histogram.labels(**self._labels).observe(tokens)
        self._done.labels(**self._labels).inc(finished)
        self._set_gauges()


class FakePods:
    """An HTTP server for every fake pod's /metrics, and the thread that makes their requests finish."""

    def __init__(self) -> None:
        self.pods: dict[str, FakePod] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        pods = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with pods._lock:
                    pod = pods.pods.get(self.path.removesuffix("/metrics"))
                    body = generate_latest(pod.registry) if pod else b""
                self.send_response(200 if pod else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self._server.server_address[1]}"
        self._threads = [
            threading.Thread(target=self._server.serve_forever, daemon=True),
            threading.Thread(target=self._finish_requests, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def add(self, pod: FakePod) -> FakePod:
        with self._lock:
            self.pods[f"/pods/{pod.namespace}/{pod.name}"] = pod
        return pod

    def targets(self) -> list[prom.Target]:
        with self._lock:
            return [
                prom.Target(self.address, p.namespace, p.name, p.inference,
                            "mmfleet_io_encode" if p.encode_pod else "mmfleet_io_inference")
                for p in self.pods.values()
            ]  # fmt: skip

    def _finish_requests(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(TICK):
            now = time.monotonic()
            with self._lock:
                for pod in self.pods.values():
                    pod.tick(now - last)
            last = now

    def close(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)


@dataclass
class PrometheusServer:
    """Prometheus on 127.0.0.1, scraping the targets written to ``targets`` every ``interval`` (its timeout too)."""

    state: Path
    interval: str = "1s"
    url: str = ""
    proc: Proc | None = None

    def start(self) -> None:
        prom.prepare(self.state, self.interval)
        port = prom.port_of(self.url) if self.url else process.free_port()  # a restart keeps its address
        self.url = f"http://127.0.0.1:{port}"
        self.proc = prom.launch(self.state, port)
        prom.wait_ready(self.proc, self.url, 30)

    def stop(self) -> None:
        if self.proc is not None:
            process.stop([self.proc])
            self.proc = None

    def scrape(self, pods: FakePods) -> None:
        prom.write_targets(prom.targets_dir(self.state) / "fake-pods.json", pods.targets())


@contextmanager
def prometheus_scraping(state: Path, interval: str = "1s") -> Iterator[tuple[PrometheusServer, FakePods]]:
    """A running Prometheus and fake pods for it to scrape; both stopped on the way out."""
    pods = FakePods()
    server = PrometheusServer(state, interval)
    try:
        server.start()
        yield server, pods
    finally:
        server.stop()
        pods.close()
