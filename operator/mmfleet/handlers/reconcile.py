"""One reconcile of one fleet, the only one there is: whatever asked for it (mmfleet.handlers.triggers).

Parse the spec; when the generation is new to this process, a child drifted, or the last try failed: resolve the
cloud, render, check that no child's name is taken by an object this fleet does not control, server-side apply
every child, prune; then, always, observe and write status. Idempotent, so running it for a key that needed
nothing costs no request unless the status changed. It never raises: what went wrong is in its ``Result``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from opentelemetry.trace import Span

from mmfleet import metrics_export, render, routing, status, telemetry
from mmfleet.api import DegradedReason, MultimodalInference, seconds
from mmfleet.autoscaler import standby
from mmfleet.handlers import discovery
from mmfleet.handlers import standby as fleet_standby
from mmfleet.handlers.children import (
    OPTIONAL_BY_KIND,
    deployment_pods,
    fingerprint,
    foreign_fields,
    foreign_fields_message,
    foreign_owner,
    owned_deployment,
    scaler_owns_replicas,
    taken_over,
)
from mmfleet.handlers.records import (
    FIRST_STATUS_WAIT,
    Body,
    FleetRecord,
    Key,
    Operator,
    kopf_event,
    last_status,
    log,
    never_reported,
    parse_spec,
    previous_status,
    render_children,
    utc_now,
    write_status,
)
from mmfleet.kube import KindNotServedError, NamespaceTerminatingError, RefusedError, RetryableError
from mmfleet.render import SERVING_LABEL, STANDBY_ANNOTATION, SpecError
from mmfleet.validation import PolicyDeniedError

# A failed reconcile is tried again after RETRY_FIRST_SECONDS, doubling up to RETRY_MAX_SECONDS.
RETRY_FIRST_SECONDS = 5.0
RETRY_MAX_SECONDS = 300.0
# A Retry-After is waited for as asked, within these bounds (0 would spin; the header is the server's to set), for the
# first RETRY_AFTER_ATTEMPTS retries, as client-go honours it for 10 retries of a request (rest.Request's maxRetries);
# after that the doubling backoff starts again from RETRY_FIRST_SECONDS, never shorter than the header.
RETRY_AFTER_MIN_SECONDS = 1
RETRY_AFTER_MAX_SECONDS = 60
RETRY_AFTER_ATTEMPTS = 10
# The API server's own message is kept whole up to this length in a condition.
MESSAGE_LIMIT = 2048


def retry_delay(attempts: int) -> float:
    """Seconds before retry number ``attempts`` (0 for the first): doubling, bounded, so a refusal never spins."""
    return min(RETRY_MAX_SECONDS, RETRY_FIRST_SECONDS * 2.0 ** min(attempts, 16))


def api_retry_delay(attempts: int, retry_after: float | None) -> float:
    """Seconds before retry number ``attempts``: the ``Retry-After`` the API server sent (bounded), else the
    doubling backoff. The work queue's backoff for every fleet."""
    if retry_after is None:
        return retry_delay(attempts)
    asked = float(min(RETRY_AFTER_MAX_SECONDS, max(RETRY_AFTER_MIN_SECONDS, retry_after)))
    if attempts < RETRY_AFTER_ATTEMPTS:
        return asked
    return max(asked, retry_delay(attempts - RETRY_AFTER_ATTEMPTS))


def retrying_message(error: RetryableError, delay: float) -> str:
    """The Progressing condition's message: the call, what it met, what the API server asked, when the next try is."""
    asked = f"; the API server asked to retry after {error.retry_after} s" if error.retry_after is not None else ""
    return f"{error}{asked}; next in {delay:.0f} s"


@dataclass(frozen=True)
class Snapshot:
    """A fleet and its children as kopf's indexes showed them when a worker took its key."""

    key: Key
    body: Body
    deployment: Body | None
    pods: list[Body]


@dataclass(frozen=True)
class Result:
    """How a reconcile ended: ``retry`` puts the key back after its backoff (or the server's ``retry_after``)."""

    outcome: str  # one of metrics_export.RECONCILE_RESULTS
    retry: bool = False
    retry_after: float | None = None
    # Come back this much later without counting a failure (a failed apply's backoff not over yet).
    requeue_after: float | None = None


# The delay the queue will wait before the next try, given the server's Retry-After: for the status message.
NextDelay = Callable[[float | None], float]


class _NotAppliedError(Exception):
    """Nothing more is applied for this fleet: ``reason`` and ``message`` go into its conditions."""

    def __init__(self, reason: DegradedReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def reconcile(op: Operator, seen: Snapshot, next_delay: NextDelay) -> Result:
    """Bring the fleet's children in line with its spec, and its status in line with its children."""
    started = time.perf_counter()
    meta = seen.body["metadata"]
    record = op.find(seen.key, meta.get("uid"))
    if record is None:  # deleted, or the name taken by another fleet, since the key was taken
        return Result("ok")
    try:
        with record.lock:
            result = _reconcile(op, record, seen, next_delay)
    except RetryableError as error:  # writing the status met the API server's fault
        log.warning("%s/%s: %s", *seen.key, error)
        result = Result("retry", retry=True, retry_after=error.retry_after)
    except Exception:  # a bug, or an answer no check foresaw: logged, counted, tried again later
        log.exception("reconciling %s/%s failed", *seen.key)
        metrics_export.error("reconcile")
        result = Result("error", retry=True)
    metrics_export.reconciled(result.outcome, time.perf_counter() - started)
    return result


def _reconcile(op: Operator, record: FleetRecord, seen: Snapshot, next_delay: NextDelay) -> Result:
    meta = seen.body["metadata"]
    try:
        inference = parse_spec(op, record, seen.body)
    except SpecError as error:
        record.reconciled, record.refused, record.retrying = int(meta.get("generation") or 0), None, None
        previous = previous_status(seen.body)
        invalid_spec = status.InvalidSpec(error.problems, meta.get("generation"), isinstance(error, PolicyDeniedError))
        invalid = status.compute_status(invalid_spec, status.Observed(), previous, utc_now())
        write_status(op, record, seen.body, invalid, previous)
        return Result("invalid_spec")
    waiting = record.backing_off(meta.get("generation"), time.monotonic())
    if record.needs_apply(meta.get("generation")) and not waiting:
        return _apply_all(op, record, seen, inference, next_delay)
    cloud = discovery.resolve_cloud(op, inference)
    held = _observe(op, record, seen.body, inference, seen.deployment, seen.pods, cloud)
    due = [seconds for seconds in (waiting, held) if seconds]
    return Result("ok", requeue_after=min(due) if due else None)


def _apply_all(
    op: Operator, record: FleetRecord, seen: Snapshot, inference: MultimodalInference, next_delay: NextDelay
) -> Result:
    """The apply, as one span with the applies and the status write inside it."""
    meta = seen.body["metadata"]
    attributes = telemetry.fleet(meta["namespace"], meta["name"], meta.get("generation"))
    requests_before = op.get_kube().thread_requests()
    started = time.perf_counter()
    with telemetry.tracer().start_as_current_span(telemetry.RECONCILE, attributes=attributes) as span:
        result = _apply(op, record, seen, inference, next_delay, span)
    log.info(
        "reconciled %s/%s in %.1f ms with %d API requests (%s)",
        *seen.key,
        (time.perf_counter() - started) * 1000,
        op.get_kube().thread_requests() - requests_before,
        result.outcome,
    )
    return result


def _apply(
    op: Operator, record: FleetRecord, seen: Snapshot, inference: MultimodalInference, next_delay: NextDelay, span: Span
) -> Result:
    key, body, live = seen.key, seen.body, seen.deployment
    generation = int(body["metadata"].get("generation") or 0)
    cloud: str | None = None
    deployment: Body | None = None
    # Cleared before the applies, not after: a hand edit seen while they run (its event sets it again) is applied
    # over by the next reconcile, which the event has queued.
    record.drifted, record.attempted = False, generation
    try:
        cloud = discovery.resolve_cloud(op, inference)
        monitoring, routing_crds = discovery.monitoring_crds(op), discovery.routing_crds(op, inference)
        shown = last_status(record, body)
        measured = seconds(shown.cold_start.total) if shown and shown.cold_start and shown.cold_start.total else None
        children = render_children(op, record, inference, cloud, monitoring, routing_crds, measured)
        backend = inference.spec.backend.name
        span.set_attributes({telemetry.CLOUD: cloud, telemetry.BACKEND: backend, telemetry.CHILDREN: len(children)})
        _claim_names(op, record, inference, children)
        _hand_over_replicas(op, inference, live)
        live_encode = _encode_deployment(op, inference)
        _hand_over_encode_replicas(op, inference, live_encode)
        _label_serving(op, inference, seen.pods)
        for child in children:
            applied = _apply_child(op, child, body)
            record.applied[applied["metadata"]["uid"]] = fingerprint(applied)
            record.owned.add((child["kind"], child["metadata"]["name"]))
            if child["kind"] == "Deployment" and child["metadata"]["name"] == inference.metadata.name:
                deployment = applied
                _check_volumes_kept(inference, child, applied)
            elif child["kind"] == "Deployment" and child["metadata"]["name"] == render.encode_name(inference):
                _clamp_encode_replicas(op, inference, applied, live_encode)
        if deployment is not None and inference.spec.autoscaled:
            deployment = _clamp_replicas(op, inference, deployment, live)
        if inference.spec.standby is None and any(standby.resting(pod) for pod in seen.pods):
            # Warm standby turned off (or autoscaling, whose loop no longer tends the fleet): every sleeping pod is
            # woken, whatever else the reconcile does.
            replicas = int((deployment or live or {}).get("spec", {}).get("replicas") or 0)
            fleet_standby.tend(op, record, key, body, inference, seen.pods, None, replicas)
        # A spec changed since this process applied one: what it no longer asks for goes. After a restart, nothing
        # is known to have changed (the first reconcile of each fleet would cost a read per optional child).
        if record.reconciled is not None and record.reconciled != generation:
            _prune(op, record, inference, children)
        record.reconciled, record.refused, record.retrying = generation, None, None
        if never_reported(last_status(record, body)):
            record.first_status_due = time.monotonic() + FIRST_STATUS_WAIT
        held = _observe(op, record, body, inference, deployment, seen.pods, cloud)
        return Result("ok", requeue_after=held)
    except RetryableError as error:
        if isinstance(error, KindNotServedError):  # its CRD removed: the retry renders without it
            discovery.forget_served(op, error.api_version, error.kind)
        # Said in Progressing until a reconcile goes through; every status write (the autoscaler's too) keeps it.
        record.retrying = retrying_message(error, next_delay(error.retry_after))
        seen_status = last_status(record, body)
        with contextlib.suppress(RetryableError):  # the status write may meet the same fault
            _observe(
                op,
                record,
                body,
                inference,
                deployment or live,
                seen.pods,
                cloud or (seen_status.cloud if seen_status else None),
            )
        log.warning("%s/%s: %s", *key, record.retrying)
        return Result("retry", retry=True, retry_after=error.retry_after)
    except NamespaceTerminatingError:
        log.info("%s/%s: its namespace is being deleted; nothing to apply", *key)
        return Result("ok")
    except (_NotAppliedError, RefusedError) as error:
        refused = (
            error
            if isinstance(error, _NotAppliedError)
            else _NotAppliedError(DegradedReason.APPLY_REFUSED, _refusal(error))
        )
        log.warning("%s/%s: %s: %s", *key, refused.reason, refused.message)
        record.refused, record.retrying = (refused.reason, refused.message), None
        with contextlib.suppress(RetryableError):
            _observe(op, record, body, inference, live, seen.pods, cloud)
        return Result("refused", retry=True)


def _claim_names(op: Operator, record: FleetRecord, inference: MultimodalInference, children: list[Body]) -> None:
    """Raise ``_NotAppliedError`` when a child's name is held by an object this fleet does not control.

    Applying over it would adopt it: a ServiceAccount taken over this way runs the fleet's image with its
    rights, and deleting the fleet would delete it. One read per child the first time, none after, all at once, from
    the API server's watch cache: an object created a moment before could be missed, as between read and apply.
    """
    meta = inference.metadata
    unknown = [c for c in children if (c["kind"], c["metadata"]["name"]) not in record.owned]
    refs = [(c["apiVersion"], c["kind"], meta.namespace, c["metadata"]["name"]) for c in unknown]
    for (_, kind, _, name), live in zip(refs, op.get_kube().get_each(refs, cached=True), strict=True):
        holder = foreign_owner(live, meta.uid)
        if holder is not None:
            raise _NotAppliedError(
                DegradedReason.CHILD_NOT_OWNED,
                f"{kind} {meta.namespace}/{name} already exists with {holder}, not this MultimodalInference: the "
                f"operator neither changes nor deletes objects it did not create; delete or rename that {kind}, or "
                f"give this MultimodalInference another metadata.name (now {meta.name})",
            )
        if live is not None:
            record.owned.add((kind, name))


def _observe(
    op: Operator,
    record: FleetRecord,
    body: Body,
    inference: MultimodalInference,
    deployment: Body | None,
    pods: list[Body],
    cloud: str | None,
) -> float | None:
    """Write the status the fleet's children show; the seconds until a held first status is due, if it was held."""
    observed = status.Observed(
        deployment=deployment,
        pod_problems=status.pod_problems(pods),
        cloud=cloud,
        cache_problem=discovery.cache_problem(op, record, inference),
        tracing=discovery.tracing_seen(op, record, inference, cloud) if cloud is not None else None,
        refused=record.refused,
        retrying=record.retrying,
        routing=_routing_seen(op, inference),
        encode=encode_seen(op, inference),
    )
    previous = last_status(record, body)
    write_status(op, record, body, status.compute_status(inference, observed, previous, utc_now()), previous)
    return record.holding_status(time.monotonic())


def _routing_seen(op: Operator, inference: MultimodalInference) -> status.RoutingSeen | None:
    if inference.spec.routing.mode != "inferencePool":
        return None
    meta = inference.metadata
    key = (meta.namespace, meta.name)
    picker = owned_deployment(op.indexes, key, meta.uid, routing.picker_name(inference))
    pods = deployment_pods(op.indexes, key, routing.picker_name(inference)) if picker is not None else []
    return status.RoutingSeen(discovery.routing_crds(op, inference), picker, status.pod_problems(pods))


def encode_seen(op: Operator, inference: MultimodalInference) -> status.EncodeSeen | None:
    """The encode tier as the indexes show it now (None without one)."""
    if inference.spec.disaggregation.encode is None:
        return None
    meta = inference.metadata
    deployment = _encode_deployment(op, inference)
    pods = deployment_pods(op.indexes, (meta.namespace, meta.name), render.encode_name(inference)) if deployment else []
    return status.EncodeSeen(deployment, status.pod_problems(pods))


def _clamp_replicas(op: Operator, inference: MultimodalInference, deployment: Body, live: Body | None) -> Body:
    """With autoscaling on, the Deployment's replicas belong to the scaler; keep them within bounds. A change of the
    warm standby moves them by as much, written with the new count in one apply, so the scaler's own replicas stay
    what they were and a failed call is redone from what the Deployment says."""
    had = deployment.get("spec", {}).get("replicas", (live or {}).get("spec", {}).get("replicas"))
    before = status.standby_replicas(deployment)
    after = inference.spec.standby.replicas if inference.spec.standby is not None else 0
    current = {**deployment, "spec": {**deployment.get("spec", {}), "replicas": had}} if had is not None else deployment
    desired = status.desired_replicas(inference, current) - before + after
    meta = inference.metadata
    if before != after:
        op.get_kube().scale_with_standby(meta.namespace, meta.name, desired, after)
        annotations = {**(deployment.get("metadata", {}).get("annotations") or {}), STANDBY_ANNOTATION: str(after)}
        deployment = {**deployment, "metadata": {**deployment.get("metadata", {}), "annotations": annotations}}
    elif had != desired:
        op.get_kube().scale(meta.namespace, meta.name, desired)
    return {**deployment, "spec": {**deployment.get("spec", {}), "replicas": desired}}


def _label_serving(op: Operator, inference: MultimodalInference, pods: list[Body]) -> None:
    """With warm standby, the Service and the InferencePool select mmfleet.io/serving=true: the fleet's pods from
    before it (no label; awake) are labelled before the selectors change, so they keep serving meanwhile."""
    if inference.spec.standby is None:
        return
    for pod in pods:
        meta = pod.get("metadata") or {}
        if SERVING_LABEL not in (meta.get("labels") or {}) and not meta.get("deletionTimestamp"):
            op.get_kube().mark_pod(inference.metadata.namespace, meta["name"], {SERVING_LABEL: "true"}, {})


def _hand_over_replicas(op: Operator, inference: MultimodalInference, live: Body | None) -> None:
    """Before an apply that drops replicas (autoscaling turned on), let the scaler own the field.

    Server-side apply resets a field its only manager stops applying; without a co-owner the
    Deployment would fall to 1 replica for a moment and kill serving pods.
    """
    if live is None or not inference.spec.autoscaled or scaler_owns_replicas(live):
        return
    meta = inference.metadata
    op.get_kube().scale(meta.namespace, meta.name, status.desired_replicas(inference, live))


def _encode_deployment(op: Operator, inference: MultimodalInference) -> Body | None:
    if inference.spec.disaggregation.encode is None:
        return None
    meta = inference.metadata
    return owned_deployment(op.indexes, (meta.namespace, meta.name), meta.uid, render.encode_name(inference))


def _hand_over_encode_replicas(op: Operator, inference: MultimodalInference, live: Body | None) -> None:
    """``_hand_over_replicas`` for the encode tier, once its autoscaling is turned on."""
    if live is None or inference.spec.encode_autoscaling is None or scaler_owns_replicas(live):
        return
    meta = inference.metadata
    op.get_kube().scale(meta.namespace, render.encode_name(inference), status.encode_desired_replicas(inference, live))


def _clamp_encode_replicas(op: Operator, inference: MultimodalInference, applied: Body, live: Body | None) -> None:
    """With its autoscaling on, the encode tier's replicas belong to the scaler: within its bounds, counted from what
    the apply answered (the index may not have the scaler's last change yet), and a new tier from
    spec.disaggregation.encode.replicas (its Deployment was made without replicas, so with one)."""
    if inference.spec.encode_autoscaling is None:
        return
    desired = status.encode_desired_replicas(inference, applied if live is not None else None)
    if applied.get("spec", {}).get("replicas") != desired:
        op.get_kube().scale(inference.metadata.namespace, render.encode_name(inference), desired)


def _refusal(error: RefusedError) -> str:
    text = f"the API server refused a write ({error.status}): {error.message}"
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 1] + "…"


def _apply_replacing_role_ref(op: Operator, child: Body) -> Body:
    """``apply``; a RoleBinding whose ``roleRef`` changed (the install's picker ClusterRole renamed:
    ``MMFLEET_PICKER_CLUSTER_ROLE``, another release name) is deleted and made again, since the API server refuses
    any change to a ``roleRef`` (422). Only the fleet's own reaches here (``_claim_names``)."""
    kube = op.get_kube()
    try:
        return kube.apply(child)
    except RefusedError as error:
        if child["kind"] != "RoleBinding" or error.status != 422 or "roleRef" not in error.message:
            raise
        meta = child["metadata"]
        kube.delete(child["apiVersion"], child["kind"], meta["namespace"], meta["name"])
        return kube.apply(child)


def _volumes(deployment: Body) -> set[str]:
    return {
        v.get("name", "") for v in deployment.get("spec", {}).get("template", {}).get("spec", {}).get("volumes") or []
    }


def _check_volumes_kept(inference: MultimodalInference, rendered: Body, applied: Body) -> None:
    """Raise ``_NotAppliedError`` when the API server dropped a volume the operator rendered.

    An API server that does not serve a volume type behind a feature gate drops it from the template and accepts the
    Deployment (ImageVolume before Kubernetes 1.35, ``pkg/api/pod/util.go`` ``dropImageVolumes``): the pods would
    start without the weights and crash, with nothing saying why.
    """
    dropped = sorted(_volumes(rendered) - _volumes(applied))
    if dropped:
        source = inference.spec.model.resolved_source()
        raise _NotAppliedError(
            DegradedReason.APPLY_REFUSED,
            f"the API server dropped volume(s) {', '.join(dropped)} from Deployment {inference.metadata.name}'s pod "
            f"template: it does not serve that volume type (spec.model.source {source} is an image volume, served "
            "from Kubernetes 1.35 or with the ImageVolume feature gate); enable it, or use another spec.model.source "
            "(hf://, pvc://, s3://)",
        )


def _apply_child(op: Operator, child: Body, fleet: Body) -> Body:
    """One server-side apply, as a span of the reconcile that asked for it; a refusal names the child.

    Fields another manager added that the operator never renders (a sidecar, ``hostNetwork``, an env var) survive an
    apply: they are moved to the operator's manager and applied away, and the fleet gets an event naming them. The
    check reads the apply's answer, so it costs no request until there is something to remove.
    """
    kind, meta = child["kind"], child["metadata"]
    where = f"{meta.get('namespace')}/{meta['name']}"
    attributes = {telemetry.CHILD_KIND: kind, telemetry.CHILD_NAME: meta["name"]}
    with telemetry.tracer().start_as_current_span(telemetry.APPLY, attributes=attributes):
        try:
            applied = _apply_replacing_role_ref(op, child)
            foreign = foreign_fields(applied)
            if not foreign:
                return applied
            op.get_kube().set_managed_fields(applied, taken_over(applied, foreign))
            applied = op.get_kube().apply(child)
        except RefusedError as error:
            raise RefusedError(error.status, f"applying {kind} {where}: {error.message}") from error
    message = foreign_fields_message(kind, where, foreign)
    log.warning("%s/%s: %s", fleet["metadata"]["namespace"], fleet["metadata"]["name"], message)
    kopf_event(fleet, "Warning", "ForeignFieldsRemoved", message)
    return applied


def _prune(op: Operator, record: FleetRecord, inference: MultimodalInference, children: list[Body]) -> None:
    """Delete optional children the spec no longer asks for, but only ones this resource owns."""
    kube = op.get_kube()
    meta = inference.metadata
    present = {(c["apiVersion"], c["kind"], c["metadata"]["name"]) for c in children}
    # No read for the children of a front door or an encode tier a fleet never had: what this process applied, and for
    # an encode tier also its Deployment in the index (made before a restart of the operator), say it had one.
    front_door = {(kind, name) for _, kind, name in routing.front_door(inference)}
    encode = {(kind, name) for _, kind, name in render.encode_children(inference)}
    had_encode = owned_deployment(op.indexes, (meta.namespace, meta.name), meta.uid, render.encode_name(inference))
    for api_version, kind, name in render.optional_children(inference):
        if (api_version, kind, name) in present:
            continue
        if (kind, name) in front_door and (kind, name) not in record.owned:
            continue
        if (kind, name) in encode and (kind, name) not in record.owned and had_encode is None:
            continue
        # A kind whose CRD may not be installed: discovery is asked first, as a read would fail without it.
        if kind in OPTIONAL_BY_KIND and not discovery.served(op, api_version, kind):
            continue
        found = kube.get(api_version, kind, meta.namespace, name)
        owners = (found or {}).get("metadata", {}).get("ownerReferences") or []
        if any(o.get("uid") == meta.uid for o in owners):
            kube.delete(api_version, kind, meta.namespace, name)
