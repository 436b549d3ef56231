"""Two distributions from one source root: the operator's (``mmfleet``, what the image installs) and the lab's
(``mmfleet-lab``, lab/pyproject.toml), which brings the lab's dependencies and its sub-commands of ``mmfleet``."""

from __future__ import annotations

import ast
import tomllib
from typing import Any

from tests.helpers.repo import ROOT

LAB_DEPENDENCIES = {"numpy", "numba", "matplotlib", "cryptography", "hypothesis"}


def _project(path: str) -> dict[str, Any]:
    found: dict[str, Any] = tomllib.loads((ROOT / path).read_text())
    return found


def _names(requirements: list[str]) -> set[str]:
    return {r.split(";")[0].split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip() for r in requirements}


def test_the_operators_distribution_holds_only_the_operator() -> None:
    operator = _project("pyproject.toml")
    assert operator["tool"]["setuptools"]["packages"]["find"] == {
        "where": ["operator"],
        "include": ["mmfleet", "mmfleet.*"],
    }
    assert set(operator["tool"]["setuptools"]["package-data"]) == {"mmfleet"}
    assert "entry-points" not in operator["project"]  # nothing of the lab's: the lab declares its own commands
    assert not _names(operator["project"]["dependencies"]) & LAB_DEPENDENCIES


def test_the_lab_is_its_own_distribution_with_its_dependencies_and_commands() -> None:
    lab = _project("lab/pyproject.toml")
    assert lab["project"]["name"] == "mmfleet-lab"
    assert _names(lab["project"]["dependencies"]) == {"mmfleet"} | LAB_DEPENDENCIES
    assert lab["project"]["entry-points"] == {"mmfleet.commands": {"lab": "mmfleet_lab.cli:register"}}
    assert lab["tool"]["setuptools"]["package-dir"] == {"": "../operator"}
    assert lab["tool"]["setuptools"]["packages"]["find"]["include"] == ["mmfleet_lab", "mmfleet_lab.*"]


def test_the_lab_extra_and_make_install_bring_the_lab_from_this_checkout() -> None:
    operator = _project("pyproject.toml")
    assert operator["project"]["optional-dependencies"]["lab"] == ["mmfleet-lab"]
    makefile = (ROOT / "Makefile").read_text()
    assert '-e ".[lab,dev]" -e ./lab' in makefile  # one pip command: mmfleet-lab is taken from lab/, not an index


def test_the_operator_uses_only_kopfs_public_api() -> None:
    """kopf is pinned to a minor version, but its underscored modules may change within one: the operator imports
    none (a private import it once had is now an aiohttp middleware, ``handlers.connection.KindGone``)."""
    private = []
    for path in sorted((ROOT / "operator/mmfleet").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            private += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.startswith("kopf._")]
    assert private == []
