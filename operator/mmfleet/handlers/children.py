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
from collections.abc import Iterable, Mapping
from typing import Any

import kopf

from mmfleet.autoscaler.standby import SLEEP_ANNOTATION
from mmfleet.handlers.records import Body, Fingerprint, Key, operator_of
from mmfleet.kube import AUTOSCALER_FIELD_MANAGER
from mmfleet.render import FIELD_MANAGER, INFERENCE_LABEL, SERVING_LABEL, STANDBY_ANNOTATION

CHILD_LABELS: dict[str, Any] = {
    INFERENCE_LABEL: kopf.PRESENT,
    "app.kubernetes.io/managed-by": "mmfleet",
}
POD_LABELS: dict[str, Any] = {INFERENCE_LABEL: kopf.PRESENT}
# (group, version, plural) of every kind a fleet's children or pods come in: each is watched. The optional ones only
# where their CRD is served (the Prometheus Operator's, the Gateway API Inference Extension's, the Gateway API's):
# kopf watches CRDs, so one installed later is watched from then on.
OPTIONAL_BY_KIND = {
    "PodMonitor": ("monitoring.coreos.com", "v1", "podmonitors"),
    "InferencePool": ("inference.networking.k8s.io", "v1", "inferencepools"),
    "HTTPRoute": ("gateway.networking.k8s.io", "v1", "httproutes"),
}
OPTIONAL_KINDS = tuple(OPTIONAL_BY_KIND.values())
CHILD_KINDS = (
    ("apps", "v1", "deployments"),
    ("", "v1", "services"),
    ("", "v1", "serviceaccounts"),
    ("", "v1", "configmaps"),
    ("policy", "v1", "poddisruptionbudgets"),
    ("networking.k8s.io", "v1", "networkpolicies"),
    ("", "v1", "pods"),
    ("rbac.authorization.k8s.io", "v1", "rolebindings"),
    *OPTIONAL_KINDS,
)


def child_labels(plural: str) -> dict[str, Any]:
    """The labels a watched object of ``plural`` (a CHILD_KINDS kind) must carry for the handlers to take it."""
    return POD_LABELS if plural == "pods" else CHILD_LABELS


INDEXES = ("fleets", "fleet_deployments", "fleet_pods")
# The label the Deployment controller puts on a ReplicaSet's pods; the ReplicaSet's name ends in it.
POD_TEMPLATE_HASH = "pod-template-hash"
OWN_MANAGERS = (FIELD_MANAGER, AUTOSCALER_FIELD_MANAGER)
# A field as a managedFields entry's fieldsV1 names it: ("f:spec", "f:template", ..., 'k:{"name":"server"}', ".").
FieldPath = tuple[str, ...]
# Fields of a child that another manager may set and keep. Replicas: ``kubectl scale`` is judged, and taken back, by
# the operator's own apply or scale (_spec_digest). The timestamp of ``kubectl rollout restart``: Argo CD's and
# KServe's users restart pods that way, and it changes nothing but when they start.
LEFT_TO_OTHERS: tuple[FieldPath, ...] = (
    ("f:spec", "f:replicas"),
    ("f:spec", "f:template", "f:metadata", "f:annotations", "f:kubectl.kubernetes.io/restartedAt"),
)
# Field names an event lists at most; the rest are counted.
NAMED_FIELDS = 10


def _replicas_set_by_others(obj: Mapping[str, Any]) -> bool:
    """Whether a manager other than the operator's two (its apply, the autoscaler's scale) owns ``spec.replicas``."""
    return any(
        entry.get("manager") not in (FIELD_MANAGER, AUTOSCALER_FIELD_MANAGER)
        and "f:replicas" in (entry.get("fieldsV1") or {}).get("f:spec", {})
        for entry in obj.get("metadata", {}).get("managedFields") or []
    )


def _managed_fields(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = obj.get("metadata", {}).get("managedFields") or []
    return entries


def _paths(fields: Mapping[str, Any], prefix: FieldPath = ()) -> set[FieldPath]:
    """The fields a fieldsV1 tree owns: its leaves (``{}``), where ``"."`` is the map or list item itself."""
    found: set[FieldPath] = set()
    for key, below in fields.items():
        found |= _paths(below, (*prefix, key)) if below else {(*prefix, key)}
    return found


def _tree(paths: Iterable[FieldPath]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for path in paths:
        node = root
        for key in path:
            node = node.setdefault(key, {})
    return root


def _left_to_others(path: FieldPath) -> bool:
    """Whether ``path`` is one of LEFT_TO_OTHERS, below one, or a map or item holding one (which, taken, would be
    removed with it)."""
    node = path[:-1] if path[-1] == "." else path
    return any(path[: len(left)] == left or (path[-1] == "." and left[: len(node)] == node) for left in LEFT_TO_OTHERS)


def foreign_fields(obj: Mapping[str, Any]) -> dict[str, set[FieldPath]]:
    """The fields of a child, as applied, that a manager other than the operator's own still owns, by manager.

    Server-side apply takes back only the fields the operator applies: a sidecar container, ``hostNetwork`` or an env
    var added by ``kubectl edit`` is a field the operator never names, and stays. Metadata (labels and annotations
    other tools add), status (its own subresource) and LEFT_TO_OTHERS are left alone; the API server's defaults and
    allocations (a Service's clusterIP and nodePorts) are no manager's, so never count.
    """
    found: dict[str, set[FieldPath]] = {}
    for entry in _managed_fields(obj):
        if entry.get("manager") in OWN_MANAGERS or entry.get("subresource") == "status":
            continue
        paths = {
            path
            for path in _paths(entry.get("fieldsV1") or {})
            if path[0] not in ("f:metadata", "f:status") and not _left_to_others(path)
        }
        if paths:
            found.setdefault(str(entry.get("manager")), set()).update(paths)
    return found


def taken_over(obj: Mapping[str, Any], foreign: Mapping[str, set[FieldPath]]) -> list[dict[str, Any]]:
    """The child's managedFields with ``foreign`` moved from their managers to the operator's apply, so that its next
    apply, which leaves them out, removes them: a field goes when its last manager stops applying it.

    The way kubectl moves fields from client-side to server-side apply (client-go's ``csaupgrade``). Other ways were
    worse: an update (PUT) of the rendered object also drops what other managers legitimately keep (a rollout
    restart's timestamp, replicas ``kubectl scale`` or the autoscaler set) and leaves an Update entry of the
    operator's that co-owns every field, so a field a later spec drops would stay; applying the foreign fields first
    only shares them (a manager keeps a field applied with the value it set), and they stay.
    """
    moved: set[FieldPath] = set().union(*foreign.values())
    entries: list[dict[str, Any]] = []
    ours: dict[str, Any] | None = None
    for entry in _managed_fields(obj):
        if entry.get("manager") == FIELD_MANAGER and entry.get("operation") == "Apply" and not entry.get("subresource"):
            ours = entry
        elif entry.get("manager") in foreign and entry.get("subresource") != "status":
            kept = _paths(entry.get("fieldsV1") or {}) - moved
            if kept:
                entries.append({**entry, "fieldsV1": _tree(kept)})
            continue
        entries.append(entry)
    base = ours or {"manager": FIELD_MANAGER, "operation": "Apply", "apiVersion": obj.get("apiVersion")}
    owned = {**base, "fieldsType": "FieldsV1", "fieldsV1": _tree(_paths(base.get("fieldsV1") or {}) | moved)}
    return [owned if entry is ours else entry for entry in entries] if ours else [*entries, owned]


def _field_name(path: FieldPath) -> str:
    """``spec.template.spec.containers[name=server].env[name=X]`` for a fieldsV1 path."""
    name = ""
    for key in path:
        kind, _, rest = key.partition(":")
        if kind == "f":
            name += f".{rest}" if name else rest
        elif kind == "k":
            name += "[" + ",".join(f"{k}={v}" for k, v in json.loads(rest).items()) + "]"
        else:  # "v:" a member of a set, "i:" an index
            name += f"[{rest}]"
    return name


def field_names(paths: Iterable[FieldPath]) -> list[str]:
    """The fields ``paths`` name, outermost only: a sidecar, not each of its fields."""
    nodes = {path[:-1] if path[-1] == "." else path for path in paths}
    return sorted(_field_name(n) for n in nodes if not any(n[:i] in nodes for i in range(1, len(n))))


def foreign_fields_message(kind: str, where: str, foreign: Mapping[str, set[FieldPath]]) -> str:
    """An event's message: which fields of which child which manager had set; NAMED_FIELDS of them, the rest counted."""
    parts = []
    for manager, paths in sorted(foreign.items()):
        names = field_names(paths)
        more = f" and {len(names) - NAMED_FIELDS} more" if len(names) > NAMED_FIELDS else ""
        parts.append(f"{', '.join(names[:NAMED_FIELDS])}{more} (set by {manager})")
    return f"removed from {kind} {where}, which the operator renders without them: {'; '.join(parts)}"


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
    if applied[0]:  # the spec's digest only once the generation moved: most events are status updates
        generation = int(obj.get("metadata", {}).get("generation") or 0)
        return generation > applied[0] and _spec_digest(obj) != applied[1]
    return fingerprint(obj)[1] != applied[1]


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
    return deployment, deployment_pods(indexes, key, name)


def deployment_pods(indexes: Mapping[str, Any], key: Key, deployment: str) -> list[Body]:
    """The fleet's pods that Deployment ``deployment`` controls (its servers', or its endpoint picker's)."""
    return [p for p in indexed(indexes, "fleet_pods", key) if p["metadata"].get("deployment") == deployment]


def owned_deployment(indexes: Mapping[str, Any], key: Key, uid: str | None, name: str) -> Body | None:
    """The fleet's Deployment ``name`` besides its servers' (its endpoint picker's, its encode tier's), controlled by
    the fleet of ``uid``."""
    found = indexed(indexes, "fleet_deployments", key)
    return next(
        (d for d in found if uid and d["metadata"].get("name") == name and d["metadata"].get("controller") == uid), None
    )


def _slim_meta(meta: kopf.Meta, *keys: str) -> Body:
    return {k: meta[k] for k in ("name", "namespace", "uid", "generation", "deletionTimestamp", *keys) if k in meta}


async def fleets(namespace: str | None, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> dict[Key, Body]:
    operator_of(memo).remember_kopf_context()  # indexed before any loop of the operator's own sees a fleet
    slim = {k: body[k] for k in ("apiVersion", "kind", "spec", "status") if k in body}
    return {(namespace or "", name): {**slim, "metadata": _slim_meta(body.meta, "labels")}}


async def fleet_deployments(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Key, Body]:
    meta = _slim_meta(body.meta)
    meta["annotations"] = {k: v for k, v in body.meta.annotations.items() if k == STANDBY_ANNOTATION}
    meta["scalerOwnsReplicas"] = scaler_owns_replicas(dict(body))
    meta["controller"] = (controller_of(body.meta) or {}).get("uid")
    slim = {"metadata": meta, "spec": {"replicas": body.spec.get("replicas")}, "status": dict(body.status)}
    return {(namespace or "", labels[INFERENCE_LABEL]): slim}


async def fleet_pods(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Key, Body]:
    pod_status = body.status
    # The autoscaler measures cold starts from creationTimestamp; warm standby reads where a pod is in its sleep
    # (its label and annotation) and reaches it at its IP.
    meta = {**_slim_meta(body.meta, "creationTimestamp"), "deployment": deployment_of_pod(body.meta)}
    meta["labels"] = {k: v for k, v in body.meta.labels.items() if k == SERVING_LABEL}
    meta["annotations"] = {k: v for k, v in body.meta.annotations.items() if k == SLEEP_ANNOTATION}
    kept = ("phase", "conditions", "containerStatuses", "podIP")
    slim = {"metadata": meta, "status": {k: pod_status[k] for k in kept if k in pod_status}}
    return {(namespace or "", labels[INFERENCE_LABEL]): slim}
