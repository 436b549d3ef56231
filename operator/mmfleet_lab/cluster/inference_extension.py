"""The CustomResourceDefinitions routing mode inferencePool uses, as released, for tests that need the kinds served:
the Gateway API Inference Extension's (InferencePool, ...) and the Gateway API's (HTTPRoute, ...).

Like the Prometheus Operator's (``prometheus_operator``): the Go module proxy serves each project's module, the
Inference Extension's at the version the operator pins its endpoint picker to, and the released CRDs are files in
it. Downloading a module into the Go module cache is all it takes; nothing is built.
"""

from __future__ import annotations

from pathlib import Path

from mmfleet.routing import PICKER_VERSION
from mmfleet_lab.cluster.build import module_dir

_MODULE = "sigs.k8s.io/gateway-api-inference-extension"
INFERENCE_POOL_CRD = "inference.networking.k8s.io_inferencepools"  # its file under config/crd/bases
_GATEWAY_API_MODULE = "sigs.k8s.io/gateway-api"
GATEWAY_API_VERSION = "1.4.1"
HTTPROUTE_CRD = "gateway.networking.k8s.io_httproutes"  # its file under config/crd/standard


def inference_extension_crds() -> Path:
    """The directory of the Inference Extension's released CRD files; instant once the module is cached."""
    return module_dir(f"{_MODULE}@{PICKER_VERSION}") / "config" / "crd" / "bases"


def gateway_api_crds() -> Path:
    """The directory of the Gateway API's standard-channel CRD files (HTTPRoute v1 is GA since v1.0)."""
    return module_dir(f"{_GATEWAY_API_MODULE}@v{GATEWAY_API_VERSION}") / "config" / "crd" / "standard"
