"""Every file the ``mmfleet`` command reads, broken or hostile: a one-line error naming the file (and the field, where
there is one), exit code 2, never a traceback, never a hang."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.operator_process import mmfleet_command
from tests.helpers.repo import ROOT

HEADER = "apiVersion: mmfleet.io/v1alpha1\nkind: MultimodalInference\nmetadata: {name: broken}\n"
# 9 aliases of 9 aliases, nine levels: 9**9 (387 million) strings once expanded, from a file of about 400 bytes.
LAUGHS = 'l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"l{i}: &l{i} [{','.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 9)
)


def _write(content: bytes) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        path = folder / "spec.yaml"
        path.write_bytes(content)
        return path

    return make


def _directory(folder: Path) -> Path:
    (folder / "specs").mkdir()
    return folder / "specs"


# (what, how to make the file, what the one error line says after the file's name)
BROKEN_SPECS: list[tuple[str, Callable[[Path], Path], str]] = [
    (
        "non-UTF-8",
        _write(HEADER.encode() + b"spec:\n  model: {name: caf\xe9}\n"),
        ": not UTF-8 text: byte 0xe9 on line 5",
    ),
    ("deep nesting", _write(HEADER.encode() + b"spec: " + b"[" * 20_000 + b"]" * 20_000 + b"\n"), ": nested more than"),
    ("nesting under the limit of the parser", _write(b"spec: " + b"[" * 100 + b"]" * 100), ": spec[0][0][0]"),
    ("alias bomb at the top", _write(LAUGHS.encode()), "values once YAML aliases are expanded"),
    (
        "alias bomb in a field",
        _write((LAUGHS + HEADER + "spec:\n  model: {name: m}\n  extraArgs: *l8\n").encode()),
        ": spec.extraArgs[",
    ),
    ("an alias cycle", _write(HEADER.encode() + b"spec: &s {model: *s}\n"), ": spec.model.model.model"),
    ("a huge integer", _write(HEADER.encode() + b"spec:\n  replicas: " + b"9" * 5000 + b"\n"), ": spec.replicas: an "),
    (
        "a date that is none",
        _write(HEADER.encode() + b"spec:\n  model: {name: 2026-13-45}\n"),
        "month must be in 1..12",
    ),
    ("an empty file", _write(b""), ": empty; expected one or more MultimodalInference"),
    ("only comments", _write(b"# nothing\n---\n"), ": empty; expected one or more MultimodalInference"),
    ("a directory", _directory, ": Is a directory"),
    ("a missing file", lambda folder: folder / "nope.yaml", ": No such file or directory"),
    ("not YAML", _write(b"spec: [unclosed\n"), ": not valid YAML: line 2, column 1: expected ',' or ']'"),
]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*mmfleet_command(), *args], capture_output=True, text=True, check=False, cwd=ROOT, timeout=60
    )


@pytest.mark.parametrize(("make", "says"), [case[1:] for case in BROKEN_SPECS], ids=[c[0] for c in BROKEN_SPECS])
def test_render_refuses_a_broken_file_with_one_line(make: Callable[[Path], Path], says: str, tmp_path: Path) -> None:
    path = make(tmp_path)
    result = run("render", "-f", str(path))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(str(path)) and says in lines[0], lines[0]


def test_render_reads_a_spec_with_anchors_and_aliases(tmp_path: Path) -> None:
    """Aliases are YAML, and a spec may use a few: only their expansion past any real spec is refused."""
    path = _write((HEADER + "spec:\n  model: {name: m}\n  gpu: {count: &n 2}\n  parallelism: {tensor: *n}\n").encode())(
        tmp_path
    )
    result = run("render", "-f", str(path), "--cloud", "generic")
    assert result.returncode == 0, result.stderr
    assert "- --tensor-parallel-size\n        - '2'" in result.stdout


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return run("bench", "autoscale", "--quick", "--no-oracle", *args)


TRACES: list[tuple[str, Callable[[Path], Path], str]] = [
    ("non-UTF-8", _write(b"ts,prompt\n1,caf\xe9\n"), ": not UTF-8 text (byte 0xe9)"),
    ("an empty file", _write(b""), ": no rows"),
    ("a directory", _directory, ": Is a directory"),
    ("a missing file", lambda folder: folder / "nope.csv", ": No such file or directory"),
    ("a missing column", _write(b"time,prompt\n1,2\n"), ": no column 'ts'"),
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
    ("non-UTF-8", _write(b'{"profile": "\xff"}'), ": not UTF-8 text (byte 0xff)"),
    ("an empty file", _write(b""), ": Expecting value"),
    ("a directory", _directory, ": Is a directory"),
    ("a missing file", lambda folder: folder / "nope.json", ": No such file or directory"),
    ("a missing key", _write(b'{"picked": {}}'), ": no key 'profile'"),
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
