"""Pure rendering: one MultimodalInference and a cloud profile in, its child manifests out.

No I/O here. The controller applies what this returns with server-side apply, so every
object is complete (apiVersion, kind, metadata, owner reference) and fields the operator does
not own are left out: with autoscaling on, the Deployment carries no ``replicas``.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from importlib import resources
from typing import Any

from mmfleet import backends, clouds, routing
from mmfleet.api import API_VERSION, KIND, PROFILE_NAMES, Affinity, GpuSpec, MultimodalInference, NetworkPeer
from mmfleet.backends import Backend, EcRole, ServerContext
from mmfleet.backends.vllm import EC_SIDE_CHANNEL_PORT
from mmfleet.clouds import CloudProfile
from mmfleet.routing import PickerSettings, RoutingCrds

Manifest = dict[str, Any]

FIELD_MANAGER = "mmfleet"
INFERENCE_LABEL = "mmfleet.io/inference"
COMPONENT = "inference-server"
CONTAINER = "server"
# spec.disaggregation.encode: the encode tier's pods, and the sidecar in each serving pod that sends a request's
# images through them (mmfleet.encode_proxy, run by the server's image from the fleet's ConfigMap). The sidecar takes
# the serving port (its name and number: the Service, the InferencePool, Prometheus and warm standby reach the pod as
# before, and a fleet rolling onto the tier keeps serving from old and new pods alike); the server moves beside it.
ENCODE_COMPONENT = "encoder"
ENCODE_SUFFIX = "-encode"
PROXY_CONTAINER = "encode-proxy"
SERVER_PORT_NAME = "server"
SERVER_PORT = 8001
PROXY_FILE = "encode_proxy.py"
# Its program, read once from the package (rendering imports it not: it is an aiohttp server).
PROXY_SOURCE = resources.files("mmfleet").joinpath(PROXY_FILE).read_text(encoding="utf-8")
# What it asks: a proxy of a few requests at a time, whose bodies (images inline) it holds while it forwards them.
PROXY_CPU = "250m"
PROXY_MEMORY = "1Gi"

CACHE_DIR = "/cache"
# The shared claim's mount (spec.modelCache.volume shared). HOME stays on the replica's own volume:
# only caches whose concurrent writers upstream handles (docs/backends.md) go on the shared one.
SHARED_CACHE_DIR = "/shared-cache"
CONFIG_DIR = "/etc/mmfleet"
PVC_MOUNT = "/models"
# An oci:// source's image volume (Kubernetes' ImageVolume, KEP-4639): the image's root, read-only.
OCI_MOUNT = "/models/image"
# Weight download, model load and CUDA graph capture can take many minutes; the startup probe
# allows this much from container start before the kubelet restarts it (the image pull comes
# before and counts only against the Deployment's progress deadline).
STARTUP_BUDGET_SECONDS = 1800
# preStop waits this long at most for in-flight requests to finish before SIGTERM.
DRAIN_SECONDS = 120
# Endpoints take a moment to drop a terminating pod; requests may still arrive meanwhile.
DRAIN_SETTLE_SECONDS = 5
# After preStop, a backend that drains on SIGTERM gets this long to finish what is left.
SHUTDOWN_SECONDS = 30
# The most bytes one rendered child (as JSON, as applied) may take. A pod is stored in etcd with its template, its
# managedFields (about the template again) and its status, in one request of at most 1.5 MiB (etcd's
# --max-request-bytes); its ReplicaSet and Deployment likewise. 256 KiB, Kubernetes' own limit on an object's
# annotations, keeps each of them under half of that, and every pod of a fleet at most ~0.5 MiB of etcd; a real spec
# renders a Deployment of a few KiB.
CHILD_BYTES_MAX = 256 * 1024
CPU_PER_GPU = 4
MEMORY_GI_PER_GPU = 32
SHM_GI_PER_GPU = 2


# With warm standby, the Service and the InferencePool select pods labelled so; the operator sets it to "false" on a
# pod it puts to sleep (autoscaler.standby).
SERVING_LABEL = "mmfleet.io/serving"
# How many of the Deployment's replicas are warm standby, written with them (kube.Kube.scale_with_standby): the
# autoscaler's replicas are the rest.
STANDBY_ANNOTATION = "mmfleet.io/standby-replicas"


class SpecError(ValueError):
    """A spec the schema let through but that cannot be served; one message per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Placement:
    """Where the model comes from, as the pod sees it."""

    model_ref: str
    volume: Manifest | None
    mount: Manifest | None


@dataclass(frozen=True)
class Tier:
    """One Deployment of the fleet's servers: the serving tier (every fleet), or the encode tier."""

    name: str
    selector: dict[str, str]
    gpu: GpuSpec
    ec_role: EcRole | None


def selector_labels(inference: MultimodalInference) -> dict[str, str]:
    """Stable across spec changes: a Deployment's selector is immutable."""
    return {INFERENCE_LABEL: inference.metadata.name, "app.kubernetes.io/component": COMPONENT}


def encode_selector(inference: MultimodalInference) -> dict[str, str]:
    return {INFERENCE_LABEL: inference.metadata.name, "app.kubernetes.io/component": ENCODE_COMPONENT}


def encode_name(inference: MultimodalInference) -> str:
    return inference.metadata.name + ENCODE_SUFFIX


def serving_tier(inference: MultimodalInference) -> Tier:
    role: EcRole | None = "ec_consumer" if inference.spec.disaggregation.encode is not None else None
    return Tier(inference.metadata.name, selector_labels(inference), inference.spec.gpu, role)


def encode_tier(inference: MultimodalInference) -> Tier | None:
    encode = inference.spec.disaggregation.encode
    if encode is None:
        return None
    gpu = GpuSpec(count=encode.gpu.count, type=encode.gpu.type or inference.spec.gpu.type)
    return Tier(encode_name(inference), encode_selector(inference), gpu, "ec_producer")


def routed_labels(inference: MultimodalInference) -> dict[str, str]:
    """The pods a request may reach: with warm standby, those the operator has not taken out to sleep
    (autoscaler.standby)."""
    if inference.spec.standby is None:
        return selector_labels(inference)
    return {**selector_labels(inference), SERVING_LABEL: "true"}


def selector_string(inference: MultimodalInference) -> str:
    return ",".join(f"{k}={v}" for k, v in selector_labels(inference).items())


def labels(inference: MultimodalInference) -> dict[str, str]:
    backend = backends.get(inference.spec.backend.name)
    return {
        "app.kubernetes.io/name": backend.name,
        "app.kubernetes.io/instance": inference.metadata.name,
        "app.kubernetes.io/version": backend.version,
        "app.kubernetes.io/part-of": "mmfleet",
        "app.kubernetes.io/managed-by": "mmfleet",
        **selector_labels(inference),
    }


def endpoint(inference: MultimodalInference) -> str:
    port = backends.get(inference.spec.backend.name).port
    return f"http://{inference.metadata.name}.{inference.metadata.namespace}.svc.cluster.local:{port}/v1"


def tracing_endpoint(inference: MultimodalInference, cloud: CloudProfile, collector: str | None = None) -> str | None:
    """Where the pods send spans: spec.tracing.endpoint, else the operator's collector (its setting
    ``collector_endpoint``, which follows where the collector really is), else the cloud profile's default."""
    tracing = inference.spec.tracing
    if not tracing.enabled:
        return None
    return tracing.endpoint or collector or cloud.tracing_endpoint


def problems(inference: MultimodalInference) -> list[str]:
    """What only the operator can judge; the schema and the models caught the rest."""
    return _clashes(inference) or _routing_problems(inference) or _encode_problems(inference) or _oversized(inference)


def _encode_problems(inference: MultimodalInference) -> list[str]:
    name = encode_name(inference)
    if inference.spec.disaggregation.encode is not None and len(name) > 63:
        return [
            f"metadata.name: {inference.metadata.name} has {len(inference.metadata.name)} characters; with "
            f"spec.disaggregation.encode it may have at most {63 - len(ENCODE_SUFFIX)} (the encode tier's Service is "
            f"{name}, at most 63): use a shorter name, or no disaggregation.encode"
        ]
    return []


def _clashes(inference: MultimodalInference) -> list[str]:
    backend = backends.get(inference.spec.backend.name)
    return backends.clashes(backend, list(inference.spec.backend.extra_args))


def _bytes(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")))


def _largest_field(spec: Manifest) -> tuple[str, int]:
    """The spec's field that holds the most bytes: the largest one at each level, down while it holds at least half
    of its parent's."""
    path, node = "spec", spec
    while isinstance(node, dict | list) and node:
        items = node.items() if isinstance(node, dict) else enumerate(node)
        key, child = max(items, key=lambda item: _bytes(item[1]))
        if _bytes(child) * 2 < _bytes(node):
            break
        path, node = (f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}"), child
    return path, _bytes(node)


def _oversized(inference: MultimodalInference) -> list[str]:
    """A child over ``CHILD_BYTES_MAX`` on the spec's cloud (with auto, on any), named with the spec's largest field.

    Refused before anything is applied, as a spec problem: an apply the API server refuses for its size would be
    retried for ever, and a smaller one would still fill etcd with a copy per pod.
    """
    cloud = inference.spec.cloud
    for name in PROFILE_NAMES if cloud == "auto" else (cloud,):
        found = _too_large(inference, name, _children(inference, clouds.get(name), monitoring_crds=True))
        if found:
            return found
    return []


def _too_large(inference: MultimodalInference, cloud: str, children: list[Manifest]) -> list[str]:
    for child in children:
        size = _bytes(child)
        if size > CHILD_BYTES_MAX:
            field, held = _largest_field(inference.spec.wire())
            return [
                f"{field}: its {held:,} bytes make the {child['kind']} {child['metadata']['name']} {size:,} bytes "
                f"(on cloud {cloud}), over the {CHILD_BYTES_MAX:,} (256 KiB) a child of a MultimodalInference may "
                f"take; shorten {field}"
            ]
    return []


def _metadata(inference: MultimodalInference, name: str, **extra: Any) -> Manifest:
    meta = inference.metadata
    out: Manifest = {"name": name, "namespace": meta.namespace, "labels": labels(inference), **extra}
    # Offline (`mmfleet render` of a file) there is no uid yet, and an owner reference without one is invalid.
    if meta.uid:
        out["ownerReferences"] = [
            {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": meta.name,
                "uid": meta.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return out


def _tier_metadata(inference: MultimodalInference, tier: Tier) -> Manifest:
    """A tier's child: named after the tier, and labelled with its component."""
    meta = _metadata(inference, tier.name)
    meta["labels"] = {**meta["labels"], **tier.selector}
    return meta


def _model_placement(inference: MultimodalInference) -> Placement:
    source = inference.spec.model.resolved_source()
    scheme, rest = source.split("://", 1)
    if scheme == "hf":
        return Placement(model_ref=rest, volume=None, mount=None)
    if scheme == "pvc":
        claim, _, path = rest.partition("/")
        volume = {"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        mount = {"name": "model", "mountPath": PVC_MOUNT, "readOnly": True}
        return Placement(model_ref=f"{PVC_MOUNT}/{path}".rstrip("/"), volume=volume, mount=mount)
    if scheme == "oci":
        # The kubelet pulls the image with the node's credentials, once per node (a digest keeps the nodes in step).
        volume = {"name": "model", "image": {"reference": rest, "pullPolicy": "IfNotPresent"}}
        mount = {"name": "model", "mountPath": OCI_MOUNT, "readOnly": True}
        return Placement(model_ref=OCI_MOUNT, volume=volume, mount=mount)
    return Placement(model_ref=source, volume=None, mount=None)


def server_context(
    inference: MultimodalInference, cloud: CloudProfile, collector: str | None = None, ec_role: EcRole | None = None
) -> ServerContext:
    shared = inference.spec.model_cache.volume == "shared"
    cache_dir = SHARED_CACHE_DIR if shared else CACHE_DIR
    return ServerContext(
        inference=inference,
        model_ref=_model_placement(inference).model_ref,
        port=SERVER_PORT if ec_role == "ec_consumer" else backends.get(inference.spec.backend.name).port,
        config_dir=CONFIG_DIR,
        tracing_endpoint=tracing_endpoint(inference, cloud, collector),
        cache_dir=cache_dir,
        download_dir=f"{cache_dir}/models",
        shared_cache_dir=SHARED_CACHE_DIR if shared else None,
        cloud=cloud.name,
        ec_role=ec_role,
    )


def config_files(
    inference: MultimodalInference, cloud: CloudProfile, collector: str | None = None, tier: Tier | None = None
) -> dict[str, str]:
    """The files of the fleet's ConfigMap a tier's pods read (all of them: the ConfigMap's): the backend's, and the
    encode sidecar's program in the serving pods of a fleet with an encode tier."""
    ctx = server_context(inference, cloud, collector, serving_tier(inference).ec_role)
    files = backends.get(inference.spec.backend.name).config_files(ctx)
    serving = tier is None or tier.ec_role != "ec_producer"
    if inference.spec.disaggregation.encode is not None and serving:
        files = {**files, PROXY_FILE: PROXY_SOURCE}
    return files


def _cores(value: float) -> str:
    """Cores as a quantity: whole cores, else millicores rounded up (float noise aside)."""
    millicores = math.ceil(round(value * 1000, 6))
    return str(millicores // 1000) if millicores % 1000 == 0 else f"{millicores}m"


def _gi(value: float) -> str:
    """GiB as a quantity: whole GiB, else MiB rounded up."""
    return f"{int(value)}Gi" if value == int(value) else f"{math.ceil(value * 1024)}Mi"


def _cache_volume(inference: MultimodalInference, cloud: CloudProfile, tier: Tier) -> Manifest:
    cache = inference.spec.model_cache
    # With shared, the replica's own volume holds only HOME and scratch: the node's disk will do.
    if cache.volume != "ephemeral":
        return {"name": "cache", "emptyDir": {"sizeLimit": str(cache.size)}}
    claim: Manifest = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": str(cache.size)}},
    }
    storage_class = cache.storage_class_name or cloud.storage_class
    if storage_class:
        claim["storageClassName"] = storage_class
    template = {"metadata": {"labels": tier.selector}, "spec": claim}
    return {"name": "cache", "ephemeral": {"volumeClaimTemplate": template}}


def _drain_command(backend: Backend, port: int) -> list[str]:
    """Wait until the server (on ``port``) reports no running or waiting request, so SIGTERM drops nothing."""
    url = f"http://127.0.0.1:{port}{backend.metrics_path}"
    busy = (backend.metrics.running, backend.metrics.waiting)
    script = (
        "import time, urllib.request\n"
        f"time.sleep({DRAIN_SETTLE_SECONDS})\n"
        f"deadline = time.time() + {DRAIN_SECONDS - DRAIN_SETTLE_SECONDS}\n"
        "while time.time() < deadline:\n"
        "    try:\n"
        f"        text = urllib.request.urlopen({url!r}, timeout=2).read().decode()\n"
        "    except Exception:\n"
        "        break\n"
        f"    busy = sum(float(line.rsplit(' ', 1)[1]) for line in text.splitlines()\n"
        f"               if line.split('{{', 1)[0].split(' ', 1)[0] in {busy!r})\n"
        "    if busy == 0:\n"
        "        break\n"
        "    time.sleep(1)\n"
    )
    return ["python3", "-c", script]


def _probe(backend: Backend, port: str, period: int, failures: int, timeout: int) -> Manifest:
    return {
        "httpGet": {"path": backend.health_path, "port": port},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": timeout,
    }


def _merge_affinity(cloud_affinity: Manifest | None, user: Affinity) -> Manifest | None:
    """The user's affinity on top of the cloud's GPU selection, which it narrows but never drops.

    Required node selector terms are ORed within a list, so "cloud AND user" is every pairing of
    a cloud term with a user term. The typed ``Affinity`` guarantees every shape read here.
    """
    merged: Manifest = user.model_dump(by_alias=True, exclude_defaults=True, mode="json")
    if not cloud_affinity:
        return merged or None
    key = "requiredDuringSchedulingIgnoredDuringExecution"
    node = dict(merged.get("nodeAffinity", {}))
    cloud_terms = cloud_affinity[key]["nodeSelectorTerms"]
    user_terms = node.get(key, {}).get("nodeSelectorTerms") or [{}]
    node[key] = {
        "nodeSelectorTerms": [
            {
                field: [*c.get(field, []), *u.get(field, [])]
                for field in ("matchExpressions", "matchFields")
                if c.get(field) or u.get(field)
            }
            for c in cloud_terms
            for u in user_terms
        ]
    }
    merged["nodeAffinity"] = node
    return merged


def _config_checksum(files: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]


def build_service_account(inference: MultimodalInference, cloud: CloudProfile) -> Manifest:
    wiring = cloud.identity(inference.spec.identity)
    meta = _metadata(inference, inference.metadata.name)
    if wiring.service_account_annotations:
        meta["annotations"] = dict(wiring.service_account_annotations)
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta}


def config_map_name(inference: MultimodalInference) -> str:
    return f"{inference.metadata.name}-config"


def optional_children(inference: MultimodalInference) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of the children a spec may or may not ask for: pruned when it does not."""
    return [
        ("v1", "ConfigMap", config_map_name(inference)),
        ("monitoring.coreos.com/v1", "PodMonitor", inference.metadata.name),
        *routing.front_door(inference),
        *encode_children(inference),
    ]


def encode_children(inference: MultimodalInference) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of the encode tier's children."""
    name = encode_name(inference)
    return [
        ("apps/v1", "Deployment", name),
        ("v1", "Service", name),
        ("policy/v1", "PodDisruptionBudget", name),
        ("networking.k8s.io/v1", "NetworkPolicy", name),
        ("monitoring.coreos.com/v1", "PodMonitor", name),
    ]


def build_config_map(inference: MultimodalInference, files: dict[str, str]) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(inference, config_map_name(inference)),
        "data": dict(files),
    }


def build_deployment(inference: MultimodalInference, cloud: CloudProfile, collector: str | None = None) -> Manifest:
    """The serving tier: every fleet's replicas, which the autoscaler scales."""
    return _server_deployment(inference, cloud, collector, serving_tier(inference))


def _server_deployment(
    inference: MultimodalInference, cloud: CloudProfile, collector: str | None, tier: Tier
) -> Manifest:
    spec = inference.spec
    backend = backends.get(spec.backend.name)
    placement = _model_placement(inference)
    ctx = server_context(inference, cloud, collector, tier.ec_role)
    files = config_files(inference, cloud, collector, tier)
    serving = tier.ec_role != "ec_producer"
    gpus = tier.gpu.count
    extra = backend.host_extra(inference, tier.ec_role)
    shm = _gi(SHM_GI_PER_GPU * gpus + extra.shm_gib)
    memory = (
        str(spec.resources.memory)
        if spec.resources.memory is not None
        else _gi(MEMORY_GI_PER_GPU * gpus + extra.memory_gib + SHM_GI_PER_GPU * gpus + extra.shm_gib)
    )
    cpu = str(spec.resources.cpu) if spec.resources.cpu is not None else _cores(CPU_PER_GPU * gpus + extra.cpu)

    volumes: list[Manifest] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}},
        _cache_volume(inference, cloud, tier),
    ]
    mounts: list[Manifest] = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "cache", "mountPath": CACHE_DIR},
    ]
    claim = spec.model_cache.claim_name  # set exactly when volume is shared
    if claim is not None:
        volumes.append({"name": "shared-cache", "persistentVolumeClaim": {"claimName": claim}})
        mounts.append({"name": "shared-cache", "mountPath": SHARED_CACHE_DIR})
    if placement.volume is not None and placement.mount is not None:
        volumes.append(placement.volume)
        mounts.append(placement.mount)
    if files:
        volumes.append({"name": "config", "configMap": {"name": config_map_name(inference)}})
        mounts.append({"name": "config", "mountPath": CONFIG_DIR, "readOnly": True})

    for path in backend.writable_paths:
        # The image's own directory may not be writable by the pod's non-root user.
        name = "writable" + path.replace("/", "-")
        volumes.append({"name": name, "emptyDir": {}})
        mounts.append({"name": name, "mountPath": path})

    env: list[Manifest] = [{"name": "HOME", "value": CACHE_DIR}, *backend.env(ctx)]
    port_name = SERVER_PORT_NAME if tier.ec_role == "ec_consumer" else "http"
    ports: list[Manifest] = [{"name": port_name, "containerPort": ctx.port, "protocol": "TCP"}]
    if tier.ec_role == "ec_producer":
        ports.append({"name": "ec-side-channel", "containerPort": EC_SIDE_CHANNEL_PORT, "protocol": "TCP"})
    image = spec.backend.image or backend.image
    container: Manifest = {
        "name": CONTAINER,
        "image": image,
        "command": [*backend.command(ctx), *backend.drain_args(SHUTDOWN_SECONDS), *spec.backend.extra_args],
        "workingDir": CACHE_DIR,
        "ports": ports,
        "env": env,
        "resources": {
            "requests": {"cpu": cpu, "memory": memory, cloud.gpu_resource: str(gpus)},
            "limits": {"memory": memory, cloud.gpu_resource: str(gpus)},
        },
        "volumeMounts": mounts,
        "startupProbe": _probe(backend, port_name, period=10, failures=STARTUP_BUDGET_SECONDS // 10, timeout=5),
        "readinessProbe": _probe(backend, port_name, period=5, failures=3, timeout=3),
        "livenessProbe": _probe(backend, port_name, period=15, failures=4, timeout=5),
        "lifecycle": {"preStop": {"exec": {"command": _drain_command(backend, ctx.port)}}},
        "securityContext": _container_security(backend),
    }
    if spec.model.credentials_secret:
        container["envFrom"] = [{"secretRef": {"name": spec.model.credentials_secret}}]
    containers = [container]
    if tier.ec_role == "ec_consumer":
        containers.append(_proxy_container(inference, backend, image))

    wiring = cloud.identity(spec.identity)
    pod_annotations = {"kubectl.kubernetes.io/default-container": CONTAINER}
    if files:
        pod_annotations["mmfleet.io/config-checksum"] = _config_checksum(files)
    pod_spec: Manifest = {
        "serviceAccountName": inference.metadata.name,
        # The servers never call the API server. Workload identity (IRSA, Azure workload identity, RRSA) needs no
        # default token either: each webhook mounts a projected token of its own audience (docs/clouds.md).
        "automountServiceAccountToken": False,
        # A Service named like the backend would otherwise inject VLLM_PORT=tcp://..., which vLLM misreads.
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": DRAIN_SECONDS + SHUTDOWN_SECONDS + 10,
        "containers": containers,
        "volumes": volumes,
        "tolerations": [*cloud.gpu_tolerations(), *(t.wire() for t in spec.placement.tolerations)],
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                # GPUs are scarce: spreading is a preference, never a reason to stay Pending.
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": tier.selector},
            }
        ],
        "securityContext": _pod_security(backend, shared_cache=spec.model_cache.volume == "shared"),
    }
    if spec.placement.node_selector:
        pod_spec["nodeSelector"] = dict(spec.placement.node_selector)
    affinity = _merge_affinity(cloud.gpu_node_affinity(tier.gpu), spec.placement.affinity)
    if affinity:
        pod_spec["affinity"] = affinity

    pod_labels = {**labels(inference), **tier.selector, **(routed_labels(inference) if serving else {})}
    deployment_spec: Manifest = {
        "selector": {"matchLabels": tier.selector},
        "revisionHistoryLimit": 3,
        "progressDeadlineSeconds": STARTUP_BUDGET_SECONDS + 600,
        # Never drop serving capacity for a rollout; a surge pod needs one spare replica's GPUs.
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        "template": {
            "metadata": {"labels": {**pod_labels, **wiring.pod_labels}, "annotations": pod_annotations},
            "spec": pod_spec,
        },
    }
    encode = spec.disaggregation.encode
    if not serving and encode is not None:
        if spec.encode_autoscaling is None:  # else its autoscaler owns them, as the serving tier's
            deployment_spec["replicas"] = encode.replicas
    elif not spec.autoscaled:
        deployment_spec["replicas"] = spec.replicas
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _tier_metadata(inference, tier),
        "spec": deployment_spec,
    }


def _proxy_container(inference: MultimodalInference, backend: Backend, image: str) -> Manifest:
    """The sidecar that sends a request's images through the encode tier and the request on to the server beside it
    (mmfleet.encode_proxy), on the serving port; the server's own image runs it, from the fleet's ConfigMap. It
    drains as the server does: its preStop waits for the server to finish what it has, then in-flight answers get
    SHUTDOWN_SECONDS."""
    encoder = f"http://{encode_name(inference)}.{inference.metadata.namespace}.svc:{backend.port}"
    return {
        "name": PROXY_CONTAINER,
        "image": image,
        "command": [
            *("python3", f"{CONFIG_DIR}/{PROXY_FILE}", "--port", str(backend.port)),
            *("--server", f"http://127.0.0.1:{SERVER_PORT}", "--encoder", encoder),
            *("--shutdown-seconds", str(SHUTDOWN_SECONDS)),
        ],
        "ports": [{"name": "http", "containerPort": backend.port, "protocol": "TCP"}],
        "resources": {
            "requests": {"cpu": PROXY_CPU, "memory": PROXY_MEMORY},
            "limits": {"memory": PROXY_MEMORY},
        },
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}],
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}, {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
        "readinessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 5, "failureThreshold": 3},
        "lifecycle": {"preStop": {"exec": {"command": _drain_command(backend, SERVER_PORT)}}},
        "securityContext": {**_container_security(backend), "readOnlyRootFilesystem": True},
    }


def _container_security(backend: Backend) -> Manifest:
    context: Manifest = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if backend.run_as_user is not None:
        context.update({"runAsNonRoot": True, "runAsUser": backend.run_as_user})
    return context


def _pod_security(backend: Backend, *, shared_cache: bool) -> Manifest:
    context: Manifest = {"seccompProfile": {"type": "RuntimeDefault"}}
    if backend.run_as_user is not None:
        # Makes the model cache (emptyDir or PVC) writable by the image's user.
        context["fsGroup"] = backend.run_as_user
        if shared_cache:
            # Where the volume's driver applies fsGroup, the default (Always) re-owns every file of the
            # shared claim at each pod start; once its root is right, nothing needs changing.
            context["fsGroupChangePolicy"] = "OnRootMismatch"
    return context


def build_service(inference: MultimodalInference, cloud: CloudProfile) -> Manifest:
    backend = backends.get(inference.spec.backend.name)
    service_type = inference.spec.service.type
    meta = _metadata(inference, inference.metadata.name)
    if service_type == "LoadBalancer" and cloud.internal_lb_annotations:
        meta["annotations"] = dict(cloud.internal_lb_annotations)
    spec: Manifest = {
        "type": service_type,
        "selector": routed_labels(inference),
        "ports": [{"name": "http", "port": backend.port, "targetPort": "http", "protocol": "TCP"}],
    }
    ranges = inference.spec.service.load_balancer_source_ranges
    if service_type == "LoadBalancer" and ranges:
        spec["loadBalancerSourceRanges"] = list(ranges)
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec}


def build_encode_service(inference: MultimodalInference, tier: Tier) -> Manifest:
    """The encode tier's Service: the serving pods' sidecars send each request's images to it."""
    port = backends.get(inference.spec.backend.name).port
    spec: Manifest = {
        "type": "ClusterIP",
        "selector": tier.selector,
        "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
    }
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _tier_metadata(inference, tier),
        "spec": spec,
    }


def build_pod_disruption_budget(inference: MultimodalInference, tier: Tier | None = None) -> Manifest:
    tier = tier or serving_tier(inference)
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _tier_metadata(inference, tier),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": tier.selector},
            # A crash-looping replica serves nothing; it must not block a node drain.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def build_network_policy(
    inference: MultimodalInference, prometheus_namespace: str | None = None, operator_namespace: str | None = None
) -> Manifest:
    """Ingress to the serving port (the API and /metrics share it) only from those the spec and the operator name.

    The fleet's namespace, or spec.networkPolicy.ingressFrom; the namespace of the operator's Prometheus and
    metricsFrom; with warm standby the operator's namespace, which puts replicas to sleep and wakes them; and with a
    LoadBalancer every source: its clients reach the pods through the load balancer,
    often with the balancer's or a node's address (SNAT), which no rule can tell apart, so the balancer's own
    loadBalancerSourceRanges and spec.apiKeySecret guard them.
    """
    policy = inference.spec.network_policy
    service = inference.spec.service
    port = [{"port": "http", "protocol": "TCP"}]

    def peers(items: list[NetworkPeer]) -> list[Manifest]:
        # exclude_defaults keeps a selector given as {} (every namespace or pod) as {}.
        return [p.model_dump(by_alias=True, exclude_defaults=True, mode="json") for p in items]

    rules: list[Manifest] = [{"ports": port, "from": peers(policy.ingress_from) or [{"podSelector": {}}]}]
    scrapers = peers(policy.metrics_from)
    if prometheus_namespace:  # even the fleet's own: ingressFrom may leave it out
        namespace_label = {"kubernetes.io/metadata.name": prometheus_namespace}
        scrapers.append({"namespaceSelector": {"matchLabels": namespace_label}})
    if scrapers:
        rules.append({"ports": port, "from": scrapers})
    if inference.spec.routing.mode == "inferencePool":
        rules.append({"ports": port, "from": _front_door_peers(inference)})
    if inference.spec.standby is not None and operator_namespace:
        operator = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": operator_namespace}}}
        rules.append({"ports": port, "from": [operator]})
    if service.type == "LoadBalancer":
        rules.append({"ports": port})
    if inference.spec.disaggregation.encode is not None:
        # NIXL's transfers between the tiers open ports of their own choosing (UCX), in either direction.
        rules.append({"from": [{"podSelector": {"matchLabels": encode_selector(inference)}}]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(inference, inference.metadata.name),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(inference)},
            "policyTypes": ["Ingress"],
            "ingress": rules,
        },
    }


def build_encode_network_policy(
    inference: MultimodalInference, tier: Tier, prometheus_namespace: str | None = None
) -> Manifest:
    """The encode pods take requests and NIXL transfers from the fleet's serving pods only (the sidecars call the
    encode Service; the servers read the outputs on ports NIXL picks), and scrapes on the server's port."""
    port = [{"port": "http", "protocol": "TCP"}]
    rules: list[Manifest] = [{"from": [{"podSelector": {"matchLabels": selector_labels(inference)}}]}]
    scrapers = [
        p.model_dump(by_alias=True, exclude_defaults=True, mode="json")
        for p in inference.spec.network_policy.metrics_from
    ]
    if prometheus_namespace:
        scrapers.append({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": prometheus_namespace}}})
    if scrapers:
        rules.append({"ports": port, "from": scrapers})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _tier_metadata(inference, tier),
        "spec": {
            "podSelector": {"matchLabels": tier.selector},
            "policyTypes": ["Ingress"],
            "ingress": rules,
        },
    }


def _front_door_peers(inference: MultimodalInference) -> list[Manifest]:
    """In routing mode inferencePool: the picker, which reads the servers' /metrics, and the named Gateway's
    namespace, whose proxies send each request to the pod the picker chose (not through the Service)."""
    peers: list[Manifest] = [{"podSelector": {"matchLabels": routing.picker_selector(inference, INFERENCE_LABEL)}}]
    gateway = inference.spec.routing.gateway
    if gateway is not None:
        namespace = gateway.namespace or inference.metadata.namespace
        peers.append({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}})
    return peers


def build_pod_monitor(inference: MultimodalInference) -> Manifest:
    """Scrape every replica and stamp the series with the labels the autoscaler groups by."""
    backend = backends.get(inference.spec.backend.name)
    meta = _metadata(inference, inference.metadata.name)
    return _pod_monitor(meta, selector_labels(inference), "http", backend.metrics_path)


# How often the rendered PodMonitors have Prometheus scrape the servers and the picker, seconds.
SCRAPE_INTERVAL = 15.0


# The encode pods' series carry the fleet's name in a label of their own: under mmfleet_io_inference their vllm:* series
# would join the serving replicas' in every query the autoscaler sends.
ENCODE_FLEET_LABEL = "mmfleet_io_encode"


def _pod_monitor(
    meta: Manifest, selector: dict[str, str], port: str, path: str, fleet_label: str = "mmfleet_io_inference"
) -> Manifest:
    """A PodMonitor of the pods ``selector`` picks, their series labelled by fleet (``fleet_label``), namespace and
    pod."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": selector},
            "podMetricsEndpoints": [
                {
                    "port": port,
                    "path": path,
                    "interval": f"{SCRAPE_INTERVAL:g}s",
                    "relabelings": [
                        {
                            "sourceLabels": ["__meta_kubernetes_pod_label_mmfleet_io_inference"],
                            "targetLabel": fleet_label,
                        },
                        {"sourceLabels": ["__meta_kubernetes_namespace"], "targetLabel": "namespace"},
                        {"sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "pod"},
                    ],
                }
            ],
        },
    }


def render(
    inference: MultimodalInference,
    cloud: CloudProfile | str,
    *,
    monitoring_crds: bool = False,
    collector_endpoint: str | None = None,
    prometheus_namespace: str | None = None,
    picker: PickerSettings | None = None,
    routing_crds: RoutingCrds = routing.ALL_SERVED,
    operator_namespace: str | None = None,
) -> list[Manifest]:
    """Every child of one resource, in the order they are applied; ``collector_endpoint``: see tracing_endpoint;
    ``prometheus_namespace``: where the operator's Prometheus runs, admitted to the pods' /metrics; ``picker``: for
    routing mode inferencePool; ``routing_crds``: which of its kinds are served (all, offline); ``operator_namespace``:
    admitted to the serving port of fleets with warm standby."""
    found = _clashes(inference) + _routing_problems(inference)
    if found:
        raise SpecError(found)
    profile = clouds.get(cloud) if isinstance(cloud, str) else cloud
    children = _children(
        inference,
        profile,
        monitoring_crds,
        collector_endpoint,
        prometheus_namespace,
        picker,
        routing_crds,
        operator_namespace,
    )
    found = _too_large(inference, profile.name, children)
    if found:
        raise SpecError(found)
    return children


def _children(
    inference: MultimodalInference,
    profile: CloudProfile,
    monitoring_crds: bool = False,
    collector_endpoint: str | None = None,
    prometheus_namespace: str | None = None,
    picker: PickerSettings | None = None,
    routing_crds: RoutingCrds = routing.ALL_SERVED,
    operator_namespace: str | None = None,
) -> list[Manifest]:
    files = config_files(inference, profile, collector_endpoint)
    children = [build_service_account(inference, profile)]
    if files:
        children.append(build_config_map(inference, files))
    children += [
        build_deployment(inference, profile, collector_endpoint),
        build_service(inference, profile),
        build_pod_disruption_budget(inference),
        build_network_policy(inference, prometheus_namespace, operator_namespace),
    ]
    wants_monitor = inference.spec.monitoring.pod_monitor
    monitored = bool(wants_monitor or (wants_monitor is None and monitoring_crds))
    if monitored:
        children.append(build_pod_monitor(inference))
    encode = encode_tier(inference)
    if encode is not None:
        children += [
            _server_deployment(inference, profile, collector_endpoint, encode),
            build_encode_service(inference, encode),
            build_pod_disruption_budget(inference, encode),
            build_encode_network_policy(inference, encode, prometheus_namespace),
        ]
        if monitored:
            path = backends.get(inference.spec.backend.name).metrics_path
            meta = _tier_metadata(inference, encode)
            children.append(_pod_monitor(meta, encode.selector, "http", path, ENCODE_FLEET_LABEL))
    if inference.spec.routing.mode == "inferencePool" and routing_crds.pool:
        picker = picker or routing.DEFAULT_PICKER
        children += _front_door(inference, profile, collector_endpoint, picker, routing_crds.route, monitored)
    return children


def _routing_problems(inference: MultimodalInference) -> list[str]:
    name = inference.metadata.name
    if inference.spec.routing.mode == "inferencePool" and len(name) > routing.NAME_MAX:
        return [
            f"metadata.name: {name} has {len(name)} characters; with spec.routing.mode inferencePool it may have at "
            f"most {routing.NAME_MAX} (its endpoint picker's Service is {name}{routing.PICKER_SUFFIX}, at most 63): "
            "use a shorter name, or routing.mode service"
        ]
    return []


def _front_door(
    inference: MultimodalInference,
    profile: CloudProfile,
    collector: str | None,
    picker: PickerSettings,
    route_served: bool,
    monitored: bool,
) -> list[Manifest]:
    """The InferencePool and its endpoint picker (mmfleet.routing), the HTTPRoute when a Gateway is named, and the
    picker's PodMonitor beside the fleet's (its queue, saturation and prefix-index series: the dashboard's Routing
    row)."""
    name = routing.picker_name(inference)
    meta = {**_metadata(inference, name), "labels": routing.picker_labels(labels(inference))}
    selector = routing.picker_selector(inference, INFERENCE_LABEL)
    config = routing.build_picker_config_map(inference, meta, picker.cold_start)
    port = backends.get(inference.spec.backend.name).port
    children = [
        routing.build_picker_service_account(meta),
        config,
        routing.build_picker_role_binding(inference, meta, picker.cluster_role),
        routing.build_picker_deployment(
            inference, meta, selector, config, tracing_endpoint(inference, profile, collector), picker.image
        ),
        routing.build_picker_service(meta, selector),
        routing.build_inference_pool(
            inference, _metadata(inference, inference.metadata.name), routed_labels(inference), port
        ),
    ]
    if inference.spec.routing.gateway is not None and route_served:
        children.append(routing.build_http_route(inference, _metadata(inference, inference.metadata.name)))
    if monitored:
        children.append(_pod_monitor(meta, selector, routing.METRICS_PORT_NAME, "/metrics"))
    return children
