"""Samples a vLLM server every --every seconds while the PreprocessingBound run goes on (preproc_run.sh): the lines of
its /metrics that the operator's PreprocessingBound condition reads (waiting and running requests, the TTFT, queue and
prefill histograms' sums and counts, the API server's process_cpu_seconds_total, finished requests), the CPU seconds of
the server's processes from /proc (the API server and its children, the engine core among them), and the GPU's
utilisation from nvidia-smi. One block per sample: "### SAMPLE <epoch>" then the lines. Stdlib only; stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import urllib.request

KEEP = (
    "process_cpu_seconds_total",
    "vllm:num_requests_waiting{",
    "vllm:num_requests_running{",
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
    "vllm:request_queue_time_seconds_sum",
    "vllm:request_queue_time_seconds_count",
    "vllm:request_prefill_time_seconds_sum",
    "vllm:request_prefill_time_seconds_count",
    "vllm:request_success_total",
    "vllm:prompt_tokens_total",
)
TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(root: int) -> list[str]:
    """'proc <pid> <name> <cpu seconds>' for root and its descendants (from /proc; empty where it cannot be read)."""
    out: list[str] = []
    kids: dict[int, list[tuple[int, str, float]]] = {}
    try:
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as handle:
                    stat = handle.read()
            except OSError:
                continue
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2 :].split()
            ppid, cpu = int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK
            kids.setdefault(ppid, []).append((int(d), name, cpu))
            if int(d) == root:
                out.append(f"proc {d} {name} {cpu:.2f} root")
    except OSError:
        return out
    todo = [root]
    while todo:
        p = todo.pop()
        for pid, name, cpu in kids.get(p, []):
            out.append(f"proc {pid} {name} {cpu:.2f} child-of-{p}")
            todo.append(pid)
    return out


def gpu_util() -> str:
    try:
        r = subprocess.run(
            ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=3,
            check=False,
        )
        return "gpu " + r.stdout.strip().replace(",", "")
    except Exception as e:
        return f"gpu unknown {type(e).__name__}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="http://127.0.0.1:8000")
    ap.add_argument("--every", type=float, default=2.0)
    ap.add_argument("--pid", type=int, default=0, help="the server's process (the API server)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    with open(a.out, "a") as f:
        nxt = time.time()
        while not stop:
            t = time.time()
            lines = [f"### SAMPLE {t:.3f}"]
            try:
                body = urllib.request.urlopen(a.base + "/metrics", timeout=5).read().decode("utf-8", "replace")
                lines += [ln for ln in body.splitlines() if ln.startswith(KEEP)]
            except Exception as e:
                lines.append(f"# scrape failed: {type(e).__name__}: {e}")
            lines.append(f"# scraped in {time.time() - t:.3f}s")
            if a.pid:
                lines += proc_cpu(a.pid)
            lines.append(gpu_util())
            f.write("\n".join(lines) + "\n")
            f.flush()
            nxt += a.every
            time.sleep(max(0.0, nxt - time.time()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
