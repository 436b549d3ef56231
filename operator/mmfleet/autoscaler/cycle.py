"""One autoscaling cycle of one fleet, as pure functions: what was seen -> decision -> status.

The loop in the controller gathers what the API server (kopf's indexes) and Prometheus show, and
hands it here; nothing in this module does I/O, so every rule below is unit-tested on plain data:

- silence is not zero: with Prometheus unavailable or a series missing the fleet holds its
  replicas, and ``MetricsAvailable`` says which; the policy is not even asked;
- nor is bad data: a refused query, a value that is not a number, NaN, an infinity, a negative
  value or one no pod could produce (``implausible``) holds the fleet too, and ``MetricsAvailable``
  quotes it; but for that cycle only: the series are there, so the warm-up goes on (only a gap in
  them longer than the rate window restarts it); a partial scrape (fewer pods reporting than are
  Ready) may grow the fleet, never shrink it, since its sums miss pods;
- nor is one sample decisive: one far beyond what the fleet has shown (``beyond_shown``) is held
  until the next sample confirms it, and teaches the policy nothing;
- a fleet that finished no request and has none in flight is idle, which meets any target: the
  policy sees a latency of 0, so an idle fleet can return to ``minReplicas`` once its window passes;
- the cold start L the policy plans with is measured on the fleet's own pods (creation to Ready),
  with a configured default until one of them has been Ready; each Ready pod's way there is split into the phases
  Kubernetes timestamps (``PHASES``), and the last of them by what the server logged (``SERVER_PHASES``), shown in
  status and observed once per pod by the operator's metrics;
- a fleet with minReplicas 0 lets its last replica go once it has been idle (no request finished, in flight or held
  by its endpoint picker) for the wait ``autoscaler.idle`` sets, and comes back to one replica in the first cycle
  that reads a request held by the picker, the only sign of demand with no server; the policy sizes the live fleet
  with a floor of one;
- attainment is the share of measured cycles over the last hour whose percentile met the target.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import astuple, dataclass, field, fields, replace
from datetime import datetime
from typing import Any, Literal, get_args

from mmfleet import backends
from mmfleet.api import (
    AutoscalingSpec,
    ColdStartStatus,
    ConditionType,
    DemandSwingsReason,
    IdleReason,
    MetricsAvailableReason,
    MultimodalInference,
    PreprocessingBoundReason,
    ScalingLimitedReason,
    SloMetReason,
    SloSpec,
    clamp_replicas,
    duration_text,
    seconds,
)
from mmfleet.autoscaler import Observation
from mmfleet.autoscaler.idle import IdleMemory, IdleRule, idle_rule
from mmfleet.autoscaler.metrics import API_CPU_SERIES, RATE_WINDOW, SIGNALS, Signals
from mmfleet.autoscaler.policy import ENVELOPE_WINDOW, MIN_RISE_PAIRS, RISE_LAG, SWING, SloPolicy, SloState, swinging
from mmfleet.backends import ServerStartup
from mmfleet.status import ConditionRow, Scaling, scheduling_failure

ATTAINMENT_WINDOW = 3600.0  # s
RATE_WINDOW_S = seconds(RATE_WINDOW)
WARM_UP_S = RATE_WINDOW_S  # the policy is asked once a fleet's series cover a whole rate window
# What no pod produces, so a sample beyond it is a broken exporter or a glitch, not load. Generous: vLLM's
# max_num_seqs defaults to 256-1024 running, and a replica serving 10,000 requests/s is far beyond any GPU.
MAX_LATENCY = 86400.0  # s: histogram_quantile answers at most the highest finite bucket, else +Inf
MAX_RATE_PER_POD = 10_000.0  # finished requests/s
MAX_IN_FLIGHT_PER_POD = 100_000.0  # waiting, and running, requests
# A sample whose requests in flight or request rate per Ready pod is more than this many times the most the fleet has
# shown is held until the next sample confirms it, above the largest rise a real step brings within one cycle
# (docs/autoscaling.md, Design notes).
OUTLIER_RATIO = 10.0
# What a fleet that has shown less is judged against, per Ready pod, so that its first traffic is not suspect: a full
# running batch at vLLM's default max_num_seqs, and ten requests a second, below what one replica serves within its
# SLO (docs/autoscaling.md, Design notes).
SHOWN_IN_FLIGHT_FLOOR = 256.0
SHOWN_RATE_FLOOR = 10.0  # req/s
# A pod Ready for less than this may not have been scraped yet (Prometheus' default scrape interval is 1m), so it is
# not counted among the pods that should report.
SCRAPE_GRACE = 60.0  # s


# A pod's way from creation to Ready, each phase named by the moment it ends: PodScheduled; Initialized (sandbox,
# network, volumes, init containers); its containers running (images pulled, containers created); Ready (weights
# loaded, kernels compiled, the readiness probe passed).
PHASES = ("scheduled", "initialized", "started", "ready")
# Inside ``ready``, what the server's own log says (backends.ServerStartup, read once per pod by the loop).
SERVER_PHASES = tuple(f.name for f in fields(ServerStartup))


@dataclass(frozen=True)
class PodStart:
    """One Ready pod's cold start: the whole, and seconds per phase of ``PHASES`` (None where Kubernetes recorded no
    time for its end, or one out of order: its time then counts in the next phase), then of ``SERVER_PHASES``."""

    pod: str
    total: float
    phases: tuple[float | None, ...]
    server: ServerStartup = field(default_factory=ServerStartup)


@dataclass(frozen=True)
class ColdStart:
    """The medians of the Ready pods' cold starts, per phase; what status shows."""

    total: float
    phases: tuple[float | None, ...]  # PHASES, then SERVER_PHASES
    pods: int

    @classmethod
    def of(cls, starts: tuple[PodStart, ...]) -> ColdStart | None:
        if not starts:
            return None
        columns: list[list[float]] = [[] for _ in (*PHASES, *SERVER_PHASES)]
        for start in starts:
            for column, value in zip(columns, (*start.phases, *astuple(start.server)), strict=True):
                if value is not None:
                    column.append(value)
        phases = tuple(statistics.median(c) if c else None for c in columns)
        return cls(statistics.median(s.total for s in starts), phases, len(starts))

    def status(self) -> ColdStartStatus:
        phases = zip((*PHASES, *SERVER_PHASES), self.phases, strict=True)
        texts = {name: None if value is None else duration_text(value) for name, value in phases}
        return ColdStartStatus.model_validate({"total": duration_text(self.total), **texts, "pods": self.pods})


# PreprocessingBound (``_preprocessing_row``): the share of the mean time to first token spent before the engine took
# the request, the busiest API server process's CPU cores, and the requests finished over the rate window, from which
# it is said. Set a priori (docs/troubleshooting.md says why): no real run here was preprocessing-bound. The image
# processor runs on one thread per API server process, which alone takes a core when it never rests.
PREPROCESSING_SHARE = 0.5
PREPROCESSING_CPU = 0.9
# Once True, it stays so until the share or the cores fall this far below those: near a threshold the condition would
# otherwise turn every cycle, each turn to True a Warning event.
PREPROCESSING_HYSTERESIS = 0.1
PREPROCESSING_MIN_REQUESTS = 20

# SLOMet while the signals cannot be used: the fleet holds, and MetricsAvailable says why.
NOTHING_MEASURED: ConditionRow = (
    "SLOMet",
    None,
    SloMetReason.METRICS_UNAVAILABLE,
    "nothing measured: see MetricsAvailable",
)


@dataclass(frozen=True)
class Pods:
    """The fleet's pods as the API server shows them (terminating ones left out: they serve no more)."""

    ready: int = 0
    starting: int = 0  # scheduled or about to be, not Ready yet
    unschedulable: int = 0  # the scheduler found no node (for GPU pods: no free GPUs)
    why_unschedulable: str = ""  # the scheduler's message about the first of them
    cold_start: float | None = None  # median creation -> Ready of the Ready pods, s
    ready_since: tuple[datetime, ...] = ()  # when each Ready pod turned Ready, where the kubelet said
    starts: tuple[PodStart, ...] = ()  # the Ready pods' cold starts, phase by phase
    asleep: int = 0  # with warm standby: pods asleep, out of routing, none of the counts above
    wake: float | None = None  # with warm standby: the median of the fleet's measured wakes, s


def _time(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def _true_condition(pod: dict[str, Any], kind: str) -> dict[str, Any] | None:
    found: dict[str, Any] | None = next(
        (
            c
            for c in (pod.get("status") or {}).get("conditions") or []
            if c.get("type") == kind and c.get("status") == "True"
        ),
        None,
    )
    return found


def _condition_time(pod: dict[str, Any], kind: str) -> datetime | None:
    condition = _true_condition(pod, kind)
    return None if condition is None else _time(condition.get("lastTransitionTime"))


def pod_start(pod: dict[str, Any], name: str, created: datetime, ready: datetime) -> PodStart:
    """A Ready pod's cold start, phase by phase, from its conditions and its containers' start times."""
    running = [
        _time(((c.get("state") or {}).get("running") or {}).get("startedAt"))
        for c in (pod.get("status") or {}).get("containerStatuses") or []
    ]
    started = [t for t in running if t is not None]
    ends = (
        _condition_time(pod, "PodScheduled"),
        _condition_time(pod, "Initialized"),
        max(started) if started and len(started) == len(running) else None,
        ready,
    )
    phases: list[float | None] = []
    last = created
    for end in ends:
        if end is None or end < last or end > ready:
            phases.append(None)
            continue
        phases.append((end - last).total_seconds())
        last = end
    return PodStart(name, (ready - created).total_seconds(), tuple(phases))


def _ready(pod: dict[str, Any]) -> tuple[bool, datetime | None]:
    """Whether a pod is Ready, and since when if the kubelet said."""
    return _true_condition(pod, "Ready") is not None, _condition_time(pod, "Ready")


def count_pods(pods: Iterable[dict[str, Any]]) -> Pods:
    """Ready, starting and unschedulable pods, and the cold start measured on the Ready ones."""
    ready = starting = unschedulable = 0
    why = ""
    starts: list[PodStart] = []
    ready_since: list[datetime] = []
    for pod in pods:
        meta = pod.get("metadata", {})
        if meta.get("deletionTimestamp") or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        is_ready, since = _ready(pod)
        failure = scheduling_failure(pod)
        if is_ready:
            ready += 1
            if since is not None:
                ready_since.append(since)
            created = _time(meta.get("creationTimestamp"))
            if created is not None and since is not None and since >= created:
                starts.append(pod_start(pod, meta.get("name", ""), created, since))
        elif failure is not None:
            unschedulable += 1
            why = why or f"pod {failure.pod}: {failure.message or failure.reason}"
        else:
            starting += 1
    cold_start = statistics.median(s.total for s in starts) if starts else None
    return Pods(ready, starting, unschedulable, why, cold_start, tuple(ready_since), tuple(starts))


def with_server(pods: Pods, startups: dict[str, ServerStartup]) -> Pods:
    """``pods`` with what each Ready pod's server logged about its start, by pod name, where it was read."""
    starts = tuple(replace(s, server=startups.get(s.pod, s.server)) for s in pods.starts)
    return replace(pods, starts=starts)


def should_report(pods: Pods, now: datetime) -> int:
    """The Ready pods that Prometheus has had a scrape interval to find: all but those Ready for under SCRAPE_GRACE."""
    return pods.ready - sum(1 for since in pods.ready_since if (now - since).total_seconds() < SCRAPE_GRACE)


@dataclass(frozen=True)
class Memory:
    """What the loop keeps about one fleet between cycles (in the operator's memory only)."""

    policy_state: Any = None  # None: the policy's initial state
    verdicts: tuple[tuple[float, bool], ...] = ()  # (time, met the target) of each measured cycle
    cold_start: float | None = None  # the last one measured, kept when the measured pods are gone
    cold_start_phases: ColdStart | None = None  # and phase by phase
    timed: frozenset[str] = frozenset()  # Ready pods whose cold start the operator's metrics have observed
    metrics_since: float | None = None  # since when its series were read with no gap longer than the rate window
    series_read: float | None = None  # the last cycle that read them, a rejected or failed sample included
    most_in_flight: float = 0.0  # the most requests in flight (waiting + running) per Ready pod in samples used
    most_rate: float = 0.0  # the most finished requests/s per Ready pod in samples used
    unconfirmed: float | None = None  # when a sample beyond those was held, for the next one read to confirm
    idle: IdleMemory = field(default_factory=IdleMemory)  # with minReplicas 0: the current idle gap and the last ones
    preprocessing_bound: bool = False  # PreprocessingBound was True when last measured


@dataclass(frozen=True)
class Seen:
    """One cycle's view of a fleet: the Deployment's replicas, its pods, and Prometheus' answer."""

    current: int
    pods: Pods
    signals: Signals | None = None
    outage: str | None = None  # why Prometheus gave no answer; signals are then None


# What a cycle did with a fleet, in a word (the label of the operator's decisions metric; the reason sentence,
# with its numbers, is the event's). Holds name what held the fleet, the first that applies.
Cause = Literal[
    "scaled_up",
    "scaled_down",
    "metrics_unavailable",
    "sample_unconfirmed",
    "warming_up",
    "unschedulable",
    "at_max_replicas",
    "held",
]
CAUSES: tuple[Cause, ...] = get_args(Cause)


@dataclass(frozen=True)
class Outcome:
    """What one cycle decided for a fleet, and what status and events should say about it."""

    current: int
    replicas: int  # to set; equal to current when holding
    reason: str  # the decision in one sentence (event message and status.lastScaleReason)
    cause: Cause
    memory: Memory
    latency: float | None  # the measured percentile, None when nothing was measured
    idle: bool  # no request finished and none in flight (at zero: none held by the picker either)
    conditions: tuple[ConditionRow, ...]
    new_starts: tuple[PodStart, ...] = ()  # pods first seen Ready this cycle: their cold starts, for the metrics

    @property
    def scaled(self) -> bool:
        return self.replicas != self.current

    @property
    def event_reason(self) -> str:
        return "ScaledUp" if self.replicas > self.current else "ScaledDown"

    def scaling(self) -> Scaling:
        """What ``status.compute_status`` shows of this cycle."""
        return Scaling(
            replicas=self.replicas,
            scaled=self.scaled,
            reason=self.reason,
            latency=self.latency,
            idle=self.idle,
            attainment=attainment(self.memory.verdicts),
            conditions=self.conditions,
            cold_start=None if self.memory.cold_start_phases is None else self.memory.cold_start_phases.status(),
        )


def policy_for(autoscaling: AutoscalingSpec, slo: SloSpec, interval: float) -> SloPolicy:
    """The fleet's policy: capacity from the spec's profile if given, learned online above it; its latency memory
    spans the SLO window."""
    delay = autoscaling.scale_down_delay
    return SloPolicy(
        interval=interval,
        settle=seconds(slo.window),
        stabilization=None if delay is None else seconds(delay),
        capacity_per_replica=autoscaling.capacity_per_replica,
        rate_window=RATE_WINDOW_S,
    )


def series_since(since: float | None, last_read: float | None, clock: float) -> float:
    """Since when a fleet's series have been read with no gap: only a gap longer than the rate window restarts the
    warm-up, since a rate() across a shorter one still spans the window."""
    gap = last_read is not None and clock - last_read > RATE_WINDOW_S
    return clock if since is None or gap else since


def serving_target(inference: MultimodalInference) -> float:
    """Seconds the serving tier's percentile may take: the SLO's target, less the encode tier's share when that tier
    scales on its own (``autoscaler.encode``)."""
    target = inference.spec.serving_slo_target
    assert target is not None, "only fleets with an SLO are decided"
    return target


def implausible(signals: Signals, pods: Pods, inference: MultimodalInference) -> list[str]:
    """The samples no healthy fleet produces (NaN, infinite, negative, beyond what its pods could), quoted."""
    autoscaling = inference.spec.autoscaling
    assert autoscaling is not None and autoscaling.slo is not None
    names = backends.get(inference.spec.backend.name).metrics
    per_pod = max(signals.reporting or 0, pods.ready + pods.starting, 1)
    highs = {
        "request_rate": MAX_RATE_PER_POD * per_pod,
        "waiting": MAX_IN_FLIGHT_PER_POD * per_pod,
        "running": MAX_IN_FLIGHT_PER_POD * per_pod,
        "kv_cache_usage": 1.0,
    }
    checks = [(f"P{autoscaling.slo.percentile:g} latency", signals.latency, MAX_LATENCY)]
    checks += [(names.series(signal), getattr(signals, signal), highs[signal]) for signal in SIGNALS]
    return [
        f"{name} = {value:g} (accepted: 0 to {high:g} for {per_pod} pods)"
        for name, value, high in checks
        if value is not None and not 0.0 <= value <= high  # NaN fails every comparison
    ]


def beyond_shown(signals: Signals, pods: Pods, memory: Memory) -> list[str]:
    """The signals of a sample more than OUTLIER_RATIO times the most per Ready pod this fleet has shown, quoted.

    Per Ready pod, so a fleet that grows is not suspect; a fleet that has shown little is judged against floors a pod
    may reach on its first traffic. Real load grows the queue over several scrapes, while one glitch acted on would
    scale the fleet and the policy's demand level and down window would keep it there for minutes.
    """
    ready = max(pods.ready, 1)
    waiting, running = signals.waiting or 0.0, signals.running or 0.0
    checks = (
        (f"waiting {waiting:g} + running {running:g}", waiting + running, memory.most_in_flight, SHOWN_IN_FLIGHT_FLOOR),
        ("request rate (req/s)", signals.request_rate or 0.0, memory.most_rate, SHOWN_RATE_FLOOR),
    )
    pods_text = f"{ready} Ready pod" + ("s" if ready > 1 else "")
    return [
        f"{name} = {value:g} for {pods_text}, {value / ready / max(most, floor):.0f}x the most seen per pod "
        f"({most:g}{'' if most >= floor else f', judged as {floor:g}'})"
        for name, value, most, floor in checks
        if value / ready > OUTLIER_RATIO * max(most, floor)
    ]


def _series_read(seen: Seen) -> bool:
    """Whether this cycle read the fleet's series, good or bad: a cycle that did not is part of a gap in them."""
    return seen.outage is None and seen.signals is not None and not seen.signals.missing and seen.pods.ready > 0


def _unavailable(seen: Seen, inference: MultimodalInference, held: int, memory: Memory) -> ConditionRow | None:
    """MetricsAvailable when the signals cannot be used (then the fleet holds), or None when they can.

    A fleet with no Ready pod has nothing scraped yet: Unknown, not a failure worth a Warning. A sample beyond what the
    fleet has shown is used only when the sample read before it was one too.
    """
    holding = f"holding {held} replicas"
    once = f"{holding} this cycle (a bad sample does not restart the rate window's warm-up)"
    if seen.outage is not None:
        return ("MetricsAvailable", False, MetricsAvailableReason.PROMETHEUS_UNAVAILABLE, f"{seen.outage}; {holding}")
    if seen.signals is not None and seen.signals.failed is not None:
        return ("MetricsAvailable", False, MetricsAvailableReason.QUERY_FAILED, f"{seen.signals.failed}; {once}")
    if seen.signals is not None and not seen.signals.missing:
        rejected = implausible(seen.signals, seen.pods, inference)
        if rejected:
            return (
                "MetricsAvailable",
                False,
                MetricsAvailableReason.SAMPLES_REJECTED,
                f"not trusted: {'; '.join(rejected)}; {once}",
            )
        beyond = beyond_shown(seen.signals, seen.pods, memory)
        confirms = memory.unconfirmed is not None and memory.unconfirmed == memory.series_read  # the last read was held
        if beyond and not confirms:
            return (
                "MetricsAvailable",
                False,
                MetricsAvailableReason.SAMPLE_UNCONFIRMED,
                f"{'; '.join(beyond)}: held until the next sample confirms it; {holding}",
            )
        return None
    if seen.pods.ready == 0:
        return (
            "MetricsAvailable",
            None,
            MetricsAvailableReason.NO_POD_SERVING,
            f"no pod is Ready, so none is scraped yet; {holding}",
        )
    missing = ", ".join(seen.signals.missing) if seen.signals else "any series"
    meta = inference.metadata
    return (
        "MetricsAvailable",
        False,
        MetricsAvailableReason.SERIES_MISSING,
        f"Prometheus has no {missing} for namespace={meta.namespace}, mmfleet_io_inference={meta.name}; "
        f"{holding} (does Prometheus scrape the pods? see docs/autoscaling.md)",
    )


def decide(
    inference: MultimodalInference,
    seen: Seen,
    memory: Memory,
    now: datetime,
    *,
    interval: float,
    default_cold_start: float,
) -> Outcome:
    """One cycle for one autoscaled fleet: hold on silence, else ask the policy; and the conditions."""
    autoscaling = inference.spec.autoscaling
    assert autoscaling is not None and autoscaling.slo is not None, "only autoscaled fleets are decided"
    slo = autoscaling.slo
    pods = seen.pods
    cold_start = pods.cold_start if pods.cold_start is not None else memory.cold_start
    timed = frozenset(s.pod for s in pods.starts)
    new_starts = tuple(s for s in pods.starts if s.pod not in memory.timed)
    memory = replace(
        memory,
        cold_start=cold_start,
        cold_start_phases=ColdStart.of(pods.starts) or memory.cold_start_phases,
        timed=timed,
    )
    clock = now.timestamp()
    lead = default_cold_start if cold_start is None else cold_start
    target = serving_target(inference)
    label = f"P{slo.percentile:g}"
    encode = inference.spec.encode_autoscaling
    of_target = (
        f"target {slo.target}"
        if encode is None
        else f"target {duration_text(target)} (the serving tier's part of {slo.target}; the encode tier has "
        f"{encode.share:.0%}: status.encode)"
    )
    rule = _idle_rule(autoscaling, memory, lead)
    if rule is None:  # never goes to zero (now): nothing of its idleness is kept for a later minReplicas 0
        memory = replace(memory, idle=IdleMemory())
    elif seen.current == 0:  # PreprocessingBound is absent at zero: a fleet back from it starts unbound
        memory = replace(memory, preprocessing_bound=False)
        return replace(_at_zero(inference, seen, memory, clock, rule, lead, target, label), new_starts=new_starts)
    # The live fleet's floor: one replica even with minReplicas 0, whose last replica only the idle rule lets go.
    low = max(1, autoscaling.min_replicas)
    held = clamp_replicas(seen.current, low, autoscaling.max_replicas)
    unavailable = _unavailable(seen, inference, held, memory)
    if _series_read(seen):
        # Only a gap in the series longer than the rate window restarts the warm-up: a rate() across a shorter one
        # still spans the window, and a rejected sample is no gap at all.
        since = series_since(memory.metrics_since, memory.series_read, clock)
        memory = replace(memory, metrics_since=since, series_read=clock)
    latency: float | None = None
    idle = False
    quiet = False  # for the idle rule: nothing finished over the rate window, in flight, held, or starting
    down_window = 0.0  # the policy's scale-down window, which a fleet of several replicas waits out before zero
    cause: Cause = "held"
    undecided: str | None = None  # why the policy was not asked this cycle
    metrics: ConditionRow
    slo_met: ConditionRow
    if unavailable is not None:
        replicas, metrics, cause = held, unavailable, "metrics_unavailable"
        what = "metrics unavailable"
        if unavailable[2] == MetricsAvailableReason.SAMPLE_UNCONFIRMED:
            memory = replace(memory, unconfirmed=clock)
            cause, what = "sample_unconfirmed", "sample unconfirmed"
        reason = (
            f"{what}: holding {held}"
            if held == seen.current
            else f"{what}: {seen.current} -> {held}, within minReplicas and maxReplicas"
        )
        slo_met = NOTHING_MEASURED
        undecided = unavailable[3]
    else:
        assert seen.signals is not None
        signals = seen.signals
        in_flight = (signals.waiting or 0.0) + (signals.running or 0.0)
        latency = signals.latency
        idle = latency is None and signals.request_rate == 0 and in_flight == 0
        expected = should_report(pods, now)
        policy = policy_for(autoscaling, slo, interval)
        state = memory.policy_state if memory.policy_state is not None else policy.initial_state()
        observation = Observation(
            time=clock,
            ready=pods.ready,
            starting=pods.starting,
            unschedulable=pods.unschedulable,
            current=seen.current,
            min_replicas=low,
            max_replicas=autoscaling.max_replicas,
            slo_target=target,
            slo_percentile=slo.percentile,
            cold_start=lead,
            request_rate=signals.request_rate,
            latency=0.0 if idle else latency,
            waiting=signals.waiting,
            running=signals.running,
            kv_cache_usage=signals.kv_cache_usage,
            request_mix=signals.mix,
            # pods too newly Ready to have been scraped count as reporting: only a scrape that misses pods is partial
            reporting=None if signals.reporting is None else signals.reporting + pods.ready - expected,
            asleep=pods.asleep,
            wake=pods.wake,
        )
        down_window = policy.down_window(observation)
        if pods.ready:
            memory = replace(
                memory,
                most_in_flight=max(memory.most_in_flight, in_flight / pods.ready),
                most_rate=max(memory.most_rate, (signals.request_rate or 0.0) / pods.ready),
            )
        since = memory.metrics_since if memory.metrics_since is not None else clock
        if clock - since < WARM_UP_S:
            # Young series: rate() over a window they only partly cover reads low, and a capacity learned
            # from it would grow the fleet for nothing (docs/autoscaling.md, Design notes).
            replicas, cause = held, "warming_up"
            undecided = f"series read for {clock - since:.0f}s, less than the {RATE_WINDOW} rate window"
            reason = f"{undecided}: holding {held}"
        else:
            decision = policy.decide(observation, state)
            replicas, reason = decision.replicas, decision.reason
            memory = replace(memory, policy_state=decision.state)
            if pods.unschedulable:
                cause = "unschedulable"
            elif replicas >= autoscaling.max_replicas:
                cause = "at_max_replicas"
        partial = signals.reporting is not None and signals.reporting < expected
        # A partial scrape's sums miss pods, and a starting pod was asked for: neither is an idle fleet.
        quiet = signals.request_rate == 0 and in_flight == 0 and signals.held == 0 and not partial
        quiet = quiet and pods.starting == 0
        if partial:
            metrics = (
                "MetricsAvailable",
                False,
                MetricsAvailableReason.PARTIAL_SCRAPE,
                f"{signals.reporting} of {expected} Ready pods report series, so the sums miss pods: the fleet may "
                "grow, not shrink (does Prometheus scrape every pod?)",
            )
        else:
            metrics = (
                "MetricsAvailable",
                True,
                MetricsAvailableReason.SERIES_PRESENT,
                "latency, request rate, queue and KV-cache series read",
            )
        if latency is not None:
            met = latency <= target
            memory = replace(
                memory,
                verdicts=(*(v for v in memory.verdicts if v[0] > clock - ATTAINMENT_WINDOW), (clock, met)),
            )
            op = "<=" if met else ">"
            slo_met = (
                "SLOMet",
                met,
                SloMetReason.TARGET_MET if met else SloMetReason.TARGET_MISSED,
                f"{label} {duration_text(latency)} {op} {of_target} over the last {slo.window}",
            )
        elif idle:
            slo_met = ("SLOMet", True, SloMetReason.NO_REQUESTS, f"no requests over the last {slo.window}")
        else:
            slo_met = (
                "SLOMet",
                None,
                SloMetReason.NO_REQUESTS_FINISHED,
                f"no request finished over the last {slo.window}, {in_flight:g} in flight",
            )
    rows: tuple[ConditionRow, ...] = ()
    if rule is not None:
        # Only a cycle that read the servers and the picker says whether the fleet is idle; one that could not leaves
        # the gap as it was (a gap is neither ended nor learned on a failed read).
        problem = unavailable[3] if unavailable is not None else (seen.signals.held_problem if seen.signals else None)
        idleness = memory.idle if problem is not None else memory.idle.seen(quiet, clock)
        memory = replace(memory, idle=idleness)
        # On two quiet reads in a row at least; a fleet of several replicas (whose policy cannot shrink it on no
        # demand before it has learned what a replica serves) also waits out the policy's scale-down window.
        enough = max(rule.wait, interval, down_window if seen.current > 1 else 0.0)
        if quiet and replicas <= seen.current and idleness.idle_for(clock) >= enough:
            reason = f"no request for {duration_text(idleness.idle_for(clock))} ({rule.why}): {seen.current} -> 0"
            replicas = 0
            if isinstance(memory.policy_state, SloState):  # a fleet woken from zero holds no peak from before it
                memory = replace(memory, policy_state=replace(memory.policy_state, swung=None, zeroed=clock))
        rows = (_idle_row(idleness, clock, rule, quiet, problem, replicas),)
    unread = None if unavailable is None else unavailable[3]
    bound = _preprocessing_row(inference, seen.signals, unread, latency, target, label, memory.preprocessing_bound)
    rows += () if bound is None else (bound,)
    rows += (_swing_row(memory.policy_state, undecided, clock, autoscaling.scale_down_delay),)
    if bound is not None and bound[1] is not None:
        memory = replace(memory, preprocessing_bound=bound[1])
    if replicas != seen.current:
        cause = "scaled_up" if replicas > seen.current else "scaled_down"
    return Outcome(
        current=seen.current,
        replicas=replicas,
        reason=reason,
        cause=cause,
        memory=memory,
        latency=latency,
        idle=idle,
        conditions=(metrics, slo_met, _limits(inference, replicas, pods, latency, target, label), *rows),
        new_starts=new_starts,
    )


def _swing_row(state: Any, undecided: str | None, clock: float, delay: str | None) -> ConditionRow:
    """DemandSwings, as the policy's decision of this cycle saw the demand: Unknown when it was not asked or sized
    nothing this cycle, or has read too few changes of demand to tell. ``delay``: the fleet's scaleDownDelay, which
    when set holds no peak (``SloPolicy.stabilization``)."""
    kind: ConditionType = "DemandSwings"
    unknown = DemandSwingsReason.NOT_MEASURED
    if undecided is not None or not isinstance(state, SloState):
        return (kind, None, unknown, f"not measured: {undecided or 'no decision yet'}")
    if state.time != clock:
        return (kind, None, unknown, "not measured this cycle: no latency, request rate or queue length to size with "
                "(see SLOMet)")  # fmt: skip
    if state.swing is None:
        return (kind, None, unknown, f"not measured: fewer than {MIN_RISE_PAIRS} changes of demand over "
                f"{duration_text(RISE_LAG)} read yet")  # fmt: skip
    demand = state.demand[-1][1]
    now = f"demand's learned rise within {duration_text(RISE_LAG)} at the SLO's percentile: {1.0 + state.swing:.2f}x"
    swung = state.swung if swinging(state.swung, clock, demand) else None
    if swung is None or (state.envelope is None and delay is None):
        steady = "no demand, nothing held" if demand <= 0 else "the fleet follows it"
        return (kind, False, DemandSwingsReason.STEADY, f"{now}, not over {1.0 + SWING:g}x in the last "
                f"{ENVELOPE_WINDOW / 60:g} minutes: {steady}")  # fmt: skip
    ago = "this cycle" if swung >= clock else f"{duration_text(clock - swung)} ago"
    if state.envelope is None:
        return (kind, True, DemandSwingsReason.SWINGING, f"{now}; over {1.0 + SWING:g}x {ago}, faster than a pod "
                f"starts: not held for its peak, since spec.autoscaling.scaleDownDelay is set ({delay}): the fleet "
                f"follows it, and removes replicas once demand has stayed lower for {delay}")  # fmt: skip
    peak = f"its peak of the last {ENVELOPE_WINDOW / 60:g} minutes, {state.envelope:.3g} req/s"
    held = (
        f"the fleet is held for {peak}, instead of following it"
        if demand < state.envelope
        else f"demand is at {peak}, and forecast as usual there"
    )
    return (kind, True, DemandSwingsReason.SWINGING, f"{now}; over {1.0 + SWING:g}x {ago}, faster than a pod starts: "
            f"{held}")  # fmt: skip


def _preprocessing_row(
    inference: MultimodalInference,
    signals: Signals | None,
    unread: str | None,
    latency: float | None,
    target: float,
    label: str,
    was_bound: bool,
) -> ConditionRow | None:
    """PreprocessingBound for a vllm fleet with a ttft or e2e SLO: its latency misses the target while its engines
    queue nothing, most of its time to first token, and at least the miss, is spent before the engine takes the
    request, and the API server process uses a core (vLLM
    loads and preprocesses images there, the image processor on one thread per process, vLLM #58266, a queue its
    waiting count does not show, vLLM #44688). Each leg rules out a cause the others would miss: an engine past its
    capacity queues requests and lags its output (the calibration's 40 req/s), and a short TTFT is mostly outside the
    engine while nothing is saturated (its 20 req/s, 31%). ``was_bound``: the share and the cores it leaves on are
    ``PREPROCESSING_HYSTERESIS`` lower than those it turns on at. None for other backends."""
    if inference.spec.backend.name != "vllm":
        return None
    kind: ConditionType = "PreprocessingBound"
    unknown, no = PreprocessingBoundReason.NOT_MEASURED, PreprocessingBoundReason.NOT_API_SERVER_BOUND
    if signals is None or unread is not None:
        return (kind, None, unknown, f"not measured: {unread or 'nothing was read this cycle'}")
    if inference.spec.autoscaling and inference.spec.autoscaling.slo and inference.spec.autoscaling.slo.metric == "itl":
        return (kind, False, no, "an itl SLO: preprocessing adds to the time to first token, not between tokens")
    if latency is None:
        return (kind, None, unknown, f"not measured: no request finished over the last {RATE_WINDOW}")
    if latency <= target:
        return (kind, False, no, f"{label} {duration_text(latency)} <= target {duration_text(target)}")
    seen = signals.preprocessing
    if seen is None or seen.problem is not None:
        return (kind, None, unknown, f"not measured: {seen.problem if seen else 'not read this cycle'}")
    finished = (signals.request_rate or 0.0) * RATE_WINDOW_S
    if finished < PREPROCESSING_MIN_REQUESTS:
        return (kind, None, unknown, f"not measured: {finished:.0f} requests finished over the last {RATE_WINDOW}, "
                f"fewer than {PREPROCESSING_MIN_REQUESTS}")  # fmt: skip
    if seen.waiting_most is None:
        return (kind, None, unknown, "not measured: Prometheus has no engine queue for the fleet")
    if seen.waiting_most >= 1:
        return (kind, False, no, f"the engines queued requests over the last {RATE_WINDOW} (at most "
                f"{seen.waiting_most:g} waiting): the GPUs bound the latency")  # fmt: skip
    if seen.outside is None or seen.ttft_mean is None or seen.ttft_mean <= 0:
        return (kind, None, unknown, f"not measured: no request had a first token over the last {RATE_WINDOW}")
    share = max(0.0, seen.outside) / seen.ttft_mean
    slack = PREPROCESSING_HYSTERESIS if was_bound else 0.0
    measured = (
        f"{label} {duration_text(latency)} > target {duration_text(target)} with the engines queueing nothing, and "
        f"{duration_text(max(0.0, seen.outside))} of the mean time to first token, "
        f"{duration_text(seen.ttft_mean)}, before the engine took the request ({share:.0%})"
    )
    if share < PREPROCESSING_SHARE - slack:
        return (kind, False, no, f"{measured}: the engine's prefill is most of it")
    if max(0.0, seen.outside) < latency - target:
        return (kind, False, no, f"{measured}: less than the {duration_text(latency - target)} by which it misses "
                "the target, so not what misses it")  # fmt: skip
    if seen.api_cpu is None:
        return (kind, None, unknown, f"{measured}, but Prometheus has no {API_CPU_SERIES} for the servers' API "
                "processes (vLLM exports none with several, spec.multimodal.apiServers)")  # fmt: skip
    cpu = f"the busiest API server process at {seen.api_cpu:.2f} CPU cores"
    if was_bound and (share < PREPROCESSING_SHARE or seen.api_cpu < PREPROCESSING_CPU):
        low_share, low_cpu = PREPROCESSING_SHARE - slack, PREPROCESSING_CPU - slack
        cpu += f" (still above the {low_share:.0%} and {low_cpu:g} cores it turns False below)"
    if seen.api_cpu < PREPROCESSING_CPU - slack:
        return (kind, False, no, f"{measured}, {cpu}: it has CPU to spare")
    return (
        kind,
        True,
        PreprocessingBoundReason.API_SERVER_BOUND,
        f"{measured}, {cpu}: the API server's preprocessing (loading and processing images, tokenizing) bounds the "
        "latency, not the GPUs; raise spec.multimodal.apiServers and spec.resources.cpu "
        "(docs/troubleshooting.md#preprocessingbound-autoscaled-vllm-fleets)",
    )


def _idle_rule(autoscaling: AutoscalingSpec, memory: Memory, cold_start: float) -> IdleRule | None:
    """With minReplicas 0, how long the fleet stays warm while idle; None for a fleet that never goes to zero."""
    after = autoscaling.idle_after
    if after is None:
        return None
    return idle_rule(after, memory.idle.gaps, cold_start, None if after == "auto" else seconds(after))


def _idle_row(
    gap: IdleMemory, clock: float, rule: IdleRule, quiet: bool, problem: str | None, replicas: int
) -> ConditionRow:
    """The Idle condition of a live zero-capable fleet."""
    goes = f"the last replica goes after {duration_text(rule.wait)} idle ({rule.why})"
    if problem is not None:
        return ("Idle", None, IdleReason.NOT_MEASURED, f"not known this cycle ({problem}); {goes}")
    if not quiet:
        return ("Idle", False, IdleReason.SERVING, f"requests over the last {RATE_WINDOW}; {goes}")
    idle_for = duration_text(gap.idle_for(clock))
    if replicas == 0:
        return ("Idle", True, IdleReason.SCALED_TO_ZERO, f"no request for {idle_for}: scaling to zero ({rule.why})")
    return ("Idle", True, IdleReason.IDLE, f"no request for {idle_for}; {goes}")


def _at_zero(
    inference: MultimodalInference,
    seen: Seen,
    memory: Memory,
    clock: float,
    rule: IdleRule,
    cold_start: float,
    target: float,
    label: str,
) -> Outcome:
    """A fleet at zero replicas: nothing serves, nothing is scraped but its endpoint picker, whose held requests
    bring it back to one replica (its policy sizes it from there once that replica's series are read). The held
    requests are read even when the servers' queries were not answered: other fleets' trouble must not keep it down.
    """
    signals = seen.signals
    held = None if signals is None else signals.held
    pods = seen.pods
    conditions: tuple[ConditionRow, ...]
    if held is None:
        problem = (signals.held_problem if signals is not None else None) or seen.outage or "no answer"
        conditions = (
            (
                "MetricsAvailable",
                False,
                MetricsAvailableReason.QUERY_FAILED,
                f"the endpoint picker's held requests could not be read: {problem}; holding 0 replicas, so a "
                "request waits in the picker until its TTL",
            ),
            NOTHING_MEASURED,
            _limits(inference, 0, pods, None, target, label),
            ("Idle", None, IdleReason.NOT_MEASURED, f"0 replicas; the picker could not be read ({problem})"),
        )
        reason = "scaled to zero, the picker not read: holding 0"
        return Outcome(0, 0, reason, "metrics_unavailable", memory, latency=None, idle=False, conditions=conditions)
    metrics: ConditionRow = (
        "MetricsAvailable",
        None,
        MetricsAvailableReason.NO_POD_SERVING,
        f"scaled to zero, no server to scrape; the endpoint picker holds {held:g} requests",
    )
    if held > 0:
        idle_for = duration_text(memory.idle.idle_for(clock))
        memory = replace(memory, idle=memory.idle.seen(False, clock))
        conditions = (
            metrics,
            ("SLOMet", None, SloMetReason.NO_REQUESTS_FINISHED, f"{held:g} requests held until a replica is Ready"),
            _limits(inference, 1, pods, None, target, label),
            (
                "Idle",
                False,
                IdleReason.WAKING_UP,
                f"{held:g} requests held by the endpoint picker; a replica is starting (cold start about "
                f"{duration_text(cold_start)})",
            ),
        )
        reason = f"{held:g} requests held by the endpoint picker after {idle_for} idle: 0 -> 1"
        return Outcome(0, 1, reason, "scaled_up", memory, latency=None, idle=False, conditions=conditions)
    # The gap goes on (after an operator restart at zero it is timed from now, and not learned).
    memory = replace(memory, idle=memory.idle.seen(True, clock))
    idle_for = duration_text(memory.idle.idle_for(clock))
    conditions = (
        metrics,
        ("SLOMet", True, SloMetReason.NO_REQUESTS, "no requests: scaled to zero"),
        _limits(inference, 0, pods, None, target, label),
        (
            "Idle",
            True,
            IdleReason.SCALED_TO_ZERO,
            f"0 replicas, no request for {idle_for}; the endpoint picker holds the next request, and the autoscaler "
            f"adds a replica in its first cycle after Prometheus scrapes the picker (cold start about "
            f"{duration_text(cold_start)})",
        ),
    )
    reason = f"scaled to zero (no request for {idle_for}): holding 0"
    return Outcome(0, 0, reason, "held", memory, latency=None, idle=True, conditions=conditions)


def _limits(
    inference: MultimodalInference, replicas: int, pods: Pods, latency: float | None, target: float, label: str
) -> ConditionRow:
    """ScalingLimited: pods that cannot be placed come first, they are what a user must fix."""
    autoscaling = inference.spec.autoscaling
    assert autoscaling is not None
    if pods.unschedulable:
        return (
            "ScalingLimited",
            True,
            ScalingLimitedReason.PODS_UNSCHEDULABLE,
            f"{pods.unschedulable} pods cannot be scheduled ({pods.why_unschedulable}); "
            "not adding more until they start",
        )
    if replicas >= autoscaling.max_replicas:
        over = ""
        if latency and latency > target:
            over = f" while {label} {duration_text(latency)} > target {duration_text(target)}"
        return (
            "ScalingLimited",
            True,
            ScalingLimitedReason.AT_MAX_REPLICAS,
            f"{replicas} replicas is spec.autoscaling.maxReplicas{over}; raise it to let the fleet grow",
        )
    return (
        "ScalingLimited",
        False,
        ScalingLimitedReason.WITHIN_RANGE,
        f"{replicas} replicas within minReplicas {autoscaling.min_replicas} and maxReplicas {autoscaling.max_replicas}",
    )


def attainment(verdicts: tuple[tuple[float, bool], ...]) -> float | None:
    return round(sum(met for _, met in verdicts) / len(verdicts), 3) if verdicts else None
