"""The encode sidecar over real HTTP on loopback: a chat request's images go through the encode tier and come back as
``ec_transfer_params`` on the request the server gets; anything else, and every failure of the encode tier, reaches the
server as the client sent it.

The two upstreams answer as vLLM 0.33's OpenAI server does (``entrypoints/openai/chat_completion/serving.py``): the
encoder's non-streaming response carries ``ec_transfer_params`` at its top level, keyed by the item's hash, with the
producer's address (``ec_connector/cpu/scheduler`` ``request_finished``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import ClientSession, ClientTimeout, web
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from mmfleet import encode_proxy, render
from mmfleet_lab.cluster.process import free_port

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 64}}
ANNOUNCED = {
    "9f2c": {
        "modality": "image",
        "item_indices": [0],
        "metadata": {"image_grid_thw": [1, 16, 16]},
        "peer_host": "10.0.3.7",
        "peer_port": 5601,
        "size_bytes": 917504,
        "shape": [64, 3584],
    }
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def image_request(stream: bool = False) -> dict[str, Any]:
    return {
        "model": "qwen",
        "stream": stream,
        "max_tokens": 32,
        "mm_processor_kwargs": {"max_pixels": 200704},
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "What is it?"}, IMAGE]},
        ],
    }


class Upstream:
    """One fake vLLM server, recording what reached it."""

    def __init__(self, answer: Handler | None = None) -> None:
        self.seen: list[tuple[str, str, dict[str, str], bytes]] = []
        self.answer = answer

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append((request.method, request.raw_path, dict(request.headers), body))
        if self.answer is not None:
            return await self.answer(request)
        return web.json_response({"id": "chatcmpl-1", "choices": [{"message": {"content": "a cat"}}]})


async def encoder_answer(request: web.Request) -> web.StreamResponse:
    return web.json_response({"id": "chatcmpl-e", "choices": [], "ec_transfer_params": ANNOUNCED})


async def streamed(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for token in ("a", " cat"):
        await response.write(f"data: {json.dumps({'choices': [{'delta': {'content': token}}]})}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def serve(upstream: Upstream) -> TestServer:
    app = web.Application(client_max_size=encode_proxy.MAX_REQUEST_BYTES)
    app.router.add_route("*", "/{path:.*}", upstream.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


def run(
    server: Upstream | None,
    encoder: Upstream | None,
    send: Callable[[ClientSession, str], Awaitable[Any]],
    encode_timeout: float = 5.0,
) -> Any:
    """Start the upstreams (one left out: a port nothing listens on) and the sidecar, then ``send`` to the sidecar."""

    async def main() -> Any:
        upstream = await serve(server) if server is not None else None
        encode = await serve(encoder) if encoder is not None else None
        server_url = str(upstream.make_url("")) if upstream is not None else "http://127.0.0.1:9"
        encoder_url = str(encode.make_url("")) if encode is not None else "http://127.0.0.1:9"
        app = encode_proxy.build_app(server_url, encoder_url, encode_timeout)
        proxy = TestServer(app, host="127.0.0.1")
        await proxy.start_server()
        try:
            async with ClientSession() as client:
                return await send(client, str(proxy.make_url("/")))
        finally:
            await proxy.close()
            for started in (upstream, encode):
                if started is not None:
                    await started.close()

    return asyncio.run(main())


def post_chat(payload: dict[str, Any], headers: dict[str, str] | None = None) -> Callable[..., Awaitable[Any]]:
    async def send(client: ClientSession, base: str) -> tuple[int, bytes]:
        async with client.post(base + "v1/chat/completions", json=payload, headers=headers or {}) as response:
            return response.status, await response.read()

    return send


def test_an_image_request_reaches_the_server_with_the_encode_tiers_outputs() -> None:
    server, encoder = Upstream(), Upstream(encoder_answer)
    headers = {"Authorization": "Bearer k-1"}
    status, body = run(server, encoder, post_chat(image_request(), headers))
    assert status == 200
    assert json.loads(body)["choices"][0]["message"]["content"] == "a cat"

    ((method, path, encode_headers, encode_body),) = encoder.seen
    assert (method, path) == ("POST", "/v1/chat/completions")
    assert encode_headers["Authorization"] == "Bearer k-1"
    assert json.loads(encode_body) == {
        "model": "qwen",
        "messages": [{"role": "user", "content": [IMAGE]}],
        "stream": False,  # only a whole response carries ec_transfer_params
        "max_tokens": 1,
        "mm_processor_kwargs": {"max_pixels": 200704},  # the item's hash depends on them
    }
    ((_, _, served_headers, served_body),) = server.seen
    assert served_headers["Authorization"] == "Bearer k-1"
    # The request keeps its image: if the transfer fails, the server encodes it itself.
    assert json.loads(served_body) == {**image_request(), "ec_transfer_params": ANNOUNCED}


def test_a_streamed_answer_comes_back_as_the_server_wrote_it() -> None:
    server, encoder = Upstream(streamed), Upstream(encoder_answer)
    status, body = run(server, encoder, post_chat(image_request(stream=True)))
    assert status == 200
    assert body.decode().count("data: ") == 3 and body.endswith(b"data: [DONE]\n\n")
    assert json.loads(server.seen[0][3])["stream"] is True


def test_a_text_request_goes_past_the_encode_tier_unchanged() -> None:
    server, encoder = Upstream(), Upstream(encoder_answer)
    payload = {"model": "qwen", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    status, _ = run(server, encoder, post_chat(payload))
    assert status == 200
    assert encoder.seen == []
    assert json.loads(server.seen[0][3]) == payload


def test_the_server_encodes_when_the_encode_tier_is_down_or_failing() -> None:
    for encoder in (None, Upstream(lambda _: asyncio.sleep(0, web.json_response({"error": "x"}, status=500)))):
        server = Upstream()
        status, _ = run(server, encoder, post_chat(image_request()))
        assert status == 200
        assert json.loads(server.seen[0][3]) == image_request()


def test_a_call_that_brings_no_encoder_outputs_is_counted_as_failed() -> None:
    """The encode tier's autoscaler holds while most calls fail: the servers then encode, and its signal reads low."""

    async def metrics_answer(request: web.Request) -> web.StreamResponse:
        return web.Response(text="") if request.path == "/metrics" else await Upstream().handle(request)

    async def slow(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(2)
        return await encoder_answer(request)

    failing = Upstream(lambda _: asyncio.sleep(0, web.json_response({"error": "x"}, status=500)))
    # A timeout is a slow tier, not a failing one: its wait is timed (and scales it), it is no failure.
    for encoder, failed in ((failing, 1), (Upstream(encoder_answer), 0), (Upstream(slow), 0)):

        async def send(client: ClientSession, base: str) -> str:
            await post_chat(image_request())(client, base)
            async with client.get(base + "metrics") as response:
                return await response.text()

        text = run(Upstream(metrics_answer), encoder, send, encode_timeout=0.3)
        families = {f.name: f for f in text_string_to_metric_families(text)}
        counts = {name: families[name.removesuffix("_total")].samples[0].value for name in
                  (encode_proxy.ENCODE_ITEMS, encode_proxy.ENCODE_FAILURES)}  # fmt: skip
        assert counts == {encode_proxy.ENCODE_ITEMS: 1, encode_proxy.ENCODE_FAILURES: failed}
        waits = next(s.value for s in families[encode_proxy.ENCODE_CALL].samples if s.name.endswith("_count"))
        assert waits == 1


def test_the_server_encodes_when_the_encode_tier_is_slow() -> None:
    async def slow(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(2)
        return await encoder_answer(request)

    server = Upstream()
    status, _ = run(server, Upstream(slow), post_chat(image_request()), encode_timeout=0.3)
    assert status == 200
    assert "ec_transfer_params" not in json.loads(server.seen[0][3])


def test_a_large_inline_image_is_accepted() -> None:
    payload = image_request()
    big = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "B" * (4 * 1024 * 1024)}}
    payload["messages"][1]["content"].append(big)
    server, encoder = Upstream(), Upstream(encoder_answer)
    status, _ = run(server, encoder, post_chat(payload))
    assert status == 200
    assert json.loads(encoder.seen[0][3])["messages"][0]["content"] == [IMAGE, big]


def test_other_paths_pass_through() -> None:
    async def models(request: web.Request) -> web.StreamResponse:
        return web.Response(text='{"data": []}', headers={"X-Upstream": "yes"})

    server, encoder = Upstream(models), Upstream(encoder_answer)

    async def send(client: ClientSession, base: str) -> tuple[int, str, str | None]:
        async with client.get(base + "v1/models?a=1&b=two") as response:
            return response.status, await response.text(), response.headers.get("X-Upstream")

    assert run(server, encoder, send) == (200, '{"data": []}', "yes")
    assert server.seen[0][:2] == ("GET", "/v1/models?a=1&b=two")
    assert encoder.seen == []


def test_the_metrics_add_the_latency_clients_see_to_the_servers() -> None:
    """The encode tier's time is in the front door's histograms, which vLLM's own (from the request's arrival at the
    server) leave out; the server's exposition is passed on whole, as plain text."""

    async def server_answer(request: web.Request) -> web.StreamResponse:
        if request.path == "/metrics":
            return web.Response(text="# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 2\n")
        return (
            await streamed(request)
            if json.loads(await request.read()).get("stream")
            else await Upstream().handle(request)
        )

    async def slow_encoder(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(0.4)
        return await encoder_answer(request)

    server, encoder = Upstream(server_answer), Upstream(slow_encoder)

    async def send(client: ClientSession, base: str) -> str:
        for payload in (image_request(stream=True), image_request()):
            async with client.post(base + "v1/chat/completions", json=payload) as response:
                await response.read()
        headers = {"Accept": "application/openmetrics-text", "Accept-Encoding": "gzip"}
        async with client.get(base + "metrics", headers=headers) as response:
            assert response.headers["Content-Type"].startswith("text/plain")
            return await response.text()

    families = {f.name: f for f in text_string_to_metric_families(run(server, encoder, send))}
    assert families["vllm:num_requests_running"].samples[0].value == 2
    e2e = {s.labels.get("le"): s.value for s in families[encode_proxy.FRONT_DOOR_E2E].samples}
    assert (e2e["0.3"], e2e["0.5"], e2e["+Inf"]) == (0, 2, 2)  # both waited 0.4 s for the encode tier
    ttft = {s.labels.get("le"): s.value for s in families[encode_proxy.FRONT_DOOR_TTFT].samples}
    assert (ttft["0.25"], ttft["0.5"], ttft["+Inf"]) == (0, 1, 1)  # the streamed one only, on vLLM's TTFT buckets
    # the encode tier's own signals: each call's wait, and the items sent (one image per request)
    calls = {s.labels.get("le"): s.value for s in families[encode_proxy.ENCODE_CALL].samples if "le" in s.labels}
    assert (calls["0.25"], calls["0.5"], calls["+Inf"]) == (0, 2, 2)
    assert families[encode_proxy.ENCODE_ITEMS.removesuffix("_total")].samples[0].value == 2
    metrics_request = server.seen[-1]
    assert metrics_request[2]["Accept-Encoding"] == "identity"


def test_the_server_down_is_a_bad_gateway_that_says_so() -> None:
    async def send(client: ClientSession, base: str) -> tuple[int, Any]:
        async with client.post(base + "v1/chat/completions", json={"model": "qwen", "messages": []}) as response:
            return response.status, await response.json()

    status, body = run(None, None, send, encode_timeout=1.0)
    assert status == 502
    assert "inference server not reached" in body["error"]["message"]


def test_the_items_sent_are_the_last_user_turns_whole() -> None:
    """Earlier turns' items are in the server's prefix cache; a part goes whole, its uuid (the item's hash when
    given) with it."""
    video = {"type": "video_url", "video_url": {"url": "http://example.com/v.mp4"}, "uuid": "clip-7"}
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    payload = {
        "messages": [
            {"role": "user", "content": [IMAGE, {"type": "text", "text": "and"}]},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [video, {"type": "text", "text": "this?"}, audio]},
            "not a message",
        ]
    }
    assert encode_proxy.media_items(payload) == [video, audio]
    assert encode_proxy.media_items({"messages": [{"role": "user", "content": "text"}]}) == []
    assert encode_proxy.media_items({"messages": "text"}) == []


def test_the_encode_request_keeps_what_the_items_hash_depends_on() -> None:
    item = {**IMAGE, "uuid": "img-1"}
    payload = {"model": "qwen", "media_io_kwargs": {"video": {"num_frames": 8}}, "mm_processor_kwargs": {"fps": 2}}
    assert encode_proxy.encode_request(payload, [item]) == {
        "model": "qwen",
        "messages": [{"role": "user", "content": [item]}],
        "stream": False,
        "max_tokens": 1,
        "mm_processor_kwargs": {"fps": 2},
        "media_io_kwargs": {"video": {"num_frames": 8}},
    }


def test_headers_pass_on_as_a_proxy_should() -> None:
    async def answer(request: web.Request) -> web.StreamResponse:
        response = web.Response(body=b"0123456789", headers={"X-Part": "a"})
        response.headers.add("X-Part", "b")
        return response

    server, encoder = Upstream(answer), Upstream(encoder_answer)
    sent = {"Authorization": "Bearer k", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    sent |= {"Connection": "keep-alive, X-Hop", "X-Hop": "no", "X-End": "yes"}

    async def send(client: ClientSession, base: str) -> tuple[int, list[str], str | None]:
        async with client.post(base + "v1/chat/completions", json=image_request(), headers=sent) as response:
            await response.read()
            return response.status, response.headers.getall("X-Part"), response.headers.get("Content-Length")

    assert run(server, encoder, send) == (200, ["a", "b"], "10")
    encode_headers, served_headers = encoder.seen[0][2], server.seen[0][2]
    assert encode_headers["traceparent"] == sent["traceparent"]  # the encode call joins the request's trace
    assert "X-End" not in encode_headers  # the encode tier gets credentials and trace context only
    assert served_headers["X-End"] == "yes"
    assert "X-Hop" not in served_headers  # named by Connection: hop-by-hop


def test_a_request_over_the_cap_is_refused_whole() -> None:
    payload = image_request()
    payload["messages"][1]["content"].append({"type": "image_url", "image_url": {"url": "A" * (33 * 1024 * 1024)}})
    server, encoder = Upstream(), Upstream(encoder_answer)
    status, _ = run(server, encoder, post_chat(payload))
    assert status == 413
    assert server.seen == [] and encoder.seen == []


def test_a_client_that_leaves_cancels_its_request_at_the_server(tmp_path: Path) -> None:
    """Run as the pod runs it (its own process, run_app's settings): the client's going away reaches the server."""
    program = tmp_path / render.PROXY_FILE
    program.write_text(render.PROXY_SOURCE)

    async def main() -> bool:
        left = asyncio.Event()

        async def slow(request: web.Request) -> web.StreamResponse:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                left.set()
                raise
            return web.json_response({})

        upstream = await serve(Upstream(slow))
        port = free_port()
        args = ["--port", str(port), "--server", str(upstream.make_url("")), "--encoder", "http://127.0.0.1:9"]
        args += ["--shutdown-seconds", "1"]
        sidecar = await asyncio.create_subprocess_exec(sys.executable, "-I", str(program), *args)
        try:
            for _ in range(100):  # until it listens
                with contextlib.suppress(OSError):
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.close()
                    break
                await asyncio.sleep(0.1)
            async with ClientSession() as client:
                with contextlib.suppress(TimeoutError):
                    text = {"model": "qwen", "messages": [{"role": "user", "content": "hi"}]}
                    await client.post(
                        f"http://127.0.0.1:{port}/v1/chat/completions", json=text, timeout=ClientTimeout(1)
                    )
            await asyncio.wait_for(left.wait(), 10)
            return left.is_set()
        finally:
            sidecar.terminate()
            await sidecar.wait()
            await upstream.close()

    assert asyncio.run(main())


def test_a_first_token_is_a_data_line_and_only_generations_are_timed() -> None:
    """A keep-alive comment (vLLM's --sse-keep-alive-interval) is no token; a refused request (4xx) no latency."""

    async def server_answer(request: web.Request) -> web.StreamResponse:
        if request.path == "/metrics":
            return web.Response(text="")
        payload = json.loads(await request.read())
        if payload.get("model") != "qwen":
            return web.json_response({"error": {"message": "no such model"}}, status=404)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b": keep-alive\n\n")
        await asyncio.sleep(0.3)
        await response.write(b'data: {"choices": [{"delta": {"content": "a"}}]}\n\ndata: [DONE]\n\n')
        await response.write_eof()
        return response

    async def send(client: ClientSession, base: str) -> str:
        for payload in ({"model": "qwen", "stream": True, "messages": []}, {"model": "other", "messages": []}):
            async with client.post(base + "v1/chat/completions", json=payload) as response:
                await response.read()
        async with client.get(base + "metrics") as response:
            return await response.text()

    families = {f.name: f for f in text_string_to_metric_families(run(Upstream(server_answer), None, send))}
    ttft = {s.labels.get("le"): s.value for s in families[encode_proxy.FRONT_DOOR_TTFT].samples}
    assert (ttft["0.25"], ttft["0.5"]) == (0, 1)  # 0.3 s to the first data line, not the comment's at once
    e2e = {s.name: s.value for s in families[encode_proxy.FRONT_DOOR_E2E].samples if s.name.endswith("_count")}
    assert list(e2e.values()) == [1]  # the 404 is not a generation


def test_the_sidecar_runs_alone_as_the_pod_runs_it(tmp_path: Path) -> None:
    """The pod runs the file from the ConfigMap with the server image's python3: no mmfleet to import."""
    program = tmp_path / render.PROXY_FILE
    program.write_text(render.PROXY_SOURCE)
    result = subprocess.run(
        [sys.executable, "-I", str(program), "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "--encoder" in result.stdout
