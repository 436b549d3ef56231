"""The install artefacts: kustomize base and overlays, RBAC, the Argo CD health check, the Helm chart.

Fast and without a cluster. `kubectl kustomize` is the real binary (built into ~/.cache/mmfleet
by the local-cluster tooling); without it the kustomize tests skip and say why. Helm is not
installed, so the chart is not rendered: its ClusterRole rules and the Deployment's settings are
compared with the kustomize base as text, which works because the templates keep those parts
literal.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterable
from typing import Any

import kubernetes_validate
import pytest
import yaml

from mmfleet import config, telemetry
from mmfleet.admin_policy import AdminPolicy
from mmfleet.api import ReadyReason
from mmfleet.clouds import COLLECTOR_ENDPOINT
from mmfleet.handlers import records
from mmfleet.validation import SYSTEM_NAMESPACES
from mmfleet_lab.twin.spans import kubelet_env
from tests.helpers.manifests import BASE, CHART, OVERLAYS, Obj, is_collector, kustomize, strip_template
from tests.helpers.operator_state import environment_config, served_in
from tests.helpers.repo import K8S_VERSION, ROOT, VERSION
from tests.helpers.tools import missing

ARGOCD = ROOT / "manifests/argocd"
CRD_FILE = ROOT / "crds/multimodalinferences.mmfleet.io.yaml"
NAMESPACE = "mmfleet-system"
IMAGE = f"ghcr.io/mmfleet/operator:{VERSION}"
HEALTH_KEY = "resource.customizations.health.mmfleet.io_MultimodalInference"


def _triples(group: str, resources: Iterable[str], verbs: Iterable[str]) -> set[tuple[str, str, str]]:
    return {(group, r, v) for r in resources for v in verbs}


# Every (apiGroup, resource, verb) the operator uses, read off the code. Server-side apply that
# creates an object is authorized as `create` as well as `patch` (apiserver patch.go), so each
# applied kind needs both. kopf reads through list+watch only.
EXPECTED_RULES: set[tuple[str, str, str]] = (
    # kopf: resource discovery (CRD list+watch), namespaces when restricted by MMFLEET_NAMESPACES,
    # and Events (POST to core v1 events only).
    _triples("apiextensions.k8s.io", ["customresourcedefinitions"], ["list", "watch"])
    | _triples("", ["namespaces"], ["list", "watch"])
    | _triples("", ["events"], ["create"])
    # The MultimodalInference: kopf watches it and patches its annotations/finalizers;
    # kube.Kube.patch_status writes status; children's blockOwnerDeletion needs finalizers update.
    | _triples("mmfleet.io", ["multimodalinferences"], ["list", "watch", "patch"])
    | _triples("mmfleet.io", ["multimodalinferences/status"], ["patch"])
    | _triples("mmfleet.io", ["multimodalinferences/finalizers"], ["update"])
    # Children applied by kube.Kube.apply and watched by controller's indexes and watch_* handlers; read
    # once before the first apply (handlers.reconcile._claim_names: never adopt an object of that name).
    | _triples("apps", ["deployments"], ["get", "list", "watch", "create", "patch", "delete"])  # the picker pruned
    | _triples("apps", ["deployments/scale"], ["patch"])  # kube.Kube.scale: server-side apply on /scale
    | _triples("", ["services", "serviceaccounts"], ["get", "list", "watch", "create", "patch", "delete"])
    | _triples("", ["configmaps"], ["get", "list", "watch", "create", "patch", "delete"])  # pruned
    | _triples("policy", ["poddisruptionbudgets"], ["get", "list", "watch", "create", "patch"])
    | _triples("networking.k8s.io", ["networkpolicies"], ["get", "list", "watch", "create", "patch"])
    | _triples("monitoring.coreos.com", ["podmonitors"], ["get", "list", "watch", "create", "patch", "delete"])
    | _triples("", ["pods"], ["list", "watch"])  # index fleet_pods
    | _triples("", ["pods"], ["patch"])  # kube.Kube.mark_pod: warm standby takes a sleeping pod out of routing
    | _triples("", ["pods/log"], ["get"])  # kube.Kube.pod_log: where each new replica's start went
    | _triples("inference.networking.k8s.io", ["inferencepools"], ["get", "list", "watch", "create", "patch", "delete"])
    | _triples("gateway.networking.k8s.io", ["httproutes"], ["get", "list", "watch", "create", "patch", "delete"])
    | _triples("rbac.authorization.k8s.io", ["rolebindings"], ["get", "list", "watch", "create", "patch", "delete"])
    | _triples("rbac.authorization.k8s.io", ["clusterroles"], ["bind"])  # the picker's ClusterRole only, by name
    | _triples("", ["persistentvolumeclaims"], ["get"])  # status.shared_cache_problem reads the shared claim
    | _triples("", ["nodes"], ["list"])  # kube.Kube.provider_ids (cloud detection)
    # TracingReady's CollectorNotReady: the collector Service's EndpointSlices (handlers.discovery._ready_endpoints).
    | _triples("discovery.k8s.io", ["endpointslices"], ["list"])
)
# Verbs that would let the operator grant itself more than this list.
ESCALATING = {"*", "escalate", "bind", "impersonate"}


def is_picker_role(obj: Obj) -> bool:
    return bool(obj["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "endpoint-picker")


def one(objs: list[Obj], kind: str) -> Obj:
    """The operator's one object of this kind (the collector's and the endpoint pickers' ClusterRole are left out)."""
    found = [o for o in objs if o["kind"] == kind and not is_collector(o) and not is_picker_role(o)]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def granted(rules: list[Obj]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def operator_container(objs: list[Obj]) -> Obj:
    containers: list[Obj] = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["operator"]
    return containers[0]


def env(container: Obj) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


@pytest.fixture(scope="module")
def base() -> list[Obj]:
    return kustomize(BASE)


# --- kustomize ---------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["base", *OVERLAYS])
def test_kustomization_builds_valid_kubernetes(target: str) -> None:
    objs = kustomize(BASE if target == "base" else ROOT / "manifests/overlays" / target)
    assert {o["kind"] for o in objs if not is_collector(o)} == {
        "Namespace",
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
    }
    for obj in objs:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.parametrize("cloud", OVERLAYS)
def test_overlay_sets_only_the_default_cloud(base: list[Obj], cloud: str) -> None:
    objs = kustomize(ROOT / "manifests/overlays" / cloud)
    assert env(operator_container(objs)) == {**env(operator_container(base)), "MMFLEET_DEFAULT_CLOUD": cloud}

    def same(obj: Obj) -> bool:  # the operator's Deployment and the collector's configuration differ
        return obj["kind"] != "Deployment" and not (is_collector(obj) and obj["kind"] == "ConfigMap")

    assert [o for o in objs if same(o)] == [o for o in base if same(o)]


def test_base_ships_the_generated_crd_itself(base: list[Obj]) -> None:
    """The CRD comes from crds/, not from a copy; only the Argo CD annotation is added."""
    built = one(base, "CustomResourceDefinition")
    annotations = built["metadata"].pop("annotations")
    assert annotations == {"argocd.argoproj.io/sync-options": "Prune=false,Delete=false"}
    assert built == yaml.safe_load(CRD_FILE.read_text())
    assert not list((ROOT / "manifests").rglob("multimodalinferences.mmfleet.io.yaml"))


def test_namespaced_objects_live_in_mmfleet_system(base: list[Obj]) -> None:
    assert one(base, "Namespace")["metadata"]["name"] == NAMESPACE
    for obj in base:
        if obj["kind"] in ("ServiceAccount", "Deployment", "Service", "ConfigMap"):
            assert obj["metadata"]["namespace"] == NAMESPACE


# --- RBAC --------------------------------------------------------------------------------


def test_cluster_role_grants_exactly_what_the_operator_uses(base: list[Obj]) -> None:
    rules = one(base, "ClusterRole")["rules"]
    have = granted(rules)
    assert EXPECTED_RULES - have == set(), "missing"
    assert have - EXPECTED_RULES == set(), "granted but not used by the operator"


def test_cluster_role_is_nothing_like_cluster_admin(base: list[Obj]) -> None:
    for rule in one(base, "ClusterRole")["rules"]:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], rule
        if rule["verbs"] == ["bind"]:  # the picker's ClusterRole, by name: the one RoleBinding the operator makes
            assert rule["resources"] == ["clusterroles"] and rule["resourceNames"] == ["mmfleet-endpoint-picker"], rule
        else:
            assert not ESCALATING & set(rule["verbs"]), rule
        assert "nonResourceURLs" not in rule, rule
        assert "secrets" not in rule["resources"], rule


def test_leader_election_may_touch_its_own_lease_and_nothing_else(base: list[Obj]) -> None:
    role = one(base, "Role")
    assert role["metadata"]["namespace"] == one(base, "Deployment")["metadata"]["namespace"]
    lease = env(operator_container(base))["MMFLEET_LEADER_ELECTION_LEASE"]
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [lease],
            "verbs": ["get", "update"],
        },
    ]
    binding = one(base, "RoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == one(base, "ClusterRoleBinding")["subjects"]


def test_binding_gives_the_role_to_the_operator_service_account(base: list[Obj]) -> None:
    binding = one(base, "ClusterRoleBinding")
    account = one(base, "ServiceAccount")["metadata"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": one(base, "ClusterRole")["metadata"]["name"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["name"], "namespace": NAMESPACE}]
    pod = one(base, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["name"]


# --- the operator Deployment -------------------------------------------------------------


def test_operator_runs_once_with_recreate(base: list[Obj]) -> None:
    spec = one(base, "Deployment")["spec"]
    assert spec["replicas"] == 1, "kopf runs standalone: a second replica would handle every event twice"
    assert spec["strategy"] == {"type": "Recreate"}


def test_operator_container(base: list[Obj]) -> None:
    container = operator_container(base)
    assert container["image"] == IMAGE
    assert container["args"] == ["run"]
    defaults = config.OperatorConfig()
    port, metrics = (int(address.rsplit(":", 1)[1]) for address in (defaults.health_address, defaults.metrics_address))
    assert container["ports"] == [
        {"name": "health", "containerPort": port, "protocol": "TCP"},
        {"name": "metrics", "containerPort": metrics, "protocol": "TCP"},
    ]
    for probe in ("startupProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert env(container)["MMFLEET_HEALTH_ADDRESS"].endswith(f":{port}")
    assert env(container)["MMFLEET_METRICS_ADDRESS"].endswith(f":{metrics}")
    assert {"requests", "limits"} <= container["resources"].keys()


def test_the_base_is_cluster_wide_and_its_operator_refuses_fleets_in_the_system_namespaces(
    base: list[Obj], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The base's ClusterRole writes in every namespace (RBAC cannot leave one out); the operator it runs applies
    nothing in kube-system, kube-public or kube-node-lease (issue 23 item 8)."""
    config = environment_config(operator_container(base)["env"], monkeypatch)
    assert config.namespaces == ()
    monkeypatch.setattr(records, "kopf_event", lambda *_: None)
    for namespace in SYSTEM_NAMESPACES:
        assert served_in(config, namespace).startswith(f"{ReadyReason.POLICY_DENIED}: metadata.namespace: ")
    assert served_in(config, "team-a") == "applied"


def test_the_base_ships_the_closed_default_policy(base: list[Obj], monkeypatch: pytest.MonkeyPatch) -> None:
    """The base spells the policy out for an overlay to patch; it must be the one the operator defaults to."""
    assert environment_config(operator_container(base)["env"], monkeypatch).policy == AdminPolicy()


def test_every_env_var_is_one_the_operator_reads(base: list[Obj]) -> None:
    variables = env(operator_container(base))
    # Read by the OpenTelemetry SDK (its exporter, and Resource.create: test_operator_spans_name_their_pod).
    assert variables.pop("OTEL_EXPORTER_OTLP_ENDPOINT") == COLLECTOR_ENDPOINT
    assert variables.pop("OTEL_SERVICE_NAME") == telemetry.SERVICE_NAME
    assert variables.pop("OTEL_RESOURCE_ATTRIBUTES")
    assert set(variables) == set(config.env_variables().values())


def test_operator_spans_name_their_pod(base: list[Obj], monkeypatch: pytest.MonkeyPatch) -> None:
    """The resource of the operator's spans, from the Deployment's env as the kubelet resolves it for a pod of it
    (the downward API, then ``$(VAR)``), as ``telemetry.resource`` builds it with the OpenTelemetry SDK."""
    pod = {"metadata": {"name": "mmfleet-operator-7d9f8-abcde", "namespace": NAMESPACE}}
    resolved = kubelet_env(operator_container(base)["env"], pod)
    for name in ("OTEL_RESOURCE_ATTRIBUTES", "OTEL_SERVICE_NAME"):
        monkeypatch.setenv(name, resolved[name])
    attributes = telemetry.resource().attributes
    assert attributes["k8s.pod.name"] == "mmfleet-operator-7d9f8-abcde"
    assert attributes["k8s.namespace.name"] == NAMESPACE
    assert attributes["service.name"] == telemetry.SERVICE_NAME


def test_pod_meets_the_restricted_pod_security_standard(base: list[Obj]) -> None:
    pod = one(base, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    context = operator_container(base)["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["runAsNonRoot"] is True
    assert context["runAsUser"] == 65532
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "hostNetwork" not in pod and "hostPID" not in pod


# --- Argo CD -----------------------------------------------------------------------------


def test_argocd_application_installs_an_overlay_with_server_side_apply() -> None:
    app = yaml.safe_load((ARGOCD / "application.yaml").read_text())
    assert (app["apiVersion"], app["kind"]) == ("argoproj.io/v1alpha1", "Application")
    assert (ROOT / app["spec"]["source"]["path"] / "kustomization.yaml").exists()
    assert app["spec"]["source"]["path"] == "manifests/overlays/eks"
    assert "ServerSideApply=true" in app["spec"]["syncPolicy"]["syncOptions"]
    assert app["spec"]["destination"]["namespace"] == NAMESPACE


def test_argocd_health_check_is_registered_verbatim() -> None:
    script = (ARGOCD / "health.lua").read_text()
    for outcome in ("Healthy", "Degraded", "Progressing"):
        assert f'"{outcome}"' in script
    patch = yaml.safe_load((ARGOCD / "argocd-cm-patch.yaml").read_text())
    assert (patch["kind"], patch["metadata"]["name"], patch["metadata"]["namespace"]) == (
        "ConfigMap",
        "argocd-cm",
        "argocd",
    )
    assert patch["data"] == {HEALTH_KEY: script}


def _lua_literal(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"[{json.dumps(k)}] = {_lua_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "{" + ", ".join(_lua_literal(v) for v in value) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))


def _condition(kind: str, status: str, message: str = "", reason: str = "R") -> Obj:
    return {"type": kind, "status": status, "reason": reason, "message": message}


def _routed(reason: str) -> Obj:
    """A fleet whose servers are ready, with RoutingReady False for ``reason``."""
    conditions = [_condition("Ready", "True"), _condition("Degraded", "False"),
                  _condition("RoutingReady", "False", "picker qwen-epp ...", reason)]  # fmt: skip
    return {
        "metadata": {"generation": 1},
        "status": {"observedGeneration": 1, "phase": "Ready", "conditions": conditions},
    }


def _encoded(reason: str, ok: str = "False") -> Obj:
    """A fleet whose serving replicas are ready, with EncodeReady ``ok`` for ``reason``."""
    conditions = [_condition("Ready", "True"), _condition("Degraded", "False"),
                  _condition("EncodeReady", ok, "encode tier qwen-encode: ...", reason)]  # fmt: skip
    return {
        "metadata": {"generation": 1},
        "status": {"observedGeneration": 1, "phase": "Ready", "conditions": conditions},
    }


HEALTH_CASES: list[tuple[str, Obj, str]] = [
    ("no status", {"metadata": {"generation": 1}}, "Progressing"),
    (
        "stale generation",
        {
            "metadata": {"generation": 3},
            "status": {"observedGeneration": 2, "phase": "Ready", "conditions": [_condition("Ready", "True")]},
        },
        "Progressing",
    ),
    (
        "ready",
        {
            "metadata": {"generation": 2},
            "status": {
                "observedGeneration": 2,
                "phase": "Ready",
                "conditions": [_condition("Ready", "True", "2/2 replicas ready"), _condition("Degraded", "False")],
            },
        },
        "Healthy",
    ),
    (
        "failed",
        {
            "metadata": {"generation": 1},
            "status": {
                "observedGeneration": 1,
                "phase": "Failed",
                "conditions": [_condition("Ready", "False"), _condition("Degraded", "True", "bad spec")],
            },
        },
        "Degraded",
    ),
    (
        "degraded pods",
        {
            "metadata": {"generation": 1},
            "status": {
                "observedGeneration": 1,
                "phase": "Degraded",
                "conditions": [_condition("Ready", "False"), _condition("Degraded", "True", "ImagePullBackOff")],
            },
        },
        "Degraded",
    ),
    (
        "rolling out",
        {
            "metadata": {"generation": 1},
            "status": {
                "observedGeneration": 1,
                "phase": "Progressing",
                "conditions": [_condition("Ready", "False", "1/2 replicas ready"), _condition("Degraded", "False")],
            },
        },
        "Progressing",
    ),
    ("picker starting", _routed("PickerNotReady"), "Progressing"),
    ("picker crash-looping", _routed("PickerFailing"), "Degraded"),
    ("no InferencePool CRD", _routed("InferencePoolCRDMissing"), "Degraded"),
    ("no Gateway API", _routed("GatewayAPIMissing"), "Degraded"),
    ("encode tier starting", _encoded("EncodeReplicasNotReady"), "Progressing"),
    ("encode pod crash-looping", _encoded("EncodeReplicasFailing"), "Degraded"),
    ("encode tier ready", _encoded("EncodeReplicasReady", "True"), "Healthy"),
]


@pytest.mark.parametrize(("case", "obj", "expected"), HEALTH_CASES, ids=[c[0] for c in HEALTH_CASES])
def test_argocd_health_check_outcomes(case: str, obj: Obj, expected: str) -> None:
    """Runs health.lua the way Argo CD does (global `obj`, the returned table), with Lua 5.1 as Argo CD's gopher-lua."""
    lua = next((found for name in ("lua5.1", "luajit", "lua") if (found := shutil.which(name))), None)
    if lua is None:
        missing("no Lua interpreter (apt-get install lua5.1; make system-deps does) to run manifests/argocd/health.lua")
    script = (ARGOCD / "health.lua").read_text()
    # Argo CD sets the global `obj` and takes the table the chunk returns.
    program = "\n".join(
        [
            f"obj = {_lua_literal(obj)}",
            f"local hs = (function()\n{script}\nend)()",
            "print(hs.status)",
            "print(hs.message)",
        ]
    )
    result = subprocess.run([lua, "-"], input=program, capture_output=True, text=True, timeout=10, check=False)
    assert result.returncode == 0, result.stderr
    status, message = result.stdout.splitlines()[:2]
    assert status == expected, f"{case}: {message}"
    assert message


# --- Helm chart --------------------------------------------------------------------------


def test_chart_metadata_and_values_parse() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert (chart["apiVersion"], chart["name"], chart["version"], chart["appVersion"]) == (
        "v2",
        "mmfleet",
        VERSION,
        VERSION,
    )
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert f"{values['image']['repository']}:{values['image']['tag'] or chart['appVersion']}" == IMAGE
    assert values["defaultCloud"] == "auto"
    assert (values["watchNamespaces"], values["clusterWide"]) == ([], False)  # a choice the install must make
    assert values["prometheusUrl"] == config.OperatorConfig().prometheus_url
    assert values["logFormat"] in ("plain", "json")
    assert {"requests", "limits"} <= values["resources"].keys()
    templates = {p.name for p in (CHART / "templates").iterdir()}
    assert {
        "_helpers.tpl",
        "serviceaccount.yaml",
        "clusterrole.yaml",
        "clusterrolebinding.yaml",
        "deployment.yaml",
    } <= (templates)


def test_chart_templates_use_only_values_that_exist() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    used = {m for p in (CHART / "templates").iterdir() for m in re.findall(r"\.Values\.(\w+)", p.read_text())}
    assert used - values.keys() == set()


def test_chart_deployment_matches_the_base(base: list[Obj]) -> None:
    text = (CHART / "templates/deployment.yaml").read_text()
    names = {e["name"] for e in operator_container(base)["env"]}
    assert set(re.findall(r"- name: (MMFLEET_\w+|OTEL_\w+)", text)) == names
    literal = yaml.safe_load(strip_template(text))
    spec = literal["spec"]
    base_spec = one(base, "Deployment")["spec"]
    assert spec["replicas"] == base_spec["replicas"] == 1
    assert spec["strategy"] == base_spec["strategy"]
    container = spec["template"]["spec"]["containers"][0]
    base_container = operator_container(base)
    for key in ("args", "ports", "startupProbe", "livenessProbe", "securityContext", "volumeMounts"):
        assert container[key] == base_container[key], key
    # The resource of the operator's spans: the same literal entries, in the same order ($(VAR) needs it).
    resource_env = ("OTEL_SERVICE_NAME", "MMFLEET_POD_NAME", "MMFLEET_POD_NAMESPACE", "OTEL_RESOURCE_ATTRIBUTES")
    assert [e for e in container["env"] if e["name"] in resource_env] == [
        e for e in base_container["env"] if e["name"] in resource_env
    ]
    assert spec["template"]["spec"]["securityContext"] == base_spec["template"]["spec"]["securityContext"]
    assert spec["template"]["spec"]["volumes"] == base_spec["template"]["spec"]["volumes"]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["resources"] == base_container["resources"]
    assert values["nodeSelector"] == base_spec["template"]["spec"]["nodeSelector"]
