"""A cycle trusts nothing it reads: bad samples hold the fleet, and MetricsAvailable quotes what was seen."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from mmfleet.autoscaler.cycle import Memory, Outcome, Pods, Seen, decide
from mmfleet.autoscaler.metrics import Signals
from tests.helpers.autoscaler import INTERVAL, T0, busy, conditions, fleet, run


@pytest.mark.parametrize(
    ("bad", "quoted"),
    [
        ({"latency": math.inf}, "P90 latency = inf"),  # histogram_quantile in the +Inf bucket
        ({"waiting": 1e9}, "vllm:num_requests_waiting = 1e+09"),  # scaled 3 -> max in one step
        ({"waiting": math.nan}, "vllm:num_requests_waiting = nan"),
        ({"running": -math.inf}, "vllm:num_requests_running = -inf"),
        ({"request_rate": -5.0}, "vllm:request_success_total = -5"),
        ({"kv_cache_usage": 1.7}, "vllm:kv_cache_usage_perc = 1.7"),
    ],
)
def test_an_implausible_sample_holds_the_fleet_and_is_quoted(bad: dict[str, float], quoted: str) -> None:
    signals = replace(busy(4.0, waiting=40.0), reporting=3, **bad)
    outcomes, _, current = run(fleet(min_replicas=1, max_replicas=20), 3, signals, cycles=12)
    assert current == 3 and not any(o.scaled for o in outcomes), "neither minReplicas nor maxReplicas on bad data"
    ok, reason, message = conditions(outcomes[-1])["MetricsAvailable"]
    assert (ok, reason) == (False, "SamplesRejected")
    assert quoted in message and message.endswith(
        "holding 3 replicas this cycle (a bad sample does not restart the rate window's warm-up)"
    )
    assert outcomes[-1].cause == "metrics_unavailable"


def test_the_plausible_range_grows_with_the_pods() -> None:
    """100,000 waiting is implausible on one pod, not on three hundred."""
    signals = replace(busy(1.0, waiting=150_000.0), reporting=300)
    outcomes, _, _ = run(fleet(max_replicas=400), 300, signals, cycles=1, pods=Pods(ready=300))
    assert conditions(outcomes[-1])["MetricsAvailable"][:2] == (True, "SeriesPresent")


def test_a_query_prometheus_refused_holds_the_fleet_and_quotes_prometheus() -> None:
    failed = Signals(failed="http://prom:9090 refused the query 'x[0s]': HTTP Status Code 400 (bad_data)")
    outcomes, _, current = run(fleet(), 4, failed, cycles=6)
    assert current == 4
    ok, reason, message = conditions(outcomes[-1])["MetricsAvailable"]
    assert (ok, reason) == (False, "QueryFailed")
    assert message == (
        f"{failed.failed}; holding 4 replicas this cycle (a bad sample does not restart the rate window's warm-up)"
    )


def test_a_partial_scrape_says_so_and_never_scales_down() -> None:
    full = replace(busy(1.0, rate=12.0, waiting=0.0, running=12.0), reporting=6)
    _, learned, _ = run(fleet(), 6, full, cycles=20, pods=Pods(ready=6))  # 2 req/s per replica within the target
    quiet = replace(full, request_rate=2.0, running=2.0, reporting=1)  # what a scrape of one pod in six sums to
    outcomes, _, current = run(fleet(), 6, quiet, cycles=60, pods=Pods(ready=6), memory=learned)
    assert current == 6, "a scrape missing five of six pods reads as a quiet fleet"
    ok, reason, message = conditions(outcomes[-1])["MetricsAvailable"]
    assert (ok, reason) == (False, "PartialScrape")
    assert message.startswith("1 of 6 Ready pods report series")
    _, _, current = run(fleet(), 6, replace(quiet, reporting=6), cycles=60, pods=Pods(ready=6), memory=learned)
    assert current < 6, "the same numbers from every pod do scale down"


def test_pods_ready_for_less_than_a_scrape_interval_are_not_yet_expected_to_report() -> None:
    """Right after a scale-up, new pods are Ready before Prometheus has scraped them: not a partial scrape."""
    signals = replace(busy(1.0, waiting=0.0), reporting=3)
    just_ready = Pods(ready=5, ready_since=(T0 - timedelta(minutes=10),) * 3 + (T0 - timedelta(seconds=10),) * 2)
    outcomes, _, _ = run(fleet(), 5, signals, cycles=1, pods=just_ready)
    assert conditions(outcomes[-1])["MetricsAvailable"][:2] == (True, "SeriesPresent")
    outcomes, _, _ = run(fleet(), 5, signals, cycles=1, pods=just_ready, start=T0 + timedelta(minutes=2))
    assert conditions(outcomes[-1])["MetricsAvailable"][:3] == (
        False, "PartialScrape", "3 of 5 Ready pods report series, so the sums miss pods: the fleet may grow, not "
        "shrink (does Prometheus scrape every pod?)",
    )  # fmt: skip


# --- one sample is never decisive ------------------------------------------------------------------------------------


def replicas_over_time(
    samples: list[Signals], current: int, memory: Memory | None = None, start: datetime = T0
) -> tuple[list[Outcome], list[int]]:
    """One cycle per sample, every 15 s, the pods Ready as soon as they are asked for (and all reporting)."""
    memory, outcomes = memory or Memory(), []
    for i, sample in enumerate(samples):
        signals = sample if sample.failed else replace(sample, reporting=current)
        seen = Seen(current, Pods(ready=current), signals)
        now = start + timedelta(seconds=INTERVAL * i)
        outcome = decide(fleet(max_replicas=20), seen, memory, now, interval=INTERVAL, default_cold_start=120)
        outcomes.append(outcome)
        memory, current = outcome.memory, outcome.replicas
    return outcomes, [o.replicas for o in outcomes]


REJECTED = Signals(latency=math.nan, request_rate=10.0, waiting=20.0, running=10.0, kv_cache_usage=0.6)
FAILED = Signals(failed="http://prom:9090 refused the query 'x': HTTP Status Code 503")


@pytest.mark.parametrize("bad", [REJECTED, FAILED], ids=["rejected", "failed"])
def test_one_bad_sample_a_minute_does_not_freeze_a_fleet_at_three_times_its_target(bad: Signals) -> None:
    """Each bad sample used to restart the warm-up, so a fleet at 3x its target stayed at 1 replica."""
    over = busy(6.0)  # P90 6 s against a 2 s target
    _, clean = replicas_over_time([over] * 40, current=1)
    outcomes, flaky = replicas_over_time([bad if i % 4 == 3 else over for i in range(40)], current=1)
    assert clean[-1] > 4, clean
    assert all(flaky[i] >= clean[i - 1] for i in range(1, 40)), (clean, flaky)
    assert flaky.index(2) <= clean.index(2) + 1, "the first scale-up at most one cycle later"
    ok, _, message = conditions(outcomes[3])["MetricsAvailable"]
    assert ok is False
    assert message.endswith("holding 1 replicas this cycle (a bad sample does not restart the rate window's warm-up)")


CALM = Signals(latency=1.0, request_rate=2.0, waiting=0.0, running=4.0, kv_cache_usage=0.3)
AFTER_CALM = T0 + timedelta(seconds=INTERVAL * 40)


def calm_fleet() -> Memory:
    """Ten minutes of 1 replica serving 2 req/s with 4 in flight, well within its 2 s target."""
    outcomes, replicas = replicas_over_time([CALM] * 40, current=1)
    assert replicas[-1] == 1
    return outcomes[-1].memory


def test_one_wild_queue_with_the_slo_met_is_held_and_says_why() -> None:
    """99,999 waiting is within the plausible bounds for one pod, but far beyond anything this fleet has shown."""
    memory = calm_fleet()
    wild = replace(CALM, waiting=99_999.0)
    outcomes, replicas = replicas_over_time([wild] + [CALM] * 40, current=1, memory=memory, start=AFTER_CALM)
    held = outcomes[0]
    assert held.cause == "sample_unconfirmed"
    assert held.memory.policy_state == memory.policy_state, "the policy never sees it: it teaches no capacity"
    assert conditions(held)["MetricsAvailable"] == (
        False,
        "SampleUnconfirmed",
        "waiting 99999 + running 4 = 100003 for 1 Ready pod, 391x the most seen per pod (4, judged as 256): "
        "held until the next sample confirms it; holding 1 replicas",
    )
    assert replicas == [1] * 41, "never scaled on the one sample"
    assert conditions(outcomes[1])["MetricsAvailable"][:2] == (True, "SeriesPresent")


def test_one_wild_queue_does_not_keep_a_fleet_from_scaling_down() -> None:
    """A fleet shrinking on the normal rules shrinks the same with a 99,999-waiting sample in the middle."""
    busy_hour = Signals(latency=1.0, request_rate=20.0, waiting=0.0, running=40.0, kv_cache_usage=0.6)
    quiet = Signals(latency=0.5, request_rate=4.0, waiting=0.0, running=8.0, kv_cache_usage=0.2)
    samples = [busy_hour] * 20 + [quiet] * 60  # 2 req/s per replica learned, then a fifth of the load
    _, clean = replicas_over_time(samples, current=10)
    glitched = [replace(sample, waiting=99_999.0) if i == 30 else sample for i, sample in enumerate(samples)]
    assert clean[-1] < 10 and replicas_over_time(glitched, current=10)[1] == clean


def test_a_queue_confirmed_by_the_next_sample_with_latency_over_target_scales_up() -> None:
    """A real spike is seen in consecutive scrapes: the first alone is held, the second scales the fleet."""
    spike = [replace(CALM, latency=latency, waiting=waiting, running=64.0, kv_cache_usage=0.9)
             for latency, waiting in ((2.5, 3_000.0), (3.0, 6_000.0), (4.0, 9_000.0))]  # fmt: skip
    outcomes, replicas = replicas_over_time(spike, current=1, memory=calm_fleet(), start=AFTER_CALM)
    assert [o.cause for o in outcomes[:2]] == ["sample_unconfirmed", "scaled_up"]
    assert replicas[0] == 1 < replicas[1] <= replicas[2]
    assert conditions(outcomes[1])["MetricsAvailable"][:2] == (True, "SeriesPresent")
