"""The Helm chart's values as a pydantic model: the source of ``charts/mmfleet/values.schema.json``.

Helm validates every install, upgrade, template and lint against that schema, so a wrong value (an unknown
cloud, a duration that is not Go's form, a negative number) fails before anything is rendered, with the value's
path in the message. The types are the operator's own (``mmfleet.api``, ``mmfleet.config``): the chart accepts
what the operator it configures accepts. ``charts/mmfleet/values.yaml`` holds the same defaults, with comments;
a contract test checks that the two and the committed schema agree.

Regenerate with ``make crds`` (``python -m mmfleet.chart_values``).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, WithJsonSchema

from mmfleet.admin_policy import AdminPolicy
from mmfleet.api import (
    DNS_SUBDOMAIN_PATTERN,
    DURATION_PATTERN,
    QUANTITY_PATTERN,
    CloudName,
    Model,
    ProfileName,
    Quantity,
    Toleration,
)
from mmfleet.clouds.collector import COLLECTOR_SECRET, COLLECTOR_VERSION, REGION_PATTERN
from mmfleet.config import (
    AUTOSCALE_INTERVAL_MIN,
    DOMAIN_PATTERN,
    ENDPOINT_PATTERN,
    LogFormat,
    duration_seconds,
    otlp_endpoint,
)
from mmfleet.routing import PICKER_IMAGE

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

PullPolicy = Literal["Always", "IfNotPresent", "Never"]
Labels = dict[str, str]


def _at_least(minimum: float) -> AfterValidator:
    """The operator's own bound on a duration setting (``mmfleet.config.duration_seconds``)."""

    def check(value: str) -> str:
        duration_seconds(value, at_least=minimum)
        return value

    return AfterValidator(check)


def _optional(pattern: str) -> str:
    """``pattern`` anchored, or the empty string (the chart's 'not set')."""
    return f"^({pattern})?$"


def _optional_endpoint(value: str) -> str:
    return otlp_endpoint(value) if value else value


# A Go duration (15s, 2m, 1m30s; the form kopf's and the operator's settings take); no sign, so never negative.
GoDuration = Annotated[
    str,
    Field(
        pattern=DURATION_PATTERN,
        description="A Go-style duration: numbers with units ms, s, m, h, e.g. 500ms, 15s, 2m, 1m30s.",
    ),
]
# Kubernetes resource quantities, with the pattern in the schema (the CRD generator adds it the same way).
ChartQuantity = Annotated[
    Quantity,
    WithJsonSchema({"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": QUANTITY_PATTERN}]}),
]


class Image(Model):
    """A container image; the tag empty means the chart's appVersion (the operator) or the pinned release."""

    repository: str = Field(min_length=1, description="Image repository, e.g. ghcr.io/mmfleet/operator.")
    tag: str = Field(default="", description="Image tag; empty: the chart's appVersion.")
    pull_policy: PullPolicy = Field(default="IfNotPresent", description="Kubernetes imagePullPolicy.")


class LocalObjectReference(Model):
    """A Secret in the release namespace, by name."""

    name: str = Field(min_length=1, pattern=DNS_SUBDOMAIN_PATTERN, description="The Secret's name.")


class Resources(Model):
    """A container's resource requests and limits (Kubernetes ResourceRequirements)."""

    requests: dict[str, ChartQuantity] = Field(default_factory=dict, description="e.g. cpu: 100m, memory: 256Mi.")
    limits: dict[str, ChartQuantity] = Field(default_factory=dict, description="e.g. memory: 512Mi.")


class ServiceAccount(Model):
    """The operator's ServiceAccount."""

    create: bool = Field(default=True, description="Create it; otherwise `name` must exist in the namespace.")
    name: str = Field(
        default="",
        pattern=_optional(DNS_SUBDOMAIN_PATTERN.strip("^$")),
        description="Its name; empty: the release's full name.",
    )
    annotations: Labels = Field(default_factory=dict, description="e.g. a cloud's workload identity annotation.")


class CollectorServiceAccount(Model):
    """The collector's ServiceAccount."""

    annotations: Labels = Field(
        default_factory=dict,
        description="EKS IRSA: eks.amazonaws.com/role-arn of a role allowed to put X-Ray traces.",
    )


def _collector_image() -> Image:
    return Image(repository="otel/opentelemetry-collector-contrib", tag=COLLECTOR_VERSION)


def _default_resources() -> Resources:
    return Resources(requests={"cpu": "100m", "memory": "256Mi"}, limits={"memory": "512Mi"})


class Collector(Model):
    """The OpenTelemetry Collector fleets' pods (and the operator) send spans to (docs/tracing.md)."""

    enabled: bool = Field(default=True, description="Install the collector.")
    endpoint: Annotated[str, AfterValidator(_optional_endpoint)] = Field(
        default="",
        pattern=_optional(ENDPOINT_PATTERN),
        description="Reuse a collector instead: its OTLP/gRPC endpoint, e.g. http://otel.observability.svc:4317.",
    )
    cloud: ProfileName | Literal[""] = Field(
        default="", description="Which cloud's shipped configuration; empty: defaultCloud."
    )
    config: str = Field(default="", description="A whole collector configuration (YAML) instead of the shipped one.")
    image: Image = Field(default_factory=_collector_image, description="The collector image.")
    secret_name: str = Field(
        default=COLLECTOR_SECRET,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="The Secret holding one key per ${env:NAME} the configuration reads.",
    )
    service_account: CollectorServiceAccount = Field(
        default_factory=CollectorServiceAccount, description="The collector's ServiceAccount."
    )
    aws_region: str = Field(
        default="",
        pattern=_optional(REGION_PATTERN),
        description="EKS: the AWS region (AWS_REGION), e.g. us-west-2; required with the shipped eks configuration.",
    )
    resources: Resources = Field(default_factory=_default_resources, description="The collector's resources.")


class Toggle(Model):
    """An optional object the chart installs, and the labels that select it (e.g. a Prometheus' selector)."""

    enabled: bool = Field(default=False, description="Install it.")
    labels: Labels = Field(default_factory=dict, description="Extra labels on it.")


def _dashboards() -> Toggle:
    return Toggle(labels={"grafana_dashboard": "1"})


class Monitoring(Model):
    """The operator's own monitoring: the Prometheus Operator's PodMonitor and PrometheusRule, Grafana dashboards."""

    pod_monitor: Toggle = Field(default_factory=Toggle, description="A PodMonitor for the operator's metrics.")
    dashboards: Toggle = Field(
        default_factory=_dashboards,
        description="ConfigMaps holding the Grafana dashboards (labels: what the Grafana sidecar selects).",
    )
    alerts: Toggle = Field(default_factory=Toggle, description="A PrometheusRule with the alerts.")


class ChartValues(Model):
    """Every value of the mmfleet chart."""

    name_override: str = Field(default="", max_length=63, description="The chart name in object names.")
    fullname_override: str = Field(default="", max_length=63, description="The objects' full name.")
    image: Image = Field(
        default_factory=lambda: Image(repository="ghcr.io/mmfleet/operator"), description="The operator image."
    )
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list, description="Secrets to pull the operator image with."
    )
    default_cloud: CloudName = Field(
        default="auto",
        description="Cloud profile for fleets with spec.cloud auto (MMFLEET_DEFAULT_CLOUD); auto detects it.",
    )
    watch_namespaces: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list,
        description="The namespaces the operator serves: names (a Role in each) or, with clusterWide, kopf "
        "patterns such as ml-*; set this or clusterWide (docs/operator.md).",
    )
    cluster_wide: bool = Field(
        default=False,
        description="A ClusterRole writing in every namespace; the operator serves every namespace (or those "
        "watchNamespaces matches) but kube-system, kube-public and kube-node-lease.",
    )
    prometheus_url: str = Field(
        default="http://prometheus-operated.monitoring.svc:9090",
        pattern=r"^(https?://\S+)?$",
        description="The Prometheus the autoscaler queries; empty: autoscaled fleets hold their replicas.",
    )
    autoscale_interval: Annotated[GoDuration, _at_least(AUTOSCALE_INTERVAL_MIN)] = Field(
        default="15s",
        description=f"Time between autoscaling cycles (Go duration, at least {AUTOSCALE_INTERVAL_MIN:g}s).",
    )
    default_cold_start: Annotated[GoDuration, _at_least(0.0)] = Field(
        default="120s",
        description="The cold start (pod created to Ready, Go duration) assumed until a fleet's pod is seen Ready.",
    )
    log_format: LogFormat = Field(default="json", description="plain, or json (one object per line).")
    workers: int = Field(default=16, ge=1, description="Reconcile workers (and autoscaler threads).")
    service_account: ServiceAccount = Field(default_factory=ServiceAccount, description="The operator's account.")
    resources: Resources = Field(default_factory=_default_resources, description="The operator's resources.")
    pod_annotations: Labels = Field(default_factory=dict, description="Extra annotations on the operator's pod.")
    pod_labels: Labels = Field(default_factory=dict, description="Extra labels on the operator's pod.")
    node_selector: Labels = Field(
        default_factory=lambda: {"kubernetes.io/os": "linux"}, description="Where the operator's pod runs."
    )
    tolerations: list[Toleration] = Field(default_factory=list, description="The operator pod's tolerations.")
    affinity: dict[str, Any] = Field(default_factory=dict, description="A Kubernetes Affinity, used as given.")
    picker_image: str = Field(
        default=PICKER_IMAGE,
        min_length=1,
        description="The endpoint picker's image for fleets in routing mode inferencePool (MMFLEET_PICKER_IMAGE): "
        "the pinned upstream release, or your mirror of it.",
    )
    cluster_domain: str = Field(
        default="cluster.local",
        pattern=f"(?i)^({DOMAIN_PATTERN})\\.?$",
        description="The cluster's DNS domain (MMFLEET_CLUSTER_DOMAIN).",
    )
    collector: Collector = Field(default_factory=Collector, description="The OpenTelemetry Collector.")
    policy: AdminPolicy = Field(
        default_factory=AdminPolicy,
        description="What MultimodalInferences may name (images, Secrets, claims, identities, placement, load "
        "balancers); closed by default (docs/security.md).",
    )
    monitoring: Monitoring = Field(default_factory=Monitoring, description="The operator's own monitoring.")


def values_schema() -> dict[str, Any]:
    """The JSON Schema (2020-12, which Helm 3.18+ validates with) of the chart's values."""
    return {"$schema": JSON_SCHEMA_DIALECT, **ChartValues.model_json_schema(by_alias=True, mode="validation")}


def values_schema_json() -> str:
    """``values_schema()`` as the committed file holds it."""
    return json.dumps(values_schema(), indent=2) + "\n"


if __name__ == "__main__":
    print(values_schema_json(), end="")
