"""The reconcile against objects it does not own, writes the API server refuses, and requests that hang."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import kopf
import pytest
import urllib3
from kubernetes import client

from mmfleet import kube as kube_module
from mmfleet import status
from mmfleet.config import OperatorConfig
from mmfleet.handlers import autoscale, fleet, state
from mmfleet.handlers.state import STATE
from mmfleet.kube import Kube, RefusedError, lease_namespace, timed

pytestmark = pytest.mark.usefixtures("fresh_operator_state")

UID = "fleet-uid"


def body(generation: int = 1) -> dict[str, Any]:
    spec = {"model": {"name": "Qwen/Qwen2.5-VL-7B-Instruct"}, "cloud": "eks", "replicas": 1}
    meta = {"name": "qwen", "namespace": "ml", "uid": UID, "generation": generation}
    return {"apiVersion": "mmfleet.io/v1alpha1", "kind": "MultimodalInference", "metadata": meta, "spec": spec}


class FakeKube(Kube):
    """Objects that exist by (kind, name); applies recorded, or refused with ``refuse`` (a status and message)."""

    def __init__(self, existing: dict[tuple[str, str], dict[str, Any]] | None = None) -> None:
        self.existing = existing or {}
        self.applied: list[dict[str, Any]] = []
        self.written: list[dict[str, Any]] = []
        self.got: list[tuple[str, str]] = []
        self.refuse: tuple[int, str] | None = None

    def apply(self, manifest: dict[str, Any], manager: str = "mmfleet") -> dict[str, Any]:
        if self.refuse is not None and manifest["kind"] == "Deployment":
            raise RefusedError(*self.refuse)
        self.applied.append(manifest)
        meta = {**manifest["metadata"], "uid": f"uid-{manifest['kind']}", "generation": 1}
        return {**manifest, "metadata": meta}

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        self.got.append((kind, name))
        return self.existing.get((kind, name))

    def has_api(self, api_version: str, kind: str) -> bool:
        return False

    def scale(self, namespace: str, name: str, replicas: int, manager: str = "") -> None:
        raise AssertionError("nothing to scale without autoscaling")

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.written.append(status)

    def thread_requests(self) -> int:
        return 0


@pytest.fixture(autouse=True)
def events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """The events the status writes post, as (type, reason); kopf posts only inside its own handlers."""
    posted: list[tuple[str, str]] = []
    monkeypatch.setattr(state, "kopf_event", lambda body, type_, reason, message: posted.append((type_, reason)))
    return posted


def degraded(written: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in written["conditions"] if c["type"] == "Degraded")


def test_who_controls_a_live_object_of_a_childs_name() -> None:
    ours = {"metadata": {"ownerReferences": [{"kind": "MultimodalInference", "uid": UID, "controller": True}]}}
    assert fleet.foreign_owner(None, UID) is None  # the name is free
    assert fleet.foreign_owner(ours, UID) is None
    assert fleet.foreign_owner({"metadata": {}}, UID) == "no controller (created by hand or by another tool)"
    other = {"metadata": {"ownerReferences": [{"kind": "Deployment", "name": "web", "uid": "u2", "controller": True}]}}
    assert fleet.foreign_owner(other, UID) == "Deployment web (uid u2)"
    # Only a controller reference makes it ours: a plain owner reference to the fleet is not enough.
    shared = {"metadata": {"ownerReferences": [{"kind": "MultimodalInference", "uid": UID}]}}
    assert fleet.foreign_owner(shared, UID) is not None


def test_a_service_account_of_the_fleets_name_made_by_someone_else_is_never_applied_over(
    events: list[tuple[str, str]],
) -> None:
    kube = FakeKube({("ServiceAccount", "qwen"): {"metadata": {"name": "qwen"}}})
    STATE.kube = kube
    with pytest.raises(kopf.PermanentError, match="ChildNotOwned"):
        fleet.reconcile(body(), [], None, prune=False)
    assert kube.applied == []  # not the ServiceAccount, nor a Deployment that would run as it
    condition = degraded(kube.written[-1])
    assert (condition["status"], condition["reason"]) == ("True", "ChildNotOwned")
    assert "ServiceAccount ml/qwen already exists with no controller" in condition["message"]
    assert "metadata.name (now qwen)" in condition["message"]
    assert kube.written[-1]["phase"] == "Degraded"
    assert ("Warning", "ChildNotOwned") in events
    assert ("ml", "qwen") in STATE.refused and ("ml", "qwen") in STATE.retries

    # The autoscaler leaves the fleet alone: its Deployment may be someone else's.
    autoscaled = {**body(), "spec": {**body()["spec"], "autoscaling": {"minReplicas": 1, "maxReplicas": 4}}}
    view = autoscale.FleetView(("ml", "qwen"), autoscaled, {"spec": {"replicas": 1}}, [])
    decided: list[Any] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(autoscale, "_autoscale_fleet", lambda *args: decided.append(args) or (False, False))
        autoscale.autoscale([view], None, _Inline(), lambda key: (None, []))
    assert decided == []

    # Once the ServiceAccount is gone, the retry applies everything and clears the condition.
    del kube.existing[("ServiceAccount", "qwen")]
    fleet.reconcile(body(), [], None, prune=False)
    assert [m["kind"] for m in kube.applied][:1] == ["ServiceAccount"]
    assert degraded(kube.written[-1])["reason"] != "ChildNotOwned"
    assert ("ml", "qwen") not in STATE.refused and ("ml", "qwen") not in STATE.retries


class _Inline:
    """A thread pool that runs in the caller's thread."""

    def map(self, fn: Any, items: Any) -> Iterator[Any]:
        return map(fn, items)


def test_children_are_looked_up_once_then_trusted_from_memory() -> None:
    kube = FakeKube()
    STATE.kube = kube
    fleet.reconcile(body(), [], None, prune=False)
    first = len(kube.got)
    assert first == len(kube.applied)  # one read per child before its first apply
    fleet.reconcile(body(), [], None, prune=False)
    assert len(kube.got) == first


def test_a_write_the_api_server_refuses_is_a_condition_naming_the_child_and_is_retried_with_backoff() -> None:
    kube = FakeKube()
    kube.refuse = (422, 'Deployment.apps "qwen" is invalid: spec.template.spec.nodeSelector: Invalid value: "a b"')
    STATE.kube = kube
    with pytest.raises(kopf.PermanentError, match="ApplyRefused"):  # kopf does not retry a permanent error
        fleet.reconcile(body(), [], None, prune=False)
    condition = degraded(kube.written[-1])
    assert condition["reason"] == "ApplyRefused"
    assert "(422): applying Deployment ml/qwen: " in condition["message"]
    assert "spec.template.spec.nodeSelector: Invalid value" in condition["message"]
    first = STATE.retries[("ml", "qwen")]
    with pytest.raises(kopf.PermanentError):
        fleet.reconcile(body(), [], None, prune=False)
    assert STATE.retries[("ml", "qwen")].attempts == first.attempts + 1
    assert len(kube.written) == 1, "the same refusal again writes nothing new"
    delays = [fleet.retry_delay(n) for n in range(20)]
    assert delays[0] == fleet.RETRY_FIRST_SECONDS and delays == sorted(delays)
    assert max(delays) == fleet.RETRY_MAX_SECONDS


def test_a_failed_drift_repair_is_retried_by_the_retry_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf never retries an event handler: the repair's failure must leave a retry behind."""
    calls: list[str] = []

    def flaky(parent: dict[str, Any], pods: Any, deployment: Any, prune: bool) -> None:
        calls.append(parent["metadata"]["name"])
        if len(calls) == 1:
            raise kube_module.RetryableError("503 Service Unavailable")
        STATE.retries.pop(("ml", "qwen"), None)  # as a successful reconcile does

    monkeypatch.setattr(fleet, "reconcile", flaky)
    monkeypatch.setattr(fleet, "RETRY_FIRST_SECONDS", 0.05)
    monkeypatch.setattr(fleet, "RETRY_TICK_SECONDS", 0.02)
    indexes: dict[str, Any] = {
        "fleets": {("ml", "qwen"): [body()]},
        "fleet_deployments": {},
        "fleet_pods": {},
    }
    labels = {fleet.INFERENCE_LABEL: "qwen"}
    deleted: kopf.RawEvent = {"type": "DELETED", "object": {"kind": "Service", "metadata": {"name": "qwen"}}}  # type: ignore[typeddict-item]

    async def scenario() -> None:
        await fleet.observe_child(deleted, "ml", labels, indexes)
        assert ("ml", "qwen") in STATE.retries
        loop = asyncio.create_task(fleet.retry_forever(indexes))
        deadline = time.monotonic() + 5
        while len(calls) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        loop.cancel()

    asyncio.run(scenario())
    assert calls == ["qwen", "qwen"]
    assert ("ml", "qwen") not in STATE.retries


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


def test_leader_election_settings_name_the_variable_and_the_rule() -> None:
    assert OperatorConfig.load().leader_election_lease == ""  # off unless asked for (the chart asks)
    assert OperatorConfig.load(leader_election_lease="mmfleet-operator").leader_election_lease == "mmfleet-operator"
    with pytest.raises(ValueError, match="MMFLEET_LEADER_ELECTION_LEASE: 'Not A Name': not an object name"):
        OperatorConfig.load(leader_election_lease="Not A Name")
    assert lease_namespace("ops") == "ops"


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
