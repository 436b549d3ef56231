"""The fleets' children as the watches show them: kopf's indexes, and how a change to a child is judged.

The indexes keep only what status and drift need: at 1,000 fleets, whole bodies (managedFields,
kopf's annotations, pod specs) would be most of the operator's memory. They are async, so kopf
calls them on its event loop: a sync one costs a hop to a worker thread on every watch event.

They are keyed by the fleet's label, which anyone who may create a Deployment or a pod can put on one: what they
hold is read through ``fleet_children``, which keeps only the fleet's own (by owner references and uids).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import kopf

from mmfleet.handlers.records import Body, Fingerprint, Key, operator_of
from mmfleet.kube import AUTOSCALER_FIELD_MANAGER
from mmfleet.render import FIELD_MANAGER, INFERENCE_LABEL

CHILD_LABELS: dict[str, Any] = {
    INFERENCE_LABEL: kopf.PRESENT,
    "app.kubernetes.io/managed-by": "mmfleet",
}
POD_LABELS: dict[str, Any] = {INFERENCE_LABEL: kopf.PRESENT}
# (group, version, plural) of every kind a fleet's children or pods come in: each is watched.
CHILD_KINDS = (
    ("apps", "v1", "deployments"),
    ("", "v1", "services"),
    ("", "v1", "serviceaccounts"),
    ("", "v1", "configmaps"),
    ("policy", "v1", "poddisruptionbudgets"),
    ("networking.k8s.io", "v1", "networkpolicies"),
    ("", "v1", "pods"),
)
INDEXES = ("fleets", "fleet_deployments", "fleet_pods")
# The label the Deployment controller puts on a ReplicaSet's pods; the ReplicaSet's name ends in it.
POD_TEMPLATE_HASH = "pod-template-hash"


def _replicas_set_by_others(obj: Mapping[str, Any]) -> bool:
    """Whether a manager other than the operator's two (its apply, the autoscaler's scale) owns ``spec.replicas``."""
    return any(
        entry.get("manager") not in (FIELD_MANAGER, AUTOSCALER_FIELD_MANAGER)
        and "f:replicas" in (entry.get("fieldsV1") or {}).get("f:spec", {})
        for entry in obj.get("metadata", {}).get("managedFields") or []
    )


def _spec_digest(obj: Mapping[str, Any]) -> str:
    """The spec, with replicas only when someone else set them: the operator's own scales are not edits (its apply
    leaves replicas to the autoscaler, whose scale then bumps the generation), ``kubectl scale`` is."""
    spec = dict(obj.get("spec") or {})
    if not _replicas_set_by_others(obj):
        spec.pop("replicas", None)
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()


def fingerprint(obj: Mapping[str, Any]) -> Fingerprint:
    """Generation and spec digest where the kind has one (it moves only on spec changes), else the resourceVersion."""
    meta = obj.get("metadata", {})
    generation = meta.get("generation")
    return (int(generation), _spec_digest(obj)) if generation else (0, str(meta.get("resourceVersion") or ""))


def edited_by_hand(obj: Mapping[str, Any], applied: Fingerprint | None) -> bool:
    """Changed since our last apply (``applied``, its fingerprint): late events about older generations and the
    autoscaler's own scale (a new generation with the same spec but replicas) do not count."""
    if applied is None:
        return False
    current = fingerprint(obj)
    if applied[0]:
        return current[0] > applied[0] and current[1] != applied[1]
    return current[1] != applied[1]


def controller_of(meta: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The controller owner reference in an object's metadata (the API server allows at most one), if any."""
    return next((r for r in meta.get("ownerReferences") or [] if r.get("controller")), None)


def foreign_owner(live: Mapping[str, Any] | None, uid: str | None) -> str | None:
    """Who controls a live object that has a child's name, when it is not the fleet of ``uid``; None when the name
    is free or the object is the fleet's own (its controller owner reference carries the fleet's uid)."""
    if live is None:
        return None
    controller = controller_of(live.get("metadata") or {})
    if controller is None:
        return "no controller (created by hand or by another tool)"
    if uid and controller.get("uid") == uid:
        return None
    return f"{controller.get('kind')} {controller.get('name')} (uid {controller.get('uid')})"


def deployment_of_pod(meta: Mapping[str, Any]) -> str | None:
    """The name of the Deployment whose ReplicaSet controls a pod, from the pod alone; None for any other pod.

    The Deployment controller names each of its ReplicaSets ``<deployment>-<pod-template-hash>`` and labels their
    pods with that hash, and a name is unique in its namespace. A pod made by hand, or by any other controller, does
    not pass; one naming a ReplicaSet that does not exist (or has another uid) is deleted by the garbage collector.
    A ReplicaSet made by hand under such a name, controlling pods of its own, would pass: telling it apart needs the
    ReplicaSets themselves (a watch of its own, or a read per ReplicaSet), which the operator does not pay for.
    """
    controller = controller_of(meta)
    template_hash = (meta.get("labels") or {}).get(POD_TEMPLATE_HASH)
    if controller is None or controller.get("apiVersion") != "apps/v1" or controller.get("kind") != "ReplicaSet":
        return None
    suffix = f"-{template_hash}"
    name = str(controller.get("name") or "")
    return name.removesuffix(suffix) if template_hash and name.endswith(suffix) else None


def scaler_owns_replicas(deployment: Body) -> bool:
    if "scalerOwnsReplicas" in deployment.get("metadata", {}):
        return bool(deployment["metadata"]["scalerOwnsReplicas"])
    for entry in deployment.get("metadata", {}).get("managedFields") or []:
        fields = entry.get("fieldsV1") or {}
        if entry.get("manager") == AUTOSCALER_FIELD_MANAGER and "f:replicas" in fields.get("f:spec", {}):
            return True
    return False


def indexed(indexes: Mapping[str, Any], name: str, key: Key) -> list[Body]:
    """What index ``name`` holds for the fleet ``key`` (kopf injects indexes as keyword arguments by their ids)."""
    index: kopf.Index[Key, Body] = indexes[name]
    return list(index.get(key, []))


def first(indexes: Mapping[str, Any], name: str, key: Key) -> Body | None:
    found = indexed(indexes, name, key)
    return found[0] if found else None


def fleet_children(indexes: Mapping[str, Any], key: Key, uid: str | None) -> tuple[Body | None, list[Body]]:
    """The Deployment and the pods of the fleet ``key`` whose uid is ``uid``, among those that carry its label.

    The Deployment is the one named after the fleet (as rendered) whose controller is the fleet of this uid: not a
    decoy with the fleet's labels, nor one a namesake fleet deleted before left. The pods are those its ReplicaSets
    control (``deployment_of_pod``); with no Deployment of its own, the fleet has none.
    """
    name = key[1]
    deployment = next(
        (
            d
            for d in indexed(indexes, "fleet_deployments", key)
            if uid and d["metadata"].get("name") == name and d["metadata"].get("controller") == uid
        ),
        None,
    )
    if deployment is None:
        return None, []
    return deployment, [p for p in indexed(indexes, "fleet_pods", key) if p["metadata"].get("deployment") == name]


def _slim_meta(meta: kopf.Meta, *keys: str) -> Body:
    return {k: meta[k] for k in ("name", "namespace", "uid", "generation", "deletionTimestamp", *keys) if k in meta}


async def fleets(namespace: str | None, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> dict[Key, Body]:
    operator_of(memo).remember_kopf_context()  # indexed before any loop of the operator's own sees a fleet
    slim = {k: body[k] for k in ("apiVersion", "kind", "spec", "status") if k in body}
    return {(namespace or "", name): {**slim, "metadata": _slim_meta(body.meta, "labels")}}


async def fleet_deployments(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Key, Body]:
    meta = _slim_meta(body.meta)
    meta["scalerOwnsReplicas"] = scaler_owns_replicas(dict(body))
    meta["controller"] = (controller_of(body.meta) or {}).get("uid")
    slim = {"metadata": meta, "spec": {"replicas": body.spec.get("replicas")}, "status": dict(body.status)}
    return {(namespace or "", labels[INFERENCE_LABEL]): slim}


async def fleet_pods(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Key, Body]:
    pod_status = body.status
    slim = {
        # The autoscaler measures cold starts from creationTimestamp.
        "metadata": {**_slim_meta(body.meta, "creationTimestamp"), "deployment": deployment_of_pod(body.meta)},
        "status": {k: pod_status[k] for k in ("phase", "conditions", "containerStatuses") if k in pod_status},
    }
    return {(namespace or "", labels[INFERENCE_LABEL]): slim}
