"""One tenant's SLO cannot stall everyone: the cycle's queries go out side by side, within one deadline.

A real HTTP server answers like Prometheus' ``/api/v1/query`` (tests/helpers/prometheus_api.py), behind the
lab's fault proxy, which delays the queries of one SLO or all of them, and counts how many were in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from mmfleet import metrics_export
from mmfleet.autoscaler.metrics import QUERY_CONCURRENCY, Preprocessing, Prometheus, Readings, Signals, Slo, Target
from mmfleet.handlers import autoscale, memo, records
from mmfleet_lab.cluster.prometheus_faults import Fault, PrometheusFaultProxy
from tests.helpers.operator_state import KEY, RecordingKube, fleet_body, indexes, operator
from tests.helpers.prometheus_api import PrometheusApi
from tests.helpers.wait import wait_for

SERVED = Signals(
    latency=1.0,
    request_rate=1.0,
    waiting=1.0,
    running=1.0,
    kv_cache_usage=1.0,
    reporting=1,
    preprocessing=Preprocessing(1.0, 1.0, 1.0, 1.0),
    mix=(1.0, 1.0),
)


@contextlib.contextmanager
def prometheus(targets: list[Target], *faults: Fault) -> Iterator[PrometheusFaultProxy]:
    """A Prometheus that answers 1 for every fleet in ``targets``, behind a proxy applying ``faults``."""
    with (
        PrometheusApi((t.key for t in targets), backend=targets[0].backend) as api,
        PrometheusFaultProxy(api.url) as proxy,
    ):
        proxy.inject(*faults)
        yield proxy
        wait_for(lambda: proxy.in_flight == 0, 10, "the slow answers given up on")  # before their upstream goes


def timed_read(url: str, targets: list[Target], deadline: float) -> tuple[Readings, float]:
    client = Prometheus(url, deadline)
    try:
        started = time.monotonic()
        readings = client.read(targets, time.time())
        return readings, time.monotonic() - started
    finally:
        client.close()


def test_forty_distinct_percentiles_are_read_side_by_side_not_one_after_another() -> None:
    """The attack: 40 fleets, each its own percentile, took 40 sequential queries and turned liveness red."""
    targets = [Target("tenant", f"f{i}", "vllm", Slo("ttft", 90 + i / 5, "60s")) for i in range(40)]
    with prometheus(targets, Fault("slow", delay=0.3)) as proxy:  # every query takes 0.3 s
        readings, took = timed_read(proxy.url, targets, deadline=7.5)
        assert proxy.busiest <= QUERY_CONCURRENCY, "a bounded number in flight: Prometheus is not flooded"
    assert took < 4, f"51 queries of 0.3 s, {QUERY_CONCURRENCY} at a time: about 2 s, not 14.7 s (took {took:.1f})"
    assert readings.outage is None
    assert all(readings.signals[t.key] == SERVED for t in targets), "every fleet read"
    # 4 signals, reporting, 40 SLOs, the request mix's two and PreprocessingBound's four
    assert readings.queries == 51 and all(sent.ok for sent in readings.latencies)


def test_a_slow_slo_fails_only_its_fleets_naming_it_and_the_read_keeps_its_deadline() -> None:
    """TensorRT-LLM fleets: no advisory queries (the request mix, PreprocessingBound), so the one slow query is the only
    one failed."""
    slow, fine = Slo("ttft", 97.3, "60s"), Slo("e2e", 90, "60s")
    targets = [Target("a", "slow-1", "tensorrt-llm", slow), Target("b", "slow-2", "tensorrt-llm", slow)]
    targets += [Target("c", f"fine-{i}", "tensorrt-llm", fine) for i in range(3)]
    with prometheus(targets, Fault("slow", match="histogram_quantile(0.973,", delay=1.5)) as proxy:
        readings, took = timed_read(proxy.url, targets, deadline=1.0)
    assert readings.outage is None
    for target in targets[:2]:
        assert readings.signals[target.key] == Signals(
            failed=f"{proxy.url} did not answer the query for P97.3 of ttft over 60s within 1s"
        )
    assert all(readings.signals[t.key] == replace(SERVED, preprocessing=None, mix=None) for t in targets[2:])
    assert 1.0 <= took < 1.5, f"the read ends at its deadline, not at the slow query's answer (took {took:.2f})"
    assert readings.queries == 7 and [sent.ok for sent in readings.latencies].count(False) == 1
    errors = metrics_export.REGISTRY.get_sample_value(
        "mmfleet_prometheus_query_duration_seconds_count", {"result": "error"}
    )
    metrics_export.record_cycle(readings, took)
    assert (
        metrics_export.REGISTRY.get_sample_value("mmfleet_prometheus_query_duration_seconds_count", {"result": "error"})
        == (errors or 0) + 1
    ), "the operator's own metrics count the query that did not answer as an error"


def test_a_flood_of_distinct_slos_never_outlasts_the_read_deadline() -> None:
    """400 distinct SLOs of 0.3 s each would take 15 s 8 at a time: those not read by the deadline fail, and say so.
    The deadline leaves the five shared queries (the first 0.3 s) time to spare on a loaded machine; the advisory
    queries (the request mix, PreprocessingBound) go last, so they are the ones left unsent, and say so."""
    targets = [Target("tenant", f"f{i}", "vllm", Slo("itl", 50 + i / 10, "60s")) for i in range(400)]
    with prometheus(targets, Fault("slow", delay=0.3)) as proxy:
        readings, took = timed_read(proxy.url, targets, deadline=2.0)
        assert proxy.busiest <= QUERY_CONCURRENCY
    assert took < 2.5, f"took {took:.2f} s"
    assert readings.outage is None, "the shared queries go first and are answered"
    read = [
        t
        for t in targets
        if replace(readings.signals[t.key], preprocessing=None, mix=None)
        == replace(SERVED, preprocessing=None, mix=None)
    ]
    assert 0 < len(read) < 400
    unsent = "was not sent within 2s (411 queries this cycle"
    told = all(unsent in ((readings.signals[t.key].preprocessing or Preprocessing()).problem or "") for t in read)
    assert told, "the advisory queries go last; PreprocessingBound says why it is not measured"
    assert readings.queries < 411
    last = readings.signals[targets[-1].key]
    assert last.failed == (
        f"{proxy.url}: the query for P89.9 of itl over 60s was not sent within 2s (411 queries this cycle, "
        f"{QUERY_CONCURRENCY} at a time)"
    )


def test_a_shared_query_that_does_not_answer_is_an_outage_for_all() -> None:
    targets = [Target("a", "x", "vllm", Slo("e2e", 90, "60s"))]
    with prometheus(targets, Fault("slow", match="num_requests_waiting", delay=1.5)) as proxy:
        readings, took = timed_read(proxy.url, targets, deadline=1.0)
    assert readings.signals == {}
    assert readings.outage == f"{proxy.url} did not answer the query for waiting within 1s"
    assert took < 1.5


def test_an_unreachable_prometheus_is_still_an_outage_for_all() -> None:
    with socket.socket() as bound:  # bound, never listening, so nothing else takes it: connection refused
        bound.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{bound.getsockname()[1]}"
        targets = [Target("a", f"x{i}", "vllm", Slo("e2e", 90 + i, "60s")) for i in range(3)]
        readings, took = timed_read(url, targets, deadline=5.0)
    assert readings.signals == {}
    assert readings.outage is not None and readings.outage.startswith(f"{url} unreachable: ")
    assert "Connection refused" in readings.outage
    assert took < 1.0, "refused at once: the read does not wait out its deadline"
    # A connection dropped on one SLO's query: Prometheus is gone for every fleet, not only for that one.
    with prometheus(targets, Fault("drop", match="histogram_quantile(0.91,")) as proxy:
        readings, _ = timed_read(proxy.url, targets, deadline=5.0)
    assert readings.signals == {}
    assert readings.outage is not None and readings.outage.startswith(f"{proxy.url} unreachable: ")


def test_the_loop_keeps_cycling_while_a_fleets_query_hangs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cycles finish every interval, the liveness probe stays green, and the fleet's status names the query."""
    monkeypatch.setattr(autoscale, "kopf_event", lambda *args: None)  # kopf's posting needs its own context
    monkeypatch.setattr(records, "kopf_event", lambda *args: None)
    body = fleet_body(autoscaling=True)
    own = {"name": KEY[1], "generation": 1, "controller": body["metadata"]["uid"]}  # the fleet's, as indexed
    held = indexes(body, {"metadata": own, "spec": {"replicas": 2}, "status": {}})
    cycles: list[float] = []
    monkeypatch.setattr(metrics_export, "record_cycle", lambda _, took: cycles.append(took))
    with prometheus(
        [Target(*KEY, "vllm", Slo("e2e", 90, "60s"))], Fault("slow", match="histogram_quantile", delay=2.0)
    ) as proxy:
        kube = RecordingKube()
        op = operator(kube, prometheus_url=proxy.url, autoscale_interval=1.0)
        op.record(KEY, body["metadata"]["uid"])

        async def scenario() -> str:
            op.autoscaler = asyncio.create_task(autoscale.autoscale_forever(op, held))
            await asyncio.sleep(3.5)
            said = await autoscale.check_autoscaler(memo(op))
            op.autoscaler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await op.autoscaler
            return said

        said = asyncio.run(scenario())
    metrics_export.forget_others(set())
    assert len(cycles) >= 3 and max(cycles) < 0.9, f"a cycle every second, each within half of it: {cycles}"
    assert said in ("last cycle 0s ago", "last cycle 1s ago")
    condition = next(c for c in kube.written[-1]["conditions"] if c["type"] == "MetricsAvailable")
    assert (condition["status"], condition["reason"]) == ("False", "QueryFailed")
    assert condition["message"].startswith(f"{proxy.url} did not answer the query for P90 of e2e over 60s within 0.5s")
