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
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from mmfleet.clouds import COLLECTOR_ENDPOINT
from mmfleet.clouds.collector import (
    AWS_REGION_PLACEHOLDER,
    COLLECTOR_IMAGE,
    COLLECTOR_NAME,
    COLLECTOR_NAMESPACE,
    COLLECTOR_SECRET,
    COLLECTOR_VERSION,
    CollectorSettings,
    collector_config,
    env_patch_header,
    header,
    kustomize_env_patch,
    secret_keys,
    to_yaml,
)
from mmfleet.config import OperatorConfig
from mmfleet.status import collector_service
from tests.helpers.manifests import BASE, CHART, OVERLAYS, is_collector, kustomize, strip_template
from tests.helpers.repo import K8S_VERSION, ROOT, WATCH_ONE_NAMESPACE, helm_binary

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


def generated_env_patch(cloud: str) -> str:
    settings = CollectorSettings(cloud=cloud)  # type: ignore[arg-type]
    return to_yaml(kustomize_env_patch(settings), header=env_patch_header(settings))


@pytest.mark.parametrize("cloud", CLOUDS)
def test_committed_env_patches_equal_the_generator(cloud: str) -> None:
    assert (kustomize_dir(cloud) / "collector-env.yaml").read_text() == generated_env_patch(cloud), "run `make crds`"


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


def test_the_operator_gives_fleets_the_collector_it_installs() -> None:
    """MMFLEET_COLLECTOR_ENDPOINT, the fleets' default (pods and TracingReady), is the installed collector's Service,
    where the operator's own spans go too."""
    operator = next(o for o in kustomize(BASE) if o["kind"] == "Deployment" and not is_collector(o))
    variables = {e["name"]: e.get("value") for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert variables["MMFLEET_COLLECTOR_ENDPOINT"] == variables["OTEL_EXPORTER_OTLP_ENDPOINT"] == COLLECTOR_ENDPOINT
    assert OperatorConfig(collector_endpoint=variables["MMFLEET_COLLECTOR_ENDPOINT"]).collector_endpoint
    assert variables["MMFLEET_CLUSTER_DOMAIN"] == OperatorConfig().cluster_domain
    service = by_kind(collector_objects("generic"), "Service")["metadata"]
    looked_up = collector_service(variables["MMFLEET_COLLECTOR_ENDPOINT"], "ml", variables["MMFLEET_CLUSTER_DOMAIN"])
    assert looked_up == (service["namespace"], service["name"])


def test_rbac_is_what_k8s_attributes_reads_and_nothing_more() -> None:
    objs = collector_objects("generic")
    rules = by_kind(objs, "ClusterRole")["rules"]
    granted = {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    read = ("get", "list", "watch")
    # No replicasets: at the pinned k8sattributes the deployment name is cut from the ReplicaSet name.
    assert granted == {("", r, v) for r in ("pods", "namespaces") for v in read}
    binding = by_kind(objs, "ClusterRoleBinding")
    account = by_kind(objs, "ServiceAccount")["metadata"]
    assert binding["roleRef"]["name"] == by_kind(objs, "ClusterRole")["metadata"]["name"]
    subject = {"kind": "ServiceAccount", "name": account["name"], "namespace": COLLECTOR_NAMESPACE}
    assert binding["subjects"] == [subject]
    assert by_kind(objs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == account["name"]


@pytest.mark.parametrize("cloud", CLOUDS)
def test_collector_container_takes_each_key_its_configuration_reads_from_the_secret(cloud: str) -> None:
    """Per key and not optional: without the Secret or a key the pod does not start (CreateContainerConfigError),
    which TracingReady sees as CollectorNotReady; envFrom with optional would start a collector exporting nowhere."""
    container = by_kind(collector_objects(cloud), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "envFrom" not in container
    variables = {e["name"]: e for e in container["env"]}
    settings = CollectorSettings(cloud=cloud)  # type: ignore[arg-type]
    for key in secret_keys(settings):
        assert variables.pop(key)["valueFrom"] == {"secretKeyRef": {"name": COLLECTOR_SECRET, "key": key}}
    if cloud == "eks":
        assert variables.pop("AWS_REGION") == {"name": "AWS_REGION", "value": AWS_REGION_PLACEHOLDER}
    assert set(variables) == {"MY_POD_IP", "GOMEMLIMIT"}


def test_collector_container_runs_the_pinned_image_and_probes_its_health() -> None:
    container = by_kind(collector_objects("generic"), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == COLLECTOR_IMAGE
    assert container["args"] == ["--config=/conf/config.yaml"]
    variables = {e["name"]: e for e in container["env"]}
    assert variables["MY_POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
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
    docs = [d for d in yaml.safe_load_all(strip_template(text)) if d]
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


def _chart_secret_keys(config: str) -> list[str]:
    """What the chart's template finds in a configuration: its regex, applied as Helm's regexFindAll would."""
    template = (CHART / "templates/collector.yaml").read_text()
    found = re.search(r"regexFindAll `([^`]+)` \$config -1", template)
    assert found, "the template no longer derives the Secret's keys from the configuration"
    keys: list[str] = []
    for match in re.findall(found.group(1), config):
        key = match.removeprefix("${env:").removesuffix("}")
        if key not in ("MY_POD_IP", "AWS_REGION") and key not in keys:
            keys.append(key)
    return keys


@pytest.mark.parametrize("cloud", CLOUDS)
def test_chart_gives_the_collector_each_secret_key_its_configuration_reads(cloud: str) -> None:
    settings = CollectorSettings(cloud=cloud)  # type: ignore[arg-type]
    assert _chart_secret_keys(generated(cloud)) == list(secret_keys(settings))
    sls = CollectorSettings(cloud="ack", ack_backend="sls", endpoint="cn-hangzhou.log.aliyuncs.com")
    assert _chart_secret_keys(to_yaml(collector_config(sls))) == list(secret_keys(sls))  # a collector.config too


def test_chart_secret_keys_are_required_and_the_eks_region_too() -> None:
    template = (CHART / "templates/collector.yaml").read_text()
    assert "envFrom" not in template and "optional:" not in template
    assert (
        "secretKeyRef:\n              name: {{ $.Values.collector.secretName }}\n              key: {{ . }}" in template
    )
    assert re.search(r'contains "\$\{env:AWS_REGION\}" \$config', template)
    assert re.search(r"required \"collector.awsRegion: [^\"]+\" \.Values\.collector\.awsRegion", template)


def _helm(*args: str) -> subprocess.CompletedProcess[str]:
    command = [str(helm_binary()), "template", "t", str(CHART), *WATCH_ONE_NAMESPACE, *args]
    if "--namespace" not in args:
        command += ["--namespace", "mmfleet-system"]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("cloud", CLOUDS)
def test_helm_renders_one_required_secret_key_per_variable(cloud: str) -> None:
    region = ["--set", "collector.awsRegion=us-west-2"] if cloud == "eks" else []
    result = _helm("--set", f"collector.cloud={cloud}", *region)
    assert result.returncode == 0, result.stderr
    deployment = next(
        d
        for d in yaml.safe_load_all(result.stdout)
        if d and d["kind"] == "Deployment" and d["metadata"]["name"] == COLLECTOR_NAME
    )
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    refs = [e["valueFrom"]["secretKeyRef"] for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})]
    keys = secret_keys(CollectorSettings(cloud=cloud))  # type: ignore[arg-type]
    assert refs == [{"name": COLLECTOR_SECRET, "key": key} for key in keys]
    assert "envFrom" not in container


def _operator_env(rendered: str) -> dict[str, str]:
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    operator = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] != COLLECTOR_NAME)
    return {e["name"]: e.get("value", "") for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_helm_gives_fleets_the_collector_of_its_namespace_or_the_reused_one() -> None:
    """Installed outside mmfleet-system, or reusing a collector: the fleets' default follows, not a fixed name."""
    helm = _helm("--set", "collector.cloud=generic", "--namespace", "observability")
    assert helm.returncode == 0, helm.stderr
    variables = _operator_env(helm.stdout)
    installed = "http://mmfleet-otel-collector.observability.svc:4317"
    assert variables["MMFLEET_COLLECTOR_ENDPOINT"] == variables["OTEL_EXPORTER_OTLP_ENDPOINT"] == installed
    assert collector_service(installed, "ml") == ("observability", COLLECTOR_NAME)
    reused = _helm("--set", "collector.endpoint=http://otel.tracing:4317", "--set", "clusterDomain=corp.example")
    assert reused.returncode == 0, reused.stderr
    variables = _operator_env(reused.stdout)
    assert (
        variables["MMFLEET_COLLECTOR_ENDPOINT"]
        == variables["OTEL_EXPORTER_OTLP_ENDPOINT"]
        == "http://otel.tracing:4317"
    )
    assert variables["MMFLEET_CLUSTER_DOMAIN"] == "corp.example"


def test_chart_sets_the_fleets_collector_from_its_collector_values() -> None:
    deployment = (CHART / "templates/deployment.yaml").read_text()
    assert re.search(
        r'MMFLEET_COLLECTOR_ENDPOINT\n\s+value: \{\{ include "mmfleet.collectorEndpoint" \. \| quote \}\}', deployment
    )
    helpers = (CHART / "templates/_helpers.tpl").read_text()
    assert (
        '.Values.collector.endpoint | default (printf "http://mmfleet-otel-collector.%s.svc:4317" .Release.Namespace)'
        in helpers
    )


def test_helm_refuses_eks_without_a_region() -> None:
    result = _helm("--set", "collector.cloud=eks")
    assert result.returncode != 0
    assert "collector.awsRegion" in result.stderr


def test_chart_reads_each_clouds_file_and_installs_none_for_auto() -> None:
    assert "files/collector-%s.yaml" in (CHART / "templates/collector.yaml").read_text()
    helpers = (CHART / "templates/_helpers.tpl").read_text()
    assert re.search(r'has \$cloud \(list "auto" "eks" "aks" "ack" "generic"\)', helpers)
    assert '(or .Values.collector.config (ne $cloud "auto"))' in helpers
    assert {p.name for p in (CHART / "files").glob("collector-*")} == {f"collector-{c}.yaml" for c in CLOUDS}
