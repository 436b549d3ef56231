"""A fault-injecting HTTP proxy in front of a real Prometheus, on 127.0.0.1: what the autoscaler reads, made bad.

The operator reads Prometheus' instant-query API (``/api/v1/query``); this proxy forwards every request to
the real server and, while a ``Fault`` is set, breaks the answer as a sick Prometheus, a proxy or a broken
exporter would: no answer at all (the connection closed), a slow one, an empty vector, an error status with
Prometheus' own error body, a body that is not JSON, or one fleet's value replaced (``NaN``, ``+Inf``, a wild
outlier, text that is not a number). A fault applies to the queries containing ``match`` and, for values,
to the series of one fleet, so one fleet's bad answer can be told from the others'.

Faults in what Prometheus scrapes (counter resets, stale series, partial scrapes, NaN in an exposition)
need no proxy: make the pods' own ``/metrics`` say them, and the real Prometheus stores them.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal, Self
from urllib.parse import parse_qs, urlsplit

FaultMode = Literal["drop", "slow", "empty", "status", "not-json", "value"]


@dataclass(frozen=True)
class Fault:
    """One way to break the answers to the queries containing ``match`` (all queries when empty).

    - ``drop``: the connection is closed with no response (Prometheus gone mid-request);
    - ``slow``: the answer comes after ``delay`` seconds (longer than the client waits);
    - ``empty``: a successful, empty vector (no series at all);
    - ``status``: HTTP ``status`` with Prometheus' error body (``bad_data`` for 400, ``execution`` for 422);
    - ``not-json``: HTTP 200 with a body that is not JSON;
    - ``value``: the sample of the fleet named ``fleet`` (every sample when None) gets ``value`` as its
      value, exactly as written into the JSON (Prometheus writes ``"NaN"``, ``"+Inf"``, ``"-Inf"``).
    """

    mode: FaultMode
    match: str = ""
    fleet: str | None = None
    value: str = "NaN"
    status: int = 422
    delay: float = 10.0


class LocalHttpServer:
    """An HTTP server on 127.0.0.1 (a free port, ``url``) in a thread of its own, closed on leaving a ``with``."""

    def _serve(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class PrometheusFaultProxy(LocalHttpServer):
    """Forwards to ``upstream`` (a Prometheus URL), applying the faults set with ``inject``; counts requests, and
    the most in flight at once (``busiest``: what the client's concurrency put on Prometheus)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.requests = 0
        self.busiest = 0
        self._in_flight = 0
        self._faults: tuple[Fault, ...] = ()
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                proxy._handle(self, None)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                proxy._handle(self, self.rfile.read(length))

            def log_message(self, *_: object) -> None:
                pass

        self._serve(Handler)

    @property
    def in_flight(self) -> int:
        """Requests not yet answered (a slow fault's still sleeping)."""
        return self._in_flight

    def inject(self, *faults: Fault) -> None:
        """Replace the faults in force (none: answers pass through unchanged)."""
        with self._lock:
            self._faults = faults

    def clear(self) -> None:
        self.inject()

    def _handle(self, handler: BaseHTTPRequestHandler, body: bytes | None) -> None:
        with self._lock:
            self.requests += 1
            self._in_flight += 1
            self.busiest = max(self.busiest, self._in_flight)
            faults = self._faults
        try:
            self._answer(handler, body, faults)
        finally:
            with self._lock:
                self._in_flight -= 1

    def _answer(self, handler: BaseHTTPRequestHandler, body: bytes | None, faults: tuple[Fault, ...]) -> None:
        query = _query_of(handler.path, body)
        fault = next((f for f in faults if f.match in query), None)
        if fault is not None and fault.mode == "drop":
            handler.close_connection = True
            handler.connection.close()
            return
        if fault is not None and fault.mode == "slow":
            time.sleep(fault.delay)
        if fault is not None and fault.mode == "status":
            kind = "bad_data" if fault.status == 400 else "execution"
            error = {"status": "error", "errorType": kind, "error": f"injected fault for {query!r}"}
            _send(handler, fault.status, json.dumps(error).encode())
            return
        if fault is not None and fault.mode == "not-json":
            _send(handler, 200, b"<html>502 Bad Gateway</html>", "text/html")
            return
        status, answer = self._forward(handler.path, body, handler.headers.get("Content-Type"))
        if fault is not None and fault.mode in ("empty", "value") and status == 200:
            answer = _rewrite(answer, fault)
        _send(handler, status, answer)

    def _forward(self, path: str, body: bytes | None, content_type: str | None) -> tuple[int, bytes]:
        request = urllib.request.Request(self.upstream + path, data=body, method="POST" if body is not None else "GET")
        if content_type:
            request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, bytes(response.read())
        except urllib.error.HTTPError as error:
            return error.code, bytes(error.read())


def _query_of(path: str, body: bytes | None) -> str:
    params = parse_qs(urlsplit(path).query)
    if body:
        params.update(parse_qs(body.decode(errors="replace")))
    return " ".join(params.get("query", []))


def _rewrite(answer: bytes, fault: Fault) -> bytes:
    document: dict[str, Any] = json.loads(answer)
    result = document.get("data", {}).get("result", [])
    if fault.mode == "empty":
        document["data"]["result"] = []
    else:
        for sample in result:
            if fault.fleet is None or sample.get("metric", {}).get("mmfleet_io_inference") == fault.fleet:
                sample["value"][1] = fault.value
    return json.dumps(document).encode()


def _send(handler: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str = "application/json") -> None:
    try:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
    except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout): nothing to answer
        pass
