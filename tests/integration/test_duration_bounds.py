"""The API server refuses the durations the autoscaler cannot serve (the CRD's CEL rules), naming field, value, range.

Issue 13: ``0s``, sub-millisecond and 400-digit windows reached Prometheus, which refused them, and a
target of ``0s`` divided by zero; the CRD accepted all of them.
"""

from __future__ import annotations

import subprocess

import pytest

from mmfleet_lab.cluster import Cluster
from mmfleet_lab.cluster.kubectl import run_kubectl

pytestmark = pytest.mark.integration


def dry_run(cluster: Cluster, namespace: str, autoscaling: str) -> subprocess.CompletedProcess[str]:
    resource = (
        "apiVersion: mmfleet.io/v1alpha1\nkind: MultimodalInference\n"
        f"metadata: {{name: durations, namespace: {namespace}}}\n"
        f"spec:\n  model: {{name: m}}\n  autoscaling: {autoscaling}\n"
    )
    return run_kubectl(cluster.kubeconfig, "apply", "--dry-run=server", "-f", "-", stdin=resource)


@pytest.mark.parametrize(
    ("autoscaling", "field", "value", "accepted"),
    [
        ("{slo: {target: 0s}}", "spec.autoscaling.slo.target", "0s", "from 1ms to 1h"),
        ("{slo: {target: 0.5ms}}", "spec.autoscaling.slo.target", "0.5ms", "from 1ms to 1h"),
        ("{slo: {target: 2s, window: 0s}}", "spec.autoscaling.slo.window", "0s", "from 5s to 1h"),
        ("{slo: {target: 2s, window: 900ms}}", "spec.autoscaling.slo.window", "900ms", "from 5s to 1h"),
        ("{slo: {target: 2s, window: 99999h}}", "spec.autoscaling.slo.window", "99999h", "from 5s to 1h"),
        ("{slo: {target: 2s}, scaleDownDelay: 2h}", "spec.autoscaling.scaleDownDelay", "2h", "from 0s to 1h"),
    ],
)
def test_out_of_range_durations_are_refused_by_the_api_server(
    cluster: Cluster, crd: None, namespace: str, autoscaling: str, field: str, value: str, accepted: str
) -> None:
    result = dry_run(cluster, namespace, autoscaling)
    assert result.returncode != 0, result.stdout
    assert f"{field}: {value} is out of range" in result.stderr
    assert accepted in result.stderr


def test_four_hundred_digits_are_refused_before_any_rule_parses_them(
    cluster: Cluster, crd: None, namespace: str
) -> None:
    result = dry_run(cluster, namespace, "{slo: {target: 2s, window: " + "9" * 400 + "s}}")
    assert result.returncode != 0
    assert "spec.autoscaling.slo.window" in result.stderr
    assert "Too long" in result.stderr or "may not be more than 64" in result.stderr, result.stderr


@pytest.mark.parametrize("autoscaling", ["{slo: {target: 1ms, window: 5s}}", "{slo: {target: 1.5s, window: 1m30s}}",
                                         "{slo: {target: 1h, window: 1h}, scaleDownDelay: 0s}"])  # fmt: skip
def test_durations_within_range_are_accepted(cluster: Cluster, crd: None, namespace: str, autoscaling: str) -> None:
    result = dry_run(cluster, namespace, autoscaling)
    assert result.returncode == 0, result.stderr
