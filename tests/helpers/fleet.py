"""MultimodalInference resources on the local control plane, in the words of the tests."""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from mmfleet.api import GROUP, PLURAL, VERSION
from tests.helpers.wait import wait_for

READY_TIMEOUT = 60


def mmi(name: str, **spec: Any) -> dict[str, Any]:
    spec.setdefault("model", {"name": "Qwen/Qwen2.5-VL-3B-Instruct"})
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "MultimodalInference", "metadata": {"name": name}, "spec": spec}


class Fleet:
    """Small helpers over the official client, in the words of the tests."""

    def __init__(self, api: Any, namespace: str) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.apps = client.AppsV1Api(api)
        self.core = client.CoreV1Api(api)
        self.namespace = namespace

    def create(self, body: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body)

    def patch(self, name: str, spec: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name, {"spec": spec})

    def get(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)
        return found

    def status(self, name: str) -> dict[str, Any]:
        return self.get(name).get("status") or {}

    def events(self, name: str, reason: str, event_type: str | None = None) -> list[str]:
        """The messages of the events on fleet ``name`` with ``reason`` (and ``event_type``, when given). kopf posts
        them from a queue of its own after the status is written: a test waits for them."""
        found = self.core.list_namespaced_event(self.namespace, field_selector=f"involvedObject.name={name}").items
        return [e.message for e in found if e.reason == reason and event_type in (None, e.type)]

    def condition(self, name: str, kind: str) -> dict[str, Any]:
        return next((c for c in self.status(name).get("conditions", []) if c["type"] == kind), {})

    def wait_condition(
        self, name: str, kind: str, *, status: str | None = None, reason: str | None = None, timeout: float = 60.0
    ) -> dict[str, Any]:
        """The condition once it shows ``status`` and ``reason`` (either may be left open)."""

        def shown() -> dict[str, Any] | None:
            found = self.condition(name, kind)
            wanted = (status is None or found.get("status") == status) and (
                reason is None or found.get("reason") == reason
            )
            return found if found and wanted else None

        result: dict[str, Any] = wait_for(shown, timeout, f"{name} {kind} status={status} reason={reason}")
        return result

    def wait_ready(self, name: str, replicas: int = 1, timeout: float = READY_TIMEOUT) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            status = self.status(name)
            generation = self.get(name)["metadata"]["generation"]
            ok = (
                status.get("phase") == "Ready"
                and status.get("readyReplicas") == replicas
                and status.get("observedGeneration") == generation
            )
            return status if ok else None

        result: dict[str, Any] = wait_for(ready, timeout, f"{self.namespace}/{name} Ready with {replicas} replicas")
        return result

    def deployment(self, name: str) -> Any:
        try:
            return self.apps.read_namespaced_deployment(name, self.namespace)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
