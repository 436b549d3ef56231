"""A fault-injecting proxy between the operator and kube-apiserver, on 127.0.0.1.

The operator talks plain HTTP to the proxy with a placeholder bearer token (its kubeconfig comes from
``kubeconfig``); the proxy re-originates every request over TLS to the real API server with the lab's
admin client certificate, streaming bodies both ways so watches work. While a ``Fault`` is set, a
share of the matching requests is answered by the fault instead: a Kubernetes ``Status`` with 409,
429 or 503 (with a ``Retry-After`` when the fault sets one), 500; a request held open until the fault
ends (hung); the connection reset; or, for watches, the stream dropped. Every request is counted, so a
test can bound what the operator sent while the fault lasted (backoff, not a busy loop).

``CASES`` are the faults the integration test and ``mmfleet bench faults --api-trials N`` set; ``run_trial``
is one trial of one: fleets Ready at 1 replica are scaled to 2 while the fault lasts, and an autoscaled one
has its spec changed (its maxReplicas), so each reconciles during the fault; then the time until the
namespace is converged and clean (``faults_crash.audit``) is measured from the fault's end. The operator
runs with ``OPERATOR_ENV``: an autoscaling cycle every 2 s, so the autoscaler writes the autoscaled fleet's
status while its reconcile waits to be retried.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import random
import re
import ssl
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp
import yaml
from aiohttp import web

from mmfleet.api import GROUP, VERSION
from mmfleet.kube import REQUEST_TIMEOUT
from mmfleet_lab.faults_crash import Audit, Namespace, percentile

FaultKind = Literal["409", "429", "500", "503", "hang", "reset", "drop-watch"]
HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "proxy-authorization",
        "proxy-connection",
        "content-length",
        "authorization",
        "host",
    }
)
WATCH_DROP_AFTER = 0.5  # s a watch stream lives while drop-watch is set


@dataclass(frozen=True)
class Fault:
    """What to inject: ``kind`` on ``share`` of requests whose method is in ``methods`` and path has ``path``."""

    kind: FaultKind
    share: float = 1.0
    methods: frozenset[str] = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})
    path: str = ""  # substring of the request path; empty: every path
    retry_after: int | None = None  # seconds, sent as Retry-After with a 429 or 503

    def matches(self, request: web.BaseRequest, is_watch: bool) -> bool:
        if self.kind == "drop-watch":
            return is_watch and self.path in request.path
        return request.method in self.methods and self.path in request.path and not is_watch


@dataclass
class Counts:
    """Requests the proxy received, split by whether a fault was set, and the ones it faulted."""

    during_fault: Counter[str] = field(default_factory=Counter)  # "METHOD /path" -> requests while a fault was set
    faulted: int = 0
    total: int = 0


def _is_watch(request: web.BaseRequest) -> bool:
    return request.query.get("watch") in {"true", "1"}


def _status(code: int, reason: str, retry_after: int | None = None) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"injected by the fault proxy: {code} {reason}",
        "reason": reason,
        "code": code,
    }
    headers = {"Retry-After": str(retry_after)} if retry_after is not None and code in (429, 503) else {}
    return web.json_response(body, status=code, headers=headers)


_STATUS_REASONS = {
    "409": (409, "Conflict"),
    "429": (429, "TooManyRequests"),
    "500": (500, "InternalError"),
    "503": (503, "ServiceUnavailable"),
}


class FaultProxy:
    """The proxy in a thread of its own; ``set_fault`` / ``clear`` switch faults from the test's thread."""

    def __init__(self, upstream: str, admin_kubeconfig: Path, seed: int = 0) -> None:
        self.upstream = upstream.rstrip("/")
        self._admin = yaml.safe_load(admin_kubeconfig.read_text())
        self._rng = random.Random(seed)
        self._fault: Fault | None = None
        self._cleared = asyncio.Event()
        self.counts = Counts()
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault proxy", daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._tmp = tempfile.TemporaryDirectory(prefix="mmfleet-fault-proxy-")
        self._watches: dict[int, web.BaseRequest] = {}  # id -> an open watch (requests are not hashable)

    def _ssl(self) -> ssl.SSLContext:
        cluster = self._admin["clusters"][0]["cluster"]
        user = self._admin["users"][0]["user"]
        tmp = Path(self._tmp.name)
        for name, key in (
            ("ca.crt", cluster["certificate-authority-data"]),
            ("client.crt", user["client-certificate-data"]),
            ("client.key", user["client-key-data"]),
        ):
            (tmp / name).write_bytes(base64.b64decode(key))
        context = ssl.create_default_context(cafile=str(tmp / "ca.crt"))
        context.load_cert_chain(tmp / "client.crt", tmp / "client.key")
        return context

    def start(self) -> FaultProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        return self

    async def _start(self) -> None:
        self._cleared = asyncio.Event()
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._ssl()), timeout=aiohttp.ClientTimeout(total=None)
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    def stop(self) -> None:
        async def _stop() -> None:
            self._cleared.set()
            for request in list(self._watches.values()):
                _drop(request)
            if self._runner is not None:
                await self._runner.cleanup()
            if self._session is not None:
                await self._session.close()

        asyncio.run_coroutine_threadsafe(_stop(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._tmp.cleanup()

    def set_fault(self, fault: Fault) -> None:
        """Inject ``fault`` from now on; the counts start afresh."""

        def _set() -> None:
            self._fault = fault
            self.counts = Counts()
            self._cleared.clear()
            for request in list(self._watches.values()):
                if fault.matches(request, True):
                    _drop(request)

        self._loop.call_soon_threadsafe(_set)

    def clear(self) -> None:
        def _clear() -> None:
            self._fault = None
            self._cleared.set()

        self._loop.call_soon_threadsafe(_clear)

    def snapshot(self) -> Counts:
        """A copy of the counts, taken on the proxy's loop (which changes them)."""

        async def _copy() -> Counts:
            return copy.deepcopy(self.counts)

        return asyncio.run_coroutine_threadsafe(_copy(), self._loop).result(timeout=10)

    def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig for the operator that points at the proxy (plain HTTP, a placeholder token)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "fault-proxy",
            "clusters": [{"name": "fault-proxy", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
            "users": [{"name": "fault-proxy", "user": {"token": "fault-proxy"}}],
            "contexts": [{"name": "fault-proxy", "context": {"cluster": "fault-proxy", "user": "fault-proxy"}}],
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        watch = _is_watch(request)
        fault = self._fault
        self.counts.total += 1
        if fault is not None:
            self.counts.during_fault[f"{request.method} {request.path}{' watch' if watch else ''}"] += 1
        if fault is not None and fault.matches(request, watch) and self._rng.random() < fault.share:
            self.counts.faulted += 1
            if fault.kind in _STATUS_REASONS:
                return _status(*_STATUS_REASONS[fault.kind], fault.retry_after)
            if fault.kind == "hang":
                await self._cleared.wait()
                return _status(503, "ServiceUnavailable")
            if fault.kind == "reset":
                if request.transport is not None:
                    request.transport.abort()
                raise asyncio.CancelledError
        return await self._forward(request, watch)

    async def _forward(self, request: web.Request, watch: bool) -> web.StreamResponse:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        body = await request.read()
        async with self._session.request(
            request.method,
            f"{self.upstream}{request.rel_url}",
            headers=headers,
            data=body or None,
            allow_redirects=False,
            auto_decompress=False,
        ) as upstream:
            response = web.StreamResponse(
                status=upstream.status,
                headers={k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS},
            )
            fault = self._fault
            if watch and fault is not None and fault.matches(request, watch):
                self.counts.faulted += 1
                asyncio.get_running_loop().call_later(WATCH_DROP_AFTER, _drop, request)
            if watch:
                self._watches[id(request)] = request
            try:
                with contextlib.suppress(ConnectionResetError):  # the operator (or a drop) closed the stream
                    await response.prepare(request)
                    async for chunk in upstream.content.iter_any():
                        await response.write(chunk)
                    await response.write_eof()
            finally:
                self._watches.pop(id(request), None)
            return response


def _drop(request: web.BaseRequest) -> None:
    """Cut a stream mid-flight, as a load balancer or an API server restart does."""
    if request.transport is not None:
        request.transport.abort()


FAULT_SECONDS = 15.0
CONVERGE_TIMEOUT = 120.0
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Non-watch requests a second and fleet the operator may send while a fault lasts: backoff, not a busy loop.
MAX_REQUESTS_PER_FLEET_SECOND = 3.0
# The operator's settings for these runs: no Prometheus (the autoscaled fleet holds and says so), a cycle every 2 s.
OPERATOR_ENV = {"MMFLEET_PROMETHEUS_URL": "", "MMFLEET_AUTOSCALE_INTERVAL": "2s"}
FIXED = [f"api-{i}" for i in range(3)]
AUTOSCALED = "api-auto"


@dataclass(frozen=True)
class Case:
    """One fault as the test and the benchmark set it. ``says``: what every fleet's Progressing must quote while
    it lasts, after ``apply Deployment <namespace>/<fleet>: `` (None: not asserted, as when half of all calls fail
    and the status write may fail with them)."""

    fault: Fault
    scope: str
    seconds: float = FAULT_SECONDS
    says: str | None = None


def on_apply(kind: FaultKind, retry_after: int | None = None) -> Fault:
    """``kind`` on every write to a Deployment (its apply, its scale): what a reconcile cannot do without."""
    return Fault(kind, methods=WRITES, path="/deployments", retry_after=retry_after)


CASES = {
    "409-on-apply": Case(on_apply("409"), "writes to Deployments", says="409 Conflict; next in "),
    "429-on-apply": Case(
        on_apply("429", retry_after=2),
        "writes to Deployments, `Retry-After: 2`",
        says="429 Too Many Requests; the API server asked to retry after 2 s; next in 2 s",
    ),
    "429-half": Case(Fault("429", share=0.5, retry_after=2), "half of all calls, `Retry-After: 2`"),
    "500-on-apply": Case(on_apply("500"), "writes to Deployments", says="500 Internal Server Error; next in "),
    "503-half": Case(Fault("503", share=0.5), "half of all calls"),
    # Longer than the read timeout, so the operator gives up on a hung apply while the fault lasts.
    "hang-on-apply": Case(
        on_apply("hang"),
        "writes to Deployments, held until the fault ends",
        seconds=REQUEST_TIMEOUT[1] + 10,
        says=f"no answer from the API server within {REQUEST_TIMEOUT[1]:g} s; next in ",
    ),
    "reset-on-apply": Case(on_apply("reset"), "writes to Deployments", says="connection reset by the API server"),
    "reset-half": Case(Fault("reset", share=0.5), "half of all calls"),
    "drop-watch": Case(Fault("drop-watch"), "every watch, cut 0.5 s after it opens"),
}


@dataclass(frozen=True)
class Trial:
    """One fault's trial: what was sent while it lasted, what the fleets said, how long converging took after it."""

    name: str
    seconds: float  # how long the fault lasted
    counts: Counts  # what the proxy saw while it lasted
    converge: float | None  # s from the fault's end to a converged, clean namespace; None: not within the timeout
    audit: Audit  # the last audit
    said: dict[str, list[str]]  # fleet -> each Progressing "reason: message" seen while the fault lasted, in turn
    during: Audit | None = None  # the audit taken just before the fault ended

    @property
    def requests(self) -> int:
        """Non-watch requests while the fault lasted."""
        return sum(n for k, n in self.counts.during_fault.items() if not k.endswith(" watch"))

    @property
    def watch_opens(self) -> Counter[str]:
        return Counter({k: n for k, n in self.counts.during_fault.items() if k.endswith(" watch")})

    def elsewhere(self, namespace: str) -> Counter[str]:
        """Requests about another namespace than ``namespace``: none, from an operator that watches only it."""
        other = re.compile(rf"/namespaces/(?!{re.escape(namespace)}/)[^/]+/")
        return Counter({k: n for k, n in self.counts.during_fault.items() if other.search(k)})

    def applies(self, namespace: str, fleet: str) -> int:
        """The Deployment applies (server-side apply: PATCH) of ``fleet`` while the fault lasted."""
        return self.counts.during_fault[f"PATCH /apis/apps/v1/namespaces/{namespace}/deployments/{fleet}"]

    def says(self, case: Case, namespace: str) -> dict[str, bool]:
        """Whether each fleet's Progressing named the call (its Deployment's apply, or its scale for the autoscaled
        fleet) and quoted ``case.says`` while the fault lasted."""
        call = re.compile(rf"ApiServerRetrying: (apply|scale) Deployment {re.escape(namespace)}/(?P<fleet>[^: ]+)")
        return {
            fleet: any(
                (found := call.match(said)) is not None and found["fleet"] == fleet and f": {case.says}" in said
                for said in seen
            )
            for fleet, seen in self.said.items()
        }

    def bounded(self) -> bool:
        """At most ``MAX_REQUESTS_PER_FLEET_SECOND`` non-watch requests a second and fleet while the fault lasted."""
        return self.requests <= MAX_REQUESTS_PER_FLEET_SECOND * len(self.said) * self.seconds

    def kept(self) -> dict[str, bool]:
        """Whether each fleet's Progressing, once ApiServerRetrying, stayed so while the fault lasted (no status
        write of a refresh or of the autoscaler's cycle replaced it before a reconcile went through)."""
        kept = {}
        for fleet, seen in self.said.items():
            since = next((i for i, said in enumerate(seen) if said.startswith("ApiServerRetrying")), len(seen))
            kept[fleet] = all(said.startswith("ApiServerRetrying") for said in seen[since:])
        return kept


AUTOSCALING = {"minReplicas": 1, "maxReplicas": 3, "slo": {"target": "2s"}}


def create_fleets(ns: Namespace) -> None:
    """``FIXED`` at 1 replica and ``AUTOSCALED`` (which holds 1 replica: no Prometheus)."""
    for name in [*FIXED, AUTOSCALED]:
        spec: dict[str, Any] = {"model": {"name": "Qwen/Qwen2.5-VL-3B-Instruct"}}
        spec.update({"autoscaling": AUTOSCALING} if name == AUTOSCALED else {"replicas": 1})
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "MultimodalInference", "metadata": {"name": name}}
        ns.fleets.create(namespace=ns.namespace, body={**body, "spec": spec})


def _patch(ns: Namespace, name: str, spec: dict[str, Any]) -> None:
    ns.fleets.patch(name=name, namespace=ns.namespace, body={"spec": spec}, content_type="application/merge-patch+json")


def scale_fleets(ns: Namespace, names: Iterable[str], replicas: int) -> None:
    for name in names:
        _patch(ns, name, {"replicas": replicas})


def change_autoscaled(ns: Namespace) -> None:
    """A new generation of ``AUTOSCALED`` (maxReplicas 3 <-> 4), which its replicas (held at 1) do not follow."""
    spec = ns.fleets.get(name=AUTOSCALED, namespace=ns.namespace).to_dict()["spec"]
    _patch(ns, AUTOSCALED, {"autoscaling": {"maxReplicas": 7 - int(spec["autoscaling"]["maxReplicas"])}})


def converge(ns: Namespace, timeout: float) -> tuple[float | None, Audit]:
    """Seconds until the namespace is converged and clean (every fleet Ready as its spec asks), else None."""
    started = time.monotonic()
    while True:
        result = ns.audit()
        if result.clean:
            return time.monotonic() - started, result
        if time.monotonic() - started > timeout:
            return None, result
        time.sleep(0.25)


def run_trial(ns: Namespace, proxy: FaultProxy, name: str, timeout: float = CONVERGE_TIMEOUT) -> Trial:
    """While ``CASES[name]`` lasts, ``FIXED`` (Ready at 1) are scaled to 2 and ``AUTOSCALED`` changed; then the time
    from the fault's end until all are converged and the audit clean."""
    case = CASES[name]
    proxy.set_fault(case.fault)
    began = time.monotonic()
    scale_fleets(ns, FIXED, 2)
    change_autoscaled(ns)
    said: dict[str, list[str]] = {n: [] for n in [*FIXED, AUTOSCALED]}
    while time.monotonic() - began < case.seconds:
        for fleet in ns.fleets.get(namespace=ns.namespace).to_dict()["items"]:
            seen = said.get(fleet["metadata"]["name"])
            for c in (fleet.get("status") or {}).get("conditions") or []:
                text = f"{c['reason']}: {c.get('message', '')}"
                if c["type"] == "Progressing" and seen is not None and seen[-1:] != [text]:
                    seen.append(text)
        time.sleep(0.5)
    during = ns.audit()  # through the admin client, not the proxy
    proxy.clear()
    seconds = time.monotonic() - began
    counts = proxy.snapshot()
    took, audit = converge(ns, timeout)
    return Trial(name, seconds, counts, took, audit, said, during)


def reset(ns: Namespace, timeout: float = CONVERGE_TIMEOUT) -> None:
    """``FIXED`` back to 1 replica each, converged: the next trial starts where the first did."""
    scale_fleets(ns, FIXED, 1)
    took, audit = converge(ns, timeout)
    if took is None:
        raise RuntimeError(f"fleets did not return to 1 replica within {timeout:.0f}s: {audit.problems[:5]}")


def _said(trials: list[Trial], namespace: str) -> str:
    """The ApiServerRetrying messages seen, the fleet written ``<fleet>`` and the delay N, most seen first."""
    seen: Counter[str] = Counter()
    for trial in trials:
        for fleet, said in trial.said.items():
            general = {
                re.sub(r"next in \d+ s", "next in N s", text.replace(f"{namespace}/{fleet}", "<fleet>"))
                for text in said
                if text.startswith("ApiServerRetrying")
            }
            seen.update(general)  # once per fleet-trial
    fleet_trials = sum(len(t.said) for t in trials)
    return "; ".join(f'"{text}" ({n} of {fleet_trials})' for text, n in seen.most_common(3)) or "none"


def _kept(trials: list[Trial]) -> str:
    """Of the fleet-trials that showed ApiServerRetrying, how many kept it until the fault ended (``Trial.kept``)."""
    showed = [
        trial.kept()[fleet]
        for trial in trials
        for fleet, seen in trial.said.items()
        if any(said.startswith("ApiServerRetrying") for said in seen)
    ]
    return f"{sum(showed)} of {len(showed)}"


HEADERS = [
    "fault",
    "scope",
    "trials",
    "not converged",
    "lost",
    "duplicated",
    "adopted",
    "converge p50 s",
    "converge p99 s",
    "requests during the fault (non-watch, mean)",
    "per s and fleet (max)",
    "faulted (mean)",
    "Progressing seen (fleet-trials)",
    "ApiServerRetrying kept",
]


def row(name: str, trials: list[Trial], namespace: str) -> list[object]:
    times = [t.converge for t in trials if t.converge is not None]
    audits = [t.audit for t in trials]
    return [
        name,
        CASES[name].scope,
        len(trials),
        sum(t.converge is None for t in trials),
        max(a.lost for a in audits),
        max(a.duplicated for a in audits),
        max(a.adopted for a in audits),
        f"{percentile(times, 0.5):.1f}",
        f"{percentile(times, 0.99):.1f}",
        f"{statistics.fmean(t.requests for t in trials):.0f} in {statistics.fmean(t.seconds for t in trials):.0f} s",
        f"{max(t.requests / t.seconds / len(t.said) for t in trials):.1f}",
        f"{statistics.fmean(t.counts.faulted for t in trials):.0f}",
        _said(trials, namespace),
        _kept(trials),
    ]


def run(
    api: Any,
    namespace: str,
    proxy: FaultProxy,
    trials: int,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, list[Trial]]:
    """``trials`` trials of every case, in turn, on the fleets of ``create_fleets``, converged."""
    ns = Namespace(api, namespace)
    done: dict[str, list[Trial]] = {name: [] for name in CASES}
    for n in range(trials):
        for name in CASES:
            trial = run_trial(ns, proxy, name)
            done[name].append(trial)
            took = "not converged" if trial.converge is None else f"converged {trial.converge:.1f}s after"
            progress(
                f"{name} trial {n + 1}/{trials}: {trial.requests} requests in {trial.seconds:.1f}s "
                f"({trial.counts.faulted} faulted), {took}"
            )
            reset(ns)
    return done


CLUSTER = "mmfleet-faults-api"
OPERATOR_LOG = Path(tempfile.gettempdir()) / f"{CLUSTER}-operator.log"
DOCS_KEY = "faults-api"


def _commit() -> str:
    """The commit of the code measured (and whether operator/ had uncommitted changes), for the table's caption."""
    import subprocess

    here = Path(__file__).parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", str(here.parent)], cwd=here, check=False)
    return f"{sha} with uncommitted changes" if dirty.returncode else sha


def main(trials: int, docs: Path, progress: Callable[[str], None]) -> int:
    """``mmfleet bench faults --api-trials N``: a fresh local cluster, the operator as its own process talking to it
    through the proxy, ``trials`` trials of every case; the table into ``docs``. Exits 1 when a trial did not
    converge or sent more than ``MAX_REQUESTS_PER_FLEET_SECOND`` a second and fleet, naming it."""
    import os
    import subprocess
    import sys

    from mmfleet_lab.bench.operator_scale import NAMESPACE, _install
    from mmfleet_lab.bench.report import table, write_section
    from mmfleet_lab.cluster import down, up

    commit = _commit()
    cluster = up(CLUSTER, pod_ready_delay="2s", progress=progress)
    proxy: FaultProxy | None = None
    operator: subprocess.Popen[bytes] | None = None
    try:
        api = _install(cluster)
        proxy = FaultProxy(cluster.server, cluster.kubeconfig).start()
        kubeconfig = proxy.kubeconfig(cluster.state_dir / "proxy-kubeconfig")
        env = {**os.environ, **OPERATOR_ENV, "KUBECONFIG": str(kubeconfig)}
        progress(f"the operator's log: {OPERATOR_LOG} (kept after the cluster is down)")
        with OPERATOR_LOG.open("wb") as out:
            command = [sys.executable, "-m", "mmfleet.cli", "run", "--health-address", "", "--metrics-address", ""]
            operator = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        ns = Namespace(api, NAMESPACE)
        create_fleets(ns)
        if converge(ns, CONVERGE_TIMEOUT)[0] is None:
            raise RuntimeError("the fleets never became Ready through the proxy")
        done = run(api, NAMESPACE, proxy, trials, progress)
    finally:
        if operator is not None:
            operator.terminate()
            operator.wait(timeout=15)
        if proxy is not None:
            proxy.stop()
        down(CLUSTER, progress=progress)
    rows = [row(name, found, NAMESPACE) for name, found in done.items()]
    body = (
        f"{table(HEADERS, rows)}\n\n{len(FIXED)} fleets Ready at 1 replica, scaled to 2 as each fault begins, and an "
        f"autoscaled one whose spec changes then; the fault lasts {FAULT_SECONDS:.0f} s "
        f"({CASES['hang-on-apply'].seconds:.0f} s when hung). Converge: from the fault's end to every fleet Ready as "
        f"its spec asks with a clean audit (p50/p99 nearest rank over the converged trials); lost, duplicated, "
        f"adopted: the worst trial's. Measured at {commit}; reproduce: "
        f"`mmfleet bench faults --kills 0 --api-trials {trials}`"
    )
    write_section(docs, DOCS_KEY, f"API server faults, {trials} trials each", body, level=3)
    failed = []
    for trial in (t for found in done.values() for t in found):
        if trial.converge is None:
            failed.append(f"{trial.name}: not converged: {'; '.join(trial.audit.problems[:5])}")
        if not trial.bounded():
            failed.append(
                f"{trial.name}: {trial.requests} requests in {trial.seconds:.1f}s from {len(trial.said)} fleets"
            )
    for line in failed:
        progress(line)
    return 1 if failed else 0
