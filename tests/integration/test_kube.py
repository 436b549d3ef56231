"""``mmfleet.kube.Kube`` against the real API server, where the client's own caches could mislead it."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from mmfleet.kube import Kube
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.integration

GROUP = "probe.mmfleet.test"


def widget_crd() -> dict[str, Any]:
    schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}],
        },
    }


def test_has_api_sees_a_kind_installed_and_removed_after_its_first_answer(api: Any) -> None:
    """The operator asks every few minutes whether PodMonitor is served; a cached yes would outlive an uninstall
    and every reconcile would then fail applying a kind that is gone."""
    kube, crds = Kube(api), client.ApiextensionsV1Api(api)
    assert not kube.has_api(f"{GROUP}/v1", "Widget")
    crds.create_custom_resource_definition(widget_crd())
    try:
        wait_for(lambda: kube.has_api(f"{GROUP}/v1", "Widget"), 30, "Widget served")
    finally:
        crds.delete_custom_resource_definition(f"widgets.{GROUP}")
    wait_for(lambda: not kube.has_api(f"{GROUP}/v1", "Widget"), 30, "Widget no longer served")


def test_apply_keeps_characters_outside_the_basic_multilingual_plane(api: Any, namespace: str) -> None:
    """The API server accepts "🙂" in a fleet's model name (a JSON create); the Deployment rendered from it must apply
    too. Applies are YAML to the API server, whose decoder refuses the UTF-16 surrogate escapes that json.dumps writes
    by default (found by the fuzzer's live leg: every apply refused, 400)."""
    data = {"model": "🙂 café 模型", "astral": "\U0001d54f"}
    manifest = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "astral", "namespace": namespace}}
    applied = Kube(api).apply({**manifest, "data": data})
    assert applied["data"] == data
    assert client.CoreV1Api(api).read_namespaced_config_map("astral", namespace).data == data
