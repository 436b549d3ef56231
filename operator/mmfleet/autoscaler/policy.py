"""mmfleet's own policy: size the fleet for the demand it will see when new pods are Ready.

Why not a proportional controller like the HPA: a GPU pod serves only a cold start L after it is
asked for, so a controller that sizes for today's load is L late, and then too small to drain what
queued meanwhile. The answer to such a dead time is a feed-forward predictor with a feedback
correction (Hellerstein, Diao, Parekh and Tilbury, *Feedback Control of Computing Systems*, Wiley
2004); this policy is one, with few knobs:

- feed-forward: the demand forecast over L plus one interval, over the capacity of a replica at the
  SLO, μ_SLO, learned online. The forecast is an upper quantile: a fast EWMA level
  plus z × a robust noise estimate, plus a robust trend (Theil-Sen on both halves of the last
  five minutes), which a sustained ramp has and a step does not; and at least today's demand
  grown by how much this fleet's own demand rises within that horizon at the SLO's percentile,
  learned from its last half hour (``rise_quantile``), at most doubling it: a
  fleet sized for today's demand misses windows whenever demand rises before a pod ordered now is
  Ready, and how much it rises is the workload's, not a constant (unless an envelope is held, next);
- a demand that swings faster than a pod starts (it rose by more than ``SWING`` within one rate window at the
  SLO's percentile in a cycle of the last ``ENVELOPE_WINDOW``) is not chased: below its envelope, the highest demand
  of that window, the forecast is the envelope, so the fleet holds for its peaks as a static fleet would instead of
  ordering pods that arrive after each burst and releasing them before the next; at a new high the forecast is as
  above; no demand is held, and a fleet that went to zero holds no peak from before it. Not where the user set a
  scale-down delay: it then says alone how long demand must stay lower before replicas go, and the fleet follows;
- backlog: the queue projected to the moment a pod asked for now would be Ready if today's demand
  holds, given the pods already starting (their order times are remembered), drained in
  ``drain_time`` by Q / (μ_SLO × drain_time) extra replicas for a backlog of Q, at most as many
  again as the demand needs and at most as many as are Ready: queues stay on the pods they were
  sent to, so new pods serve new arrivals while the Ready ones drain what they hold;
- the trend is extrapolated over L, but never beyond the five minutes it was fitted on;
- feedback: when the observed percentile is over target although the Ready count has not changed
  for a whole latency window, the queue is not draining and the replicas are busy, at least
  ready × observed / target;
- a warm standby's replicas asleep come in a wake, not L: the serving replicas are sized for the forecast over a
  wake plus one interval, and with those asleep for the forecast over L (the wake once the fleet has measured one);
- pods still starting are capacity on the way: every number above is an absolute replica count,
  set as the Deployment's replicas, which already include them, so nothing is asked for twice;
- up at once; down only to the highest recommendation of the last max(300 s, L): the HPA's default
  downscale stabilization window (kubernetes/kubernetes
  ``pkg/controller/podautoscaler/config/v1alpha1/defaults.go`` @85643c0f), and at least L, because
  removing a pod that is needed again within L costs a cold start (ski rental: Lin, Wierman, Andrew
  and Thereska, "Dynamic right-sizing for power-proportional data centers", INFOCOM 2011);
  never below the demand's learned rise over two such windows, the horizon in which a scale-down
  that is undone counts as a reversal (while an envelope is held, the envelope instead);
  never while the percentile is over target and the queue is not shrinking (a shrinking queue is
  the past being served), only when it frees a tenth of the fleet, and at most
  once every two minutes: a slowly falling window maximum is followed in a few steps, not one pod
  at a time (each step down that demand soon reverses is a reversal and a cold start paid);
- a throughput seen within the SLO is only a lower bound on μ_SLO: a fleet that starts oversized and is sized by
  it stays oversized, its replicas never busier than they were. Until the fleet comes near its knee (the SLO's
  percentile over half the target, or a queue over half what the Ready replicas clear within it), the capacity
  assumed for sizing grows above the learned one while the fleet holds steady above minReplicas (time constant
  20 minutes, at most 1.5 times it, reached after about 8), so the fleet shrinks until its replicas show what they
  can do; the first time it comes near, the probe ends (for the operator's life: its memory is not kept across a
  restart). The probe sizes scale-ups too while it runs. A profiled μ_SLO is the user's word and is not probed;
- replicas too idle to have tested a learned μ_SLO (under ``MIN_HELD`` request in flight each on average over the
  rate window, none waiting) are neither grown on it nor held up by it on the way down: a near-empty model's learned
  μ_SLO is what arrived; a request waiting, more in flight, or the latency feedback still grows the fleet;
- silence is not zero: a missing metric holds the current count; unschedulable pods stop growth;
- no single sample decides much: growth per cycle is capped as the HPA's default scale-up policy
  caps it (the larger of 4 pods and 100 % per 15 s: kubernetes/kubernetes
  ``pkg/apis/autoscaling/v2/defaults.go``), μ_SLO is raised only by a throughput seen in
  consecutive cycles (the least of them), and it decays toward what the replicas serve while they
  miss the target with a queue that does not drain and no pod on order, so a glitch neither holds a fleet small nor
  sends it to maxReplicas; a partial scrape (fewer pods reporting than are Ready) never scales down.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from itertools import combinations, pairwise

from mmfleet.api import clamp_replicas, duration_text
from mmfleet.autoscaler import Decision, Observation

FAST_WINDOW = 60.0  # s, time constant of the demand level: follows a step within about a minute
TREND_WINDOW = 300.0  # s of demand samples behind the trend and the spread
RISE_WINDOW = 1800.0  # s of demand samples behind the learned rise over the horizon
RISE_LAG = 60.0  # s, the lag of the demand changes behind the rise: one rate window
MAX_RISE = 1.0  # the learned rise at most doubles the demand
MIN_RISE_PAIRS = 8  # demand changes needed before the rise is believed (two minutes at a 15 s interval)
QUANTILE_Z = 1.28  # the forecast's upper quantile, q90 of a normal
TREND_CAP = 0.5  # the trend adds at most half the level over the horizon
BACKLOG_RATIO = 1.0  # the backlog adds at most this share of the demand's replicas
MAX_FEEDBACK_RATIO = 2.0  # latency feedback at most doubles the Ready replicas, and the feed-forward
BUSY = 0.5  # latency feedback needs replicas serving at least half of μ each
CAPACITY_FLOOR = 0.25  # the capacity correction never believes a replica does less than a quarter of μ
CAPACITY_RECOVERY = 300.0  # s, time constant for the correction to return to 1 while the SLO holds
DOWN_MARGIN = 0.1  # scale down only when it frees at least this share of the fleet (and one pod)
DOWN_PAUSE = 120.0  # s between scale-downs, so a falling window maximum is followed in few steps
REVERSAL_WINDOWS = 2.0  # a scale-down undone within this many down windows is a reversal (the benchmark's horizon)
STEP_PERIOD = 15.0  # s: within any such period the fleet grows by at most the larger of ``step_pods`` pods and
# ``step_ratio`` times the replicas it had (the HPA's default scale-up policies: 4 pods, 100 %)
# μ_SLO is raised only by a throughput seen this many cycles in a row within the SLO, the least of them: one outlier
# teaches nothing (why 2: docs/autoscaling.md, Design notes).
CAPACITY_SAMPLES = 2
# A fleet near its knee: the SLO's percentile over this share of the target, or a queue over this share of what the
# Ready replicas clear within the target. Until one is seen, μ_SLO learned is only a lower bound (docs/autoscaling.md,
# Design notes).
KNEE_LATENCY = 0.5
KNEE_QUEUE = 0.5
PROBE_TIME = 1200.0  # s, time constant of the probe's growth above the learned μ_SLO while the knee has not been seen
PROBE_MAX = 1.5  # the probe assumes at most this times the learned μ_SLO
CAPACITY_DECAY = 60.0  # s, time constant of μ_SLO's fall toward what saturated replicas missing the target serve
# Replicas holding fewer requests in flight than this each on average over the rate window, none waiting, are idle
# most of the time: a batching server is far from its knee there, and a μ_SLO learned from such replicas is their
# arrivals, not what they can serve, so the forecast does not size the fleet on it (docs/autoscaling.md, Design notes).
MIN_HELD = 1.0
# A request mix heavier than the one μ_SLO was learned at by less than this reads as the same, and only the growth
# beyond it counts: the mix of the requests finished over one rate window varies about that much by itself
# (docs/autoscaling.md, Design notes).
MIX_TOLERANCE = 0.1
# Demand that rises by more than this share within one rate window (``RISE_LAG``) at the SLO's percentile swings faster
# than a GPU pod starts: the fleet is sized for the envelope of its last ``ENVELOPE_WINDOW`` s instead of following it.
# Steady training and validation traces rise at most 0.2 within a minute (docs/autoscaling.md, Design notes).
SWING = 0.25
ENVELOPE_WINDOW = 900.0

Samples = tuple[tuple[float, float], ...]
Mix = tuple[float, float]  # prompt and output tokens per request


@dataclass(frozen=True)
class SloState:
    """What ``SloPolicy`` remembers between cycles."""

    time: float | None = None  # of the last observation with metrics
    inflights: Samples = ()  # (time, running + waiting) over the rate window, for demand without arrival_rate
    level: float | None = None  # fast EWMA of demand, req/s
    demand: Samples = ()  # (time, req/s) over the rise window (the trend reads its last TREND_WINDOW)
    learned_capacity: float | None = None  # best throughput per Ready replica held for a rate window within the SLO
    streak: Samples = ()  # (time, throughput per Ready replica) of the last cycles in a row that could teach μ_SLO
    streak_mix: tuple[Mix | None, ...] = ()  # the request mix of each of those cycles, None where not known
    mix: Mix | None = None  # the request mix μ_SLO was learned at, None if not known
    capacity_scale: float = 1.0  # <= 1: replicas with a standing queue served less than assumed
    recommendations: tuple[tuple[float, int], ...] = ()  # (time, replicas needed) in the down window
    history: tuple[tuple[float, int, float], ...] = ()  # (time, ready, waiting) over the latency window
    orders: tuple[tuple[float, int], ...] = ()  # (time, pods added) by our scale-ups, last cold start
    last_down: float | None = None  # time of our last scale-down
    probe: float = 1.0  # >= 1: the capacity assumed over the learned one until the fleet comes near its knee
    knee_seen: bool = False  # the fleet has come near its knee: the learned μ_SLO was tested, the probe is over
    swing: float | None = None  # the last cycle's rise within ``RISE_LAG`` (``SWING``); None: too few changes yet
    swung: float | None = None  # time of the last cycle whose swing was over ``SWING``
    zeroed: float | None = None  # when the operator last scaled the fleet to zero (``cycle``): it ends the hold
    envelope: float | None = None  # while demand swings (``SWING``): its peak, held for when demand is below it


@dataclass(frozen=True)
class Sizing:
    """How one decision was reached; the reason sentence is built from it."""

    demand: float
    forecast: float
    horizon: float
    capacity: float | None
    feedforward: int | None  # forecast and backlog alone
    needed: int
    backlog: float  # requests projected to be queued when a pod asked for now is Ready
    feedback: int | None
    draining: bool  # the queue is shorter than a latency window ago
    probe: float  # the capacity's factor over the learned μ_SLO (``SloState.probe``)
    standing_in: int = 0  # replicas asleep counted for the demand beyond a wake (warm standby)
    sparse: bool = False  # the replicas are too idle to have tested the learned μ_SLO (``MIN_HELD``)
    untested: bool = False  # so the forecast, which asked for more than the fleet, was not followed
    heavier: float = 1.0  # the work per request over what it was when μ_SLO was learned (``heavier``)
    held: float | None = None  # the envelope the forecast holds while demand swings below it (``SWING``)


def _v(value: float) -> str:
    return f"{value:.3g}"


def _ewma(previous: float, value: float, dt: float, window: float) -> float:
    """An exponentially weighted mean with a time constant, so any decision interval works."""
    return previous + (1.0 - math.exp(-dt / window)) * (value - previous)


def _theil_sen(samples: Samples) -> float:
    slopes = [(v2 - v1) / (t2 - t1) for (t1, v1), (t2, v2) in combinations(samples, 2) if t2 > t1]
    return statistics.median(slopes) if slopes else 0.0


def robust_trend(samples: Samples) -> tuple[float, float]:
    """A demand trend that a ramp has and a step does not, and the noise around it.

    Trend: Theil-Sen slopes (medians of pairwise slopes) of the older and the newer half of the
    window; a ramp gives both its slope, a step sits in at most one half and leaves the other flat,
    so the one nearer zero is taken (zero if they disagree in sign). Noise: the median absolute
    change between successive samples once the trend is removed, over 0.954 (a normal's σ); one
    jump does not move a median.
    """
    if len(samples) < 6:
        return 0.0, 0.0
    middle = samples[0][0] + (samples[-1][0] - samples[0][0]) / 2
    older = _theil_sen(tuple(s for s in samples if s[0] <= middle))
    newer = _theil_sen(tuple(s for s in samples if s[0] >= middle))
    slope = 0.0 if older * newer <= 0 else min(older, newer, key=abs)
    changes = [abs(v2 - v1 - slope * (t2 - t1)) for (t1, v1), (t2, v2) in pairwise(samples)]
    return slope, statistics.median(changes) / 0.954


def rise_quantile(samples: Samples, horizon: float, percentile: float) -> float:
    """How much demand rises over ``horizon`` at ``percentile``, relative, as this fleet's own demand varies.

    The log changes of demand over ``RISE_LAG`` are taken as a random walk: their spread, by the median
    absolute deviation, which a spike's few steps do not move, grows with the square root of the horizon.
    Taken over a short lag (``RISE_LAG``), so that a step taints few pairs (docs/autoscaling.md, Design notes).
    0 until there are enough pairs to say anything about the workload.
    """
    logs = _log_changes(samples)
    if len(logs) < MIN_RISE_PAIRS:
        return 0.0
    center = statistics.median(logs)
    spread = statistics.median(abs(x - center) for x in logs) / 0.6745
    z = statistics.NormalDist().inv_cdf(min(max(percentile, 50.0), 99.9) / 100)
    return math.exp(z * spread * math.sqrt(max(horizon, RISE_LAG) / RISE_LAG)) - 1.0


def _log_changes(samples: Samples) -> list[float]:
    """The log changes of demand over ``RISE_LAG``, each sample against the first at least that much later."""
    times = [t for t, _ in samples]
    logs: list[float] = []
    j = 0
    for i, (t, value) in enumerate(samples):
        j = max(j, i + 1)
        while j < len(samples) and times[j] < t + RISE_LAG - 1e-9:
            j += 1
        if j == len(samples):
            break
        if value > 0 and samples[j][1] > 0:
            logs.append(math.log(samples[j][1] / value))
    return logs


def swinging(swung: float | None, now: float, demand: float) -> bool:
    """A demand over ``SWING`` in a cycle of the last ``ENVELOPE_WINDOW`` that has not gone to nothing: what the policy
    holds an envelope for (where the user set no scale-down delay) and ``DemandSwings`` reports."""
    return swung is not None and now - swung < ENVELOPE_WINDOW and demand > 0


def partial_scrape(obs: Observation) -> bool:
    """Fewer pods report than are Ready: the sums miss pods, so the fleet looks less loaded than it is."""
    return obs.reporting is not None and obs.reporting < obs.ready


def heavier(now: Mix | None, learned_at: Mix | None) -> float:
    """How much more work a request is now than when μ_SLO was learned: the mean growth of its prompt and its output
    tokens, less ``MIX_TOLERANCE``, at least 1. A lighter mix is not read as more capacity: what the replicas then
    serve within the SLO teaches that."""
    if now is None or learned_at is None or min(learned_at) <= 0:
        return 1.0
    growth = statistics.fmean(n / r for n, r in zip(now, learned_at, strict=True))
    return max(1.0, growth - MIX_TOLERANCE)


def _mean_mix(mixes: tuple[Mix | None, ...]) -> Mix | None:
    """The mix a streak was served at: the mean of the readings it has (a query refused in one cycle loses no label)."""
    known = [m for m in mixes if m is not None]
    if not known:
        return None
    return statistics.fmean(m[0] for m in known), statistics.fmean(m[1] for m in known)


def projected_backlog(
    queued: float,
    demand: float,
    ready: int,
    starting_ready_at: list[float],
    now: float,
    horizon: float,
    capacity: float,
) -> float:
    """The queue at ``now + horizon`` if demand holds and each starting pod is Ready at its time.

    Replicas drain at ``capacity`` each, which is μ_SLO: slower than a saturated replica really
    serves, so the projection errs towards a longer queue.
    """
    queue, clock, serving = queued, now, ready
    for at in [*sorted(starting_ready_at), math.inf]:
        until = min(max(at, now), now + horizon)
        queue = max(0.0, queue + (demand - capacity * serving) * (until - clock))
        clock = until
        if clock >= now + horizon:
            break
        serving += 1
    return queue


@dataclass(frozen=True)
class SloPolicy:
    """Scale so the SLO percentile stays under target through spikes, on as few GPUs as that allows.

    μ_SLO is learned online, conservatively, as the best throughput per Ready replica held for
    ``CAPACITY_SAMPLES`` cycles in a row while the SLO held; being what a replica did within the SLO,
    it gets no headroom; until the fleet comes near its knee it is a lower bound, and the capacity sized with is
    probed above it (``SloState.probe``); it decays toward what replicas serve while they miss the target with a
    standing queue and no pod starting. ``drain_time``: seconds in which a backlog should clear once new pods are Ready.
    ``stabilization``: the scale-down window, default max(300 s, L); where it is set (the user's
    ``scaleDownDelay``) no swinging demand's envelope is held (``SWING``): the window alone holds the fleet.
    ``settle``: how far back the latency and rate signals reach (the SLO window). ``rate_window``: the window of the
    request rate, over which in-flight growth is taken too. ``capacity_per_replica``: μ_SLO from a profile
    (``spec.autoscaling.capacityPerReplica``), believed from the first cycle; what is learned online
    only raises it, and the standing-queue correction lowers either. ``step_pods``, ``step_ratio``:
    the most the fleet grows within ``STEP_PERIOD``, the larger of the two.
    """

    name: str = "mmfleet"
    interval: float = 15.0
    drain_time: float = 60.0
    stabilization: float | None = None
    settle: float = 60.0
    capacity_per_replica: float | None = None
    rate_window: float = 60.0
    step_pods: int = 4
    step_ratio: float = 1.0

    def initial_state(self) -> SloState:
        return SloState()

    def down_window(self, obs: Observation) -> float:
        return self.stabilization if self.stabilization is not None else max(300.0, obs.cold_start)

    def decide(self, observation: Observation, state: SloState) -> Decision:
        obs = observation
        low, high, current = obs.min_replicas, obs.max_replicas, obs.current
        missing = [
            name
            for name, value in (
                (f"P{obs.slo_percentile:g} latency", obs.latency),
                ("request rate", obs.request_rate),
                ("queue length", obs.waiting),
            )
            if value is None
        ]
        if missing:
            held = clamp_replicas(current, low, high)
            return Decision(held, f"metrics missing ({', '.join(missing)}): holding {held}", state)

        state, sizing = self._size(obs, state)

        window = self.down_window(obs)
        # The first decision counts the current size as a recommendation: no scale-down before a whole
        # window of observations, whatever the first (often half-filled) rate windows say.
        earlier = state.recommendations if state.recommendations else ((obs.time, current),)
        recs = (*((t, n) for t, n in earlier if t > obs.time - window), (obs.time, sizing.needed))
        # Up at once; down only to the most that the whole window still asked for, and never while
        # the percentile is over target.
        if sizing.needed >= current:
            desired = sizing.needed
        elif obs.latency is not None and obs.latency > obs.slo_target and not sizing.draining:
            # Over target with a queue that does not shrink: more may be needed soon. A shrinking one is
            # the past being served (queues stay on the pods they were sent to; new pods do not speed it).
            desired = current
        else:
            floor = max(n for _, n in recs)
            if sizing.capacity and not sizing.sparse and sizing.held is None:
                # Not below what demand may rise to, at the SLO's percentile, within the reversal horizon: a pod
                # released and ordered again inside it costs a cold start (docs/autoscaling.md, Design notes). Not
                # on a μ_SLO that replicas too idle to test it taught, nor while the forecast holds an envelope.
                rise = min(rise_quantile(state.demand, REVERSAL_WINDOWS * window, obs.slo_percentile), MAX_RISE)
                floor = max(floor, math.ceil(sizing.demand * (1.0 + rise) / sizing.capacity - 1e-9))
            paused = state.last_down is not None and obs.time - state.last_down < DOWN_PAUSE
            worth = current - floor >= max(1, math.ceil(DOWN_MARGIN * current - 1e-9))
            desired = current if paused or not worth or partial_scrape(obs) else min(current, floor)
        # The HPA's default scale-up limit, over what this policy added within the last period.
        added = sum(n for t, n in state.orders if t > obs.time - STEP_PERIOD)
        base = max(0, current - added)
        step_cap = max(base + self.step_pods, math.floor(base * (1.0 + self.step_ratio)))
        stepped = desired > step_cap and step_cap < high
        desired = clamp_replicas(min(desired, step_cap), low, high)
        blocked = obs.unschedulable > 0 and desired > current
        if blocked:
            desired = clamp_replicas(current, low, high)
        orders = tuple((t, n) for t, n in state.orders if t > obs.time - obs.cold_start)
        if desired > current:
            orders = (*orders, (obs.time, desired - current))
        last_down = obs.time if desired < current else state.last_down
        state = replace(state, recommendations=recs, orders=orders, last_down=last_down)
        return Decision(desired, self._reason(obs, sizing, desired, window, blocked, stepped), state)

    def _starting_ready_at(self, obs: Observation, state: SloState) -> list[float]:
        """When each starting pod should be Ready: the newest orders are the ones still starting."""
        times: list[float] = []
        for t, n in reversed(state.orders):
            times += [t + obs.cold_start] * n
        times = times[: obs.starting]
        return times + [obs.time + obs.cold_start] * (obs.starting - len(times))

    def _size(self, obs: Observation, state: SloState) -> tuple[SloState, Sizing]:
        """Update the demand and capacity estimates; return the replicas needed now."""
        assert obs.latency is not None and obs.request_rate is not None and obs.waiting is not None
        target = obs.slo_target
        dt = obs.time - state.time if state.time is not None and obs.time > state.time else None

        # Demand: arrivals, else completions plus the growth of what is in flight over the same window, so a drained
        # backlog is not counted twice (docs/autoscaling.md, Design notes).
        inflights = (
            *((t, v) for t, v in state.inflights if t >= obs.time - self.rate_window - 1e-9),
            (obs.time, obs.waiting + (obs.running or 0.0)),
        )
        (since, before), (last, previous) = inflights[0], inflights[max(0, len(inflights) - 2)]
        inflight = inflights[-1][1]
        if obs.arrival_rate is not None:
            demand = obs.arrival_rate
        elif obs.time > since:
            demand = max(0.0, obs.request_rate + (inflight - before) / (obs.time - since))
            # While in flight has not fallen over the window, the last interval's growth counts too: a step is seen
            # within one interval rather than averaged over the window.
            if inflight >= before and obs.time > last:
                demand = max(demand, obs.request_rate + (inflight - previous) / (obs.time - last))
        else:
            demand = obs.request_rate
        if state.level is None:
            level = demand
        else:
            level = state.level if dt is None else _ewma(state.level, demand, dt, FAST_WINDOW)
        samples = (*((t, v) for t, v in state.demand if t > obs.time - RISE_WINDOW), (obs.time, demand))
        slope, spread = robust_trend(tuple(s for s in samples if s[0] > obs.time - TREND_WINDOW))
        upper = max(demand, level + QUANTILE_Z * spread)

        def forecast_over(horizon: float) -> float:
            """What capacity is sized for, to serve until pods asked for now serve ``horizon`` from now."""
            # not extrapolated beyond the span it was fitted on
            growth = max(0.0, slope) * min(horizon, TREND_WINDOW)
            # At most doubling the demand, as the backlog and the latency feedback at most double the fleet
            # (docs/autoscaling.md, Design notes).
            rise = min(rise_quantile(samples, horizon, obs.slo_percentile), MAX_RISE)
            return max(upper + min(growth, TREND_CAP * upper), demand * (1.0 + rise))

        horizon = obs.cold_start + self.interval
        forecast = forecast_over(horizon)
        # A demand that swings within a rate window is held for its envelope, not chased (module docstring).
        known_swing = len(_log_changes(samples)) >= MIN_RISE_PAIRS
        swing = rise_quantile(samples, RISE_LAG, obs.slo_percentile) if known_swing else None
        # No peak from before the fleet went to zero is held after it (``SloState.zeroed``): it sizes for what comes.
        swung = obs.time if swing is not None and swing > SWING else state.swung
        since = max(obs.time - ENVELOPE_WINDOW, state.zeroed or -math.inf)
        # A scale-down delay the user set is their word on how long demand must stay lower before replicas go, swinging
        # or not: a hold of its own length would only cut the forecast's headroom to the last few samples' peak.
        holding = self.stabilization is None and swinging(swung, obs.time, demand)
        envelope = max(v for t, v in samples if t > since) if holding else None
        hold = envelope if envelope is not None and demand < envelope else None
        forecast = forecast if hold is None else hold

        # The last latency window of (time, ready, waiting): rates and the percentile average over
        # such a window, so they describe the fleet as it was across it.
        history = (
            # one interval more than the window, so it spans the window whatever the interval
            *(h for h in state.history if h[0] > obs.time - self.settle - self.interval + 1e-9),
            (obs.time, obs.ready, obs.waiting),
        )
        spans = obs.time - history[0][0] >= self.settle
        ready_ref = min(h[1] for h in history)
        ready_steady = spans and obs.ready > 0 and ready_ref == max(h[1] for h in history)

        # μ_SLO rises only to a throughput seen in consecutive cycles within the SLO, the least of them. It is learned
        # at a request mix: a heavier one asks more of a replica per request, so sizing divides it by ``heavier``.
        learned, learned_at = state.learned_capacity, state.mix
        weight = heavier(obs.request_mix, learned_at)
        draining = obs.waiting < history[0][2]
        streak_mix: tuple[Mix | None, ...] = ()
        if obs.latency <= target and ready_steady and obs.request_rate > 0:
            streak = (*state.streak[-(CAPACITY_SAMPLES - 1) :], (obs.time, obs.request_rate / obs.ready))
            streak_mix = (*state.streak_mix[-(CAPACITY_SAMPLES - 1) :], obs.request_mix)
            if len(streak) >= CAPACITY_SAMPLES:
                # The streak's throughput, at its own mix, replaces μ_SLO where it promises more at today's mix.
                seen_at = _mean_mix(streak_mix)
                least = min(v for _, v in streak)
                if least / heavier(obs.request_mix, seen_at) > (learned or 0.0) / weight:
                    learned, learned_at, weight = least, seen_at, heavier(obs.request_mix, seen_at)
        else:
            streak = ()
            # Replicas missing the target with a queue that does not drain, with nothing on order, serve all they
            # can: μ_SLO above that was never true, or is no longer (a heavier mix), and falls toward it. While
            # pods start, a standing queue is expected and says nothing of μ_SLO (docs/autoscaling.md, Design notes).
            served = obs.request_rate / obs.ready if obs.ready else None
            standing_queue = obs.waiting > 0 and not draining
            missing = obs.latency > target and ready_steady and standing_queue and obs.starting == 0 and dt is not None
            if missing and served is not None and learned is not None and served < learned / weight:
                assert dt is not None
                # toward what the replicas serve at today's mix, which it is learned at from now on
                learned, learned_at, weight = _ewma(learned / weight, served, dt, CAPACITY_DECAY), obs.request_mix, 1.0

        scale = state.capacity_scale
        probe, knee_seen = state.probe, state.knee_seen
        capacity: float | None = None
        backlog = 0.0
        standing_in = 0
        sparse = untested = False
        feedforward: int | None = None
        needed = obs.current  # nothing to size with yet: only the feedback below may move it
        known = max((learned or 0.0) / weight, self.capacity_per_replica or 0.0)
        if known > 0:
            # Replicas whose queue stood for a whole window serve at their true capacity; below μ means
            # a heavier mix than profiled, which is believed until the SLO has held for a while.
            clears = known * scale * obs.ready * target  # what the Ready replicas clear within the target
            standing = spans and all(h[2] > clears for h in history)
            # A queue that shrinks is served faster than it grows: an over-provisioned fleet draining a
            # backlog says nothing about slow replicas (docs/autoscaling.md, Design notes).
            if obs.latency > target and standing and ready_steady and obs.waiting >= history[0][2]:
                scale = max(CAPACITY_FLOOR, min(scale, obs.request_rate / obs.ready / known))
            elif obs.latency <= target and dt is not None:
                scale = _ewma(scale, 1.0, dt, CAPACITY_RECOVERY)
            # The probe above a learned lower bound (module docstring; docs/autoscaling.md, Design notes). It grows
            # only where it can shrink the fleet, and never over a profile, even one set while it ran.
            near = obs.latency > KNEE_LATENCY * target or (spans and any(h[2] > KNEE_QUEUE * clears for h in history))
            if near or self.capacity_per_replica is not None:
                probe, knee_seen = 1.0, knee_seen or near
            elif not knee_seen and spans and ready_steady and obs.current > obs.min_replicas and dt is not None:
                probe = min(PROBE_MAX, probe * math.exp(dt / PROBE_TIME))
            capacity = known * scale * probe
            queued = max(0.0, obs.waiting - capacity * obs.ready * target)
            starting = self._starting_ready_at(obs, state)
            # The queue builds from what arrives now; the trend is already in the forecast, not counted twice.
            arriving = max(demand, level)  # what the queue will see
            backlog = projected_backlog(queued, arriving, obs.ready, starting, obs.time, obs.cold_start, capacity)
            sized = forecast / capacity
            # The backlog adds at most as many again as the demand needs, and at most the Ready replicas: only they
            # serve the queue they hold, while arrivals need ``sized`` of their own (docs/autoscaling.md, Design notes).
            drain = min(backlog / (capacity * self.drain_time), BACKLOG_RATIO * sized, float(obs.ready))
            feedforward = math.ceil(sized + drain - 1e-9)
            if obs.asleep and obs.wake is not None and obs.wake < obs.cold_start:
                # A warm standby: the first replicas asked for serve a wake from now, the rest a cold start. Serving
                # replicas for what comes within a wake, and with the asleep ones for what comes within L.
                soon = math.ceil(forecast_over(obs.wake + self.interval) / capacity + drain - 1e-9)
                standing_in = min(obs.asleep, max(0, feedforward - soon))
                feedforward -= standing_in
            held = statistics.fmean(v for _, v in inflights)  # requests in flight over the rate window: Little's L
            measured = obs.running is not None and obs.ready > 0 and obs.waiting <= 0
            sparse = self.capacity_per_replica is None and measured and held < MIN_HELD * obs.ready
            if sparse and feedforward > obs.current:
                feedforward, standing_in, untested = obs.current, 0, True
            needed = feedforward

        # Latency feedback, for what the model misses. Only on a fleet that has not changed for a whole
        # latency window, whose queue is not draining, and whose replicas are busy: otherwise the
        # percentile is looking back at a fleet or a queue that is gone, or more replicas would not help.
        feedback: int | None = None
        busy = capacity is None or obs.request_rate >= BUSY * capacity * obs.ready
        if obs.latency > target and ready_steady and not draining and busy:
            feedback = math.ceil(ready_ref * min(obs.latency / target, MAX_FEEDBACK_RATIO) - 1e-9)
            if feedforward is not None:
                feedback = min(feedback, math.ceil(MAX_FEEDBACK_RATIO * feedforward))
            needed = max(needed, feedback)

        state = replace(
            state,
            time=obs.time,
            inflights=inflights,
            level=level,
            demand=samples,
            learned_capacity=learned,
            streak=streak,
            streak_mix=streak_mix,
            mix=learned_at,
            capacity_scale=scale,
            probe=probe,
            knee_seen=knee_seen,
            history=history,
            swing=swing,
            swung=swung,
            envelope=envelope,
        )
        sizing = Sizing(
            demand, forecast, horizon, capacity, feedforward, needed, backlog, feedback, draining, probe, standing_in,
            sparse, untested, weight if learned and known == learned / weight else 1.0, hold,
        )  # fmt: skip
        return state, sizing

    def _reason(
        self, obs: Observation, sz: Sizing, desired: int, window: float, blocked: bool, stepped: bool = False
    ) -> str:
        """One sentence for a Kubernetes event: what was seen, what it needs, what is done."""
        assert obs.latency is not None
        op = ">" if obs.latency > obs.slo_target else "<="
        parts = [f"P{obs.slo_percentile:g} {duration_text(obs.latency)} {op} target {duration_text(obs.slo_target)}"]
        if sz.capacity is not None:
            sized_for = (
                f"forecast {_v(sz.forecast)} over {duration_text(sz.horizon)}"
                if sz.held is None
                else f"it swings within {duration_text(RISE_LAG)}, so held for its peak of the last "
                f"{ENVELOPE_WINDOW / 60:g} minutes ({_v(sz.held)} req/s)"
            )
            parts.append(
                f"demand {_v(sz.demand)} req/s, {sized_for} at {_v(sz.capacity)} req/s per replica"
                + (
                    f" ({sz.probe:.2f}x the learned: the fleet has not come near its knee)"
                    if f"{sz.probe:.2f}" != "1.00"
                    else ""
                )
                + (
                    f" (divided by {sz.heavier:.2f}: its requests carry {sz.heavier + MIX_TOLERANCE:.2f}x the tokens "
                    "it was learned at)"
                    if f"{sz.heavier:.2f}" != "1.00"  # a factor the sentence could only print as 1.00 is not said
                    else ""
                )
            )
        else:
            parts.append(f"demand {_v(sz.demand)} req/s, capacity per replica not learned yet")
        if sz.backlog > 0:
            parts.append(f"{sz.backlog:.0f} requests queued by then")
        if sz.standing_in:
            parts.append(f"{sz.standing_in} replicas of it asleep (woken in {duration_text(obs.wake or 0.0)})")
        if sz.untested:
            parts.append(f"its replicas hold under {MIN_HELD:g} request in flight each, too few to test that capacity")
        if sz.feedback is not None and (sz.feedforward is None or sz.feedback > sz.feedforward):
            parts.append(f"latency feedback on {obs.ready} ready")
        parts.append(f"needs {sz.needed}")
        if obs.starting:
            parts.append(f"{obs.starting} pods starting")
        if blocked:
            parts.append(f"{obs.unschedulable} pods unschedulable (no free GPUs, or a quota), not adding more")
        if stepped:
            parts.append(f"growth capped at max({self.step_pods} pods, {self.step_ratio:.0%}) per {STEP_PERIOD:g}s")
        text = ", ".join(parts)
        current = obs.current
        if desired > current:
            capped = " (capped at max)" if desired == obs.max_replicas and sz.needed > desired else ""
            return f"{text}: {current} -> {desired}{capped}"
        if desired < current:
            return f"{text}: {current} -> {desired}"
        if sz.needed < current and obs.latency > obs.slo_target:
            return f"{text}: holding {current} while over target"
        if sz.needed < current and partial_scrape(obs):
            return f"{text}: holding {current}, only {obs.reporting} of {obs.ready} Ready pods report metrics"
        if sz.needed < current and not blocked:
            return f"{text}: holding {current} until demand stays lower for {duration_text(window)}"
        return f"{text}: holding {current}"
