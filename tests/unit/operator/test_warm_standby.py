"""Warm standby: the spec's rules, what the pods are rendered with, and the plan that keeps the autoscaler's replicas
in routing and the rest asleep."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from mmfleet import render
from mmfleet.api import MultimodalInference
from mmfleet.autoscaler.cycle import Pods
from mmfleet.autoscaler.standby import SLEEP_ANNOTATION, active_count, plan, serving_pods, status
from mmfleet.render import SERVING_LABEL
from tests.helpers.repo import spec_doc

SLO = {"target": "2s"}


def standby_fleet(standby: dict[str, Any] | None = None, **spec: Any) -> MultimodalInference:
    autoscaling = {"slo": SLO, "warmStandby": standby if standby is not None else {}}
    return MultimodalInference.model_validate(spec_doc(autoscaling=autoscaling, **spec))


def pod(name: str, created: int, *, ready: bool = True, serving: str | None = "true", state: str | None = None) -> Any:
    labels = {} if serving is None else {SERVING_LABEL: serving}
    annotations = {} if state is None else {SLEEP_ANNOTATION: state}
    return {
        "metadata": {
            "name": name,
            "creationTimestamp": f"2026-12-05T01:{created:02d}:00Z",
            "labels": labels,
            "annotations": annotations,
        },
        "status": {
            "phase": "Running",
            "podIP": f"10.244.0.{created + 10}",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def names(pods: tuple[Any, ...]) -> list[str]:
    return [p.name for p in pods]


# --- the spec -------------------------------------------------------------------------------------


def test_defaults_keep_one_replica_asleep_at_level_one() -> None:
    standby = standby_fleet().spec.standby
    assert standby is not None and (standby.replicas, standby.level) == (1, 1)


def test_tensorrt_llm_has_no_sleep_mode_and_the_error_names_the_field() -> None:
    with pytest.raises(ValidationError, match=r"autoscaling.warmStandby: set, but spec.backend.name is tensorrt-llm"):
        standby_fleet(backend={"name": "tensorrt-llm"})


def test_standby_is_refused_with_autoscaling_off_and_out_of_range_values_are_named() -> None:
    with pytest.raises(ValidationError, match="warmStandby: set, but enabled is false"):
        MultimodalInference.model_validate(spec_doc(autoscaling={"enabled": False, "warmStandby": {}}))
    with pytest.raises(ValidationError, match="level"):
        standby_fleet({"level": 3})
    with pytest.raises(ValidationError, match="replicas"):
        standby_fleet({"replicas": 0})


# --- what the pods are rendered with ----------------------------------------------------------------


def children(inference: MultimodalInference, **kwargs: Any) -> dict[str, Any]:
    """The fleet's own children by kind (not the endpoint picker's)."""
    name = inference.metadata.name
    return {c["kind"]: c for c in render.render(inference, "generic", **kwargs) if c["metadata"]["name"] == name}


def test_the_server_runs_with_sleep_mode_and_its_development_endpoints() -> None:
    container = children(standby_fleet())["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert "--enable-sleep-mode" in container["command"]
    assert {"name": "VLLM_SERVER_DEV_MODE", "value": "1"} in container["env"]


def test_requests_reach_only_pods_labelled_serving_and_new_pods_start_serving() -> None:
    for routing in ("service", "inferencePool"):
        rendered = children(standby_fleet(routing={"mode": routing}))
        template = rendered["Deployment"]["spec"]["template"]["metadata"]["labels"]
        assert template[SERVING_LABEL] == "true"
        # The Deployment's selector is immutable and stays the fleet's: a sleeping pod is still its own.
        assert SERVING_LABEL not in rendered["Deployment"]["spec"]["selector"]["matchLabels"]
        assert rendered["Service"]["spec"]["selector"][SERVING_LABEL] == "true"
    pool = children(standby_fleet(routing={"mode": "inferencePool"}))["InferencePool"]
    assert pool["spec"]["selector"]["matchLabels"][SERVING_LABEL] == "true"


def test_the_operator_may_reach_the_serving_port_to_put_pods_to_sleep() -> None:
    rules = children(standby_fleet(), operator_namespace="mmfleet-system")["NetworkPolicy"]["spec"]["ingress"]
    operator = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mmfleet-system"}}}
    assert any(operator in rule.get("from", []) for rule in rules)


def test_without_standby_nothing_changes() -> None:
    inference = MultimodalInference.model_validate(spec_doc(autoscaling={"slo": SLO}))
    rendered = children(inference, operator_namespace="mmfleet-system")
    container = rendered["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert "--enable-sleep-mode" not in container["command"]
    assert all(e["name"] != "VLLM_SERVER_DEV_MODE" for e in container["env"])
    assert SERVING_LABEL not in rendered["Service"]["spec"]["selector"]
    assert SERVING_LABEL not in rendered["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert "mmfleet-system" not in str(rendered["NetworkPolicy"])


# --- the plan -------------------------------------------------------------------------------------


def test_pods_beyond_the_autoscalers_replicas_are_put_to_sleep_youngest_first() -> None:
    pods = [pod("a", 1), pod("b", 2), pod("c", 3)]
    done = plan(pods, serving=1, busy=frozenset())
    assert names(done.sleep) == ["c", "b"] and not done.wake


def test_a_scale_up_wakes_sleeping_pods_before_anything_else() -> None:
    pods = [pod("a", 1), pod("b", 2, serving="false", state="asleep"), pod("c", 3, serving="false", state="asleep")]
    assert names(plan(pods, serving=2, busy=frozenset()).wake) == ["b"]
    assert names(plan(pods, serving=5, busy=frozenset()).wake) == ["b", "c"]


def test_pods_being_woken_or_put_to_sleep_are_left_alone_and_counted_where_they_go() -> None:
    pods = [pod("a", 1), pod("b", 2, serving="false", state="waking"), pod("c", 3, serving="false", state="asleep")]
    # b is waking: it is the second serving replica, so c stays asleep.
    done = plan(pods, serving=2, busy=frozenset({"b"}))
    assert done.empty


def test_a_pod_left_half_way_is_finished_when_the_operator_comes_back() -> None:
    # Out of routing but never confirmed asleep (a failed or cut sleep): put to sleep again.
    assert names(plan([pod("a", 1), pod("b", 2, serving="false", state="sleeping")], 1, frozenset()).sleep) == ["b"]
    # A wake cut short is woken again when a replica is wanted.
    assert names(plan([pod("a", 1), pod("b", 2, serving="false", state="waking")], 2, frozenset()).wake) == ["b"]


def test_pods_from_before_standby_serve_and_are_labelled_so() -> None:
    done = plan([pod("a", 1, serving=None), pod("b", 2, serving=None)], serving=2, busy=frozenset())
    assert names(done.label) == ["a", "b"] and not done.sleep


def test_starting_and_terminating_pods_are_neither_woken_nor_put_to_sleep() -> None:
    gone = pod("b", 2)
    gone["metadata"]["deletionTimestamp"] = "2026-12-05T01:05:00Z"
    assert plan([pod("a", 1), gone, pod("c", 3, ready=False)], serving=1, busy=frozenset()).empty


def test_the_autoscaler_counts_only_serving_pods_and_the_starting_ones_it_can_use() -> None:
    pods = [pod("a", 1), pod("b", 2, serving="false", state="asleep")]
    assert [p["metadata"]["name"] for p in serving_pods(pods)] == ["a"]
    # Two starting pods but a target of 2 with one Ready: one of them is the standby's replacement.
    assert active_count(Pods(ready=1, starting=2), target=2).starting == 1
    assert active_count(Pods(ready=3, starting=2), target=2).starting == 0


def test_status_shows_sleeping_and_serving_pods_and_the_median_wake() -> None:
    pods = [pod("a", 1), pod("b", 2, serving="false", state="asleep"), pod("c", 3, serving="false", state="sleeping")]
    shown = status(pods, [2.0, 4.0, 30.0], "pod c: POST /sleep?level=1&mode=wait failed: HTTP 404")
    assert (shown.asleep, shown.serving, shown.wake, shown.wakes) == (1, 1, "4s", 3)
    assert shown.problem is not None and "HTTP 404" in shown.problem
