"""The chart's monitoring objects (helm template): off by default; on, they ship the tested files, find the operator."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import yaml

from mmfleet.config import OperatorConfig
from tests.helpers.repo import ROOT, WATCH_ONE_NAMESPACE, helm_binary

CHART = ROOT / "charts" / "mmfleet"
ALL_ON = (
    "--set", "monitoring.podMonitor.enabled=true", "--set", "monitoring.podMonitor.labels.release=kp",
    "--set", "monitoring.dashboards.enabled=true",
    "--set", "monitoring.alerts.enabled=true", "--set", "monitoring.alerts.labels.role=alert-rules",
)  # fmt: skip


def render(*args: str) -> list[dict[str, Any]]:
    command = [str(helm_binary()), "template", "t", str(CHART), "--namespace", "mmfleet-system", *WATCH_ONE_NAMESPACE]
    command += args
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].startswith("t-mmfleet")]
    assert len(found) == 1, [d["kind"] for d in docs]
    return found[0]


def test_nothing_is_installed_for_monitoring_by_default() -> None:
    kinds = {d["kind"] for d in render()}
    assert not kinds & {"PodMonitor", "PrometheusRule"}
    assert not [d for d in render() if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboards")]


def test_the_pod_monitor_scrapes_the_operators_metrics_on_its_probe_port() -> None:
    docs = render(*ALL_ON)
    monitor, deployment = one(docs, "PodMonitor"), one(docs, "Deployment")
    pod = deployment["spec"]["template"]
    assert monitor["metadata"]["labels"]["release"] == "kp"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["mmfleet-system"]}
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    container = pod["spec"]["containers"][0]
    port = next(p for p in container["ports"] if p["name"] == endpoint["port"])
    assert port["containerPort"] == int(OperatorConfig().metrics_address.rsplit(":", 1)[1])
    assert endpoint["path"] == "/metrics"
    assert endpoint["honorLabels"] is True  # the fleets' namespace label, not the operator pod's
    job = {r["targetLabel"]: r["replacement"] for r in endpoint["relabelings"]}["job"]
    rules = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
    operator_down = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "MmfleetOperatorDown")
    assert f'job="{job}"' in operator_down["expr"]


def test_the_dashboards_and_alerts_are_the_tested_files() -> None:
    docs = render(*ALL_ON)
    dashboards = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "t-mmfleet-dashboards")
    assert dashboards["metadata"]["labels"]["grafana_dashboard"] == "1"  # the values' default
    shipped = {p.name: json.loads(p.read_text()) for p in (CHART / "files" / "dashboards").glob("*.json")}
    assert {name: json.loads(text) for name, text in dashboards["data"].items()} == shipped
    rule = one(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["role"] == "alert-rules"
    assert rule["spec"] == yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
