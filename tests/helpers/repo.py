"""The repository the tests read: its root, its examples, a resource around a spec, the lab's helm."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from tests.helpers.tools import missing

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"  # measurements and traces the tests read
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
VERSION = (ROOT / "VERSION").read_text().strip()  # the operator's and the lab's, written only there
K8S_VERSION = "1.34.0"  # the Kubernetes version manifests are validated against (kubernetes-validate)


def spec_doc(**spec: Any) -> dict[str, Any]:
    """A whole resource around a spec; model defaults to a small VLM."""
    spec.setdefault("model", {"name": "Qwen/Qwen2.5-VL-7B-Instruct"})
    return {
        "apiVersion": "mmfleet.io/v1alpha1",
        "kind": "MultimodalInference",
        "metadata": {"name": "qwen", "namespace": "ml", "uid": "0b9c7c4e-1111-2222-3333-444455556666"},
        "spec": spec,
    }


def load_example(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    return doc


# The chart needs a choice of where the operator may write (watchNamespaces or clusterWide); renders about something
# else install it namespaced, to one namespace.
WATCH_ONE_NAMESPACE = ("--set-json", 'watchNamespaces=["ml"]')


def helm_binary() -> Path:
    """The lab's helm (``make binaries`` builds it); missing, ``tests.helpers.tools.missing`` decides."""
    from mmfleet_lab.cluster.build import helm_path

    helm = helm_path()
    if not os.access(helm, os.X_OK):
        missing(f"helm is not built at {helm} (make binaries builds it)")
    return helm
