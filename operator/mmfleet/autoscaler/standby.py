"""Warm standby: which replicas sleep and which serve, decided from the pods alone (no I/O).

A fleet with ``autoscaling.warmStandby`` runs the autoscaler's replicas plus ``replicas`` more in one Deployment
(whose ``mmfleet.io/standby-replicas`` annotation says how many of its replicas are the standby's). The Service and
the InferencePool select ``mmfleet.io/serving: "true"`` besides the fleet's labels, so a pod the operator labels
``"false"`` leaves routing while it stays Ready for its Deployment (a readiness gate would hold every rollout and the
PodDisruptionBudget on the sleeping pods). The pod's ``mmfleet.io/sleep`` annotation says how far it got:
``sleeping`` (out of routing, vLLM's ``/sleep`` under way), ``asleep``, ``waking``. A sleeping pod also carries a low
``controller.kubernetes.io/pod-deletion-cost``, so a scale-down deletes it before a serving one.

Each cycle the serving pods are brought to the autoscaler's count: asleep pods are woken first (seconds), and
serving pods beyond it (the Deployment's replacements, once Ready) are put to sleep, the youngest first, but never
while the Deployment is deleting pods (more live pods than it wants: the pod to sleep might be the one going). A pod
without the label (one from before standby was on) serves and is labelled so. With standby turned off, every
sleeping pod is woken.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

from mmfleet.api import StandbyStatus, duration_text
from mmfleet.autoscaler.cycle import Pods, count_pods, should_report
from mmfleet.render import SERVING_LABEL

SLEEP_ANNOTATION = "mmfleet.io/sleep"
# Kubernetes' ReplicaSet deletes pods of lower cost first (controller.kubernetes.io/pod-deletion-cost).
DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
ASLEEP_DELETION_COST = "-1000"
# The events of a wake that worked, and of a sleep or wake that failed.
WOKE_EVENT = "WokeStandby"
FAILED_EVENT = "StandbyFailed"
WAKES_KEPT = 16  # the wake times the status's median is over
Intent = Literal["wake", "sleep"]


@dataclass(frozen=True)
class PodView:
    """What the plan needs of one pod."""

    name: str
    ip: str
    created: str  # RFC 3339, so it sorts by time
    healthy: bool  # Ready and not terminating: its server answers
    live: bool  # not terminating, not finished
    serving: bool | None  # the label: None when absent
    state: str | None  # the annotation


@dataclass(frozen=True)
class Plan:
    """What to do to which pods this cycle."""

    wake: tuple[PodView, ...] = ()
    sleep: tuple[PodView, ...] = ()
    label: tuple[PodView, ...] = ()  # serving, unlabelled: label them so the Service keeps them

    @property
    def empty(self) -> bool:
        return not (self.wake or self.sleep or self.label)


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def view(pod: dict[str, Any]) -> PodView:
    meta = pod.get("metadata") or {}
    label = (meta.get("labels") or {}).get(SERVING_LABEL)
    status = pod.get("status") or {}
    live = not meta.get("deletionTimestamp") and status.get("phase") not in ("Succeeded", "Failed")
    return PodView(
        name=str(meta.get("name", "")),
        ip=str(status.get("podIP") or ""),
        created=str(meta.get("creationTimestamp") or ""),
        healthy=live and status.get("phase") == "Running" and _ready(pod) and bool(status.get("podIP")),
        live=live,
        serving=None if label is None else label == "true",
        state=(meta.get("annotations") or {}).get(SLEEP_ANNOTATION),
    )


def resting(pod: dict[str, Any]) -> bool:
    """A pod out of routing (asleep, or on its way to or from sleep): not one of the autoscaler's replicas."""
    return view(pod).serving is False


def serving_pods(pods: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods the autoscaler counts as its replicas."""
    return [pod for pod in pods if not resting(pod)]


def reporting_resting(pods: Iterable[dict[str, Any]], now: datetime) -> int:
    """Ready pods out of routing that Prometheus has had a scrape interval to find: it scrapes them too (their series
    are zeros), so the count of pods reporting series holds them beside the serving ones."""
    return should_report(count_pods(pod for pod in pods if resting(pod) and view(pod).healthy), now)


def active_count(pods: Pods, target: int, waking: int = 0) -> Pods:
    """``pods`` of the serving ones, with the starting and the unschedulable pods the target can still use beside
    those Ready and ``waking``: the Deployment's others are the standby's replacements, neither capacity coming nor a
    reason to stop growing (a replacement left Pending must not keep the other sleeping pods from being woken)."""
    free = max(0, target - pods.ready - waking)
    starting = min(pods.starting, free)
    unschedulable = min(pods.unschedulable, free - starting)
    return replace(
        pods,
        starting=starting,
        unschedulable=unschedulable,
        why_unschedulable=pods.why_unschedulable if unschedulable else "",
    )


def waking(pods: Iterable[dict[str, Any]], busy: Mapping[str, Intent]) -> int:
    """Pods being woken (or queued to be): the serving count's, though not in routing yet."""
    return sum(1 for v in map(view, pods) if v.live and v.serving is False and "wake" in (v.state, busy.get(v.name)))


def plan(
    pods: Iterable[dict[str, Any]],
    serving: int | None,
    total: int,
    busy: Mapping[str, Intent],
    blocked: Set[str] = frozenset(),
) -> Plan:
    """Bring the healthy serving pods to ``serving`` (None: standby is off, wake every pod); ``total``: the replicas the
    Deployment is asked for; ``busy``: pods with a wake or a sleep under way or queued, left alone and counted where
    they are going; ``blocked``: pods whose last call failed, left alone until their backoff ends."""
    views = [view(pod) for pod in pods]
    idle = [v for v in views if v.healthy and v.name not in busy and v.name not in blocked]
    label = tuple(v for v in idle if v.serving is None)
    out = [v for v in idle if v.serving is False]
    if serving is None:
        return Plan(wake=tuple(sorted(out, key=lambda v: v.created)), label=label)
    now_serving = [v for v in idle if v.serving is not False]
    coming = sum(1 for v in views if v.live and busy.get(v.name) == "wake")  # a pod gone mid-wake brings nothing
    need = serving - len(now_serving) - coming
    if need > 0:
        # A wake cut short (a restart of the operator) is tried again like a sleeping pod's.
        asleep = sorted((v for v in out if v.state in ("asleep", "waking")), key=lambda v: v.created)
        return Plan(wake=tuple(asleep[:need]), label=label)
    if sum(1 for v in views if v.live) > total:
        return Plan(label=label)  # the Deployment is deleting pods: which ones, it decides first
    # Out of routing but not asleep: a sleep that failed or was cut short is tried again (vLLM's /sleep of a sleeping
    # engine changes nothing).
    unfinished = tuple(v for v in out if v.state not in ("asleep",))
    extra = sorted(now_serving, key=lambda v: v.created, reverse=True)[: max(0, -need)]
    return Plan(sleep=(*extra, *unfinished), label=tuple(v for v in label if v not in extra))


def _asleep(v: PodView) -> bool:
    return v.healthy and v.serving is False and v.state == "asleep"


def asleep(pods: Iterable[dict[str, Any]]) -> int:
    """The pods asleep and out of routing, which a scale-up can wake."""
    return sum(1 for pod in pods if _asleep(view(pod)))


def median_wake(wakes: Iterable[float]) -> float | None:
    """The fleet's wake time, s: the median of its measured wakes; None before its first."""
    times = list(wakes)
    return statistics.median(times) if times else None


def status(pods: Iterable[dict[str, Any]], wakes: Iterable[float], problem: str | None) -> StandbyStatus:
    """What the fleet's status shows of its standby."""
    views = [view(pod) for pod in pods]
    times = list(wakes)
    wake = median_wake(times)
    return StandbyStatus(
        asleep=sum(1 for v in views if _asleep(v)),
        serving=sum(1 for v in views if v.healthy and v.serving is not False),
        wake=None if wake is None else duration_text(wake),
        wakes=len(times) or None,
        problem=problem,
    )
