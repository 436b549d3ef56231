"""The kustomize base and overlays, applied by the real kubectl (its built-in kustomize) to the local control plane.

The base is applied for real, as ``kubectl apply -k manifests/base`` on a fresh cluster would, and then removed
again, all but the CRD, which the session's other tests share (deleting it would delete their fleets). The cloud
overlays are applied with a server-side dry run: the API server admits, defaults and validates every object as
it would on EKS, AKS or ACK, and nothing changes. The examples are applied the same way once the base's CRD is
served, so the schema and its CEL rules judge them, and the operator running for other tests makes no GPU fleets.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from mmfleet.api import GROUP, PLURAL
from mmfleet_lab.cluster import Cluster
from mmfleet_lab.cluster.kubectl import run_kubectl
from tests.helpers.repo import ROOT
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.integration

BASE = ROOT / "manifests" / "base"
OVERLAYS = ("eks", "aks", "ack")
CRD_NAME = f"{PLURAL}.{GROUP}"
OPERATOR_NAMESPACE = "mmfleet-system"


def ok(result: subprocess.CompletedProcess[str]) -> str:
    """The output of a kubectl that succeeded; else the test fails naming its arguments (after the binary,
    ``--kubeconfig`` and ``--cache-dir`` that run_kubectl puts first) and kubectl's message."""
    assert result.returncode == 0, f"{' '.join(result.args[4:])} failed:\n{result.stderr}"
    return result.stdout


def built(cluster: Cluster, directory: Path) -> list[dict[str, Any]]:
    """What kubectl's own kustomize renders for a directory."""
    return [doc for doc in yaml.safe_load_all(ok(run_kubectl(cluster.kubeconfig, "kustomize", str(directory)))) if doc]


@pytest.fixture(scope="module")
def base(cluster: Cluster, api: Any) -> Iterator[list[dict[str, Any]]]:
    """``kubectl apply -k manifests/base``, then everything it created but the CRD deleted again."""
    objects = built(cluster, BASE)
    core = client.CoreV1Api(api)
    try:
        core.read_namespace(OPERATOR_NAMESPACE)
        pytest.fail(f"namespace {OPERATOR_NAMESPACE} exists before the test; another test installs into it")
    except ApiException as error:
        assert error.status == 404
    ok(run_kubectl(cluster.kubeconfig, "apply", "-k", str(BASE)))
    yield objects
    removable = [o for o in objects if o["kind"] != "CustomResourceDefinition"]
    leftovers = yaml.safe_dump_all(removable)
    ok(run_kubectl(cluster.kubeconfig, "delete", "--ignore-not-found", "--wait=false", "-f", "-", stdin=leftovers))


def test_apply_k_base_creates_every_object_it_renders(cluster: Cluster, base: list[dict[str, Any]]) -> None:
    kinds = {(o["kind"], o["metadata"]["name"]) for o in base}
    assert ("Namespace", OPERATOR_NAMESPACE) in kinds
    assert ("CustomResourceDefinition", CRD_NAME) in kinds
    assert ("Deployment", "mmfleet-operator") in kinds
    listed = ok(run_kubectl(cluster.kubeconfig, "get", "-k", str(BASE), "-o", "name"))
    assert len(listed.split()) == len(base), listed


def test_base_operator_deployment_is_admitted_under_the_restricted_pod_security_standard(
    cluster: Cluster, base: list[dict[str, Any]], api: Any
) -> None:
    """The namespace enforces ``restricted``; a pod the standard refuses would never be created."""
    apps = client.AppsV1Api(api)
    deployment = apps.read_namespaced_deployment("mmfleet-operator", OPERATOR_NAMESPACE)
    container = deployment.spec.template.spec.containers[0]
    assert container.security_context.read_only_root_filesystem is True

    def pod_created() -> bool:
        pods = client.CoreV1Api(api).list_namespaced_pod(
            OPERATOR_NAMESPACE, label_selector="app.kubernetes.io/component=operator"
        )
        return bool(pods.items)

    wait_for(pod_created, 30, "the operator Deployment's pod to be admitted")


@pytest.mark.parametrize("cloud", OVERLAYS)
def test_each_overlay_is_admitted_by_a_server_side_dry_run(
    cluster: Cluster, api: Any, base: list[dict[str, Any]], cloud: str
) -> None:
    overlay = ROOT / "manifests" / "overlays" / cloud
    out = ok(run_kubectl(cluster.kubeconfig, "apply", "-k", str(overlay), "--dry-run=server", "-o", "yaml"))
    answered = yaml.safe_load(out)
    items = answered["items"] if answered.get("kind") == "List" else [answered]
    assert len(items) == len(built(cluster, overlay))
    (deployment,) = [i for i in items if i["kind"] == "Deployment" and i["metadata"]["name"] == "mmfleet-operator"]
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["MMFLEET_DEFAULT_CLOUD"] == cloud
    # A dry run changes nothing: the base's operator still runs with its own default.
    live = client.AppsV1Api(api).read_namespaced_deployment("mmfleet-operator", OPERATOR_NAMESPACE)
    assert {e.name: e.value for e in live.spec.template.spec.containers[0].env}["MMFLEET_DEFAULT_CLOUD"] == "auto"


@pytest.fixture
def example_namespaces(cluster: Cluster, api: Any) -> Iterator[None]:
    """The namespaces the examples name (``ml``), created for the test when the cluster lacks them."""
    core = client.CoreV1Api(api)
    names = {
        doc["metadata"]["namespace"]
        for path in sorted((ROOT / "examples").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc and "namespace" in doc["metadata"]
    }
    created = []
    for name in sorted(names):
        try:
            core.create_namespace({"metadata": {"name": name}})
            created.append(name)
        except ApiException as error:
            if error.status != 409:
                raise
    yield
    for name in created:
        core.delete_namespace(name)


def test_examples_apply_once_the_base_serves_the_crd(
    cluster: Cluster, base: list[dict[str, Any]], example_namespaces: None
) -> None:
    out = ok(run_kubectl(cluster.kubeconfig, "apply", "-f", str(ROOT / "examples"), "--dry-run=server"))
    files = sorted((ROOT / "examples").glob("*.yaml"))
    names = [doc["metadata"]["name"] for path in files for doc in yaml.safe_load_all(path.read_text()) if doc]
    assert files and len(names) == len(files), "one MultimodalInference per example file"
    for name in names:
        assert f"multimodalinference.{GROUP}/{name} " in out, out


def test_a_model_name_the_server_would_take_for_a_flag_is_refused_by_the_api_server(
    cluster: Cluster, base: list[dict[str, Any]], namespace: str
) -> None:
    bad = {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "MultimodalInference",
        "metadata": {"name": "flag", "namespace": namespace},
        "spec": {"model": {"name": "--trust-remote-code"}},
    }
    result = run_kubectl(cluster.kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(bad))
    assert result.returncode != 0
    assert "spec.model.name" in result.stderr and "must not start with '-'" in result.stderr, result.stderr
