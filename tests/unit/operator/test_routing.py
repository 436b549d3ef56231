"""Routing mode inferencePool: the InferencePool, its endpoint picker and the picker's configuration, derived from
the resource; nothing of it in mode service."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mmfleet import render, routing
from mmfleet.render import SpecError
from mmfleet.routing import PickerSettings
from mmfleet.validation import parse
from tests.helpers.repo import spec_doc

POOL = {"mode": "inferencePool"}


def rendered(doc: dict[str, Any], **kw: Any) -> dict[tuple[str, str], dict[str, Any]]:
    return {(c["kind"], c["metadata"]["name"]): c for c in render.render(parse(doc), "generic", **kw)}


def config(doc: dict[str, Any], cold_start: float = 120.0) -> dict[str, Any]:
    picker = PickerSettings(cold_start=cold_start, cluster_role="mmfleet-endpoint-picker")
    found: dict[str, Any] = json.loads(rendered(doc, picker=picker)["ConfigMap", "qwen-epp"]["data"]["config.yaml"])
    return found


def test_service_mode_renders_no_pool_and_no_picker() -> None:
    kinds = {kind for kind, _ in rendered(spec_doc())}
    assert not kinds & {"InferencePool", "HTTPRoute", "RoleBinding"}
    assert ("Deployment", "qwen-epp") not in rendered(spec_doc())


def test_the_pool_selects_the_servers_only_and_names_its_picker() -> None:
    children = rendered(spec_doc(routing=POOL))
    pool = children["InferencePool", "qwen"]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    servers = children["Deployment", "qwen"]["spec"]["template"]["metadata"]["labels"]
    picker_pod = children["Deployment", "qwen-epp"]["spec"]["template"]["metadata"]["labels"]
    selector = pool["spec"]["selector"]["matchLabels"]
    assert selector.items() <= servers.items()
    assert not selector.items() <= picker_pod.items()  # the picker is never one of its own endpoints
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    ref = pool["spec"]["endpointPickerRef"]
    assert (ref["name"], ref["port"]["number"], ref["failureMode"]) == ("qwen-epp", 9002, "FailClose")
    service = children["Service", "qwen-epp"]["spec"]
    assert service["selector"].items() <= picker_pod.items()
    assert not children["Service", "qwen"]["spec"]["selector"].items() <= picker_pod.items()


def test_the_picker_runs_the_pinned_image_restricted_on_its_own_account() -> None:
    children = rendered(spec_doc(routing=POOL), picker=PickerSettings(60.0, "ops-epp"))
    pod = children["Deployment", "qwen-epp"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0"
    args = container["args"]
    assert args[args.index("--pool-name") + 1] == "qwen" and args[args.index("--pool-namespace") + 1] == "ml"
    assert args[args.index("--config-file") + 1] == "/config/config.yaml"
    assert "--enable-pprof=false" in args and "--metrics-endpoint-auth=false" in args  # no profile open to the pods
    assert container["securityContext"]["runAsNonRoot"] and container["securityContext"]["capabilities"] == {
        "drop": ["ALL"]
    }
    assert pod["serviceAccountName"] == "qwen-epp"
    binding = children["RoleBinding", "qwen-epp"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "ops-epp"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "qwen-epp", "namespace": "ml"}]


def test_a_new_configuration_restarts_the_picker() -> None:
    def template_hash(cold_start: float) -> str:
        children = rendered(spec_doc(routing=POOL), picker=PickerSettings(cold_start, "r"))
        annotations = children["Deployment", "qwen-epp"]["spec"]["template"]["metadata"]["annotations"]
        return str(annotations[routing.CONFIG_HASH_ANNOTATION])

    assert template_hash(100.0) == template_hash(110.0)  # the same 30 s step of the request TTL
    assert template_hash(100.0) != template_hash(200.0)


@pytest.mark.parametrize(("cold_start", "ttl"), [(0.0, "30s"), (29.9, "30s"), (30.0, "60s"), (120.0, "150s")])
def test_held_requests_outlive_a_cold_start(cold_start: float, ttl: str) -> None:
    found = config(spec_doc(routing=POOL), cold_start)
    assert found["featureGates"] == ["flowControl"]
    assert found["flowControl"]["defaultRequestTTL"] == ttl


def test_the_prefix_index_reaches_the_longest_prompt() -> None:
    found = config(spec_doc(routing=POOL, backend={"maxModelLen": 32768}))
    prefix = next(p for p in found["plugins"] if p["type"] == "prefix-cache-scorer")
    assert prefix["parameters"] == {"autoTune": True, "maxPrefixTokensToMatch": 32768}


@pytest.mark.parametrize(
    ("autoscaling", "depth"),
    [
        (None, 5),  # no SLO: the picker's default
        ({"slo": {"target": "2s"}}, 5),  # no measured capacity in the spec: the default
        ({"slo": {"target": "2s"}, "capacityPerReplica": 4.5}, 9),  # what one replica serves within the target
        ({"slo": {"target": "100ms"}, "capacityPerReplica": 4.5}, 1),
    ],
)
def test_saturation_is_the_queue_the_slo_allows(autoscaling: dict[str, Any] | None, depth: int) -> None:
    doc = spec_doc(routing=POOL, **({"autoscaling": autoscaling} if autoscaling else {}))
    detector = next(p for p in config(doc)["plugins"] if p["type"] == "utilization-detector")
    assert detector["parameters"] == {"queueDepthThreshold": depth, "kvCacheUtilThreshold": 0.8}


def test_the_profile_filters_out_replicas_with_stale_metrics_only() -> None:
    """A detector instance of its own is the profile's filter: a replica whose server died (its metrics stale) stops
    being chosen before its pod turns not Ready (tests/integration/test_routing_requests.py), but a replica is never
    dropped for its queue, which would break a repeated image's affinity as soon as one request waits there; the
    saturation detector (flow control) keeps the queue the SLO allows."""
    picker = config(spec_doc(routing=POOL, autoscaling={"slo": {"target": "2s"}, "capacityPerReplica": 0.5}))
    plugins = {p.get("name", p["type"]): p for p in picker["plugins"]}
    profile = picker["schedulingProfiles"][0]["plugins"]
    (first, *scorers) = [plugins[ref["pluginRef"]] for ref in profile]
    assert first["type"] == "utilization-detector" and first["name"] != picker["saturationDetector"]["pluginRef"]
    assert first["parameters"]["queueDepthThreshold"] >= 1 << 30 and first["parameters"]["kvCacheUtilThreshold"] == 1
    assert [p["type"] for p in scorers] == [name for name, _ in routing.SCORER_WEIGHTS]
    saturation = plugins[picker["saturationDetector"]["pluginRef"]]["parameters"]
    assert saturation["queueDepthThreshold"] == 1


ENGINES = [("vllm", "vllm", "/metrics"), ("tensorrt-llm", "trtllm-serve", "/prometheus/metrics")]


@pytest.mark.parametrize(("backend", "engine", "path"), ENGINES)
def test_the_picker_reads_each_backends_own_metrics(backend: str, engine: str, path: str) -> None:
    plugins = {
        p["type"]: p.get("parameters") for p in config(spec_doc(routing=POOL, backend={"name": backend}))["plugins"]
    }
    assert plugins["core-metrics-extractor"] == {"defaultEngine": engine}
    assert plugins["metrics-data-source"] == {"scheme": "http", "path": path}


def test_a_named_gateway_gets_an_http_route_to_the_pool() -> None:
    gateway = {"name": "inference", "namespace": "gateways", "sectionName": "https"}
    route = rendered(spec_doc(routing={**POOL, "gateway": gateway}))["HTTPRoute", "qwen"]
    assert route["spec"]["parentRefs"] == [
        {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference", "namespace": "gateways",
         "sectionName": "https"}
    ]  # fmt: skip
    (rule,) = route["spec"]["rules"]
    assert rule["backendRefs"] == [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "qwen"}]


def test_a_gateway_without_the_pool_mode_is_refused_naming_the_field() -> None:
    with pytest.raises(SpecError, match=r"routing\.gateway: set, but spec\.routing\.mode is service"):
        parse(spec_doc(routing={"gateway": {"name": "inference"}}))


def test_a_name_too_long_for_the_pickers_service_is_refused_naming_the_field() -> None:
    """Refused when the spec is parsed, as InvalidSpec, not when the reconcile renders it."""
    doc = spec_doc(routing=POOL)
    doc["metadata"]["name"] = "q" * 61
    with pytest.raises(
        SpecError, match=r"^metadata.name: q{61} has 61 characters; with spec.routing.mode inferencePool"
    ):
        parse(doc)
    doc["metadata"]["name"] = "q" * 59
    assert ("Service", "q" * 59 + "-epp") in rendered(doc)


def test_the_servers_admit_the_picker_and_the_named_gateways_namespace() -> None:
    doc = spec_doc(routing={**POOL, "gateway": {"name": "inference", "namespace": "gateways"}})
    doc["spec"]["networkPolicy"] = {"ingressFrom": [{"podSelector": {"matchLabels": {"app": "client"}}}]}
    children = rendered(doc)
    rules = children["NetworkPolicy", "qwen"]["spec"]["ingress"]
    peers = [peer for rule in rules for peer in rule["from"]]
    picker = {"mmfleet.io/inference": "qwen", "app.kubernetes.io/component": "endpoint-picker"}
    assert {"podSelector": {"matchLabels": picker}} in peers
    assert picker.items() <= children["Deployment", "qwen-epp"]["spec"]["template"]["metadata"]["labels"].items()
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateways"}}} in peers
    service_mode = rendered(spec_doc())["NetworkPolicy", "qwen"]["spec"]["ingress"]
    assert not any("namespaceSelector" in p for rule in service_mode for p in rule.get("from", []))


def test_the_pickers_metrics_are_scraped_beside_the_fleets_where_podmonitors_are() -> None:
    """The picker's series (its saturation, held requests, prefix-index hits: the dashboard's Routing row) are
    scraped from the port its container names, labelled by fleet like the servers'; none without PodMonitors."""
    children = rendered(spec_doc(routing=POOL), monitoring_crds=True)
    monitor = children["PodMonitor", "qwen-epp"]["spec"]
    picker_pod = children["Deployment", "qwen-epp"]["spec"]["template"]
    servers = children["Deployment", "qwen"]["spec"]["template"]["metadata"]["labels"]
    assert monitor["selector"]["matchLabels"].items() <= picker_pod["metadata"]["labels"].items()
    assert not monitor["selector"]["matchLabels"].items() <= servers.items()  # no server scraped twice
    (endpoint,) = monitor["podMetricsEndpoints"]
    ports = {p["name"]: p["containerPort"] for p in picker_pod["spec"]["containers"][0]["ports"]}
    assert ports[endpoint["port"]] == routing.METRICS_PORT and endpoint["path"] == "/metrics"
    fleet_relabel = children["PodMonitor", "qwen"]["spec"]["podMetricsEndpoints"][0]["relabelings"]
    assert endpoint["relabelings"] == fleet_relabel
    assert ("PodMonitor", "qwen-epp") not in rendered(spec_doc(routing=POOL))
    assert ("PodMonitor", "qwen-epp") not in rendered(spec_doc(), monitoring_crds=True)
    pruned = {(kind, name) for _, kind, name in render.optional_children(parse(spec_doc()))}
    assert ("PodMonitor", "qwen-epp") in pruned  # back to mode service, or monitoring turned off


def test_the_install_may_mirror_the_pickers_image(monkeypatch: pytest.MonkeyPatch) -> None:
    """An air-gapped cluster pulls the picker from its own registry: MMFLEET_PICKER_IMAGE (the chart's pickerImage)."""
    from mmfleet.config import OperatorConfig

    monkeypatch.setenv("MMFLEET_PICKER_IMAGE", "mirror.example/epp:v1.5.0")
    config = OperatorConfig.load()
    settings = PickerSettings(config.default_cold_start, config.picker_cluster_role, config.picker_image)
    (container,) = rendered(spec_doc(routing=POOL), picker=settings)["Deployment", "qwen-epp"]["spec"]["template"][
        "spec"
    ]["containers"]
    assert container["image"] == "mirror.example/epp:v1.5.0"
