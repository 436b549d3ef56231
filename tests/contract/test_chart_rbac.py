"""The chart's RBAC as helm renders it: cluster-wide by default; with plain watchNamespaces, writes only there."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.helpers.repo import K8S_VERSION, ROOT, helm_binary

CHART = ROOT / "charts/mmfleet"
BASE_RBAC = ROOT / "manifests/base/rbac.yaml"
CLUSTER_SCOPED = {"customresourcedefinitions", "namespaces", "nodes"}
Obj = dict[str, Any]


def render(*watch: str) -> list[Obj]:
    args = ["--set-json", f"watchNamespaces={json.dumps(list(watch))}"]
    command = [str(helm_binary()), "template", "t", str(CHART), "--namespace", "mmfleet-system", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def base_rules() -> list[Obj]:
    rules: list[Obj] = next(d for d in yaml.safe_load_all(BASE_RBAC.read_text()) if d["kind"] == "ClusterRole")["rules"]
    return rules


def same(rules: list[Obj], others: list[Obj]) -> bool:
    """The same rules, in whatever order (the chart lists the cluster-scoped ones first)."""
    return sorted(map(json.dumps, rules)) == sorted(map(json.dumps, others))


def named(docs: list[Obj], kind: str, name: str = "t-mmfleet") -> list[Obj]:
    return [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]


@pytest.mark.parametrize("watch", [(), ("ml-*",), ("ml", "!kube-system")], ids=["all", "pattern", "negation"])
def test_cluster_wide_unless_every_watched_namespace_is_a_plain_name(watch: tuple[str, ...]) -> None:
    """Namespaces a pattern will match are not known at install time: the ClusterRole holds every rule."""
    docs = render(*watch)
    assert same(named(docs, "ClusterRole")[0]["rules"], base_rules())
    assert named(docs, "Role") == []


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
