"""Rendering: what each child of a MultimodalInference carries, for every backend and cloud."""

from __future__ import annotations

from typing import Any

import pytest

from mmfleet import render
from mmfleet.api import PROFILE_NAMES, MultimodalInference
from mmfleet.validation import parse
from tests.helpers.repo import spec_doc

CLOUDS = PROFILE_NAMES
BACKENDS = ["vllm", "tensorrt-llm"]


def children(doc: dict[str, Any], cloud: str = "generic", **kw: Any) -> dict[str, dict[str, Any]]:
    return {c["kind"]: c for c in render.render(parse(doc), cloud, **kw)}


def pod(doc: dict[str, Any], cloud: str = "generic") -> dict[str, Any]:
    spec: dict[str, Any] = children(doc, cloud)["Deployment"]["spec"]["template"]["spec"]
    return spec


def server(doc: dict[str, Any], cloud: str = "generic") -> dict[str, Any]:
    container: dict[str, Any] = pod(doc, cloud)["containers"][0]
    return container


@pytest.mark.parametrize("cloud", CLOUDS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_child_is_owned_and_labelled(cloud: str, backend: str) -> None:
    for child in render.render(parse(spec_doc(backend={"name": backend})), cloud, monitoring_crds=True):
        meta = child["metadata"]
        assert meta["namespace"] == "ml"
        owner = meta["ownerReferences"][0]
        assert owner["kind"] == "MultimodalInference"
        assert owner["name"] == "qwen"
        assert owner["uid"] == "0b9c7c4e-1111-2222-3333-444455556666"
        assert owner["controller"] is True
        assert meta["labels"]["mmfleet.io/inference"] == "qwen"
        assert meta["labels"]["app.kubernetes.io/part-of"] == "mmfleet"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "mmfleet"
        assert meta["labels"]["app.kubernetes.io/instance"] == "qwen"


def test_children_are_the_expected_set() -> None:
    assert list(children(spec_doc())) == [
        "ServiceAccount",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "NetworkPolicy",
    ]
    with_monitor = children(spec_doc(), monitoring_crds=True)
    assert "PodMonitor" in with_monitor
    assert "PodMonitor" in children(spec_doc(monitoring={"podMonitor": True}))
    assert "PodMonitor" not in children(spec_doc(monitoring={"podMonitor": False}), monitoring_crds=True)


def test_autoscaled_deployment_leaves_replicas_to_the_scaler() -> None:
    auto = children(spec_doc(autoscaling={"slo": {"target": "2s"}}))["Deployment"]["spec"]
    assert "replicas" not in auto
    fixed = children(spec_doc(replicas=3))["Deployment"]["spec"]
    assert fixed["replicas"] == 3


def test_gpu_limit_and_shm_scale_with_gpus() -> None:
    doc = spec_doc(gpu={"count": 4})
    container = server(doc)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "4"
    shm = next(v for v in pod(doc)["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    # Memory-backed shm counts against the memory limit, so the limit includes it.
    assert container["resources"]["limits"]["memory"] == "136Gi"


def test_probes_allow_a_long_model_load() -> None:
    container = server(spec_doc())
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["livenessProbe"]["httpGet"]["port"] == "http"


def test_prestop_drains_and_grace_period_covers_it() -> None:
    container = server(spec_doc())
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["python3", "-c"]
    assert "vllm:num_requests_running" in command[2]
    assert "vllm:num_requests_waiting" in command[2]
    compile(command[2], "prestop", "exec")
    assert pod(spec_doc())["terminationGracePeriodSeconds"] > render.DRAIN_SECONDS


def test_vllm_runs_restricted_non_root() -> None:
    context = server(spec_doc())["securityContext"]
    assert context["runAsNonRoot"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["runAsUser"] == 2000  # the vllm user the image ships
    assert pod(spec_doc())["securityContext"]["fsGroup"] == 2000


def test_credentials_come_from_the_secret() -> None:
    container = server(spec_doc(model={"name": "m", "credentialsSecret": "hf-token"}))
    assert container["envFrom"] == [{"secretRef": {"name": "hf-token"}}]
    assert "envFrom" not in server(spec_doc())


def test_pvc_source_mounts_the_claim_read_only() -> None:
    doc = spec_doc(model={"name": "qwen", "source": "pvc://weights/qwen/7b"})
    spec = pod(doc)
    volume = next(v for v in spec["volumes"] if v["name"] == "model")
    assert volume["persistentVolumeClaim"] == {"claimName": "weights", "readOnly": True}
    assert "/models/qwen/7b" in spec["containers"][0]["command"]


def test_persistent_cache_uses_the_cloud_storage_class() -> None:
    doc = spec_doc(modelCache={"size": "300Gi", "volume": "ephemeral"})
    for cloud in ("eks", "aks", "ack"):
        cache = next(v for v in pod(doc, cloud)["volumes"] if v["name"] == "cache")
        claim = cache["ephemeral"]["volumeClaimTemplate"]["spec"]
        assert claim["resources"]["requests"]["storage"] == "300Gi"
        assert claim["storageClassName"]
    local = next(v for v in pod(spec_doc())["volumes"] if v["name"] == "cache")
    assert local == {"name": "cache", "emptyDir": {"sizeLimit": "200Gi"}}


@pytest.mark.parametrize("cloud", ["eks", "aks", "ack"])
def test_gpu_type_selects_nodes_per_cloud(cloud: str) -> None:
    spec = pod(spec_doc(gpu={"type": "H100"}), cloud)
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms
    assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])


def test_user_placement_is_merged_over_the_cloud() -> None:
    doc = spec_doc(
        gpu={"type": "H100"},
        placement={
            "nodeSelector": {"pool": "inference"},
            "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
            "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        },
    )
    spec = pod(doc, "eks")
    assert spec["nodeSelector"] == {"pool": "inference"}
    assert {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert "nodeAffinity" in spec["affinity"]
    assert "podAntiAffinity" in spec["affinity"]


def test_user_node_affinity_narrows_the_gpu_selection() -> None:
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-west-2a"]}
    user = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [zone]}]}}}  # fmt: skip
    cloud_only = pod(spec_doc(gpu={"type": "H100"}), "eks")["affinity"]["nodeAffinity"]
    merged = pod(spec_doc(gpu={"type": "H100"}, placement={"affinity": user}), "eks")["affinity"]["nodeAffinity"]
    key = "requiredDuringSchedulingIgnoredDuringExecution"
    cloud_terms = cloud_only[key]["nodeSelectorTerms"]
    terms = merged[key]["nodeSelectorTerms"]
    assert len(terms) == len(cloud_terms)
    for term, cloud_term in zip(terms, cloud_terms, strict=True):
        assert term["matchExpressions"] == [*cloud_term["matchExpressions"], zone]


def test_offline_render_has_no_owner_reference() -> None:
    doc = spec_doc()
    del doc["metadata"]["uid"]
    for child in render.render(parse(doc), "generic"):
        assert "ownerReferences" not in child["metadata"]


def test_workload_identity_per_cloud() -> None:
    doc = spec_doc(identity={"awsRoleArn": "arn:aws:iam::123456789012:role/reader"})
    account = children(doc, "eks")["ServiceAccount"]
    assert account["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/reader"}
    assert "annotations" not in children(doc, "generic")["ServiceAccount"]["metadata"]
    azure = spec_doc(identity={"azureClientId": "00000000-0000-0000-0000-000000000001"})
    template = children(azure, "aks")["Deployment"]["spec"]["template"]
    assert template["metadata"]["labels"]["azure.workload.identity/use"] == "true"
    assert template["spec"]["serviceAccountName"] == "qwen"


def test_internal_load_balancer_only_when_asked() -> None:
    lb = children(spec_doc(service={"type": "LoadBalancer"}, cloud="aks"), "aks")["Service"]
    assert lb["spec"]["type"] == "LoadBalancer"
    assert lb["metadata"]["annotations"]
    assert "annotations" not in children(spec_doc(), "aks")["Service"]["metadata"]


def test_service_routes_to_the_pods() -> None:
    rendered = children(spec_doc())
    service, deployment = rendered["Service"], rendered["Deployment"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "http"


def test_selector_is_stable_across_backend_change() -> None:
    a = children(spec_doc(backend={"name": "vllm"}))["Deployment"]["spec"]["selector"]
    b = children(spec_doc(backend={"name": "tensorrt-llm"}))["Deployment"]["spec"]["selector"]
    assert a == b


def test_pod_disruption_budget_never_blocks_on_broken_pods() -> None:
    pdb = children(spec_doc())["PodDisruptionBudget"]["spec"]
    assert pdb["maxUnavailable"] == 1
    assert pdb["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_pod_monitor_puts_inference_and_namespace_on_series() -> None:
    monitor = children(spec_doc(), monitoring_crds=True)["PodMonitor"]["spec"]
    relabel = monitor["podMetricsEndpoints"][0]["relabelings"]
    targets = {r["targetLabel"]: r["sourceLabels"] for r in relabel}
    assert targets["mmfleet_io_inference"] == ["__meta_kubernetes_pod_label_mmfleet_io_inference"]
    assert targets["namespace"] == ["__meta_kubernetes_namespace"]


def test_tensorrt_llm_config_is_mounted_and_rolls_out_on_change() -> None:
    doc = spec_doc(backend={"name": "tensorrt-llm"})
    rendered = children(doc)
    assert "ConfigMap" in rendered
    template = rendered["Deployment"]["spec"]["template"]
    assert any(v.get("configMap", {}).get("name") == "qwen-config" for v in template["spec"]["volumes"])
    changed = children(spec_doc(backend={"name": "tensorrt-llm", "kvCacheDtype": "fp8"}))
    assert (
        changed["Deployment"]["spec"]["template"]["metadata"]["annotations"]["mmfleet.io/config-checksum"]
        != template["metadata"]["annotations"]["mmfleet.io/config-checksum"]
    )


def test_the_children_pruned_when_absent_are_named_as_rendered() -> None:
    """The reconcile deletes a ConfigMap or PodMonitor the spec stops asking for, by these names."""
    inference = MultimodalInference.model_validate(spec_doc(backend={"name": "tensorrt-llm"}))
    rendered = render.render(inference, "generic", monitoring_crds=True)
    optional = {(c["apiVersion"], c["kind"], c["metadata"]["name"]) for c in rendered} & set(
        render.optional_children(inference)
    )
    assert {kind for _, kind, _ in optional} == {"ConfigMap", "PodMonitor"}


def test_extra_args_are_appended_and_clashes_rejected() -> None:
    assert server(spec_doc(backend={"extraArgs": ["--enforce-eager"]}))["command"][-1] == "--enforce-eager"
    inference = MultimodalInference.model_validate(spec_doc(backend={"extraArgs": ["--port=9000"]}))
    with pytest.raises(render.SpecError, match=r"spec\.backend\.extraArgs\[0\]: --port=9000"):
        render.render(inference, "generic")


def test_service_links_are_off() -> None:
    assert pod(spec_doc())["enableServiceLinks"] is False


def shared_cache_doc(backend: str = "vllm") -> dict[str, Any]:
    return spec_doc(backend={"name": backend}, modelCache={"volume": "shared", "claimName": "models-rwx"})


@pytest.mark.parametrize("backend", BACKENDS)
def test_shared_cache_mounts_the_claim_and_keeps_hf_downloads_on_it(backend: str) -> None:
    spec = pod(shared_cache_doc(backend))
    container = spec["containers"][0]
    assert {"name": "shared-cache", "persistentVolumeClaim": {"claimName": "models-rwx"}} in spec["volumes"]
    assert {"name": "shared-cache", "mountPath": "/shared-cache"} in container["volumeMounts"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["HF_HOME"] == "/shared-cache/huggingface"
    # HOME and scratch stay on the replica's own disk; only the caches go on the claim.
    assert env["HOME"] == "/cache"
    assert next(v for v in spec["volumes"] if v["name"] == "cache") == {
        "name": "cache",
        "emptyDir": {"sizeLimit": "200Gi"},
    }


def test_shared_cache_holds_vllm_downloads_and_compile_cache() -> None:
    container = server(shared_cache_doc())
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["VLLM_CACHE_ROOT"] == "/shared-cache/vllm"
    command = container["command"]
    assert command[command.index("--download-dir") + 1] == "/shared-cache/models"
    # Re-owning every file of a large shared volume at each pod start would cost the cold start it saves.
    assert pod(shared_cache_doc())["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"


@pytest.mark.parametrize("volume", ["emptyDir", "ephemeral"])
def test_per_replica_cache_renders_as_before(volume: str) -> None:
    """Existing fleets see no change in their pod template, so upgrading the operator rolls nothing."""
    spec = pod(spec_doc(modelCache={"volume": volume}))
    container = spec["containers"][0]
    assert "VLLM_CACHE_ROOT" not in {e["name"] for e in container["env"]}
    assert "shared-cache" not in {v["name"] for v in spec["volumes"]}
    assert "fsGroupChangePolicy" not in spec["securityContext"]
    assert container["command"][container["command"].index("--download-dir") + 1] == "/cache/models"


def test_oci_source_mounts_the_image_read_only_as_the_model_directory() -> None:
    doc = spec_doc(model={"name": "qwen", "source": "oci://registry.example.com/models/qwen2.5-vl-7b:v1"})
    spec = pod(doc)
    volume = next(v for v in spec["volumes"] if v["name"] == "model")
    assert volume["image"] == {
        "reference": "registry.example.com/models/qwen2.5-vl-7b:v1",
        "pullPolicy": "IfNotPresent",
    }
    mount = next(m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "model")
    assert mount == {"name": "model", "mountPath": "/models/image", "readOnly": True}
    assert spec["containers"][0]["command"][:3] == ["vllm", "serve", "/models/image"]
