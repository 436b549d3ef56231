"""The ``mmfleet`` command run as a user runs it, in a separate process."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

from tests.helpers.operator_process import mmfleet_command
from tests.helpers.repo import ROOT


def run(
    *args: str, stdin: str | None = None, without: tuple[str, ...] = (), env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``mmfleet *args`` with this process's environment, and ``env`` over it."""
    return subprocess.run(
        [*mmfleet_command(without), *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        timeout=60,
        env=None if env is None else {**os.environ, **env},
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
