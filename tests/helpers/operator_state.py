"""An operator of its own for each unit test: its state, its reconcile and its work queue, driven without kopf or
an API server (``RecordingKube`` answers in its place)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

from kubernetes.client.exceptions import ApiException

from mmfleet.autoscaler import metrics
from mmfleet.config import OperatorConfig
from mmfleet.handlers import memo, triggers
from mmfleet.handlers.reconcile import Result, Snapshot, api_retry_delay, reconcile
from mmfleet.handlers.records import Operator
from mmfleet.kube import Kube, ObjectRef, RefusedError, RetryableError

KEY = ("ml", "qwen")
Body = dict[str, Any]


def fleet_body(
    generation: int = 2,
    autoscaling: bool = False,
    replicas: int = 2,
    uid: str = "u-1",
    tracing: bool = False,
    capacity_per_replica: float | None = None,
) -> Body:
    spec: Body = {"model": {"name": "Qwen/Qwen2.5-VL-7B-Instruct"}, "cloud": "eks", "replicas": replicas}
    if tracing:
        spec["tracing"] = {"enabled": True}
    if autoscaling:
        spec["autoscaling"] = {"minReplicas": 1, "maxReplicas": 8, "slo": {"target": "2s"}}
        if capacity_per_replica is not None:
            spec["autoscaling"]["capacityPerReplica"] = capacity_per_replica
    meta = {"name": KEY[1], "namespace": KEY[0], "uid": uid, "generation": generation}
    return {"apiVersion": "mmfleet.io/v1alpha1", "kind": "MultimodalInference", "metadata": meta, "spec": spec}


class RecordingKube(Kube):
    """Applies echo back (a Deployment as ready as its replicas), status writes and reads are recorded.

    The Deployment's apply raises ``fault``, or is refused with ``refuse``, while set; ``existing``: objects
    that exist, by (kind, name); ``ready``: whether an applied Deployment's replicas are ready at once.
    """

    def __init__(self, fault: RetryableError | None = None) -> None:
        self.fault = fault
        self.refuse: tuple[int, str] | None = None
        self.existing: dict[tuple[str, str], Body] = {}
        self.applied: list[Body] = []
        self.written: list[Body] = []
        self.got: list[tuple[str, str]] = []
        self.deleted: list[tuple[str, str]] = []
        self.scaled: list[int] = []
        self.scaled_names: list[tuple[str, int]] = []  # (Deployment, replicas) of each scale
        self.live_replicas: dict[
            str, int
        ] = {}  # a Deployment's replicas set by the scaler: an apply without them keeps
        self.marked: list[tuple[str, dict[str, str], dict[str, str | None]]] = []
        self.kept_annotations: dict[str, str] = {}  # the Deployment's, from the scaler's own applies
        self.scaled_with_standby: list[tuple[int, int]] = []
        self.ready = True
        self.logs: dict[str, str | Exception] = {}  # each pod's server log, or what reading it raises
        self.logs_read: list[str] = []

    def apply(self, manifest: Body, manager: str = "mmfleet") -> Body:
        if manifest["kind"] == "Deployment":
            if self.fault is not None:
                raise self.fault
            if self.refuse is not None:
                raise RefusedError(*self.refuse)
        self.applied.append(manifest)
        meta = {**manifest["metadata"], "uid": f"uid-{manifest['kind']}", "generation": 1}
        if manifest["kind"] == "Deployment" and self.kept_annotations:  # set by another field manager, kept
            meta["annotations"] = {**(meta.get("annotations") or {}), **self.kept_annotations}
        kept = self.live_replicas.get(manifest["metadata"]["name"])
        replicas = manifest.get("spec", {}).get("replicas", kept or 1)
        ready = {"replicas": replicas, "readyReplicas": replicas if self.ready else 0, "updatedReplicas": replicas}
        if kept is not None and "replicas" not in manifest.get("spec", {}):
            return {**manifest, "metadata": meta, "status": ready, "spec": {**manifest["spec"], "replicas": kept}}
        return {**manifest, "metadata": meta, "status": ready}

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> Body | None:
        self.got.append((kind, name))
        return self.existing.get((kind, name))

    def get_each(self, wanted: Sequence[ObjectRef], cached: bool = False) -> list[Body | None]:
        return [self.get(*ref) for ref in wanted]

    def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> None:
        self.deleted.append((kind, name))
        self.existing.pop((kind, name), None)

    def has_api(self, api_version: str, kind: str) -> bool:
        return False

    def scale(self, namespace: str, name: str, replicas: int, manager: str = "") -> None:
        self.scaled.append(replicas)
        self.scaled_names.append((name, replicas))

    def scale_with_standby(self, namespace: str, name: str, replicas: int, standby: int) -> None:
        self.scaled_with_standby.append((replicas, standby))

    def mark_pod(self, namespace: str, name: str, labels: dict[str, str], annotations: dict[str, str | None]) -> None:
        self.marked.append((name, labels, annotations))

    def pod_log(self, namespace: str, name: str, container: str, limit_bytes: int) -> str:
        self.logs_read.append(name)
        found = self.logs.get(name, "")
        if isinstance(found, Exception):
            raise found
        return found

    def patch_status(self, namespace: str, name: str, status: Body) -> None:
        self.written.append(status)

    def thread_requests(self) -> int:
        return 0

    services: list[str] | None = []  # noqa: RUF012 (the Services that exist, by name; None: listing them fails)
    slices: list[Body] | int = []  # noqa: RUF012 (their EndpointSlices; an int: the error status)
    listed = 0

    def list_objects(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[Body]:
        self.listed += 1
        if kind == "EndpointSlice":
            if isinstance(self.slices, int):
                raise ApiException(status=self.slices, reason="Forbidden" if self.slices == 403 else "Unavailable")
            return self.slices
        if self.services is None:
            raise ApiException(status=503, reason="Service Unavailable")
        name = (field_selector or "").removeprefix("metadata.name=")
        return [{"metadata": {"name": name}}] if name in self.services else []


class FakePrometheus(metrics.Prometheus):
    """Answers every read with the signals given, as one batched read would."""

    def __init__(self, signals: metrics.Signals | None, outage: str | None = None) -> None:
        self.signals = signals
        self.outage = outage

    def read(self, targets: Iterable[metrics.Target], at: float) -> metrics.Readings:
        if self.outage:
            return metrics.Readings(outage=self.outage, queries=1)
        return metrics.Readings({t.key: self.signals or metrics.Signals() for t in targets}, queries=5)


def operator(kube: Kube, **config: Any) -> Operator:
    """An operator over ``kube`` whose kopf indexes hold nothing yet."""
    return Operator(config=OperatorConfig(**config), kube=kube, indexes=indexes(None))


def reconcile_once(
    op: Operator, body: Body, attempt: int = 0, deployment: Body | None = None, pods: list[Body] | None = None
) -> Result:
    """One reconcile, as a worker runs it, for the ``attempt``-th try (of a fleet whose watch event was seen)."""
    op.record(KEY, body["metadata"].get("uid"))
    seen = Snapshot(KEY, body, deployment, pods or [])
    return reconcile(op, seen, lambda retry_after: api_retry_delay(attempt, retry_after))


def refused_ready(body: Body) -> Body:
    """The Ready condition a fleet gets from its first reconcile when it is refused, nothing applied."""
    kube = RecordingKube()
    assert reconcile_once(operator(kube), body).outcome == "invalid_spec"
    assert kube.applied == []
    [status] = kube.written
    ready: Body = next(c for c in status["conditions"] if c["type"] == "Ready")
    return ready


def served_in(config: OperatorConfig, namespace: str) -> str:
    """What one reconcile of a fresh fleet in ``namespace`` does under ``config``: "applied" when its children were
    applied, else its Ready condition's reason and message (nothing applied)."""
    kube = RecordingKube()
    body = fleet_body(generation=1)
    body["metadata"]["namespace"] = namespace
    reconcile_once(Operator(config=config, kube=kube), body)
    if kube.applied:
        return "applied"
    ready = next(c for c in kube.written[0]["conditions"] if c["type"] == "Ready")
    return f"{ready['reason']}: {ready['message']}"


def environment_config(env: Iterable[Body], monkeypatch: Any) -> OperatorConfig:
    """The operator's settings as a container with ``env`` (a Deployment's list) would load them."""
    for variable in env:
        if variable["name"].startswith("MMFLEET_") and "value" in variable:
            monkeypatch.setenv(variable["name"], variable["value"])
    return OperatorConfig.load()


def indexes(body: Body | None, deployment: Body | None = None, pods: list[Body] | None = None) -> dict[str, Any]:
    """kopf's three indexes as they would hold one fleet (or none)."""
    return {
        "fleets": {KEY: [body]} if body is not None else {},
        "fleet_deployments": {KEY: [deployment]} if deployment is not None else {},
        "fleet_pods": {KEY: pods or []},
    }


@contextlib.asynccontextmanager
async def workers(op: Operator, held: dict[str, Any]) -> AsyncIterator[Operator]:
    """The operator's work queue and workers running over the indexes ``held`` (changed in place by the test)."""
    await triggers.start_workers(memo=memo(op), **held)
    try:
        yield op
    finally:
        await triggers.stop_workers(memo=memo(op))


async def fleet_event(op: Operator, body: Body, type_: str = "MODIFIED") -> None:
    """The fleet's watch event, as kopf hands it to the handler."""
    event: Any = {"type": type_, "object": body}
    await triggers.on_fleet_event(event, KEY[0], KEY[1], body["metadata"], memo(op))
