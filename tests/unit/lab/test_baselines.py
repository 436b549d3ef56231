"""Each baseline against hand-computed steps of its real control law (the upstream source each baseline's docstring
names, with its commit)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from mmfleet.autoscaler import Decision
from mmfleet_lab.bench.baselines import FAMILIES, Profile, baselines, build, grid
from mmfleet_lab.bench.baselines.aibrix import AibrixApaPolicy
from mmfleet_lab.bench.baselines.dynamo import DynamoPlannerPolicy
from mmfleet_lab.bench.baselines.hpa import (
    HpaPolicy,
    HpaState,
    external_average_replicas,
    hpa_normalize,
    pods_metric_replicas,
)
from mmfleet_lab.bench.baselines.keda import KedaPolicy, KedaState
from mmfleet_lab.bench.baselines.knative import KpaPolicy
from mmfleet_lab.bench.baselines.kubeai import KubeAiPolicy
from mmfleet_lab.bench.baselines.llmd import LlmdQueuePolicy, LlmdSloPolicy
from mmfleet_lab.bench.baselines.static import StaticPolicy
from mmfleet_lab.twin.policy import LabObservation, Policy


def obs(**kw: Any) -> LabObservation:
    """A fleet of 4 Ready replicas at modest load; override what a test is about."""
    base: dict[str, Any] = {
        "time": 0.0,
        "ready": 4,
        "starting": 0,
        "unschedulable": 0,
        "current": 4,
        "min_replicas": 1,
        "max_replicas": 100,
        "slo_target": 2.0,
        "slo_percentile": 90.0,
        "cold_start": 120.0,
        "request_rate": 8.0,
        "latency": 1.0,
        "waiting": 0.0,
        "running": 8.0,
        "kv_cache_usage": 0.5,
        "prompt_tokens_rate": 24000.0,
        "generation_tokens_rate": 1200.0,
    }
    base.update(kw)
    return LabObservation(**base)


def run(policy: Policy, observations: list[LabObservation]) -> list[Decision]:
    """Feed observations in order, carrying the state; each sees the replicas the previous one set."""
    state = policy.initial_state()
    out: list[Decision] = []
    for o in observations:
        d = policy.decide(replace(o, current=out[-1].replicas) if out else o, state)
        state = d.state
        out.append(d)
    return out


# ------------------------------ HPA replica calculator (kubernetes/kubernetes replica_calculator.go @19e8ce76)


def test_hpa_pods_metric_is_ceil_of_ratio_times_ready() -> None:
    # 4 pods at 8 waiting each vs target 5: ceil(4 x 1.6) = 7
    assert pods_metric_replicas(32, 5, ready=4, missing=0, unready=0, current=4) == 7


def test_hpa_within_tolerance_keeps_current() -> None:
    assert pods_metric_replicas(21, 5, ready=4, missing=0, unready=0, current=4) == 4  # ratio 1.05
    assert pods_metric_replicas(22, 5, ready=4, missing=0, unready=0, current=4) == 4  # 1.10 is still within
    assert pods_metric_replicas(23, 5, ready=4, missing=0, unready=0, current=4) == 5  # 1.15: ceil(4.6)


def test_hpa_missing_pods_count_zero_on_the_way_up() -> None:
    # 4 reporting at 15 each (ratio 3), 2 loading without metrics: 60 / 6 pods / 5 = 2 -> ceil(2 x 6) = 12
    assert pods_metric_replicas(60, 5, ready=4, missing=2, unready=0, current=6) == 12
    # ...and if the zeros bring the ratio below 1 the direction flips: hold
    assert pods_metric_replicas(32, 5, ready=4, missing=4, unready=0, current=8) == 8


def test_hpa_missing_pods_count_as_target_on_the_way_down() -> None:
    # 4 at 1 each (ratio 0.2); 2 missing taken at 5: 14000m // 6 = 2333m -> 0.4666 x 6 = 2.8 -> 3, not ceil(0.8) = 1
    assert pods_metric_replicas(4, 5, ready=4, missing=2, unready=0, current=6) == 3
    assert pods_metric_replicas(4, 5, ready=4, missing=0, unready=0, current=4) == 1


def test_hpa_pending_pods_are_set_aside_except_on_the_way_up() -> None:
    assert pods_metric_replicas(4, 5, ready=4, missing=0, unready=2, current=6) == 1  # down: ignored
    # up: 2 Pending come back as 0: 40 / 6 / 5 = 1.333 (6666m -> 1.3332) x 6 = 7.9992 -> 8
    assert pods_metric_replicas(40, 5, ready=4, missing=0, unready=2, current=6) == 8


def test_hpa_no_pod_reporting_is_an_error() -> None:
    assert pods_metric_replicas(0, 5, ready=0, missing=4, unready=0, current=4) is None


def test_hpa_first_sync_seeds_the_window_with_the_current_count() -> None:
    n, state = hpa_normalize(1, 10, 1, 100, 0.0, HpaState())
    assert n == 10
    assert state.recommendations == ((0.0, 10.0), (0.0, 1.0))


def test_hpa_scale_up_rate_is_max_of_four_pods_and_doubling_per_15s() -> None:
    # v2 defaults.go @1adaa753: from 1 replica under a huge metric, 1 -> 5 -> 10 -> 20 -> 40, one step per 15 s
    state = HpaState()
    current, seen = 1, []
    for t in (0.0, 15.0, 30.0, 45.0):
        current, state = hpa_normalize(1000, current, 1, 1000, t, state)
        seen.append(current)
    assert seen == [5, 10, 20, 40]


def test_hpa_scale_up_rate_counts_the_events_of_the_period() -> None:
    state = HpaState()
    n, state = hpa_normalize(100, 4, 1, 1000, 0.0, state)
    assert n == 8  # max(4 + 4, 4 x 2)
    n, _ = hpa_normalize(100, 8, 1, 1000, 10.0, state)
    assert n == 8  # the +4 at t=0 is inside this 15 s period: the period started at 4
    n, _ = hpa_normalize(100, 8, 1, 1000, 15.0, state)
    assert n == 16  # t=0 is no longer After(15 - 15)


def test_hpa_policy_scales_4_pods_at_metric_8_to_7() -> None:
    d = HpaPolicy().decide(obs(waiting=32.0), HpaState())
    assert d.replicas == 7
    assert "4 -> 7" in d.reason


def test_hpa_policy_holds_scale_down_for_300s_then_applies_it() -> None:
    policy = HpaPolicy()
    high = [obs(time=0.0, current=10, ready=10, waiting=50.0)]  # exactly on target: hold 10, records 10
    low = [obs(time=t, current=10, ready=10, waiting=10.0) for t in range(15, 316, 15)]  # wants 2
    decisions = run(policy, high + low)
    by_time = {o.time: d.replicas for o, d in zip(high + low, decisions, strict=True)}
    assert all(by_time[t] == 10 for t in range(0, 300, 15))
    assert by_time[300] == 2  # the recommendation of 10 at t=0 is out of (0, 300]; 100 %/15 s allows it
    assert "holding 10" in decisions[5].reason


def test_hpa_policy_holds_when_the_metric_is_missing() -> None:
    d = HpaPolicy().decide(obs(waiting=None, current=6), HpaState())
    assert d.replicas == 6
    assert "holding 6" in d.reason


def test_hpa_inflight_variant_takes_littles_law_target_with_the_mean_latency_not_the_slo() -> None:
    # target = mu_SLO x mean latency = 2 req/s x 1 s = 2 in flight per pod (the SLO, 2 s, would say 4);
    # 4 pods at 8 in flight -> ceil(4 x 4) = 16, rate-limited to x2 this sync
    policy = HpaPolicy(metric="running+waiting", target=None, capacity_per_replica=2.0, mean_latency=1.0)
    d = policy.decide(obs(running=24.0, waiting=8.0), HpaState())
    assert "vs target 2 " in d.reason and "metric wants 16" in d.reason
    assert d.replicas == 8
    with pytest.raises(ValueError, match="mean_latency"):
        HpaPolicy(metric="running+waiting", target=None, capacity_per_replica=2.0).decide(obs(), HpaState())


def test_hpa_range_guard_brings_replicas_back_within_bounds() -> None:
    assert HpaPolicy().decide(obs(current=12, max_replicas=10), HpaState()).replicas == 10


# ---------------------------------------------------------------- KEDA (kedacore/keda prometheus_scaler.go @0805d72)


def test_keda_threshold_math_is_external_average_value() -> None:
    assert external_average_replicas(23, 5, status_replicas=4) == 5  # 23 / 20 = 1.15 -> ceil(23 / 5)
    assert external_average_replicas(21, 5, status_replicas=4) == 4  # 1.05: within tolerance
    assert external_average_replicas(0, 5, status_replicas=0) == 0


def test_keda_has_no_readiness_damping() -> None:
    # 4 Ready at 8 waiting each + 4 still loading. The HPA's Pods path counts the loading pods as 0, sees
    # the ratio flip below 1 and holds; KEDA's External metric divides by all 8 pods and scales down to 7.
    assert pods_metric_replicas(32, 5, ready=4, missing=4, unready=0, current=8) == 8
    assert external_average_replicas(32, 5, status_replicas=8) == 7
    settled = KedaState(hpa=HpaState(recommendations=((-400.0, 8.0),)))  # nothing in the 300 s window
    d = KedaPolicy().decide(obs(current=8, ready=4, starting=4, waiting=32.0), settled)
    assert d.replicas == 7


def test_keda_reads_an_absent_series_as_zero_but_holds_when_prometheus_is_down() -> None:
    policy = KedaPolicy()
    absent = [obs(time=float(t), current=6, ready=6, waiting=None) for t in range(0, 301, 15)]
    keda = run(policy, absent)
    # ignoreNullValues: 0 -> ceil(0 / 5) = 0, held by the seeded 300 s window, then minReplicas
    assert [d.replicas for d in keda] == [6] * 20 + [1]
    assert all(d.replicas == 6 for d in run(HpaPolicy(), absent))  # the HPA itself errors and holds
    down = policy.decide(
        obs(current=6, waiting=None, request_rate=None, latency=None, running=None), policy.initial_state()
    )
    assert down.replicas == 6
    assert "holding 6" in down.reason


def test_keda_scale_to_zero_waits_cooldown_after_last_activity() -> None:
    policy = KedaPolicy(min_replica_count=0)
    active = [obs(time=0.0, current=1, ready=1, waiting=3.0)]
    idle = [obs(time=t, current=1, ready=1, waiting=0.0) for t in range(15, 301, 15)]
    decisions = run(policy, active + idle)
    assert [d.replicas for d in decisions[:-1]] == [1] * 20  # inactive polls at 30..270 s: < 300 s
    assert decisions[-1].replicas == 0  # poll at 300 s: 300 s since the last active poll
    back = policy.decide(obs(time=330.0, current=0, ready=0, waiting=2.0), decisions[-1].state)
    assert back.replicas == 1


def test_keda_keep_alive_trigger_keeps_one_replica_while_requests_arrive() -> None:
    policy = KedaPolicy(min_replica_count=0, keep_alive=True)
    d = policy.decide(obs(current=1, ready=1, waiting=0.0, arrival_rate=0.5), policy.initial_state())
    assert d.replicas == 1


# ---------------------------------------------------------------- Knative KPA (knative/serving autoscaler.go @98e5ef9)


def kpa_ticks(policy: KpaPolicy, values: list[tuple[float, float]], ready: int = 4) -> list[Decision]:
    return run(policy, [obs(time=t, ready=ready, current=ready, running=v, waiting=0.0) for t, v in values])


def test_kpa_stable_mode_is_ceil_of_average_over_target() -> None:
    policy = KpaPolicy(container_concurrency=10)  # target 0.7 x 10 = 7
    ds = kpa_ticks(policy, [(float(t), 20.0) for t in range(0, 81, 2)], ready=2)
    assert ds[-1].replicas == 3  # ceil(20 / 7); 3 / 2 ready = 1.5 < 2: no panic
    assert "stable" in ds[-1].reason


def test_kpa_new_decider_starts_in_panic_at_the_ready_count() -> None:
    policy = KpaPolicy(container_concurrency=10)
    ds = kpa_ticks(policy, [(float(t), 0.0) for t in range(0, 65, 2)], ready=4)
    assert all(d.replicas == 4 for d in ds[:31])  # t = 0..60: panic keeps 4 although nothing is in flight
    assert ds[-1].replicas == 2  # t = 64 > 0 + 60: stable, 0 in flight, but at most halving: floor(4 / 2)


def test_kpa_enters_panic_at_twice_the_ready_pods_and_never_scales_down_in_it() -> None:
    policy = KpaPolicy(container_concurrency=10)  # target 7, panic window 6 s
    ticks = [(float(t), 28.0) for t in range(0, 59, 2)] + [(60.0, 140.0)]
    quiet = [(float(t), 0.0) for t in range(62, 127, 2)]
    decisions = dict(zip([t for t, _ in ticks + quiet], kpa_ticks(policy, ticks + quiet, ready=4), strict=True))
    # t=60: stable avg over (0, 60] = (29 x 28 + 140) / 30, panic avg over (54, 60] = (28 + 28 + 140) / 3
    stable = (29 * 28 + 140) / 30
    panic = (28 + 28 + 140) / 3
    dppc = math.ceil(panic / 7)
    assert dppc / 4 >= 2.0
    assert decisions[60.0].replicas == max(math.ceil(stable / 7), dppc) == 10
    # t=62 is still over (panic avg (28 + 140 + 0) / 3 -> 8 pods = 2 x 4) and extends panic to 62 + 60
    assert all(d.replicas == 10 for t, d in decisions.items() if 60 < t <= 122)
    # t=124: panic ends; stable avg over (64, 124] is 0, kept >= floor(4 / 2) = 2
    assert decisions[124.0].replicas == 2
    assert "stable" in decisions[124.0].reason


def test_kpa_below_panic_threshold_scales_proportionally() -> None:
    policy = KpaPolicy(container_concurrency=10)
    ticks = [(float(t), 28.0) for t in range(0, 121, 2)] + [(122.0, 70.0)]
    ds = kpa_ticks(policy, ticks, ready=4)
    # panic avg (28 + 28 + 70) / 3 = 42 -> 6 pods = 1.5 x 4: stable; stable avg (29 x 28 + 70) / 30 -> 5
    assert ds[-1].replicas == math.ceil((29 * 28 + 70) / 30 / 7) == 5
    assert "stable" in ds[-1].reason


# ---------------------------------------------------------------- AIBrix APA (vllm-project/aibrix apa.go @e3e10f9)


def test_aibrix_apa_up_is_ceil_current_times_ratio_capped_at_double() -> None:
    policy = AibrixApaPolicy()  # kv_cache_usage, target 0.5
    assert policy.decide(obs(kv_cache_usage=0.8), policy.initial_state()).replicas == 7  # ceil(4 x 1.6)
    low_target = AibrixApaPolicy(target=0.2)  # ratio 5: ceil(4 x 5) = 20, capped at ceil(2 x 4)
    assert low_target.decide(obs(kv_cache_usage=1.0), low_target.initial_state()).replicas == 8
    assert policy.decide(obs(kv_cache_usage=0.53), policy.initial_state()).replicas == 4  # within 10 %


def test_aibrix_apa_scale_down_waits_for_cooldown_and_the_inverted_variant_does_not() -> None:
    seq = [obs(time=0.0, kv_cache_usage=0.5)] + [obs(time=float(t), kv_cache_usage=0.1) for t in range(10, 301, 10)]
    correct = run(AibrixApaPolicy(window=1.0), seq)
    # ratio 0.2 -> ceil(4 x 0.2) = 1, floored at floor(4 / 2) = 2; the 4 at t=0 holds for 300 s
    assert [d.replicas for d in correct[:-1]] == [4] * 30
    assert correct[-1].replicas == 2
    inverted = run(AibrixApaPolicy(window=1.0, inverted_stabilization=True), seq)
    assert inverted[1].replicas == 2  # AIBrix as shipped takes the window's minimum at once


def test_aibrix_apa_averages_over_its_window() -> None:
    seq = [obs(time=0.0, kv_cache_usage=0.5), obs(time=10.0, kv_cache_usage=1.1)]
    # mean 0.8 over 180 s -> ratio 1.6 -> 7
    assert run(AibrixApaPolicy(), seq)[-1].replicas == 7


# ---------------------------------------------------------------- KubeAI (substratusai/kubeai autoscaler.go @2f32ef4)


def test_kubeai_is_ceil_of_moving_average_over_target() -> None:
    policy = KubeAiPolicy(target_requests=100)
    assert policy.decide(obs(running=250.0, waiting=0.0, current=1), policy.initial_state()).replicas == 3
    # a cold window of ceil(30 / 10) = 3 samples: (0, 0, 300) averages 100 -> 1; a warm one (300 x 3) -> 3
    cold = KubeAiPolicy(target_requests=100, time_window=30.0, warm_start=False)
    warm = KubeAiPolicy(target_requests=100, time_window=30.0)
    assert cold.decide(obs(running=300.0, waiting=0.0, current=1), cold.initial_state()).replicas == 1
    assert warm.decide(obs(running=300.0, waiting=0.0, current=1), warm.initial_state()).replicas == 3


def test_kubeai_scales_down_on_the_fourth_consecutive_scale_down_decision() -> None:
    policy = KubeAiPolicy(target_requests=100, time_window=10.0)  # one-sample average
    seq = [obs(time=10.0 * i, current=5, running=200.0, waiting=0.0) for i in range(6)]
    replicas = [d.replicas for d in run(policy, seq)]
    assert replicas == [5, 5, 5, 2, 2, 2]


def test_kubeai_counter_resets_on_a_decision_that_is_not_a_scale_down() -> None:
    policy = KubeAiPolicy(target_requests=100, time_window=10.0)
    loads = [200.0, 200.0, 500.0, 200.0, 200.0, 200.0, 200.0]
    seq = [obs(time=10.0 * i, current=5, running=v, waiting=0.0) for i, v in enumerate(loads)]
    assert [d.replicas for d in run(policy, seq)] == [5, 5, 5, 5, 5, 5, 2]


# ------------------ llm-d KEDA + EPP (llm-d/llm-d guides/workload-autoscaling/README.slo-aware.md @d38c9f0)


def slo_obs(ttft: float | None, tpot: float | None = 0.01, **kw: Any) -> LabObservation:
    """An observation whose P90s over the last minute are ``ttft`` and ``tpot`` (None: no traffic, no quantile)."""
    extra = {"prometheus_up": 1.0}
    extra |= {} if ttft is None else {"p90_ttft_1m": ttft}
    extra |= {} if tpot is None else {"p90_tpot_1m": tpot}
    return obs(extra=extra, **kw)


def test_llmd_saturation_is_the_worse_p90_over_its_slo_and_zero_without_traffic() -> None:
    law = LlmdSloPolicy()  # S_ttft 3 s, S_tpot 100 ms
    assert law.saturation_raw(slo_obs(1.5, 0.02)) == pytest.approx(0.5)  # TTFT 1.5 / 3 beats TPOT 0.02 / 0.1
    assert law.saturation_raw(slo_obs(0.3, 0.08)) == pytest.approx(0.8)
    assert law.saturation_raw(slo_obs(None, None)) == 0.0


def test_llmd_formula_scales_up_credited_down_uncredited_and_holds_in_the_band() -> None:
    law = LlmdSloPolicy()
    assert law.formula(1.1, 4, 4) == 8  # 4 + ceil(4 (1.1 / 0.55 - 1))
    assert law.formula(0.6, 4, 4) == 5  # 4 + ceil(4 x 0.0909)
    assert law.formula(1.1, 4, 2) == 4  # credit 2 / 4: 4 + ceil(4 (0.55 / 0.55 - 1)) = 4
    assert law.formula(0.55, 4, 4) == 4  # not above θ_up
    assert law.formula(0.40, 4, 4) == 4  # not below θ_dn
    assert law.formula(0.3, 4, 4) == 3  # 4 - floor(4 (1 - 0.3 / 0.4))
    assert law.formula(0.3, 4, 2) == 3  # the credit never reaches the scale-down branch
    assert law.formula(0.0, 4, 4) == 0


def test_llmd_scales_up_when_p90_ttft_over_its_target_passes_the_threshold() -> None:
    law = LlmdSloPolicy()
    times = [0.0, 15.0, 30.0, 45.0]
    below = run(law, [slo_obs(1.5, time=t) for t in times])  # s = 0.5: in the band
    assert [d.replicas for d in below] == [4, 4, 4, 4]
    above = run(law, [slo_obs(1.8, time=t) for t in times])  # s = 0.6 > 0.55: 4 + ceil(4 x 0.0909) = 5
    # the HPA's 30 s scale-up window keeps the count of t = 0 until it leaves (t - 30, t] at t = 30
    assert [d.replicas for d in above] == [4, 4, 5, 5]
    burst = run(law, [slo_obs(30.0, time=t) for t in times])  # s_raw 10 clamps to 2: formula 15 over 4 pods
    assert "formula 15 over 4 pods" in burst[0].reason
    assert burst[-1].replicas == 8  # the HPA's max(100 %, 4 pods) per 60 s


def test_llmd_smooths_the_clamped_signal_over_45_seconds() -> None:
    law = LlmdSloPolicy()
    seq = [slo_obs(30.0, time=0.0), *(slo_obs(None, None, time=t) for t in (15.0, 30.0, 45.0))]
    state = law.initial_state()
    means = []
    for o in seq:
        state = law.decide(o, state).state
        means.append(sum(v for _, v in state.clamped) / len(state.clamped))
    assert means == pytest.approx([2.0, 1.0, 2.0 / 3.0, 0.0])  # the t=0 sample leaves the (t-45, t] window at 45


def test_llmd_drains_one_pod_per_120s_after_its_180s_window() -> None:
    law = LlmdSloPolicy()
    state, current, changes = law.initial_state(), 8, []
    for t in range(0, 600, 15):  # an idle pool: s = 0, formula 0, clamped to the floor by the HPA
        d = law.decide(slo_obs(None, None, time=float(t), ready=current, current=current), state)
        state = d.state
        if d.replicas != current:
            changes.append((float(t), d.replicas))
        current = d.replicas
    # the count of t = 0 holds the 180 s window until t = 180; then 1 pod per 120 s
    assert changes == [(180.0, 7), (300.0, 6), (420.0, 5), (540.0, 4)]


def test_llmd_holds_when_prometheus_is_down() -> None:
    law = LlmdSloPolicy()
    d = law.decide(obs(extra={"prometheus_up": 0.0}, current=6), law.initial_state())
    assert d.replicas == 6 and "holding 6" in d.reason


def test_llmd_queue_overlay_races_queue_over_1_and_running_over_16_behind_a_300s_window() -> None:
    law = LlmdQueuePolicy()
    first = law.decide(obs(running=80.0, waiting=2.0), law.initial_state())
    assert "metric wants 5" in first.reason and first.replicas == 4  # max(ceil(2 / 1), ceil(80 / 16))
    assert "metric wants 7" in law.decide(obs(running=16.0, waiting=7.0), law.initial_state()).reason
    ups = run(law, [obs(time=float(t), running=80.0, waiting=2.0) for t in range(0, 316, 15)])
    assert [d.replicas for d in ups].index(5) == 20  # t = 300: the count of t = 0 left the 300 s window


# ---------------------------------------------------------------- Dynamo planner (sla_planner.md @240df6a)


def dynamo(**kw: Any) -> DynamoPlannerPolicy:
    return DynamoPlannerPolicy(prefill_tokens_per_replica=6000.0, decode_tokens_per_replica=200.0, **kw)


def test_dynamo_sizes_prefill_and_decode_and_takes_the_larger() -> None:
    # 10 req/s, ISL 3000, OSL 150: prefill ceil(30000 / 6000) = 5, decode ceil(1500 / 200) = 8
    o = obs(request_rate=10.0, prompt_tokens_rate=30000.0, generation_tokens_rate=1500.0)
    assert dynamo().decide(o, None).replicas == 8
    o = replace(o, arrival_rate=16.0)  # the frontend's request count drives next_requests
    assert dynamo().decide(o, None).replicas == math.ceil(16 * 150 / 200)


def test_dynamo_prefill_correction_only_lowers_the_load() -> None:
    o = obs(request_rate=10.0, prompt_tokens_rate=60000.0, generation_tokens_rate=100.0)  # prefill needs 10
    assert dynamo(expected_ttft=0.5).decide(replace(o, mean_ttft=0.25), None).replicas == 5  # x min(1, 0.5)
    assert dynamo(expected_ttft=0.5).decide(replace(o, mean_ttft=1.0), None).replicas == 10  # x min(1, 2)


def test_dynamo_decode_correction_reads_the_profile_at_the_corrected_itl() -> None:
    policy = dynamo(expected_itl=0.05, decode_profile=((0.025, 100.0), (0.05, 200.0)))
    o = obs(request_rate=10.0, prompt_tokens_rate=100.0, generation_tokens_rate=1500.0, mean_itl=0.1)
    assert policy.decide(o, None).replicas == 15  # ITL target 0.05 / 2 = 0.025 -> 100 tok/s per replica


def test_dynamo_holds_while_scaling_and_without_requests() -> None:
    assert dynamo().decide(obs(starting=2, current=6), None).replicas == 6
    assert dynamo().decide(obs(request_rate=0.0, current=6), None).replicas == 6


# ---------------------------------------------------------------- static and the default set


def test_static_returns_its_count_within_bounds() -> None:
    assert StaticPolicy(7).decide(obs(), None).replicas == 7
    assert StaticPolicy(70).decide(obs(max_replicas=10), None).replicas == 10


PROFILE = Profile(capacity=2.0, mean_latency=1.5, isl=3000.0, osl=150.0, max_num_seqs=256,
                  kv_capacity_tokens=1.0e6, mean_replicas=4.0, p90_ttft=0.5, p90_tpot=0.04)  # fmt: skip


def test_default_set_has_every_baseline_once_and_each_holds_when_prometheus_is_down() -> None:
    policies = baselines(PROFILE)
    names = [p.name for p in policies]
    assert len(set(names)) == len(names) == len(FAMILIES)
    assert isinstance(policies[0], StaticPolicy) and policies[0].replicas == 4
    silent = obs(
        current=6,
        request_rate=None,
        latency=None,
        waiting=None,
        running=None,
        kv_cache_usage=None,
        prompt_tokens_rate=None,
        generation_tokens_rate=None,
        extra={"prometheus_up": 0.0},  # what twin.observe.query reports with Prometheus down
    )
    for p in policies:
        if isinstance(p, StaticPolicy):
            continue
        d = p.decide(silent, p.initial_state())
        assert d.replicas == 6, p.name
        assert "holding 6" in d.reason, p.name


def test_grids_step_in_flight_targets_around_littles_law_and_build_every_setting() -> None:
    hpa = grid("hpa", PROFILE)
    built = {round(build("hpa", s, PROFILE).target, 6) for s in hpa if s["metric"] == "running+waiting"}  # type: ignore[attr-defined]
    assert built == {1.5, 2.1, 3.0, 4.2}  # 3.0 in flight x steps
    assert hpa[0] == {"metric": "waiting", "target": 5.0, "down_window": 300.0, "down_percent": 100.0,
                      "down_period": 15.0}  # fmt: skip
    for family in FAMILIES:
        for setting in grid(family, PROFILE):
            assert build(family, setting, PROFILE).name == baselines(PROFILE)[FAMILIES.index(family)].name
    with pytest.raises(ValueError, match="unknown baseline"):
        grid("autopilot", PROFILE)
    assert grid("llmd-keda", PROFILE)[0] == {"law": "slo-aware", "ttft_slo": 3.0, "tpot_slo": 0.1,
                                             "up_threshold": 0.55, "down_boundary": 0.40}  # fmt: skip


def test_a_relative_setting_builds_absolute_values_for_the_profile_it_is_given() -> None:
    other = replace(PROFILE, capacity=4.0, mean_latency=3.0, isl=500.0, osl=400.0, p90_ttft=2.0, p90_tpot=0.08)
    hpa = {"metric": "running+waiting", "target_per_inflight": 0.5, "down_window": 60.0, "down_percent": 10.0,
           "down_period": 60.0}  # fmt: skip
    assert build("hpa", hpa, PROFILE).target == pytest.approx(1.5)  # type: ignore[attr-defined]  # 0.5 x 2 x 1.5
    assert build("hpa", hpa, other).target == pytest.approx(6.0)  # type: ignore[attr-defined]  # 0.5 x 4 x 3
    slo = {"law": "slo-aware", "slo_per_profile": 0.7, "up_threshold": 0.55, "down_boundary": 0.40}
    a, b = build("llmd-keda", slo, PROFILE), build("llmd-keda", slo, other)
    assert (a.ttft_slo, a.tpot_slo) == pytest.approx((0.35, 0.028))  # type: ignore[attr-defined]
    assert (b.ttft_slo, b.tpot_slo) == pytest.approx((1.4, 0.056))  # type: ignore[attr-defined]
    dyn = {"tokens_per_capacity": 0.6, "interval": 180.0}
    assert build("dynamo-planner", dyn, PROFILE).prefill_tokens_per_replica == 3600  # type: ignore[attr-defined]
    assert build("dynamo-planner", dyn, other).prefill_tokens_per_replica == 1200  # type: ignore[attr-defined]
    # a published default stays as the manifest ships it, whatever the profile
    assert build("hpa", grid("hpa", other)[0], other).target == 5.0  # type: ignore[attr-defined]


def test_knative_target_is_the_annotation_not_the_batch_limit() -> None:
    # 4 ready at 12 in flight each; target 10 x 0.7 = 7 -> ceil(48 / 7) = 7 (with 1024 seats it would be 1)
    kpa = KpaPolicy(container_concurrency=1024, target=10.0)
    state = kpa.initial_state()
    d = kpa.decide(obs(time=0.0, ready=1, current=1, running=48.0, waiting=0.0), state)
    assert d.replicas == 7


def test_knative_scale_down_delay_keeps_the_max_over_its_window() -> None:
    kpa = KpaPolicy(container_concurrency=1024, target=10.0, scale_down_delay=30.0, stable_window=6.0)
    hot = [obs(time=float(t), ready=1, current=1, running=48.0, waiting=0.0) for t in (0, 2)]
    calm = [obs(time=float(t), ready=7, current=7, running=7.0, waiting=0.0) for t in range(10, 60, 2)]
    decisions = run(kpa, hot + calm)
    times = [o.time for o in hot + calm]
    by_time = dict(zip(times, (d.replicas for d in decisions), strict=True))
    assert by_time[30.0] == 7  # the 7 of t=2 is still inside the 30 s delay window
    assert by_time[58.0] < 7


def test_keda_on_in_flight_sums_running_and_waiting() -> None:
    keda = KedaPolicy(metric="running+waiting", threshold=10.0)
    d = keda.decide(obs(running=60.0, waiting=20.0), keda.initial_state())
    assert d.replicas == 8  # ceil(80 / 10)


@pytest.mark.parametrize("policy", baselines(PROFILE), ids=lambda p: p.name)
def test_every_baseline_runs_a_step_in_demand_and_stays_in_bounds(policy: Policy) -> None:
    seq = [obs(time=float(t), running=8.0, waiting=0.0) for t in range(0, 300, 15)]
    seq += [
        obs(
            time=float(t),
            running=64.0,
            waiting=80.0,
            kv_cache_usage=0.95,
            request_rate=12.0,
            arrival_rate=40.0,
            prompt_tokens_rate=36000.0,
            generation_tokens_rate=1800.0,
        )
        for t in range(300, 1200, 15)
    ]
    decisions = run(policy, seq)
    assert all(1 <= d.replicas <= 100 for d in decisions)
    assert all(d.reason for d in decisions)
