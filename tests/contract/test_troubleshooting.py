"""docs/troubleshooting.md explains every condition reason the operator can set, read out of the operator's code.

The reasons are string literals where the conditions are built: ``condition(<type>, <status>, <reason>, ...)``
calls and ``(<type>, <status>, <reason>, <message>)`` rows, whose first element is a condition type. To those
add the reasons passed through from elsewhere: the kubelet's waiting reasons and the scheduler's
``Unschedulable`` (``status.BROKEN_WAITING_REASONS``, ``status.pod_problems``) and the shared model cache's
(``status.shared_cache_problem``), and the autoscaler's event reasons.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap

from mmfleet import status
from mmfleet.api import CONDITION_TYPES
from tests.helpers.repo import ROOT

DOC = ROOT / "docs/troubleshooting.md"
SOURCES = sorted((ROOT / "operator/mmfleet").rglob("*.py"))


def _literals(node: ast.expr) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.IfExp):
        return _literals(node.body) | _literals(node.orelse)
    return set()


def condition_reasons() -> dict[str, set[str]]:
    """Condition type -> the literal reasons the code pairs with it."""
    found: dict[str, set[str]] = {}
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            items = node.elts if isinstance(node, ast.Tuple) else node.args if isinstance(node, ast.Call) else []
            if len(items) < 3:
                continue
            kinds = _literals(items[0])
            reasons = _literals(items[2])
            if len(kinds) == 1 and kinds <= set(CONDITION_TYPES) and not reasons & set(CONDITION_TYPES):
                found.setdefault(kinds.pop(), set()).update(reasons)
    return found


def passed_through_reasons() -> set[str]:
    cache = ast.parse(textwrap.dedent(inspect.getsource(status.shared_cache_problem)))
    cache_reasons = {
        r.value.elts[0].value
        for r in ast.walk(cache)
        if isinstance(r, ast.Return) and isinstance(r.value, ast.Tuple) and isinstance(r.value.elts[0], ast.Constant)
    }
    return set(status.BROKEN_WAITING_REASONS) | {"Unschedulable"} | cache_reasons


def documented() -> set[str]:
    return set(re.findall(r"`([A-Z][A-Za-z]+)`", DOC.read_text()))


def test_the_code_scan_finds_the_reasons_it_should() -> None:
    """Guards the scan itself: reasons known to exist are found, under the right condition."""
    reasons = condition_reasons()
    assert reasons.keys() == set(CONDITION_TYPES)
    assert {"ReplicasReady", "InvalidSpec"} <= reasons["Ready"]
    assert {"ProgressDeadlineExceeded", "ReplicasStarting"} <= reasons["Progressing"]
    assert {"PrometheusUnavailable", "SeriesMissing"} <= reasons["MetricsAvailable"]
    assert "CollectorNotReady" in reasons["TracingReady"]
    assert {"ModelCacheClaimMissing", "CrashLoopBackOff"} <= passed_through_reasons()


def test_every_condition_and_reason_is_in_the_troubleshooting_doc() -> None:
    reasons = set().union(*condition_reasons().values()) | passed_through_reasons() | {"ScaledUp", "ScaledDown"}
    missing = (set(CONDITION_TYPES) | reasons) - documented()
    assert not missing, f"docs/troubleshooting.md does not explain: {sorted(missing)}"


def test_every_condition_has_its_own_section() -> None:
    headings = re.findall(r"^## (\w+)", DOC.read_text(), re.MULTILINE)
    assert [h for h in headings if h in CONDITION_TYPES] == list(CONDITION_TYPES)
