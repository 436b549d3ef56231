"""The Prometheus Operator's CustomResourceDefinitions, as released, for tests that need its kinds served.

No release download is reachable here, but the Go module proxy serves the project's root module, whose
``example/prometheus-operator-crd`` holds the released CRDs (PodMonitor, PrometheusRule, ...). Downloading the
module (4 MB, into the Go module cache) is all it takes; nothing is built.
"""

from __future__ import annotations

from pathlib import Path

from mmfleet_lab.cluster.build import module_dir

PROMETHEUS_OPERATOR_VERSION = "0.85.0"  # the newest the Go module proxy serves (go list -m ...@latest, 2026-12)
_MODULE = "github.com/prometheus-operator/prometheus-operator"


def prometheus_operator_crds() -> Path:
    """The directory of the released CRD files (``monitoring.coreos.com_podmonitors.yaml``, ...); instant if cached."""
    return module_dir(f"{_MODULE}@v{PROMETHEUS_OPERATOR_VERSION}") / "example" / "prometheus-operator-crd"
