"""The kustomize base and overlays and the chart, as kubectl builds them."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from mmfleet_lab.cluster.build import binaries_at, cache_root
from tests.helpers.repo import ROOT
from tests.helpers.tools import missing

BASE = ROOT / "manifests/base"
OVERLAYS = ["eks", "aks", "ack"]
CHART = ROOT / "charts/mmfleet"


def kubectl() -> str:
    """The kubectl `make binaries` builds (make test builds it first); the fast tier skips without one."""
    cached = binaries_at(cache_root()).kubectl
    if cached.exists():
        return str(cached)
    found = shutil.which("kubectl")
    if found is None:
        missing(f"no kubectl: neither {cached} (make binaries) nor one on PATH")
    return found


def kustomize(path: Path) -> list[Obj]:
    result = subprocess.run(
        [kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, f"kubectl kustomize {path} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def is_collector(obj: Obj) -> bool:
    """The OpenTelemetry Collector's objects (tests/contract/test_collector_manifests.py checks them)."""
    return bool(obj["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "otel-collector")


def strip_template(text: str) -> str:
    """The literal YAML of a template: drop whole-line actions, blank out inline ones.

    Good enough for the templates here, whose compared parts are literal YAML with no
    conditionals around them; it is not a template engine.
    """
    lines = [line for line in text.splitlines() if not re.fullmatch(r"\s*\{\{.*\}\}\s*", line)]
    return re.sub(r"\{\{.*?\}\}", "TEMPLATED", "\n".join(lines))


Obj = dict[str, Any]
