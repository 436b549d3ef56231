"""Start, probe and stop the component processes.

Components run in their own session (``start_new_session``) so they outlive ``mmfleet cluster up``
and a Ctrl-C in the terminal does not hit them; ``stop`` is what ends them, possibly from another
process, so it works from recorded pids and checks ``/proc/<pid>/exe`` before signalling, in case
a pid was reused.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# Popen handles of the components this Python process started, so stopping them here also reaps them
# (otherwise they linger as zombies of this process until it exits).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


class ClusterError(RuntimeError):
    """A component failed to start or to become healthy; the message ends with the tail of its log."""


@dataclass(frozen=True)
class Proc:
    """A started component, as recorded in the cluster's state file."""

    component: str
    pid: int
    exe: str
    log: str


# Ports handed out by this process, so two components started together never get the same one.
_HANDED_OUT: set[int] = set()
_LOWEST_PORT = 10000


def _ephemeral_low() -> int:
    """The first port the kernel hands to ``bind(0)`` and outgoing connections (Linux's default if unreadable)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _kernel_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1, below the kernel's ephemeral range where it has room; never one
    this process handed out before.

    A component binds its port seconds after it is chosen. A port the kernel picked for ``bind(0)`` can meanwhile
    be picked again, for the next port drawn here or for any server that listens on port 0 (the tests' fake pods
    and stand-ins, another test worker's), and the component then fails with "address already in use". Below the
    range only an explicit bind to that very port can take it.
    """
    low = _ephemeral_low()
    if low - _LOWEST_PORT >= 1000:
        rng = random.SystemRandom()
        for _ in range(200):
            port = rng.randrange(_LOWEST_PORT, low)
            if port not in _HANDED_OUT and _bindable(port):
                _HANDED_OUT.add(port)
                return port
    port = _kernel_port()
    while port in _HANDED_OUT:
        port = _kernel_port()
    _HANDED_OUT.add(port)
    return port


def start(
    component: str, exe: Path, args: Sequence[str], log: Path, cwd: Path, env: Mapping[str, str] | None = None
) -> Proc:
    """Start ``exe`` in its own session, logging to ``log``; ``env`` replaces the inherited environment when given."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        out.write(f"# {exe} {' '.join(args)}\n".encode())
        out.flush()
        popen = subprocess.Popen(
            [str(exe), *args],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    _CHILDREN[popen.pid] = popen
    return Proc(component=component, pid=popen.pid, exe=str(exe.resolve()), log=str(log))


_ERROR_LINE = re.compile(r'^(Error:|[EF]\d{4} )|"level":"(error|fatal|panic)"')


def tail(path: str | Path, lines: int = 30) -> str:
    """The log's last lines, preceded by its last few error lines (a bad flag's "Error:" is far above the usage)."""
    try:
        text = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    last = text[-lines:]
    errors = [line for line in text[:-lines] if _ERROR_LINE.search(line)][-5:]
    return "\n".join([*errors, "...", *last] if errors else last)


def alive(proc: Proc) -> bool:
    """True while the recorded process runs: the pid exists, is no zombie, and still runs ``proc.exe``."""
    child = _CHILDREN.get(proc.pid)
    if child is not None and child.poll() is not None:
        return False
    try:
        with open(f"/proc/{proc.pid}/stat", encoding="utf-8") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
        exe = os.readlink(f"/proc/{proc.pid}/exe")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    except PermissionError:
        return True
    return state not in ("Z", "X") and exe.removesuffix(" (deleted)") == proc.exe


def wait_healthy(proc: Proc, check: Callable[[], bool], timeout: float) -> None:
    """Poll ``check`` until it returns True; fail fast, naming the component, if the process exits."""
    deadline = time.monotonic() + timeout
    last_error = ""
    while True:
        if not alive(proc):
            child = _CHILDREN.get(proc.pid)
            code = f" with code {child.returncode}" if child is not None and child.returncode is not None else ""
            raise ClusterError(f"{proc.component} exited{code} while starting; end of {proc.log}:\n{tail(proc.log)}")
        try:
            if check():
                return
        except OSError as error:  # connection refused, TLS not up yet, HTTP 500 from /readyz ...
            last_error = str(error)
        if time.monotonic() > deadline:
            raise ClusterError(
                f"{proc.component} not healthy after {timeout:.0f}s ({last_error or 'check failed'}); "
                f"end of {proc.log}:\n{tail(proc.log)}"
            )
        time.sleep(0.2)


def http_get(url: str, context: ssl.SSLContext | None = None) -> str:
    """The body of a GET that answered 200; raises OSError (URLError, HTTPError) otherwise."""
    with urllib.request.urlopen(url, timeout=3, context=context) as response:
        body: bytes = response.read()
    return body.decode(errors="replace").strip()


def stop(procs: Sequence[Proc], grace: float = 10.0) -> list[Proc]:
    """SIGTERM every process, SIGKILL what is left after ``grace`` seconds; returns any that survived."""
    running = [p for p in procs if alive(p)]
    for proc in running:
        _signal(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while running and time.monotonic() < deadline:
        time.sleep(0.1)
        running = [p for p in running if alive(p)]
    for proc in running:
        _signal(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while running and time.monotonic() < deadline:
        time.sleep(0.05)
        running = [p for p in running if alive(p)]
    for proc in procs:  # reap our own children
        child = _CHILDREN.pop(proc.pid, None)
        if child is not None and child.poll() is None and proc not in running:
            child.wait(timeout=1)
    return running


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
