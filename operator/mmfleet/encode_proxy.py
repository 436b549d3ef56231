"""The encode sidecar (spec.disaggregation.encode): a request's images go through the encode tier, the request to the
server beside it.

vLLM 0.33's encoder disaggregation leaves the routing to whoever is in front (docs/rendering.md, Encode tier): an
encode-only instance answers a chat request with its items' encoder outputs announced in ``ec_transfer_params``
(non-streaming responses only), and a consuming instance reads them over NIXL when the request carries them back in
its own ``ec_transfer_params``. This sidecar does both steps for each chat request that holds an image, a video or an
audio clip; any other request, and every other path (``/metrics``, ``/health``, ``/v1/models``), goes to the server
unchanged. The request keeps its items, so when the encode tier fails, times out or is not there yet the server
encodes them itself (``_fail_or_fallback`` in vLLM's ``ec_connector/cpu/scheduler``): the encode tier only ever
makes a request faster, never lost.

It runs in each serving pod from the server's own image, its source shipped in the fleet's ConfigMap, so it needs
the standard library and aiohttp only (a dependency of vllm 0.33, ``aiohttp>=3.14.4``, with its own yarl).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web
from yarl import URL

LOG = logging.getLogger("mmfleet.encode_proxy")
CHAT_PATH = "/v1/chat/completions"
# Chat content parts that carry an item for the encoder (vLLM's entrypoints/chat_utils.py part types).
MEDIA_PARTS = frozenset({"image_url", "video_url", "audio_url", "input_audio"})
# Request fields that change how the items are processed, and so their hash: the encode request must agree.
PROCESSING_FIELDS = ("mm_processor_kwargs", "media_io_kwargs")
# Headers not passed on: hop-by-hop (RFC 9110 7.6.1), and those aiohttp writes for the body it sends.
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
        "host",
        "content-length",
    }
)
# A chat request with images inline as data URLs can be large; aiohttp's default cap is 1 MiB.
MAX_REQUEST_BYTES = 256 * 1024 * 1024
SESSION: web.AppKey[ClientSession] = web.AppKey("session", ClientSession)


def media_items(payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The chat request's images, videos and audio clips, in the order the server will see them."""
    messages = payload.get("messages")
    if not isinstance(messages, list):
        return []
    items: list[dict[str, Any]] = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            items += [part for part in content if isinstance(part, dict) and part.get("type") in MEDIA_PARTS]
    return items


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


def _passed_on(headers: Mapping[str, str]) -> dict[str, str]:
    return {name: value for name, value in headers.items() if name.lower() not in HOP_HEADERS}


class Proxy:
    """The sidecar's two upstreams: the server beside it and the encode tier's Service."""

    def __init__(self, server: str, encoder: str, encode_timeout: float) -> None:
        self.server = server.rstrip("/")
        self.encoder = encoder.rstrip("/")
        self.encode_timeout = encode_timeout

    async def encode(
        self,
        session: ClientSession,
        payload: Mapping[str, Any],
        items: list[dict[str, Any]],
        headers: Mapping[str, str],
    ) -> dict[str, Any] | None:
        """The items' ``ec_transfer_params`` from the encode tier, or None (then the server encodes them)."""
        auth = {name: value for name, value in headers.items() if name.lower() == "authorization"}
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
                    return None
                answer = await response.json(content_type=None)
        except (ClientError, TimeoutError, ValueError) as error:
            LOG.warning("encode tier not reached (%s: %s); the server encodes the items", type(error).__name__, error)
            return None
        params = answer.get("ec_transfer_params") if isinstance(answer, dict) else None
        if not isinstance(params, dict) or not params:
            LOG.warning("encode tier announced no encoder outputs; the server encodes the items")
            return None
        LOG.debug("encoded %d items in %.3f s", len(items), time.monotonic() - started)
        return params

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.method == "POST" and request.path == CHAT_PATH:
            body = await self._through_encoder(request, body)
        return await self._forward(request, body)

    async def _through_encoder(self, request: web.Request, body: bytes) -> bytes:
        try:
            payload = json.loads(body)
        except ValueError:
            return body  # the server answers a malformed request with its own error
        items = media_items(payload) if isinstance(payload, dict) else []
        if not items:
            return body
        params = await self.encode(request.app[SESSION], payload, items, request.headers)
        if params is None:
            return body
        return json.dumps({**payload, "ec_transfer_params": params}).encode()

    async def _forward(self, request: web.Request, body: bytes) -> web.StreamResponse:
        session = request.app[SESSION]
        try:
            # raw_path: the path and query as the client encoded them (path_qs would decode %2F to /).
            url = URL(self.server + request.raw_path, encoded=True)
            upstream = await session.request(request.method, url, data=body, headers=_passed_on(request.headers))
        except ClientError as error:
            LOG.warning("server not reached: %s", error)
            return web.json_response({"error": {"message": f"inference server not reached: {error}"}}, status=502)
        async with upstream:
            response = web.StreamResponse(status=upstream.status, headers=_passed_on(upstream.headers))
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response


def build_app(server: str, encoder: str, encode_timeout: float = 60.0) -> web.Application:
    proxy = Proxy(server, encoder, encode_timeout)
    app = web.Application(client_max_size=MAX_REQUEST_BYTES)

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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    web.run_app(build_app(args.server, args.encoder, args.encode_timeout), port=args.port, access_log=None)


if __name__ == "__main__":
    main()
