"""Status from what really runs: one pure function from the spec and the observed children.

Handlers never build status by hand; they observe, call ``compute_status`` and write the result,
so the same observation always yields the same status (and a reconcile that changes nothing
writes nothing).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from mmfleet import render, routing
from mmfleet.api import (
    CONDITION_MESSAGE_MAX,
    SCALE_REASON_MAX,
    TRUNCATED,
    ColdStartStatus,
    Condition,
    ConditionType,
    DegradedReason,
    EncodeReadyReason,
    MultimodalInference,
    MultimodalInferenceStatus,
    Phase,
    ProgressingReason,
    ReadyReason,
    RoutingReadyReason,
    SloStatus,
    StandbyStatus,
    TracingReadyReason,
    clamp_replicas,
    duration_text,
)
from mmfleet.render import STANDBY_ANNOTATION
from mmfleet.routing import RoutingCrds

# Waiting reasons of a container that will not get better by waiting.
BROKEN_WAITING_REASONS = frozenset(
    {
        DegradedReason.CRASH_LOOP_BACK_OFF,
        DegradedReason.IMAGE_PULL_BACK_OFF,
        DegradedReason.ERR_IMAGE_PULL,
        DegradedReason.CREATE_CONTAINER_CONFIG_ERROR,
        DegradedReason.INVALID_IMAGE_NAME,
    }
)
# Condition transitions a person should hear about, as Warning events: the status that is bad news.
WARNING_WHEN = {
    "Degraded": "True",
    "MetricsAvailable": "False",
    "ScalingLimited": "True",
    "TracingReady": "False",
    "PreprocessingBound": "True",
    "EncodeMetricsAvailable": "False",
}
# Conditions the autoscaler owns; compute_status carries them over untouched.
AUTOSCALER_CONDITIONS: tuple[ConditionType, ...] = (
    "ScalingLimited",
    "SLOMet",
    "MetricsAvailable",
    "Idle",
    "PreprocessingBound",
    "DemandSwings",
    "EncodeMetricsAvailable",
)


@dataclass(frozen=True)
class PodProblem:
    pod: str
    reason: str
    message: str


# A condition before it meets the previous status: (type, True/False/None for Unknown, reason, message).
ConditionRow = tuple[ConditionType, bool | None, str, str]


@dataclass(frozen=True)
class EncodeScaling:
    """What one autoscaling cycle concluded for the encode tier (``autoscaler.encode.EncodeOutcome``)."""

    replicas: int  # set, or held
    scaled: bool
    reason: str
    latency: float | None  # the percentile of the calls to the tier, None when nothing was measured
    target: float  # its share of the SLO's target, s
    metrics: ConditionRow  # EncodeMetricsAvailable


@dataclass(frozen=True)
class Scaling:
    """What one autoscaling cycle concluded (``autoscaler.cycle.Outcome.scaling``), as the status shows it."""

    replicas: int  # set, or held
    scaled: bool
    reason: str
    latency: float | None  # the measured percentile, None when nothing was measured
    idle: bool  # no request finished and none in flight: nothing to measure, the target met
    attainment: float | None
    conditions: tuple[ConditionRow, ...]
    cold_start: ColdStartStatus | None = None  # the medians of the Ready pods' cold starts, phase by phase
    standby: StandbyStatus | None = None  # with warm standby: what the cycle saw of it
    encode: EncodeScaling | None = None  # with the encode tier's autoscaling: its decision


@dataclass(frozen=True)
class TracingSeen:
    """Where a fleet's pods send their spans, and whether the in-cluster Service that endpoint names exists."""

    endpoint: str
    from_spec: bool  # spec.tracing.endpoint; else the operator's collector (OperatorConfig.collector_endpoint)
    cloud: str
    service: tuple[str, str] | None = None  # (namespace, name) the endpoint names; None: not an in-cluster name
    found: bool | None = None  # whether that Service exists; None when not looked up
    ready: int | None = None  # its ready endpoints (EndpointSlices); None when they may not be read
    failed: str | None = None  # why the look-up failed (remembered briefly), when it did
    # A Service the spec names in another namespace than the fleet's: not looked up, so that whether it exists is
    # not told to whoever may write a MultimodalInference.
    elsewhere: bool = False


DEFAULT_CLUSTER_DOMAIN = "cluster.local"
_SERVICE_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")  # DNS-1035 label, as Service names are
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # DNS-1123 label


def _host(endpoint: str) -> str:
    return urlsplit(endpoint if "://" in endpoint else f"//{endpoint}").hostname or ""


def collector_service(
    endpoint: str, namespace: str, cluster_domain: str = DEFAULT_CLUSTER_DOMAIN
) -> tuple[str, str] | None:
    """The (namespace, name) of the Service an OTLP endpoint names in cluster DNS, or None for any other host.

    What a pod's resolver (search path ``<ns>.svc.<domain> svc.<domain> <domain>``) turns into a Service:
    ``name.ns.svc``, ``name.ns.svc.<domain>`` (also with the trailing dot of an absolute name), ``name.ns``, and a
    bare ``name`` in the pod's own namespace. Anything else (an IP, a cloud endpoint, another domain, any other
    absolute name) is outside what the operator can check.
    """
    host = _host(endpoint)
    absolute = host.endswith(".")
    labels = host.removesuffix(".").split(".")
    domain = cluster_domain.strip(".").lower()
    if len(labels) >= 3 and labels[2] == "svc":
        rest = ".".join(labels[3:])
        if not (rest == domain or (rest == "" and not absolute)):
            return None
    elif absolute or len(labels) > 2:
        return None
    name = labels[0]
    service_namespace = labels[1] if len(labels) > 1 else namespace
    if not _SERVICE_NAME.fullmatch(name) or not _NAMESPACE.fullmatch(service_namespace) or name == "localhost":
        return None
    return service_namespace, name


def _also_outside(endpoint: str) -> bool:
    """``name.ns`` resolves to a Service when there is one, and otherwise to whatever public DNS says."""
    return len(_host(endpoint).split(".")) == 2


def tracing_row(seen: TracingSeen) -> ConditionRow:
    """TracingReady: where the spans go, or why they cannot get there, or that the operator could not tell."""
    where = "spec.tracing.endpoint" if seen.from_spec else f"the operator's collector, cloud {seen.cloud}"
    if seen.service is None:
        return (
            "TracingReady",
            None,
            TracingReadyReason.ENDPOINT_NOT_CHECKED,
            f"spans go to {seen.endpoint} ({where}), which names no Service in cluster DNS; whether anything "
            "receives them there was not checked",
        )
    namespace, name = seen.service
    if seen.elsewhere:
        return (
            "TracingReady",
            None,
            TracingReadyReason.ENDPOINT_NOT_CHECKED,
            f"spans go to {seen.endpoint} ({where}), a Service in namespace {namespace}, not this resource's: the "
            "operator does not look into other namespaces for it (that would tell what they hold); not checked",
        )
    if seen.failed is not None:
        return (
            "TracingReady",
            None,
            TracingReadyReason.COLLECTOR_LOOKUP_FAILED,
            f"looking up Service {namespace}/{name} of {seen.endpoint} ({where}) failed: {seen.failed}",
        )
    if seen.found is None:
        return (
            "TracingReady",
            None,
            TracingReadyReason.NOT_CHECKED,
            f"Service {namespace}/{name} of {seen.endpoint} not looked up yet",
        )
    if not seen.found and _also_outside(seen.endpoint):
        return (
            "TracingReady",
            None,
            TracingReadyReason.ENDPOINT_NOT_CHECKED,
            f"no Service {name} in namespace {namespace}: spans sent to {seen.endpoint} ({where}) go to that host "
            "outside the cluster, if there is one; not checked",
        )
    if not seen.found:
        fix = (
            "fix spec.tracing.endpoint"
            if seen.from_spec
            else "install the collector (docs/tracing.md) or set spec.tracing.endpoint"
        )
        return (
            "TracingReady",
            False,
            TracingReadyReason.COLLECTOR_NOT_FOUND,
            f"no Service {name} in namespace {namespace}: the spans sent to {seen.endpoint} ({where}) are lost; {fix}",
        )
    if seen.ready == 0:
        return (
            "TracingReady",
            False,
            TracingReadyReason.COLLECTOR_NOT_READY,
            f"Service {namespace}/{name} has no ready endpoint: no collector pod behind it is serving, and the spans "
            f"sent to {seen.endpoint} ({where}) are lost; a Secret or cloud identity the collector needs may be "
            f"missing (kubectl -n {namespace} get pods; docs/tracing.md)",
        )
    return (
        "TracingReady",
        True,
        TracingReadyReason.COLLECTOR_FOUND,
        f"spans go to {seen.endpoint} ({where}), Service {namespace}/{name}",
    )


@dataclass(frozen=True)
class RoutingSeen:
    """Routing mode inferencePool as the operator found it: which of its kinds are served, and the picker's
    Deployment (None: not made yet)."""

    crds: RoutingCrds
    picker: dict[str, Any] | None
    problems: list[PodProblem] = field(default_factory=list)  # why the picker's pods do not start (``pod_problems``)

    @property
    def picker_ready(self) -> bool:
        return int(((self.picker or {}).get("status") or {}).get("readyReplicas") or 0) >= 1


def routing_row(inference: MultimodalInference, seen: RoutingSeen) -> ConditionRow:
    """RoutingReady: the pool and its picker serving, or what is missing for them to."""
    name, picker = inference.metadata.name, routing.picker_name(inference)
    gateway = inference.spec.routing.gateway
    if not seen.crds.pool:
        return (
            "RoutingReady",
            False,
            RoutingReadyReason.INFERENCE_POOL_CRD_MISSING,
            f"spec.routing.mode: inferencePool, but InferencePool ({routing.POOL_API_VERSION}) is not served: install "
            f"the Gateway API Inference Extension's CRDs ({routing.PICKER_VERSION}); nothing of the pool is made, and "
            f"Service {name} serves meanwhile",
        )
    if not seen.picker_ready and seen.problems:
        problem = seen.problems[0]
        return (
            "RoutingReady",
            False,
            RoutingReadyReason.PICKER_FAILING,
            f"endpoint picker {picker} does not start: pod {problem.pod}: {problem.reason}"
            f"{': ' + problem.message if problem.message else ''} (kubectl logs {problem.pod}); a gateway sending "
            f"to InferencePool {name} refuses requests meanwhile (failureMode FailClose)",
        )
    if not seen.picker_ready:
        return (
            "RoutingReady",
            False,
            RoutingReadyReason.PICKER_NOT_READY,
            f"endpoint picker {picker} has no ready replica yet (kubectl get pods -l "
            f"app.kubernetes.io/component={routing.PICKER_COMPONENT}); a gateway sending to InferencePool {name} "
            "refuses requests until it has (failureMode FailClose)",
        )
    if gateway is not None and not seen.crds.route:
        return (
            "RoutingReady",
            False,
            RoutingReadyReason.GATEWAY_API_MISSING,
            f"spec.routing.gateway: {gateway.name}, but HTTPRoute ({routing.HTTPROUTE_API_VERSION}) is not served: "
            f"install the Gateway API's CRDs; InferencePool {name} and its picker serve, with no route to them",
        )
    via = f", with an HTTPRoute from Gateway {gateway.name}" if gateway is not None else ""
    return (
        "RoutingReady",
        True,
        RoutingReadyReason.PICKER_READY,
        f"InferencePool {name} and its endpoint picker {picker} serve{via}",
    )


@dataclass(frozen=True)
class EncodeSeen:
    """The encode tier's Deployment (None: not made yet) and why its pods do not start."""

    deployment: dict[str, Any] | None
    problems: list[PodProblem] = field(default_factory=list)


def encode_row(
    inference: MultimodalInference, seen: EncodeSeen, scaling: EncodeScaling | None = None
) -> tuple[ConditionRow, dict[str, Any]]:
    """EncodeReady and status.encode: ready once every replica the spec (or its autoscaler: ``scaling``) asks for is
    ready on the current spec (a rollout stuck on a new pod is not hidden behind the old ones). Without its encode
    replicas the fleet still serves: each serving replica's sidecar has its server encode the images itself
    (mmfleet.encode_proxy), slower."""
    name = render.encode_name(inference)
    desired = scaling.replicas if scaling is not None else encode_desired_replicas(inference, seen.deployment)
    deployment = seen.deployment or {}
    dep_status = deployment.get("status") or {}
    ready, updated = int(dep_status.get("readyReplicas") or 0), int(dep_status.get("updatedReplicas") or 0)
    current = int(dep_status.get("observedGeneration") or 0) >= int(
        (deployment.get("metadata") or {}).get("generation") or 0
    )
    part = {"deployment": name, "replicas": int(dep_status.get("replicas") or 0), "readyReplicas": ready}
    part["desiredReplicas"] = desired
    if seen.deployment is not None and current and ready >= desired and updated >= desired:
        return (
            "EncodeReady",
            True,
            EncodeReadyReason.REPLICAS_READY,
            f"encode tier {name}: {ready}/{desired} replicas ready",
        ), part
    meanwhile = "the serving replicas encode their requests' images themselves meanwhile"
    if seen.problems:
        problem = seen.problems[0]
        detail = f": {problem.message}" if problem.message else ""
        message = f"encode tier {name}: pod {problem.pod}: {problem.reason}{detail} (kubectl logs {problem.pod}); "
        return ("EncodeReady", False, EncodeReadyReason.REPLICAS_FAILING, message + meanwhile), part
    message = f"encode tier {name}: {ready}/{desired} replicas ready, {updated} on the current spec; {meanwhile}"
    return ("EncodeReady", False, EncodeReadyReason.REPLICAS_NOT_READY, message), part


@dataclass(frozen=True)
class Observed:
    """What the operator saw of the children, and, from the autoscaling loop, what its cycle concluded.

    ``scaling`` None (a reconcile or a status refresh): the autoscaler's part of the status is
    carried over from the previous status while autoscaling is on.
    """

    deployment: dict[str, Any] | None = None
    pod_problems: list[PodProblem] = field(default_factory=list)
    cloud: str | None = None
    scaling: Scaling | None = None
    cache_problem: tuple[str, str] | None = None  # (reason, message) from ``shared_cache_problem``
    # With spec.tracing.enabled: where spans go, as last looked up; None keeps the previous TracingReady.
    tracing: TracingSeen | None = None
    # (reason, message): why the operator applied nothing (a child it does not own, a write the API server refused).
    refused: tuple[str, str] | None = None
    # Why the last reconcile failed for now (409, 429, 5xx, no answer), naming the call: it is retried with backoff.
    retrying: str | None = None
    # In routing mode inferencePool: what was seen of it; None keeps the previous RoutingReady.
    routing: RoutingSeen | None = None
    # With spec.disaggregation.encode: what was seen of the encode tier; None keeps the previous EncodeReady.
    encode: EncodeSeen | None = None


@dataclass(frozen=True)
class InvalidSpec:
    """A spec that failed validation: no children can be rendered from it, so only its problems are known."""

    problems: list[str]
    generation: int | None
    denied: bool = False  # valid, but refused by the admin's policy (mmfleet.admin_policy)


def scheduling_failure(pod: dict[str, Any]) -> PodProblem | None:
    """Why the scheduler found no node for a pod (PodScheduled False), or None."""
    for entry in (pod.get("status") or {}).get("conditions") or []:
        if entry.get("type") == "PodScheduled" and entry.get("status") == "False":
            name = pod.get("metadata", {}).get("name", "")
            return PodProblem(name, entry.get("reason") or DegradedReason.UNSCHEDULABLE, entry.get("message") or "")
    return None


def pod_problems(pods: list[dict[str, Any]]) -> list[PodProblem]:
    """Why pods are not serving, in the words of the scheduler and the kubelet."""
    found = []
    for pod in pods:
        name = pod.get("metadata", {}).get("name", "")
        if pod.get("metadata", {}).get("deletionTimestamp"):
            continue
        status = pod.get("status") or {}
        unscheduled = scheduling_failure(pod)
        if unscheduled is not None:
            found.append(unscheduled)
        for container in status.get("containerStatuses") or []:
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in BROKEN_WAITING_REASONS:
                found.append(PodProblem(name, waiting["reason"], waiting.get("message") or ""))
    return found


def standby_replicas(deployment: dict[str, Any] | None) -> int:
    """How many of a Deployment's replicas are warm standby, as the operator last applied it (0 without)."""
    annotations = ((deployment or {}).get("metadata") or {}).get("annotations") or {}
    value = str(annotations.get(STANDBY_ANNOTATION) or "0")
    return int(value) if value.isdigit() else 0


def desired_replicas(inference: MultimodalInference, deployment: dict[str, Any] | None) -> int:
    """spec.replicas, or with autoscaling what the scaler last set, within its bounds (its warm standby beside)."""
    spec = inference.spec
    if not spec.autoscaled or spec.autoscaling is None:
        return spec.replicas
    current = (deployment or {}).get("spec", {}).get("replicas")
    low, high = spec.autoscaling.min_replicas, spec.autoscaling.max_replicas
    spare = standby_replicas(deployment)
    # A new fleet starts with at least one replica, minReplicas 0 too (Knative's initial scale): it shows it serves.
    return spare + (max(low, 1) if current is None else clamp_replicas(max(0, int(current) - spare), low, high))


def encode_desired_replicas(inference: MultimodalInference, deployment: dict[str, Any] | None) -> int:
    """The encode tier's replicas: its spec's, or with its autoscaling what the scaler last set, within its bounds (a
    new tier starts from its spec's replicas)."""
    encode = inference.spec.disaggregation.encode
    if encode is None:
        return 0
    scaling = inference.spec.encode_autoscaling
    if scaling is None:
        return encode.replicas
    current = (deployment or {}).get("spec", {}).get("replicas")
    return clamp_replicas(
        encode.replicas if current is None else int(current), scaling.min_replicas, scaling.max_replicas
    )


def truncate(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters (the API server counts characters), ending in TRUNCATED when cut."""
    return text if len(text) <= limit else text[: limit - len(TRUNCATED)] + TRUNCATED


@dataclass(frozen=True)
class Conditions:
    """Builds the conditions of one new status: all share its time and generation, and meet the same previous ones."""

    before: dict[str, Condition]
    now: datetime
    generation: int | None

    @classmethod
    def after(cls, previous: MultimodalInferenceStatus | None, now: datetime, generation: int | None) -> Conditions:
        return cls({c.type: c for c in (previous.conditions if previous else [])}, now, generation)

    def __call__(self, kind: ConditionType, ok: bool | None, reason: str, message: str) -> Condition:
        """A condition whose transition time moves only when its status does; ``ok`` None is Unknown.

        A message longer than the API server accepts (Condition.message's maxLength) is cut, with a marker, so that
        a long list of problems never makes the status itself unwritable.
        """
        status = "Unknown" if ok is None else "True" if ok else "False"
        before = self.before.get(kind)
        since = before.last_transition_time if before is not None and before.status == status else self.now
        return Condition.model_validate(
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": truncate(message, CONDITION_MESSAGE_MAX),
                "lastTransitionTime": since,
                "observedGeneration": self.generation,
            }
        )

    def kept(self, kinds: tuple[ConditionType, ...]) -> list[Condition]:
        """Those of ``kinds`` as last written, for a part of the status this one does not recompute."""
        return [self.before[kind] for kind in kinds if kind in self.before]


def replica_failure(deployment: dict[str, Any] | None) -> tuple[str, str] | None:
    """Why the ReplicaSet cannot create the pods asked for, as the Deployment carries it (ReplicaFailure), or None.

    Pods a ResourceQuota refuses never exist, so no pod explains them: the ReplicaSet controller's
    ``FailedCreate`` message (``exceeded quota: <name>, requested: ..., used: ..., limited: ...``) is all there is.
    """
    for entry in ((deployment or {}).get("status") or {}).get("conditions") or []:
        if entry.get("type") == "ReplicaFailure" and entry.get("status") == "True":
            message = str(entry.get("message") or "")
            reason = (
                DegradedReason.QUOTA_EXCEEDED
                if "exceeded quota" in message
                else str(entry.get("reason") or DegradedReason.FAILED_CREATE)
            )
            return reason, f"the Deployment's pods cannot be created: {message}"
    return None


def refused_pods(deployment: dict[str, Any] | None) -> tuple[int, str]:
    """How many of the pods the Deployment wants its ReplicaSet could not create (a quota), and why; (0, "") if none.

    For the autoscaler they are as unschedulable pods are: more replicas would be refused too, so growth stops.
    """
    failure = replica_failure(deployment)
    if failure is None or deployment is None:
        return 0, ""
    wanted = int((deployment.get("spec") or {}).get("replicas") or 0)
    existing = int((deployment.get("status") or {}).get("replicas") or 0)
    return max(0, wanted - existing), failure[1]


def _deployment_progress(deployment: dict[str, Any]) -> tuple[bool, str]:
    """Whether the Deployment gave up rolling out (ProgressDeadlineExceeded), and its message."""
    for entry in deployment.get("status", {}).get("conditions") or []:
        if entry.get("type") == "Progressing" and entry.get("reason") == "ProgressDeadlineExceeded":
            return True, entry.get("message") or "rollout exceeded its progress deadline"
    return False, ""


def _scaling_part(
    inference: MultimodalInference,
    scaling: Scaling | None,
    previous: MultimodalInferenceStatus | None,
    condition: Conditions,
) -> tuple[dict[str, Any], list[Condition]]:
    """The autoscaler's fields and conditions: from this cycle's ``scaling``, else as last written.

    They go when autoscaling goes (no stale SLOMet after it is turned off). ``slo.observed`` and
    ``slo.lastEvaluated`` keep the last measurement while nothing is measured (their age shows),
    and an idle fleet has no percentile to show.
    """
    autoscaling = inference.spec.autoscaling
    slo = autoscaling.slo if autoscaling is not None and inference.spec.autoscaled else None
    if slo is None or (scaling is None and previous is None):
        return {}, []
    if scaling is None:
        assert previous is not None
        fields = {
            "slo": previous.slo,
            "coldStart": previous.cold_start,
            "standby": previous.standby if inference.spec.standby is not None else None,
            "lastScaleTime": previous.last_scale_time,
            "lastScaleReason": previous.last_scale_reason,
        }
        kept = condition.kept(AUTOSCALER_CONDITIONS)
        return fields, [c for c in kept if c.type != "EncodeMetricsAvailable" or inference.spec.encode_autoscaling]
    previous = previous or MultimodalInferenceStatus()
    now = condition.now
    last = previous.slo or SloStatus()
    if scaling.latency is not None or scaling.idle:
        observed = None if scaling.latency is None else duration_text(scaling.latency)
        last = SloStatus(observed=observed, last_evaluated=now)
    fields = {
        "slo": SloStatus(
            observed=last.observed,
            # the serving tier's part when the encode tier scales on its own share: what ``observed`` is held to
            target=slo.target
            if inference.spec.encode_autoscaling is None
            else duration_text(inference.spec.serving_slo_target or 0.0),
            attainment=scaling.attainment,
            last_evaluated=last.last_evaluated,
        ),
        "coldStart": scaling.cold_start or previous.cold_start,
        "standby": scaling.standby,
        "lastScaleTime": now if scaling.scaled else previous.last_scale_time,
        "lastScaleReason": truncate(scaling.reason, SCALE_REASON_MAX) if scaling.scaled else previous.last_scale_reason,
    }
    return fields, [condition(*row) for row in scaling.conditions]


def shared_cache_problem(inference: MultimodalInference, claim: dict[str, Any] | None) -> tuple[str, str] | None:
    """Why the shared model cache's claim cannot serve every replica, or None (also when no claim is shared).

    The pods would only say ``persistentvolumeclaim not found`` or stay Pending on a second node; the condition
    names the field and what would work instead.
    """
    cache = inference.spec.model_cache
    if cache.volume != "shared":
        return None
    where = f"spec.modelCache.claimName: {cache.claim_name}"
    instead = "or set spec.modelCache.volume: emptyDir"
    if claim is None:
        return (
            DegradedReason.MODEL_CACHE_CLAIM_MISSING,
            f"{where}: no PersistentVolumeClaim of that name in namespace {inference.metadata.namespace}; create a "
            f"ReadWriteMany claim (EFS on EKS, Azure Files on AKS, NAS on ACK) {instead}",
        )
    modes = list((claim.get("spec") or {}).get("accessModes") or [])
    if "ReadWriteMany" not in modes:
        return (
            DegradedReason.MODEL_CACHE_CLAIM_NOT_SHARED,
            f"{where} has access modes {', '.join(modes) or 'none'}; replicas on several nodes need ReadWriteMany "
            f"(EFS, Azure Files, NAS) {instead}",
        )
    if (claim.get("status") or {}).get("phase") == "Lost":
        return (
            DegradedReason.MODEL_CACHE_CLAIM_LOST,
            f"{where} is Lost: its PersistentVolume is gone; recreate it {instead}",
        )
    return None


def compute_status(
    inference: MultimodalInference | InvalidSpec,
    observed: Observed,
    previous: MultimodalInferenceStatus | None,
    now: datetime,
) -> MultimodalInferenceStatus:
    """The whole status, the autoscaler's part included, from the spec and what was observed."""
    if isinstance(inference, InvalidSpec):
        return _invalid_status(inference, previous, now)
    generation = inference.metadata.generation
    condition = Conditions.after(previous, now, generation)
    base, kept = _scaling_part(inference, observed.scaling, previous, condition)
    base |= {
        "observedGeneration": generation,
        "selector": render.selector_string(inference),
        "endpoint": render.endpoint(inference),
        "cloud": observed.cloud,
        "backend": inference.spec.backend.name,
    }

    tracing = _tracing_part(inference, observed.tracing, condition)
    routed, base["routing"] = _routing_part(inference, observed.routing, condition, previous)
    encoded, base["encode"] = _encode_part(
        inference, observed.encode, condition, previous, observed.scaling.encode if observed.scaling else None
    )

    def status(phase: Phase, conditions: list[Condition], **numbers: int) -> MultimodalInferenceStatus:
        body = {**base, **numbers, "phase": phase, "conditions": [*conditions, *kept, *tracing, *routed, *encoded]}
        return MultimodalInferenceStatus.model_validate({k: v for k, v in body.items() if v is not None})

    deployment = observed.deployment
    desired = observed.scaling.replicas if observed.scaling else desired_replicas(inference, deployment)
    if observed.refused is not None:
        reason, message = observed.refused
        return status(
            "Degraded",
            [
                condition("Ready", False, reason, message),
                condition("Progressing", False, reason, "nothing applied until this is resolved"),
                condition("Degraded", True, reason, message),
            ],
            desiredReplicas=desired,
        )
    retrying = None
    if observed.retrying is not None:
        retrying = condition("Progressing", False, ProgressingReason.API_SERVER_RETRYING, observed.retrying)
    if deployment is None:
        return status(
            "Pending",
            [
                condition("Ready", False, ReadyReason.CREATING, "creating the Deployment"),
                retrying or condition("Progressing", True, ProgressingReason.CREATING, "creating the Deployment"),
                condition("Degraded", False, DegradedReason.AS_EXPECTED, ""),
            ],
            desiredReplicas=desired,
        )

    dep_status = deployment.get("status") or {}
    replicas = int(dep_status.get("replicas") or 0)
    ready = int(dep_status.get("readyReplicas") or 0)
    updated = int(dep_status.get("updatedReplicas") or 0)
    rolled_out = dep_status.get("observedGeneration", 0) >= deployment.get("metadata", {}).get("generation", 0)
    serving = rolled_out and ready >= desired and updated >= desired and replicas <= desired
    stalled, stall_message = _deployment_progress(deployment)
    problems = observed.pod_problems
    failed_create = replica_failure(deployment)

    ready_message = f"{ready}/{desired} replicas ready"
    if serving and desired == 0 and inference.spec.autoscaled:
        ready_message = "scaled to zero while idle: the endpoint picker holds the next request while a replica starts"
        ready_cond = condition("Ready", True, ReadyReason.SCALED_TO_ZERO, ready_message)
        progressing = condition("Progressing", False, ProgressingReason.ROLLED_OUT, "0 replicas: scaled to zero")
    elif serving:
        ready_cond = condition("Ready", True, ReadyReason.REPLICAS_READY, ready_message)
        progressing = condition("Progressing", False, ProgressingReason.ROLLED_OUT, ready_message)
    else:
        ready_cond = condition("Ready", False, ReadyReason.REPLICAS_NOT_READY, ready_message)
        progressing = condition(
            "Progressing",
            not stalled,
            ProgressingReason.PROGRESS_DEADLINE_EXCEEDED if stalled else ProgressingReason.REPLICAS_STARTING,
            stall_message or f"{updated}/{desired} replicas on the current spec, {ready} ready",
        )
    progressing = retrying or progressing
    if observed.cache_problem is not None:
        reason, message = observed.cache_problem
        degraded = condition("Degraded", True, reason, message)
    elif failed_create is not None:
        degraded = condition("Degraded", True, *failed_create)
    elif problems:
        first = problems[0]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        degraded = condition("Degraded", True, first.reason, f"pod {first.pod}: {first.message}{more}")
    elif stalled:
        degraded = condition("Degraded", True, DegradedReason.PROGRESS_DEADLINE_EXCEEDED, stall_message)
    else:
        degraded = condition("Degraded", False, DegradedReason.AS_EXPECTED, "")

    # A fleet woken from zero serves through the picker, which holds its requests while the replica starts: Ready
    # stays True (an Argo CD Application does not turn Progressing at each wake) unless something is wrong.
    before = next((c for c in previous.conditions if c.type == "Ready"), None) if previous else None
    waking = ready == 0 and before is not None and before.status == "True"
    waking = waking and before is not None and before.reason in {ReadyReason.SCALED_TO_ZERO, ReadyReason.WAKING_UP}
    if waking and not serving and degraded.status == "False" and not stalled and inference.spec.autoscaled:
        serving = True
        message = "waking from zero: a replica is starting, and the endpoint picker holds requests until it is Ready"
        ready_cond = condition("Ready", True, ReadyReason.WAKING_UP, message)
    phase: Phase = "Ready" if serving else ("Degraded" if degraded.status == "True" else "Progressing")
    return status(
        phase,
        [ready_cond, progressing, degraded],
        replicas=replicas,
        readyReplicas=ready,
        desiredReplicas=desired,
    )


def _tracing_part(inference: MultimodalInference, seen: TracingSeen | None, condition: Conditions) -> list[Condition]:
    """TracingReady while spec.tracing.enabled, from what was seen, else as last written (Unknown before that)."""
    if not inference.spec.tracing.enabled:
        return []
    if seen is not None:
        return [condition(*tracing_row(seen))]
    kept = condition.kept(("TracingReady",))
    message = "the collector has not been looked up yet"
    return kept or [condition("TracingReady", None, TracingReadyReason.NOT_CHECKED, message)]


def _routing_part(
    inference: MultimodalInference,
    seen: RoutingSeen | None,
    condition: Conditions,
    previous: MultimodalInferenceStatus | None,
) -> tuple[list[Condition], dict[str, Any] | None]:
    """RoutingReady and status.routing in routing mode inferencePool, from what was seen, else as last written."""
    if inference.spec.routing.mode != "inferencePool":
        return [], None
    if seen is None:
        kept = condition.kept(("RoutingReady",))
        before = (
            previous.routing.model_dump(by_alias=True, exclude_none=True) if previous and previous.routing else None
        )
        return kept or [condition("RoutingReady", None, RoutingReadyReason.NOT_CHECKED, "not looked at yet")], before
    row = routing_row(inference, seen)
    part = {"pool": inference.metadata.name, "picker": routing.picker_name(inference), "pickerReady": seen.picker_ready}
    return [condition(*row)], part if seen.crds.pool else None


def _encode_part(
    inference: MultimodalInference,
    seen: EncodeSeen | None,
    condition: Conditions,
    previous: MultimodalInferenceStatus | None,
    scaling: EncodeScaling | None = None,
) -> tuple[list[Condition], dict[str, Any] | None]:
    """EncodeReady and status.encode with spec.disaggregation.encode, from what was seen, else as last written; with
    its autoscaling, the autoscaler's part from its cycle (``scaling``), else as last written while it is on."""
    if inference.spec.disaggregation.encode is None:
        return [], None
    before = previous.encode.model_dump(by_alias=True, exclude_none=True) if previous and previous.encode else {}
    if seen is None:
        kept = condition.kept(("EncodeReady",))
        return kept or [
            condition("EncodeReady", None, EncodeReadyReason.NOT_CHECKED, "not looked at yet")
        ], before or None
    row, part = encode_row(inference, seen, scaling)
    if inference.spec.encode_autoscaling is not None:
        # The autoscaler's fields, as last written while no cycle measured them (latency: the last percentile).
        part.update({k: before[k] for k in ("latency", "target", "lastScaleReason") if k in before})
        if scaling is not None:
            part["target"] = duration_text(scaling.target)
            if scaling.latency is not None:
                part["latency"] = duration_text(scaling.latency)
            if scaling.scaled:
                part["lastScaleReason"] = truncate(scaling.reason, SCALE_REASON_MAX)
    return [condition(*row)], part


def _invalid_status(
    spec: InvalidSpec, previous: MultimodalInferenceStatus | None, now: datetime
) -> MultimodalInferenceStatus:
    """A spec the operator cannot serve: say why on Ready, and leave running children alone."""
    problems, generation = spec.problems, spec.generation
    condition = Conditions.after(previous, now, generation)
    message = "; ".join(problems)
    if spec.denied:
        reasons = (ReadyReason.POLICY_DENIED, ProgressingReason.POLICY_DENIED, DegradedReason.POLICY_DENIED)
        fix = "change the spec, or have the cluster admin allow it, to continue"
    else:
        reasons = (ReadyReason.INVALID_SPEC, ProgressingReason.INVALID_SPEC, DegradedReason.INVALID_SPEC)
        fix = "fix the spec to continue"
    conditions = [
        condition("Ready", False, reasons[0], message),
        condition("Progressing", False, reasons[1], fix),
        condition("Degraded", True, reasons[2], message),
        *condition.kept(AUTOSCALER_CONDITIONS),
    ]
    kept = previous.model_dump(exclude={"conditions", "phase", "observed_generation"}) if previous else {}
    return MultimodalInferenceStatus.model_validate(
        {**kept, "phase": "Failed", "observed_generation": generation, "conditions": conditions}
    )


def rolling_out(new: MultimodalInferenceStatus) -> bool:
    """Whether ``new`` only says that a rollout is under way: not Ready, and no condition worth an event."""
    return new.phase in ("Pending", "Progressing") and not events(None, new)


def events(previous: MultimodalInferenceStatus | None, new: MultimodalInferenceStatus) -> list[tuple[str, str, str]]:
    """The (type, reason, message) events a status change is worth: bad news as Warnings, and Ready.

    Only transitions count: a condition whose status and reason stayed is not news again.
    """
    before = {c.type: c for c in previous.conditions} if previous else {}
    found = []
    for condition in new.conditions:
        old = before.get(condition.type)
        if old is not None and (old.status, old.reason) == (condition.status, condition.reason):
            continue
        if condition.status == WARNING_WHEN.get(condition.type):
            found.append(("Warning", condition.reason, condition.message))
        elif condition.type == "Ready" and condition.status == "True":
            found.append(("Normal", "Ready", condition.message))
    return found
