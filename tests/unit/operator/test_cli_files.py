"""Every file the ``mmfleet`` command reads, broken or hostile: a one-line error naming the file (and the field, where
there is one), exit code 2, never a traceback, never a hang."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.cli import a_directory, run, writes

HEADER = "apiVersion: mmfleet.io/v1alpha1\nkind: MultimodalInference\nmetadata: {name: broken}\n"
# 9 aliases of 9 aliases, nine levels: 9**9 (387 million) strings once expanded, from a file of about 400 bytes.
LAUGHS = 'l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"l{i}: &l{i} [{','.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 9)
)


# (what, how to make the file, what the one error line says after the file's name)
BROKEN_SPECS: list[tuple[str, Callable[[Path], Path], str]] = [
    (
        "non-UTF-8",
        writes(HEADER.encode() + b"spec:\n  model: {name: caf\xe9}\n"),
        ": not UTF-8 text: byte 0xe9 on line 5",
    ),
    ("deep nesting", writes(HEADER.encode() + b"spec: " + b"[" * 20_000 + b"]" * 20_000 + b"\n"), ": nested more than"),
    ("nesting under the limit of the parser", writes(b"spec: " + b"[" * 100 + b"]" * 100), ": spec[0][0][0]"),
    ("alias bomb at the top", writes(LAUGHS.encode()), "values once YAML aliases are expanded"),
    (
        "alias bomb in a field",
        writes((LAUGHS + HEADER + "spec:\n  model: {name: m}\n  extraArgs: *l8\n").encode()),
        ": spec.extraArgs[",
    ),
    ("an alias cycle", writes(HEADER.encode() + b"spec: &s {model: *s}\n"), ": spec.model.model.model"),
    ("a huge integer", writes(HEADER.encode() + b"spec:\n  replicas: " + b"9" * 5000 + b"\n"), ": spec.replicas: an "),
    (
        "a date that is none",
        writes(HEADER.encode() + b"spec:\n  model: {name: 2026-13-45}\n"),
        "month must be in 1..12",
    ),
    ("an empty file", writes(b""), ": empty; expected one or more MultimodalInference"),
    ("only comments", writes(b"# nothing\n---\n"), ": empty; expected one or more MultimodalInference"),
    ("a directory", a_directory, ": Is a directory"),
    ("a missing file", lambda folder: folder / "nope.yaml", ": No such file or directory"),
    ("not YAML", writes(b"spec: [unclosed\n"), ": not valid YAML: line 2, column 1: expected ',' or ']'"),
]


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
    path = writes((HEADER + "spec:\n  model: {name: m}\n  gpu: {count: &n 2}\n  parallelism: {tensor: *n}\n").encode())(
        tmp_path
    )
    result = run("render", "-f", str(path), "--cloud", "generic")
    assert result.returncode == 0, result.stderr
    assert "- --tensor-parallel-size\n        - '2'" in result.stdout


def test_render_refuses_a_file_with_no_multimodal_inference_in_it(tmp_path: Path) -> None:
    path = writes(b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n---\nkind: Secret\n")(tmp_path)
    result = run("render", "-f", str(path))
    assert (result.returncode, result.stdout) == (2, "")
    expected = "expected one or more MultimodalInference resources"
    assert result.stderr == f"{path}: no MultimodalInference (kind: ConfigMap, Secret); {expected}\n"


SPEC = (HEADER + "spec:\n  model: {name: m}\n").encode()
BROKEN_POLICIES: list[tuple[str, bytes, str]] = [
    ("an empty file", b"", ": empty; expected one policy mapping (the policy alone, or chart values holding it under"),
    ("chart values with an empty policy", b"policy:\n", ": policy: empty; expected a mapping of some of images, model"),
    ("two documents", b"images: []\n---\nsecrets: []\n", ": 2 YAML documents; expected one policy mapping"),
]


@pytest.mark.parametrize(("content", "says"), [c[1:] for c in BROKEN_POLICIES], ids=[c[0] for c in BROKEN_POLICIES])
def test_render_names_what_a_policy_file_lacks(content: bytes, says: str, tmp_path: Path) -> None:
    spec = writes(SPEC)(tmp_path)
    policy = tmp_path / "policy.yaml"
    policy.write_bytes(content)
    result = run("render", "-f", str(spec), "--policy", str(policy))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"{policy}{says}"), result.stderr


def test_render_refuses_to_read_both_files_from_standard_input() -> None:
    result = run("render", "-f", "-", "--policy", "-", stdin=SPEC.decode())
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == "-f - and --policy -: both read standard input, which is read once; give one as a file\n"
