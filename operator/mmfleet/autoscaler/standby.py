"""Warm standby: which replicas sleep and which serve, decided from the pods alone (no I/O).

A fleet with ``autoscaling.warmStandby`` runs the autoscaler's replicas plus ``replicas`` more in one Deployment.
The Service and the InferencePool select ``mmfleet.io/serving: "true"`` besides the fleet's labels, so a pod the
operator labels ``"false"`` leaves routing while it stays Ready for its Deployment (a readiness gate would hold
every rollout and the PodDisruptionBudget on the sleeping pods). The pod's ``mmfleet.io/sleep`` annotation says how
far it got: ``sleeping`` (out of routing, vLLM's ``/sleep`` under way), ``asleep``, ``waking``.

Each cycle the serving pods are brought to the autoscaler's count: asleep pods are woken first (seconds), and
serving pods beyond it (the Deployment's replacements, once Ready) are put to sleep, the youngest first. A pod
without the label (one from before standby was on) serves and is labelled so.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Set
from dataclasses import dataclass, replace
from typing import Any, Literal

from mmfleet.api import StandbyStatus, duration_text
from mmfleet.autoscaler.cycle import Pods
from mmfleet.render import SERVING_LABEL

SLEEP_ANNOTATION = "mmfleet.io/sleep"
# The events of a wake that worked, and of a sleep or wake that failed.
WOKE_EVENT = "WokeStandby"
FAILED_EVENT = "StandbyFailed"
SleepState = Literal["sleeping", "asleep", "waking"]


@dataclass(frozen=True)
class PodView:
    """What the plan needs of one pod."""

    name: str
    ip: str
    created: str  # RFC 3339, so it sorts by time
    healthy: bool  # Ready and not terminating: its server answers
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
    live = not meta.get("deletionTimestamp") and status.get("phase") == "Running"
    return PodView(
        name=str(meta.get("name", "")),
        ip=str(status.get("podIP") or ""),
        created=str(meta.get("creationTimestamp") or ""),
        healthy=live and _ready(pod) and bool(status.get("podIP")),
        serving=None if label is None else label == "true",
        state=(meta.get("annotations") or {}).get(SLEEP_ANNOTATION),
    )


def resting(pod: dict[str, Any]) -> bool:
    """A pod out of routing (asleep, or on its way to or from sleep): not one of the autoscaler's replicas."""
    return view(pod).serving is False


def serving_pods(pods: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods the autoscaler counts as its replicas."""
    return [pod for pod in pods if not resting(pod)]


def active_count(pods: Pods, target: int) -> Pods:
    """``pods`` of the serving ones, with the starting pods the target can still use: the Deployment's other starting
    pods are the standby's replacements, no capacity for the SLO."""
    return replace(pods, starting=min(pods.starting, max(0, target - pods.ready)))


def plan(pods: Iterable[dict[str, Any]], serving: int, busy: Set[str]) -> Plan:
    """Bring the healthy serving pods to ``serving``; ``busy``: pods with a wake or a sleep under way, left alone
    (and counted where they are going)."""
    views = [view(pod) for pod in pods]
    healthy = [v for v in views if v.healthy]
    going = [v for v in healthy if v.name in busy]
    idle = [v for v in healthy if v.name not in busy]
    label = tuple(v for v in idle if v.serving is None)
    now_serving = [v for v in idle if v.serving is not False]
    coming = sum(1 for v in going if v.state == "waking")
    need = serving - len(now_serving) - coming
    if need > 0:
        # A wake cut short (a restart of the operator) is tried again like a sleeping pod's.
        asleep = sorted(
            (v for v in idle if v.serving is False and v.state in ("asleep", "waking")), key=lambda v: v.created
        )
        return Plan(wake=tuple(asleep[:need]), label=label)
    # Out of routing but not asleep: a sleep that failed or was cut short is tried again (vLLM's /sleep of a sleeping
    # engine changes nothing).
    unfinished = tuple(v for v in idle if v.serving is False and v.state != "asleep")
    extra = sorted(now_serving, key=lambda v: v.created, reverse=True)[: -need if need < 0 else 0]
    return Plan(sleep=(*extra, *unfinished), label=tuple(v for v in label if v not in extra))


WAKES_KEPT = 16  # the wake times the status's median is over


def status(pods: Iterable[dict[str, Any]], wakes: Iterable[float], problem: str | None) -> StandbyStatus:
    """What the fleet's status shows of its standby."""
    views = [view(pod) for pod in pods]
    times = list(wakes)
    return StandbyStatus(
        asleep=sum(1 for v in views if v.healthy and v.serving is False and v.state == "asleep"),
        serving=sum(1 for v in views if v.healthy and v.serving is not False),
        wake=duration_text(statistics.median(times)) if times else None,
        wakes=len(times) or None,
        problem=problem,
    )
