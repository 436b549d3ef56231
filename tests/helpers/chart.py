"""The chart installed with the lab's helm on the local control plane, and the operator run as the chart runs it.

The module-scoped fixtures here reach the integration tests through ``tests/integration/conftest.py``: each test
module that asks for ``installed`` or ``chart_run`` gets its own install and run of the chart."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from mmfleet.api import GROUP, PLURAL
from mmfleet_lab.cluster import Cluster
from mmfleet_lab.cluster.crds import established, install_crd, read_crd
from mmfleet_lab.cluster.inference_extension import (
    HTTPROUTE_CRD,
    INFERENCE_POOL_CRD,
    gateway_api_crds,
    inference_extension_crds,
)
from mmfleet_lab.cluster.kubectl import kubectl
from mmfleet_lab.cluster.process import free_port
from mmfleet_lab.cluster.prometheus_operator import prometheus_operator_crds
from mmfleet_lab.demo import examples_policy
from mmfleet_lab.twin.spans import kubelet_env
from tests.helpers.fleet import Fleet
from tests.helpers.operator_process import OperatorProcess, mmfleet_command, stop
from tests.helpers.repo import ROOT, helm_binary
from tests.helpers.wait import wait_for

CHART = ROOT / "charts" / "mmfleet"
CRD_NAME = f"{PLURAL}.{GROUP}"
PODMONITOR_CRD = "monitoring.coreos.com_podmonitors"  # its file in the Prometheus Operator's release
PODMONITOR_CRD_NAME = "podmonitors.monitoring.coreos.com"
RELEASE = "mmfleet"  # contains the chart's name, so every object is called "mmfleet"
NAMESPACE = "mmfleet-helm"
WATCHED = "helm-*"  # watchNamespaces as a kopf pattern (with clusterWide): the fleets' namespaces below match it
# The policy value: what the examples may name (examples/admin/policy.yaml) in the fleets' namespaces, and the API key
# Secret of test_least_privilege's fleet; any other Secret is refused (PolicyDenied).
API_KEY_SECRET = "vl-key"


def _policy() -> str:
    policy = json.loads(examples_policy(WATCHED))
    policy["secrets"].append(f"{WATCHED}/{API_KEY_SECRET}")
    return json.dumps(policy)


POLICY = _policy()


# minimal: the least spec; qwen-vl-eks: autoscaling, tracing, a workload identity (its own ServiceAccount);
# llama-vision-trtllm-aks: TensorRT-LLM's ConfigMap, two replicas.
EXAMPLES = ("minimal.yaml", "qwen-vl-eks.yaml", "llama-vision-trtllm-aks.yaml")
Triple = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)


def helm(*args: str, kubeconfig: Path | None = None, home: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``helm ARGS`` with the lab's helm; its cache, config and data kept out of the user's home."""
    env = dict(os.environ)
    if home is not None:
        env |= {f"HELM_{kind}_HOME": str(home / kind.lower()) for kind in ("CACHE", "CONFIG", "DATA")}
    argv = [str(helm_binary()), *args, *(["--kubeconfig", str(kubeconfig)] if kubeconfig else [])]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, env=env)


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


@dataclass
class Installed:
    cluster: Cluster
    home: Path
    watched: list[str]  # watchNamespaces
    unused: list[str] = field(default_factory=list)  # with plain names: those no fleet was given yet

    def fleet_namespace(self, api: Any) -> str:
        """A watched namespace for a new fleet: a fresh one matching the pattern, or the next of the plain names (made
        before the install, which puts a Role in each)."""
        if self.watched == [WATCHED]:
            return namespaced(api, f"helm-{uuid.uuid4().hex[:8]}")
        assert self.unused, f"every plain watched namespace ({self.watched}) has a fleet already"
        return self.unused.pop(0)

    def helm(self, *args: str) -> subprocess.CompletedProcess[str]:
        return helm(*args, "--namespace", NAMESPACE, kubeconfig=self.cluster.kubeconfig, home=self.home)

    def deployment(self, api: Any) -> dict[str, Any]:
        """The installed operator Deployment as YAML shows it (camelCase)."""
        found: dict[str, Any] = api.sanitize_for_serialization(
            client.AppsV1Api(api).read_namespaced_deployment(RELEASE, NAMESPACE)
        )
        return found


def _no_fleets_anywhere(api: Any) -> bool:
    try:
        return not client.CustomObjectsApi(api).list_cluster_custom_object(GROUP, "v1alpha1", PLURAL)["items"]
    except ApiException as error:
        return error.status == 404


def _remove_crd(api: Any) -> None:
    """Delete the CRD (no fleet exists any more) so that the install is what creates it, from crds/."""
    ext = client.ApiextensionsV1Api(api)
    try:
        ext.delete_custom_resource_definition(CRD_NAME)
    except ApiException as error:
        if error.status != 404:
            raise

    def gone() -> bool:
        try:
            ext.read_custom_resource_definition(CRD_NAME)
        except ApiException as error:
            return error.status == 404
        return False

    wait_for(gone, 60, f"the CRD {CRD_NAME} to be deleted")


@pytest.fixture(scope="module")
def pod_monitor_crd(api: Any) -> Iterator[None]:
    """The Prometheus Operator's real PodMonitor CRD served, so the operator creates and prunes PodMonitors;
    removed again after the module when it was not there before (other tests count a fleet's children)."""
    body = yaml.safe_load((prometheus_operator_crds() / f"{PODMONITOR_CRD}.yaml").read_text())
    present = established(api, body["metadata"]["name"])
    if not present:
        install_crd(api, body, "mmfleet-tests", timeout=30)
    yield
    if not present:
        client.ApiextensionsV1Api(api).delete_custom_resource_definition(body["metadata"]["name"])


@pytest.fixture(scope="module")
def routing_crds(api: Any) -> Iterator[None]:
    """The InferencePool and HTTPRoute CRDs served, as released, so the run reaches routing mode inferencePool's
    calls; removed again after the module, once gone (the routing tests start without them)."""
    bodies = [
        yaml.safe_load((inference_extension_crds() / f"{INFERENCE_POOL_CRD}.yaml").read_text()),
        yaml.safe_load((gateway_api_crds() / f"{HTTPROUTE_CRD}.yaml").read_text()),
    ]
    for body in bodies:
        install_crd(api, body, "mmfleet-tests", timeout=30)
    yield
    names = [body["metadata"]["name"] for body in bodies]
    for name in names:
        client.ApiextensionsV1Api(api).delete_custom_resource_definition(name)
    wait_for(lambda: all(not_terminating(api, name) for name in names), 120, f"the deletion of {', '.join(names)}")


@pytest.fixture(scope="module")
def watch_mode() -> str:
    """How the install gives watchNamespaces: ``pattern`` (WATCHED, with clusterWide: the ClusterRole holds every
    rule) or ``names`` (one plain name per fleet the run makes; a Role in each). Here the pattern; test_least_privilege
    runs both."""
    return "pattern"


@pytest.fixture(scope="module")
def installed(
    cluster: Cluster,
    api: Any,
    operator: OperatorProcess,
    pod_monitor_crd: None,
    routing_crds: None,
    watch_mode: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Installed]:
    """``helm install`` of the chart; the session's operator stopped meanwhile (one operator per fleet)."""
    # Earlier tests' fleets go first (their finalizers need the session's operator), then the CRD.
    wait_for(lambda: _no_fleets_anywhere(api), 60, "earlier tests' fleets to be gone")
    operator.stop()
    _remove_crd(api)
    home = tmp_path_factory.mktemp("helm")
    if watch_mode == "names":  # made before the install puts a Role in each: one per example, one for _exercise's
        names = [namespaced(api, f"helm-{uuid.uuid4().hex[:8]}") for _ in range(len(EXAMPLES) + 1)]
        release = Installed(cluster, home, names, unused=list(names))
    else:
        release = Installed(cluster, home, [WATCHED])
    result = release.helm(
        "install", RELEASE, str(CHART), "--create-namespace",
        "--set", f"prometheusUrl={cluster.prometheus_url}",
        "--set-json", f"watchNamespaces={json.dumps(release.watched)}",
        # A pattern's namespaces are unknown at install time: its write rights are cluster-wide, asked for explicitly.
        "--set", f"clusterWide={str(watch_mode == 'pattern').lower()}",
        # The generic collector, installed beside the operator: TracingReady looks up its Service's EndpointSlices.
        "--set", "collector.cloud=generic",
        "--set-json", f"policy={POLICY}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    yield release
    release.helm("uninstall", RELEASE)
    operator.start()


def token_kubeconfig(cluster: Cluster, service_account: str, path: Path) -> Path:
    """A kubeconfig for the cluster as the ServiceAccount (a TokenRequest token, as the kubelet mounts one)."""
    token = kubectl(
        cluster.kubeconfig, "create", "token", service_account, "--namespace", NAMESPACE, "--duration", "1h", timeout=30
    ).strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": service_account, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": service_account}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@dataclass
class ChartRun:
    username: str  # the ServiceAccount the operator ran as
    health_url: str
    fleets: dict[str, tuple[str, dict[str, Any]]]  # example file -> (namespace, status once Ready)
    log: Path


def _apiserver_calls(cluster: Cluster, username: str) -> list[dict[str, Any]]:
    """The audit events of ``username``'s finished resource requests."""
    events = (json.loads(line) for line in cluster.audit_log.read_text().splitlines() if line.strip())
    return [e for e in events if e["user"]["username"] == username and e.get("objectRef")]


def refused_calls(cluster: Cluster, username: str) -> list[dict[str, Any]]:
    return [e for e in _apiserver_calls(cluster, username) if e["responseStatus"]["code"] == 403]


def namespaced(api: Any, name: str) -> str:
    client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
    wait_for(lambda: has_default_sa(api, name), 30, f"namespace {name}'s default ServiceAccount")
    return name


def has_default_sa(api: Any, namespace: str) -> bool:
    try:
        client.CoreV1Api(api).read_namespaced_service_account("default", namespace)
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


def _route_and_return(api: Any, namespace: str) -> None:
    """Routing mode inferencePool with a Gateway named (the pool, the picker and its RoleBinding, the HTTPRoute), then
    back to mode service (all of it pruned)."""
    fleet, custom = Fleet(api, namespace), client.CustomObjectsApi(api)

    def route() -> Any:
        try:
            return custom.get_namespaced_custom_object(
                "gateway.networking.k8s.io", "v1", namespace, "httproutes", "minimal"
            )
        except ApiException as error:
            if error.status != 404:
                raise
            return None

    fleet.patch("minimal", {"routing": {"mode": "inferencePool", "gateway": {"name": "inference"}}})
    fleet.wait_condition("minimal", "RoutingReady", status="True", reason="PickerReady", timeout=90)
    assert route() is not None
    fleet.patch("minimal", {"routing": {"mode": "service", "gateway": None}})
    wait_for(lambda: route() is None, 60, "the HTTPRoute pruned once the fleet is back in mode service")


def _exercise(api: Any, installed: Installed, fleets: dict[str, tuple[str, dict[str, Any]]]) -> None:
    """What a user does next, so the run reaches the operator's other API calls: routing mode inferencePool and back
    (its objects made, then pruned), a PodMonitor turned off (pruned),
    an autoscaled fleet's minimum raised (the scale subresource), then a warm standby (its pods labelled), a backend
    switched (the stale ConfigMap pruned),
    a shared model cache whose claim is missing (read, to say why), a fleet an upgrade finds with the finalizer an
    earlier version added (removed)."""
    namespace, _ = fleets["minimal.yaml"]
    monitors = client.CustomObjectsApi(api)

    def monitor(present: bool) -> bool:
        try:
            monitors.get_namespaced_custom_object("monitoring.coreos.com", "v1", namespace, "podmonitors", "minimal")
        except ApiException as error:
            if error.status != 404:
                raise
            return not present
        return present

    wait_for(lambda: monitor(present=True), 60, "the PodMonitor the served CRD makes the operator create")
    Fleet(api, namespace).patch("minimal", {"monitoring": {"podMonitor": False}})
    wait_for(lambda: monitor(present=False), 60, "the PodMonitor pruned once the spec turns it off")

    _route_and_return(api, fleets["minimal.yaml"][0])

    namespace, _ = fleets["qwen-vl-eks.yaml"]
    Fleet(api, namespace).patch("qwen-vl", {"autoscaling": {"minReplicas": 2}})
    Fleet(api, namespace).wait_ready("qwen-vl", replicas=2, timeout=90)
    # Warm standby turned on: the serving pods labelled before the selectors change (pods patch), the standby's
    # replica written with the replicas (the Deployment, as the scaler).
    apps = client.AppsV1Api(api)
    Fleet(api, namespace).patch(
        "qwen-vl", {"routing": {"mode": "inferencePool"}, "autoscaling": {"minReplicas": 2, "warmStandby": {}}}
    )
    wait_for(lambda: apps.read_namespaced_deployment("qwen-vl", namespace).spec.replicas == 3, 90, "standby's replica")

    namespace, _ = fleets["llama-vision-trtllm-aks.yaml"]
    core = client.CoreV1Api(api)
    assert core.read_namespaced_config_map("llama-vision-config", namespace)
    tuning = {"kvCacheDtype": None, "maxModelLen": None, "maxNumSeqs": None, "maxNumBatchedTokens": None}
    Fleet(api, namespace).patch("llama-vision", {"backend": {"name": "vllm", **tuning}})

    def pruned() -> bool:
        try:
            core.read_namespaced_config_map("llama-vision-config", namespace)
        except ApiException as error:
            return error.status == 404
        return False

    wait_for(pruned, 60, "the TensorRT-LLM ConfigMap pruned after the switch to vLLM")

    body = yaml.safe_load((ROOT / "examples" / "qwen-vl-shared-cache.yaml").read_text())
    body["metadata"].pop("namespace", None)
    namespace = installed.fleet_namespace(api)
    fleet = Fleet(api, namespace)
    fleet.create(body)
    name = body["metadata"]["name"]
    wait_for(lambda: fleet.status(name).get("observedGeneration"), 60, f"{name}'s status")
    fleets["qwen-vl-shared-cache.yaml"] = (namespace, fleet.status(name))

    # A fleet an earlier operator version left with its finalizer (it had timers): kopf removes it (a patch).
    legacy = yaml.safe_load((ROOT / "examples" / "minimal.yaml").read_text())
    legacy["metadata"] = {"name": "legacy", "finalizers": ["mmfleet.io/finalizer"]}
    fleet.create(legacy)
    wait_for(lambda: not fleet.get("legacy")["metadata"].get("finalizers"), 60, "the legacy finalizer removed")


@pytest.fixture(scope="module")
def chart_run(installed: Installed, api: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChartRun]:
    """The operator, from this checkout, with the installed Deployment's args and env and its ServiceAccount's token,
    reconciling the examples to Ready (each in its own namespace matching watchNamespaces)."""
    work = tmp_path_factory.mktemp("chart-operator")
    deployment = installed.deployment(api)
    pod = deployment["spec"]["template"]
    service_account = pod["spec"]["serviceAccountName"]
    container = _container(deployment)
    env = kubelet_env(container["env"], {"metadata": {"name": f"{RELEASE}-0", "namespace": NAMESPACE}})
    probe = container["startupProbe"]["httpGet"]
    assert env["MMFLEET_HEALTH_ADDRESS"].endswith(f":{container['ports'][0]['containerPort']}")
    assert env["MMFLEET_METRICS_ADDRESS"].endswith(f":{container['ports'][1]['containerPort']}")
    env["MMFLEET_HEALTH_ADDRESS"] = f"127.0.0.1:{free_port()}"
    env["MMFLEET_METRICS_ADDRESS"] = f"127.0.0.1:{free_port()}"
    kubeconfig = token_kubeconfig(installed.cluster, service_account, work / "kubeconfig")
    username = f"system:serviceaccount:{NAMESPACE}:{service_account}"
    # The shell's settings must not leak in: only what the pod would have, plus PATH/HOME to run Python.
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("MMFLEET_", "OTEL_", "KUBECONFIG"))}
    log = work / "operator.log"
    argv = [*mmfleet_command(), *(container.get("args") or [])]
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, env={**inherited, **env, "KUBECONFIG": str(kubeconfig)}, stdout=out, stderr=out)
    fleets: dict[str, tuple[str, dict[str, Any]]] = {}
    try:
        for example in EXAMPLES:
            body = yaml.safe_load((ROOT / "examples" / example).read_text())
            body["metadata"].pop("namespace", None)
            namespace = installed.fleet_namespace(api)
            fleet = Fleet(api, namespace)
            fleet.create(body)
            name = body["metadata"]["name"]
            fleets[example] = (namespace, fleet.wait_ready(name, replicas=body["spec"].get("replicas", 1), timeout=90))
        _exercise(api, installed, fleets)
        assert proc.poll() is None, log.read_text()[-3000:]
        yield ChartRun(username, f"http://{env['MMFLEET_HEALTH_ADDRESS']}{probe['path']}", fleets, log)
    except AssertionError as error:  # say what the chart's RBAC refused, if that is why
        denied = {
            (e["verb"], e["objectRef"]["resource"], e["objectRef"].get("subresource"))
            for e in refused_calls(installed.cluster, username)
        }
        raise AssertionError(f"{error}; refused by the chart's RBAC: {sorted(denied, key=str) or 'nothing'}") from error
    finally:
        stop(proc)
        for namespace, _ in fleets.values():  # their finalizers go when the session's operator is back
            client.CoreV1Api(api).delete_namespace(namespace)


def rule_triples(rules: list[dict[str, Any]]) -> set[Triple]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule.get("verbs", [])
    }


@contextmanager
def crd_served_to(api: Any, operator: OperatorProcess, crd_file: Path) -> Iterator[OperatorProcess]:
    """The CRD served and ``operator`` restarted to see it (it asks whether a kind is served every ten minutes); at
    the end the CRD deleted (if a test has not), and the operator restarted once it is gone, so later tests see none."""
    name = yaml.safe_load(crd_file.read_text())["metadata"]["name"]
    install_crd(api, yaml.safe_load(crd_file.read_text()), "mmfleet-tests", timeout=30)
    operator.stop()
    operator.start()
    try:
        yield operator
    finally:
        delete_crd(api, name)
        wait_for(lambda: not_terminating(api, name), 120, f"the {name} CRD's deletion")
        operator.stop()
        operator.start()


def delete_crd(api: Any, name: str) -> None:
    """Delete a CRD; one already gone is no error."""
    try:
        client.ApiextensionsV1Api(api).delete_custom_resource_definition(name)
    except ApiException as error:
        if error.status != 404:
            raise


def not_terminating(api: Any, name: str) -> bool:
    found = read_crd(api, name)
    return found is None or found.metadata.deletion_timestamp is None


@pytest.fixture(scope="module")
def settled_pod_monitor_crd(api: Any) -> None:
    """An earlier module's ``pod_monitor_crd`` deletes the CRD it made as it ends, and a CRD being deleted still reads
    as established: wait until it is gone, so that this module's ``pod_monitor_crd`` makes it again (autouse fixtures
    run before the others of their scope)."""
    wait_for(lambda: not_terminating(api, PODMONITOR_CRD_NAME), 120, f"the {PODMONITOR_CRD_NAME} CRD's deletion to end")
