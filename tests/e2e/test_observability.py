"""Every dashboard panel's PromQL, and every alert's, against the local cluster's Prometheus while the twin serves.

Real parts throughout: kube-apiserver, scheduler and kwok GPU nodes; the operator as users run it
(``mmfleet run``), serving kopf's /healthz and its own /metrics, which the lab's Prometheus scrapes
as the ``mmfleet-operator`` job (as the chart's PodMonitor does); and the twin serving the fleet's
pods with vLLM's metrics under steady traffic. A panel whose query errors, or returns nothing while
the twin serves, fails the test; so does an alert or recording rule that Prometheus refuses. The Routing row's
panels read a fleet's endpoint picker, which this fleet (mode service) has not: Prometheus must accept their
queries, and test_routing_requests checks that the real picker exports every series they name.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from mmfleet import dashboard
from mmfleet_lab.cluster import Cluster, NodePool, down, process, prometheus, up
from mmfleet_lab.cluster.crds import install_mmfleet_crd
from mmfleet_lab.cluster.kubectl import apply_ready
from mmfleet_lab.spike import Twin
from tests.helpers.operator_process import OperatorProcess
from tests.helpers.repo import ROOT
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.e2e

CLUSTER = f"mmfleet-obs-{os.getpid()}"
NAMESPACE = "obs"
NAME = "qwen-vl"
RATE = 4.0  # req/s, steady: one replica, its P90 at times over 3 s (tests/helpers/spike.py); panels need only answer
# The Routing row: data only from a fleet in routing mode inferencePool; the Encode tier row, with an encode tier.
PICKER_PANELS = ("Picker: ", "Encode tier: ")
SETTLE = 240.0  # s for every panel to have an answer: series over the rate window, the SLO window, two scrapes
RESOURCE = {
    "apiVersion": "mmfleet.io/v1alpha1",
    "kind": "MultimodalInference",
    "metadata": {"name": NAME, "namespace": NAMESPACE},
    "spec": {
        "model": {"name": "Qwen/Qwen2.5-VL-7B-Instruct", "servedName": NAME},
        "gpu": {"count": 1, "type": "H100"},
        "cloud": "eks",
        "autoscaling": {
            "minReplicas": 1,
            "maxReplicas": 4,
            "slo": {"metric": "e2e", "percentile": 90, "target": "3s", "window": "20s"},
        },
    },
}


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    running = up(
        CLUSTER, pod_ready_delay="5s", nodes=(NodePool(cloud="eks", gpu_type="H100", count=2),),
        scrape_interval="2s", progress=_say,
    )  # fmt: skip
    yield running
    down(CLUSTER, progress=_say)


@pytest.fixture(scope="module")
def operator(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    """``mmfleet run`` serving /healthz and /metrics (each on its port), the latter the lab Prometheus' target."""
    install_mmfleet_crd(cluster.api_client(), "mmfleet-tests")
    address, metrics = (f"127.0.0.1:{process.free_port()}" for _ in range(2))
    env = {"MMFLEET_PROMETHEUS_URL": cluster.prometheus_url, "MMFLEET_AUTOSCALE_INTERVAL": "3s"}
    log = tmp_path_factory.mktemp("observability") / "operator.log"
    running = OperatorProcess(cluster.kubeconfig, log, env=env, health_address=address, metrics_address=metrics)
    running.start()
    prometheus.write_operator_target(cluster.state_dir, metrics)
    yield running
    running.stop()


def query(cluster: Cluster, promql: str) -> tuple[str, list[Any]]:
    """Prometheus' instant answer: ("success", result) or (the error, [])."""
    url = f"{cluster.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            answer = json.load(response)
    except urllib.error.HTTPError as refused:
        answer = json.load(refused)
    if answer.get("status") != "success":
        return f"{answer.get('errorType')}: {answer.get('error')}", []
    return "success", answer["data"]["result"]


def panel_queries() -> list[tuple[str, str]]:
    """Every target of the shipped dashboard, with its variables set to the test's fleet."""
    shipped = json.loads((ROOT / "charts" / "mmfleet" / "files" / "dashboards" / "mmfleet.json").read_text())
    return [
        (title, expr.replace("$namespace", NAMESPACE).replace("$fleet", NAME))
        for title, expr in dashboard.expressions(shipped)
    ]


def rule_queries() -> list[tuple[str, str]]:
    groups = yaml.safe_load((ROOT / "charts" / "mmfleet" / "files" / "alerts.yaml").read_text())["groups"]
    return [(rule.get("alert") or rule["record"], rule["expr"]) for group in groups for rule in group["rules"]]


def test_every_panel_answers_and_every_rule_evaluates_while_the_twin_serves(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    apply_ready(cluster.kubeconfig, RESOURCE)
    health = process.http_get(f"http://{operator.health_address}/healthz")
    assert "autoscaler" in json.loads(health), health  # the operator's probe handlers, through kopf's endpoint
    twin = Twin(cluster, RATE, (), tmp_path / "twin.log", ROOT / "tests" / "data")
    panels = panel_queries()
    try:
        up_query = f'up{{job="{prometheus.OPERATOR_JOB}"}} == 1'
        wait_for(lambda: query(cluster, up_query)[1], 60, "Prometheus scraping the operator", interval=2)

        def unanswered() -> list[tuple[str, str, str]]:
            found = [(title, expr, *query(cluster, expr)) for title, expr in panels]
            return [
                (title, expr, status)
                for title, expr, status, result in found
                if status != "success" or not (result or title.startswith(PICKER_PANELS))
            ]

        missing: list[tuple[str, str, str]] = []

        def answered() -> bool:
            nonlocal missing
            missing = unanswered()
            return not missing

        wait_for(
            answered,
            SETTLE,
            lambda: (
                f"every panel to answer (operator log: {operator.tail(20)}): "
                + "\n".join(f"{title}: {status}: {expr}" for title, expr, status in missing)
            ),
            interval=5,
        )
        refused = [(name, status) for name, expr in rule_queries() if (status := query(cluster, expr)[0]) != "success"]
        assert not refused, refused
    finally:
        twin.stop()
