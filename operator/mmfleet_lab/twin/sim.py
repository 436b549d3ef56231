"""``simulate``: a policy, or the shipped autoscaler, driving a simulated fleet through a scenario;
``capacity_at_slo``: mu_SLO."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable

import numpy as np

from mmfleet.api import SloSpec, clamp_replicas, seconds
from mmfleet.autoscaler import cycle
from mmfleet_lab.twin.compiled import CompiledEngine
from mmfleet_lab.twin.encode import EncodeFleet, EncodeTier
from mmfleet_lab.twin.engine import CLIENT_TIMEOUT_S, Engine, Workload
from mmfleet_lab.twin.fleet import Fleet
from mmfleet_lab.twin.observe import Prometheus, query
from mmfleet_lab.twin.policy import LabObservation, Policy
from mmfleet_lab.twin.replica import ReplicaParams
from mmfleet_lab.twin.shipped import Shipped, fleet, signals
from mmfleet_lab.twin.types import Requests, RunResult, Scenario

TAIL_S = 300.0  # after the horizon, in-flight requests may finish for this long (no decisions, no GPU billing)
OUTAGE = "Prometheus unreachable (the twin's metrics outage)"
EngineFactory = Callable[[ReplicaParams, Workload], Engine]


def _on_grid(t: float, step: float, phase: float = 0.0) -> float:
    """The next multiple of ``step`` (plus ``phase``) strictly after ``t``."""
    k = math.floor((t - phase) / step + 1e-9) + 1
    return phase + k * step


def simulate(
    scenario: Scenario,
    policy: Policy | Shipped,
    *,
    params: ReplicaParams,
    cold_start: float,
    slo: SloSpec,
    min_replicas: int = 1,
    max_replicas: int = 64,
    initial_replicas: int | None = None,
    scrape_interval: float = 15.0,
    gpus_available: int | None = None,
    gpus_per_replica: int = 1,
    metrics_outage: tuple[float, float] | None = None,
    seed: int = 0,
    rate_window: float = 60.0,
    start: float = 0.0,
    timeout: float = CLIENT_TIMEOUT_S,
    engine: EngineFactory = CompiledEngine,
    standby: int = 0,
    wake: float = 0.0,
    encode: EncodeTier | None = None,
) -> RunResult:
    """Run ``policy`` on a fleet serving ``scenario`` and return what happened.

    The policy is called every ``policy.interval`` seconds, from the first multiple of it that is
    at least ``start`` (and past 0): until then the fleet serves at its initial size. A ``Policy``
    sees a ``LabObservation`` built only from scraped metrics and API-server counts; ``Shipped`` (the
    operator's ``cycle.decide``) sees what the operator's loop reads, for a fleet with ``slo`` and
    these replica bounds. The replicas decided are clamped to [min_replicas, max_replicas] and
    applied at once. The run starts with ``initial_replicas`` (default ``min_replicas``) Ready pods.
    ``seed`` sets the phase of the scrape grid (Prometheus spreads scrapes over the interval); the
    engine is deterministic (``engine`` builds it; tests pass the reference engine). After
    ``scenario.duration`` in-flight requests may finish for up to ``TAIL_S`` s; GPU time is counted
    up to the duration only. A request not finished ``timeout`` s after its arrival is abandoned by
    its client (``Engine.run``). Requests abandoned or never finished have latency ``np.inf``. ``standby``: replicas
    kept asleep beside the policy's (``spec.autoscaling.warmStandby``), woken in ``wake`` s (``twin.fleet``).
    ``encode``: an encode tier in front of the serving replicas (E/PD, ``twin.encode``), scaled by its own policy; its
    pods are not bound by ``gpus_available`` and its GPU time is ``RunResult.encode_gpu_seconds``.
    """
    req = scenario.requests
    horizon = float(scenario.duration)
    work = Workload.build(req, params, timeout)
    eng = engine(params, work)
    tiers = None
    if encode is not None:
        if not isinstance(eng, CompiledEngine):
            raise ValueError("an encode tier needs the compiled engine")
        tiers = EncodeFleet(encode, params, req, timeout, cold_start)
    initial = min_replicas if initial_replicas is None else initial_replicas
    initial = clamp_replicas(initial, min_replicas, max_replicas)
    pods = Fleet(
        eng,
        cold_start=cold_start,
        initial=initial,
        gpus_per_replica=gpus_per_replica,
        gpus_available=gpus_available,
        standby=standby,
        wake=wake,
    )
    prom = Prometheus()
    picker_held = (
        0.0  # requests held in front of the servers (flow control, no Ready pod) as Prometheus last scraped it
    )
    phase = float(np.random.default_rng(seed).uniform(0.0, scrape_interval)) if seed else 0.0
    inference = (
        fleet(slo, min_replicas, max_replicas, policy.capacity_per_replica, policy.encode)
        if isinstance(policy, Shipped)
        else None
    )
    state = policy.initial_state()
    decisions: list[tuple[float, int, str]] = []
    n_sec = math.ceil(horizon)
    times = np.arange(n_sec, dtype=float)
    tl = {
        k: np.zeros(n_sec)
        for k in ("ready", "starting", "desired", "unschedulable", "draining", "held", "encode_ready", "encode_desired")
    }
    encode_decisions: list[tuple[float, int]] = []
    target, window = seconds(slo.target), seconds(slo.window)

    def down(t: float) -> bool:
        return metrics_outage is not None and metrics_outage[0] <= t < metrics_outage[1]

    def held_now() -> float:
        """Requests held in front of the servers: at the gateway with no Ready pod, or by the picker's flow control."""
        return float(pods.held.size) + (float(eng.held()) if isinstance(eng, CompiledEngine) else 0.0)

    def sample(k: int) -> None:
        tl["ready"][k] = pods.count("ready")
        tl["starting"][k] = pods.count("starting")
        tl["unschedulable"][k] = pods.count("unschedulable")
        tl["draining"][k] = pods.count("draining")
        tl["desired"][k] = pods.desired
        tl["held"][k] = held_now()
        if tiers is not None:
            tl["encode_ready"][k] = tiers.pods.count("ready")
            tl["encode_desired"][k] = tiers.pods.desired

    def decide(t: float) -> tuple[int, str]:
        """Ask the policy, with what it would see at ``t``; keeps its memory in ``state``."""
        nonlocal state, picker_held
        up = not down(t)
        view = query(
            prom, t, slo_metric=slo.metric, slo_percentile=slo.percentile, slo_window=window,
            rate_window=rate_window, up=up,
        )  # fmt: skip
        ready, starting, unschedulable = pods.serving_counts()
        if isinstance(policy, Shipped):
            assert inference is not None
            seen = cycle.Seen(
                pods.desired,
                cycle.Pods(
                    ready,
                    starting,
                    unschedulable,
                    cold_start=pods.measured_cold_start(),
                    asleep=pods.count("asleep"),
                    wake=pods.measured_wake(),
                ),
                signals(view, picker_held if policy.picker_held else 0.0, picker_held if min_replicas == 0 else None)
                if up
                else None,
                None if up else OUTAGE,
            )
            outcome = policy.decide(inference, seen, t, state)
            state = outcome.memory
            return outcome.replicas, outcome.reason
        obs = LabObservation(
            time=t,
            ready=ready,
            starting=starting,
            unschedulable=unschedulable,
            current=pods.desired,
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            slo_target=target,
            slo_percentile=slo.percentile,
            cold_start=cold_start,
            request_rate=view.request_rate,
            arrival_rate=view.arrival_rate,
            latency=view.latency,
            waiting=view.waiting,
            running=view.running,
            kv_cache_usage=view.kv_cache_usage,
            prompt_tokens_rate=view.prompt_tokens_rate,
            generation_tokens_rate=view.generation_tokens_rate,
            mean_ttft=view.mean_ttft,
            mean_itl=view.mean_itl,
            # Knative's activator reports the requests it buffers to the autoscaler at once, not through a scrape.
            extra={**view.extra, "held_now": float(pods.held.size)},
            held=picker_held,
        )
        decision = policy.decide(obs, state)
        state = decision.state
        return decision.replicas, decision.reason

    def serve(t0: float, t1: float, idx: np.ndarray) -> None:
        if tiers is None:
            pods.run(t0, t1, idx)
        else:
            assert isinstance(eng, CompiledEngine)
            tiers.run(pods, eng, t0, t1, idx)

    def transitions(t: float) -> None:
        pods.transitions(t)
        if tiers is not None:
            tiers.pods.transitions(t)

    arrivals = work.arrival
    pos = 0
    t = 0.0
    next_scrape = phase
    next_decision = policy.interval * max(1, math.ceil(start / policy.interval - 1e-9))
    next_second = 0.0
    next_encode = encode.interval if encode is not None else math.inf
    while True:
        if next_scrape <= t + 1e-9:
            if not down(t):
                picker_held = held_now()
                prom.scrape(
                    t,
                    [
                        (p.pid, eng.book.export(p.rid), eng.gauges(p.rid))
                        for p in pods.scrape_targets()
                        if p.rid is not None
                    ],
                )
            next_scrape = _on_grid(t, scrape_interval, phase)
        if next_decision <= t + 1e-9:
            replicas, reason = decide(t)
            want = clamp_replicas(int(replicas), min_replicas, max_replicas)
            if want != pods.desired:
                pods.scale(want, t)
                decisions.append((t, want, reason))
            next_decision = t + float(policy.interval)
        if tiers is not None and next_encode <= t + 1e-9:
            scaled = tiers.decide(t)
            if scaled is not None:
                encode_decisions.append((t, scaled))
            next_encode = t + tiers.tier.interval
        if next_second <= t + 1e-9:
            k = round(next_second)
            if k < n_sec:
                sample(k)
            next_second = k + 1.0
        if t >= horizon - 1e-9:
            break
        t_next = min(next_scrape, next_decision, next_second, next_encode, pods.next_event(), horizon)
        if tiers is not None:
            t_next = min(t_next, tiers.pods.next_event())
        end = int(np.searchsorted(arrivals, t_next, side="left"))
        serve(t, t_next, np.arange(pos, end, dtype=np.int64))
        pos = end
        t = t_next
        transitions(t)
    gpu_s, start_s = pods.gpu_seconds(horizon)
    # let in-flight requests finish (arrivals after the horizon, if any, are never served)
    t_end = horizon + TAIL_S
    while t < t_end and (pods.held.size or int(eng.outstanding().sum()) > 0 or (tiers is not None and tiers.busy())):
        t_next = min(t + 10.0, t_end)
        serve(t, t_next, np.zeros(0, dtype=np.int64))
        t = t_next
        transitions(t)
    out = eng.outcomes
    return RunResult(
        arrival=arrivals.copy(),
        e2e=out.e2e.copy(),
        ttft=out.ttft.copy(),
        itl=out.itl.copy(),
        times=times,
        ready=tl["ready"],
        starting=tl["starting"],
        desired=tl["desired"],
        gpu_seconds=gpu_s,
        decisions=decisions,
        unschedulable=tl["unschedulable"],
        draining=tl["draining"],
        held=tl["held"],
        starting_gpu_seconds=start_s,
        cached=out.cached.copy(),
        rejected=eng.rejected() if isinstance(eng, CompiledEngine) else 0,
        holds=pods.holds(horizon),
        gpus_per_replica=pods.gpus_per_replica,
        encode_gpu_seconds=tiers.pods.gpu_seconds(horizon)[0] if tiers is not None else 0.0,
        encode_ready=tl["encode_ready"],
        encode_desired=tl["encode_desired"],
        encode_decisions=encode_decisions,
    )


# ------------------------------------------------------------------------------- capacity at SLO
CAPACITY_DURATION_S = 300.0  # simulated seconds per probe
CAPACITY_WARMUP_S = 60.0  # requests arriving before this are not measured
CAPACITY_SAMPLES = 2000  # requests drawn from the mix per probe (at most)
_CAPACITY_CACHE: dict[tuple[object, ...], dict[float, float]] = {}


def mix_key(requests: Requests) -> str:
    """A digest of a request mix (tokens and images), independent of arrival times."""
    h = hashlib.sha1()
    for a in (requests.input_tokens, requests.output_tokens, requests.images, requests.tokens_per_image):
        h.update(np.ascontiguousarray(np.asarray(a, dtype=float)).tobytes())
    return h.hexdigest()


def probe_latency(params: ReplicaParams, requests: Requests, slo: SloSpec, rate: float, *, seed: int = 0) -> float:
    """The SLO percentile of one replica fed Poisson arrivals at ``rate`` from the mix (steady part)."""
    rng = np.random.default_rng(seed)
    n = len(requests)
    count = int(min(CAPACITY_SAMPLES, max(rate * CAPACITY_DURATION_S, 50)))
    pick = rng.integers(0, n, size=count)
    gaps = rng.exponential(1.0, size=count)  # common random numbers: the same unit-rate gaps at every rate
    arrival = np.cumsum(gaps) / rate
    probe = requests.take(pick, arrival)
    work = Workload.build(probe, params)
    eng = CompiledEngine(params, work)
    eng.add_replica()
    horizon = float(arrival[-1]) + 1.0
    eng.run(0.0, horizon, np.arange(count, dtype=np.int64), np.array([0]))
    t = horizon
    while int(eng.outstanding().sum()) > 0 and t < horizon + TAIL_S:
        eng.run(t, t + 10.0, np.zeros(0, dtype=np.int64), np.array([0]))
        t += 10.0
    lat = {"e2e": eng.outcomes.e2e, "ttft": eng.outcomes.ttft, "itl": eng.outcomes.itl}[slo.metric]
    warm = min(CAPACITY_WARMUP_S, 0.2 * float(arrival[-1]))
    sel = lat[arrival >= warm]
    return float(np.percentile(sel, slo.percentile)) if sel.size else math.inf


def capacity_at_slo(params: ReplicaParams, requests: Requests, slo: SloSpec) -> float:
    """mu_SLO: the highest steady arrival rate (req/s) one replica sustains with the SLO met.

    Probes a single replica with Poisson arrivals drawn from the mix (the same random numbers at
    every rate), bracketing then bisecting to 3% on the rate. Probe results are cached per
    (params, mix, metric, percentile), so different targets reuse them; the answer is the first
    crossing of the target on the running maximum of the probed latencies, which makes it monotone
    in the target.
    """
    key = (params, mix_key(requests), slo.metric, slo.percentile)
    probes = _CAPACITY_CACHE.setdefault(key, {})
    target = seconds(slo.target)

    def f(rate: float) -> float:
        r = round(rate, 6)
        if r not in probes:
            probes[r] = probe_latency(params, requests, slo, r)
        return probes[r]

    lo, hi = 0.0, 1.0
    if f(hi) > target:
        while hi > 1e-3 and f(hi) > target:
            lo, hi = 0.0, hi / 2.0
        if f(hi) > target:
            return 0.0
    while f(hi) <= target and hi < 1e4:
        lo, hi = hi, hi * 2.0
    lo = max(lo, hi / 2.0) if f(hi / 2.0) <= target else lo
    while hi - lo > 0.03 * hi:
        mid = (lo + hi) / 2.0
        if f(mid) <= target:
            lo = mid
        else:
            hi = mid
    # first crossing on the running maximum of everything probed for this mix
    rates = sorted(probes)
    best = 0.0
    worst = -math.inf
    for r in rates:
        worst = max(worst, probes[r])
        if worst > target:
            break
        best = r
    return best
