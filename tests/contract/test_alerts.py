"""The shipped alerts: valid for promtool, each unit-tested firing and not firing, on series the operator exports."""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

import yaml

from mmfleet.autoscaler.metrics import FLEET_LABELS
from tests.helpers.metrics import exported_series
from tests.helpers.repo import ROOT
from tests.helpers.tools import missing

ALERTS = ROOT / "charts" / "mmfleet" / "files" / "alerts.yaml"
ALERT_TESTS = ROOT / "tests" / "data" / "alerts_test.yaml"


def promtool() -> str:
    """Debian's prometheus package ships promtool (make system-deps installs it)."""
    found = shutil.which("promtool")
    if found is None:
        missing("promtool is not installed (apt-get install prometheus; make system-deps does)")
    return found


def run(*args: str) -> str:
    done = subprocess.run([promtool(), *args], capture_output=True, text=True, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def test_promtool_accepts_the_rules() -> None:
    assert f"SUCCESS: {len(rules())} rules found" in run("check", "rules", str(ALERTS))


def test_every_alert_passes_its_unit_tests() -> None:
    assert "SUCCESS" in run("test", "rules", str(ALERT_TESTS))


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    """Firing: some case expects it. Not firing: some case expects nothing, or a fleet in its input is not expected."""
    cases = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    for name in {rule["alert"] for rule in rules() if "alert" in rule}:
        firing = quiet = False
        for case in cases:
            inputs = " ".join(series["series"] for series in case["input_series"])
            fleets = set(re.findall(r'mmfleet_io_inference="([^"]+)"', inputs))
            for check in case.get("alert_rule_test", []):
                if check["alertname"] != name:
                    continue
                expected = check.get("exp_alerts") or []
                firing = firing or bool(expected)
                named = {alert["exp_labels"].get("mmfleet_io_inference") for alert in expected}
                quiet = quiet or not expected or bool(fleets - named)
        assert firing, f"{name}: no promtool case expects it to fire"
        assert quiet, f"{name}: no promtool case expects it to stay quiet"


def test_the_alerts_read_only_series_the_operator_exports() -> None:
    exported = exported_series()
    for rule in rules():
        for name in set(re.findall(r"\b(mmfleet_[a-z_]+)\b", rule["expr"])) - set(FLEET_LABELS):
            assert name in exported, f"{rule.get('alert') or rule.get('record')}: {name} is not exported"
