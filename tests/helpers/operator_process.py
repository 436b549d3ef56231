"""The operator as users run it: a separate `mmfleet run` process against the local cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# What `pip install .` (no extra) leaves out: the lab and the dependencies only it needs.
LAB_MODULES = ("mmfleet_lab", "numpy", "numba", "matplotlib", "cryptography")
# `mmfleet ARGS` with the modules in argv[1] (comma-separated) unimportable, as if not installed.
_WITHOUT = (
    "import sys; sys.modules.update(dict.fromkeys(sys.argv[1].split(',')));"
    "from mmfleet.cli import main; sys.exit(main(sys.argv[2:]))"
)


def stop(proc: subprocess.Popen[Any], grace: float = 15.0) -> int:
    """SIGTERM, and SIGKILL if it has not exited within ``grace`` seconds; its exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    return proc.returncode


def mmfleet_command(without: Sequence[str] = ()) -> list[str]:
    """The argv that starts the ``mmfleet`` command in this interpreter, with ``without`` blocked."""
    return [sys.executable, "-c", _WITHOUT, ",".join(without)] if without else [sys.executable, "-m", "mmfleet.cli"]


class OperatorProcess:
    """Start, kill and restart `mmfleet run`; its log goes to a file for post-mortems."""

    def __init__(
        self,
        kubeconfig: Path,
        log: Path,
        env: dict[str, str] | None = None,
        without: Sequence[str] = (),
        health_address: str = "",
        metrics_address: str = "",
    ) -> None:
        self.kubeconfig = kubeconfig
        self.log = log
        self.env = env or {}  # MMFLEET_* settings for the next start
        self.without = tuple(without)  # modules the process may not import (see LAB_MODULES)
        self.health_address = health_address  # where /healthz is served; empty: not served
        self.metrics_address = metrics_address  # where /metrics is served; empty: not served
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, **self.env, "KUBECONFIG": str(self.kubeconfig)}
        run = [*mmfleet_command(self.without), "run"]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*run, "--health-address", self.health_address, "--metrics-address", self.metrics_address],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def kill(self) -> None:
        """SIGKILL: no cleanup, no finalizers, exactly like an OOM kill or a node loss."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.exists() else ""

    def decisions(self) -> str:
        """The autoscaler's decisions so far, counted by cause, from its /metrics (served when ``metrics_address``
        is): what a failing test says about why a fleet held."""
        if not self.metrics_address:
            return "(no /metrics served)"
        try:
            with urllib.request.urlopen(f"http://{self.metrics_address}/metrics", timeout=5) as answer:
                text = answer.read().decode()
        except OSError as error:
            return f"(/metrics unreadable: {error})"
        return "\n".join(line for line in text.splitlines() if line.startswith("mmfleet_autoscaler_decisions_total"))
