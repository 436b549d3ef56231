"""The chart's RBAC as helm renders it: where the operator may write is the installer's explicit choice.

With neither watchNamespaces nor clusterWide the install fails naming both (issue 23 item 8: the default install
could write Deployments, ServiceAccounts and ConfigMaps in every namespace, kube-system included); plain names give a
Role in each; clusterWide gives the ClusterRole every rule, and the operator it configures refuses fleets in the
system namespaces.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import kubernetes_validate
import pytest
import yaml

from mmfleet.api import ReadyReason
from mmfleet.handlers import records
from mmfleet.validation import SYSTEM_NAMESPACES
from tests.helpers.operator_state import environment_config, served_in
from tests.helpers.repo import K8S_VERSION, ROOT, helm_binary

CHART = ROOT / "charts/mmfleet"
BASE_RBAC = ROOT / "manifests/base/rbac.yaml"
CLUSTER_SCOPED = {"customresourcedefinitions", "namespaces", "nodes"}
Obj = dict[str, Any]


def helm_template(*args: str) -> subprocess.CompletedProcess[str]:
    command = [str(helm_binary()), "template", "t", str(CHART), "--namespace", "mmfleet-system", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def render(*watch: str, cluster_wide: bool = False) -> list[Obj]:
    args = ["--set-json", f"watchNamespaces={json.dumps(list(watch))}"]
    done = helm_template(*args, *(["--set", "clusterWide=true"] if cluster_wide else []))
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def base_rules() -> list[Obj]:
    """The base's rules as the chart's release ``t`` has them: its picker ClusterRole is named after the release."""
    rules: list[Obj] = next(d for d in yaml.safe_load_all(BASE_RBAC.read_text()) if d["kind"] == "ClusterRole")["rules"]
    picker = {"resourceNames": ["t-mmfleet-endpoint-picker"]}
    return [{**rule, **picker} if "resourceNames" in rule else rule for rule in rules]


def same(rules: list[Obj], others: list[Obj]) -> bool:
    """The same rules, in whatever order (the chart lists the cluster-scoped ones first)."""
    return sorted(map(json.dumps, rules)) == sorted(map(json.dumps, others))


def named(docs: list[Obj], kind: str, name: str = "t-mmfleet") -> list[Obj]:
    return [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]


def test_the_default_values_grant_no_write_anywhere_and_fail_naming_the_values_to_set() -> None:
    done = helm_template()
    assert done.returncode != 0
    assert "choose where the operator may write: set watchNamespaces" in done.stderr
    assert "or clusterWide=true" in done.stderr
    assert "kind: ClusterRole" not in done.stdout


@pytest.mark.parametrize("watch", [("ml-*",), ("ml", "!kube-system")], ids=["pattern", "negation"])
def test_a_pattern_needs_cluster_wide_since_its_namespaces_are_unknown_at_install_time(watch: tuple[str, ...]) -> None:
    done = helm_template("--set-json", f"watchNamespaces={json.dumps(list(watch))}")
    assert done.returncode != 0
    assert f"watchNamespaces: {json.dumps(list(watch), separators=(',', ':'))} holds a pattern" in done.stderr
    assert "set clusterWide=true as well, or list the namespaces by name" in done.stderr


@pytest.mark.parametrize("namespace", SYSTEM_NAMESPACES)
def test_a_system_namespace_is_never_given_write_rights(namespace: str) -> None:
    done = helm_template("--set-json", f"watchNamespaces={json.dumps(['ml', namespace])}")
    assert done.returncode != 0
    assert f'watchNamespaces: "{namespace}" is a system namespace' in done.stderr


@pytest.mark.parametrize("watch", [(), ("ml-*",), ("ml", "!kube-system")], ids=["all", "pattern", "negation"])
def test_cluster_wide_only_when_asked_and_then_the_cluster_role_holds_every_rule(watch: tuple[str, ...]) -> None:
    docs = render(*watch, cluster_wide=True)
    assert same(named(docs, "ClusterRole")[0]["rules"], base_rules())
    assert named(docs, "Role") == []


def test_cluster_wide_the_installed_operator_refuses_fleets_in_the_system_namespaces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ClusterRole reaches kube-system too (RBAC cannot leave a namespace out): the operator, configured as the
    chart's Deployment configures it, applies nothing there and says why in the fleet's Ready condition."""
    [deployment] = named(render(cluster_wide=True), "Deployment")
    config = environment_config(deployment["spec"]["template"]["spec"]["containers"][0]["env"], monkeypatch)
    assert config.namespaces == ()  # kopf watches the whole cluster
    monkeypatch.setattr(records, "kopf_event", lambda *_: None)
    for namespace in SYSTEM_NAMESPACES:
        refused = f"{ReadyReason.POLICY_DENIED}: metadata.namespace: {namespace!r} is not served"
        assert served_in(config, namespace).startswith(refused)
    assert served_in(config, "ml") == "applied"


def test_plain_watched_namespaces_get_the_write_rights_in_a_role_each_and_nothing_cluster_wide() -> None:
    docs = render("ml", "team-b")
    cluster = named(docs, "ClusterRole")[0]["rules"]
    assert {r for rule in cluster for r in rule["resources"]} == CLUSTER_SCOPED
    assert all(set(rule["verbs"]) <= {"list", "watch"} for rule in cluster), "no write is cluster-wide"
    roles = named(docs, "Role")
    for obj in [*roles, *named(docs, "RoleBinding")]:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["ml", "team-b"]
    for role in roles:  # together, the same rules as cluster-wide: nothing lost, nothing added
        assert same(cluster + role["rules"], base_rules())
    service_account = named(docs, "ServiceAccount")[0]["metadata"]
    for binding in named(docs, "RoleBinding"):
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "t-mmfleet"}
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": service_account["name"], "namespace": "mmfleet-system"}
        ]
    # The collector's Service in the release namespace, which is not watched, can still be looked up.
    lookup = named(docs, "Role", "t-mmfleet-collector-lookup")[0]
    assert lookup["metadata"]["namespace"] == "mmfleet-system"
    assert {(r["resources"][0], tuple(r["verbs"])) for r in lookup["rules"]} == {
        ("services", ("list",)),
        ("endpointslices", ("list",)),
    }
    assert named(render("ml", "mmfleet-system"), "Role", "t-mmfleet-collector-lookup") == []
