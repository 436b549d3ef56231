"""The ``mmfleet`` command run as a user runs it, in a separate process."""

from __future__ import annotations

import subprocess

from tests.helpers.operator_process import mmfleet_command
from tests.helpers.repo import ROOT


def run(*args: str, stdin: str | None = None, without: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*mmfleet_command(without), *args], input=stdin, capture_output=True, text=True, check=False, cwd=ROOT
    )
