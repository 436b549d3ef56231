"""Any other cluster (kind, kwok, bare metal, on-prem): what ``detect`` falls back to.

GPU nodes are matched on ``nvidia.com/gpu.product`` as NVIDIA GPU feature discovery (the GPU
Operator) sets it; see ``mmfleet.clouds`` for the value format and sources. Nothing else is
assumed: no storage class (the cluster default applies), no load-balancer annotations, no
workload identity, and traces go to a plain OTLP endpoint the user gives the collector.
It owns no providerID, so it is chosen only when no cloud claims the nodes.
"""

from __future__ import annotations

from types import MappingProxyType

from mmfleet.clouds import GFD_SELECTOR, Profile

PROFILE = Profile(
    name="generic",
    gpu_selectors=(GFD_SELECTOR,),
    provider_id_pattern=None,
    exporter=MappingProxyType({"exporters": {"otlp_grpc": {"endpoint": "${env:OTLP_ENDPOINT}"}}, "extensions": {}}),
)
