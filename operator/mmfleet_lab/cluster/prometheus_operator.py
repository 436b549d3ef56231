"""The Prometheus Operator's CustomResourceDefinitions, as released, for tests that need its kinds served.

No release download is reachable here, but the Go module proxy serves the project's root module, whose
``example/prometheus-operator-crd`` holds the released CRDs (PodMonitor, PrometheusRule, ...). Downloading the
module (4 MB, into the Go module cache) is all it takes; nothing is built.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from mmfleet_lab.cluster.build import BuildError

PROMETHEUS_OPERATOR_VERSION = "0.85.0"  # the newest the Go module proxy serves (go list -m ...@latest, 2026-12)
_MODULE = "github.com/prometheus-operator/prometheus-operator"


def prometheus_operator_crds() -> Path:
    """The directory of the released CRD files (``monitoring.coreos.com_podmonitors.yaml``, ...); instant if cached."""
    go = shutil.which("go")
    if go is None:
        raise BuildError("the 'go' command is needed to download the Prometheus Operator's CRDs and is not on PATH")
    target = f"{_MODULE}@v{PROMETHEUS_OPERATOR_VERSION}"
    done = subprocess.run(
        [go, "mod", "download", "-json", target],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"},
    )
    if done.returncode != 0:
        raise BuildError(f"'go mod download {target}' failed (exit {done.returncode}): {done.stdout}{done.stderr}")
    return Path(json.loads(done.stdout)["Dir"]) / "example" / "prometheus-operator-crd"
