"""How the fuzzer's live leg judges a fleet and reads the operator's log (``mmfleet_lab.fuzz``): a verdict only once
the status is for the fleet's generation, over a Deployment rendered from that generation's spec; a pod the API server
refuses is a finding, the harness's quota is not; which fleets are updated, and to what."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from mmfleet import render
from mmfleet.clouds import COLLECTOR_ENDPOINT
from mmfleet.render import SpecError
from mmfleet.validation import parse
from mmfleet_lab import fuzz
from tests.helpers.operator_process import mmfleet_command

QUOTA = 'pods "q-1" is forbidden: exceeded quota: fuzz-pods, requested: pods=1, used: pods=2, limited: pods=2'
PSS = 'pods "q-2" is forbidden: violates PodSecurity "restricted:latest": runAsNonRoot != true'
MODEL = {"model": {"name": "Qwen/Qwen2.5-VL-3B-Instruct"}}


def _fleet(
    generation: int = 2,
    observed: int | None = 2,
    reason: str = "ReplicasNotReady",
    message: str = "",
    spec: dict[str, Any] | None = None,
) -> Any:
    status: dict[str, Any] = {
        "cloud": "generic",
        "conditions": [{"type": "Ready", "status": "False", "reason": reason, "message": message}],
    }
    if observed is not None:
        status["observedGeneration"] = observed
    metadata = {"name": "f", "namespace": "fz-a-1", "generation": generation}
    return {
        **fuzz.UPDATE_SHAPES[0].body,
        "metadata": metadata,
        "spec": spec or {**MODEL, "replicas": 1},
        "status": status,
    }


def _deployment(fleet: dict[str, Any], replicas: int | None = None) -> dict[str, Any]:
    """The Deployment ``mmfleet render`` makes of ``fleet``, with ``replicas`` as the scaler or the spec left them."""
    rendered = render.render(parse(fleet), "generic", collector_endpoint=COLLECTOR_ENDPOINT)
    deployment: dict[str, Any] = next(c for c in rendered if c["kind"] == "Deployment")
    if replicas is not None:
        deployment["spec"]["replicas"] = replicas
    return deployment


def test_no_verdict_before_the_status_is_for_this_generation() -> None:
    assert fuzz.judge(_fleet(observed=None), [_deployment(_fleet())], [{}], [])[0] == ""
    assert fuzz.judge(_fleet(observed=1), [_deployment(_fleet())], [{}], [])[0] == ""


def test_invalid_spec_counts_as_refused_only_when_its_message_starts_with_the_field_path() -> None:
    named = _fleet(reason="InvalidSpec", message="spec.placement.nodeSelector: {'-x': 'y'} is not accepted: ...")
    assert fuzz.judge(named, [], [], [])[0] == "refused naming the field"
    unnamed = _fleet(reason="InvalidSpec", message="something is wrong")
    assert fuzz.judge(unnamed, [], [], [])[0] == "refusals not naming a field"


def test_a_refused_apply_is_a_finding_not_a_refusal_of_the_spec() -> None:
    refused = _fleet(reason="ApplyRefused", message="the API server refused a write (422): applying Deployment ...")
    assert fuzz.judge(refused, [], [], [])[0] == "accepted specs whose children the API server refuses"


def test_served_once_the_pods_the_quota_allows_exist_and_only_the_quota_refused_more() -> None:
    fleet = _fleet(spec={**MODEL, "replicas": 1000})
    assert fuzz.judge(fleet, [], [], [])[0] == ""  # no Deployment yet
    assert fuzz.judge(fleet, [_deployment(fleet)], [{}], [{"message": QUOTA}])[0] == ""  # 1 of 2 pods
    assert fuzz.judge(fleet, [_deployment(fleet)], [{}, {}], [{"message": QUOTA}])[0] == "served"
    idle = _fleet(spec={**MODEL, "replicas": 0})
    assert fuzz.judge(idle, [_deployment(idle)], [], [])[0] == "served"


def test_a_status_for_the_new_generation_over_the_old_generation_s_deployment_is_a_finding() -> None:
    """A fleet updated from vLLM to TensorRT-LLM whose status says generation 2 while its Deployment still runs
    vLLM, or still has the replicas of before."""
    old = _fleet(spec=MODEL)
    new = _fleet(spec={**MODEL, "backend": {"name": "tensorrt-llm"}})
    verdict, why = fuzz.judge(new, [_deployment(old)], [{}], [])
    assert verdict == "children not from the fleet's generation"
    assert "generation 2" in why and "vllm" in why and "tensorrt-llm" in why
    two = _fleet(spec={**MODEL, "replicas": 2})
    verdict, why = fuzz.judge(two, [_deployment(two, replicas=1)], [{}, {}], [])
    assert (verdict, why) == ("children not from the fleet's generation", "generation 2: replicas 1 instead of 2")
    assert fuzz.judge(new, [_deployment(new)], [{}], [])[0] == "served"


def test_with_autoscaling_the_replicas_may_be_any_within_its_bounds() -> None:
    scaled = _fleet(spec={**MODEL, "autoscaling": {"minReplicas": 1, "maxReplicas": 3, "slo": {"target": "2s"}}})
    assert fuzz.judge(scaled, [_deployment(scaled, replicas=3)], [{}, {}], [])[0] == "served"
    verdict, why = fuzz.judge(scaled, [_deployment(scaled, replicas=4)], [{}, {}], [])
    assert verdict == "children not from the fleet's generation" and "replicas 4 outside 1-3" in why


def test_of_every_three_fleets_one_is_updated_once_answered_one_racing_its_creation_then_the_shapes() -> None:
    bodies = [{**fuzz.UPDATE_SHAPES[0].body, "spec": {**MODEL, "replicas": n}} for n in range(7)]
    planned = fuzz.plans(bodies, 13)
    assert [p.body for p in planned[:7]] == bodies
    assert [p.update is not None for p in planned[:7]] == [n % fuzz.UPDATE_EVERY in (0, 1) for n in range(7)]
    assert [p.racing for p in planned[:7]] == [n % fuzz.UPDATE_EVERY == 1 for n in range(7)]
    assert all(p.update["spec"] != p.body["spec"] for p in planned[:7] if p.update is not None)
    assert planned == fuzz.plans(bodies, 13) and planned[7:] == fuzz.UPDATE_SHAPES
    assert not any(p.racing for p in fuzz.UPDATE_SHAPES)  # their first verdict is planned too
    assert fuzz.plans([bodies[0]], 13)[0].update is None  # no other spec to update to


@pytest.mark.parametrize("shape", fuzz.UPDATE_SHAPES, ids=lambda p: p.shape)
def test_each_update_shape_expects_what_the_operator_s_own_parser_says(shape: fuzz.Plan) -> None:
    """The planted transitions: the operator serves a spec it parses and refuses, naming the field, one it does not
    (the API server, whose schema is generated from the same models, refuses some of those first)."""
    assert shape.update is not None
    for body, expected in zip((shape.body, shape.update), shape.expect, strict=True):
        try:
            render.render(parse({**body, "metadata": {**body["metadata"], "namespace": "n"}}), "generic")
        except SpecError as error:
            assert expected in (fuzz.REFUSED, fuzz.API_REFUSED)
            assert all(fuzz.PROBLEM.match(line) for line in error.problems)
        else:
            assert expected == fuzz.SERVED


def test_a_pod_pod_security_refuses_is_a_finding() -> None:
    fleet = _fleet()
    verdict, why = fuzz.judge(fleet, [_deployment(fleet)], [], [{"message": QUOTA}, {"message": PSS}])
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
