"""Alibaba Cloud ACK.

ACK labels GPU nodes ``aliyun.accelerator/nvidia_name`` with the NVML device name, spaces turned
to dashes: the same strings as GPU feature discovery's ``nvidia.com/gpu.product``, so both terms
share ``NVIDIA_PRODUCTS``.

Sources:

- ``aliyun.accelerator/nvidia_name``: ACK's GPU cluster guide shows
  ``aliyun.accelerator/nvidia_name=Tesla-P100-PCIE-16GB`` with ``nvidia.com/gpu`` allocatable; a
  real ACK gn7i node shows ``aliyun.accelerator/nvidia_name=NVIDIA-A10``; Fluid's ACK samples use
  ``Tesla-V100-SXM2-16GB``; AliyunContainerService's gpushare code reads the same key. The values for
  Hopper/Blackwell parts (e.g. NVIDIA-H20, NVIDIA-H100-80GB-HBM3) are UNCONFIRMED on ACK and assumed
  to follow the same NVML naming.
- Exclusive GPUs: ``nvidia.com/gpu``; exclusive scheduling is the default mode (label
  ``ack.node.gpu.schedule: default`` or none), nothing else is needed (ACK "Enable scheduling
  features", doc-detail/191140). Shared modes use other resources and are out of scope.
- Taints: ACK adds none to GPU nodes by itself; its taint guide tells users to add their own, so
  only the common ``nvidia.com/gpu`` taint is tolerated.
- Internal LB: ``service.beta.kubernetes.io/alibaba-cloud-loadbalancer-address-type: intranet``
  (ACK CCM docs; Kubernetes Service docs' Alibaba tab).
- Storage: ``alicloud-disk-topology-alltype``, a default ACK StorageClass "recommended for
  multi-zone scenarios": it tries ESSD, then SSD, then ultra disk, and binds WaitForFirstConsumer,
  so the disk lands in the GPU pod's zone. ``alicloud-disk-essd`` also exists but fails on
  instance families without ESSD support and, per the older ACK storage docs, binds Immediately.
- RRSA: ack-pod-identity-webhook component overview (Mar 2026,
  https://www.alibabacloud.com/help/en/container-service-for-kubernetes/latest/ack-pod-identity-webhook):
  SA annotation ``pod-identity.alibabacloud.com/role-name``; "Namespace configuration": the label
  ``pod-identity.alibabacloud.com/injection`` "Set to on to enable automatic configuration injection for all
  pods in the namespace". That namespace label is the documented switch, and docs/clouds.md tells the user
  to set it (the operator never labels namespaces). The page says a pod level exists too, but no copy we could
  read shows its key, so the same label on the pod, kept because it costs nothing, is UNCONFIRMED alone.
- Tracing: ARMS (Managed Service for OpenTelemetry) gRPC endpoint
  ``http://tracing-analysis-dc-<region>[-internal].aliyuncs.com:8090`` with header
  ``Authentication: <token>`` and ``tls.insecure: true`` (help.aliyun.com/document_detail/407604.html),
  through the ``otlp_grpc`` exporter (``otlp`` is its deprecated alias, collector v0.161.0).
- SLS, the alternative: contrib ``alibabacloud_logservice`` exporter, keys ``endpoint``, ``project``,
  ``logstore``, ``access_key_id``, ``access_key_secret`` (``exporter/alibabacloudlogserviceexporter/config.go``
  v0.161.0); the keys come from the collector's Secret through the environment.
- providerID ``<region-id>.<instance-id>`` with no scheme (e.g. ``cn-zhangjiakou.i-8vb2y0cdlriptkfer0ir``),
  or with an ``alicloud://`` prefix (kubernetes/cloud-provider-alibaba-cloud ``NodeFromProviderID``).
"""

from __future__ import annotations

from types import MappingProxyType

from mmfleet.clouds import GFD_SELECTOR, NVIDIA_PRODUCTS, GpuSelector, IdentityRule, Profile

NVIDIA_NAME = GpuSelector(key="aliyun.accelerator/nvidia_name", values=NVIDIA_PRODUCTS)

PROFILE = Profile(
    name="ack",
    gpu_selectors=(NVIDIA_NAME, GFD_SELECTOR),
    provider_id_pattern=r"(alicloud://)?[a-z]{2}(-[a-z0-9]+)+\.i-[a-z0-9]+",
    storage_class="alicloud-disk-topology-alltype",
    internal_lb_annotations=MappingProxyType(
        {"service.beta.kubernetes.io/alibaba-cloud-loadbalancer-address-type": "intranet"}
    ),
    identity_rule=IdentityRule(
        value=lambda identity: identity.alibaba_role_name,
        service_account_annotation="pod-identity.alibabacloud.com/role-name",
        pod_labels=MappingProxyType({"pod-identity.alibabacloud.com/injection": "on"}),
    ),
    exporter=MappingProxyType(
        {
            "exporters": {
                "otlp_grpc": {
                    "endpoint": "${env:ARMS_OTLP_ENDPOINT}",
                    "tls": {"insecure": True},
                    "headers": {"Authentication": "${env:ARMS_TOKEN}"},
                }
            },
            "extensions": {},
        }
    ),
)

# The SLS alternative (mmfleet collector-config --cloud ack --ack-backend sls): project, logstore and endpoint
# are filled in from the settings; the access key pair only ever comes from the Secret's environment variables.
SLS_EXPORTER = MappingProxyType(
    {
        "exporters": {
            "alibabacloud_logservice": {
                "endpoint": "${env:SLS_ENDPOINT}",
                "project": "${env:SLS_PROJECT}",
                "logstore": "${env:SLS_LOGSTORE}",
                "access_key_id": "${env:SLS_ACCESS_KEY_ID}",
                "access_key_secret": "${env:SLS_ACCESS_KEY_SECRET}",
            }
        },
        "extensions": {},
    }
)
