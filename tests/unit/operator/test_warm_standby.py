"""Warm standby: the spec's rules, what the pods are rendered with, and the plan that keeps the autoscaler's replicas
in routing and the rest asleep."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from mmfleet import render
from mmfleet import status as status_module
from mmfleet.api import MultimodalInference
from mmfleet.autoscaler.cycle import Pods
from mmfleet.autoscaler.metrics import Signals
from mmfleet.autoscaler.standby import SLEEP_ANNOTATION, active_count, asleep, plan, serving_pods, status
from mmfleet.handlers import autoscale, records
from mmfleet.handlers import standby as fleet_standby
from mmfleet.render import SERVING_LABEL, STANDBY_ANNOTATION
from tests.helpers.operator_state import (
    KEY,
    FakePrometheus,
    RecordingKube,
    fleet_body,
    operator,
    reconcile_once,
    refused_ready,
)
from tests.helpers.repo import spec_doc

SLO = {"target": "2s"}


def standby_fleet(standby: dict[str, Any] | None = None, **spec: Any) -> MultimodalInference:
    autoscaling = {"slo": SLO, "warmStandby": standby if standby is not None else {}}
    spec.setdefault("routing", {"mode": "inferencePool"})
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


def test_defaults_keep_one_replica_asleep() -> None:
    standby = standby_fleet().spec.standby
    assert standby is not None and standby.replicas == 1


def test_tensorrt_llm_has_no_sleep_mode_and_the_error_names_the_field() -> None:
    with pytest.raises(ValidationError, match=r"autoscaling.warmStandby: set, but spec.backend.name is tensorrt-llm"):
        standby_fleet(backend={"name": "tensorrt-llm"})


def test_a_service_would_keep_sending_kept_alive_connections_to_a_sleeping_pod_and_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"autoscaling.warmStandby: set, but spec.routing.mode is service"):
        standby_fleet(routing={"mode": "service"})


def test_a_load_balancer_would_expose_the_development_endpoints_and_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"autoscaling.warmStandby: set, but spec.service.type is LoadBalancer"):
        standby_fleet(service={"type": "LoadBalancer", "loadBalancerSourceRanges": ["10.0.0.0/8"]}, cloud="eks")


def test_standby_is_refused_with_autoscaling_off_and_out_of_range_values_are_named() -> None:
    with pytest.raises(ValidationError, match="warmStandby: set, but enabled is false"):
        MultimodalInference.model_validate(spec_doc(autoscaling={"enabled": False, "warmStandby": {}}))
    with pytest.raises(ValidationError, match="level"):  # level 2 wakes without weights (vLLM 0.33 gpu_worker.wake_up)
        standby_fleet({"level": 2})
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
    rendered = children(standby_fleet())
    template = rendered["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert template[SERVING_LABEL] == "true"
    # The Deployment's selector is immutable and stays the fleet's: a sleeping pod is still its own.
    assert SERVING_LABEL not in rendered["Deployment"]["spec"]["selector"]["matchLabels"]
    assert rendered["Service"]["spec"]["selector"][SERVING_LABEL] == "true"
    assert rendered["InferencePool"]["spec"]["selector"]["matchLabels"][SERVING_LABEL] == "true"


def test_the_operator_may_reach_the_serving_port_to_put_pods_to_sleep() -> None:
    rules = children(standby_fleet(), operator_namespace="mmfleet-system")["NetworkPolicy"]["spec"]["ingress"]
    operator = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mmfleet-system"}}}
    assert any(operator in rule.get("from", []) for rule in rules)


def test_a_gateway_passes_only_the_openai_api_to_servers_with_development_endpoints() -> None:
    routed = {"mode": "inferencePool", "gateway": {"name": "inference-gateway"}}
    route = children(standby_fleet(routing=routed))["HTTPRoute"]
    assert route["spec"]["rules"][0]["matches"] == [{"path": {"type": "PathPrefix", "value": "/v1"}}]
    plain = MultimodalInference.model_validate(spec_doc(autoscaling={"slo": SLO}, routing=routed))
    assert children(plain)["HTTPRoute"]["spec"]["rules"][0]["matches"][0]["path"]["value"] == "/"


def test_the_deployment_says_how_many_of_its_replicas_are_standby_as_the_scaler_wrote_them() -> None:
    # Not rendered (the reconcile's apply would change it apart from the replicas): written with them.
    assert "annotations" not in children(standby_fleet({"replicas": 2}))["Deployment"]["metadata"]
    assert status_module.standby_replicas(live(3, 2)) == 2
    assert status_module.standby_replicas(live(3, None)) == 0


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
    done = plan(pods, serving=1, total=3, busy={})
    assert names(done.sleep) == ["c", "b"] and not done.wake


def test_a_scale_up_wakes_sleeping_pods_before_anything_else() -> None:
    pods = [pod("a", 1), pod("b", 2, serving="false", state="asleep"), pod("c", 3, serving="false", state="asleep")]
    assert names(plan(pods, serving=2, total=3, busy={}).wake) == ["b"]
    assert names(plan(pods, serving=5, total=6, busy={}).wake) == ["b", "c"]


def test_pods_being_woken_or_put_to_sleep_are_left_alone_and_counted_where_they_go() -> None:
    pods = [pod("a", 1), pod("b", 2, serving="false", state="waking"), pod("c", 3, serving="false", state="asleep")]
    # b is waking: it is the second serving replica, so c stays asleep.
    assert plan(pods, serving=2, total=3, busy={"b": "wake"}).empty
    # A wake queued but not started (no annotation yet) counts too: two standby pods, one wanted, one woken.
    queued = [pod("a", 1), pod("b", 2, serving="false", state="asleep"), pod("c", 3, serving="false", state="asleep")]
    assert plan(queued, serving=2, total=4, busy={"b": "wake"}).empty
    # A pod whose last call failed is left alone until its backoff ends.
    assert plan(queued, serving=2, total=4, busy={}, blocked={"b"}).wake[0].name == "c"


def test_a_pod_left_half_way_is_finished_when_the_operator_comes_back() -> None:
    # Out of routing but never confirmed asleep (a failed or cut sleep): put to sleep again.
    cut = [pod("a", 1), pod("b", 2, serving="false", state="sleeping")]
    assert names(plan(cut, serving=1, total=2, busy={}).sleep) == ["b"]
    # A wake cut short is woken again when a replica is wanted.
    waking = [pod("a", 1), pod("b", 2, serving="false", state="waking")]
    assert names(plan(waking, serving=2, total=3, busy={}).wake) == ["b"]


def test_pods_from_before_standby_serve_and_are_labelled_so() -> None:
    done = plan([pod("a", 1, serving=None), pod("b", 2, serving=None)], serving=2, total=3, busy={})
    assert names(done.label) == ["a", "b"] and not done.sleep


def test_starting_and_terminating_pods_are_neither_woken_nor_put_to_sleep() -> None:
    gone = pod("b", 2)
    gone["metadata"]["deletionTimestamp"] = "2026-12-05T01:05:00Z"
    assert plan([pod("a", 1), gone, pod("c", 3, ready=False)], serving=1, total=2, busy={}).empty


def test_nothing_is_put_to_sleep_while_the_deployment_deletes_pods() -> None:
    # Scaled from 3 to 2 (1 serving + 1 standby): the ReplicaSet picks the pod to delete; sleeping one now could
    # put to sleep the pod it keeps or the one it deletes.
    pods = [pod("a", 1), pod("b", 2), pod("c", 3, serving="false", state="asleep")]
    assert plan(pods, serving=1, total=2, busy={}).empty
    assert names(plan(pods[:2], serving=1, total=2, busy={}).sleep) == ["b"]


def test_with_standby_turned_off_every_sleeping_pod_is_woken() -> None:
    pods = [pod("a", 1), pod("b", 2, serving="false", state="asleep"), pod("c", 3, serving="false", state="sleeping")]
    assert names(plan(pods, serving=None, total=2, busy={}).wake) == ["b", "c"]


def test_the_autoscaler_counts_only_serving_pods_and_the_starting_ones_it_can_use() -> None:
    pods = [pod("a", 1), pod("b", 2, serving="false", state="asleep")]
    assert [p["metadata"]["name"] for p in serving_pods(pods)] == ["a"]
    # Two starting pods but a target of 2 with one Ready: one of them is the standby's replacement.
    assert active_count(Pods(ready=1, starting=2), target=2).starting == 1
    assert active_count(Pods(ready=3, starting=2), target=2).starting == 0
    # A pod being woken fills its slot: the Pending replacement is neither capacity nor a reason to stop growing.
    assert (
        active_count(Pods(ready=1, unschedulable=1, why_unschedulable="no GPU"), target=2, waking=1).unschedulable == 0
    )


def test_status_shows_sleeping_and_serving_pods_and_the_median_wake() -> None:
    pods = [pod("a", 1), pod("b", 2, serving="false", state="asleep"), pod("c", 3, serving="false", state="sleeping")]
    shown = status(pods, [2.0, 4.0, 30.0], "pod c: POST /sleep?level=1&mode=wait failed: HTTP 404")
    assert (shown.asleep, shown.serving, shown.wake, shown.wakes) == (1, 1, "4s", 3)
    assert shown.problem is not None and "HTTP 404" in shown.problem


# --- the operator: the Deployment's replicas, status, the signals ------------------------------------


ALLOWED = {"warmStandbyNamespaces": ["*"]}  # the admin's opt-in (mmfleet.admin_policy)


def standby_body(standby: int | None = 1, max_replicas: int = 8) -> dict[str, Any]:
    body = fleet_body(autoscaling=True)
    body["spec"]["autoscaling"]["maxReplicas"] = max_replicas
    body["spec"]["routing"] = {"mode": "inferencePool"}
    if standby is not None:
        body["spec"]["autoscaling"]["warmStandby"] = {"replicas": standby}
    return body


def live(replicas: int, standby: int | None) -> dict[str, Any]:
    """The fleet's Deployment as the operator's index shows it."""
    annotations = {} if standby is None else {STANDBY_ANNOTATION: str(standby)}
    return {
        "metadata": {"name": KEY[1], "generation": 1, "annotations": annotations, "scalerOwnsReplicas": True},
        "spec": {"replicas": replicas},
        "status": {
            "replicas": replicas,
            "readyReplicas": replicas,
            "updatedReplicas": replicas,
            "observedGeneration": 1,
        },
    }


@pytest.mark.parametrize(
    ("before", "after", "replicas", "written"),
    [
        (None, 1, 2, [(3, 1)]),  # turned on: two serving replicas stay two, one more to sleep
        (1, 2, 3, [(4, 2)]),  # one more standby
        (2, None, 4, [(2, 0)]),  # turned off: the two serving ones remain
        (1, 1, 9, []),  # maxReplicas 8 serving and one asleep: within bounds, left alone
    ],
)
def test_a_change_of_standby_moves_the_deployment_by_as_much_in_one_write_and_never_fights_the_autoscaler(
    before: int | None, after: int | None, replicas: int, written: list[tuple[int, int]]
) -> None:
    """The replicas and the standby count are written together: a retry after a failed call starts from what the
    Deployment says, never moves it twice."""
    kube = RecordingKube()
    kube.kept_annotations = {} if before is None else {STANDBY_ANNOTATION: str(before)}
    body = standby_body(after)
    reconcile_once(operator(kube, policy=ALLOWED), body, deployment=live(replicas, before))
    assert (kube.scaled_with_standby, kube.scaled) == (written, [])
    if written:  # the write went through: the next reconcile finds both moved and leaves them
        kube.kept_annotations = {STANDBY_ANNOTATION: str(written[0][1])} if written[0][1] else {}
        again = RecordingKube()
        again.kept_annotations = kube.kept_annotations
        reconcile_once(operator(again, policy=ALLOWED), body, deployment=live(written[0][0], after))
        assert (again.scaled_with_standby, again.scaled) == ([], [])


def test_pods_from_before_standby_are_labelled_serving_before_the_selectors_change() -> None:
    kube = RecordingKube()
    old = [pod("a", 1, serving=None), pod("b", 2, serving=None), pod("c", 3, serving="false", state="asleep")]
    reconcile_once(operator(kube, policy=ALLOWED), standby_body(1), deployment=live(2, None), pods=old)
    labelled = [(name, labels) for name, labels, _ in kube.marked]
    assert labelled == [("a", {SERVING_LABEL: "true"}), ("b", {SERVING_LABEL: "true"})]


def test_a_standby_the_admin_has_not_allowed_is_refused_naming_the_setting_and_nothing_is_applied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(records, "kopf_event", lambda *_: None)
    body = standby_body(1)
    body["metadata"]["generation"] = 1
    ready = refused_ready(body)
    assert (ready["status"], ready["reason"]) == ("False", "PolicyDenied")
    assert "policy.warmStandbyNamespaces" in ready["message"]


def cycle_once(kube: RecordingKube, body: dict[str, Any], deployment: dict[str, Any], pods: list[Any]) -> Any:
    op = operator(kube, policy=ALLOWED)
    reconcile_once(op, body, deployment=deployment, pods=pods)
    view = autoscale.FleetView(KEY, body, deployment, pods)
    signals = Signals(latency=0.5, request_rate=2.0, waiting=0.0, running=1.0, kv_cache_usage=0.2, reporting=2)
    with ThreadPoolExecutor(1) as pool:
        autoscale.autoscale(op, [view], FakePrometheus(signals), pool, lambda *_: (deployment, pods))
    return kube.written[-1]


def test_a_fleet_with_its_standby_asleep_is_ready_and_counts_its_serving_replicas(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(records, "kopf_event", lambda *_: None)
    # The plan's calls reach pods at their IPs (the integration test); here only what the status shows of them.
    monkeypatch.setattr(fleet_standby, "tend", lambda *args: status(args[5], [], None))
    kube = RecordingKube()
    pods = [pod("a", 1), pod("b", 2, serving="false", state="asleep")]
    written = cycle_once(kube, standby_body(1), live(2, 1), pods)
    ready = next(c for c in written["conditions"] if c["type"] == "Ready")
    assert (ready["status"], written["desiredReplicas"]) == ("True", 2), ready
    assert written["standby"] == {"asleep": 1, "serving": 1}
    assert kube.scaled == [], "one serving replica and one asleep is what was asked"


def test_the_sleeping_pods_series_do_not_count_as_serving_pods_reporting() -> None:
    pods = [pod("a", 1), pod("b", 2, serving="false", state="asleep")]
    view = autoscale.FleetView(KEY, standby_body(1), live(2, 1), pods)
    later = datetime(2026, 12, 5, 2, 0, tzinfo=UTC)  # both pods Ready long enough to have been scraped
    counted, signals = autoscale._serving_view(view, 1, 1, 0, Signals(running=3.0, reporting=2), later)
    assert (counted.ready, signals.reporting if signals else None) == (1, 1)


def test_only_healthy_pods_asleep_and_out_of_routing_count_as_what_a_scale_up_can_wake() -> None:
    pods = [
        pod("a", 1, serving="false", state="asleep"),
        pod("b", 2, serving="false", state="sleeping"),
        pod("c", 3, serving="true"),
        pod("d", 4, serving="false", state="waking"),
    ]
    assert asleep(pods) == 1


def test_the_policy_is_told_the_pods_asleep_and_the_median_of_the_fleets_measured_wakes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(records, "kopf_event", lambda *_: None)
    monkeypatch.setattr(fleet_standby, "tend", lambda *args: status(args[5], [], None))
    seen: list[Any] = []
    decide = autoscale.cycle.decide
    monkeypatch.setattr(
        autoscale.cycle, "decide", lambda inference, s, *a, **k: seen.append(s) or decide(inference, s, *a, **k)
    )
    kube = RecordingKube()
    op = operator(kube, policy=ALLOWED)
    body, deployment = standby_body(2), live(3, 2)
    pods = [pod("a", 1), pod("b", 2, serving="false", state="asleep"), pod("c", 3, serving="false", state="sleeping")]
    reconcile_once(op, body, deployment=deployment, pods=pods)
    record = op.find(KEY, body["metadata"]["uid"])
    assert record is not None
    record.standby.wakes.extend([1.0, 1.2, 5.0])
    view = autoscale.FleetView(KEY, body, deployment, pods)
    signals = Signals(latency=0.5, request_rate=2.0, waiting=0.0, running=1.0, kv_cache_usage=0.2, reporting=1)
    with ThreadPoolExecutor(1) as pool:
        autoscale.autoscale(op, [view], FakePrometheus(signals), pool, lambda *_: (deployment, pods))
    [told] = seen
    assert (told.pods.asleep, told.pods.wake) == (1, 1.2), "only the pod asleep can be woken; the median wake"
