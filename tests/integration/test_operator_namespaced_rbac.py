"""The chart's namespaced RBAC on the local control plane: the operator, with only its watched namespace's Role (and
the ClusterRole's cluster-scoped reads), reconciles a fleet there, is refused nothing, and can write nowhere else."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from mmfleet_lab.cluster import Cluster
from mmfleet_lab.cluster.kubectl import kubectl
from tests.helpers.fleet import Fleet, mmi
from tests.helpers.operator_process import OperatorProcess
from tests.helpers.repo import ROOT, helm_binary

pytestmark = pytest.mark.integration

RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


@pytest.fixture
def namespaced_operator(
    cluster: Cluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> Iterator[tuple[OperatorProcess, str]]:
    """The chart's RBAC for ``watchNamespaces: [namespace]`` (release in its own namespace), and the operator run
    with a token of the chart's ServiceAccount; the session's operator is stopped meanwhile."""
    release_ns = f"rel-{uuid.uuid4().hex[:6]}"
    release = f"r{uuid.uuid4().hex[:6]}"
    rendered = subprocess.run(
        [str(helm_binary()), "template", release, str(ROOT / "charts/mmfleet"), "--namespace", release_ns,
         "--set-json", f"watchNamespaces={json.dumps([namespace])}"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    everything = [d for d in yaml.safe_load_all(rendered) if d]
    docs = [d for d in everything if d["kind"] in RBAC_KINDS]
    deployment = next(d for d in everything if d["kind"] == "Deployment")
    chart_env = {e["name"]: e["value"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
                 if e["name"].startswith("MMFLEET_") and "value" in e}  # fmt: skip
    kubectl(cluster.kubeconfig, "create", "namespace", release_ns)
    kubectl(cluster.kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump_all(docs))
    account = next(d for d in docs if d["kind"] == "ServiceAccount")["metadata"]["name"]
    token = kubectl(cluster.kubeconfig, "create", "token", account, "-n", release_ns, "--duration", "1h").strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": account}}],
        "current-context": "sa",
    }
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    env = {**chart_env, "MMFLEET_PROMETHEUS_URL": "", "MMFLEET_HEALTH_ADDRESS": "", "MMFLEET_LOG_FORMAT": "plain"}
    assert (env["MMFLEET_NAMESPACES"], env["MMFLEET_LEADER_ELECTION_NAMESPACE"]) == (namespace, release_ns)
    process = OperatorProcess(kubeconfig, tmp_path / "operator.log", env=env)
    operator.stop()
    try:
        process.start()
        yield process, f"system:serviceaccount:{release_ns}:{account}"
    finally:
        process.stop()
        operator.start()
        kubectl(cluster.kubeconfig, "delete", "-f", "-", "--ignore-not-found", stdin=yaml.safe_dump_all(docs))
        kubectl(cluster.kubeconfig, "delete", "namespace", release_ns, "--wait=false")


def test_with_only_its_watched_namespaces_roles_the_operator_serves_them_and_may_write_nowhere_else(
    cluster: Cluster, api: Any, namespace: str, namespaced_operator: tuple[OperatorProcess, str]
) -> None:
    process, user = namespaced_operator
    fleet = Fleet(api, namespace)
    fleet.create(mmi("scoped", replicas=1))
    try:
        fleet.wait_ready("scoped", timeout=90)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{process.tail(60)}") from error
    events = (json.loads(line) for line in cluster.audit_log.read_text().splitlines() if line.strip())
    refused = {
        (e["verb"], e["objectRef"].get("resource"), e["objectRef"].get("namespace"))
        for e in events
        if e["user"]["username"] == user and e.get("objectRef") and e["responseStatus"]["code"] == 403
    }
    assert refused == set(), "the namespaced RBAC refused calls the operator needs"
    auth = client.AuthorizationV1Api(api)

    def allowed(verb: str, resource: str, group: str, where: str | None) -> bool:
        review = {"spec": {"user": user, "resourceAttributes": {"verb": verb, "resource": resource, "group": group}}}
        if where is not None:
            review["spec"]["resourceAttributes"]["namespace"] = where  # type: ignore[index]
        return bool(auth.create_subject_access_review(review).status.allowed)

    assert allowed("patch", "deployments", "apps", namespace)
    for verb, resource, group in (("create", "deployments", "apps"), ("patch", "services", ""), ("get", "pods", "")):
        assert not allowed(verb, resource, group, "kube-system"), (verb, resource)
        assert not allowed(verb, resource, group, None), f"{verb} {resource} cluster-wide"
