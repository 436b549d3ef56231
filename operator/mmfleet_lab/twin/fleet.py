"""A fleet of pods around an engine: scheduling, cold start, readiness, drain, routing, GPU time.

- A pod is created when the desired count rises. If a GPU slot is free it is scheduled at once and
  holds its GPUs from then (``starting``), becoming Ready ``cold_start`` seconds later; otherwise it
  stays Pending (``unschedulable``) until GPUs free up (FIFO). Its creation -> Ready, Pending time
  included, is what the operator measures as the cold start.
- On scale-down pods go in the order a ReplicaSet deletes them: Pending first, then not-Ready
  (newest first), then Ready (most recently Ready first). A deleted starting pod frees its GPUs at
  once. A deleted Ready pod *drains*: the router stops sending to it, it finishes everything already
  sent to it (running and queued), then frees its GPUs, as vLLM does on SIGTERM with
  ``--shutdown-timeout`` (mmfleet renders it; see ``mmfleet.backends.vllm``).
- The router sends each request to a Ready, non-draining pod: by default the one with the fewest outstanding
  requests (the engine does it, as its ``Router`` says). With no Ready pod a request is held at the gateway until
  one is Ready.
- GPU time counts from the moment a pod holds its GPUs, Ready or not, until it releases them.
- Warm standby (``standby`` > 0, as ``spec.autoscaling.warmStandby`` with ``mmfleet.autoscaler.standby``): the
  Deployment runs ``desired`` serving pods and ``standby`` more. A Ready pod beyond the serving count is put to sleep:
  it gets no new request, finishes what it holds (``/sleep?mode=wait``; phase ``sleeping``), then is ``asleep``,
  holding its GPUs. A scale-up wakes asleep pods first: ``waking`` for ``wake`` seconds (the phase of its own that
  a GPU measurement would fit), then Ready, serving again; new pods replace them and go to sleep once Ready. A
  scale-down puts the youngest Ready pods to sleep and deletes asleep pods first (their deletion cost is lowest).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Literal

import numpy as np

from mmfleet_lab.twin.engine import Engine

Phase = Literal["unschedulable", "starting", "ready", "draining", "gone", "sleeping", "asleep", "waking"]
# Phases of a warm-standby pod out of routing (only with standby > 0).
RESTING: tuple[Phase, ...] = ("sleeping", "asleep", "waking")


@dataclass
class Pod:
    """One replica's pod; times in seconds from the start of the run."""

    pid: int
    created: float
    phase: Phase
    bound: float | None = None  # GPUs held from
    ready_at: float | None = None  # when it is (or will be) Ready
    released: float | None = None  # GPUs freed at
    rid: int | None = None  # the engine replica serving it, once Ready
    awake_at: float | None = None  # when a waking pod serves again


class Fleet:
    """Pods and their lifecycle around an ``Engine``; see the module docstring."""

    def __init__(
        self,
        engine: Engine,
        *,
        cold_start: float,
        initial: int,
        gpus_per_replica: int = 1,
        gpus_available: int | None = None,
        standby: int = 0,
        wake: float = 0.0,
    ) -> None:
        self.engine = engine
        self.cold_start = cold_start
        self.standby, self.wake = standby, wake
        self.woken = False  # the operator knows a fleet's wake time once it has woken a pod
        self.gpus_per_replica = gpus_per_replica
        self.slots = math.inf if gpus_available is None else gpus_available // gpus_per_replica
        self.pods: list[Pod] = []
        self.desired = 0
        self.held = np.zeros(0, dtype=np.int64)  # requests waiting at the gateway for a Ready pod
        for _ in range(initial + standby):  # the run starts with a warm fleet, its pods created one cold start ago
            pod = self._new_pod(0.0)
            if pod.phase == "starting":
                pod.created, pod.ready_at = -cold_start, 0.0
        self.desired = initial
        self.transitions(0.0)

    # ---------------------------------------------------------------- counts
    def count(self, phase: Phase) -> int:
        return sum(1 for p in self.pods if p.phase == phase)

    def measured_cold_start(self) -> float | None:
        """The median creation -> Ready of the Ready pods, as the operator measures it (``cycle.count_pods``)."""
        spans = [p.ready_at - p.created for p in self.pods if p.phase in ("ready", *RESTING) and p.ready_at is not None]
        return statistics.median(spans) if spans else None

    def _holding(self) -> int:
        return sum(1 for p in self.pods if p.phase in ("starting", "ready", "draining", *RESTING))

    def live(self) -> list[Pod]:
        """Pods that count towards the Deployment's replicas (not draining, not gone)."""
        return [p for p in self.pods if p.phase in ("unschedulable", "starting", "ready", *RESTING)]

    def next_event(self) -> float:
        """The next time a starting pod becomes Ready, or a waking one serves."""
        starts = (p.ready_at for p in self.pods if p.phase == "starting" and p.ready_at is not None)
        wakes = (p.awake_at for p in self.pods if p.phase == "waking" and p.awake_at is not None)
        return min((*starts, *wakes), default=math.inf)

    def measured_wake(self) -> float | None:
        """The wake time as the operator has it: measured once a pod has been woken."""
        return self.wake if self.woken else None

    def serving_counts(self) -> tuple[int, int, int]:
        """(Ready, starting, unschedulable) pods as the operator counts them for the policy
        (``standby.active_count``): with standby, only the starting and Pending ones the serving count can still
        use; the others are its replacements."""
        ready, starting, unschedulable = self.count("ready"), self.count("starting"), self.count("unschedulable")
        if not self.standby:
            return ready, starting, unschedulable
        free = max(0, self.desired - ready - self.count("waking"))
        starting = min(starting, free)
        return ready, starting, min(unschedulable, free - starting)

    # ---------------------------------------------------------------- scaling
    def _new_pod(self, t: float) -> Pod:
        pod = Pod(pid=len(self.pods), created=t, phase="unschedulable")
        self.pods.append(pod)
        self._schedule(pod, t)
        return pod

    def _schedule(self, pod: Pod, t: float) -> None:
        if self._holding() < self.slots:
            pod.phase = "starting"
            pod.bound = t
            pod.ready_at = t + self.cold_start

    def scale(self, desired: int, t: float) -> None:
        """Set the Deployment's replicas at time ``t`` (with standby: the serving ones; the Deployment has
        ``standby`` more)."""
        self.desired = desired
        if self.standby:
            self._tend(t)
            desired += self.standby
        live = self.live()
        if desired > len(live):
            for _ in range(desired - len(live)):
                self._new_pod(t)
        elif desired < len(live):

            def rank(p: Pod) -> tuple[int, float]:
                # A ReplicaSet deletes Pending pods, then not-Ready ones, then Ready ones of the lowest deletion cost
                # (an asleep pod's), then the most recently Ready.
                if p.phase == "unschedulable":
                    return (0, -p.created)
                if p.phase == "starting":
                    return (1, -p.created)
                if p.phase == "asleep":
                    return (2, -p.created)
                return (3, -(p.ready_at or 0.0))

            for pod in sorted(live, key=rank)[: len(live) - desired]:
                if pod.phase in ("ready", "sleeping", "waking"):
                    pod.phase = "draining"
                elif pod.phase in ("asleep", "starting"):
                    pod.phase = "gone"
                    pod.released = t
                else:
                    pod.phase = "gone"
            self._schedule_pending(t)
        self.transitions(t)

    def _tend(self, t: float) -> None:
        """Warm standby: bring the serving pods (Ready or waking) to ``desired``, waking asleep pods first and putting
        the youngest Ready ones beyond it to sleep."""
        serving = self.count("ready") + self.count("waking")
        if serving < self.desired:
            for pod in [p for p in self.pods if p.phase == "asleep"][: self.desired - serving]:
                pod.phase, pod.awake_at = "waking", t + self.wake
                self.woken = True
        elif serving > self.desired:
            ready = sorted((p for p in self.pods if p.phase == "ready"), key=lambda p: -(p.ready_at or 0.0))
            for pod in ready[: serving - self.desired]:
                pod.phase = "sleeping"

    def _schedule_pending(self, t: float) -> None:
        for pod in self.pods:
            if pod.phase == "unschedulable":
                self._schedule(pod, t)

    def transitions(self, t: float) -> None:
        """Starting pods whose cold start is over become Ready; drained pods free their GPUs."""
        for pod in self.pods:
            if pod.phase == "starting" and pod.ready_at is not None and pod.ready_at <= t + 1e-9:
                pod.phase = "ready"
                pod.rid = self.engine.add_replica()
            elif pod.phase == "waking" and pod.awake_at is not None and pod.awake_at <= t + 1e-9:
                pod.phase = "ready"
        if self.standby:
            self._tend(t)
        out = self.engine.outstanding() if any(p.phase in ("draining", "sleeping") for p in self.pods) else None
        freed = False
        for pod in self.pods:
            if out is None or pod.rid is None or out[pod.rid] != 0:
                continue
            if pod.phase == "draining":
                pod.phase = "gone"
                pod.released = t
                freed = True
            elif pod.phase == "sleeping":
                pod.phase = "asleep"
        if freed:
            self._schedule_pending(t)

    # ---------------------------------------------------------------- serving
    def eligible(self) -> np.ndarray:
        return np.array([p.rid for p in self.pods if p.phase == "ready" and p.rid is not None], dtype=np.int64)

    def run(self, t0: float, t1: float, idx: np.ndarray) -> None:
        """Serve arrivals ``idx`` (in [t0, t1)) and advance the engine to ``t1``."""
        eligible = self.eligible()
        if eligible.size == 0:
            self.held = np.r_[self.held, idx]
            self.engine.run(t0, t1, np.zeros(0, dtype=np.int64), eligible)
            return
        if self.held.size:
            idx = np.r_[self.held, idx]
            self.held = np.zeros(0, dtype=np.int64)
        self.engine.run(t0, t1, idx, eligible)

    def scrape_targets(self) -> list[Pod]:
        """Pods Prometheus scrapes: those serving /metrics (Ready or draining; with standby, one finishing its
        requests before it sleeps; the operator leaves the series of pods out of routing out of its count)."""
        return [p for p in self.pods if p.phase in ("ready", "draining", "sleeping") and p.rid is not None]

    # ---------------------------------------------------------------- accounting
    def gpu_seconds(self, horizon: float) -> tuple[float, float]:
        """(total, before Ready) GPU-seconds up to ``horizon``."""
        total = starting = 0.0
        for p in self.pods:
            if p.bound is None or p.bound >= horizon:
                continue
            end = min(p.released if p.released is not None else horizon, horizon)
            total += (end - p.bound) * self.gpus_per_replica
            ready = min(p.ready_at if p.ready_at is not None else end, end)
            starting += max(ready - p.bound, 0.0) * self.gpus_per_replica
        return total, starting

    def holds(self, horizon: float) -> np.ndarray:
        """(from, to) of each pod's hold on its GPUs up to ``horizon``, one row per pod that held any."""
        spans = [
            (p.bound, min(p.released if p.released is not None else horizon, horizon))
            for p in self.pods
            if p.bound is not None and p.bound < horizon
        ]
        return np.asarray(spans, dtype=float).reshape(-1, 2)
