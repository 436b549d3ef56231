"""kopf's settings for this operator, set once at startup, and what happens at cleanup."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable
from typing import Any, cast

import kopf
from kopf._cogs.clients import errors, watching

from mmfleet import telemetry
from mmfleet.handlers.children import OPTIONAL_KINDS
from mmfleet.handlers.discovery import monitoring_crds
from mmfleet.handlers.records import log, operator_of

# kopf keeps a worker per watched object (with its queue and last event) this long after its last event; at the
# default 5 s, a burst of creations kept thousands alive at once.
WORKER_IDLE_SECONDS = 1.0


class EmptyEssence(kopf.AnnotationsDiffBaseStorage):
    """kopf's diff base, never built: no handler of ours reads a diff (there is no change handler).

    kopf builds the essence of every watched event, pods' included, by deep-copying the body, and diffs it
    against the stored one (kopf 1.45.2, ``kopf/_core/reactor/processing.py``, ``_detect_causes``), whether or
    not a change handler will read it.
    """

    def build(self, *, body: kopf.Body, extra_fields: Iterable[kopf.FieldSpec] | None = None) -> kopf.BodyEssence:
        return cast(kopf.BodyEssence, {})


class OptionalKindUnresolved(logging.Filter):
    """Drops kopf's warning that a watch of an optional child kind has no CRD to serve it (``OPTIONAL_KINDS``): the
    operator renders none of that kind then, and kopf repeats its warning whenever any CRD of the cluster changes. A
    warning that names another kind as well passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if not text.startswith("Unresolved resources cannot be served"):
            return True
        named = text.split(":", 1)[1].split("), ")
        return not all(any(_names(selector, kind) for kind in OPTIONAL_KINDS) for selector in named)


def _names(selector: str, kind: tuple[str, str, str]) -> bool:
    group, _, plural = kind
    return repr(group) in selector and repr(plural) in selector


def quiet_optional_kinds() -> None:
    """Installs ``OptionalKindUnresolved`` on kopf's resource observer, once."""
    observer = logging.getLogger("kopf._core.reactor.observation")
    if not any(isinstance(f, OptionalKindUnresolved) for f in observer.filters):
        observer.addFilter(OptionalKindUnresolved())


# How long a watch of a kind found no longer served waits before it asks again; kopf stops it within moments.
GONE_KIND_RETRY_SECONDS = 1.0


async def _watch_until_gone(**kwargs: Any) -> AsyncIterator[Any]:
    """kopf's ``continuous_watch``, but a kind no longer served ends the stream instead of the operator.

    Deleting a CRD closes its watches, and kopf reconnects at once: when that is before its CRD observer has seen
    the deletion, the reconnect meets a plain ``404 page not found``, which kopf 1.45.2 raises out of every watcher
    (``kopf/_cogs/clients/watching.py``, ``infinite_watch`` tolerates only 429), and the whole operator exits
    (CI, 2026-12-03: the PodMonitor CRD deleted under a running operator). Ending the stream sends kopf back to
    ``infinite_watch``'s loop, until its observer stops the watcher of a kind it no longer serves.
    """
    try:
        async for event in KOPF_CONTINUOUS_WATCH(**kwargs):
            yield event
    except errors.APINotFoundError:
        log.info("%s is no longer served; its watch waits for kopf to stop it", kwargs["resource"])
        await asyncio.sleep(GONE_KIND_RETRY_SECONDS)


KOPF_CONTINUOUS_WATCH = watching.continuous_watch


def survive_removed_kinds() -> None:
    """Installs ``_watch_until_gone`` in kopf's watch loop, once."""
    watching.continuous_watch = _watch_until_gone


def configure_operator(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    op = operator_of(memo)
    # No handler needs a finalizer or stores progress; kopf's annotations are named under mmfleet.io should one ever.
    settings.persistence.finalizer = "mmfleet.io/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="mmfleet.io")
    settings.persistence.diffbase_storage = EmptyEssence(prefix="mmfleet.io", key="last-handled-configuration")
    # kopf's own log lines become Kubernetes Events only from warnings up (not one per handler success);
    # the operator's own events (Ready, Degraded) are posted explicitly with kopf.event.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 600
    # kopf's own requests (events) end within this long. Watches are bounded by server_timeout and kopf's
    # inactivity_timeout.
    settings.networking.request_timeout = 30
    settings.networking.connect_timeout = 5
    settings.queueing.idle_timeout = WORKER_IDLE_SECONDS
    if op.tracer_provider is None:
        op.tracer_provider = telemetry.setup()
    absent = "absent (PodMonitors are neither applied nor watched until they are served)"
    log.info("mmfleet operator started: monitoring CRDs %s", "found" if monitoring_crds(op) else absent)


def report_requests(memo: kopf.Memo, **_: Any) -> None:
    op = operator_of(memo)
    log.info("API requests made: %d", op.get_kube().requests)
    if op.tracer_provider is not None:  # send the last batch of spans
        op.tracer_provider.shutdown()
        op.tracer_provider = None
