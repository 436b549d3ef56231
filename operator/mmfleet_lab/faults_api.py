"""A fault-injecting proxy between the operator and kube-apiserver, on 127.0.0.1.

The operator talks plain HTTP to the proxy with a placeholder bearer token (its kubeconfig comes from
``kubeconfig``); the proxy re-originates every request over TLS to the real API server with the lab's
admin client certificate, streaming bodies both ways so watches work. While a ``Fault`` is set, a
share of the matching requests is answered by the fault instead: a Kubernetes ``Status`` with 409,
429 (with ``Retry-After``), 500 or 503; a request held open until the fault ends (hung); the
connection reset; or, for watches, the stream dropped. Every request is counted, so a test can bound
what the operator sent while the fault lasted (backoff, not a busy loop).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
import ssl
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import aiohttp
import yaml
from aiohttp import web

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
RETRY_AFTER_SECONDS = 2
WATCH_DROP_AFTER = 0.5  # s a watch stream lives while drop-watch is set


@dataclass(frozen=True)
class Fault:
    """What to inject: ``kind`` on ``share`` of requests whose method is in ``methods`` and path has ``path``."""

    kind: FaultKind
    share: float = 1.0
    methods: frozenset[str] = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})
    path: str = ""  # substring of the request path; empty: every path

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


def _status(code: int, reason: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"injected by the fault proxy: {code} {reason}",
        "reason": reason,
        "code": code,
    }
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if code == 429 else {}
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
        def _set() -> None:
            self._fault = fault
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
                return _status(*_STATUS_REASONS[fault.kind])
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
