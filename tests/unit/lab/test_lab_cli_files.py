"""The lab's commands given broken files (bench's traces and tuned files, the twin's traces folder): one line naming
the file, exit 2, no traceback."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.cli import a_directory, run, writes


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return run("bench", "autoscale", "--quick", "--no-oracle", *args)


TRACES: list[tuple[str, Callable[[Path], Path], str]] = [
    ("non-UTF-8", writes(b"ts,prompt\n1,caf\xe9\n"), ": not UTF-8 text (byte 0xe9)"),
    ("an empty file", writes(b""), ": no rows"),
    ("a directory", a_directory, ": Is a directory"),
    ("a missing file", lambda folder: folder / "nope.csv", ": No such file or directory"),
    ("a missing column", writes(b"time,prompt\n1,2\n"), ": no column 'ts'"),
]


@pytest.mark.parametrize(("make", "says"), [case[1:] for case in TRACES], ids=[c[0] for c in TRACES])
def test_bench_refuses_a_broken_trace_before_it_starts(make: Callable[[Path], Path], says: str, tmp_path: Path) -> None:
    path = make(tmp_path)
    result = _bench("--trace", str(path), "--time-column", "ts", "--docs", str(tmp_path / "d.md"))
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith(f"--trace {path}") and says in result.stderr, result.stderr


TUNED: list[tuple[str, Callable[[Path], Path], str]] = [
    ("non-UTF-8", writes(b'{"profile": "\xff"}'), ": not UTF-8 text (byte 0xff)"),
    ("an empty file", writes(b""), ": Expecting value"),
    ("a directory", a_directory, ": Is a directory"),
    ("a missing file", lambda folder: folder / "nope.json", ": No such file or directory"),
    ("a missing key", writes(b'{"picked": {}}'), ": no key 'profile'"),
]


@pytest.mark.parametrize(("make", "says"), [case[1:] for case in TUNED], ids=[c[0] for c in TUNED])
def test_bench_refuses_a_broken_tuned_file(make: Callable[[Path], Path], says: str, tmp_path: Path) -> None:
    path = make(tmp_path)
    result = _bench("--tuned", str(path), "--docs", str(tmp_path / "d.md"))
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith(f"--tuned {path}") and says in result.stderr, result.stderr


def _traces(content: bytes | None) -> Callable[[Path], Path]:
    """A --traces folder whose token statistics file (the first one `twin profile` reads) holds ``content``."""

    def make(folder: Path) -> Path:
        if content is not None:
            (folder / "servegen_client_token_stats_6h.csv").write_bytes(content)
        return folder

    return make


TRACE_FOLDERS: list[tuple[str, Callable[[Path], Path], str]] = [
    ("a missing folder", lambda folder: folder / "nope", "is missing. Get it from"),
    ("a folder without the file", _traces(None), "is missing. Get it from"),
    ("non-UTF-8", _traces(b"model,window\n\xff\xfe,1\n"), ": not UTF-8 text (byte 0xff)"),
    ("an empty file", _traces(b""), "no multimodal token rows"),
]


@pytest.mark.parametrize(("make", "says"), [case[1:] for case in TRACE_FOLDERS], ids=[c[0] for c in TRACE_FOLDERS])
def test_twin_profile_refuses_a_broken_traces_folder(make: Callable[[Path], Path], says: str, tmp_path: Path) -> None:
    folder = make(tmp_path)
    result = run("twin", "profile", "--traces", str(folder))
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith(f"mmfleet twin profile: --traces {folder}") and says in result.stderr, result.stderr
