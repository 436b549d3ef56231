"""The operator's autoscaler on the local control plane, fed by a real Prometheus scraping fake pods.

The fake pods (tests/helpers/fake_pods.py) report a latency over the SLO for one fleet and nothing
for another, so the test sees the loop end to end (queries, decision, actuation through the scale
subresource, status, events) without the twin; the closed loop with the twin is tests/e2e.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mmfleet.api import seconds
from mmfleet.handlers.autoscale import SERVER_LOG_BYTES
from mmfleet.kube import AUTOSCALER_FIELD_MANAGER, Kube
from mmfleet_lab.cluster.cluster import Cluster
from tests.helpers.fake_pods import FakePod, FakePods, PrometheusServer, prometheus_scraping
from tests.helpers.fleet import Fleet, mmi
from tests.helpers.operator_process import OperatorProcess
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.integration

SLO = {"target": "2s", "window": "10s"}  # a short window: the policy's latency feedback waits one window


@pytest.fixture
def scraped(tmp_path: Path) -> Iterator[tuple[PrometheusServer, FakePods]]:
    with prometheus_scraping(tmp_path) as (server, pods):
        yield server, pods


@pytest.fixture
def fleet(
    api: Any, namespace: str, operator: OperatorProcess, scraped: tuple[PrometheusServer, FakePods]
) -> Iterator[Fleet]:
    """The session's operator, restarted to read this test's Prometheus every second; restored after."""
    server, _ = scraped
    saved = operator.env
    operator.stop()
    operator.env = {**saved, "MMFLEET_PROMETHEUS_URL": server.url, "MMFLEET_AUTOSCALE_INTERVAL": "1s"}
    operator.start()
    yield Fleet(api, namespace)
    operator.stop()
    operator.env = saved
    operator.start()


def replicas(fleet: Fleet, name: str) -> int:
    count: int = fleet.deployment(name).spec.replicas
    return count


SERVER_LOG = Path(__file__).parents[1] / "data" / "vllm_h200_server_start_0.33.0.log"


def as_node_keeps_it(log: str) -> str:
    """A container's log in the CRI format a node's runtime writes (and the kubelet API reads)."""
    return "".join(f"2026-12-02T18:11:20.000000000Z stdout F {line}\n" for line in log.splitlines())


@pytest.fixture
def logging_as_vllm(cluster: Cluster) -> Iterator[None]:
    """Every pod's server container logs as the real vLLM 0.33 server did on an H200 (kwok's kubelet API serves it),
    then a progress bar long enough that the operator's read (SERVER_LOG_BYTES) ends inside one of its characters."""
    start = SERVER_LOG.read_text()
    filler = SERVER_LOG_BYTES - 1 - len((start if start.endswith("\n") else start + "\n").encode())
    cluster.server_log.write_text(as_node_keeps_it(start + "x" * filler + "\u2588" * 8 + "\n"))
    yield
    cluster.server_log.write_text("")


@pytest.mark.usefixtures("logging_as_vllm")
def test_autoscaler_scales_on_prometheus_latency_and_holds_through_silence(
    api: Any, fleet: Fleet, scraped: tuple[PrometheusServer, FakePods]
) -> None:
    server, pods = scraped
    ns = fleet.namespace
    # As many reporting pods as "hot" will have Ready (3, its maxReplicas): fewer would be a partial scrape.
    for i in range(3):
        pods.add(FakePod(ns, f"hot-fake-{i}", "hot", rate=5, latency=4.0, waiting=5, running=5))
    server.scrape(pods)
    fleet.create(mmi("hot", autoscaling={"minReplicas": 1, "maxReplicas": 3, "slo": SLO}))
    fleet.create(mmi("quiet", autoscaling={"minReplicas": 1, "maxReplicas": 4, "slo": SLO}))
    fleet.wait_ready("quiet")
    Kube(api).scale(ns, "quiet", 3)  # as if the autoscaler had grown it earlier
    generations = {name: fleet.get(name)["metadata"]["generation"] for name in ("hot", "quiet")}

    # Over target (every request takes 4 s: P90 4.75 s in vLLM's buckets): up, with the reason as the event.
    scaled_up = wait_for(lambda: fleet.events("hot", "ScaledUp"), 120, "a ScaledUp event for hot (after 1m of warm-up)")
    assert scaled_up[0].startswith("P90 4.75s > target 2s"), scaled_up
    assert scaled_up[0].endswith(": 1 -> 2"), scaled_up
    wait_for(lambda: replicas(fleet, "hot") == 3, 60, "hot at maxReplicas 3")
    limited = wait_for(lambda: fleet.condition("hot", "ScalingLimited").get("reason") == "AtMaxReplicas" and
                       fleet.condition("hot", "ScalingLimited"), 30, "ScalingLimited AtMaxReplicas")  # fmt: skip
    assert limited["status"] == "True"
    status = fleet.status("hot")
    assert status["desiredReplicas"] == 3
    assert status["slo"]["observed"] == "4.75s" and status["slo"]["target"] == "2s"
    assert status["slo"]["attainment"] == 0
    assert ": 2 -> 3" in status["lastScaleReason"]
    # The cold start, phase by phase, from the timestamps the API server recorded on the Ready pods: the local
    # cluster's pods wait POD_READY_DELAY (2 s) after binding, all of it before kwok marks them Initialized.
    cold = status["coldStart"]
    assert cold["pods"] >= 1 and seconds(cold["total"]) >= 2.0, cold
    assert seconds(cold["initialized"]) >= 2.0 and seconds(cold["ready"]) == 0.0, cold
    # Within ready, what the server logged, read through the API server (`kubectl logs`): weights, engine, compile.
    assert (cold["weights"], cold["engine"], cold["compile"]) == ("3.56s", "72.9s", "22.6s"), cold
    slo_met = fleet.condition("hot", "SLOMet")
    assert (slo_met["status"], slo_met["reason"]) == ("False", "TargetMissed")
    fleet.wait_condition("hot", "MetricsAvailable", status="True", timeout=30)  # one slow scrape may drop a pod

    # The replicas are the autoscaler's, set through the scale subresource.
    owners = [
        (f.manager, f.subresource)
        for f in fleet.deployment("hot").metadata.managed_fields
        if "f:replicas" in (f.fields_v1 or {}).get("f:spec", {})
    ]
    assert owners == [(AUTOSCALER_FIELD_MANAGER, "scale")]

    # No series for quiet: it holds at 3 (never down to minReplicas on silence) and says which series.
    condition = fleet.wait_condition("quiet", "MetricsAvailable", reason="SeriesMissing", timeout=30)
    assert condition["status"] == "False"
    assert "vllm:e2e_request_latency_seconds_bucket" in condition["message"]
    assert f"namespace={ns}, mmfleet_io_inference=quiet" in condition["message"]
    assert "holding 3 replicas" in condition["message"]

    # Prometheus stopped: both hold, and say so.
    server.stop()

    def unavailable() -> bool:
        return all(
            fleet.condition(name, "MetricsAvailable").get("reason") == "PrometheusUnavailable"
            for name in ("hot", "quiet")
        )

    wait_for(unavailable, 30, "MetricsAvailable=False PrometheusUnavailable on both fleets")
    assert "Connection refused" in fleet.condition("hot", "MetricsAvailable")["message"]
    assert fleet.condition("hot", "SLOMet")["status"] == "Unknown"
    swings = fleet.condition("hot", "DemandSwings")
    assert (swings["status"], swings["reason"]) == ("Unknown", "NotMeasured"), swings
    assert "Connection refused" in swings["message"]
    deadline = time.monotonic() + 5  # five cycles
    while time.monotonic() < deadline:
        assert (replicas(fleet, "hot"), replicas(fleet, "quiet")) == (3, 3)
        time.sleep(0.5)
    assert fleet.events("quiet", "ScaledDown") == []
    warnings = fleet.events("hot", "PrometheusUnavailable")
    assert warnings and "holding 3 replicas" in warnings[0]

    # Back: the fleet is read again.
    server.start()
    wait_for(lambda: fleet.condition("hot", "MetricsAvailable").get("status") == "True", 60, "metrics back for hot")
    # A steady 5 req/s: once a few minutes of demand were read, the fleet follows it (DemandSwings False).
    swings = fleet.wait_condition("hot", "DemandSwings", reason="Steady", timeout=120)
    assert swings["status"] == "False" and "within 60s at the SLO's percentile" in swings["message"], swings

    # GitOps: the spec was never written (its generation did not move).
    assert {name: fleet.get(name)["metadata"]["generation"] for name in ("hot", "quiet")} == generations
    assert "replicas" not in fleet.get("hot")["spec"]


def test_the_encode_tier_scales_on_its_share_and_the_serving_tier_on_the_rest(
    fleet: Fleet, scraped: tuple[PrometheusServer, FakePods]
) -> None:
    """spec.disaggregation.encode.autoscaling: the serving pod's server answers within the serving tier's part of the
    SLO (P90 0.77 s against 1.5 s of 2 s), its sidecar waits 1.2 s for the encode tier against that tier's 0.5 s: the
    encode tier grows on its own, the serving tier stays, and status says what each tier saw."""
    server, pods = scraped
    ns = fleet.namespace
    pods.add(FakePod(ns, "epd-fake-0", "epd", rate=5, latency=0.7, waiting=0, running=2, front_door_latency=1.9,
                     encode_call_latency=1.2))  # fmt: skip
    for i in range(3):  # as many as the encode tier will have Ready: its queue stands at 4 requests each
        pods.add(FakePod(ns, f"epd-encode-fake-{i}", "epd", rate=5, latency=0.3, waiting=4, running=1, encode_pod=True))
    server.scrape(pods)
    encode = {"replicas": 1, "autoscaling": {"maxReplicas": 3, "share": 0.25}}
    # A profiled capacity far above the 5 req/s it serves: the serving tier needs its one replica.
    autoscaling = {"minReplicas": 1, "maxReplicas": 3, "slo": SLO, "capacityPerReplica": 50}
    fleet.create(mmi("epd", cloud="eks", gpu={"type": "H100"}, autoscaling=autoscaling,
                     disaggregation={"encode": encode}))  # fmt: skip

    grown = wait_for(lambda: fleet.events("epd", "EncodeScaledUp"), 150, "an EncodeScaledUp event (after warm-up)")
    assert grown[0].startswith("P90 1.45s > target 0.5s, demand "), grown  # 1.2 s in (1.0, 1.5]
    assert " items/s, " in grown[0] and "latency feedback on 1 ready" in grown[0], grown
    assert grown[0].endswith(": 1 -> 2 (encode tier: 25% of 2s)"), grown
    wait_for(lambda: replicas(fleet, "epd-encode") == 3, 90, "the encode tier at its maxReplicas 3")
    part = wait_for(lambda: (fleet.status("epd").get("encode") or {}).get("readyReplicas") == 3
                    and fleet.status("epd")["encode"], 60, "3 encode replicas ready in status")  # fmt: skip
    assert (part["desiredReplicas"], part["latency"], part["target"]) == (3, "1.45s", "0.5s")
    assert ": 2 -> 3" in part["lastScaleReason"]
    fleet.wait_condition("epd", "EncodeReady", status="True", reason="EncodeReplicasReady")
    # The serving tier, held to its part on its servers' own histogram, neither grew nor missed it.
    assert replicas(fleet, "epd") == 1 and not fleet.events("epd", "ScaledUp"), fleet.events("epd", "ScaledUp")
    slo_met = fleet.condition("epd", "SLOMet")
    assert (slo_met["status"], slo_met["reason"]) == ("True", "TargetMet")
    assert "P90 0.77s <= target 1.5s (the serving tier's part of 2s; the encode tier has 25%" in slo_met["message"]
    # The encode tier's replicas are the autoscaler's, set through the scale subresource.
    owners = [
        (f.manager, f.subresource)
        for f in fleet.deployment("epd-encode").metadata.managed_fields
        if "f:replicas" in (f.fields_v1 or {}).get("f:spec", {})
    ]
    assert owners == [(AUTOSCALER_FIELD_MANAGER, "scale")]


def test_a_fleet_whose_api_server_holds_its_requests_is_preprocessing_bound(
    fleet: Fleet, scraped: tuple[PrometheusServer, FakePods]
) -> None:
    """A real Prometheus reading vLLM's TTFT, queue and prefill histograms and the API server process's CPU: three
    fleets miss a 2 s target (P90 2.45 s). One's requests spend 1.7 s of their 2 s to first token before the engine
    takes them, with no engine queue and its API server at 0.97 cores: preprocessing-bound. Another's engines queue
    requests (the GPUs bound it), a third's API server has CPU to spare."""
    server, pods = scraped
    ns = fleet.namespace
    common = {"rate": 5, "latency": 2.2, "running": 2, "ttft": 2.0}
    pods.add(FakePod(ns, "api-fake-0", "api", waiting=0, outside=1.7, api_cpu=0.97, **common))
    pods.add(FakePod(ns, "gpu-fake-0", "gpu", waiting=6, outside=0.1, api_cpu=0.97, **common))
    pods.add(FakePod(ns, "spare-fake-0", "spare", waiting=0, outside=1.7, api_cpu=0.4, **common))
    server.scrape(pods)
    for name in ("api", "gpu", "spare"):
        fleet.create(mmi(name, autoscaling={"minReplicas": 1, "maxReplicas": 1, "slo": SLO}))
    bound = fleet.wait_condition("api", "PreprocessingBound", reason="ApiServerBound", timeout=120)
    assert bound["status"] == "True"
    assert "1.7s of the mean time to first token, 2s, before the engine took the request (85%)" in bound["message"]
    assert re.search(r"the busiest API server process at 0\.9\d CPU cores", bound["message"]), bound
    warned = wait_for(lambda: fleet.events("api", "ApiServerBound"), 30, "a Warning event")
    assert "spec.multimodal.apiServers" in warned[0]
    queued = fleet.wait_condition("gpu", "PreprocessingBound", reason="NotApiServerBound", timeout=60)
    assert queued["status"] == "False" and "(at most 6 waiting): the GPUs bound the latency" in queued["message"]
    spare = fleet.wait_condition("spare", "PreprocessingBound", reason="NotApiServerBound", timeout=60)
    assert spare["status"] == "False" and re.search(r"at 0\.[34]\d CPU cores: it has CPU to spare", spare["message"])
