"""Operator settings: environment variables (``MMFLEET_<FIELD>``, for the Deployment's env), overridden by flags."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict, SettingsError

from mmfleet.admin_policy import AdminPolicy
from mmfleet.api import CloudName, seconds
from mmfleet.clouds import COLLECTOR_ENDPOINT
from mmfleet.routing import DEFAULT_COLD_START, DEFAULT_PICKER

LogFormat = Literal["plain", "json"]
ENV_PREFIX = "MMFLEET_"
AUTOSCALE_INTERVAL_MIN = 1.0  # s: the shortest autoscaling cycle accepted
# The patterns as strings too: the chart's values schema (mmfleet.chart_values) checks the same forms.
ENDPOINT_PATTERN = r"(https?://)?[A-Za-z0-9\[][A-Za-z0-9.\-\[\]:]*(/\S*)?"
DOMAIN_PATTERN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_ENDPOINT = re.compile(ENDPOINT_PATTERN)
_DOMAIN = re.compile(DOMAIN_PATTERN, re.IGNORECASE)
_NAME = re.compile(DOMAIN_PATTERN)


def otlp_endpoint(value: str) -> str:
    """``value`` if it can be an OTLP/gRPC endpoint (the operator's setting and ``mmfleet render`` share this)."""
    if not _ENDPOINT.fullmatch(value):
        raise ValueError("not an OTLP/gRPC endpoint such as http://otel.observability.svc:4317 or host:4317")
    return value


def duration_seconds(value: Any, at_least: float) -> float:
    """A duration such as 15s or 2m, or a bare number of seconds, of at least ``at_least`` seconds."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            try:
                value = seconds(value)
            except ValueError:
                value = math.nan
    if not math.isfinite(value):
        raise ValueError("not a duration such as 15s, 2m or 90 (seconds)")
    if value < at_least:
        raise ValueError(f"{value:g}s is below the least accepted, {at_least:g}s")
    return float(value)


class OperatorConfig(BaseSettings):
    """How one operator process runs; the defaults suit a cluster-wide install."""

    # populate_by_name: code may write OperatorConfig(default_cold_start=...) (the environment then also takes
    # MMFLEET_DEFAULT_COLD_START beside the documented MMFLEET_COLD_START).
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="forbid", populate_by_name=True)

    # MMFLEET_NAMESPACES=a,b; empty: every namespace.
    namespaces: Annotated[tuple[str, ...], NoDecode] = ()
    # Empty: no Prometheus, so autoscaled fleets hold their replicas and say why (MetricsAvailable).
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    autoscale_interval: float = 15.0  # s between autoscaling cycles
    # The cold start the autoscaler plans with until one of a fleet's pods has been seen turn Ready.
    default_cold_start: float = Field(default=DEFAULT_COLD_START, validation_alias=f"{ENV_PREFIX}COLD_START")
    default_cloud: CloudName = "auto"
    # The ClusterRole the install ships for fleets' endpoint pickers (routing mode inferencePool), bound per fleet.
    picker_cluster_role: str = DEFAULT_PICKER.cluster_role
    # The endpoint picker's image: the pinned upstream release, or a mirror of it (an air-gapped registry). Another
    # version must take the same flags and configuration.
    picker_image: str = Field(default=DEFAULT_PICKER.image, min_length=1)
    log_format: LogFormat = "plain"
    workers: int = 16
    # Where kopf serves /healthz for the liveness probe; empty turns it off.
    health_address: str = "0.0.0.0:8080"
    # Where the operator's own /metrics are served; empty turns them off.
    metrics_address: str = "0.0.0.0:8081"
    # Where fleets' pods send spans when spec.tracing.endpoint is empty, and what TracingReady looks up: the
    # collector installed with the operator (the chart sets its release namespace's, or collector.endpoint).
    collector_endpoint: str = COLLECTOR_ENDPOINT
    # The cluster's DNS domain: which endpoints name a Service (name.ns.svc.<domain>) for TracingReady.
    cluster_domain: str = "cluster.local"
    # Leader election: only the holder of this coordination.k8s.io Lease reconciles and scales, so two operator
    # processes (a rolling update, replicas: 2, a second install sharing the Lease) never both act. Empty: none.
    leader_election_lease: str = ""
    # The Lease's namespace (the chart sets the operator's own); empty: the pod's own, else "default".
    leader_election_namespace: str = ""
    # What fleets may name (images, Secrets, claims, identities, tolerations, node labels, load balancers): JSON in
    # MMFLEET_POLICY, the chart's `policy` value. Closed by default (mmfleet.admin_policy).
    policy: AdminPolicy = Field(default_factory=AdminPolicy)

    @field_validator("namespaces", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        return tuple(n.strip() for n in value.split(",") if n.strip()) if isinstance(value, str) else value

    @field_validator("autoscale_interval", mode="before")
    @classmethod
    def _interval(cls, value: Any) -> float:
        return duration_seconds(value, at_least=AUTOSCALE_INTERVAL_MIN)

    @field_validator("default_cold_start", mode="before")
    @classmethod
    def _cold_start(cls, value: Any) -> float:
        return duration_seconds(value, at_least=0.0)

    @field_validator("collector_endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        return otlp_endpoint(value)

    @field_validator("leader_election_lease", "leader_election_namespace")
    @classmethod
    def _object_name(cls, value: str) -> str:
        if value and (len(value) > 63 or not _NAME.fullmatch(value)):
            raise ValueError("not an object name: at most 63 lowercase letters, digits, '-' or '.' (or empty)")
        return value

    @field_validator("cluster_domain")
    @classmethod
    def _domain(cls, value: str) -> str:
        if not _DOMAIN.fullmatch(value.strip(".")):
            raise ValueError("not a DNS domain such as cluster.local")
        return value.strip(".").lower()

    @field_validator("workers")
    @classmethod
    def _workers(cls, value: int) -> int:
        if value < 1:
            raise ValueError(f"{value} is below the least accepted, 1")
        return value

    @property
    def prometheus_deadline(self) -> float:
        """Seconds one cycle's read of Prometheus may take: half the interval, so a cycle whose queries hang
        still ends before the next is due, and the liveness probe stays green."""
        return self.autoscale_interval / 2

    @classmethod
    def load(cls, **overrides: Any) -> OperatorConfig:
        """The environment's settings under ``overrides`` (flags); ValueError names variable, value and rule."""
        try:
            return cls(**overrides)
        except ValidationError as error:
            raise ValueError("; ".join(_problem(e) for e in error.errors())) from None
        except SettingsError as error:  # a setting that must be JSON (MMFLEET_POLICY) is not
            cause = error.__cause__ or error
            example = '{"secrets": ["team-a/hf-token"]}'
            raise ValueError(f"{error}: expected JSON, such as {example} ({cause})") from None


def env_variables() -> dict[str, str]:
    """Each setting's environment variable, by field name: ``MMFLEET_<FIELD>`` unless aliased."""
    return {
        name: field.validation_alias if isinstance(field.validation_alias, str) else ENV_PREFIX + name.upper()
        for name, field in OperatorConfig.model_fields.items()
    }


def _problem(error: Any) -> str:
    """``MMFLEET_X: 'value': why``, whether the value came from the environment or a flag; a nested setting's path
    follows its variable (``MMFLEET_POLICY.secrets[0]``)."""
    where = str(error["loc"][0])
    variable = env_variables().get(where, where)
    for part in error["loc"][1:]:
        variable += f"[{part}]" if isinstance(part, int) else f".{part}"
    cause = error.get("ctx", {}).get("error")
    message = str(cause) if isinstance(cause, ValueError) else error["msg"][:1].lower() + error["msg"][1:]
    return f"{variable}: {error['input']!r}: {message}"
