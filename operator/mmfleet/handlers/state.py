"""What the handlers share: the operator's memory between calls, and the one way status is written."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import kopf
from pydantic import ValidationError

from mmfleet.api import MultimodalInferenceStatus
from mmfleet.autoscaler import cycle
from mmfleet.config import OperatorConfig
from mmfleet.kube import Kube

log = logging.getLogger("mmfleet")

Key = tuple[str, str]
Body = dict[str, Any]
# Condition transitions a person should hear about, as Warning events: the status that is bad news.
WARNING_WHEN = {"Degraded": "True", "MetricsAvailable": "False", "ScalingLimited": "True"}
EventPoster = Callable[[Mapping[str, Any], str, str, str], None]  # (object, type, reason, message)


@dataclass
class State:
    """What the operator keeps between handler calls (created at startup)."""

    config: OperatorConfig = field(default_factory=OperatorConfig)
    kube: Kube | None = None
    monitoring_crds: bool = False
    monitoring_checked_at: float = -math.inf
    detected_cloud: str = "generic"
    detected_at: float = -math.inf
    # Generation or resourceVersion of each child as our last apply left it, to tell hand edits apart.
    applied: dict[str, tuple[int, str]] = field(default_factory=dict)
    children: defaultdict[Key, set[str]] = field(default_factory=lambda: defaultdict(set))
    written: dict[Key, MultimodalInferenceStatus] = field(default_factory=dict)
    locks: defaultdict[Key, threading.Lock] = field(default_factory=lambda: defaultdict(threading.Lock))
    # The autoscaler's memory of each autoscaled fleet (policy state, attainment, cold start).
    scaling: dict[Key, cycle.Memory] = field(default_factory=dict)
    autoscaler: asyncio.Task[None] | None = None


STATE = State()


def get_kube() -> Kube:
    if STATE.kube is None:
        STATE.kube = Kube()
    return STATE.kube


def previous_status(body: Body) -> MultimodalInferenceStatus | None:
    try:
        return MultimodalInferenceStatus.model_validate(body.get("status") or {})
    except ValidationError:
        return None


def kopf_event(body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    target = body if isinstance(body, kopf.Body) else kopf.Body(cast(kopf.RawBody, dict(body)))
    kopf.event(target, type=type_, reason=reason, message=message)


def write_status(
    body: kopf.Body | Body,
    new: MultimodalInferenceStatus,
    previous: MultimodalInferenceStatus | None,
    post: EventPoster = kopf_event,
) -> None:
    """Write status only when it changed, and tell the user about transitions as events.

    "Changed" is judged against what this process last wrote (the operator is the only writer),
    because the watched copy of the resource can lag behind our own last patch. ``post`` posts an
    event: kopf's poster from handlers, the API server directly from the autoscaler loop.
    """
    wire = new.wire()
    meta = body["metadata"]
    key = (meta["namespace"], meta["name"])
    previous = STATE.written.get(key, previous)
    if previous is not None and previous.wire() == wire:
        return
    get_kube().patch_status(meta["namespace"], meta["name"], wire)
    STATE.written[key] = new
    before = {c.type: c for c in previous.conditions} if previous else {}
    for condition in new.conditions:
        old = before.get(condition.type)
        if old is not None and (old.status, old.reason) == (condition.status, condition.reason):
            continue
        if condition.status == WARNING_WHEN.get(condition.type):
            post(body, "Warning", condition.reason, condition.message)
        elif condition.type == "Ready" and condition.status == "True":
            post(body, "Normal", "Ready", condition.message)


def utc_now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)
