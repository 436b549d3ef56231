"""The chart with the real helm (built by the lab) on the local control plane: lint, template per cloud, the values
schema refusing wrong values, install, the operator run as installed (its Deployment's args and environment, its
ServiceAccount's token) reconciling an example, least-privilege RBAC measured from the API server's audit log,
upgrade and uninstall (the CRD and the user's resources stay).

The operator cannot run as the chart's pod here (no image registry; kwok nodes run nothing), so it runs from this
checkout with exactly what the installed Deployment gives its container, except the health address: tests serve on
127.0.0.1 only, so ``0.0.0.0:8080`` becomes a free port on 127.0.0.1 (the probe path is the Deployment's).
"""

from __future__ import annotations

import json
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from mmfleet.api import GROUP, PLURAL
from mmfleet_lab.cluster import Cluster
from tests.helpers.chart import (
    CHART,
    CRD_NAME,
    EXAMPLES,
    NAMESPACE,
    RELEASE,
    ChartRun,
    Installed,
    Triple,
    _apiserver_calls,
    _container,
    helm,
    namespaced,
    refused_calls,
    rule_triples,
)
from tests.helpers.fleet import Fleet
from tests.helpers.repo import ROOT, WATCH_ONE_NAMESPACE

pytestmark = pytest.mark.integration

BASE_RBAC = ROOT / "manifests" / "base" / "rbac.yaml"
CLOUD_VALUES = {
    "eks": ["--set", "defaultCloud=eks", "--set", "collector.awsRegion=us-west-2"],
    "aks": ["--set", "defaultCloud=aks"],
    "ack": ["--set", "defaultCloud=ack"],
    "generic": ["--set", "defaultCloud=generic"],
}


def _docs(rendered: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(rendered) if d]


# --- lint, template, the values schema ------------------------------------------------------------------------


@pytest.mark.parametrize("cloud", CLOUD_VALUES)
def test_helm_lint_and_template_each_clouds_values(cloud: str, cluster: Cluster, tmp_path: Path) -> None:
    values = [*WATCH_ONE_NAMESPACE, *CLOUD_VALUES[cloud]]
    lint = helm("lint", "--strict", str(CHART), *values, home=tmp_path)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    # --validate: the rendered objects are checked by the local API server, as an install would send them.
    rendered = helm(
        "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--validate", *values,
        kubeconfig=cluster.kubeconfig, home=tmp_path,
    )  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    deployments = {d["metadata"]["name"]: d for d in _docs(rendered.stdout) if d["kind"] == "Deployment"}
    env = {e["name"]: e.get("value") for e in _container(deployments[RELEASE])["env"]}
    assert env["MMFLEET_DEFAULT_CLOUD"] == cloud
    assert "mmfleet-otel-collector" in deployments, "a named cloud installs its collector"


@pytest.mark.parametrize(
    ("values", "field"),
    [
        (["--set", "defaultCloud=gcp"], "defaultCloud"),
        (["--set", "autoscaleInterval=-15s"], "autoscaleInterval"),
        (["--set", "defaultColdStart=two minutes"], "defaultColdStart"),
        (["--set", "workers=-1"], "workers"),
        (["--set", "collector.cloud=gke"], "collector/cloud"),
        (["--set", "monitoring.alerts.enabeld=true"], "monitoring/alerts"),
    ],
)
def test_a_wrong_value_fails_template_and_install_naming_the_field(
    values: list[str], field: str, cluster: Cluster, tmp_path: Path
) -> None:
    rendered = helm("template", RELEASE, str(CHART), *values, home=tmp_path)
    assert rendered.returncode != 0
    assert f"at '/{field}'" in rendered.stderr, rendered.stderr
    release = f"wrong-{uuid.uuid4().hex[:6]}"
    install = helm(
        "install", release, str(CHART), "--namespace", "default", *values, kubeconfig=cluster.kubeconfig, home=tmp_path
    )
    assert install.returncode != 0
    assert f"at '/{field}'" in install.stderr, install.stderr
    listed = helm("list", "--namespace", "default", "--all", "--short", kubeconfig=cluster.kubeconfig, home=tmp_path)
    assert release not in listed.stdout.split()


# --- install, the operator as installed, RBAC, upgrade, uninstall ---------------------------------------------


def test_helm_install_creates_the_crd_from_crds(installed: Installed, api: Any) -> None:
    crd = api.sanitize_for_serialization(client.ApiextensionsV1Api(api).read_custom_resource_definition(CRD_NAME))
    spec_writers = {m["manager"] for m in crd["metadata"]["managedFields"] if "f:spec" in m["fieldsV1"]}
    assert spec_writers == {"helm"}, crd["metadata"]["managedFields"]
    shipped = yaml.safe_load((CHART / "crds" / f"{CRD_NAME}.yaml").read_text())["spec"]
    assert {key: crd["spec"][key] for key in shipped} == shipped  # the API server only adds defaults


def test_the_installed_operator_reconciles_the_examples_to_ready(chart_run: ChartRun, installed: Installed) -> None:
    for example in EXAMPLES:
        namespace, status = chart_run.fleets[example]
        assert status["phase"] == "Ready", (example, namespace, status)
    with urllib.request.urlopen(chart_run.health_url, timeout=5) as response:
        assert response.status == 200
    assert "Traceback" not in chart_run.log.read_text()
    assert refused_calls(installed.cluster, chart_run.username) == [], "the chart's RBAC denied the operator"


NEW_NAMESPACES = 5  # with the 4 of chart_run: 72 watch streams, where a pool sized for one namespace held 33


def test_fleets_in_namespaces_created_after_the_start_are_served(chart_run: ChartRun, api: Any) -> None:
    """watchNamespaces is a pattern: every matching namespace made later adds kopf's watch streams (eight kinds).
    When those were counted against kopf's connection pool, the fifth new namespace's lists timed out waiting for a
    connection and its fleet was never reconciled."""
    body = yaml.safe_load((ROOT / "examples" / "minimal.yaml").read_text())
    body["metadata"].pop("namespace", None)
    made = []
    try:
        for _ in range(NEW_NAMESPACES):
            namespace = namespaced(api, f"helm-{uuid.uuid4().hex[:8]}")
            made.append(namespace)
            Fleet(api, namespace).create(body)
        for namespace in made:
            Fleet(api, namespace).wait_ready(body["metadata"]["name"], timeout=60)
        lines = chart_run.log.read_text(errors="replace").splitlines()
        timeouts = [line for line in lines if "TimeoutError" in line and any(f"/{ns}/" in line for ns in made)]
        assert timeouts == [], "requests for the new namespaces timed out"
    finally:
        for namespace in made:
            client.CoreV1Api(api).delete_namespace(namespace)


def _used(calls: list[dict[str, Any]]) -> set[Triple]:
    """What the calls needed authorized. A server-side apply that created its object (201) was authorized as create
    as well as patch (apiserver handlers/patch.go), and with OwnerReferencesPermissionEnforcement (on in the lab) a
    child created with blockOwnerDeletion needs update on its owner's finalizers; a RoleBinding of a ClusterRole the
    operator does not hold all the rights of needs bind on it (rbac's escalation check); none shows as a call.
    """
    used: set[Triple] = set()
    for event in calls:
        ref = event["objectRef"]
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        used.add((ref.get("apiGroup", ""), resource, event["verb"]))
        if event["verb"] == "patch" and event["responseStatus"]["code"] == 201:
            used.add((ref.get("apiGroup", ""), resource, "create"))
            used.add((GROUP, f"{PLURAL}/finalizers", "update"))
            if resource == "rolebindings":  # binding a ClusterRole it does not hold all of: authorized as bind
                used.add(("rbac.authorization.k8s.io", "clusterroles", "bind"))
    return used


def test_cluster_role_grants_only_what_the_operator_calls(chart_run: ChartRun, installed: Installed, api: Any) -> None:
    """Every (apiGroup, resource, verb) the chart's ClusterRole grants, equal to the kustomize base's, without a
    wildcard, and each one needed by what the operator did above as the kube-apiserver's audit log recorded it."""
    role = client.RbacAuthorizationV1Api(api).read_cluster_role(RELEASE)
    chart_rules = api.sanitize_for_serialization(role)["rules"]
    base_rules = next(d for d in yaml.safe_load_all(BASE_RBAC.read_text()) if d and d["kind"] == "ClusterRole")["rules"]
    granted = rule_triples(chart_rules)
    assert granted == rule_triples(base_rules), "the chart's and the kustomize base's ClusterRoles differ"
    # The one namespaced Role: the leader election's Lease in the release namespace.
    leases = client.RbacAuthorizationV1Api(api).read_namespaced_role(f"{RELEASE}-leader-election", NAMESPACE)
    granted |= rule_triples(api.sanitize_for_serialization(leases)["rules"])
    wildcards = {t for t in granted if "*" in t}
    assert wildcards == set()
    used = _used(_apiserver_calls(installed.cluster, chart_run.username))
    assert used - granted == set(), "called but not granted"
    assert granted - used == set(), "granted but never needed in this run"


def test_helm_upgrade_changes_the_deployment(installed: Installed, api: Any) -> None:
    before = installed.deployment(api)
    result = installed.helm("upgrade", RELEASE, str(CHART), "--reuse-values", "--set", "autoscaleInterval=45s")
    assert result.returncode == 0, result.stderr
    after = installed.deployment(api)
    env = {e["name"]: e.get("value") for e in _container(after)["env"]}
    assert env["MMFLEET_AUTOSCALE_INTERVAL"] == "45s"
    assert after["metadata"]["generation"] > before["metadata"]["generation"]
    history = json.loads(installed.helm("history", RELEASE, "--output", "json").stdout)
    assert [h["revision"] for h in history] == [1, 2]


def test_helm_uninstall_keeps_the_crd_and_the_users_fleets(installed: Installed, chart_run: ChartRun, api: Any) -> None:
    """Helm installs crds/ once and never deletes them (its CRD convention), so the fleets outlive the release."""
    result = installed.helm("uninstall", RELEASE)
    assert result.returncode == 0, result.stderr
    with pytest.raises(ApiException) as gone:
        client.AppsV1Api(api).read_namespaced_deployment(RELEASE, NAMESPACE)
    assert gone.value.status == 404
    with pytest.raises(ApiException) as role_gone:
        client.RbacAuthorizationV1Api(api).read_cluster_role(RELEASE)
    assert role_gone.value.status == 404
    client.ApiextensionsV1Api(api).read_custom_resource_definition(CRD_NAME)
    for example, (namespace, _) in chart_run.fleets.items():
        name = yaml.safe_load((ROOT / "examples" / example).read_text())["metadata"]["name"]
        assert Fleet(api, namespace).get(name)["metadata"]["name"] == name
