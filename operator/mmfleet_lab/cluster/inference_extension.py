"""The Gateway API Inference Extension's CustomResourceDefinitions (InferencePool, ...), as released, for tests that
need the kinds served.

Like the Prometheus Operator's (``prometheus_operator``): the Go module proxy serves the project's module at the
version the operator pins its endpoint picker to, and its ``config/crd/bases`` holds the released CRDs. Downloading
the module into the Go module cache is all it takes; nothing is built.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from mmfleet.routing import PICKER_VERSION
from mmfleet_lab.cluster.build import BuildError

_MODULE = "sigs.k8s.io/gateway-api-inference-extension"
INFERENCE_POOL_CRD = "inference.networking.k8s.io_inferencepools"  # its file under config/crd/bases


def inference_extension_crds() -> Path:
    """The directory of the released CRD files; instant once the module is in the Go module cache."""
    go = shutil.which("go")
    if go is None:
        raise BuildError("the 'go' command is needed to download the Inference Extension's CRDs and is not on PATH")
    target = f"{_MODULE}@{PICKER_VERSION}"
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
    return Path(json.loads(done.stdout)["Dir"]) / "config" / "crd" / "bases"
