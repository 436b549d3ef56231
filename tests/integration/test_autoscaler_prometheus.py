"""``autoscaler.metrics`` against a real Prometheus scraping vLLM- and TensorRT-LLM-shaped pods.

No control plane is needed: Prometheus (Debian's package) scrapes fake pods (tests/helpers/fake_pods.py)
through file_sd targets labelled as the PodMonitor relabelling labels real pods' series.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mmfleet.autoscaler.metrics import EncodeLatency, Prometheus, Readings, Slo, Target
from tests.helpers.fake_pods import FakePod, FakePods, PrometheusServer, prometheus_scraping
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.integration

E2E_P90 = Slo("e2e", 90, "10s")
RATE_WINDOW = "5s"  # five scrapes; the operator's 1m would take a minute to fill


@pytest.fixture
def scraped(tmp_path: Path) -> Iterator[tuple[PrometheusServer, FakePods]]:
    with prometheus_scraping(tmp_path) as (server, pods):
        yield server, pods


def read_when_complete(client: Prometheus, targets: list[Target]) -> Readings:
    """Until every fleet with pods has every signal (two scrapes are needed for a rate)."""

    def complete() -> Readings | None:
        readings = client.read(targets, time.time())
        full = [readings.signals[t.key] for t in targets if t.name != "nothing"]
        return readings if all(not s.missing and s.latency is not None for s in full) else None

    found: Readings = wait_for(complete, 30, "every fleet's series in Prometheus", interval=0.5)
    return found


def test_one_batched_read_returns_every_fleet_of_both_backends(scraped: tuple[PrometheusServer, FakePods]) -> None:
    server, pods = scraped
    mix = (1409.0, 211.0)  # prompt and output tokens per request
    pods.add(FakePod("team-a", "x-0", "x", rate=10, latency=0.7, waiting=3, running=5, kv_cache_usage=0.2, mix=mix))
    pods.add(FakePod("team-a", "x-1", "x", rate=10, latency=0.7, waiting=4, running=6, kv_cache_usage=0.4, mix=mix))
    pods.add(FakePod("team-b", "y-0", "y", rate=5, latency=3.0, waiting=9, running=2, kv_cache_usage=0.5))
    pods.add(FakePod("team-b", "z-0", "z", backend="tensorrt-llm", rate=4, latency=1.2, waiting=1, running=2))
    # An encode tier: the server sees 0.7 s, the client 1.2 s (the encode tier's time before the server); and two
    # whose front door timed too few of the requests to stand for them (a rollout's first pod, a TTFT mostly not
    # streamed), or none.
    pods.add(FakePod("team-b", "e-0", "e", rate=5, latency=0.7, front_door_latency=1.2))
    pods.add(FakePod("team-b", "f-0", "f", rate=5, latency=0.7, front_door_latency=1.2, front_door_share=0.5))
    pods.add(FakePod("team-b", "g-0", "g", rate=5, latency=0.7, front_door_latency=1.2, front_door_share=0.0))
    server.scrape(pods)
    targets = [
        Target("team-a", "x", "vllm", E2E_P90),
        Target("team-b", "y", "vllm", E2E_P90),
        Target("team-b", "z", "tensorrt-llm", Slo("e2e", 50, "10s")),
        Target("team-b", "nothing", "vllm", E2E_P90),
        Target("team-b", "e", "vllm", E2E_P90),
        Target("team-b", "f", "vllm", E2E_P90),
        Target("team-b", "g", "vllm", E2E_P90),
    ]
    client = Prometheus(server.url, rate_window=RATE_WINDOW)
    read_when_complete(client, targets)
    time.sleep(6)  # until the rate window holds only samples of steady load
    readings = client.read(targets, time.time())
    assert readings.outage is None
    # four signals, the pods reporting, two SLOs, vLLM's request mix (two) and PreprocessingBound's four, for seven
    # fleets on two backends
    assert readings.queries == 13

    x, y, z = (readings.signals[t.key] for t in targets[:3])
    # Every request takes 0.7 s, in vLLM's (0.5, 0.8] bucket: P90 interpolates to 0.5 + 0.9 x 0.3.
    assert x.latency == pytest.approx(0.77, abs=0.01)
    assert y.latency == pytest.approx(2.5 + 0.9 * 2.5, abs=0.01)  # 3 s sits in (2.5, 5]
    assert z.latency == pytest.approx(1.0 + 0.5 * 0.5, abs=0.01)  # P50 of 1.2 s in (1.0, 1.5]
    assert x.request_rate == pytest.approx(20, rel=0.25)  # two pods at 10/s each
    assert (x.waiting, x.running, x.kv_cache_usage) == (7, 11, pytest.approx(0.3))  # sums; the KV share averaged
    assert (y.waiting, z.waiting, z.running) == (9, 1, 2)
    assert (x.reporting, y.reporting, z.reporting) == (2, 1, 1), "pods with series, counted per fleet"
    assert z.request_rate == pytest.approx(4, rel=0.25)
    # the request mix where the servers export vLLM's per-request token histograms; none where they do not
    assert x.mix == (pytest.approx(1409.0), pytest.approx(211.0))
    assert y.mix is None and z.mix is None
    # The front door's latency where the pods measure it: P90 of 1.2 s in (1.0, 1.5], not the server's 0.77; the
    # server's where the front door timed half of the requests, or none.
    assert readings.signals[("team-b", "e")].latency == pytest.approx(1.0 + 0.9 * 0.5, abs=0.01)
    assert readings.signals[("team-b", "f")].latency == pytest.approx(0.77, abs=0.01)
    assert readings.signals[("team-b", "g")].latency == pytest.approx(0.77, abs=0.01)

    nothing = readings.signals[("team-b", "nothing")]
    assert nothing.latency is None
    assert nothing.missing == (
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:request_success_total",
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
    )
    client.close()


def test_an_encode_tier_is_read_apart_from_its_fleet(scraped: tuple[PrometheusServer, FakePods]) -> None:
    """A fleet that scales its encode tier: the serving tier's latency is its servers' own (the encode tier's time is
    left to that tier), the encode tier's is the sidecars' wait for it, its demand the items they sent (two per
    request here), its queue its own pods' in items; and the encode pods' series never join the fleet's sums."""
    server, pods = scraped
    for i in range(2):
        pods.add(FakePod("team-c", f"v-{i}", "v", rate=5, latency=0.7, waiting=1, running=2, front_door_latency=1.2,
                         encode_call_latency=0.4, items_per_request=2))  # fmt: skip
    pods.add(FakePod("team-c", "v-encode-0", "v", rate=10, latency=0.3, waiting=3, running=1, encode_pod=True))
    server.scrape(pods)
    encoded = Target("team-c", "v", "vllm", Slo("e2e", 90, "10s", front_door=False), encode=EncodeLatency(90, "10s"))
    client = Prometheus(server.url, rate_window=RATE_WINDOW)

    def complete() -> Readings | None:
        readings = client.read([encoded], time.time())
        found = readings.encode.get(encoded.key)
        return readings if found and not found.missing and found.latency is not None else None

    wait_for(complete, 30, "the encode tier's series in Prometheus", interval=0.5)
    time.sleep(6)  # until the rate window holds only samples of steady load
    readings = client.read([encoded], time.time())
    assert readings.outage is None
    fleet, tier = readings.signals[encoded.key], readings.encode[encoded.key]
    assert fleet.latency == pytest.approx(0.77, abs=0.01)  # the servers' 0.7 s, not the front door's 1.2 s
    assert (fleet.waiting, fleet.running, fleet.reporting) == (2, 4, 2)  # the encode pod's 3 and 1 are not the fleet's
    assert tier.latency == pytest.approx(0.3 + 0.9 * 0.2, abs=0.005)  # 0.4 s sits in (0.3, 0.5]
    assert tier.request_rate == pytest.approx(20, rel=0.25)  # two pods at 5 requests/s, two items each
    assert (tier.waiting, tier.running) == (pytest.approx(6, rel=0.05), pytest.approx(2, rel=0.05))  # in items
    assert tier.reporting == 1
    client.close()


def test_prometheus_stopped_is_an_outage_not_missing_series(scraped: tuple[PrometheusServer, FakePods]) -> None:
    server, pods = scraped
    pods.add(FakePod("team-a", "x-0", "x"))
    server.scrape(pods)
    targets = [Target("team-a", "x", "vllm", E2E_P90)]
    client = Prometheus(server.url, rate_window=RATE_WINDOW)
    read_when_complete(client, targets)
    server.stop()
    started = time.monotonic()
    readings = client.read(targets, time.time())
    assert readings.signals == {}
    assert readings.outage is not None
    assert readings.outage.startswith(f"{server.url} unreachable: ")
    assert "Connection refused" in readings.outage
    assert time.monotonic() - started < 1, "the first refusal ends the read: it does not wait out its deadline"
    assert readings.queries >= 1 and not any(sent.ok for sent in readings.latencies)
    client.close()
