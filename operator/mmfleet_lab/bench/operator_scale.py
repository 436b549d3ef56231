"""``mmfleet bench operator``: how the operator copes with many resources on the local control plane.

Each run starts a fresh local cluster, the operator as its own process, applies N resources as
fast as the API server takes them, and measures: the time from the last apply until all are
Ready, per-resource create-to-Ready latency, the operator's reconcile time and API requests
per reconcile (from its own log lines), and its peak RSS (VmHWM). Every resource is autoscaled and
the operator reads the cluster's Prometheus, so once all are Ready the autoscaler's cycles are
timed too: one batched read for all fleets, then a decision, status and (when it changes) a scale
per fleet. No twin serves these pods, so every fleet takes the "series missing: hold" path.

Where the operator's time and memory go, one run each (tracemalloc slows the operator down, so
neither run's timings are the benchmark's): ``MMFLEET_BENCH_PYSPY=<dir>`` samples it with py-spy
(``pip install py-spy``) into ``<dir>/operator-<count>.pyspy`` (collapsed stacks);
``MMFLEET_BENCH_TRACEMALLOC=<dir>`` writes a tracemalloc snapshot every ``SNAPSHOT_SECONDS`` into
``<dir>/operator-<count>-<n>.tracemalloc``; ``MMFLEET_BENCH_MEMRAY=<dir>`` runs the operator under
memray (``pip install memray``) with native frames into ``<dir>/operator-<count>.memray``, which
also sees the memory Python's allocator holds outside live objects (tracemalloc does not).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import kopf

from mmfleet.api import GROUP, PLURAL, VERSION
from mmfleet_lab.bench.report import table, write_section
from mmfleet_lab.cluster import Cluster, NodePool, down, up
from mmfleet_lab.cluster.discovery import dynamic_client

NAMESPACE = "bench"
CLUSTER = "mmfleet-bench"
PODS_PER_NODE = 250
TARGET_FLOOR_RATIO = 1.25  # all Ready, from the first apply, within this multiple of the no-operator floor
TARGET_STATUS_WRITES = 1.5  # status writes per fleet from its creation to all Ready
TARGET_RSS_MB = 200.0
STATUS_WRITE = "PATCH multimodalinferences status"
READ_VERBS = ("GET", "LIST")
RECONCILED = re.compile(r"reconciled \S+ in ([0-9.]+) ms with (\d+) API requests")
TOTAL_REQUESTS = re.compile(r"API requests made: (\d+)")
CYCLE = re.compile(
    r"autoscaling cycle: (\d+) fleets, (\d+) Prometheus queries(?: \(failed\))?, \d+ scaled, "
    r"(?:(\d+) status writes, )?in ([0-9.]+) ms"
)
AUTOSCALE_INTERVAL = 15.0  # s, the operator's default
CYCLES = 3  # full cycles timed once every resource is Ready
TARGET_CYCLE_MS = 1000.0
PYSPY_ENV = "MMFLEET_BENCH_PYSPY"
TRACEMALLOC_ENV = "MMFLEET_BENCH_TRACEMALLOC"
MEMRAY_ENV = "MMFLEET_BENCH_MEMRAY"
SNAPSHOT_SECONDS = 20.0
# The operator as its own process, with neither of its HTTP endpoints (each run is a fresh cluster on this machine).
OPERATOR_COMMAND = (sys.executable, "-m", "mmfleet.cli", "run", "--health-address", "", "--metrics-address", "")

WATCHED_NOTE = (
    " `its watches open` is the no-operator run again with the watches the operator's kopf holds (each child kind with "
    "its handlers' label selector, and the fleets) held open by the bench, which reads and drops what they send: "
    "what serving them costs the API server; its ratio is to the plain no-operator run."
)
Progress = Callable[[str], None]
Timeout = float | tuple[float, float]


@dataclass(frozen=True)
class Result:
    count: int
    floor: bool  # no operator: the bench applied the rendered children itself
    watched: bool  # a floor run with the operator's watches held open by the bench (``operator_watches``)
    apply_seconds: float
    ready_after_last_apply: float
    ready_after_first_apply: float
    e2e_p50: float
    e2e_p99: float
    reconcile_p50_ms: float
    reconcile_p99_ms: float
    requests_per_reconcile: float
    requests_per_resource: float
    peak_rss_mb: float
    cpu_seconds: float  # the operator's, from start to the end of the timed cycles
    all_ready: bool
    cycle_p50_ms: float  # autoscaler cycles over all fleets
    cycle_max_ms: float
    queries_per_cycle: float
    writes_per_cycle: str  # status writes in each timed cycle, e.g. "1000/0/0"
    cpu_share: dict[str, float]  # CPU seconds per process from the first apply until all are Ready
    requests: dict[str, float]  # API server requests by verb and resource over the same span
    # The same over the timed cycles, once all are Ready (steady state: only the operator is at work then).
    steady_requests: dict[str, float]
    steady_seconds: float


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def _resource(index: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "MultimodalInference",
        "metadata": {"name": f"fleet-{index:04d}", "namespace": NAMESPACE},
        "spec": {
            "model": {"name": "Qwen/Qwen2.5-VL-3B-Instruct"},
            "gpu": {"count": 1},
            "autoscaling": {"minReplicas": 1, "maxReplicas": 2, "slo": {"target": "5s"}},
        },
    }


def _peak_rss_mb(pid: int) -> float:
    """The process's peak RSS so far (VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return math.nan


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process; less disturbed by other loads on the machine than wall time."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _install(cluster: Cluster) -> Any:
    from kubernetes import client
    from kubernetes.client import rest

    from mmfleet_lab.cluster.crds import install_mmfleet_crd

    api = cluster.api_client()
    # A connection for each of the bench's threads (16 applying in the floor, 8 creating, a watch each), as the
    # operator keeps one per thread: with the client's default (5 a core) the floor's threads would open and close
    # connections, each a TLS handshake, where the operator's do not.
    api.configuration.connection_pool_maxsize = 48
    api.rest_client = rest.RESTClientObject(api.configuration)
    install_mmfleet_crd(api, "bench")
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            core.read_namespaced_service_account("default", NAMESPACE)
            client.CustomObjectsApi(api).list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)
            return api
        except client.exceptions.ApiException:
            time.sleep(0.5)
    raise TimeoutError("the CRD or the namespace's default ServiceAccount never appeared")


@dataclass
class Operator:
    """The operator's process, started directly or under py-spy (then its only child)."""

    proc: subprocess.Popen[bytes]
    spied: bool

    @property
    def pid(self) -> int:
        if not self.spied:
            return self.proc.pid
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        return int(children[0]) if children else self.proc.pid

    def stop(self) -> None:
        """SIGTERM to the operator: a clean exit, after which py-spy writes its samples and exits too."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            self.proc.wait(timeout=60)


def _wait_operator(log: Path, operator: Operator) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if operator.proc.poll() is not None:
            raise RuntimeError(f"the operator exited with {operator.proc.returncode}; see {log}")
        if log.exists() and "mmfleet operator started" in log.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise TimeoutError(f"the operator did not start within 60s; see {log}")


def run_once(count: int, progress: Progress, timeout: float, floor: bool = False, watched: bool = False) -> Result:
    nodes = math.ceil(count / PODS_PER_NODE) + 1
    # Room for PODS_PER_NODE one-GPU replicas per node at the rendered default requests (4 CPU, 34Gi).
    pool = NodePool(
        cloud="eks",
        gpu_type="H100",
        count=nodes,
        gpus_per_node=PODS_PER_NODE,
        pods=str(PODS_PER_NODE),
        cpu=str(4 * PODS_PER_NODE),
        memory=f"{34 * PODS_PER_NODE}Gi",
    )
    down(CLUSTER)
    cluster = up(CLUSTER, pod_ready_delay="1s", nodes=(pool,), progress=lambda line: progress(f"   {line}"))
    try:
        api = _install(cluster)
        # The bench's own process shares the cores too: it creates the fleets (and, with no operator, applies every
        # child) and follows them to Ready.
        pids = {**cluster.pids, "bench": os.getpid()}
        if floor:
            if not watched:
                return _measure_floor(api, count, pids, progress, timeout)
            with operator_watches(api, progress):
                return _measure_floor(api, count, pids, progress, timeout, watched=True)
        log = cluster.logs_dir / "operator.log"
        env = {
            **os.environ,
            "KUBECONFIG": str(cluster.kubeconfig),
            "MMFLEET_PROMETHEUS_URL": cluster.prometheus_url or "",
            "MMFLEET_AUTOSCALE_INTERVAL": f"{AUTOSCALE_INTERVAL:g}s",
        }
        command = list(OPERATOR_COMMAND)
        if os.environ.get(TRACEMALLOC_ENV):
            prefix = Path(os.environ[TRACEMALLOC_ENV]) / f"operator-{count}"
            prefix.parent.mkdir(parents=True, exist_ok=True)
            command = [sys.executable, "-c", "import sys; from mmfleet_lab.bench.operator_scale import "
                       "traced_operator; traced_operator(sys.argv[1:])", str(prefix), *command[3:]]  # fmt: skip
        if os.environ.get(MEMRAY_ENV):
            out = Path(os.environ[MEMRAY_ENV]) / f"operator-{count}.memray"
            out.parent.mkdir(parents=True, exist_ok=True)
            memray = shutil.which("memray") or str(Path(sys.executable).parent / "memray")
            command = [memray, "run", "--native", "-q", "-o", str(out), "-m", *command[2:]]
        if os.environ.get(PYSPY_ENV):
            # py-spy starts the operator: attaching to a running process is refused on this machine.
            out = Path(os.environ[PYSPY_ENV]) / f"operator-{count}.pyspy"
            out.parent.mkdir(parents=True, exist_ok=True)
            spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
            command = [spy, "record", "--nonblocking", "--rate", "50", "--format", "raw", "--output", str(out),
                       "--", *command]  # fmt: skip
        with log.open("ab") as out_file:
            proc = subprocess.Popen(command, env=env, stdout=out_file, stderr=subprocess.STDOUT)
        operator = Operator(proc, spied=bool(os.environ.get(PYSPY_ENV)))
        try:
            _wait_operator(log, operator)
            return _measure(api, count, operator, {**pids, "operator": operator.pid}, log, progress, timeout)
        finally:
            operator.stop()
    finally:
        down(CLUSTER)


def traced_operator(argv: list[str]) -> None:
    """``mmfleet run`` with tracemalloc, a snapshot every ``SNAPSHOT_SECONDS`` (argv: prefix, then run's args)."""
    import tracemalloc

    from mmfleet import cli

    prefix, args = argv[0], argv[1:]
    tracemalloc.start(8)

    def snapshots() -> None:
        for n in range(10_000):
            time.sleep(SNAPSHOT_SECONDS)
            tracemalloc.take_snapshot().dump(f"{prefix}-{n:03d}.tracemalloc")

    threading.Thread(target=snapshots, daemon=True).start()
    sys.exit(cli.main(args))


def _cpu_by_process(pids: dict[str, int]) -> dict[str, float]:
    found = {}
    for name, pid in pids.items():
        with contextlib.suppress(OSError):
            found[name] = _cpu_seconds(pid)
    return found


REQUEST_SAMPLE = re.compile(r"^apiserver_request_total\{([^}]*)\} ([0-9.e+]+)$", re.M)


def _get(api: Any, path: str, query: Sequence[tuple[str, str]] = (), timeout: Timeout = 60.0) -> Any:
    """A GET's urllib3 response, unread: the bench's plain reads and its watches, without the typed client's models."""
    request = api.param_serialize("GET", path, query_params=list(query), auth_settings=["BearerToken"])
    return api.call_api(*request, _request_timeout=timeout).response


def _watch_query(version: str | None = None, selector: str = "", timeout: int = 300) -> list[tuple[str, str]]:
    query = [("watch", "true"), ("allowWatchBookmarks", "true"), ("timeoutSeconds", str(timeout))]
    query += [("resourceVersion", version)] if version else []
    return query + ([("labelSelector", selector)] if selector else [])


def _apiserver_requests(api: Any) -> dict[str, float]:
    """``apiserver_request_total`` summed by verb, resource and subresource, from the API server's /metrics."""
    text = _get(api, "/metrics").data.decode()
    totals: dict[str, float] = {}
    for labels, value in REQUEST_SAMPLE.findall(text):
        tags = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        key = " ".join(filter(None, (tags.get("verb"), tags.get("resource"), tags.get("subresource"))))
        totals[key] = totals.get(key, 0.0) + float(value)
    return totals


def _usage(api: Any, pids: dict[str, int]) -> tuple[dict[str, float], dict[str, float]]:
    """CPU seconds per process and the API server's request counts, now."""
    return _cpu_by_process(pids), _apiserver_requests(api)


def _since(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


class Watched:
    """The objects of one namespaced list, kept current by a watch: both runs wait for Ready through this, so neither
    pays for a full list a second, which the API server encodes and the bench parses on the machine's shared cores
    (a list a second for the whole wait, up to about 90 a run, each of every resource with its status). A watch that
    keeps failing is an error of the run, not a silent wait until the timeout."""

    GIVE_UP = 30.0  # s of failed watches in a row

    def __init__(self, api: Any, path: str) -> None:
        self.api, self.path = api, path
        # Rebound or given a new entry by the watching thread, read whole by the main one (one C-level copy each).
        self.objects: dict[str, dict[str, Any]] = {}
        self.stop = threading.Event()
        self.failing_since: float | None = None
        self.error: Exception | None = None
        self.stream: Any = None
        self.version = self._list()
        self.thread = threading.Thread(target=self._follow, daemon=True)
        self.thread.start()

    def __enter__(self) -> Watched:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _list(self) -> str:
        response = _get(self.api, self.path)
        if response.status != 200:
            raise RuntimeError(f"list {self.path}: HTTP {response.status}: {response.data[:200]!r}")
        body = json.loads(response.data)
        self.objects = {o["metadata"]["name"]: o for o in body["items"]}
        return str(body["metadata"]["resourceVersion"])

    def _follow(self) -> None:
        while not self.stop.is_set():
            try:
                self.stream = _get(self.api, self.path, _watch_query(self.version), (5.0, 330.0))
                if self.stream.status != 200:
                    raise RuntimeError(f"watch {self.path}: HTTP {self.stream.status}")
                self.failing_since = None
                for line in self.stream:
                    if self.stop.is_set():
                        return
                    self._take(json.loads(line))
            except Exception as error:  # follow again from the last version; items() gives up after GIVE_UP
                self.error = error
                self.failing_since = self.failing_since or time.monotonic()
                self.stop.wait(0.5)

    def _take(self, event: dict[str, Any]) -> None:
        if event["type"] == "ERROR":  # too old a version (410): list again, then watch from there
            self.version = self._list()
            raise RuntimeError(f"watch {self.path}: {event['object'].get('message')}")
        obj = event["object"]
        self.version = obj["metadata"]["resourceVersion"]  # a BOOKMARK carries only this
        if event["type"] in ("ADDED", "MODIFIED"):
            self.objects[obj["metadata"]["name"]] = obj
        elif event["type"] == "DELETED":
            self.objects.pop(obj["metadata"]["name"], None)

    def items(self) -> list[dict[str, Any]]:
        if self.failing_since is not None and time.monotonic() - self.failing_since > self.GIVE_UP:
            raise RuntimeError(f"watch {self.path} failing for {self.GIVE_UP:.0f} s: {self.error}")
        return list(self.objects.values())

    def close(self) -> None:
        self.stop.set()
        with contextlib.suppress(Exception):
            self.stream.shutdown()
        self.thread.join(timeout=5)


def _measure(
    api: Any, count: int, operator: Operator, pids: dict[str, int], log: Path, progress: Progress, timeout: float
) -> Result:
    from kubernetes import client

    custom = client.CustomObjectsApi(api)
    progress(f"   applying {count} resources")
    with Watched(api, f"/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/{PLURAL}") as fleets:
        cpu_before, requests_before = _usage(api, pids)
        start = time.monotonic()
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda i: custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL,
                                                                           _resource(i)), range(count)))  # fmt: skip
        last_apply = time.monotonic()
        ready, items = 0, []
        while time.monotonic() - last_apply < timeout:
            items = fleets.items()
            ready = sum((i.get("status") or {}).get("phase") == "Ready" for i in items)
            progress(f"   {ready}/{count} Ready after {time.monotonic() - last_apply:.0f}s")
            if ready == count:
                break
            time.sleep(1.0)
    ready_after = time.monotonic() - last_apply
    cpu_after, requests_after = _usage(api, pids)
    steady_from = time.monotonic()
    cycles = _full_cycles(log, count, progress)
    steady = _since(requests_after, _apiserver_requests(api))
    steady_seconds = time.monotonic() - steady_from
    rss, cpu = _peak_rss_mb(operator.pid), _cpu_seconds(operator.pid)
    operator.stop()
    text = log.read_text(errors="replace")
    reconciles = [(float(ms), int(n)) for ms, n in RECONCILED.findall(text)]
    totals = [int(n) for n in TOTAL_REQUESTS.findall(text)]
    e2e = []
    for item in items:
        created = datetime.fromisoformat(item["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
        conditions = (item.get("status") or {}).get("conditions", [])
        became = next(
            (c["lastTransitionTime"] for c in conditions if c["type"] == "Ready" and c["status"] == "True"), None
        )
        if became:
            e2e.append((datetime.fromisoformat(became.replace("Z", "+00:00")) - created).total_seconds())
    durations = [ms for ms, _ in reconciles]
    return Result(
        count=count,
        floor=False,
        watched=False,
        apply_seconds=last_apply - start,
        ready_after_last_apply=ready_after,
        ready_after_first_apply=last_apply - start + ready_after,
        e2e_p50=_percentile(e2e, 0.5),
        e2e_p99=_percentile(e2e, 0.99),
        reconcile_p50_ms=_percentile(durations, 0.5),
        reconcile_p99_ms=_percentile(durations, 0.99),
        requests_per_reconcile=statistics.fmean(n for _, n in reconciles) if reconciles else math.nan,
        requests_per_resource=(totals[-1] / count) if totals else math.nan,
        peak_rss_mb=rss,
        cpu_seconds=cpu,
        all_ready=ready == count,
        cycle_p50_ms=_percentile([c.ms for c in cycles], 0.5),
        cycle_max_ms=max((c.ms for c in cycles), default=math.nan),
        queries_per_cycle=statistics.fmean(c.queries for c in cycles) if cycles else math.nan,
        writes_per_cycle="/".join(c.writes for c in cycles),
        cpu_share=_since(cpu_before, cpu_after),
        requests=_since(requests_before, requests_after),
        steady_requests=steady,
        steady_seconds=steady_seconds,
    )


def operator_paths() -> list[tuple[str, str]]:
    """(path, label selector) of each watch the operator's kopf holds: every child kind with the selector its
    settings give it (``watch_only_labelled``), and the fleets. kopf also lists each kind first and watches the CRDs,
    which the floor's row leaves out (nothing else changes them during a run)."""
    from mmfleet.handlers.children import CHILD_KINDS
    from mmfleet.handlers.settings import watch_only_labelled

    settings = kopf.OperatorSettings()
    watch_only_labelled(settings)
    kinds = [*CHILD_KINDS, (GROUP, VERSION, PLURAL)]
    selectors = settings.watching.label_selectors
    return [(f"/apis/{g}/{v}/{p}" if g else f"/api/{v}/{p}", selectors.get((g, v, p), "")) for g, v, p in kinds]


@contextlib.contextmanager
def operator_watches(api: Any, progress: Progress) -> Iterator[dict[str, int]]:
    """The operator's watches (``operator_paths``) held open by the bench, which reads what they send and drops it,
    counting the bytes per open watch's path (what the context gives):
    what serving them costs the API server, apart from what the operator does with the events. Every watch is open
    before the run starts, and one that fails or ends early fails the run; a kind the cluster does not serve (404:
    one of the optional kinds whose CRD is not installed) is left out, as kopf leaves it."""
    from mmfleet.handlers.children import OPTIONAL_KINDS

    optional = {f"/apis/{g}/{v}/{p}" for g, v, p in OPTIONAL_KINDS}
    stop = threading.Event()
    streams: dict[str, Any] = {}
    read: dict[str, int] = {}
    broken: list[str] = []
    settled = threading.Semaphore(0)

    def hold(path: str, selector: str) -> None:
        try:
            stream = _get(api, path, _watch_query(selector=selector, timeout=3600), (5.0, 3700.0))
        except Exception as error:
            broken.append(f"{path}: {error}")
            settled.release()
            return
        if stream.status != 200:
            if not (stream.status == 404 and path in optional):
                broken.append(f"{path}: HTTP {stream.status}")
            settled.release()
            return
        streams[path], read[path] = stream, 0
        settled.release()
        with contextlib.suppress(Exception):  # shut down at the end
            while chunk := stream.read1(65536):
                read[path] += len(chunk)
        if not stop.is_set():
            broken.append(f"{path}: ended before the run did")

    paths = operator_paths()
    threads = [threading.Thread(target=hold, args=watch, daemon=True) for watch in paths]
    for thread in threads:
        thread.start()
    for _ in threads:
        if not settled.acquire(timeout=30):
            raise RuntimeError("the operator's watches did not open within 30 s")
    try:
        if broken:
            raise RuntimeError("the operator's watches: " + "; ".join(broken))
        yield read
        if broken:
            raise RuntimeError("the operator's watches: " + "; ".join(broken))
    finally:
        stop.set()
        for stream in streams.values():
            with contextlib.suppress(Exception):
                stream.shutdown()
        progress(f"   {len(streams)} of {len(paths)} watches held open (the rest not served), "
                 f"{sum(read.values()) / 1e6:.1f} MB read from them")  # fmt: skip


def _measure_floor(
    api: Any, count: int, pids: dict[str, int], progress: Progress, timeout: float, watched: bool = False
) -> Result:
    """What the control plane alone needs: each resource created, then the children the operator would render
    for it server-side applied by the bench itself, from as many threads as the operator has workers, with no
    status or event of ours (and, unless ``watched``, no watch but the bench's own of the Deployments). Ready: the
    Deployment's pod is ready."""
    from kubernetes import client

    from mmfleet import render
    from mmfleet.api import MultimodalInference
    from mmfleet.config import OperatorConfig
    from mmfleet.render import FIELD_MANAGER

    custom, dyn = client.CustomObjectsApi(api), dynamic_client(api)

    def create(index: int) -> None:
        created = custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, _resource(index))
        for child in render.render(MultimodalInference.model_validate(created), "eks", monitoring_crds=False):
            kind = dyn.resources.get(api_version=child["apiVersion"], kind=child["kind"])
            response = dyn.server_side_apply(
                kind,
                body=child,
                name=child["metadata"]["name"],
                namespace=NAMESPACE,
                field_manager=FIELD_MANAGER,
                force_conflicts=True,
                serialize=False,
            )
            _ = response.data  # read to the end, so the connection goes back to the pool

    progress(f"   applying {count} resources and their children, no operator{', its watches open' if watched else ''}")
    with Watched(api, f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments") as deployments:
        cpu_before, requests_before = _usage(api, pids)
        start = time.monotonic()
        with ThreadPoolExecutor(max_workers=OperatorConfig.load().workers) as pool:
            list(pool.map(create, range(count)))
        applied = time.monotonic()
        ready = 0
        while time.monotonic() - applied < timeout:
            ready = sum((d.get("status") or {}).get("readyReplicas", 0) >= 1 for d in deployments.items())
            progress(f"   {ready}/{count} Deployments ready {time.monotonic() - start:.0f}s after the first apply")
            if ready == count:
                break
            time.sleep(1.0)
    cpu_after, requests_after = _usage(api, pids)
    nan = math.nan
    return Result(
        count=count, floor=True, watched=watched, apply_seconds=nan, ready_after_last_apply=nan,
        ready_after_first_apply=time.monotonic() - start, e2e_p50=nan,
        e2e_p99=nan, reconcile_p50_ms=nan, reconcile_p99_ms=nan, requests_per_reconcile=nan,
        requests_per_resource=nan, peak_rss_mb=nan, cpu_seconds=nan, all_ready=ready == count, cycle_p50_ms=nan,
        cycle_max_ms=nan, queries_per_cycle=nan, writes_per_cycle="-",
        cpu_share=_since(cpu_before, cpu_after),
        requests=_since(requests_before, requests_after),
        steady_requests={},
        steady_seconds=nan,
    )  # fmt: skip


@dataclass(frozen=True)
class Cycle:
    queries: int
    writes: str  # "?" from an operator that did not log them
    ms: float


def _cycles(log: Path, count: int) -> list[Cycle]:
    text = log.read_text(errors="replace")
    return [Cycle(int(q), w or "?", float(ms)) for n, q, w, ms in CYCLE.findall(text) if int(n) == count]


def _full_cycles(log: Path, count: int, progress: Progress) -> list[Cycle]:
    """The first ``CYCLES`` autoscaling cycles over every fleet logged once all are Ready."""
    before = len(_cycles(log, count))
    deadline = time.monotonic() + (CYCLES + 2) * AUTOSCALE_INTERVAL
    found: list[Cycle] = []
    while time.monotonic() < deadline:
        found = _cycles(log, count)[before:]
        if len(found) >= CYCLES:
            break
        time.sleep(1.0)
    progress(f"   {len(found)} autoscaling cycles over all {count} fleets")
    return found[:CYCLES]


def _label(r: Result) -> str:
    if r.watched:
        return f"{r.count}, no operator, its watches open"
    return f"{r.count}, no operator" if r.floor else str(r.count)


def _num(value: float, spec: str, suffix: str = "") -> str:
    return "-" if math.isnan(value) else f"{value:{spec}}{suffix}"


def _floor_ratio(r: Result, results: list[Result]) -> float:
    """All Ready from the first apply, against the no-operator run of the same count (NaN without one)."""
    floor = next((f for f in results if f.floor and not f.watched and f.count == r.count), None)
    return r.ready_after_first_apply / floor.ready_after_first_apply if floor is not None else math.nan


def render_results(results: list[Result]) -> str:
    headers = [
        "resources", "apply (s)", "all Ready after last apply (s)", "after first apply (s)",
        f"vs no operator (target {TARGET_FLOOR_RATIO:g}x)", f"status writes / fleet (target {TARGET_STATUS_WRITES:g})",
        "create→Ready p50 / p99 (s)", "reconcile p50 / p99 (ms)", "API req / reconcile",
        "operator API req / resource", "peak RSS (MB)", "vs 200 MB target", "operator CPU (s)",
        "autoscaler cycle p50 / max (ms)", "vs 1 s target", "Prometheus queries / cycle",
        "status writes per timed cycle",
    ]  # fmt: skip
    rows = [
        [
            _label(r),
            _num(r.apply_seconds, ".1f"),
            _num(r.ready_after_last_apply, ".1f") + ("" if r.all_ready else " (not all Ready)"),
            _num(r.ready_after_first_apply, ".1f"),
            "-" if r.floor and not r.watched else _num(_floor_ratio(r, results), ".2f", "x"),
            "-" if r.floor else _num(r.requests.get(STATUS_WRITE, 0.0) / r.count, ".2f"),
            f"{_num(r.e2e_p50, '.0f')} / {_num(r.e2e_p99, '.0f')}",
            f"{_num(r.reconcile_p50_ms, '.0f')} / {_num(r.reconcile_p99_ms, '.0f')}",
            _num(r.requests_per_reconcile, ".1f"),
            _num(r.requests_per_resource, ".1f"),
            _num(r.peak_rss_mb, ".0f"),
            _num(r.peak_rss_mb / TARGET_RSS_MB, ".2f", "x"),
            _num(r.cpu_seconds, ".0f"),
            f"{_num(r.cycle_p50_ms, '.0f')} / {_num(r.cycle_max_ms, '.0f')}",
            _num(r.cycle_p50_ms / TARGET_CYCLE_MS, ".2f", "x"),
            _num(r.queries_per_cycle, ".0f"),
            r.writes_per_cycle,
        ]
        for r in results
    ]
    return table(headers, rows)


def render_cpu(results: list[Result]) -> str:
    busiest = sorted(
        {n for r in results for n in r.cpu_share}, key=lambda n: -max(r.cpu_share.get(n, 0.0) for r in results)
    )
    rows = [
        [_label(r), f"{r.ready_after_first_apply:.0f}", f"{sum(r.cpu_share.values()):.0f}",
         *(f"{r.cpu_share[n]:.0f}" if n in r.cpu_share else "-" for n in busiest)]
        for r in results
    ]  # fmt: skip
    return table(["resources", "first apply to all Ready (s)", "CPU (s), all", *busiest], rows)


def render_steady(results: list[Result]) -> str:
    """Every request the API server served while the operator only cycled (all Ready), per fleet and minute:
    reads (GET, LIST) there are ones the watch cache did not answer."""
    rows = []
    for r in results:
        if r.floor or not r.steady_requests:
            continue
        per = r.count * r.steady_seconds / 60.0
        for key, n in sorted(r.steady_requests.items(), key=lambda item: -item[1]):
            if n > 0 and not key.startswith("WATCH"):
                read = "read" if key.split(" ", 1)[0] in READ_VERBS else "write"
                rows.append([_label(r), key, read, f"{n:.0f}", f"{n / per:.3f}"])
    return table(["resources", "request (verb resource subresource)", "kind", "count", "per fleet and minute"], rows)


def render_requests(results: list[Result], top: int = 20) -> str:
    """The API server's busiest request kinds, per resource applied, from the first apply until all were Ready."""
    totals: dict[str, float] = {}
    for r in results:
        for key, n in r.requests.items():
            totals[key] = max(totals.get(key, 0.0), n / r.count)
    keys = sorted((k for k in totals if totals[k] >= 0.05), key=lambda k: -totals[k])[:top]
    rows = [[k, *(f"{r.requests.get(k, 0.0) / r.count:.2f}" for r in results)] for k in keys]
    return table(["request (verb resource subresource)", *(f"per resource, {_label(r)}" for r in results)], rows)


def main(
    counts: list[int], docs: Path, timeout: float, progress: Progress, floor: bool = False, watched: bool = False
) -> int:
    """``watched`` adds a floor run with the operator's watches held open (``operator_watches``)."""
    results = []
    for count in counts:
        progress(f"== {count} resources")
        results.append(run_once(count, progress, timeout))
        if floor or watched:
            progress(f"== {count} resources, no operator")
            results.append(run_once(count, progress, timeout, floor=True))
        if watched:
            progress(f"== {count} resources, no operator, its watches open")
            results.append(run_once(count, progress, timeout, floor=True, watched=True))
    text = render_results(results)
    shares = render_cpu(results)
    requests = render_requests(results)
    steady = render_steady(results)
    print(text)
    print(shares)
    print(requests)
    print(steady)
    command = "mmfleet bench operator " + " ".join(f"--count {c}" for c in counts)
    command += " --floor-watched" if watched else " --floor" if floor else ""
    body = (
        f"Command: `{command}` (local control plane: etcd, kube-apiserver, kcm, scheduler, kwok; one node per "
        f"{PODS_PER_NODE} pods; pods turn Ready 1 s after binding). Machine: {os.cpu_count()} cores. "
        "Ratios are against issue 22's targets (lower is better): all Ready, from the first apply, within "
        f"{TARGET_FLOOR_RATIO:g}x the no-operator run of the same count (`--floor`), at most "
        f"{TARGET_STATUS_WRITES:g} status writes per fleet from its creation to all Ready (the API server's "
        f"`{STATUS_WRITE}` requests over that span, per resource). Every resource is autoscaled; "
        f"the autoscaler cycle (every {AUTOSCALE_INTERVAL:g} s) is timed over the first {CYCLES} cycles logged once "
        "all are Ready, from the operator's log: one batched Prometheus read for all fleets, then per fleet the "
        "decision, the status write when the status changed, and any scale. No twin serves these pods, so every "
        "fleet holds on missing series; the status writes of each timed cycle are listed. Both runs wait for Ready "
        "through a watch (the fleets' phase; with no operator, each Deployment's ready replica)."
        + (WATCHED_NOTE if watched else "")
        + f"\n\n{text}\n\nAPI requests per reconcile count the operator's own calls in one create/update; "
        "operator API requests per resource add the status refreshes driven by pod and Deployment events. "
        "Operator CPU is its user and system time from its start to the "
        "end of the timed cycles.\n\nWhere the machine's CPU went from the first apply until all were Ready "
        f"(CPU seconds per process; the machine has {os.cpu_count()} cores):\n\n{shares}\n\n"
        "The API server's requests over the same span, per resource applied (`apiserver_request_total`, "
        f"all clients, watches counted once when they start):\n\n{requests}\n\n"
        "Steady state: every request the API server served over the timed cycles, once all were Ready (only the "
        "operator is at work then; watches left out), per fleet and minute:\n\n"
        f"{steady}"
    )
    write_section(docs, "operator", "Operator at scale", body)
    return 0 if all(r.all_ready for r in results) else 1
