"""The front door of a fleet in routing mode ``inferencePool`` (pure): an InferencePool, its endpoint picker and the
picker's configuration, derived from the resource, and an HTTPRoute when a Gateway is named.

The picker is the Gateway API Inference Extension's endpoint picker (EPP), ``sigs.k8s.io/gateway-api-inference-
extension`` at ``PICKER_VERSION``: an Envoy ext_proc server that picks the replica for each request from the servers'
metrics and an approximate index of their prefix caches. Sources, in that module at v1.5.0: the flags in
``pkg/epp/server/options.go``, the configuration types in ``apix/config/v1alpha1/endpointpickerconfig_types.go``
(decoded strictly: an unknown field is refused), the Deployment and Service in ``config/charts/epplib/templates``.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from mmfleet import backends
from mmfleet.api import MultimodalInference, seconds

Manifest = dict[str, Any]

PICKER_VERSION = "v1.5.0"
# config/charts/inferencepool/values.yaml: registry, repository and tag of the released image.
PICKER_IMAGE = f"registry.k8s.io/gateway-api-inference-extension/epp:{PICKER_VERSION}"
POOL_API_VERSION = "inference.networking.k8s.io/v1"
PICKER_CONFIG_API_VERSION = "inference.networking.x-k8s.io/v1alpha1"
HTTPROUTE_API_VERSION = "gateway.networking.k8s.io/v1"
PICKER_COMPONENT = "endpoint-picker"
PICKER_SUFFIX = "-epp"
CONFIG_FILE = "config.yaml"
CONFIG_DIR = "/config"
CONFIG_HASH_ANNOTATION = "mmfleet.io/picker-config"
# options.go: the ext_proc gRPC port, its health service and the metrics port, at their defaults.
GRPC_PORT = 9002
HEALTH_PORT = 9003
METRICS_PORT = 9090
METRICS_PORT_NAME = "metrics"  # the container port the picker's PodMonitor scrapes
# The picker's own series (pkg/epp/metrics/metrics.go: subsystem and name, no namespace), for the dashboard.
SATURATION_METRIC = "inference_extension_flow_control_pool_saturation"  # 0 empty .. 1 saturated, per pool
HELD_METRIC = "inference_extension_flow_control_queue_size"  # requests held in flow control now
INFO_METRIC = "inference_extension_info"  # 1 from the picker's start (cmd/epp/runner/runner.go)
HELD_SECONDS_METRIC = "inference_extension_flow_control_request_queue_duration_seconds"  # histogram, by outcome
PREFIX_HIT_METRIC = "inference_extension_prefix_indexer_hit_ratio"  # histogram of matched / total prefix
SCHEDULING_SECONDS_METRIC = "inference_extension_scheduler_e2e_duration_seconds"  # histogram
# The health service the chart's probes ask for with one replica (epplib/templates/_deployment.yaml): without leader
# election every name answers SERVING once the pool has synced (cmd/epp/runner/health.go).
HEALTH_SERVICE = "inference-extension"
# utilization-detector's defaults (flowcontrol/saturationdetector/utilization/config.go): waiting requests per
# replica, and KV-cache use, at which a replica counts as saturated.
DEFAULT_QUEUE_DEPTH = 5
KV_CACHE_SATURATED = 0.8
# Held requests wait at least this long, and a whole number of these, so a new cold-start measurement rarely
# changes the configuration (a change restarts the picker, which reads it at start).
TTL_STEP_SECONDS = 30
# The profile's filter: the detector type again, dropping only replicas whose metrics are stale (or whose KV cache
# is full), with a queue limit no replica reaches (it must be positive: utilization/config.go validateConfig).
STALE_FILTER = "stale-endpoint-filter"
UNREACHED_QUEUE = 1 << 30
# The scorers and their weights: the picker's own defaults (pkg/epp/config/loader/defaults.go), until the routing
# benchmark measures better ones.
SCORER_WEIGHTS = (("prefix-cache-scorer", 3.0), ("queue-scorer", 2.0), ("kv-cache-utilization-scorer", 2.0))
# core-metrics-extractor's engine names (datalayer/extractor/metrics/factories.go) for each backend.
ENGINES = {"vllm": "vllm", "tensorrt-llm": "trtllm-serve"}
# The picker's Service name is <fleet>-epp, a DNS label of at most 63 characters.
NAME_MAX = 63 - len(PICKER_SUFFIX)


@dataclass(frozen=True)
class PickerSettings:
    """What the picker's objects take from the operator rather than the resource."""

    cold_start: float  # seconds a new replica is expected to take to serve (the operator's MMFLEET_COLD_START)
    cluster_role: str  # the ClusterRole the operator's install ships for pickers (read pods and pools)
    image: str = PICKER_IMAGE  # the pinned release, or the install's mirror of it (MMFLEET_PICKER_IMAGE)


@dataclass(frozen=True)
class RoutingCrds:
    """Which kinds of the front door the cluster serves: nothing of it without the InferencePool (the picker watches
    its pool and cannot start without the kind), no HTTPRoute without the Gateway API's."""

    pool: bool = True
    route: bool = True


ALL_SERVED = RoutingCrds()
# The operator's defaults (config.OperatorConfig takes them), also for ``mmfleet render`` without an operator.
DEFAULT_COLD_START = 120.0
DEFAULT_PICKER = PickerSettings(cold_start=DEFAULT_COLD_START, cluster_role="mmfleet-endpoint-picker")


def picker_name(inference: MultimodalInference) -> str:
    return inference.metadata.name + PICKER_SUFFIX


def front_door(inference: MultimodalInference) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of every object of the front door, as ``render`` makes them."""
    picker = picker_name(inference)
    return [
        ("v1", "ServiceAccount", picker),
        ("v1", "ConfigMap", picker),
        ("rbac.authorization.k8s.io/v1", "RoleBinding", picker),
        ("apps/v1", "Deployment", picker),
        ("v1", "Service", picker),
        ("monitoring.coreos.com/v1", "PodMonitor", picker),
        (POOL_API_VERSION, "InferencePool", inference.metadata.name),
        (HTTPROUTE_API_VERSION, "HTTPRoute", inference.metadata.name),
    ]


def queue_depth(inference: MultimodalInference) -> int:
    """Waiting requests per replica at which it is saturated: as many as it serves within the SLO target when
    ``capacityPerReplica`` says how many it serves per second (a request behind them would wait longer than the
    target); else the picker's default."""
    autoscaling = inference.spec.autoscaling
    if autoscaling is None or autoscaling.slo is None or autoscaling.capacity_per_replica is None:
        return DEFAULT_QUEUE_DEPTH
    return max(1, math.floor(autoscaling.capacity_per_replica * seconds(autoscaling.slo.target)))


def request_ttl(cold_start: float) -> int:
    """Seconds a request may wait in the picker's flow control while the pool is saturated: longer than a new
    replica takes to serve (``cold_start``), so one ordered for the burst can still take it; in whole steps."""
    return (math.floor(cold_start / TTL_STEP_SECONDS) + 1) * TTL_STEP_SECONDS


def picker_config(inference: MultimodalInference, cold_start: float) -> Manifest:
    """The EndpointPickerConfig: the picker's default scorers (its defaults add the max-score picker and the single
    profile handler), with the prefix index reaching the longest text prompt the servers take (the picker counts 4
    characters of the messages' JSON a token; an inline image, its base64), saturation at the queue the SLO allows,
    and flow control holding requests up to ``request_ttl``.

    A second instance of the detector is the profile's filter (``utilization/detector.go`` ``Filter``), with a queue
    limit no replica reaches and a KV limit of 1.0: it drops a replica whose metrics are stale (older than 200 ms) or
    whose KV cache is full, unless that drops them all. Without it a replica whose server died while its pod is still
    Ready kept its last metrics and got more requests than the others (measured: 203 of 455 in 4 s, all failed) until
    the kubelet marked it. The saturation detector itself as the filter would also drop every replica with
    ``queue_depth`` waiting requests, which is 1 for a fleet serving under one request per SLO target: a repeated
    image's replica dropped as soon as one request waits there (``mmfleet bench routing``: prompt tokens found cached
    32% to 23%, P90 TTFT 0.79x to 0.82x round-robin's autoscaled, worse than the picker's defaults in every seed).

    Prefix index (requestcontrol/dataproducer/approximateprefix): ``autoTune`` takes the block size and each
    server's capacity in blocks from the servers' own cache metrics (vLLM's ``vllm:cache_config_info``, trtllm-serve's
    ``trtllm_kv_cache_tokens_per_block`` and ``trtllm_kv_cache_max_blocks``); ``maxPrefixTokensToMatch`` is
    ``maxModelLen``, where the default of 256 blocks (4,096 tokens, 16 KiB of the request's messages) would stop
    inside one inline image. A chat request's hashed bytes are its messages as JSON, image URLs and data URLs
    included (``hashing.go``), so the same image after the same text hashes the same.
    """
    backend = inference.spec.backend
    plugins: list[Manifest] = [
        {
            "type": "prefix-cache-scorer",
            "parameters": {"autoTune": True, "maxPrefixTokensToMatch": backend.max_model_len},
        },
        {"type": "queue-scorer"},
        {"type": "kv-cache-utilization-scorer"},
        {
            "type": "metrics-data-source",
            "parameters": {"scheme": "http", "path": backends.get(backend.name).metrics_path},
        },
        {"type": "core-metrics-extractor", "parameters": {"defaultEngine": ENGINES[backend.name]}},
        {
            "type": "utilization-detector",
            "parameters": {"queueDepthThreshold": queue_depth(inference), "kvCacheUtilThreshold": KV_CACHE_SATURATED},
        },
        {
            "name": STALE_FILTER,
            "type": "utilization-detector",
            "parameters": {"queueDepthThreshold": UNREACHED_QUEUE, "kvCacheUtilThreshold": 1.0},
        },
    ]
    return {
        "apiVersion": PICKER_CONFIG_API_VERSION,
        "kind": "EndpointPickerConfig",
        "featureGates": ["flowControl"],
        "plugins": plugins,
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [
                    {"pluginRef": STALE_FILTER},
                    *({"pluginRef": name, "weight": weight} for name, weight in SCORER_WEIGHTS),
                ],
            }
        ],
        "saturationDetector": {"pluginRef": "utilization-detector"},
        "dataLayer": {
            "sources": [{"pluginRef": "metrics-data-source", "extractors": [{"pluginRef": "core-metrics-extractor"}]}]
        },
        "flowControl": {"defaultRequestTTL": f"{request_ttl(cold_start)}s"},
    }


def picker_args(inference: MultimodalInference) -> list[str]:
    """The picker's command line (pkg/epp/server/options.go). Its metrics are served without the default token
    check, which would need a ClusterRole creating TokenReviews, and without pprof (on by default, on the metrics
    port): no NetworkPolicy covers the picker's pods, so its metrics are open to the cluster's pods."""
    return [
        "--pool-name",
        inference.metadata.name,
        "--pool-namespace",
        inference.metadata.namespace,
        "--pool-group",
        POOL_API_VERSION.split("/", 1)[0],
        "--config-file",
        f"{CONFIG_DIR}/{CONFIG_FILE}",
        "--grpc-port",
        str(GRPC_PORT),
        "--grpc-health-port",
        str(HEALTH_PORT),
        "--metrics-port",
        str(METRICS_PORT),
        "--metrics-endpoint-auth=false",
        "--enable-pprof=false",
        f"--tracing={'true' if inference.spec.tracing.enabled else 'false'}",
        "--zap-encoder",
        "json",
    ]


def picker_labels(fleet_labels: dict[str, str]) -> dict[str, str]:
    """The fleet's labels with the picker's component: its pods are neither the Service's nor the pool's."""
    return {**fleet_labels, "app.kubernetes.io/component": PICKER_COMPONENT}


def picker_selector(inference: MultimodalInference, inference_label: str) -> dict[str, str]:
    return {inference_label: inference.metadata.name, "app.kubernetes.io/component": PICKER_COMPONENT}


def build_inference_pool(
    inference: MultimodalInference, meta: Manifest, selector: dict[str, str], port: int
) -> Manifest:
    """The replicas the picker chooses among (api/v1/inferencepool_types.go); FailClose, the API's default: a
    request the picker cannot place is refused rather than sent to any replica, which would bypass flow control."""
    return {
        "apiVersion": POOL_API_VERSION,
        "kind": "InferencePool",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": selector},
            "targetPorts": [{"number": port}],
            "endpointPickerRef": {
                "kind": "Service",
                "name": picker_name(inference),
                "port": {"number": GRPC_PORT},
                "failureMode": "FailClose",
            },
        },
    }


def build_picker_config_map(inference: MultimodalInference, meta: Manifest, cold_start: float) -> Manifest:
    text = json.dumps(picker_config(inference, cold_start), indent=1, sort_keys=True)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {CONFIG_FILE: text}}


def build_picker_service_account(meta: Manifest) -> Manifest:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta}


def build_picker_role_binding(inference: MultimodalInference, meta: Manifest, cluster_role: str) -> Manifest:
    """The picker's ServiceAccount bound, in the fleet's namespace only, to the ClusterRole the operator's install
    ships (read pods and the pool: epplib/templates/_rbac.yaml, inferencepool/templates/rbac.yaml)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
        "subjects": [
            {"kind": "ServiceAccount", "name": picker_name(inference), "namespace": inference.metadata.namespace}
        ],
    }


def build_picker_service(meta: Manifest, selector: dict[str, str]) -> Manifest:
    """epplib/templates/_service.yaml's ports: ext_proc for the gateway, metrics for Prometheus."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [
                {"name": "grpc-ext-proc", "port": GRPC_PORT, "targetPort": GRPC_PORT, "protocol": "TCP"},
                {"name": "http-metrics", "port": METRICS_PORT, "targetPort": METRICS_PORT, "protocol": "TCP"},
            ],
        },
    }


def build_picker_deployment(
    inference: MultimodalInference,
    meta: Manifest,
    selector: dict[str, str],
    config: Manifest,
    tracing_endpoint: str | None,
    image: str = PICKER_IMAGE,
) -> Manifest:
    """One picker (no leader election, so no Lease rights), restricted like the servers; the configuration's
    hash on the template, so a new configuration restarts it (it reads the file once, at start)."""
    digest = hashlib.sha256(json.dumps(config["data"], sort_keys=True).encode()).hexdigest()[:16]
    env: list[Manifest] = [
        {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    tracing = inference.spec.tracing
    if tracing.enabled and tracing_endpoint:
        # pkg/common/observability/tracing/telemetry.go: the exporter is the console unless told otherwise.
        env += [
            {"name": "OTEL_SERVICE_NAME", "value": f"{inference.metadata.name}{PICKER_SUFFIX}"},
            {"name": "OTEL_TRACES_EXPORTER", "value": "otlp"},
            {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": tracing_endpoint},
            {"name": "OTEL_TRACES_SAMPLER", "value": "parentbased_traceidratio"},
            {"name": "OTEL_TRACES_SAMPLER_ARG", "value": f"{tracing.sample_ratio:g}"},
        ]
    probe = {"grpc": {"port": HEALTH_PORT, "service": HEALTH_SERVICE}}
    container: Manifest = {
        "name": "epp",
        "image": image,
        "args": picker_args(inference),
        "env": env,
        "ports": [
            {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
            {"name": "grpc-health", "containerPort": HEALTH_PORT, "protocol": "TCP"},
            {"name": METRICS_PORT_NAME, "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "livenessProbe": {**probe, "initialDelaySeconds": 5, "periodSeconds": 10},
        "readinessProbe": {**probe, "periodSeconds": 2},
        # The chart's request is 4 CPUs and 8 GiB, sized for high QPS; one fleet's picker starts smaller and may burst.
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "4Gi"}},
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": meta["labels"], "annotations": {CONFIG_HASH_ANNOTATION: digest}},
                "spec": {
                    "serviceAccountName": picker_name(inference),
                    "containers": [container],
                    "volumes": [{"name": "config", "configMap": {"name": picker_name(inference)}}],
                    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                },
            },
        },
    }


def build_http_route(inference: MultimodalInference, meta: Manifest) -> Manifest:
    """Every request the named Gateway admits for this route (under /v1 with warm standby), to the InferencePool (the
    extension's backendRef)."""
    gateway = inference.spec.routing.gateway
    assert gateway is not None, "an HTTPRoute only with a Gateway named"
    parent: Manifest = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": gateway.name}
    if gateway.namespace:
        parent["namespace"] = gateway.namespace
    if gateway.section_name:
        parent["sectionName"] = gateway.section_name
    backend = {"group": POOL_API_VERSION.split("/", 1)[0], "kind": "InferencePool", "name": inference.metadata.name}
    # With warm standby the servers run vLLM's development endpoints (/sleep, /collective_rpc), which no API key
    # guards: the gateway then passes the OpenAI API (/v1) only.
    prefix = "/v1" if inference.spec.standby is not None else "/"
    return {
        "apiVersion": HTTPROUTE_API_VERSION,
        "kind": "HTTPRoute",
        "metadata": meta,
        "spec": {
            "parentRefs": [parent],
            "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": prefix}}], "backendRefs": [backend]}],
        },
    }
