"""Wake time against cold start on a GPU host: vLLM 0.33's sleep levels 1 and 2 (issue 26, warm standby).

Run on the GPU machine, where vLLM 0.33.0 is installed (the released wheel and its resolved dependencies,
carried there when the host has no package index) with a Qwen2.5-VL-7B config and ``--load-format dummy``. It
needs the standard library only, so it is copied there alone::

    VLLM_SERVER_DEV_MODE=1 HF_HUB_OFFLINE=1 python3 measure_wake.py --out wake.csv --cycles 5 -- \\
        python3 -m vllm.entrypoints.cli.main serve model --served-model-name qwen --load-format dummy \\
        --enable-sleep-mode --port 8000

It starts the server once and times, one CSV row each (``phase``, ``level``, ``cycle``, ``seconds``):

- ``cold_start``: the process started to ``/health`` answering 200; ``first_request``: the TTFT of the first
  request after it (torch.compile and CUDA graph warm-up included when they are lazy);
- per level and cycle: ``sleep`` (``POST /sleep?level=L&mode=wait``), ``wake`` (``POST /wake_up``) and
  ``first_request`` after the wake; at level 2 also ``reload`` (``POST /collective_rpc`` with ``reload_weights``),
  since vLLM's wake after level 2 restores buffers, not weights (``v1/worker/gpu_worker.py`` ``wake_up``): a level-2
  wake serves only after a reload.

Every request is a streamed chat completion of one short text with ``max_tokens`` 8; its TTFT is the first chunk.
Each row is written as it is taken. A call the server refuses (vLLM 0.33.0 refuses ``reload_weights`` with dummy
weights) ends the run with exit status 1, the rows taken kept.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

HEALTH_TIMEOUT = 900.0  # vLLM 0.33 started in 100-177 s on an H200 with dummy weights (tests/data/README.md)
CALL_TIMEOUT = 600.0


def _post(url: str, body: dict[str, object] | None = None, timeout: float = CALL_TIMEOUT) -> float:
    """Seconds the POST took to be answered in full; raises on an HTTP error."""
    data = json.dumps(body).encode() if body is not None else b""
    request = urllib.request.Request(url, data=data, method="POST", headers={"content-type": "application/json"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        answer.read()
    return time.perf_counter() - started


def ttft(base: str, model: str) -> float:
    """Seconds to the first streamed chunk of one chat completion."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Say something about the sea."}],
        "max_tokens": 8,
        "stream": True,
    }
    request = urllib.request.Request(
        f"{base}/v1/chat/completions", json.dumps(body).encode(), {"content-type": "application/json"}
    )
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=CALL_TIMEOUT) as answer:
        answer.readline()
        first = time.perf_counter() - started
        answer.read()
    return first


def wait_healthy(base: str, server: subprocess.Popen[bytes], timeout: float) -> float:
    started = time.perf_counter()
    while time.perf_counter() - started < timeout:
        if server.poll() is not None:
            raise SystemExit(f"the server ended with exit status {server.returncode} before /health answered")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=5) as answer:
                if answer.status == 200:
                    return time.perf_counter() - started
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise SystemExit(f"/health did not answer 200 within {timeout:.0f} s")


Row = Callable[[str, int, int, float], None]


def measure(base: str, model: str, cycles: int, server: subprocess.Popen[bytes], row: Row) -> bool:
    """Each phase's time, handed to ``row`` as soon as it is taken; False when the server refused a call, which ends
    the run (its answer printed): the server may be left asleep, and what follows would be timed from there."""
    row("cold_start", 0, 0, wait_healthy(base, server, HEALTH_TIMEOUT))
    row("first_request", 0, 0, ttft(base, model))
    try:
        for level in (1, 2):
            for cycle in range(1, cycles + 1):
                row("sleep", level, cycle, _post(f"{base}/sleep?level={level}&mode=wait"))
                row("wake", level, cycle, _post(f"{base}/wake_up"))
                if level == 2:
                    row("reload", level, cycle, _post(f"{base}/collective_rpc", {"method": "reload_weights"}))
                row("first_request", level, cycle, ttft(base, model))
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace")[:500]
        print(f"{error.url} answered {error.code}: {detail}; the rows taken are kept", file=sys.stderr, flush=True)
        return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, required=True, help="the CSV to write")
    parser.add_argument("--cycles", type=int, default=5, help="sleep/wake cycles per level")
    parser.add_argument("--port", type=int, default=8000, help="the server's port (as in its command)")
    parser.add_argument("--model", default="qwen", help="the served model name (as in its command)")
    parser.add_argument("server", nargs=argparse.REMAINDER, help="-- then the server's command")
    args = parser.parse_args(argv)
    command = args.server[1:] if args.server[:1] == ["--"] else args.server
    if not command:
        parser.error("the server's command is missing (after --)")
    base = f"http://127.0.0.1:{args.port}"
    with args.out.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["phase", "level", "cycle", "seconds"])

        def row(phase: str, level: int, cycle: int, seconds: float) -> None:
            writer.writerow((phase, level, cycle, f"{seconds:.4f}"))
            out.flush()  # a run cut short keeps what it measured
            print(f"{phase:14s} level {level} cycle {cycle}: {seconds:8.3f} s", flush=True)

        server = subprocess.Popen(command)
        try:
            complete = measure(base, args.model, args.cycles, server, row)
        finally:
            server.terminate()
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(main())
