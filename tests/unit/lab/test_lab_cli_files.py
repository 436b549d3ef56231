"""The lab's commands given broken files (bench's traces and tuned files, the twin's traces folder): one line naming
the file, exit 2, no traceback."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mmfleet_lab.twin import traffic
from tests.helpers.cli import a_directory, run, writes

TUNED_FILE = Path(__file__).resolve().parents[3] / "operator" / "mmfleet_lab" / "bench" / "tuned.json"


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return run("bench", "autoscale", "--quick", "--no-oracle", *args)


TRACES: list[tuple[str, Callable[[Path], Path], str]] = [
    ("non-UTF-8", writes(b"ts,prompt\n1,caf\xe9\n"), ": not UTF-8 text (byte 0xe9)"),
    ("an empty file", writes(b""), ": no rows"),
    ("a directory", a_directory, ": Is a directory"),
    ("a missing file", lambda folder: folder / "nope.csv", ": No such file or directory"),
    ("a missing column", writes(b"time,prompt\n1,2\n"), ": no column 'ts'"),
    ("a time that is none", writes(b"ts,prompt\n0,1\nfoo,2\n"), ": row 3: ts 'foo': expected a number of seconds or"),
    (
        "numbers and date-times mixed",
        writes(b"ts,prompt\n1.5,5\n2024-01-01 00:00:00,7\n"),
        ": row 3: ts '2024-01-01 00:00:00': a date-time, where row 2 holds a number; expected one kind of time",
    ),
    ("a time that is NaN", writes(b"ts,prompt\nnan,1\n"), ": row 2: ts 'nan': expected a number of seconds or a date"),
    ("a field over the CSV reader's limit", writes(b"ts,prompt\n1," + b"x" * 140_000 + b"\n"), ": field larger than"),
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
    ("no object", writes(b"[1, 2]"), ": expected a JSON object as `mmfleet bench tune` writes it"),
    ("a missing key", writes(b'{"picked": {}}'), ": command: null; expected a JSON string"),
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
    ("an empty file", _traces(b""), "servegen_client_token_stats_6h.csv: no rows"),
    (
        "a column missing",
        _traces(b"x,y\n1,2\n"),
        "servegen_client_token_stats_6h.csv: no column 'model' (have ['x', 'y'])",
    ),
]


@pytest.mark.parametrize(("make", "says"), [case[1:] for case in TRACE_FOLDERS], ids=[c[0] for c in TRACE_FOLDERS])
def test_twin_profile_refuses_a_broken_traces_folder(make: Callable[[Path], Path], says: str, tmp_path: Path) -> None:
    folder = make(tmp_path)
    result = run("twin", "profile", "--traces", str(folder))
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith(f"mmfleet twin profile: --traces {folder}") and says in result.stderr, result.stderr


def _tuned_with(change: Callable[[dict[str, Any]], object]) -> Callable[[Path], Path]:
    """The shipped tuned file with ``change`` made to its record."""

    def make(folder: Path) -> Path:
        record = json.loads(TUNED_FILE.read_text())
        change(record)
        path = folder / "tuned.json"
        path.write_text(json.dumps(record))
        return path

    return make


BAD_SETTINGS: list[tuple[str, Callable[[Path], Path], str]] = [
    (
        "a setting that is a number",
        _tuned_with(lambda r: r["picked"].update(hpa=5)),
        ": picked.hpa: 5; expected one of",
    ),
    ("no command", _tuned_with(lambda r: r.pop("command")), ": command: null; expected a JSON string"),
    ("no sweeps", _tuned_with(lambda r: r.pop("sweeps")), ": sweeps: null; expected a JSON object"),
    (
        "a pick its sweep lacks",
        _tuned_with(lambda r: r["sweeps"].update(kubeai=[])),
        ": sweeps.kubeai: no trial of the picked setting",
    ),
    (
        "a number given as text",
        _tuned_with(lambda r: r["picked"]["kubeai"].update(target_per_inflight="abc")),
        ': picked.kubeai: {"target_per_inflight": "abc", ',
    ),
    (
        "a value no sweep tries",
        _tuned_with(lambda r: r["picked"]["kubeai"].update(target_per_inflight=0.6)),
        ': picked.kubeai: {"target_per_inflight": 0.6, ',
    ),
    ("an unknown baseline", _tuned_with(lambda r: r["picked"].update(nope={})), ": picked.nope: not a baseline"),
    ("a profile value as text", _tuned_with(lambda r: r["profile"].update(capacity="x")), ': profile.capacity: "x"'),
]


@pytest.mark.parametrize(("make", "says"), [case[1:] for case in BAD_SETTINGS], ids=[c[0] for c in BAD_SETTINGS])
def test_bench_refuses_a_tuned_file_whose_settings_it_could_not_run(
    make: Callable[[Path], Path], says: str, tmp_path: Path
) -> None:
    path = make(tmp_path)
    result = _bench("--tuned", str(path), "--docs", str(tmp_path / "d.md"))
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"--tuned {path}{says}"), result.stderr


def test_bench_refuses_a_count_series_with_a_count_that_is_no_number_of_requests(tmp_path: Path) -> None:
    path = tmp_path / "counts.csv"
    path.write_text("t,n\n0,3\n60,1e400\n")
    result = _bench("--trace", str(path), "--time-column", "t", "--count-column", "n", "--docs", str(tmp_path / "d.md"))
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr == f"--trace {path}: row 3: n '1e400': expected a number at least 0\n"


def _a_file(folder: Path) -> Path:
    (folder / "a-file").write_text("")
    return folder / "a-file"


OUTPUTS: list[tuple[str, list[str], Callable[[Path], Path], str]] = [
    ("docs under a file", ["--docs"], lambda f: _a_file(f) / "b.md", "a-file is not a folder; expected a file it can"),
    ("docs that is a folder", ["--docs"], lambda f: f, ": a folder; expected a file it can write"),
    ("docs not UTF-8", ["--docs"], writes(b"\xff\xfe"), ": not UTF-8 text (byte 0xff)"),
    ("plots that is a file", ["--plots"], _a_file, ": not a folder; expected a folder for the plots"),
]


@pytest.mark.parametrize(("flag", "make", "says"), [c[1:] for c in OUTPUTS], ids=[c[0] for c in OUTPUTS])
def test_bench_refuses_outputs_it_could_not_write_before_it_runs(
    flag: list[str], make: Callable[[Path], Path], says: str, tmp_path: Path
) -> None:
    """A benchmark writes its tables and plots only once it has run (minutes to hours): a path that cannot take
    them is refused first, not after the results exist."""
    path = make(tmp_path)
    result = _bench(*flag, str(path), "--seed", "0", "--policy", "mmfleet")
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"{flag[0]} {path}"), result.stderr
    assert says in result.stderr, result.stderr


TOKEN_COLUMNS: list[tuple[str, bytes, list[str], str]] = [
    ("a token count that is text", b"ts,in\n0,5\n1,abc\n", ["--input-column", "in"], ": row 3: in 'abc': expected a"),
    ("a negative token count", b"ts,in\n0,-5\n", ["--input-column", "in"], ": row 2: in '-5': expected a number at"),
    ("a token column it lacks", b"ts,in\n0,5\n", ["--output-column", "out"], ": no column 'out' (have ['in', 'ts'])"),
    ("a repeated window", b"ts,n\n0,5\n0,3\n", ["--count-column", "n"], ": row 3: ts '0' repeats another row's"),
]


@pytest.mark.parametrize(
    ("content", "flags", "says"), [c[1:] for c in TOKEN_COLUMNS], ids=[c[0] for c in TOKEN_COLUMNS]
)
def test_bench_names_the_row_and_column_of_a_bad_value_in_a_trace(
    content: bytes, flags: list[str], says: str, tmp_path: Path
) -> None:
    path = writes(content)(tmp_path)
    result = _bench("--trace", str(path), "--time-column", "ts", *flags, "--docs", str(tmp_path / "d.md"))
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"--trace {path}{says}"), result.stderr


def test_a_trace_saved_with_a_byte_order_mark_reads_as_without_one(tmp_path: Path) -> None:
    """Spreadsheets save CSV as UTF-8 with a byte-order mark: the first column is still the one named."""
    plain, marked = tmp_path / "plain.csv", tmp_path / "marked.csv"
    plain.write_bytes(b"ts,in\n0,5\n2.5,7\n")
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    read = [traffic.load_csv(p, time_col="ts", input_col="in") for p in (plain, marked)]
    assert read[0].arrival.tolist() == read[1].arrival.tolist() == [0.0, 2.5]
    assert read[0].input_tokens.tolist() == read[1].input_tokens.tolist() == [5.0, 7.0]


CLUSTER_RECORDS: list[tuple[str, bytes, str]] = [
    ("not an object", b"[]\n", "(TypeError: list indices must be integers"),
    ("a key missing", b'{"name": "ok"}\n', "(KeyError: 'state_dir')"),
    ("not JSON", b'{"name": \n', "(JSONDecodeError: Expecting value"),
    ("not UTF-8", b'{"name": "\xff"}\n', "(UnicodeDecodeError: "),
]


@pytest.mark.parametrize(("content", "says"), [c[1:] for c in CLUSTER_RECORDS], ids=[c[0] for c in CLUSTER_RECORDS])
@pytest.mark.parametrize("command", [["cluster", "status"], ["cluster", "env"], ["cluster", "down"]])
def test_a_cluster_record_it_did_not_write_is_named_with_what_to_do(
    command: list[str], content: bytes, says: str, tmp_path: Path
) -> None:
    (tmp_path / "clusters").mkdir()
    record = tmp_path / "clusters" / "odd.json"
    record.write_bytes(content)
    result = run(*command, "--name", "odd", env={"MMFLEET_CACHE": str(tmp_path)})
    assert result.returncode == 1, result.stderr[-2000:]
    prefix = f"mmfleet {' '.join(command)}: {record}: not a record of a cluster `mmfleet cluster up` started {says}"
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(prefix), result.stderr
    assert result.stderr.endswith("; if no cluster odd runs, delete that file\n")


def test_bench_tune_refuses_a_record_path_it_could_not_write_before_it_sweeps(tmp_path: Path) -> None:
    result = run("bench", "tune", "--family", "static", "--seed", "0", "--tuned", str(tmp_path))
    assert (result.returncode, result.stderr) == (2, f"--tuned {tmp_path}: a folder; expected a file it can write\n")
