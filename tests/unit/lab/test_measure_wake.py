"""The GPU wake-time measurement (``mmfleet_lab.gpu.measure_wake``), probed on the CPU side before a GPU minute is
spent: against a stand-in on 127.0.0.1 that answers vLLM's sleep endpoints, it starts the server, times each phase in
order and writes the rows a GPU run would."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

from mmfleet_lab.cluster.process import free_port
from mmfleet_lab.gpu import measure_wake

# A stand-in for `vllm serve`: /health after 0.3 s, /sleep, /wake_up, /collective_rpc and a streamed completion; it
# records the calls, so the test sees the order the script made them in.
STAND_IN = r"""
import http.server, json, sys, time
started, calls = time.time(), open(sys.argv[2], "w")
class H(http.server.BaseHTTPRequestHandler):
    def _ok(self, body=b"{}"):
        self.send_response(200); self.send_header("content-length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if time.time() - started < 0.3: self.send_response(503); self.end_headers(); return
        self._ok()
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        calls.write(self.path + "\n"); calls.flush()
        if self.path == "/collective_rpc" and sys.argv[3:] == ["refuse-rpc"]:
            self.send_response(500); self.send_header("content-length", "0"); self.end_headers(); return
        if self.path.startswith("/v1/"):
            self._ok(b'data: {"choices": []}\n\ndata: [DONE]\n\n')
        else:
            self._ok(json.dumps({"status": "awake"}).encode())
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_it_times_the_cold_start_then_each_level_in_order_and_writes_one_row_each(tmp_path: Path) -> None:
    port, out, calls = free_port(), tmp_path / "wake.csv", tmp_path / "calls.txt"
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    argv = ["--out", str(out), "--cycles", "1", "--port", str(port), "--", sys.executable, str(script), str(port)]
    assert measure_wake.main([*argv, str(calls)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [(r["phase"], r["level"]) for r in rows] == [
        ("cold_start", "0"), ("first_request", "0"),
        ("sleep", "1"), ("wake", "1"), ("first_request", "1"),
        ("sleep", "2"), ("wake", "2"), ("reload", "2"), ("first_request", "2"),
    ]  # fmt: skip
    assert float(rows[0]["seconds"]) >= 0.3, "the cold start waits for /health"
    assert calls.read_text().split() == [
        "/v1/chat/completions",
        "/sleep?level=1&mode=wait", "/wake_up", "/v1/chat/completions",
        "/sleep?level=2&mode=wait", "/wake_up", "/collective_rpc", "/v1/chat/completions",
    ]  # fmt: skip


def test_a_call_the_server_refuses_ends_the_run_as_a_failure_and_keeps_every_row_taken(tmp_path: Path) -> None:
    """vLLM 0.33 refuses reload_weights with dummy weights: the level-1 rows, taken before, must survive it."""
    port, out, calls = free_port(), tmp_path / "wake.csv", tmp_path / "calls.txt"
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    argv = ["--out", str(out), "--cycles", "2", "--port", str(port), "--", sys.executable, str(script), str(port)]
    assert measure_wake.main([*argv, str(calls), "refuse-rpc"]) == 1
    rows = [(r["phase"], r["level"], r["cycle"]) for r in csv.DictReader(out.open())]
    assert len(rows) == 2 + 2 * 3 + 2, rows
    assert rows[-3:] == [("first_request", "1", "2"), ("sleep", "2", "1"), ("wake", "2", "1")]
    assert calls.read_text().split()[-1] == "/collective_rpc", "nothing is asked after the refusal at level 2"
