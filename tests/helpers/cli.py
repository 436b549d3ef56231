"""The ``mmfleet`` command run as a user runs it, in a separate process."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from tests.helpers.operator_process import mmfleet_command
from tests.helpers.repo import ROOT


def run(*args: str, stdin: str | None = None, without: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*mmfleet_command(without), *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        timeout=60,
    )


def writes(content: bytes) -> Callable[[Path], Path]:
    """What makes a file of ``content`` in a folder, for a test's parameters."""

    def make(folder: Path) -> Path:
        path = folder / "spec.yaml"
        path.write_bytes(content)
        return path

    return make


def a_directory(folder: Path) -> Path:
    """A directory where a file is expected."""
    (folder / "specs").mkdir()
    return folder / "specs"
