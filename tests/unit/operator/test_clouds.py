"""Cloud profiles: detection, GPU node selection, identity, tolerations, LB and tracing data.

The local cluster's fake GPU nodes (``mmfleet_lab.cluster.nodes``) are checked here too: each
cloud's affinity must select them, and ``detect`` must attribute their providerIDs to that cloud.
"""

from __future__ import annotations

from typing import Any, get_args

import pytest

from mmfleet import clouds
from mmfleet.api import PROFILE_NAMES, GpuSpec, GpuType, IdentitySpec, ProfileName
from mmfleet.clouds import ack, aks, eks, generic
from mmfleet_lab.cluster.nodes import gpu_node_labels, provider_id

CLOUDS = PROFILE_NAMES
GPU_TYPES: tuple[GpuType, ...] = get_args(GpuType)

EKS_ID = "aws:///us-west-2a/i-0cd1c351f3c0d11a1"
AKS_ID = (
    "azure:///subscriptions/0000/resourceGroups/mc_rg/providers/Microsoft.Compute/"
    "virtualMachineScaleSets/aks-gpu-vmss/virtualMachines/3"
)
ACK_ID = "cn-zhangjiakou.i-8vb2y0cdlriptkfer0ir"
ACK_PREFIXED_ID = "alicloud://cn-hangzhou.i-v98dklsmnxkkgiiil7"
ROLE_ARN = "arn:aws:iam::123456789012:role/reader"
CLIENT_ID = "00000000-1111-2222-3333-444444444444"


def terms(affinity: dict[str, Any] | None) -> list[dict[str, Any]]:
    assert affinity is not None
    result: list[dict[str, Any]] = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return result


def expression(term: dict[str, Any], key: str) -> dict[str, Any] | None:
    return next((e for e in term["matchExpressions"] if e["key"] == key), None)


def values_for(affinity: dict[str, Any] | None, key: str) -> list[str]:
    found = [e["values"] for t in terms(affinity) if (e := expression(t, key))]
    assert len(found) == 1, f"{key} should appear in exactly one term"
    return list(found[0])


def selects(affinity: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """The scheduler's rule: any term whose In-expressions all hold."""
    return any(
        all(e["operator"] == "In" and labels.get(e["key"]) in e["values"] for e in t["matchExpressions"])
        for t in terms(affinity)
    )


# --- detect -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ids", "expected"),
    [
        ([EKS_ID, EKS_ID, AKS_ID], "eks"),
        ([AKS_ID, AKS_ID, ""], "aks"),
        ([ACK_ID, ACK_ID, EKS_ID], "ack"),
        ([ACK_PREFIXED_ID], "ack"),
        ([ACK_ID, ACK_PREFIXED_ID, AKS_ID, EKS_ID], "ack"),
        ([], "generic"),
        (["", ""], "generic"),
        (["kind://docker/kind/kind-worker", "kind://docker/kind/kind-worker2"], "generic"),
        (["kwok://fake-gpu-0", "gce://project/zone/vm"], "generic"),
        (["kind://docker/kind/kind-worker", EKS_ID], "eks"),
    ],
)
def test_detect(ids: list[str], expected: str) -> None:
    assert clouds.detect(ids) == expected


@pytest.mark.parametrize(
    "provider_id",
    ["cn-hangzhou", "i-8vb2y0cdlriptkfer0ir", "cn-hangzhou.192.168.0.81", "https://cn-hangzhou.i-abc", "aws:///x/i-1"],
)
def test_ack_rejects_what_is_not_region_dot_instance(provider_id: str) -> None:
    assert not ack.PROFILE.owns_provider_id(provider_id)


def test_each_provider_id_is_owned_by_one_cloud_only() -> None:
    owners = {
        pid: [p.name for p in clouds.profiles().values() if p.owns_provider_id(pid)]
        for pid in (EKS_ID, AKS_ID, ACK_ID, ACK_PREFIXED_ID)
    }
    assert owners == {EKS_ID: ["eks"], AKS_ID: ["aks"], ACK_ID: ["ack"], ACK_PREFIXED_ID: ["ack"]}


def test_generic_owns_nothing() -> None:
    assert not any(generic.PROFILE.owns_provider_id(pid) for pid in (EKS_ID, AKS_ID, ACK_ID, "kind://x", ""))


@pytest.mark.parametrize("cloud", ["eks", "aks", "ack"])
def test_fake_node_provider_ids_are_detected_as_their_cloud(cloud: ProfileName) -> None:
    ids = [provider_id(cloud, i) for i in range(3)]
    assert len(set(ids)) == 3
    assert clouds.detect(ids) == cloud


def test_fake_generic_node_has_no_provider_id() -> None:
    assert provider_id("generic", 0) == ""


# --- GPU node affinity --------------------------------------------------------------------------


def test_eks_h100_ors_karpenter_and_instance_type() -> None:
    affinity = eks.PROFILE.gpu_node_affinity(GpuSpec(type="H100"))
    assert values_for(affinity, "karpenter.k8s.aws/instance-gpu-name") == ["h100"]
    assert "p5.48xlarge" in values_for(affinity, "node.kubernetes.io/instance-type")
    assert all(len(t["matchExpressions"]) == 1 for t in terms(affinity)), "EKS terms must be ORed, not ANDed"


@pytest.mark.parametrize(
    ("gpu", "name", "instance_type"),
    [
        ("H200", "h200", "p5en.48xlarge"),
        ("A100", "a100", "p4de.24xlarge"),
        ("A10G", "a10g", "g5.xlarge"),
        ("L4", "l4", "g6.xlarge"),
        ("L40S", "l40s", "g6e.xlarge"),
        ("T4", "t4", "g4dn.xlarge"),
        ("B200", "b200", "p6-b200.48xlarge"),
    ],
)
def test_eks_gpu_families(gpu: GpuType, name: str, instance_type: str) -> None:
    affinity = eks.PROFILE.gpu_node_affinity(GpuSpec(type=gpu))
    assert values_for(affinity, "karpenter.k8s.aws/instance-gpu-name") == [name]
    assert instance_type in values_for(affinity, "node.kubernetes.io/instance-type")


def test_eks_auto_mode_node_is_selected_by_its_own_gpu_name_label() -> None:
    """An EKS Auto Mode p5 node carries eks.amazonaws.com/instance-gpu-name, and no Karpenter key."""
    auto_mode_h100 = {"eks.amazonaws.com/instance-gpu-name": "h100", "eks.amazonaws.com/compute-type": "auto"}
    assert selects(eks.PROFILE.gpu_node_affinity(GpuSpec(type="H100")), auto_mode_h100)
    assert not selects(eks.PROFILE.gpu_node_affinity(GpuSpec(type="H200")), auto_mode_h100)
    assert not selects(
        eks.PROFILE.gpu_node_affinity(GpuSpec(type="H100")), {"eks.amazonaws.com/instance-gpu-name": "l4"}
    )


def test_eks_instance_types_do_not_leak_across_gpus() -> None:
    a10g = set(values_for(eks.PROFILE.gpu_node_affinity(GpuSpec(type="A10G")), "node.kubernetes.io/instance-type"))
    l4 = set(values_for(eks.PROFILE.gpu_node_affinity(GpuSpec(type="L4")), "node.kubernetes.io/instance-type"))
    assert a10g.isdisjoint(l4)
    assert all(t.startswith("g5.") for t in a10g)


def test_aks_h100_ands_accelerator_with_vm_size() -> None:
    affinity = aks.PROFILE.gpu_node_affinity(GpuSpec(type="H100"))
    (term,) = [t for t in terms(affinity) if expression(t, "kubernetes.azure.com/accelerator")]
    assert expression(term, "kubernetes.azure.com/accelerator") == {
        "key": "kubernetes.azure.com/accelerator",
        "operator": "In",
        "values": ["nvidia"],
    }
    sizes = expression(term, "node.kubernetes.io/instance-type")
    assert sizes is not None
    assert {"Standard_ND96isr_H100_v5", "Standard_NC40ads_H100_v5"} <= set(sizes["values"])
    assert not any("A100" in s for s in sizes["values"])
    # Azure sells the ND H100 v5 only as ND96isr (InfiniBand); "ND96is" names no VM size.
    assert "Standard_ND96is_H100_v5" not in sizes["values"]


def test_aks_gpu_without_azure_vm_size_still_gets_a_valid_selector() -> None:
    affinity = aks.PROFILE.gpu_node_affinity(GpuSpec(type="L4"))
    assert all(expression(t, "node.kubernetes.io/instance-type") is None for t in terms(affinity))
    assert values_for(affinity, "nvidia.com/gpu.product") == ["NVIDIA-L4"]


def test_ack_h100_uses_nvidia_name_label() -> None:
    affinity = ack.PROFILE.gpu_node_affinity(GpuSpec(type="H100"))
    assert "NVIDIA-H100-80GB-HBM3" in values_for(affinity, "aliyun.accelerator/nvidia_name")
    assert not selects(affinity, {"aliyun.accelerator/nvidia_name": "NVIDIA-A10"})


def test_generic_h100_uses_gfd_product_label() -> None:
    affinity = generic.PROFILE.gpu_node_affinity(GpuSpec(type="H100"))
    assert len(terms(affinity)) == 1
    assert "NVIDIA-H100-80GB-HBM3" in values_for(affinity, "nvidia.com/gpu.product")
    assert selects(affinity, {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
    assert not selects(affinity, {"nvidia.com/gpu.product": "NVIDIA-H200"})


@pytest.mark.parametrize("cloud", CLOUDS)
def test_no_gpu_type_means_no_affinity(cloud: str) -> None:
    assert clouds.get(cloud).gpu_node_affinity(GpuSpec()) is None
    assert clouds.get(cloud).gpu_node_affinity(GpuSpec(count=4)) is None


@pytest.mark.parametrize("cloud", CLOUDS)
@pytest.mark.parametrize("gpu", GPU_TYPES)
def test_every_gpu_type_yields_well_formed_terms(cloud: str, gpu: GpuType) -> None:
    for term in terms(clouds.get(cloud).gpu_node_affinity(GpuSpec(type=gpu))):
        for e in term["matchExpressions"]:
            assert e["operator"] == "In"
            assert e["values"], "an empty In list is rejected by the API server"
            assert all(isinstance(v, str) and v for v in e["values"])


@pytest.mark.parametrize("cloud", CLOUDS)
@pytest.mark.parametrize("gpu", GPU_TYPES)
def test_fake_node_labels_are_selected_and_only_for_their_gpu(cloud: ProfileName, gpu: GpuType) -> None:
    labels = gpu_node_labels(cloud, gpu)
    assert selects(clouds.get(cloud).gpu_node_affinity(GpuSpec(type=gpu)), labels)
    for other in GPU_TYPES:
        if other != gpu:
            assert not selects(clouds.get(cloud).gpu_node_affinity(GpuSpec(type=other)), labels), other


def test_affinity_is_a_fresh_object_each_call() -> None:
    first = eks.PROFILE.gpu_node_affinity(GpuSpec(type="H100"))
    terms(first)[0]["matchExpressions"][0]["values"].append("mutated")
    assert "mutated" not in values_for(
        eks.PROFILE.gpu_node_affinity(GpuSpec(type="H100")), "karpenter.k8s.aws/instance-gpu-name"
    )


# --- tolerations, identity, LB, storage, tracing -------------------------------------------------

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
SKU_TOLERATION = {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("cloud", "expected"),
    [
        ("eks", [GPU_TOLERATION]),
        ("aks", [GPU_TOLERATION, SKU_TOLERATION]),
        ("ack", [GPU_TOLERATION]),
        ("generic", [GPU_TOLERATION]),
    ],
)
def test_tolerations(cloud: str, expected: list[dict[str, str]]) -> None:
    tolerations = clouds.get(cloud).gpu_tolerations()
    assert tolerations == expected
    tolerations[0]["key"] = "mutated"
    assert clouds.get(cloud).gpu_tolerations() == expected


FULL_IDENTITY = IdentitySpec(aws_role_arn=ROLE_ARN, azure_client_id=CLIENT_ID, alibaba_role_name="oss-reader")


@pytest.mark.parametrize(
    ("cloud", "annotations", "pod_labels"),
    [
        ("eks", {"eks.amazonaws.com/role-arn": ROLE_ARN}, {}),
        ("aks", {"azure.workload.identity/client-id": CLIENT_ID}, {"azure.workload.identity/use": "true"}),
        (
            "ack",
            {"pod-identity.alibabacloud.com/role-name": "oss-reader"},
            {"pod-identity.alibabacloud.com/injection": "on"},
        ),
        ("generic", {}, {}),
    ],
)
def test_identity_reads_only_its_own_field(cloud: str, annotations: dict[str, str], pod_labels: dict[str, str]) -> None:
    wiring = clouds.get(cloud).identity(FULL_IDENTITY)
    assert wiring.service_account_annotations == annotations
    assert wiring.pod_labels == pod_labels


@pytest.mark.parametrize(
    ("cloud", "others_only"),
    [
        ("eks", IdentitySpec(azure_client_id=CLIENT_ID, alibaba_role_name="r")),
        ("aks", IdentitySpec(aws_role_arn=ROLE_ARN, alibaba_role_name="r")),
        ("ack", IdentitySpec(aws_role_arn=ROLE_ARN, azure_client_id=CLIENT_ID)),
    ],
)
def test_identity_ignores_other_clouds_fields(cloud: str, others_only: IdentitySpec) -> None:
    wiring = clouds.get(cloud).identity(others_only)
    assert wiring.service_account_annotations == {}
    assert wiring.pod_labels == {}


@pytest.mark.parametrize("cloud", CLOUDS)
def test_empty_identity_is_empty(cloud: str) -> None:
    wiring = clouds.get(cloud).identity(IdentitySpec())
    assert (wiring.service_account_annotations, wiring.pod_labels) == ({}, {})


@pytest.mark.parametrize(
    ("cloud", "expected"),
    [
        (
            "eks",
            {
                "service.beta.kubernetes.io/aws-load-balancer-type": "external",
                "service.beta.kubernetes.io/aws-load-balancer-nlb-target-type": "ip",
                "service.beta.kubernetes.io/aws-load-balancer-scheme": "internal",
            },
        ),
        ("aks", {"service.beta.kubernetes.io/azure-load-balancer-internal": "true"}),
        ("ack", {"service.beta.kubernetes.io/alibaba-cloud-loadbalancer-address-type": "intranet"}),
        ("generic", {}),
    ],
)
def test_internal_lb_annotations(cloud: str, expected: dict[str, str]) -> None:
    assert dict(clouds.get(cloud).internal_lb_annotations) == expected


@pytest.mark.parametrize(
    ("cloud", "expected"),
    [("eks", "gp2"), ("aks", "managed-csi-premium"), ("ack", "alicloud-disk-topology-alltype"), ("generic", None)],
)
def test_storage_class(cloud: str, expected: str | None) -> None:
    assert clouds.get(cloud).storage_class == expected


@pytest.mark.parametrize("cloud", CLOUDS)
def test_gpu_resource_and_tracing_endpoint(cloud: str) -> None:
    profile = clouds.get(cloud)
    assert profile.gpu_resource == "nvidia.com/gpu"
    assert profile.tracing_endpoint == "http://mmfleet-otel-collector.mmfleet-system.svc:4317"


def test_eks_exporter_signs_xray_otlp_with_sigv4() -> None:
    config = eks.PROFILE.collector_exporter()
    exporter = config["exporters"]["otlp_http"]  # type: ignore[index]
    assert exporter["traces_endpoint"] == "https://xray.${env:AWS_REGION}.amazonaws.com/v1/traces"
    assert exporter["auth"] == {"authenticator": "sigv4auth"}
    assert config["extensions"] == {"sigv4auth": {"region": "${env:AWS_REGION}", "service": "xray"}}


def test_aks_exporter_is_azure_monitor() -> None:
    assert aks.PROFILE.collector_exporter() == {
        "exporters": {"azure_monitor": {"connection_string": "${env:APPLICATIONINSIGHTS_CONNECTION_STRING}"}},
        "extensions": {},
    }


def test_ack_exporter_sends_arms_token() -> None:
    otlp = ack.PROFILE.collector_exporter()["exporters"]["otlp_grpc"]  # type: ignore[index]
    assert otlp["endpoint"] == "${env:ARMS_OTLP_ENDPOINT}"
    assert otlp["headers"] == {"Authentication": "${env:ARMS_TOKEN}"}


def test_generic_exporter_is_plain_otlp() -> None:
    assert generic.PROFILE.collector_exporter() == {
        "exporters": {"otlp_grpc": {"endpoint": "${env:OTLP_ENDPOINT}"}},
        "extensions": {},
    }


@pytest.mark.parametrize("cloud", CLOUDS)
def test_exporter_config_is_a_copy(cloud: str) -> None:
    profile = clouds.get(cloud)
    config = profile.collector_exporter()
    assert set(config) == {"exporters", "extensions"}
    config["exporters"]["injected"] = {}  # type: ignore[index]
    assert "injected" not in profile.collector_exporter()["exporters"]  # type: ignore[operator]


def test_profiles_registry_has_one_profile_per_cloud_name() -> None:
    assert {name: profile.name for name, profile in clouds.profiles().items()} == {n: n for n in PROFILE_NAMES}
    assert [clouds.get(name) for name in ("eks", "aks", "ack", "generic")] == [
        eks.PROFILE,
        aks.PROFILE,
        ack.PROFILE,
        generic.PROFILE,
    ]
