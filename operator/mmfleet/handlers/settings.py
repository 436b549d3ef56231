"""kopf's settings for this operator, set once at startup, and what happens at cleanup."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, cast

import kopf

from mmfleet import telemetry
from mmfleet.handlers.children import CHILD_KINDS, OPTIONAL_KINDS, child_labels
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


def label_selector(labels: Mapping[str, Any]) -> str:
    """A kopf ``labels=`` filter as the API server's label selector: present, or equal to a value."""
    terms = []
    for key, value in sorted(labels.items()):
        if value is kopf.PRESENT:
            terms.append(key)
        elif isinstance(value, str):
            terms.append(f"{key}={value}")
        else:
            raise TypeError(f"label {key}: a filter the API server cannot apply ({value!r})")
    return ",".join(terms)


def watch_only_labelled(settings: kopf.OperatorSettings) -> None:
    """Each child kind's watch asks the API server only for the objects its handlers take (their labels), so the
    cluster's other pods, ConfigMaps, Services and the rest never reach kopf: kopf filters ``labels=`` itself, after
    parsing every event of the kind, and keeps a memory of every object it was sent. A child whose labels are
    taken off leaves the watch as a deletion, so the fleet applies it again."""
    for group, version, plural in CHILD_KINDS:
        settings.watching.label_selectors[group, version, plural] = label_selector(child_labels(plural))


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
    watch_only_labelled(settings)
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
