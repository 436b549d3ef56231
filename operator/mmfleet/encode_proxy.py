"""The encode sidecar (spec.disaggregation.encode): a request's images go through the encode tier, the request to the
server beside it.

vLLM 0.33's encoder disaggregation leaves the routing to whoever is in front (docs/rendering.md, Encode tier): an
encode-only instance answers a chat request with its items' encoder outputs announced in ``ec_transfer_params``
(non-streaming responses only), and a consuming instance reads them over NIXL when the request carries them back in
its own ``ec_transfer_params``. This sidecar does both steps for each chat request whose last user turn holds an
image, a video or an audio clip (the earlier turns' items are in the server's prefix cache when the request reaches
the replica that served them; where they are not, the server encodes them); any other request, and every other path
(``/metrics``, ``/health``, ``/v1/models``, warm standby's ``/sleep``), goes to the server unchanged. The request
keeps its items, so when the encode tier fails, times out or is not there yet the server encodes them itself
(``_fail_or_fallback`` in vLLM's ``ec_connector/cpu/scheduler``): the encode tier only ever makes a request faster,
never lost.

The server's own latency histograms start when a request reaches it, after the encode tier: the sidecar measures the
latency clients see, from the request's arrival at the pod (``FRONT_DOOR_E2E``, and ``FRONT_DOOR_TTFT`` to the first
streamed chunk, which vLLM sends with the first token), and adds those histograms to the server's ``/metrics`` as it
passes them on, where the autoscaler reads them in place of the server's. It also times each call to the encode tier
(``ENCODE_CALL``) and counts the items sent (``ENCODE_ITEMS``): the encode tier's share of TTFT and its demand, on
which the autoscaler scales that tier.

It runs in each serving pod from the server's own image, its source shipped in the fleet's ConfigMap, so it needs
the standard library and aiohttp only (a dependency of vllm 0.33, ``aiohttp>=3.14.4``, with its yarl and multidict).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

LOG = logging.getLogger("mmfleet.encode_proxy")
CHAT_PATH = "/v1/chat/completions"
# The paths on which vLLM 0.33 generates (entrypoints: OpenAI, Anthropic, its own), all timed at the front door.
GENERATE_PATHS = frozenset(
    {
        CHAT_PATH,
        "/v1/completions",
        "/v1/responses",
        "/v1/messages",
        "/inference/v1/generate",
        "/v1/chat/completions/batch",
    }
)
METRICS_PATH = "/metrics"
# The front door's latency histograms (mmfleet.backends.vllm names them for the autoscaler), on vLLM 0.33's own buckets
# for each (v1/metrics/buckets.py REQUEST_LATENCY_BUCKETS, TIME_TO_FIRST_TOKEN_BUCKETS).
FRONT_DOOR_E2E = "mmfleet_front_door_e2e_request_latency_seconds"
FRONT_DOOR_TTFT = "mmfleet_front_door_time_to_first_token_seconds"
# What a request with items waits at the sidecar before it goes on to the server (its turn among large ones, the
# rewrite, and the call to the encode tier: the hop, the encode server's preprocessing, queue and encoder), on the
# TTFT buckets: the encode tier's share of TTFT; the items sent, its demand; and the calls that brought no encoder
# outputs (an error answer, the tier not reached, none announced; not a timeout, which is a slow tier, not a failing
# one), after which the server encodes the items itself. The autoscaler scales
# the encode tier on them (mmfleet.backends.vllm names them).
ENCODE_CALL = "mmfleet_encode_call_seconds"
ENCODE_ITEMS = "mmfleet_encode_items_total"
ENCODE_FAILURES = "mmfleet_encode_failures_total"
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
               960.0, 1920.0, 7680.0)  # fmt: skip
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0, 160.0, 640.0, 2560.0)  # fmt: skip
# A streamed answer's first token is its first "data:" line; a comment (vLLM's --sse-keep-alive-interval sends
# ": keep-alive") is not one.
SSE_DATA = b"data:"
EXPOSITION = "text/plain; version=0.0.4; charset=utf-8"
# Chat content parts that carry an item for the encoder (vLLM 0.33's part types, entrypoints/chat_utils.py).
MEDIA_PARTS = frozenset({"image_url", "input_image", "video_url", "audio_url", "input_audio"})
# Request fields that change how the items are processed, and so their hash: the encode request must agree.
PROCESSING_FIELDS = ("mm_processor_kwargs", "media_io_kwargs")
# Headers not passed on: hop-by-hop (RFC 9110 7.6.1) and those the Connection header names, Expect (aiohttp answers
# it), and those aiohttp writes for the body it sends on.
HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "proxy-connection",
        "expect",
        "host",
        "content-length",
    }
)
# Passed to the encode tier with the items: the credentials and the trace context (W3C).
ENCODE_HEADERS = frozenset({"authorization", "traceparent", "tracestate"})
# A chat request with images inline as data URLs can be large (aiohttp's default cap is 1 MiB); while it is turned into
# the encode request and back, the sidecar holds about five copies of it, so the large ones take turns.
MAX_REQUEST_BYTES = 32 * 1024 * 1024
LARGE_REQUEST_BYTES = 4 * 1024 * 1024
LARGE_AT_ONCE = 4
SESSION: web.AppKey[ClientSession] = web.AppKey("session", ClientSession)
LARGE: web.AppKey[asyncio.Semaphore] = web.AppKey("large", asyncio.Semaphore)


class Histogram:
    """A Prometheus histogram with no labels, written in the text format (0.0.4): what the standard library can do."""

    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...]) -> None:
        self.name, self.help_text, self.buckets = name, help_text, buckets
        self.counts = [0] * len(buckets)
        self.count, self.total = 0, 0.0

    def observe(self, seconds: float) -> None:
        for index, bound in enumerate(self.buckets):
            if seconds <= bound:
                self.counts[index] += 1
        self.count += 1
        self.total += seconds

    def exposition(self) -> str:
        lines = [f"# HELP {self.name} {self.help_text}", f"# TYPE {self.name} histogram"]
        lines += [
            f'{self.name}_bucket{{le="{bound!r}"}} {n}' for bound, n in zip(self.buckets, self.counts, strict=True)
        ]
        lines += [f'{self.name}_bucket{{le="+Inf"}} {self.count}', f"{self.name}_count {self.count}"]
        lines.append(f"{self.name}_sum {self.total!r}")
        return "\n".join(lines) + "\n"


def counter_exposition(name: str, help_text: str, value: int) -> str:
    """A Prometheus counter with no labels, in the text format (0.0.4), named as prometheus_client writes one."""
    return f"# HELP {name} {help_text}\n# TYPE {name} counter\n{name} {value}\n"


def media_items(payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The images, videos and audio clips of the chat request's last user turn, in their order: the items the server
    has not seen yet (an item's hash is its content's, or its ``uuid`` if it has one, so each part goes whole)."""
    messages = payload.get("messages")
    if not isinstance(messages, list):
        return []
    turns = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    content = turns[-1].get("content") if turns else None
    if not isinstance(content, list):
        return []
    return [part for part in content if isinstance(part, dict) and part.get("type") in MEDIA_PARTS]


def encode_request(payload: Mapping[str, Any], items: list[dict[str, Any]]) -> dict[str, Any]:
    """What the encode tier is asked: the items alone, answered whole (only a non-streaming response carries
    ``ec_transfer_params``); an encoder-only instance samples nothing, so one token is asked for."""
    request: dict[str, Any] = {
        "model": payload.get("model"),
        "messages": [{"role": "user", "content": items}],
        "stream": False,
        "max_tokens": 1,
    }
    request.update({field: payload[field] for field in PROCESSING_FIELDS if field in payload})
    return request


def _passed_on(headers: CIMultiDictProxy[str], keep_length: bool = False) -> CIMultiDict[str]:
    """``headers`` less the hop-by-hop ones (repeated ones kept); with ``keep_length``, Content-Length stays (an answer
    passed on byte for byte)."""
    named = {token.strip().lower() for value in headers.getall("Connection", []) for token in value.split(",")}
    dropped = (HOP_HEADERS | named) - ({"content-length"} if keep_length else set())
    return CIMultiDict((name, value) for name, value in headers.items() if name.lower() not in dropped)


class Proxy:
    """The sidecar's two upstreams: the server beside it and the encode tier's Service."""

    def __init__(self, server: str, encoder: str, encode_timeout: float) -> None:
        self.server = server.rstrip("/")
        self.encoder = encoder.rstrip("/")
        self.encode_timeout = encode_timeout
        self.e2e = Histogram(
            FRONT_DOOR_E2E, "Seconds from a request's arrival at the pod to its answer's end.", E2E_BUCKETS
        )
        self.ttft = Histogram(
            FRONT_DOOR_TTFT, "Seconds from a streamed request's arrival at the pod to its first token.", TTFT_BUCKETS
        )
        self.calls = Histogram(
            ENCODE_CALL, "Seconds a request with items waited at the sidecar for the encode tier.", TTFT_BUCKETS
        )
        self.items = self.failures = 0

    async def encode(
        self,
        session: ClientSession,
        payload: Mapping[str, Any],
        items: list[dict[str, Any]],
        headers: Mapping[str, str],
    ) -> dict[str, Any] | None:
        """The items' ``ec_transfer_params`` from the encode tier, or None (then the server encodes them)."""
        auth = {name: value for name, value in headers.items() if name.lower() in ENCODE_HEADERS}
        started = time.monotonic()
        try:
            async with session.post(
                self.encoder + CHAT_PATH,
                json=encode_request(payload, items),
                headers=auth,
                timeout=ClientTimeout(total=self.encode_timeout),
            ) as response:
                if response.status != 200:
                    text = (await response.text())[:300]
                    LOG.warning("encode tier answered %s: %s; the server encodes the items", response.status, text)
                    self.failures += 1
                    return None
                answer = await response.json(content_type=None)
        except TimeoutError:  # a tier too slow, not a failing one: its wait is in ENCODE_CALL, which scales it
            LOG.warning("encode tier did not answer in %gs; the server encodes the items", self.encode_timeout)
            return None
        except (ClientError, ValueError) as error:
            LOG.warning("encode tier not reached (%s: %s); the server encodes the items", type(error).__name__, error)
            self.failures += 1
            return None
        params = answer.get("ec_transfer_params") if isinstance(answer, dict) else None
        if not isinstance(params, dict) or not params:
            LOG.warning("encode tier announced no encoder outputs; the server encodes the items")
            self.failures += 1
            return None
        LOG.debug("encoded %d items in %.3f s", len(items), time.monotonic() - started)
        return params

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        arrived = time.monotonic()  # as vLLM's own clock, once the request is read
        if request.method == "GET" and request.path == METRICS_PATH:
            return await self._metrics(request)
        if request.method == "POST" and request.path == CHAT_PATH:
            if len(body) < LARGE_REQUEST_BYTES:
                body = await self._through_encoder(request, body, arrived)
            else:
                async with request.app[LARGE]:
                    body = await self._through_encoder(request, body, arrived)
        timed = request.method == "POST" and request.path in GENERATE_PATHS
        return await self._forward(request, body, arrived if timed else None)

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        """The server's /metrics, as plain text (so the front door's histograms can follow it), and then them."""
        headers = {"Accept": "text/plain;version=0.0.4", "Accept-Encoding": "identity"}
        try:
            async with request.app[SESSION].get(self.server + METRICS_PATH, headers=headers) as upstream:
                text = await upstream.text()
                status = upstream.status
        except ClientError as error:
            return web.json_response({"error": {"message": f"inference server not reached: {error}"}}, status=502)
        if status == 200:
            text = (
                text
                + ("" if text.endswith("\n") or not text else "\n")
                + self.e2e.exposition()
                + self.ttft.exposition()
                + self.calls.exposition()
                + counter_exposition(
                    ENCODE_ITEMS, "Images, videos and audio clips sent to the encode tier.", self.items
                )
                + counter_exposition(
                    ENCODE_FAILURES, "Calls to the encode tier that brought no encoder outputs.", self.failures
                )
            )
        return web.Response(status=status, body=text.encode(), headers={"Content-Type": EXPOSITION})

    async def _through_encoder(self, request: web.Request, body: bytes, arrived: float) -> bytes:
        """The request with its items' encoder outputs announced, or as it came; a request with items is timed from
        its arrival (``ENCODE_CALL``)."""
        try:
            payload = json.loads(body)
        except ValueError:
            return body  # the server answers a malformed request with its own error
        items = media_items(payload) if isinstance(payload, dict) else []
        if not items:
            return body
        self.items += len(items)
        try:
            params = await self.encode(request.app[SESSION], payload, items, request.headers)
        finally:  # a client that leaves cancels the handler: what it waited counts all the same
            self.calls.observe(time.monotonic() - arrived)
        return body if params is None else json.dumps({**payload, "ec_transfer_params": params}).encode()

    async def _forward(self, request: web.Request, body: bytes, arrived: float | None = None) -> web.StreamResponse:
        """The request to the server and its answer back as it comes; ``arrived``: time a generation, from then."""
        session = request.app[SESSION]
        try:
            # raw_path: the path and query as the client encoded them (path_qs would decode %2F to /).
            url = URL(self.server + request.raw_path, encoded=True)
            upstream = await session.request(request.method, url, data=body, headers=_passed_on(request.headers))
        except ClientError as error:
            LOG.warning("server not reached: %s", error)
            return web.json_response({"error": {"message": f"inference server not reached: {error}"}}, status=502)
        async with upstream:
            response = web.StreamResponse(
                status=upstream.status, headers=_passed_on(upstream.headers, keep_length=True)
            )
            await response.prepare(request)
            # Timed as vLLM times it: finished generations (200, and the engine's own failures, 5xx), to the last
            # byte the server sent, not to the client's reading it.
            timed = arrived is not None and (upstream.status == 200 or upstream.status >= 500)
            waiting = timed and upstream.headers.get("Content-Type", "").startswith("text/event-stream")
            tail = b""
            async for chunk in upstream.content.iter_any():
                received = time.monotonic()
                if waiting and arrived is not None and SSE_DATA in tail + chunk:
                    self.ttft.observe(received - arrived)
                    waiting = False
                tail = chunk[-len(SSE_DATA) :]
                await response.write(chunk)
            if timed and arrived is not None:
                self.e2e.observe(time.monotonic() - arrived)
            await response.write_eof()
            return response


def build_app(server: str, encoder: str, encode_timeout: float = 60.0) -> web.Application:
    proxy = Proxy(server, encoder, encode_timeout)
    app = web.Application(client_max_size=MAX_REQUEST_BYTES)
    app[LARGE] = asyncio.Semaphore(LARGE_AT_ONCE)

    async def session(app: web.Application) -> AsyncIterator[None]:
        # Bodies pass through as the server wrote them (compressed or not); no total timeout on a streamed answer.
        connector = TCPConnector(limit=0)
        async with ClientSession(
            connector=connector, auto_decompress=False, timeout=ClientTimeout(total=None, sock_connect=10)
        ) as client:
            app[SESSION] = client
            yield

    app.cleanup_ctx.append(session)
    app.router.add_route("*", "/{path:.*}", proxy.handle)
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True, help="where clients' requests arrive")
    parser.add_argument("--server", required=True, help="the inference server beside it, e.g. http://127.0.0.1:8000")
    parser.add_argument(
        "--encoder", required=True, help="the encode tier's Service, e.g. http://qwen-encode.ml.svc:8000"
    )
    parser.add_argument(
        "--encode-timeout",
        type=float,
        default=60.0,
        help="seconds to wait for the encode tier before the server encodes",
    )
    parser.add_argument(
        "--shutdown-seconds", type=float, default=30.0, help="after SIGTERM, how long answers in flight may take"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = build_app(args.server, args.encoder, args.encode_timeout)
    # A client that goes away cancels its request, so that the server aborts it, as it would for the client itself.
    web.run_app(app, port=args.port, access_log=None, handler_cancellation=True, shutdown_timeout=args.shutdown_seconds)


if __name__ == "__main__":
    main()
