"""The operator bench's watches against a real API server: ``Watched`` keeps a list current through its changes,
and ``operator_watches`` opens every watch of the operator's that the cluster serves and receives a child's event."""

from __future__ import annotations

from typing import Any

from mmfleet.api import GROUP, PLURAL, VERSION
from mmfleet.render import INFERENCE_LABEL
from mmfleet_lab.bench.operator_scale import Watched, operator_paths, operator_watches
from tests.helpers.wait import wait_for


def configmap(name: str, labels: dict[str, str] | None = None, data: str = "1") -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}}, "data": {"x": data}}


def test_watched_follows_creations_edits_and_deletions(api: Any, namespace: str) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api)
    core.create_namespaced_config_map(namespace, configmap("before"))
    with Watched(api, f"/api/v1/namespaces/{namespace}/configmaps") as watched:

        def data() -> dict[str, str]:
            return {i["metadata"]["name"]: i.get("data", {}).get("x", "") for i in watched.items()}

        assert data().get("before") == "1", "the list it starts from"
        core.create_namespaced_config_map(namespace, configmap("after"))
        core.patch_namespaced_config_map("before", namespace, {"data": {"x": "2"}})
        wait_for(lambda: data().get("after") == "1" and data().get("before") == "2", 10, lambda: f"{data()}")
        core.delete_namespaced_config_map("before", namespace)
        wait_for(lambda: "before" not in data(), 10, lambda: f"{data()}")
    assert not watched.thread.is_alive()


def test_the_operators_watches_open_and_carry_a_childs_event(api: Any, namespace: str, crd: None) -> None:
    from kubernetes import client

    lines: list[str] = []
    with operator_watches(api, lines.append) as read:
        # at most the three optional kinds are not served here
        assert len(read) >= len(operator_paths()) - 3 and f"/apis/{GROUP}/{VERSION}/{PLURAL}" in read, read
        labels = {"app.kubernetes.io/managed-by": "mmfleet", INFERENCE_LABEL: "no-such-fleet"}
        client.CoreV1Api(api).create_namespaced_config_map(namespace, configmap("child", labels))
        wait_for(lambda: read["/api/v1/configmaps"] > 0, 10, lambda: f"the labelled ConfigMap's event: {read}")
    assert "watches held open" in lines[-1], lines
