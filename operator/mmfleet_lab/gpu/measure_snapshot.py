"""Snapshot restore against cold start on a GPU host: vLLM 0.33's ``vllm snapshot create|restore`` (issue 26).

Run as root on the GPU machine, with vLLM 0.33.0 (as for ``measure_wake``), CRIU 4.2 and its CUDA plugin
(``CRIU_CUDA_PLUGIN_DIR``), NVIDIA's ``cuda-checkpoint`` and ``nvidia-smi`` on the PATH, ``kernel.io_uring_disabled=2``
(vLLM refuses to dump a tree that holds io_uring state) and the lab patch ``vllm_snapshot_lab.patch`` applied to the
vLLM tree (it says why). It needs the standard library and ``measure_wake`` only::

    MMFLEET_LAB_LOCAL_MODEL=1 HF_HUB_OFFLINE=1 python3 -m mmfleet_lab.gpu.measure_snapshot --out snapshot.csv \\
        --snapshot-dir /root/snapshots/qwen --restores 3 --cold-start -- \\
        model --served-model-name qwen --load-format dummy --limit-mm-per-prompt '{"image":4,"video":0}'

The arguments after ``--`` are ``vllm serve``'s (without ``--port``). It writes one CSV row per phase taken
(``phase``, ``cycle``, ``seconds``), as each is taken:

- ``create`` (cycle 0): ``vllm snapshot create`` whole: a cold start of the server in a child process, vLLM's canary,
  its rehearsal (sleep level 2, wake, weight reload, the canary again), sleep level 2, the CRIU dump of the tree;
- per restore cycle: ``restore`` (``vllm snapshot restore`` whole: CRIU restores the tree with the CUDA plugin, the
  server wakes, reloads its weights, listens and answers vLLM's canary request; the command returns while it serves),
  ``first_request`` (the TTFT of one streamed chat completion after it) and ``stop`` (the tree stopped until
  ``nvidia-smi`` lists no process on the GPU);
- with ``--cold-start``, last: ``cold_start`` and ``first_request`` (cycle 0) of a plain ``vllm serve`` with the same
  arguments and ``--enable-sleep-mode`` (as the snapshot's server runs), stopped the same way.

This process makes itself a child subreaper, so the restored trees (CRIU's ``--restore-detached`` leaves them without
a parent) are its to stop and reap. A step that fails ends the run with exit status 1, the rows taken kept and the
server it left stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from mmfleet_lab.gpu.measure_wake import HEALTH_TIMEOUT, ttft, wait_healthy

VLLM = (sys.executable, "-m", "vllm.entrypoints.cli.main")
PR_SET_CHILD_SUBREAPER = 36
STOP_TIMEOUT = 120.0

Row = Callable[[str, int, float], None]


class StepError(Exception):
    """A command of the run failed; its message says which and where its output is."""


def session_pids(session: int) -> list[int]:
    """The processes of one session (vLLM's snapshot tree is one session, its root the leader)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 3 and int(fields[3]) == session:
            found.append(int(entry.name))
    return found


def reap() -> None:
    """Collect every exited child (orphans of a stopped tree come here: this process is their subreaper)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def gpu_pids() -> list[str]:
    listing = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    )
    if listing.returncode != 0:
        raise StepError(f"nvidia-smi exited {listing.returncode}: {(listing.stdout + listing.stderr).strip()[:300]}")
    return [line.strip() for line in listing.stdout.splitlines() if line.strip()]


def stop_session(session: int) -> float:
    """Seconds from SIGTERM to the session's processes gone and the GPU free; SIGKILL after 30 s."""
    started = time.perf_counter()
    for sig, grace in ((signal.SIGTERM, 30.0), (signal.SIGKILL, STOP_TIMEOUT)):
        for pid in session_pids(session):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.perf_counter() + grace
        while time.perf_counter() < deadline:
            reap()
            if not session_pids(session) and not gpu_pids():
                return time.perf_counter() - started
            time.sleep(0.1)
    raise StepError(f"session {session} still held {session_pids(session)} or the GPU {gpu_pids()}")


def timed(command: Sequence[str], log: Path) -> float:
    """Seconds ``command`` ran; raises StepError (naming ``log``, which holds its output) on a non-zero exit."""
    started = time.perf_counter()
    with log.open("ab") as out:
        out.write(f"$ {' '.join(command)}\n".encode())
        out.flush()
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise StepError(f"{' '.join(command[3:5])} exited {done.returncode} after {seconds:.1f} s; see {log}")
    return seconds


def measure(args: argparse.Namespace, serve: list[str], row: Row) -> None:
    """Each step in turn; a server left running by a step that failed is stopped before the error goes on."""
    base = f"http://127.0.0.1:{args.port}"
    snapshot = str(args.snapshot_dir)
    row("create", 0, timed([*VLLM, "snapshot", "create", *serve, "--snapshot-dir", snapshot], args.log))
    for cycle in range(1, args.restores + 1):
        row("restore", cycle, timed([*VLLM, "snapshot", "restore", snapshot, "--port", str(args.port)], args.log))
        root = int((args.snapshot_dir / "restored.pid").read_text())
        try:
            row("first_request", cycle, ttft(base, args.model))
        finally:
            row("stop", cycle, stop_session(root))
    if args.cold_start:
        with args.log.open("ab") as out:
            server = subprocess.Popen(
                [*VLLM, "serve", *serve, "--enable-sleep-mode", "--port", str(args.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            row("cold_start", 0, wait_healthy(base, server, HEALTH_TIMEOUT))
            row("first_request", 0, ttft(base, args.model))
        finally:
            stop_session(server.pid)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, required=True, help="the CSV to write")
    parser.add_argument("--log", type=Path, default=Path("snapshot_commands.log"), help="the commands' output")
    parser.add_argument("--snapshot-dir", type=Path, required=True, help="where vllm snapshot create writes")
    parser.add_argument("--restores", type=int, default=3, help="restore cycles")
    parser.add_argument("--cold-start", action="store_true", help="then time a plain vllm serve")
    parser.add_argument("--port", type=int, default=8000, help="the restored server's port")
    parser.add_argument("--model", default="qwen", help="the served model name (as in the arguments)")
    parser.add_argument("serve", nargs=argparse.REMAINDER, help="-- then vllm serve's arguments")
    args = parser.parse_args(argv)
    serve = args.serve[1:] if args.serve[:1] == ["--"] else args.serve
    if not serve:
        parser.error("vllm serve's arguments are missing (after --)")
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        parser.error("this process cannot become a child subreaper (Linux only)")
    with args.out.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["phase", "cycle", "seconds"])

        def row(phase: str, cycle: int, seconds: float) -> None:
            writer.writerow((phase, cycle, f"{seconds:.4f}"))
            out.flush()  # a run cut short keeps what it measured
            print(f"{phase:14s} cycle {cycle}: {seconds:8.3f} s", flush=True)

        try:
            measure(args, serve, row)
        except (StepError, OSError, ValueError, SystemExit) as error:
            print(f"stopped: {error}; the rows taken are kept", file=sys.stderr, flush=True)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
