"""The local cluster's Prometheus configuration and target files, without starting Prometheus."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from mmfleet import render
from mmfleet.validation import parse
from mmfleet_lab.cluster import prometheus
from mmfleet_lab.cluster.prometheus import Target
from tests.helpers.repo import spec_doc
from tests.helpers.tools import missing


@pytest.mark.parametrize(
    ("text", "ms"),
    [("15s", 15_000), ("2s", 2000), ("1m", 60_000), ("500ms", 500), ("1m30s", 90_000), ("1.5s", 1500)],
)
def test_scrape_intervals_are_durations(text: str, ms: int) -> None:
    assert prometheus.interval_ms(text) == ms


@pytest.mark.parametrize("text", ["", "15", "s", "0s", "1d"])
def test_bad_scrape_intervals_name_the_value(text: str) -> None:
    with pytest.raises(ValueError, match=f"scrape interval {text!r}"):
        prometheus.interval_ms(text)


def test_config_scrapes_the_file_sd_targets_at_the_interval(tmp_path: Path) -> None:
    short = prometheus.config("2s", tmp_path)
    assert short["global"] == {"scrape_interval": "2s", "scrape_timeout": "2s", "evaluation_interval": "2s"}
    job, operator = short["scrape_configs"]
    assert job["file_sd_configs"] == [{"files": [f"{tmp_path}/*.json"], "refresh_interval": "3s"}]
    # The operator's own /metrics, named and labelled as the chart's PodMonitor scrapes it.
    assert (operator["job_name"], operator["honor_labels"]) == ("mmfleet-operator", True)
    assert operator["file_sd_configs"][0]["files"] == [f"{tmp_path.with_name('operator-targets')}/*.json"]
    assert prometheus.config("1m", tmp_path)["global"]["scrape_timeout"] == "10s"  # Prometheus' default
    # Written as Prometheus parses durations: whole seconds or milliseconds, each unit once.
    assert prometheus.config("1.5s", tmp_path)["global"]["scrape_interval"] == "1500ms"
    assert prometheus.config("1m30s", tmp_path)["global"]["evaluation_interval"] == "90s"


def test_promtool_accepts_the_config(tmp_path: Path) -> None:
    if shutil.which("promtool") is None:
        missing("promtool is not installed (apt-get install prometheus; make system-deps does)")
    prometheus.prepare(tmp_path, "5s")
    prometheus.write_targets(prometheus.targets_dir(tmp_path) / "twin.json", [Target("127.0.0.1:1", "ns", "p", "f")])
    prometheus.write_operator_target(tmp_path, "127.0.0.1:2")
    checked = subprocess.run(
        ["promtool", "check", "config", str(tmp_path / "prometheus" / "prometheus.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert yaml.safe_load((tmp_path / "prometheus" / "prometheus.yml").read_text())["global"]["scrape_interval"] == "5s"


def test_a_target_carries_the_labels_of_the_podmonitor_relabelling(tmp_path: Path) -> None:
    path = tmp_path / "twin.json"
    prometheus.write_targets(path, [Target("127.0.0.1:8080", "ml", "qwen-abc", "qwen")])
    assert json.loads(path.read_text()) == [
        {
            "targets": ["127.0.0.1:8080"],
            "labels": {
                "__metrics_path__": "/pods/ml/qwen-abc/metrics",
                "namespace": "ml",
                "pod": "qwen-abc",
                "mmfleet_io_inference": "qwen",
            },
        }
    ]
    prometheus.write_targets(path, [])
    assert json.loads(path.read_text()) == []
    assert [p.name for p in tmp_path.iterdir()] == ["twin.json"]  # the temporary file was renamed over it


def test_the_target_labels_are_the_ones_the_rendered_podmonitor_relabels_to() -> None:
    inference = parse(spec_doc())
    endpoint = render.build_pod_monitor(inference)["spec"]["podMetricsEndpoints"][0]
    relabelled = {r["targetLabel"] for r in endpoint["relabelings"]}
    (group,) = prometheus.target_groups([Target("127.0.0.1:1", "ml", "qwen-abc", "qwen")])
    assert set(group["labels"]) - {"__metrics_path__"} == relabelled
