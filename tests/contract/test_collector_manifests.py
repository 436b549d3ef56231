"""The shipped OpenTelemetry Collector: generated configurations equal the generator, and the objects around them.

- Each ``collector-config.yaml`` (kustomize base: generic; overlays: their cloud) and each chart file
  ``files/collector-<cloud>.yaml`` is exactly ``mmfleet collector-config --cloud <cloud>``: `make crds`
  regenerates them, and this fails when they drift.
- kustomize builds the collector into every overlay with its cloud's configuration, under the name and
  port that ``COLLECTOR_ENDPOINT`` gives the pods, with only the RBAC k8s_attributes needs, credentials
  only from the Secret, and the restricted pod security standard.
- The chart's template keeps the same literal parts (Helm is not installed here; see test_manifests.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from mmfleet.clouds import COLLECTOR_ENDPOINT
from mmfleet.clouds.collector import (
    COLLECTOR_IMAGE,
    COLLECTOR_NAME,
    COLLECTOR_NAMESPACE,
    COLLECTOR_SECRET,
    COLLECTOR_VERSION,
    CollectorSettings,
    collector_config,
    header,
    to_yaml,
)
from tests.conftest import ROOT
from tests.contract.test_manifests import BASE, CHART, K8S_VERSION, OVERLAYS, _strip_template, is_collector, kustomize

Obj = dict[str, Any]
CLOUDS = ["generic", *OVERLAYS]


def generated(cloud: str) -> str:
    settings = CollectorSettings(cloud=cloud)  # type: ignore[arg-type]
    return to_yaml(collector_config(settings), header=header(settings))


def kustomize_dir(cloud: str) -> Path:
    return BASE if cloud == "generic" else ROOT / "manifests/overlays" / cloud


@pytest.mark.parametrize("cloud", CLOUDS)
def test_committed_configurations_equal_the_generator(cloud: str) -> None:
    fix = "run `make crds` to regenerate"
    assert (kustomize_dir(cloud) / "collector-config.yaml").read_text() == generated(cloud), fix
    assert (CHART / f"files/collector-{cloud}.yaml").read_text() == generated(cloud), fix


def collector_objects(cloud: str) -> list[Obj]:
    return [o for o in kustomize(kustomize_dir(cloud)) if is_collector(o)]


def by_kind(objs: list[Obj], kind: str) -> Obj:
    found = [o for o in objs if o["kind"] == kind]
    assert len(found) == 1, f"expected one collector {kind}, found {len(found)}"
    return found[0]


@pytest.mark.parametrize("cloud", CLOUDS)
def test_kustomize_installs_the_collector_with_its_clouds_configuration(cloud: str) -> None:
    objs = collector_objects(cloud)
    assert sorted(o["kind"] for o in objs) == sorted(
        ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "Service", "Deployment"]
    )
    for obj in objs:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    config_map = by_kind(objs, "ConfigMap")
    assert config_map["data"] == {"config.yaml": generated(cloud)}
    pod = by_kind(objs, "Deployment")["spec"]["template"]["spec"]
    assert pod["volumes"] == [{"name": "config", "configMap": {"name": config_map["metadata"]["name"]}}]


def test_the_service_is_the_endpoint_the_pods_are_given() -> None:
    objs = collector_objects("generic")
    service = by_kind(objs, "Service")
    host = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    grpc = next(p for p in service["spec"]["ports"] if p["name"] == "otlp-grpc")
    assert f"http://{host}:{grpc['port']}" == COLLECTOR_ENDPOINT
    assert (service["metadata"]["name"], service["metadata"]["namespace"]) == (COLLECTOR_NAME, COLLECTOR_NAMESPACE)
    deployment = by_kind(objs, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    ports = {p["name"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports


def test_rbac_is_what_k8s_attributes_reads_and_nothing_more() -> None:
    objs = collector_objects("generic")
    rules = by_kind(objs, "ClusterRole")["rules"]
    granted = {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    read = ("get", "list", "watch")
    assert granted == {("", r, v) for r in ("pods", "namespaces") for v in read} | {
        ("apps", "replicasets", v) for v in read
    }
    binding = by_kind(objs, "ClusterRoleBinding")
    account = by_kind(objs, "ServiceAccount")["metadata"]
    assert binding["roleRef"]["name"] == by_kind(objs, "ClusterRole")["metadata"]["name"]
    subject = {"kind": "ServiceAccount", "name": account["name"], "namespace": COLLECTOR_NAMESPACE}
    assert binding["subjects"] == [subject]
    assert by_kind(objs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == account["name"]


def test_collector_container_takes_credentials_only_from_the_secret() -> None:
    container = by_kind(collector_objects("generic"), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == COLLECTOR_IMAGE
    assert container["args"] == ["--config=/conf/config.yaml"]
    assert container["envFrom"] == [{"secretRef": {"name": COLLECTOR_SECRET, "optional": True}}]
    variables = {e["name"]: e for e in container["env"]}
    assert variables["MY_POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert set(variables) == {"MY_POD_IP", "GOMEMLIMIT"}
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/", "port": "health"}
    assert {"name": "health", "containerPort": 13133, "protocol": "TCP"} in container["ports"]


def test_collector_pod_meets_the_restricted_pod_security_standard() -> None:
    pod = by_kind(collector_objects("generic"), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    context = pod["containers"][0]["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert "hostNetwork" not in pod


# --- Helm chart --------------------------------------------------------------------------


def _chart_documents() -> dict[str, Obj]:
    text = (CHART / "templates/collector.yaml").read_text()
    docs = [d for d in yaml.safe_load_all(_strip_template(text)) if d]
    return {d["kind"]: d for d in docs}


def test_chart_values_pin_the_same_collector() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["collector"]
    assert f"{values['image']['repository']}:{values['image']['tag']}" == COLLECTOR_IMAGE
    assert values["image"]["tag"] == COLLECTOR_VERSION
    assert values["secretName"] == COLLECTOR_SECRET
    assert (values["enabled"], values["endpoint"], values["cloud"], values["config"]) == (True, "", "", "")
    base = by_kind(collector_objects("generic"), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert values["resources"] == base["resources"]


def test_chart_collector_matches_the_base() -> None:
    chart = _chart_documents()
    base = {o["kind"]: o for o in collector_objects("generic")}
    assert set(chart) == set(base)
    assert chart["ClusterRole"]["rules"] == base["ClusterRole"]["rules"]
    assert chart["Service"]["spec"]["ports"] == base["Service"]["spec"]["ports"]
    for kind in ("ServiceAccount", "Service", "Deployment", "ConfigMap"):
        assert chart[kind]["metadata"]["name"] == COLLECTOR_NAME, kind
    container = chart["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    base_container = base["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    for key in ("args", "ports", "readinessProbe", "livenessProbe", "securityContext", "volumeMounts"):
        assert container[key] == base_container[key], key
    chart_pod = chart["Deployment"]["spec"]["template"]["spec"]
    base_pod = base["Deployment"]["spec"]["template"]["spec"]
    assert chart_pod["securityContext"] == base_pod["securityContext"]
    assert chart_pod["volumes"][0]["configMap"]["name"] == COLLECTOR_NAME


def test_chart_reads_each_clouds_file_and_installs_none_for_auto() -> None:
    assert "files/collector-%s.yaml" in (CHART / "templates/collector.yaml").read_text()
    helpers = (CHART / "templates/_helpers.tpl").read_text()
    assert re.search(r'has \$cloud \(list "auto" "eks" "aks" "ack" "generic"\)', helpers)
    assert '(or .Values.collector.config (ne $cloud "auto"))' in helpers
    assert {p.name for p in (CHART / "files").iterdir()} == {f"collector-{c}.yaml" for c in CLOUDS}
