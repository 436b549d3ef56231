"""``mmfleet bench operator`` reports issue 22's targets from what it measured: the ratio to the no-operator run,
status writes per fleet, and the reads the operator makes once every fleet is Ready."""

from __future__ import annotations

import dataclasses
import math

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
