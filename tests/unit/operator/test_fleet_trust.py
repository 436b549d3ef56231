"""The reconcile against objects it does not own, writes the API server refuses, and requests that hang."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import urllib3
from kubernetes import client

from mmfleet import kube as kube_module
from mmfleet import status
from mmfleet.handlers import autoscale, children, memo, reconcile, records, triggers
from mmfleet.kube import Kube, timed
from mmfleet.render import INFERENCE_LABEL
from tests.helpers.operator_state import KEY, RecordingKube, fleet_body, indexes, operator, reconcile_once, workers
from tests.helpers.wait import until

UID = "fleet-uid"


def body(generation: int = 1) -> dict[str, Any]:
    return fleet_body(generation=generation, replicas=1, uid=UID)


@pytest.fixture(autouse=True)
def events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """The events the status writes post, as (type, reason); kopf posts only inside its own handlers."""
    posted: list[tuple[str, str]] = []
    monkeypatch.setattr(records, "kopf_event", lambda body, type_, reason, message: posted.append((type_, reason)))
    return posted


def degraded(written: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in written["conditions"] if c["type"] == "Degraded")


def test_who_controls_a_live_object_of_a_childs_name() -> None:
    ours = {"metadata": {"ownerReferences": [{"kind": "MultimodalInference", "uid": UID, "controller": True}]}}
    assert children.foreign_owner(None, UID) is None  # the name is free
    assert children.foreign_owner(ours, UID) is None
    assert children.foreign_owner({"metadata": {}}, UID) == "no controller (created by hand or by another tool)"
    other = {"metadata": {"ownerReferences": [{"kind": "Deployment", "name": "web", "uid": "u2", "controller": True}]}}
    assert children.foreign_owner(other, UID) == "Deployment web (uid u2)"
    # Only a controller reference makes it ours: a plain owner reference to the fleet is not enough.
    shared = {"metadata": {"ownerReferences": [{"kind": "MultimodalInference", "uid": UID}]}}
    assert children.foreign_owner(shared, UID) is not None


def test_a_service_account_of_the_fleets_name_made_by_someone_else_is_never_applied_over(
    events: list[tuple[str, str]],
) -> None:
    kube = RecordingKube()
    kube.existing[("ServiceAccount", "qwen")] = {"metadata": {"name": "qwen"}}
    op = operator(kube)
    result = reconcile_once(op, body())
    assert (result.outcome, result.retry) == ("refused", True)
    assert kube.applied == []  # not the ServiceAccount, nor a Deployment that would run as it
    condition = degraded(kube.written[-1])
    assert (condition["status"], condition["reason"]) == ("True", "ChildNotOwned")
    assert "ServiceAccount ml/qwen already exists with no controller" in condition["message"]
    assert "metadata.name (now qwen)" in condition["message"]
    assert kube.written[-1]["phase"] == "Degraded"
    assert ("Warning", "ChildNotOwned") in events
    assert op.records[KEY].refused is not None

    # The autoscaler leaves the fleet alone: its Deployment may be someone else's.
    autoscaled = {**body(), "spec": {**body()["spec"], "autoscaling": {"minReplicas": 1, "maxReplicas": 4}}}
    view = autoscale.FleetView(("ml", "qwen"), autoscaled, {"spec": {"replicas": 1}}, [])
    decided: list[Any] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(autoscale, "_autoscale_fleet", lambda *args: decided.append(args) or (False, False))
        autoscale.autoscale(op, [view], None, _Inline(), lambda *_: (None, []))
    assert decided == []

    # Once the ServiceAccount is gone, the retry applies everything and clears the condition.
    del kube.existing[("ServiceAccount", "qwen")]
    assert not reconcile_once(op, body()).retry
    assert [m["kind"] for m in kube.applied][:1] == ["ServiceAccount"]
    assert degraded(kube.written[-1])["reason"] != "ChildNotOwned"
    assert op.records[KEY].refused is None


class _Inline:
    """A thread pool that runs in the caller's thread."""

    def map(self, fn: Any, items: Any) -> Iterator[Any]:
        return map(fn, items)


def test_children_are_looked_up_once_then_trusted_from_memory() -> None:
    kube = RecordingKube()
    op = operator(kube)
    reconcile_once(op, body())
    first = len(kube.got)
    assert first == len(kube.applied)  # one read per child before its first apply
    op.records[KEY].drifted = True  # a child edited by hand: everything is applied again
    reconcile_once(op, body())
    assert len(kube.got) == first and len(kube.applied) == 2 * first


def test_a_write_the_api_server_refuses_is_a_condition_naming_the_child_and_is_retried_with_backoff() -> None:
    kube = RecordingKube()
    kube.refuse = (422, 'Deployment.apps "qwen" is invalid: spec.template.spec.nodeSelector: Invalid value: "a b"')
    op = operator(kube)
    assert reconcile_once(op, body()).retry, "retried: the cause may be outside the spec (a webhook, a quota)"
    condition = degraded(kube.written[-1])
    assert condition["reason"] == "ApplyRefused"
    assert "(422): applying Deployment ml/qwen: " in condition["message"]
    assert "spec.template.spec.nodeSelector: Invalid value" in condition["message"]
    assert reconcile_once(op, body()).retry
    assert len(kube.written) == 1, "the same refusal again writes nothing new"
    delays = [reconcile.retry_delay(n) for n in range(20)]
    assert delays[0] == reconcile.RETRY_FIRST_SECONDS and delays == sorted(delays)
    assert max(delays) == reconcile.RETRY_MAX_SECONDS


def test_a_deleted_child_is_repaired_and_a_failed_repair_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The repair goes through the queue like any reconcile: its failure backs off and is tried again."""
    monkeypatch.setattr(reconcile, "RETRY_FIRST_SECONDS", 0.05)
    kube = RecordingKube()
    op = operator(kube, workers=2)
    held = indexes(body())
    labels = {INFERENCE_LABEL: "qwen"}
    deleted: Any = {
        "type": "DELETED",
        "object": {"kind": "Service", "metadata": {"name": "qwen", "uid": "uid-Service"}},
    }

    async def scenario() -> None:
        async with workers(op, held):
            await triggers.on_fleet_event({"type": "ADDED", "object": body()}, *KEY, body()["metadata"], memo(op))  # type: ignore[arg-type]
            await until(lambda: op.records[KEY].reconciled == 1, what="the first apply")
            applied = len(kube.applied)
            kube.fault = kube_module.RetryableError("503 Service Unavailable")
            await triggers.on_child_event(deleted, KEY[0], labels, memo(op), **held)
            await until(lambda: op.records[KEY].retrying is not None, what="the failed repair")
            kube.fault = None
            await until(lambda: op.records[KEY].retrying is None, what="the repair, tried again")
            kinds = [m["kind"] for m in kube.applied[applied:]]
            assert kinds.count("ServiceAccount") == 2 and kinds.count("Service") == 1, "tried twice, then whole"

    asyncio.run(scenario())


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A TCP server that accepts connections and never answers: a hung API server."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_a_hung_api_server_fails_a_call_within_the_timeout_instead_of_holding_it(
    silent_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kube_module, "REQUEST_TIMEOUT", (0.5, 0.5))
    configuration = client.Configuration()
    configuration.host = silent_server
    outcome: list[BaseException | None] = []

    def call() -> None:
        try:  # the dynamic client asks /version first, then discovery, then the list: each must time out
            Kube(timed(client.ApiClient(configuration))).list_objects("v1", "Node")
            outcome.append(None)
        except BaseException as error:  # what failed is the assertion's business
            outcome.append(error)

    started = time.monotonic()
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(timeout=15)
    assert not thread.is_alive(), "the call still hangs after 15 s"
    assert isinstance(outcome[0], urllib3.exceptions.HTTPError), outcome
    assert time.monotonic() - started < 15


def test_pods_a_quota_refused_count_as_refused_and_name_the_quota() -> None:
    message = 'pods "q-1" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=1, used: 1, limited: 1'
    failure = {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": message}
    deployment = {"spec": {"replicas": 3}, "status": {"replicas": 1, "conditions": [failure]}}
    count, why = status.refused_pods(deployment)
    assert count == 2 and "exceeded quota: gpus" in why
    assert status.replica_failure(deployment) == (
        "QuotaExceeded",
        f"the Deployment's pods cannot be created: {message}",
    )
    webhook = {**failure, "message": "admission webhook denied the request"}
    assert status.replica_failure({"status": {"conditions": [webhook]}}) == (
        "FailedCreate",
        f"the Deployment's pods cannot be created: {webhook['message']}",
    )
    assert status.refused_pods({"spec": {"replicas": 3}, "status": {"replicas": 1}}) == (0, "")


def test_a_hand_edit_seen_while_the_fleet_is_applied_is_applied_over_by_the_next_reconcile() -> None:
    """The edit's event comes while a repair applies (it cannot have restored the edit it had not seen): the key is
    queued again, and that reconcile applies, however the running one ends."""
    kube = RecordingKube()
    op = operator(kube, workers=2)
    held = indexes(body())
    labels = {INFERENCE_LABEL: "qwen"}
    applying, release = threading.Event(), threading.Event()
    apply = kube.apply

    def held_apply(manifest: dict[str, Any], manager: str = "mmfleet") -> dict[str, Any]:
        if manifest["kind"] == "Deployment" and op.records[KEY].reconciled is not None and not release.is_set():
            applying.set()
            release.wait(5)
        return apply(manifest, manager)

    kube.apply = held_apply  # type: ignore[method-assign]
    deleted: Any = {
        "type": "DELETED",
        "object": {"kind": "Service", "metadata": {"name": "qwen", "uid": "uid-Service"}},
    }
    edited: Any = {
        "type": "MODIFIED",
        "object": {"kind": "Deployment", "metadata": {"name": "qwen", "uid": "uid-Deployment", "generation": 5},
                   "spec": {"paused": True}},
    }  # fmt: skip

    async def scenario() -> None:
        async with workers(op, held):
            await triggers.on_fleet_event({"type": "ADDED", "object": body()}, *KEY, body()["metadata"], memo(op))  # type: ignore[arg-type]
            await until(lambda: op.records[KEY].reconciled == 1, what="the first apply")
            await triggers.on_child_event(deleted, KEY[0], labels, memo(op), **held)
            await until(applying.is_set, what="the repair applying the Deployment")
            await triggers.on_child_event(edited, KEY[0], labels, memo(op), **held)
            release.set()
            deployments = lambda: [m for m in kube.applied if m["kind"] == "Deployment"]  # noqa: E731
            await until(lambda: len(deployments()) == 3, what="the edit applied over")
            await until(lambda: not op.records[KEY].drifted, what="the fleet settled")

    asyncio.run(scenario())
