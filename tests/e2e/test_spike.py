"""The closed loop on the local control plane: a spike is met, released, and silence is held through.

Everything is real except the GPUs and the inference servers: kube-apiserver, controller-manager,
scheduler and kwok nodes whose pod-ready delay stands for the cold start; Debian's Prometheus
scraping the twin (``mmfleet twin serve``), which serves the fleet's Ready pods with the calibrated
replica model and exports vLLM's metrics; and the operator as users run it (``mmfleet run``).

Timeline, in seconds after the twin starts: base load 0-100 (the operator reads a fleet's series
once they cover the 1m rate window, then learns its capacity), x5 from 100 to 190, Prometheus
stopped from 205 to 225 (and a minute of warm-up again after it), the scale-down after the spike
(scaleDownDelay 45 s, which being set holds no peak of a demand that swings within a minute), done at 420.
A failing run says what the autoscaler decided meanwhile, and why (its events).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from mmfleet.api.patterns import seconds
from mmfleet_lab.cluster import Cluster, start_prometheus, stop_prometheus
from mmfleet_lab.cluster.kubectl import apply_ready
from mmfleet_lab.spike import Sample, Twin, follow, line, plot
from mmfleet_lab.twin.serve import Spike
from tests.helpers.repo import ROOT
from tests.helpers.spike import BASE_RATE, CLUSTER, SLO, say

# A module cluster started, then 420 s of traffic after the series' warm-up: past the default per-test timeout.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

NAMESPACE = "e2e"
NAME = "qwen-vl"
SPIKE = Spike(start=100.0, end=190.0, factor=5.0)
OUTAGE = (205.0, 225.0)
END = 420.0
TARGET = seconds(str(SLO["target"]))
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
            "maxReplicas": 8,
            "scaleDownDelay": "45s",
            "slo": SLO,
        },
    },
}


def run_spike(cluster: Cluster, tmp_path: Path) -> tuple[list[Sample], Sample]:
    """The samples, and the one at which Prometheus was stopped (the stop waits for it to exit, so the outage
    starts then, however late on a busy machine)."""
    apply_ready(cluster.kubeconfig, RESOURCE)
    twin = Twin(cluster, BASE_RATE, (SPIKE,), tmp_path / "twin.log", ROOT / "tests" / "data")
    samples: list[Sample] = []
    stopped: Sample | None = None
    restarted = False
    try:
        for sample in follow(cluster, NAMESPACE, NAME, twin.started, interval=1.0):
            samples.append(sample)
            say(line(sample, (SPIKE,)) + "".join(f"\n  event: {e}" for e in sample.events))
            if stopped is None and sample.t >= OUTAGE[0]:
                stop_prometheus(CLUSTER)
                stopped = sample
            if stopped is not None and not restarted and sample.t >= OUTAGE[1]:
                start_prometheus(CLUSTER)
                restarted = True
            if sample.t >= END:
                break
    finally:
        twin.stop()
        plot(samples, (SPIKE,), "e2e: a x5 spike", tmp_path / "spike.png")
    assert stopped is not None, "the run ended before the outage"
    return samples, stopped


def test_a_spike_is_met_then_released_and_silence_holds(cluster: Cluster, operator: Any, tmp_path: Path) -> None:
    samples, stopped = run_spike(cluster, tmp_path)
    spike = [s for s in samples if SPIKE.start <= s.t < SPIKE.end]
    before = [s for s in samples if s.t < SPIKE.start]
    # From a cycle and a read after the stop returned (the status says so by then) until the restart.
    resumed = samples[samples.index(stopped) + 1].t
    outage = [s for s in samples if resumed + 8 <= s.t < OUTAGE[1]]
    ups = [(s.t, e) for s in samples for e in s.events if SPIKE.start <= s.t and "->" in e]
    peak = max(s.replicas for s in spike)

    # Up: more replicas during the spike than before it, asked for on the arrival rate while P90 was
    # still within target (an HPA on latency or queue length would only react after it broke).
    assert peak > max(s.replicas for s in before), [line(s, (SPIKE,)) for s in spike]
    first_up = next(e for _, e in ups)
    assert f"<= target {TARGET:g}s" in first_up, first_up

    # No reversal inside the spike: a replica released while it lasts is ordered again and costs a cold start.
    during = [s.replicas for s in spike]
    assert all(b >= a for a, b in itertools.pairwise(during)), [line(s, (SPIKE,)) for s in spike]

    # P90 comes back under the target while the spike still runs, on the added replicas.
    recovered = [s for s in spike if s.t > SPIKE.start + 30 and s.latency is not None and s.latency <= s.target]
    assert recovered, [line(s, (SPIKE,)) for s in spike]

    # Prometheus stopped: the operator holds the replicas and says MetricsAvailable=False.
    assert outage, "no samples in the outage"
    assert {s.metrics_available for s in outage} == {"False"}, [line(s, (SPIKE,)) for s in outage]
    assert {s.replicas for s in outage} == {stopped.replicas}, [line(s, (SPIKE,)) for s in outage]

    # Back, then after the spike (and its scale-down delay) the fleet shrinks again, never below min.
    after = [s for s in samples if s.t >= OUTAGE[1] + 20]
    assert after and after[-1].metrics_available == "True"
    assert min(s.replicas for s in after) < peak, (
        "\n".join(line(s, (SPIKE,)) + "".join(f"\n  event: {e}" for e in s.events) for s in samples if s.t >= SPIKE.end)
        + "\n"
        + operator.decisions()
    )
    assert min(s.replicas for s in samples) >= 1
