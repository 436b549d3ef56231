"""Azure AKS.

AKS labels every GPU node ``kubernetes.azure.com/accelerator: nvidia`` but not with the GPU
model, so the model comes from the VM size in ``node.kubernetes.io/instance-type``; both are ANDed
in one term. A second term matches ``nvidia.com/gpu.product`` for pools running the GPU Operator,
and is the only match for GPUs Azure sells no VM size for (A10G, L4, L40S, H20, GH200, B200).

Sources:

- ``kubernetes.azure.com/accelerator=nvidia``: MicrosoftDocs/azure-aks-docs ``articles/aks/use-labels.md``.
- VM sizes: a VM-size table transcribed from Microsoft Learn (a public pricing tool's
  ``INSTANCES`` list), cross-checked by name in independent AKS/Azure ML scripts for
  NC24ads_A100_v4, NC96ads_A100_v4, ND96asr_v4, ND96amsr_A100_v4, NC40ads_H100_v5,
  NC80adis_H100_v5, ND96isr_H100_v5, ND96isr_H200_v5, NC4as_T4_v3, NC8as_T4_v3, NV72ads_A10_v5.
  The rest (NC48ads_A100_v4, NC16as/NC64as_T4_v3, NV36ads/NV36adms_A10_v5) rest on that one list.
  The ND H100 v5 series has one size, ``Standard_ND96isr_H100_v5`` (Microsoft Learn, "ND-H100-v5 size
  series", https://learn.microsoft.com/azure/virtual-machines/sizes/gpu-accelerated/ndh100v5-series);
  ``Standard_ND96is_H100_v5``, which the list also carried, is no Azure VM size and was dropped.
  The partitioned NV6/12/18ads_A10_v5 sizes hold a GPU fraction and are left out;
  whether AKS's device plugin serves the NVadsA10 v5 sizes at all is UNCONFIRMED.
- Taint ``sku=gpu:NoSchedule``: the AKS GPU guide's ``az aks nodepool add --node-taints`` example;
  AKS does not add it by itself, but tolerating it costs nothing.
- Internal LB: ``service.beta.kubernetes.io/azure-load-balancer-internal: "true"`` (cloud-provider-azure).
- Storage: ``managed-csi-premium`` (Premium SSD, Azure Disk CSI) is a built-in AKS StorageClass.
- Workload identity: SA annotation ``azure.workload.identity/client-id``; the webhook mutates only
  pods labelled ``azure.workload.identity/use: "true"`` (Azure/azure-workload-identity docs).
- Tracing: contrib ``azure_monitor`` exporter (``azuremonitor`` is its deprecated alias), key
  ``connection_string`` (``exporter/azuremonitorexporter/config.go`` and ``metadata.yaml`` v0.161.0),
  read from the environment variable the collector's Secret sets.
- providerID ``azure:///subscriptions/<sub>/resourceGroups/<rg>/providers/Microsoft.Compute/...``
  (cloud-provider-azure).
"""

from __future__ import annotations

from types import MappingProxyType

from mmfleet.clouds import GFD_SELECTOR, GpuSelector, IdentityRule, Profile

VM_SIZE = GpuSelector(
    key="node.kubernetes.io/instance-type",
    fixed=MappingProxyType({"kubernetes.azure.com/accelerator": "nvidia"}),
    values={
        "T4": ("Standard_NC4as_T4_v3", "Standard_NC8as_T4_v3", "Standard_NC16as_T4_v3", "Standard_NC64as_T4_v3"),
        "A10": ("Standard_NV36ads_A10_v5", "Standard_NV36adms_A10_v5", "Standard_NV72ads_A10_v5"),
        "A100": (
            "Standard_NC24ads_A100_v4",
            "Standard_NC48ads_A100_v4",
            "Standard_NC96ads_A100_v4",
            "Standard_ND96asr_v4",
            "Standard_ND96amsr_A100_v4",
        ),
        "H100": (
            "Standard_ND96isr_H100_v5",
            "Standard_NC40ads_H100_v5",
            "Standard_NC80adis_H100_v5",
        ),
        "H200": ("Standard_ND96isr_H200_v5",),
    },
)

PROFILE = Profile(
    name="aks",
    gpu_selectors=(VM_SIZE, GFD_SELECTOR),
    provider_id_pattern=r"azure://.*",
    storage_class="managed-csi-premium",
    internal_lb_annotations=MappingProxyType({"service.beta.kubernetes.io/azure-load-balancer-internal": "true"}),
    extra_tolerations=(MappingProxyType({"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}),),
    identity_rule=IdentityRule(
        value=lambda identity: identity.azure_client_id,
        service_account_annotation="azure.workload.identity/client-id",
        pod_labels=MappingProxyType({"azure.workload.identity/use": "true"}),
    ),
    exporter=MappingProxyType(
        {
            "exporters": {"azure_monitor": {"connection_string": "${env:APPLICATIONINSIGHTS_CONNECTION_STRING}"}},
            "extensions": {},
        }
    ),
)
