"""``mmfleet bench operator`` reports issue 22's targets from what it measured: the ratio to the no-operator run,
status writes per fleet, and the reads the operator makes once every fleet is Ready."""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
import types
from collections.abc import Iterator
from typing import Any

import pytest

from mmfleet.api import GROUP, PLURAL, VERSION
from mmfleet.handlers.children import CHILD_KINDS, child_labels
from mmfleet.handlers.settings import label_selector
from mmfleet_lab.bench import operator_scale
from mmfleet_lab.bench.operator_scale import Result

NAN = math.nan


def result(
    count: int, floor: bool, first: float, requests: dict[str, float], steady: dict[str, float], watched: bool = False
) -> Result:
    return Result(
        count=count, floor=floor, watched=watched, apply_seconds=NAN, ready_after_last_apply=NAN,
        ready_after_first_apply=first,
        e2e_p50=NAN, e2e_p99=NAN, reconcile_p50_ms=NAN, reconcile_p99_ms=NAN, requests_per_reconcile=NAN,
        requests_per_resource=NAN, peak_rss_mb=NAN, cpu_seconds=NAN, all_ready=True, cycle_p50_ms=NAN,
        cycle_max_ms=NAN, queries_per_cycle=NAN, writes_per_cycle="-", cpu_share={}, requests=requests,
        steady_requests=steady, steady_seconds=30.0,
    )  # fmt: skip


def cells(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()[2:]]


def test_the_table_says_the_ratio_to_the_floor_of_the_same_count_and_status_writes_per_fleet() -> None:
    ours = result(100, False, 90.0, {operator_scale.STATUS_WRITE: 150.0}, {})
    floor = result(100, True, 72.0, {}, {})
    ours_row, floor_row = cells(operator_scale.render_results([ours, floor]))
    assert ours_row[4:6] == ["1.25x", "1.50"] and floor_row[4:6] == ["-", "-"]
    (alone,) = cells(operator_scale.render_results([dataclasses.replace(ours, count=7)]))
    assert alone[4] != "1.25x", "no floor of the same count: no ratio"


def test_the_floor_with_the_operators_watches_open_is_held_to_the_plain_floor() -> None:
    floor = result(100, True, 72.0, {}, {})
    watched = result(100, True, 81.0, {}, {}, watched=True)
    ours = result(100, False, 90.0, {}, {})
    rows = {row[0]: row[4] for row in cells(operator_scale.render_results([ours, floor, watched]))}
    assert rows == {"100": "1.25x", "100, no operator": "-", "100, no operator, its watches open": "1.12x"}


def test_steady_state_lists_reads_apart_from_writes_per_fleet_and_minute_and_leaves_watches_out() -> None:
    steady = {"GET persistentvolumeclaims": 50.0, "PATCH multimodalinferences status": 100.0, "WATCH pods": 3.0}
    text = operator_scale.render_steady([result(100, False, 90.0, {}, steady)])
    rows = {row[1]: row[2:] for row in cells(text)}
    assert rows == {
        "PATCH multimodalinferences status": ["write", "100", "2.000"],
        "GET persistentvolumeclaims": ["read", "50", "1.000"],
    }


def test_the_floors_watches_are_the_operators() -> None:
    """Every child kind with the selector kopf's settings give it, and the fleets unselected, each once."""
    paths = dict(operator_scale.operator_paths())
    assert len(paths) == len(CHILD_KINDS) + 1
    assert paths["/api/v1/pods"] == label_selector(child_labels("pods"))
    assert paths["/apis/apps/v1/deployments"] == label_selector(child_labels("deployments"))
    assert paths[f"/apis/{GROUP}/{VERSION}/{PLURAL}"] == ""


class FakeStream:
    """A urllib3 response: a list's body, or a watch's lines and then silence until shut down."""

    def __init__(self, status: int, body: dict[str, Any] | None = None, lines: list[dict[str, Any]] | None = None):
        self.status, self.data = status, json.dumps(body or {}).encode()
        self.lines, self.closed = [json.dumps(e).encode() for e in lines or []], threading.Event()

    def __iter__(self) -> Iterator[bytes]:
        yield from self.lines
        self.closed.wait(10)

    def shutdown(self) -> None:
        self.closed.set()


class FakeApi:
    """Answers the bench's GETs from a script: each list and each watch takes the next answer of its kind."""

    def __init__(self, lists: list[FakeStream], watches: list[FakeStream | Exception]) -> None:
        self.lists, self.watches, self.queries = lists, watches, []  # type: ignore[var-annotated]

    def param_serialize(self, method: str, path: str, query_params: list[tuple[str, str]], **_: Any) -> tuple[Any, ...]:
        return (dict(query_params),)

    def call_api(self, query: dict[str, str], _request_timeout: Any) -> Any:
        self.queries.append(query)
        if "watch" not in query:
            return types.SimpleNamespace(response=self.lists.pop(0))
        answer = self.watches.pop(0) if self.watches else FakeStream(200)
        if isinstance(answer, Exception):
            raise answer
        return types.SimpleNamespace(response=answer)


def item(name: str, version: str, phase: str = "") -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": version}, "status": {"phase": phase}}


def settle(watched: operator_scale.Watched, names: set[str]) -> None:
    deadline = time.monotonic() + 5
    while {i["metadata"]["name"] for i in watched.items()} != names and time.monotonic() < deadline:
        time.sleep(0.01)


def test_watched_follows_adds_edits_deletes_and_lists_again_when_too_old() -> None:
    first = FakeStream(200, lines=[
        {"type": "ADDED", "object": item("b", "2")},
        {"type": "MODIFIED", "object": item("a", "3", "Ready")},
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "4"}}},
        {"type": "DELETED", "object": item("b", "5")},
        {"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}},
    ])  # fmt: skip
    second = FakeStream(200, lines=[{"type": "MODIFIED", "object": item("c", "11", "Ready")}])
    api = FakeApi(
        [FakeStream(200, {"metadata": {"resourceVersion": "1"}, "items": [item("a", "1")]}),
         FakeStream(200, {"metadata": {"resourceVersion": "10"}, "items": [item("a", "3", "Ready"), item("c", "9")]})],
        [first, second],
    )  # fmt: skip
    with operator_scale.Watched(api, "/apis/x/v1/namespaces/bench/things") as watched:
        settle(watched, {"a", "c"})
        deadline = time.monotonic() + 5
        while not all(i["status"]["phase"] == "Ready" for i in watched.items()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert {i["metadata"]["name"]: i["status"]["phase"] for i in watched.items()} == {"a": "Ready", "c": "Ready"}
    watches = [q["resourceVersion"] for q in api.queries if "watch" in q]
    assert watches[:2] == ["1", "10"], "each watch starts where the last list or event left off"
    assert not watched.thread.is_alive(), "closing ends the watching thread"


def test_watched_gives_up_on_a_watch_that_keeps_failing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(operator_scale.Watched, "GIVE_UP", 0.2)
    api = FakeApi([FakeStream(200, {"metadata": {"resourceVersion": "1"}, "items": []})],
                  [ConnectionError("refused")] * 100)  # fmt: skip
    with operator_scale.Watched(api, "/apis/x/v1/namespaces/bench/things") as watched:
        time.sleep(0.6)
        with pytest.raises(RuntimeError, match="failing for 0 s: refused"):
            watched.items()
