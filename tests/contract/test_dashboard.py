"""The shipped Grafana dashboard is the generator's, and every panel reads series that exist by name."""

from __future__ import annotations

import json
import re

from mmfleet import backends, dashboard, encode_proxy
from mmfleet.autoscaler.metrics import SIGNALS
from tests.helpers.metrics import exported_series
from tests.helpers.repo import ROOT

SHIPPED = ROOT / "charts" / "mmfleet" / "files" / "dashboards" / "mmfleet.json"


def test_the_committed_dashboard_is_the_generators_output() -> None:
    assert SHIPPED.read_text() == dashboard.dashboard_json(), "run make crds"


def test_every_panel_is_filtered_by_the_fleet_variables_or_is_about_the_operator() -> None:
    shipped = json.loads(SHIPPED.read_text())
    variables = [v["name"] for v in shipped["templating"]["list"]]
    assert variables == ["datasource", "namespace", "fleet"]
    rows = [p["title"] for p in shipped["panels"] if p["type"] == "row"]
    operator_row = rows.index("Operator")
    current = -1
    for item in shipped["panels"]:
        if item["type"] == "row":
            current += 1
            continue
        assert item["targets"], item["title"]
        for target in item["targets"]:
            filtered = "$namespace" in target["expr"] and "$fleet" in target["expr"]
            assert filtered == (current != operator_row), (item["title"], target["expr"])


def test_the_panels_read_the_backends_series_and_the_operators() -> None:
    """Names from mmfleet.backends for every backend and signal; the operator's from its own registry, the encode
    sidecar's from its module."""
    exprs = " ".join(expr for _, expr in dashboard.expressions(json.loads(SHIPPED.read_text())))
    for name in ("vllm", "tensorrt-llm"):
        names = backends.get(name).metrics
        for signal in SIGNALS:
            assert names.series(signal) in exprs, (name, signal)
        assert f"{names.e2e}_bucket" in exprs
    histograms = (encode_proxy.ENCODE_CALL, encode_proxy.FRONT_DOOR_E2E, encode_proxy.FRONT_DOOR_TTFT)
    sidecar = {f"{h}_{suffix}" for h in histograms for suffix in ("bucket", "count", "sum")}
    sidecar |= {encode_proxy.ENCODE_ITEMS, encode_proxy.ENCODE_FAILURES}
    exported = exported_series() | sidecar
    for series in set(re.findall(r"\b(mmfleet_[a-z0-9_]+)\{|\b(mmfleet_[a-z0-9_]+)\[", exprs)):
        found = next(s for s in series if s)
        assert found in exported, found


def test_the_panels_the_issue_asks_for_are_there() -> None:
    titles = {title for title, _ in dashboard.expressions(json.loads(SHIPPED.read_text()))}
    assert {
        "Replicas", "SLO percentile against its target", "SLO attainment (last hour)", "Request rate", "Queue",
        "KV-cache use", "Scale events", "Cold start", "Picker: pool saturation and held requests",
        "Picker: prefix-index hit ratio",
    } <= titles  # fmt: skip


def test_the_panels_about_the_picker_are_the_routing_rows_and_named_so() -> None:
    """tests/e2e/test_observability.py lets panels titled "Picker: " be empty (its fleet has no picker): those must be
    exactly the Routing row's, each reading picker series only."""
    shipped = json.loads(SHIPPED.read_text())
    row, in_routing = "", set()
    for item in shipped["panels"]:
        if item["type"] == "row":
            row = item["title"]
        elif row == "Routing":
            in_routing.add(item["title"])
    named = {title for title, _ in dashboard.expressions(shipped) if title.startswith("Picker: ")}
    assert in_routing == named and len(named) >= 4
    for title, expr in dashboard.expressions(shipped):
        if title in named:
            assert re.search(r"\binference_extension_", expr) and "vllm" not in expr, (title, expr)
