"""The GPU snapshot-restore measurement (``mmfleet_lab.gpu.measure_snapshot``), probed on the CPU side before a GPU
minute is spent: a stand-in ``vllm`` package whose ``snapshot restore`` leaves a server running detached, as CRIU's
``--restore-detached`` does, and an ``nvidia-smi`` that lists no process. The script runs in its own process, since it
makes itself a child subreaper."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
from pathlib import Path

from mmfleet_lab.cluster.process import free_port

REPO = Path(__file__).resolve().parents[3]

SERVER = r"""
import http.server, sys
calls = open(sys.argv[2], "a")
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("content-length", "0"); self.end_headers()
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        calls.write(self.path + "\n"); calls.flush()
        body = b'data: {"choices": []}\n\ndata: [DONE]\n\n'
        self.send_response(200); self.send_header("content-length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""

# `python -m vllm.entrypoints.cli.main snapshot create|restore ...` and `serve ...`, as measure_snapshot calls them;
# each server's pid is recorded, and the stand-in nvidia-smi lists those still there (a zombie too) as on the GPU.
CLI = r"""
import os, subprocess, sys, time, urllib.request
from pathlib import Path
here, args = Path(__file__).parent, sys.argv[1:]
calls = os.environ["STAND_IN_CALLS"]
with open(calls, "a") as out:
    out.write(" ".join(args[:2]) + "\n")
def serve(port, **kw):
    server = subprocess.Popen([sys.executable, str(here / "server.py"), port, calls], **kw)
    with open(os.environ["STAND_IN_PIDS"], "a") as out:
        out.write(f"{server.pid}\n")
    return server
if args[:2] == ["snapshot", "create"]:
    Path(args[args.index("--snapshot-dir") + 1]).mkdir(parents=True)
elif args[:2] == ["snapshot", "restore"]:
    if os.environ.get("STAND_IN_REFUSE_RESTORE"):
        sys.exit("restore refused")
    port = args[args.index("--port") + 1]
    server = serve(port, start_new_session=True)
    Path(args[2], "restored.pid").write_text(str(server.pid))
    while True:
        if server.poll() is not None:
            sys.exit("the restored server died")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1); break
        except OSError:
            time.sleep(0.05)
elif args[:1] == ["serve"]:
    serve(args[args.index("--port") + 1]).wait()
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


Run = tuple[subprocess.CompletedProcess[str], Path]


def run(tmp_path: Path, *extra: str, env: dict[str, str] | None = None) -> Run:
    cli = tmp_path / "fake" / "vllm" / "entrypoints" / "cli"
    cli.mkdir(parents=True)
    for package in (cli.parents[1], cli.parent, cli):
        (package / "__init__.py").write_text("")
    (cli / "main.py").write_text(CLI)
    (cli / "server.py").write_text(SERVER)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(
        '#!/bin/sh\nfor p in $(cat "$STAND_IN_PIDS"); do kill -0 "$p" 2>/dev/null && echo "$p"; done\nexit 0\n'
    )
    (bin_dir / "nvidia-smi").chmod(0o755)
    out, pids = tmp_path / "snapshot.csv", tmp_path / "pids.txt"
    pids.write_text("")
    command = [
        sys.executable, "-m", "mmfleet_lab.gpu.measure_snapshot", "--out", str(out), "--log", str(tmp_path / "log"),
        "--snapshot-dir", str(tmp_path / "snap" / "qwen"), "--port", str(free_port()), *extra,
        "--", "/root/model", "--served-model-name", "qwen",
    ]  # fmt: skip
    environment = {
        **os.environ,
        "PYTHONPATH": f"{tmp_path / 'fake'}{os.pathsep}{REPO / 'operator'}",
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "STAND_IN_CALLS": str(tmp_path / "calls.txt"),
        "STAND_IN_PIDS": str(pids),
        **(env or {}),
    }
    try:
        done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=120, check=False)
    finally:
        left = [pid for pid in map(int, pids.read_text().split()) if alive(pid)]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert not left, f"stand-in servers left running: {left}"
    return done, out


def test_it_creates_then_restores_and_stops_each_cycle_then_times_a_cold_start(tmp_path: Path) -> None:
    done, out = run(tmp_path, "--restores", "2", "--cold-start")
    assert done.returncode == 0, done.stderr
    rows = [(r["phase"], r["cycle"]) for r in csv.DictReader(out.open())]
    assert rows == [
        ("create", "0"),
        ("restore", "1"), ("first_request", "1"), ("stop", "1"),
        ("restore", "2"), ("first_request", "2"), ("stop", "2"),
        ("cold_start", "0"), ("first_request", "0"),
    ]  # fmt: skip
    assert (tmp_path / "calls.txt").read_text().split("\n")[:4] == [
        "snapshot create", "snapshot restore", "/v1/chat/completions", "snapshot restore",
    ]  # fmt: skip
    assert len((tmp_path / "pids.txt").read_text().split()) == 3, "two restored servers and the cold start's"


def test_a_failed_restore_ends_the_run_as_a_failure_naming_the_log_and_keeps_the_rows_taken(tmp_path: Path) -> None:
    done, out = run(tmp_path, "--restores", "2", env={"STAND_IN_REFUSE_RESTORE": "1"})
    assert done.returncode == 1
    assert "snapshot restore exited 1" in done.stderr and str(tmp_path / "log") in done.stderr
    assert [r["phase"] for r in csv.DictReader(out.open())] == ["create"]
    assert "restore refused" in (tmp_path / "log").read_text()
