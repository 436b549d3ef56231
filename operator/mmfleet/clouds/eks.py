"""Amazon EKS.

GPU nodes are matched three ways, ORed, because a cluster may mix provisioners: Karpenter's
``karpenter.k8s.aws/instance-gpu-name`` (only on self-managed Karpenter nodes), EKS Auto Mode's
``eks.amazonaws.com/instance-gpu-name`` (only on Auto Mode nodes, same lower-case values) and the
well-known ``node.kubernetes.io/instance-type`` (every node, including managed node groups). A fourth
term matches GPU feature discovery's ``nvidia.com/gpu.product`` for clusters running the GPU Operator.

Sources:

- GPU names and instance types: aws/karpenter-provider-aws
  ``website/content/en/docs/reference/instance-types.md`` @0c5e7d81 (generated from EC2):
  g4dn.* t4, g5.* a10g, g6.* and gr6.* l4, g6e.* l40s, p4d/p4de.24xlarge a100, p5.4xlarge and
  p5.48xlarge h100, p5e/p5en.48xlarge h200, p6-b200.48xlarge b200. g6f/gr6f (fractional L4) are
  left out: they expose no ``nvidia.com/gpu``. p5.4xlarge shows gpu-count 0 there (Karpenter will
  not pick it for a GPU request) but carries one H100, so a managed node group of it still matches.
  AWS offers no A10, H20 or GH200 instance; those types match only through the GFD term.
- EKS Auto Mode: the Amazon EKS User Guide, "Create a Node Pool for EKS Auto Mode"
  (https://docs.aws.amazon.com/eks/latest/userguide/create-node-pool.html), table "EKS Auto Mode Supported
  Labels": ``eks.amazonaws.com/instance-gpu-name``, example ``t4``, "Name of the GPU on the instance, if
  available"; the ``karpenter.k8s.aws/*`` keys are not among them. Auto Mode runs Karpenter underneath, so
  the names are Karpenter's; AWS's own Auto Mode GPU sample selects ``h200``, ``l4``, ``a100``, ``b200``.
- Internal NLB: kubernetes-sigs/aws-load-balancer-controller ``docs/guide/service/nlb.md``:
  ``aws-load-balancer-type: external`` hands the Service to the controller (the in-tree one
  ignores it), ``aws-load-balancer-nlb-target-type: ip`` targets pods (VPC CNI), and
  ``aws-load-balancer-scheme: internal`` (annotations reference; also the default since v2.2).
- Storage: EKS creates the ``gp2`` StorageClass; since 1.30 it is no longer marked default, and
  AWS says to reference it by name (EKS 1.30 release notes). ``gp3`` is not created.
- IRSA: ServiceAccount annotation ``eks.amazonaws.com/role-arn`` (aws/amazon-eks-pod-identity-webhook).
- Tracing: CloudWatch OTLP traces endpoint ``https://xray.<region>.amazonaws.com/v1/traces``
  (needs Transaction Search) through the ``otlp_http`` exporter (``otlphttp`` before collector
  v0.15x; ``exporter/otlphttpexporter/metadata.yaml`` v0.161.0 keeps it as a deprecated alias) with
  the collector's ``sigv4auth`` extension, keys ``region`` and ``service`` (opentelemetry-collector-contrib
  ``extension/sigv4authextension/config.go`` v0.159.0); ``service: xray`` as in
  kyma-project/telemetry-manager's CloudWatch example. No key in the config: the extension takes
  the AWS SDK's default chain, so IRSA's web identity token or EKS Pod Identity's agent.
- providerID ``aws:///<az>/<instance-id>``.
"""

from __future__ import annotations

from types import MappingProxyType

from mmfleet.clouds import GFD_SELECTOR, GpuSelector, IdentityRule, Profile

_SIZES_8 = ("xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge", "48xlarge")

KARPENTER_GPU_NAME = GpuSelector(
    key="karpenter.k8s.aws/instance-gpu-name",
    values={
        "T4": ("t4",),
        "A10G": ("a10g",),
        "L4": ("l4",),
        "L40S": ("l40s",),
        "A100": ("a100",),
        "H100": ("h100",),
        "H200": ("h200",),
        "B200": ("b200",),
    },
)

# EKS Auto Mode names the GPU like Karpenter, under its own key (module docstring).
AUTO_MODE_GPU_NAME = GpuSelector(key="eks.amazonaws.com/instance-gpu-name", values=KARPENTER_GPU_NAME.values)

INSTANCE_TYPE = GpuSelector(
    key="node.kubernetes.io/instance-type",
    values={
        "T4": tuple(f"g4dn.{s}" for s in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "metal")),
        "A10G": tuple(f"g5.{s}" for s in _SIZES_8),
        "L4": (*(f"g6.{s}" for s in _SIZES_8), "gr6.4xlarge", "gr6.8xlarge"),
        "L40S": tuple(f"g6e.{s}" for s in _SIZES_8),
        "A100": ("p4d.24xlarge", "p4de.24xlarge"),
        "H100": ("p5.48xlarge", "p5.4xlarge"),
        "H200": ("p5e.48xlarge", "p5en.48xlarge"),
        "B200": ("p6-b200.48xlarge",),
    },
)

PROFILE = Profile(
    name="eks",
    gpu_selectors=(KARPENTER_GPU_NAME, AUTO_MODE_GPU_NAME, INSTANCE_TYPE, GFD_SELECTOR),
    provider_id_pattern=r"aws://.*",
    storage_class="gp2",
    internal_lb_annotations=MappingProxyType(
        {
            "service.beta.kubernetes.io/aws-load-balancer-type": "external",
            "service.beta.kubernetes.io/aws-load-balancer-nlb-target-type": "ip",
            "service.beta.kubernetes.io/aws-load-balancer-scheme": "internal",
        }
    ),
    identity_rule=IdentityRule(
        value=lambda identity: identity.aws_role_arn,
        service_account_annotation="eks.amazonaws.com/role-arn",
    ),
    exporter=MappingProxyType(
        {
            "exporters": {
                "otlp_http": {
                    "traces_endpoint": "https://xray.${env:AWS_REGION}.amazonaws.com/v1/traces",
                    "auth": {"authenticator": "sigv4auth"},
                }
            },
            "extensions": {"sigv4auth": {"region": "${env:AWS_REGION}", "service": "xray"}},
        }
    ),
)
