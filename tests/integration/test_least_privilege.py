"""Least privilege, proved on the local control plane with the operator as the chart installs it (test_helm's
``chart_run``: its ServiceAccount's token, its Deployment's args and env), in both of the chart's RBAC modes:
watchNamespaces a pattern (every rule in the ClusterRole) and plain names (the namespaced rules in a Role per watched
namespace):

- as that ServiceAccount, the API server's own authorizer (SelfSubjectAccessReview) and real calls refuse reading
  Secrets, impersonating, escalating, binding, minting tokens and creating pods or RBAC;
- a fleet given a model token Secret and an API-key Secret is served, scaled and deleted by that operator with no
  call refused, in a namespace where Pod Security "restricted" is enforced (its pods are admitted, or it could not
  be Ready); the operator's pod passes the same admission, and so does every running inference pod of the run;
- after all that, neither Secret's value appears in the operator's log, any event, any fleet's status or
  annotations, or the fleet's children;
- with plain names, it can neither read nor write anything in a namespace it does not watch.
"""

from __future__ import annotations

import json
import re
import secrets
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from mmfleet.api import GROUP, PLURAL, VERSION
from mmfleet.render import INFERENCE_LABEL
from mmfleet_lab.cluster.kubectl import run_kubectl
from tests.helpers import chart
from tests.helpers.chart import API_KEY_SECRET, NAMESPACE, ChartRun, Installed, refused_calls, token_kubeconfig
from tests.helpers.fleet import Fleet
from tests.helpers.repo import ROOT
from tests.helpers.wait import wait_for

# The chart's fixtures (tests/helpers/chart.py, through the conftest): this module gets its own install and run of
# the chart; and the PodMonitor CRD an earlier module deleted, gone before this module's is made.
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("settled_pod_monitor_crd")]


@pytest.fixture(scope="module", params=["pattern", "names"], ids=["cluster-wide", "namespaced"])
def watch_mode(request: pytest.FixtureRequest) -> str:
    """test_helm's ``installed`` with watchNamespaces a pattern (ClusterRoles), then plain names (Roles)."""
    mode: str = request.param
    return mode


@pytest.fixture(scope="module", autouse=True)
def started(watch_mode: str) -> str:
    """When this mode's run began, as the audit log writes times: an earlier module (and mode) ran an operator under
    the same ServiceAccount name, refused once its release was uninstalled."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


PICKER_ROLE = f"{chart.RELEASE}-endpoint-picker"  # the chart's picker ClusterRole, for the release's full name
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
FLEETS = "<a fleet's namespace>"  # the namespace of the run's minimal fleet, which the operator watches
# (verb, apiGroup, resource, subresource, namespace or "" for every namespace): none may be allowed.
FORBIDDEN = [
    *[(verb, "", "secrets", "", ns) for verb in ("get", "list", "watch") for ns in ("", "default", NAMESPACE, FLEETS)],
    *[("impersonate", "", kind, "", "") for kind in ("users", "groups", "serviceaccounts")],
    ("impersonate", "authentication.k8s.io", "userextras", "", ""),
    ("impersonate", "authentication.k8s.io", "uids", "", ""),
    *[("escalate", "rbac.authorization.k8s.io", kind, "", "") for kind in ("roles", "clusterroles")],
    *[("bind", "rbac.authorization.k8s.io", kind, "", "") for kind in ("roles", "clusterroles")],
    # RoleBindings: the operator makes each endpoint picker's (routing mode inferencePool), in the fleets'
    # namespaces, binding only what test_the_operator_may_bind_the_pickers_cluster_role_and_no_other allows.
    *[
        (verb, "rbac.authorization.k8s.io", kind, "", "")
        for verb in ("create", "update", "patch")
        for kind in ("roles", "clusterroles", "clusterrolebindings")
    ],
    *[(verb, "rbac.authorization.k8s.io", "roles", "", FLEETS) for verb in ("escalate", "bind", "create")],
    ("create", "", "serviceaccounts", "token", ""),
    ("create", "", "serviceaccounts", "token", FLEETS),
    ("create", "", "pods", "", ""),
    ("create", "", "pods", "", FLEETS),
    ("create", "", "pods", "exec", ""),
    ("create", "", "pods", "exec", FLEETS),
    ("get", "", "nodes", "proxy", ""),
    ("create", "", "secrets", "", ""),
    ("update", "certificates.k8s.io", "certificatesigningrequests", "approval", ""),
    ("patch", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", ""),
    ("patch", "apiextensions.k8s.io", "customresourcedefinitions", "", ""),
    ("update", GROUP, PLURAL, "", ""),  # the operator never writes a fleet's spec
    ("*", "*", "*", "", ""),
]


@pytest.fixture(scope="module")
def as_operator(installed: Installed, chart_run: ChartRun, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kubeconfig with a fresh token of the ServiceAccount the operator ran as."""
    service_account = chart_run.username.rsplit(":", 1)[1]
    return token_kubeconfig(installed.cluster, service_account, tmp_path_factory.mktemp("sa") / "kubeconfig")


@pytest.mark.parametrize(("verb", "group", "resource", "subresource", "namespace"), FORBIDDEN)
def test_the_operators_service_account_may_not(
    as_operator: Path, chart_run: ChartRun, verb: str, group: str, resource: str, subresource: str, namespace: str
) -> None:
    """Asked of the API server's authorizer, as the ServiceAccount itself."""
    namespace = chart_run.fleets["minimal.yaml"][0] if namespace == FLEETS else namespace
    assert not _allowed(as_operator, verb, group, resource, subresource, namespace), (verb, resource, namespace)


def _allowed(
    kubeconfig: Path,
    verb: str,
    group: str,
    resource: str,
    subresource: str = "",
    namespace: str = "",
    name: str = "",
) -> bool:
    """The API server's authorizer's answer (SelfSubjectAccessReview) for whoever ``kubeconfig`` authenticates."""
    with config.new_client_from_config(config_file=str(kubeconfig)) as api:
        attributes = {"verb": verb, "group": group, "resource": resource, "subresource": subresource, "name": name}
        review = client.AuthorizationV1Api(api).create_self_subject_access_review(
            {"spec": {"resourceAttributes": {**attributes, **({"namespace": namespace} if namespace else {})}}}
        )
    return bool(review.status.allowed)


@pytest.mark.parametrize("role", ["cluster-admin", "admin", "edit", "mmfleet"])
def test_the_operator_may_bind_the_pickers_cluster_role_and_no_other(
    as_operator: Path, chart_run: ChartRun, role: str
) -> None:
    """Routing mode inferencePool: the operator makes each picker's RoleBinding, so it may create RoleBindings in
    the fleets' namespaces; RBAC lets it bind only roles whose rights it holds, or the one it may ``bind`` by name."""
    namespace = chart_run.fleets["minimal.yaml"][0]
    rbac = ("rbac.authorization.k8s.io", "clusterroles", "")
    assert _allowed(as_operator, "bind", *rbac, namespace, name=PICKER_ROLE)
    assert not _allowed(as_operator, "bind", *rbac, namespace, name=role)
    assert not _allowed(as_operator, "escalate", *rbac, namespace, name=role)


def test_real_attempts_as_the_operator_are_refused(
    installed: Installed, chart_run: ChartRun, as_operator: Path
) -> None:
    service_account = chart_run.username.rsplit(":", 1)[1]
    attempts = {
        "list every Secret": ("get", "secrets", "--all-namespaces"),
        "read a Secret": ("get", "secret", "sh.helm.release.v1.mmfleet.v1", "--namespace", NAMESPACE, "-o", "yaml"),
        "impersonate an admin": ("--as=system:admin", "--as-group=system:masters", "get", "namespaces"),
        "bind cluster-admin to itself": (
            "create", "clusterrolebinding", f"lp-{uuid.uuid4().hex[:6]}", "--clusterrole=cluster-admin",
            f"--serviceaccount={NAMESPACE}:{service_account}",
        ),
        "escalate with a role granting everything": (
            "create", "clusterrole", f"lp-{uuid.uuid4().hex[:6]}", "--verb=*", "--resource=*",
        ),
        "mint a token for another ServiceAccount": ("create", "token", "default", "--namespace", "default"),
        "run a pod": ("run", f"lp-{uuid.uuid4().hex[:6]}", "--image=busybox", "--namespace", "default"),
    }  # fmt: skip
    for what, args in attempts.items():
        result = run_kubectl(as_operator, *args, timeout=60)
        assert result.returncode != 0, f"{what}: allowed: {result.stdout}"
        assert "Forbidden" in result.stderr or "forbidden" in result.stderr, f"{what}: {result.stderr}"


def _restricted_namespace(api: Any) -> str:
    """A namespace the chart's operator watches (helm-*), enforcing Pod Security "restricted"."""
    name = f"helm-lp-{uuid.uuid4().hex[:6]}"
    client.CoreV1Api(api).create_namespace({"metadata": {"name": name, "labels": RESTRICTED}})
    wait_for(lambda: chart.has_default_sa(api, name), 30, f"namespace {name}'s default ServiceAccount")
    return name


@pytest.fixture(scope="module")
def secret_fleet(api: Any, chart_run: ChartRun, installed: Installed) -> dict[str, Any]:
    """A fleet with a model token and an API key from Secrets, served, scaled and deleted by the chart's operator;
    yields the Secrets' values and what the run left to search. It goes beside the minimal example, in a namespace
    the operator already watches, now enforcing Pod Security "restricted"."""
    namespace = chart_run.fleets["minimal.yaml"][0]
    core = client.CoreV1Api(api)
    core.patch_namespace(namespace, {"metadata": {"labels": RESTRICTED}})
    values = {"HF_TOKEN": f"hf_{secrets.token_hex(16)}", "api-key": f"sk-{secrets.token_hex(16)}"}
    core.create_namespaced_secret(
        namespace, {"metadata": {"name": "hf-token"}, "stringData": {"HF_TOKEN": values["HF_TOKEN"]}}
    )
    core.create_namespaced_secret(
        namespace, {"metadata": {"name": API_KEY_SECRET}, "stringData": {"key": values["api-key"]}}
    )
    body = yaml.safe_load((ROOT / "examples" / "minimal.yaml").read_text())
    body["metadata"]["name"] = "lp-secrets"
    body["spec"]["model"]["credentialsSecret"] = "hf-token"
    body["spec"]["apiKeySecret"] = {"name": API_KEY_SECRET, "key": "key"}
    body["spec"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 3, "slo": {"target": "2s"}}
    name = body["metadata"]["name"]
    fleet = Fleet(api, namespace)
    fleet.create(body)
    try:
        fleet.wait_ready(name, replicas=1, timeout=90)
        fleet.patch(name, {"autoscaling": {"minReplicas": 2}})  # the autoscaler scales through deployments/scale
        fleet.wait_ready(name, replicas=2, timeout=90)
    except AssertionError as error:
        events = [(e.reason, e.message) for e in core.list_namespaced_event(namespace).items]
        log = chart_run.log.read_text(errors="replace")[-3000:]
        raise AssertionError(f"{error}; status: {fleet.status(name)}; events: {events}; log: {log}") from error
    children = [
        api.sanitize_for_serialization(read(name, namespace))
        for read in (
            client.AppsV1Api(api).read_namespaced_deployment,
            core.read_namespaced_service,
            core.read_namespaced_service_account,
        )
    ]
    pods = api.sanitize_for_serialization(
        core.list_namespaced_pod(namespace, label_selector=f"{INFERENCE_LABEL}={name}").items
    )
    fleet.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)

    def gone() -> bool:
        try:
            fleet.get(name)
        except ApiException as error:
            return error.status == 404 and fleet.deployment(name) is None
        return False

    wait_for(gone, 90, f"{namespace}/{name} deleted, its Deployment collected")
    return {"values": values, "namespace": namespace, "children": children, "pods": pods}


def test_the_operator_serves_scales_and_deletes_a_fleet_with_nothing_refused(
    secret_fleet: dict[str, Any], installed: Installed, chart_run: ChartRun, started: str
) -> None:
    assert len(secret_fleet["pods"]) >= 2, "the fleet's pods were admitted under Pod Security restricted"
    refused = [
        (e["verb"], e["objectRef"].get("resource"), e["objectRef"].get("subresource"), e["objectRef"].get("namespace"))
        for e in refused_calls(installed.cluster, chart_run.username)
        if e["requestReceivedTimestamp"] >= started
        and not e.get("userAgent", "").startswith("kubectl/")  # this module's deliberate attempts, made with kubectl
    ]
    assert refused == [], "calls of the operator's the API server refused"


def _everything_the_run_left(api: Any, chart_run: ChartRun, fleet: dict[str, Any]) -> dict[str, str]:
    custom = client.CustomObjectsApi(api)
    fleets = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]
    events = api.sanitize_for_serialization(client.CoreV1Api(api).list_event_for_all_namespaces().items)
    return {
        "the operator's log": chart_run.log.read_text(errors="replace"),
        "events": json.dumps(events),
        "fleets' status and annotations": json.dumps(
            [(f["metadata"].get("annotations"), f.get("status")) for f in fleets]
        ),
        "the fleet's children": json.dumps(fleet["children"]),
        "the fleet's pods": json.dumps(fleet["pods"]),
    }


def test_no_secret_value_appears_in_logs_events_status_or_children(
    api: Any, chart_run: ChartRun, secret_fleet: dict[str, Any]
) -> None:
    places = _everything_the_run_left(api, chart_run, secret_fleet)
    assert all(places.values()), "every place searched holds something"
    assert "hf-token" in places["the fleet's children"], "the search reads the fleet's pod spec"
    hits = [
        (key, place) for key, value in secret_fleet["values"].items() for place, text in places.items() if value in text
    ]
    assert hits == []


def test_the_operator_pod_and_every_inference_pod_pass_restricted(
    api: Any, installed: Installed, chart_run: ChartRun
) -> None:
    """The operator's own pod, as the chart's Deployment makes it, created (dry run) where "restricted" is enforced;
    every fleet namespace of the run checked against "restricted" with its running pods (a server-side dry run of
    the label: the API server evaluates each existing pod and warns of any that would be refused)."""
    namespace = _restricted_namespace(api)
    try:
        template = installed.deployment(api)["spec"]["template"]
        pod = {
            "metadata": {"name": "operator", "labels": template["metadata"].get("labels", {})},
            "spec": template["spec"],
        }
        pod["spec"]["serviceAccountName"] = "default"  # the chart's lives in its own namespace; Pod Security ignores it
        client.CoreV1Api(api).create_namespaced_pod(namespace, pod, dry_run="All")
    finally:
        client.CoreV1Api(api).delete_namespace(namespace)
    checked = 0
    for example, (fleet_namespace, _) in chart_run.fleets.items():
        pods = client.CoreV1Api(api).list_namespaced_pod(fleet_namespace).items
        if not pods:
            continue
        labels = [f"{key}={value}" for key, value in RESTRICTED.items()]
        result = run_kubectl(
            installed.cluster.kubeconfig,
            "label", "--dry-run=server", "--overwrite", "namespace", fleet_namespace, *labels,
            timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert "violate" not in result.stderr, f"{example}: {result.stderr}"
        checked += len(pods)
    assert checked >= 3, "every example's pods were checked"


def test_with_plain_names_it_can_touch_no_namespace_it_does_not_watch(
    api: Any, watch_mode: str, installed: Installed, chart_run: ChartRun, as_operator: Path
) -> None:
    """Every rule of a watched namespace's Role is allowed there and refused in ``default`` and in a namespace the
    operator does not watch (the authorizer's answers as the ServiceAccount); real attempts as it in that namespace,
    on a fleet, a Deployment and a ConfigMap an administrator made there, are Forbidden."""
    if watch_mode != "names":
        pytest.skip("watchNamespaces a pattern: the ClusterRole grants every namespace (docs/reliability.md says so)")
    watched = chart_run.fleets["minimal.yaml"][0]
    assert watched in installed.watched
    role = client.RbacAuthorizationV1Api(api).read_namespaced_role(chart.RELEASE, watched)
    rules = sorted(chart.rule_triples(api.sanitize_for_serialization(role)["rules"]))
    assert len(rules) >= 20, rules  # the operator's namespaced rules: events, fleets, every kind of child
    unwatched = chart.namespaced(api, f"lp-unwatched-{uuid.uuid4().hex[:6]}")
    try:
        answers = {
            (group, resource, verb, where): _allowed(
                as_operator,
                verb,
                group,
                *resource.split("/"),
                namespace=where,
                name=PICKER_ROLE if verb == "bind" else "",
            )
            for group, resource, verb in rules
            for where in (watched, unwatched, "default")
        }
        assert [key for key, allowed in answers.items() if key[3] == watched and not allowed] == []
        assert [key for key, allowed in answers.items() if key[3] != watched and allowed] == []

        body = yaml.safe_load((ROOT / "examples" / "minimal.yaml").read_text())
        body["metadata"]["namespace"] = unwatched
        Fleet(api, unwatched).create(body)
        client.CoreV1Api(api).create_namespaced_config_map(unwatched, {"metadata": {"name": "lp-config"}})
        app = {"matchLabels": {"app": "lp"}}
        client.AppsV1Api(api).create_namespaced_deployment(unwatched, {
            "metadata": {"name": "lp-app"},
            "spec": {"replicas": 0, "selector": app, "template": {
                "metadata": {"labels": app["matchLabels"]},
                "spec": {"containers": [{"name": "app", "image": "busybox"}]},
            }},
        })  # fmt: skip
        fleet = body["metadata"]["name"]
        attempts = {
            "create a Deployment": ("create", "deployment", "lp-new", "--image=busybox"),
            "read a Deployment": ("get", "deployment", "lp-app"),
            "scale a Deployment": ("scale", "deployment", "lp-app", "--replicas=2"),
            "list fleets": ("get", "multimodalinferences"),
            "annotate a fleet": ("annotate", "multimodalinference", fleet, "mmfleet.io/probe=1"),
            "write a fleet's status": (
                "patch", "multimodalinference", fleet, "--subresource=status", "--type=merge",
                "--patch", '{"status": {"phase": "Ready"}}',
            ),
            "list Services": ("get", "services"),
            "delete a ConfigMap": ("delete", "configmap", "lp-config"),
        }  # fmt: skip
        for what, args in attempts.items():
            result = run_kubectl(as_operator, *args, "--namespace", unwatched, timeout=60)
            assert result.returncode != 0, f"{what}: allowed: {result.stdout}"
            assert "forbidden" in result.stderr.lower(), f"{what}: {result.stderr}"
        assert client.CoreV1Api(api).read_namespaced_config_map("lp-config", unwatched)
        assert Fleet(api, unwatched).status(fleet) == {}, "nothing reconciled the fleet it does not watch"
    finally:
        client.CoreV1Api(api).delete_namespace(unwatched)


def test_what_the_chart_policy_does_not_allow_is_refused_naming_the_field_and_nothing_is_created(
    api: Any, chart_run: ChartRun
) -> None:
    """Issue 23's escalation, against the operator as the chart configures it (its policy value travels as
    MMFLEET_POLICY): another application's Secret, any image, every taint, a public load balancer, a cloud role
    and a claim the policy does not name are refused, each naming its field, and the operator creates nothing."""
    namespace = chart_run.fleets["minimal.yaml"][0]
    body = yaml.safe_load((ROOT / "examples" / "minimal.yaml").read_text())
    body["metadata"] = {"name": "lp-escalate"}
    body["spec"] |= {
        "backend": {"image": "registry.example.com/miner:1"},
        "apiKeySecret": {"name": "payments-db", "key": "password"},
        "placement": {"tolerations": [{"operator": "Exists"}]},
        "service": {"type": "LoadBalancer", "loadBalancerSourceRanges": ["0.0.0.0/0"]},
        "identity": {"awsRoleArn": "arn:aws:iam::123456789012:role/cluster-admin"},
        "modelCache": {"volume": "shared", "claimName": "finance-archive"},
    }
    fleet = Fleet(api, namespace)
    fleet.create(body)
    try:
        ready = fleet.wait_condition("lp-escalate", "Ready", status="False", reason="PolicyDenied")
        fields = re.findall(r"(?:^|; )(spec\.[\w.\[\]]+): ", ready["message"])
        assert fields == [
            "spec.backend.image",
            "spec.apiKeySecret.name",
            "spec.modelCache.claimName",
            "spec.identity.awsRoleArn",
            "spec.placement.tolerations[0].key",
            "spec.service.loadBalancerSourceRanges",
        ], ready["message"]
        assert fleet.deployment("lp-escalate") is None
        services = client.CoreV1Api(api).list_namespaced_service(
            namespace, label_selector=f"{INFERENCE_LABEL}=lp-escalate"
        )
        assert services.items == []
    finally:
        fleet.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "lp-escalate")
