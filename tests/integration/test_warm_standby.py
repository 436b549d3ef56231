"""Warm standby on the local cluster, served for real: the llm-d inference simulator (vLLM's /sleep, /wake_up and
/is_sleeping, with --enable-sleep-mode and VLLM_SERVER_DEV_MODE as the operator renders them) at each pod's IP, the
real endpoint picker choosing among the pods its InferencePool selects, and the operator reaching the pods at their
IPs, as an operator pod does."""

from __future__ import annotations

import json
import random
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mmfleet.autoscaler.standby import SLEEP_ANNOTATION
from mmfleet.render import COMPONENT, INFERENCE_LABEL, SERVING_LABEL
from mmfleet_lab.cluster import Cluster
from tests.helpers.fleet import Fleet, mmi
from tests.helpers.operator_process import OperatorProcess
from tests.helpers.routed import NETNS_MARKS, RoutedPool, chat, question, require_netns, sample, serve_pool
from tests.helpers.wait import wait_for

pytestmark = NETNS_MARKS

FLEET = "standby"
AUTOSCALING: dict[str, Any] = {
    "minReplicas": 1,
    "maxReplicas": 3,
    "slo": {"target": "2s", "window": "10s"},
    "warmStandby": {"replicas": 1},
}


@pytest.fixture
def fast_operator(pool_operator: OperatorProcess) -> Iterator[OperatorProcess]:
    """The module's operator with a cycle a second; restored after."""
    saved = dict(pool_operator.env)
    pool_operator.stop()
    pool_operator.env["MMFLEET_AUTOSCALE_INTERVAL"] = "1s"
    pool_operator.start()
    try:
        yield pool_operator
    finally:
        pool_operator.stop()
        pool_operator.env.clear()
        pool_operator.env.update(saved)
        pool_operator.start()


def live_pods(fleet: Fleet) -> list[Any]:
    selector = f"{INFERENCE_LABEL}={FLEET},app.kubernetes.io/component={COMPONENT}"  # not the picker's
    pods = fleet.core.list_namespaced_pod(fleet.namespace, label_selector=selector).items
    return [p for p in pods if p.metadata.deletion_timestamp is None]


def serve_new_pods(fleet: Fleet, routed: RoutedPool) -> None:
    """A simulator of its own at every Ready pod's IP (kwok runs no container; a new pod may get a gone one's IP)."""
    for pod in live_pods(fleet):
        ip = pod.status.pod_ip
        ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
        if ip and ready and routed.pods.get(ip) != pod.metadata.name:
            if ip not in routed.network.pods:
                routed.network.add_pod(ip)
            routed.pods[ip] = pod.metadata.name
            routed.start_sim(ip)


def is_sleeping(routed: RoutedPool, ip: str) -> bool | None:
    """The server's own answer (GET /is_sleeping), None while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://{ip}:{routed.flag('--port')}/is_sleeping", timeout=2) as answer:
            return bool(json.loads(answer.read())["is_sleeping"])
    except OSError:
        return None


def split(fleet: Fleet, routed: RoutedPool) -> tuple[list[str], list[str]]:
    """(serving, asleep) pod IPs: as the operator labelled them and, for the asleep, as their servers confirm."""
    serve_new_pods(fleet, routed)
    serving, asleep = [], []
    for pod in live_pods(fleet):
        label = (pod.metadata.labels or {}).get(SERVING_LABEL)
        state = (pod.metadata.annotations or {}).get(SLEEP_ANNOTATION)
        ip = pod.status.pod_ip
        if label == "true" and state is None and is_sleeping(routed, ip) is False:
            serving.append(ip)
        elif label == "false" and state == "asleep" and is_sleeping(routed, ip):
            asleep.append(ip)
    return sorted(serving), sorted(asleep)


def wait_split(fleet: Fleet, routed: RoutedPool, serving: int, asleep: int, timeout: float = 120) -> tuple[Any, Any]:
    def settled() -> tuple[list[str], list[str]] | None:
        found = split(fleet, routed)
        total = len(live_pods(fleet))
        return found if (len(found[0]), len(found[1])) == (serving, asleep) and total == serving + asleep else None

    def why() -> str:
        pods = [(p.metadata.name, p.status.pod_ip, p.metadata.labels, p.metadata.annotations) for p in live_pods(fleet)]
        return f"{serving} serving and {asleep} asleep; pods: {pods}; status: {fleet.status(FLEET).get('standby')}"

    found: tuple[list[str], list[str]] = wait_for(settled, timeout, why)
    return found


def pool_ready_pods(routed: RoutedPool) -> float | None:
    """The pods in the picker's pool as it counts them (`inference_pool_ready_pods`, set from its datastore)."""
    return sample(routed.picker_metrics(), "inference_pool_ready_pods")


def endpoints(routed: RoutedPool, tries: int = 16) -> set[str]:
    """Where distinct requests through the gateway stand-in and the picker were answered (all with 200)."""
    rng = random.Random()
    seen = set()
    for _ in range(tries):
        answer = routed.post(chat(routed.model, question(rng)))
        assert answer.status == 200, answer
        seen.add(answer.endpoint)
    return seen


def test_a_standby_replica_sleeps_out_of_routing_and_a_scale_up_wakes_it_before_any_cold_start(
    cluster: Cluster, api: Any, namespace: str, fast_operator: OperatorProcess, tmp_path: Path
) -> None:
    require_netns()
    fleet = Fleet(api, namespace)
    logs = tmp_path / "standby"
    logs.mkdir()
    fleet.create(mmi(FLEET, routing={"mode": "inferencePool"}, autoscaling=AUTOSCALING))
    fleet.wait_condition(FLEET, "RoutingReady", status="True", timeout=90)
    with serve_pool(cluster, fleet, FLEET, {}, logs, None) as routed:
        routed.network.reach_from_host()

        # One replica for minReplicas 1 and one more, put to sleep and taken out of the picker's pool.
        (server,), (sleeper,) = wait_split(fleet, routed, serving=1, asleep=1)
        assert fleet.deployment(FLEET).spec.replicas == 2
        # The picker learns of the relabelled sleeper through its own watch: once its pool counts one pod, it has.
        wait_for(lambda: pool_ready_pods(routed) == 1, 30, lambda: f"the picker's pool of one\n{routed.why()}")
        assert endpoints(routed) == {routed.endpoint(server)}, "a request reached the sleeping replica"
        shown = wait_for(lambda: (fleet.status(FLEET).get("standby") or {}).get("asleep") == 1 or None, 30, "status")
        assert shown

        # Two replicas wanted: the sleeping one is woken and serves; a third pod starts and takes its place asleep.
        fleet.patch(FLEET, {"autoscaling": {**AUTOSCALING, "minReplicas": 2}})
        serving, asleep = wait_split(fleet, routed, serving=2, asleep=1)
        assert sleeper in serving, "the sleeping replica was woken, not replaced by a cold start"
        assert asleep[0] not in (server, sleeper)
        assert fleet.deployment(FLEET).spec.replicas == 3
        woke = wait_for(lambda: fleet.events(FLEET, "WokeStandby"), 30, "the WokeStandby event")
        assert any(routed.pods[sleeper] in message for message in woke), woke
        wait_for(lambda: endpoints(routed) == {routed.endpoint(ip) for ip in serving} or None, 60, "both serve")
        standby = fleet.status(FLEET)["standby"]
        assert standby["wakes"] >= 1 and standby["wake"].endswith("s"), standby
        ready = fleet.condition(FLEET, "Ready")
        assert (ready["status"], fleet.status(FLEET)["desiredReplicas"]) == ("True", 3), ready

        # Standby off: the Deployment gives the standby's replica back (the sleeping pod first: its deletion cost is
        # the lowest) and rolls out servers without sleep mode; nothing is left asleep or out of routing.
        fleet.patch(FLEET, {"autoscaling": {**AUTOSCALING, "minReplicas": 2, "warmStandby": None}})
        wait_for(lambda: fleet.deployment(FLEET).spec.replicas == 2, 60, "the standby's replica given back")

        def rolled_out() -> bool:
            serve_new_pods(fleet, routed)
            pods = live_pods(fleet)
            out = [p.metadata.name for p in pods if (p.metadata.labels or {}).get(SERVING_LABEL) == "false"]
            awake = [is_sleeping(routed, p.status.pod_ip) is False for p in pods]
            return len(pods) == 2 and not out and all(awake) and "standby" not in fleet.status(FLEET)

        wait_for(rolled_out, 120, lambda: f"two pods serving, none asleep: {fleet.status(FLEET)}")
        wait_for(lambda: len(endpoints(routed)) == 2 or None, 60, "both serve through the picker")
