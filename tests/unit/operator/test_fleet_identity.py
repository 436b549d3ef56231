"""Which Deployment and pods are a fleet's: anyone who may create one can give it the fleet's labels (issue 23, item 6).

Before, status and the autoscaler read whatever the indexes held under the fleet's label: a decoy pod in a crash
loop made the fleet Degraded, and after a restart a decoy Deployment was read as the fleet's.
"""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import pytest

from mmfleet.handlers import autoscale, children, reconcile, records
from mmfleet.render import INFERENCE_LABEL
from tests.helpers.operator_state import KEY, RecordingKube, fleet_body, fleet_event, indexes, operator, workers
from tests.helpers.wait import until

UID = "u-1"  # fleet_body's
LABELS = {INFERENCE_LABEL: KEY[1], "app.kubernetes.io/managed-by": "mmfleet"}
CRASHING = {"containerStatuses": [{"name": "server", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}


def controller(kind: str, name: str, uid: str, api_version: str = "apps/v1") -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": True}


def deployment(name: str, *owners: dict[str, Any], replicas: int = 2, ready: int = 2) -> dict[str, Any]:
    """A Deployment as the API server sends it to the watch, and as the index keeps it."""
    meta = {"name": name, "namespace": KEY[0], "uid": f"d-{name}", "generation": 1, "labels": LABELS}
    counts = {"replicas": replicas, "readyReplicas": ready, "updatedReplicas": replicas, "observedGeneration": 1}
    raw = {"metadata": {**meta, "ownerReferences": list(owners)}, "spec": {"replicas": replicas}, "status": counts}
    body = kopf.Body(raw)
    return asyncio.run(children.fleet_deployments(KEY[0], body.metadata.labels, body))[KEY]


def pod(name: str, *owners: dict[str, Any], template_hash: str = "7d9f", **status: Any) -> dict[str, Any]:
    """A pod as the API server sends it to the watch, and as the index keeps it."""
    labels = {INFERENCE_LABEL: KEY[1], "pod-template-hash": template_hash}
    meta = {"name": name, "namespace": KEY[0], "uid": f"p-{name}", "labels": labels, "ownerReferences": list(owners)}
    body = kopf.Body({"metadata": meta, "status": {"phase": "Running", **status}})
    return asyncio.run(children.fleet_pods(KEY[0], body.metadata.labels, body))[KEY]


OURS = controller("MultimodalInference", KEY[1], UID, "mmfleet.io/v1alpha1")
REPLICA_SET = controller("ReplicaSet", "qwen-7d9f", "rs-1")


def test_the_indexes_keep_who_controls_a_deployment_and_which_deployments_replica_set_controls_a_pod() -> None:
    assert deployment("qwen", OURS)["metadata"]["controller"] == UID
    assert deployment("decoy")["metadata"]["controller"] is None
    assert pod("qwen-7d9f-a", REPLICA_SET)["metadata"]["deployment"] == "qwen"
    # Another Deployment's ReplicaSet (its name is that Deployment's and the hash), not a ReplicaSet, no controller,
    # a ReplicaSet of another API group, a name that does not end in the pod's hash: none is the fleet's pod.
    assert pod("x", controller("ReplicaSet", "qwen-decoy-7d9f", "rs-2"))["metadata"]["deployment"] == "qwen-decoy"
    for owners in (
        [controller("Job", "qwen-7d9f", "j")],
        [],
        [{**REPLICA_SET, "controller": False}],
        [controller("ReplicaSet", "qwen-7d9f", "rs-3", "example.com/v1")],
        [controller("ReplicaSet", "qwen-7d9f", "rs-4")],
    ):
        template_hash = "other" if owners and owners[0]["uid"] == "rs-4" else "7d9f"
        assert pod("x", *owners, template_hash=template_hash)["metadata"]["deployment"] is None, owners


def held_with_decoys(autoscaling: bool = False) -> dict[str, Any]:
    """The fleet's Deployment (2 of 2 ready) and pods, each after a decoy with the fleet's labels, in the indexes."""
    held = indexes(fleet_body(autoscaling=autoscaling))
    forged = controller("MultimodalInference", KEY[1], UID, "mmfleet.io/v1alpha1")  # names the fleet, not its name
    held["fleet_deployments"][KEY] = [
        deployment("decoy", replicas=8, ready=0),
        deployment("qwen-2", forged, replicas=8, ready=0),
        deployment("qwen", OURS),
    ]
    held["fleet_pods"][KEY] = [
        pod("decoy", **CRASHING),  # no owner: made by hand
        pod("decoy-rs", controller("ReplicaSet", "decoy-7d9f", "rs-9"), **CRASHING),  # another Deployment's
        pod("qwen-7d9f-a", REPLICA_SET),
        pod("qwen-7d9f-b", REPLICA_SET),
    ]
    return held


def test_only_the_fleets_own_deployment_and_pods_are_read_and_a_namesake_reads_none_of_its_predecessors() -> None:
    held = held_with_decoys()
    found, pods = children.fleet_children(held, KEY, UID)
    assert found is not None and found["metadata"]["name"] == "qwen"
    assert [p["metadata"]["name"] for p in pods] == ["qwen-7d9f-a", "qwen-7d9f-b"]
    # A fleet deleted and created again under the same name has a new uid: the old one's Deployment (going with its
    # owner) is not its own, nor are that Deployment's pods.
    assert children.fleet_children(held, KEY, "u-2") == (None, [])
    # A Deployment of the fleet's name made by someone else: not the fleet's (its reconcile refuses to apply).
    held["fleet_deployments"][KEY] = [deployment("qwen", controller("Deployment", "web", "w"))]
    assert children.fleet_children(held, KEY, UID) == (None, [])


def test_decoys_with_the_fleets_labels_never_make_it_degraded_nor_count_as_its_replicas(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As after a restart: the indexes hold decoys (listed first) when the fleet is first reconciled."""
    monkeypatch.setattr(reconcile, "FIRST_STATUS_WAIT", 0.0)
    monkeypatch.setattr(records, "kopf_event", lambda *_: None)  # kopf posts events only inside its handlers
    kube = RecordingKube()
    kube.ready = False  # the apply's answer: none ready yet; the refresh then reads 2 of 2 from the indexes
    op = operator(kube, workers=1)
    held = held_with_decoys(autoscaling=True)

    async def scenario() -> None:
        async with workers(op, held):
            await fleet_event(op, fleet_body(autoscaling=True))
            await until(lambda: op.records[KEY].reconciled == 2 and bool(kube.written), what="the apply")
            written = len(kube.written)
            assert op.queue is not None
            op.queue.add(KEY)  # a pod's event: the status refreshed from the indexes
            await until(lambda: len(kube.written) > written, what="the refresh")

    asyncio.run(scenario())
    status = kube.written[-1]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (status["phase"], status["readyReplicas"], status["replicas"]) == ("Ready", 2, 2), status
    assert (degraded["status"], degraded["reason"]) == ("False", "AsExpected")
    # Autoscaling on, the replicas handed over to the scaler (before the apply) are the fleet's, not a decoy's 8.
    assert kube.scaled[:1] == [2] and 8 not in kube.scaled


def test_the_autoscaler_reads_the_fleets_own_deployment_and_pods_and_a_namesake_none() -> None:
    held = held_with_decoys()
    held["fleets"][KEY] = [fleet_body(autoscaling=True)]
    (view,) = autoscale.autoscaled_fleets(held)
    assert view.deployment is not None and view.deployment["spec"]["replicas"] == 2  # not the decoys' 8
    assert autoscale.cycle.count_pods(view.pods) == autoscale.cycle.count_pods(held["fleet_pods"][KEY][2:])
    held["fleets"][KEY] = [fleet_body(autoscaling=True, uid="u-2")]
    (view,) = autoscale.autoscaled_fleets(held)
    assert (view.deployment, view.pods) == (None, []), "not scaled: it has no Deployment of its own yet"
