"""How the fuzzer's live leg judges a fleet and reads the operator's log (``mmfleet_lab.fuzz``): a verdict only once
the status is for the fleet's generation; a pod the API server refuses is a finding, the harness's quota is not."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from mmfleet_lab import fuzz
from tests.integration.operator_process import mmfleet_command

QUOTA = 'pods "q-1" is forbidden: exceeded quota: fuzz-pods, requested: pods=1, used: pods=2, limited: pods=2'
PSS = 'pods "q-2" is forbidden: violates PodSecurity "restricted:latest": runAsNonRoot != true'


def _fleet(generation: int = 2, observed: int | None = 2, reason: str = "ReplicasNotReady", message: str = "") -> Any:
    status = {"conditions": [{"type": "Ready", "status": "False", "reason": reason, "message": message}]}
    if observed is not None:
        status["observedGeneration"] = observed
    return {"metadata": {"generation": generation}, "status": status}


def _deployment(replicas: int) -> dict[str, Any]:
    return {"spec": {"replicas": replicas}}


def test_no_verdict_before_the_status_is_for_this_generation() -> None:
    assert fuzz.judge(_fleet(observed=None), [_deployment(1)], [{}], [])[0] == ""
    assert fuzz.judge(_fleet(observed=1), [_deployment(1)], [{}], [])[0] == ""


def test_invalid_spec_counts_as_refused_only_when_its_message_starts_with_the_field_path() -> None:
    named = _fleet(reason="InvalidSpec", message="spec.placement.nodeSelector: {'-x': 'y'} is not accepted: ...")
    assert fuzz.judge(named, [], [], [])[0] == "refused naming the field"
    unnamed = _fleet(reason="InvalidSpec", message="something is wrong")
    assert fuzz.judge(unnamed, [], [], [])[0] == "refusals not naming a field"


def test_a_refused_apply_is_a_finding_not_a_refusal_of_the_spec() -> None:
    refused = _fleet(reason="ApplyRefused", message="the API server refused a write (422): applying Deployment ...")
    assert fuzz.judge(refused, [], [], [])[0] == "accepted specs whose children the API server refuses"


def test_served_once_the_pods_the_quota_allows_exist_and_only_the_quota_refused_more() -> None:
    fleet = _fleet()
    assert fuzz.judge(fleet, [], [], [])[0] == ""  # no Deployment yet
    assert fuzz.judge(fleet, [_deployment(1000)], [{}], [{"message": QUOTA}])[0] == ""  # 1 of 2 pods
    assert fuzz.judge(fleet, [_deployment(1000)], [{}, {}], [{"message": QUOTA}])[0] == "served"
    assert fuzz.judge(fleet, [_deployment(0)], [], [])[0] == "served"


def test_a_pod_pod_security_refuses_is_a_finding() -> None:
    verdict, why = fuzz.judge(_fleet(), [_deployment(1)], [], [{"message": QUOTA}, {"message": PSS}])
    assert verdict == "accepted specs whose pods the API server refuses"
    assert "PodSecurity" in why


def _line(level: str, namespace: str, text: str, n: int) -> str:
    return f"[2026-12-02 03:15:{n:02d},561] kopf.objects         [{level:8}] [{namespace}/fleet] {text} (attempt {n})"


def test_the_same_warning_for_one_fleet_more_than_the_limit_is_a_retry_loop() -> None:
    limit = fuzz.RETRY_LIMIT
    looping = [_line("WARNING", "fz-a-1", "Handler 'create_fleet' failed temporarily", n) for n in range(limit + 1)]
    within = [_line("ERROR", "fz-a-10", "Handler 'create_fleet' failed", n) for n in range(limit)]
    chatty = [_line("INFO", "fz-a-2", "Handler 'create_fleet' succeeded", n) for n in range(limit * 3)]
    loops = fuzz.retry_loops("\n".join([*looping, *within, *chatty]), ["fz-a-1", "fz-a-10", "fz-a-2"])
    assert list(loops) == ["fz-a-1"]  # fz-a-10's lines are not fz-a-1's
    count, line = loops["fz-a-1"]
    assert count == limit + 1
    assert "failed temporarily (attempt #)" in line


def test_a_traceback_counts_once_per_log_record_however_many_exceptions_it_chains() -> None:
    chained = (
        "[2026-12-02 03:46:27,697] mmfleet [ERROR   ] refreshing the status of fz-a-1/fz-1 failed\n"
        "Traceback (most recent call last):\n  ...\nNotFoundException: (404)\n\n"
        "During handling of the above exception, another exception occurred:\n\n"
        "Traceback (most recent call last):\n  ...\nNotFoundError: 404"
    )
    quiet = "[2026-12-02 03:46:28,000] kopf.objects [INFO    ] [fz-a-1/fz-1] Handler 'watch_pods' succeeded."
    found = fuzz.tracebacks("\n".join([quiet, chained, quiet, chained]))
    assert len(found) == 2
    assert found[0].startswith("[2026-12-02 03:46:27,697] mmfleet [ERROR   ] refreshing the status")


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--count", "1"], "--count 1: at least 2"),
        (["--batch", "0"], "--batch 0: at least 1"),
    ],
)
def test_bench_fuzz_refuses_a_bad_flag_naming_it_before_starting_a_cluster(
    tmp_path: Path, flags: list[str], said: str
) -> None:
    docs = tmp_path / "r.md"
    argv = [*mmfleet_command(), "bench", "fuzz", *flags, "--docs", str(docs)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2 and said in result.stderr and "Traceback" not in result.stderr
    assert not docs.exists()
