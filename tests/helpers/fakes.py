"""Fakes of the API server and of Prometheus, for the failures and the counting that a real one does not give."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kubernetes.client.exceptions import ApiException

from mmfleet.autoscaler import metrics
from mmfleet.kube import Kube


class FakeKube(Kube):
    """The API server as far as one reconcile and one scale need it: applies echo with a uid, writes recorded."""

    def __init__(self) -> None:
        self.applied: list[dict[str, Any]] = []
        self.scaled: list[int] = []
        self.written: list[dict[str, Any]] = []

    def apply(self, manifest: dict[str, Any], manager: str = "mmfleet") -> dict[str, Any]:
        self.applied.append(manifest)
        meta = {**manifest["metadata"], "uid": f"uid-{len(self.applied)}", "generation": 1}
        return {**manifest, "metadata": meta}

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        return None

    def has_api(self, api_version: str, kind: str) -> bool:
        return False

    def scale(self, namespace: str, name: str, replicas: int, manager: str = "") -> None:
        self.scaled.append(replicas)

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.written.append(status)

    def thread_requests(self) -> int:
        return 0

    services: list[str] | None = []  # noqa: RUF012 (the Services that exist, by name; None: listing them fails)
    slices: list[dict[str, Any]] | int = []  # noqa: RUF012 (their EndpointSlices; an int: the error status)
    listed = 0

    def list_objects(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        self.listed += 1
        if kind == "EndpointSlice":
            if isinstance(self.slices, int):
                raise ApiException(status=self.slices, reason="Forbidden" if self.slices == 403 else "Unavailable")
            return self.slices
        if self.services is None:
            raise ApiException(status=503, reason="Service Unavailable")
        name = (field_selector or "").removeprefix("metadata.name=")
        return [{"metadata": {"name": name}}] if name in self.services else []


def body(generation: int = 3, autoscaling: bool = False, tracing: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"model": {"name": "Qwen/Qwen2.5-VL-7B-Instruct"}, "cloud": "eks", "replicas": 1}
    if tracing:
        spec["tracing"] = {"enabled": True}
    if autoscaling:
        spec["autoscaling"] = {"minReplicas": 1, "maxReplicas": 8, "slo": {"target": "2s"}, "capacityPerReplica": 2.0}
    return {
        "apiVersion": "mmfleet.io/v1alpha1",
        "kind": "MultimodalInference",
        "metadata": {"name": "qwen", "namespace": "ml", "uid": f"u-{generation}", "generation": generation},
        "spec": spec,
    }


class FakePrometheus(metrics.Prometheus):
    """Answers every read with the signals given, as one batched read would."""

    def __init__(self, signals: metrics.Signals | None, outage: str | None = None) -> None:
        self.signals = signals
        self.outage = outage

    def read(self, targets: Iterable[metrics.Target], at: float) -> metrics.Readings:
        if self.outage:
            return metrics.Readings(outage=self.outage, queries=1)
        return metrics.Readings({t.key: self.signals or metrics.Signals() for t in targets}, queries=5)
