"""The OpenTelemetry Collector configuration mmfleet installs per cloud: a pure function of the settings.

One gateway collector per cluster (``mmfleet-otel-collector`` in ``mmfleet-system``, the Service that
``COLLECTOR_ENDPOINT`` names) receives OTLP from the inference pods and the operator, adds the pod's
Kubernetes metadata and the cloud's resource attributes, batches, and exports to the cloud's tracing
service through the exporter fragment of the cloud's profile (``mmfleet.clouds.<cloud>``).

Credentials never appear here: the generated text holds only ``${env:NAME}`` references, which the
collector expands at start from environment variables its Deployment takes from the Secret
``COLLECTOR_SECRET`` (or, on EKS, the AWS SDK's default chain: IRSA or EKS Pod Identity). So the
config can live in a ConfigMap, in git and in a log line.

Component type names and keys are those of the pinned release (``COLLECTOR_VERSION``), read in each
component's ``config.go`` and ``metadata.yaml``: ``otlp`` receiver (``protocols.grpc|http.endpoint``);
``memory_limiter`` (``check_interval``, ``limit_percentage``, ``spike_limit_percentage``); ``k8s_attributes``
(``extract.metadata``, ``extract.labels[].tag_name|key|from``, ``pod_association[].sources[].from|name``);
``resource_detection`` (``detectors``, ``timeout``, ``override``, ``<detector>.resource_attributes.<name>.enabled``;
detectors ``env``, ``eks``, ``ec2``, ``aks``, ``azure``, ``alibaba_ecs``); ``resource``
(``attributes[].key|value|action``); ``batch``; ``health_check`` (``endpoint``). The builder manifest that
compiles exactly these is ``mmfleet_lab.cluster.build.COLLECTOR_COMPONENTS``; a unit test keeps the two in step.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mmfleet.api import ProfileName
from mmfleet.clouds import JsonObj, get

# The collector release the manifests run (image tag) and the tests build (mmfleet_lab.cluster.build).
COLLECTOR_VERSION = "0.161.0"
COLLECTOR_IMAGE = f"otel/opentelemetry-collector-contrib:{COLLECTOR_VERSION}"
COLLECTOR_NAME = "mmfleet-otel-collector"
COLLECTOR_NAMESPACE = "mmfleet-system"
# The Secret whose keys become the collector's environment (secret_env); which keys each cloud reads: SECRET_KEYS.
COLLECTOR_SECRET = "mmfleet-otel-collector"
COLLECTOR_CONTAINER = "otel-collector"
# The kustomize EKS overlay's AWS_REGION until the user sets theirs: the X-Ray URL built from it is no URL (it has
# spaces), so the collector refuses to start (TracingReady: CollectorNotReady) rather than export nowhere.
AWS_REGION_PLACEHOLDER = "SET-ME your AWS region, e.g. us-west-2 (docs/tracing.md, EKS)"
OTLP_GRPC_PORT = 4317
OTLP_HTTP_PORT = 4318
HEALTH_PORT = 13133
# The label every fleet's pods carry (render.INFERENCE_LABEL, which this layer may not import); copied onto each
# span's resource.
INFERENCE_LABEL = "mmfleet.io/inference"

AckBackend = Literal["arms", "sls"]

# Detectors per cloud, most specific first (the first to set an attribute wins). Alibaba has an ECS detector
# (``alibaba_ecs``, resourcedetectionprocessor ``internal/alibaba/ecs``) but no ACK one; the ``system`` detector
# is left out everywhere: it only knows the collector's own host and OS.
DETECTORS: dict[ProfileName, tuple[str, ...]] = {
    "eks": ("env", "eks", "ec2"),
    "aks": ("env", "aks", "azure"),
    "ack": ("env", "alibaba_ecs"),
    "generic": ("env",),
}

# Every attribute each cloud detector can set (its ``metadata.yaml`` at resourcedetectionprocessor v0.158.0, the
# version the test collector builds; ``env`` has none to configure). The collector is a gateway: a detector
# describes the node the collector runs on, not the pod that sent the span, so only what is the same for every
# node of the cluster is kept (DETECTED_ATTRIBUTES); each detector's attributes are all written out, on or off,
# so a default that changes upstream cannot stamp the collector's host.*, azure.vm.* or zone on every span.
# What the ec2, eks and alibaba_ecs detectors read from their instance metadata: the same nine names in each.
_INSTANCE_ATTRIBUTES = (
    "cloud.account.id",
    "cloud.availability_zone",
    "cloud.platform",
    "cloud.provider",
    "cloud.region",
    "host.id",
    "host.image.id",
    "host.name",
    "host.type",
)
DETECTOR_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "eks": (*_INSTANCE_ATTRIBUTES, "k8s.cluster.name"),
    "ec2": _INSTANCE_ATTRIBUTES,
    "aks": ("cloud.platform", "cloud.provider", "k8s.cluster.name"),
    "azure": (
        "azure.resourcegroup.name",
        "azure.vm.name",
        "azure.vm.scaleset.name",
        "azure.vm.size",
        "cloud.account.id",
        "cloud.availability_zone",
        "cloud.platform",
        "cloud.provider",
        "cloud.region",
        "host.id",
        "host.name",
    ),
    "alibaba_ecs": _INSTANCE_ATTRIBUTES,
}
# Cluster-wide facts. The availability zone is the collector node's, not the sender's, so it is off too; the
# pod's node comes from k8s_attributes (k8s.node.name). k8s.cluster.name: EKS reads it with ec2:DescribeInstances
# (without that permission the detector logs at debug level and sets the rest), AKS parses the node resource group.
DETECTED_ATTRIBUTES = frozenset(
    {"cloud.provider", "cloud.platform", "cloud.region", "cloud.account.id", "k8s.cluster.name"}
)

# The environment variables each cloud's config references: the Secret COLLECTOR_SECRET must hold these keys
# (EKS needs none; its AWS_REGION is set by whatever installs the collector, see needs_region).
SECRET_KEYS: dict[str, tuple[str, ...]] = {
    "eks": (),
    "aks": ("APPLICATIONINSIGHTS_CONNECTION_STRING",),
    "ack": ("ARMS_OTLP_ENDPOINT", "ARMS_TOKEN"),
    "ack-sls": ("SLS_ENDPOINT", "SLS_PROJECT", "SLS_LOGSTORE", "SLS_ACCESS_KEY_ID", "SLS_ACCESS_KEY_SECRET"),
    "generic": ("OTLP_ENDPOINT",),
}

REGION_PATTERN = r"[a-z]{2}(-[a-z]+)+-\d+"  # an AWS region such as us-west-2 (also the chart's awsRegion)
_REGION = re.compile(REGION_PATTERN)
_ATTRIBUTE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-/]*")
_ENDPOINT = re.compile(r"(https?://)?[A-Za-z0-9.\-\[\]:]+(:\d+)?(/\S*)?")


class CollectorSettings(BaseModel):
    """What a user may change in the generated config; everything else follows from the cloud.

    Secrets are named, never given: a field that would hold a credential does not exist.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    cloud: ProfileName = "generic"
    # EKS: the X-Ray region, written into the endpoint and the SigV4 signer. Empty: ${env:AWS_REGION}.
    region: str | None = None
    # Where spans go: EKS the X-Ray OTLP traces URL (default from region), ACK (arms) the ARMS gRPC endpoint,
    # ACK (sls) the SLS endpoint, generic the OTLP/gRPC endpoint. Empty: from the Secret's environment variable.
    endpoint: str | None = None
    # generic and ACK ARMS: send without TLS (ARMS's documented endpoint on port 8090 is plain gRPC).
    insecure: bool | None = None
    ack_backend: AckBackend = "arms"
    sls_project: str | None = None
    sls_logstore: str | None = None
    # Added to every span's resource (the ``resource`` processor, upsert), e.g. deployment.environment.
    resource_attributes: dict[str, str] = Field(default_factory=dict)
    memory_limit_percentage: Annotated[int, Field(ge=10, le=95)] = 80
    memory_spike_limit_percentage: Annotated[int, Field(ge=1, le=50)] = 25

    @field_validator("region")
    @classmethod
    def _region(cls, value: str | None) -> str | None:
        if value is not None and not _REGION.fullmatch(value):
            raise ValueError(f"{value!r} is not a cloud region name such as us-east-1 or cn-hangzhou")
        return value

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None and ("${" in value or not _ENDPOINT.fullmatch(value)):
            raise ValueError(f"{value!r} is not a host:port or an http(s) URL")
        return value

    @field_validator("sls_project", "sls_logstore")
    @classmethod
    def _sls_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[a-z0-9][a-z0-9_\-]{1,126}[a-z0-9]", value):
            raise ValueError(f"{value!r} is not an SLS name (3-128 of a-z, 0-9, '-', '_')")
        return value

    @field_validator("resource_attributes")
    @classmethod
    def _attributes(cls, value: dict[str, str]) -> dict[str, str]:
        for key, item in value.items():
            if not _ATTRIBUTE_KEY.fullmatch(key):
                raise ValueError(f"key {key!r} is not an attribute name (letters, digits, '.', '_', '-', '/')")
            if "${" in item:
                raise ValueError(f"{key}={item!r}: '${{' would be expanded by the collector; give a literal value")
        return value

    @model_validator(mode="after")
    def _fits_the_cloud(self) -> CollectorSettings:
        """Refuse settings the chosen cloud would silently ignore, naming the field and where it applies."""
        applies = {
            "region": ("eks",),
            "endpoint": ("eks", "ack", "generic"),
            "insecure": ("ack", "generic"),
            "ack_backend": ("ack",),
            "sls_project": ("ack",),
            "sls_logstore": ("ack",),
        }
        for field, clouds in applies.items():
            if field in self.model_fields_set and self.cloud not in clouds:
                raise ValueError(f"{field} applies to cloud {' or '.join(clouds)}, not {self.cloud}")
        if self.cloud == "ack" and self.ack_backend == "arms" and (self.sls_project or self.sls_logstore):
            raise ValueError("sls_project and sls_logstore apply to ack_backend sls, not arms")
        if self.cloud == "ack" and self.ack_backend == "sls" and self.insecure is not None:
            raise ValueError("insecure applies to ack_backend arms, not sls")
        return self

    @classmethod
    def parse(cls, **values: Any) -> CollectorSettings:
        """The settings, or ValueError with one ``field: value: why`` line per problem."""
        try:
            return cls(**values)
        except ValidationError as error:
            raise ValueError("\n".join(_problem(e) for e in error.errors())) from None


def _problem(error: Any) -> str:
    where = ".".join(str(p) for p in error["loc"]) or "settings"
    cause = error.get("ctx", {}).get("error")
    message = str(cause) if isinstance(cause, ValueError) else error["msg"]
    return f"{where}: {error['input']!r}: {message}" if error["loc"] else f"{message}"


def secret_keys(settings: CollectorSettings) -> tuple[str, ...]:
    """The keys the collector's Secret must have for these settings (what ``${env:...}`` the config reads)."""
    if settings.cloud == "ack" and settings.ack_backend == "sls":
        keys = SECRET_KEYS["ack-sls"]
        fixed = {"SLS_ENDPOINT": settings.endpoint, "SLS_PROJECT": settings.sls_project}
        fixed["SLS_LOGSTORE"] = settings.sls_logstore
        return tuple(k for k in keys if not fixed.get(k))
    keys = SECRET_KEYS[settings.cloud]
    if settings.endpoint and settings.cloud in ("ack", "generic"):
        return tuple(k for k in keys if not k.endswith("ENDPOINT"))
    return keys


def needs_region(settings: CollectorSettings) -> bool:
    """Whether the config reads ``${env:AWS_REGION}`` (EKS without a region written in): unset, the collector
    would start and export to ``https://xray..amazonaws.com``, so whatever installs it must set the variable."""
    return settings.cloud == "eks" and settings.region is None


def secret_env(settings: CollectorSettings, secret: str = COLLECTOR_SECRET) -> list[JsonObj]:
    """The container's ``env`` for the Secret's keys this config reads: one ``secretKeyRef`` each, not optional.

    Not ``envFrom``: a Secret or key that is missing then stops the pod (``CreateContainerConfigError``), which
    TracingReady reports as CollectorNotReady, instead of a collector that is ready and exports nowhere.
    """
    return [{"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}} for key in secret_keys(settings)]


def kustomize_env_patch(settings: CollectorSettings) -> JsonObj:
    """The strategic-merge patch that gives the collector's container the environment its config reads.

    The kustomize base (generic) applies its own; an overlay's deletes the base's keys its cloud does not read,
    and on EKS sets AWS_REGION to ``AWS_REGION_PLACEHOLDER``, which the user replaces in an overlay of their own.
    """
    base = secret_keys(CollectorSettings())
    keys = secret_keys(settings)
    env: list[JsonObj] = [{"name": key, "$patch": "delete"} for key in base if key not in keys]
    env += secret_env(settings)
    if needs_region(settings):
        env.append({"name": "AWS_REGION", "value": AWS_REGION_PLACEHOLDER})
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": COLLECTOR_NAME, "namespace": COLLECTOR_NAMESPACE},
        "spec": {"template": {"spec": {"containers": [{"name": COLLECTOR_CONTAINER, "env": env}]}}},
    }


def _exporters(settings: CollectorSettings) -> dict[str, Any]:
    """The cloud profile's exporter fragment with the user's settings written in."""
    if settings.cloud == "ack" and settings.ack_backend == "sls":
        from mmfleet.clouds.ack import SLS_EXPORTER

        fragment: dict[str, Any] = copy.deepcopy(dict(SLS_EXPORTER))
        sls = fragment["exporters"]["alibabacloud_logservice"]
        for key, value in (("endpoint", settings.endpoint), ("project", settings.sls_project)):
            if value:
                sls[key] = value
        if settings.sls_logstore:
            sls["logstore"] = settings.sls_logstore
        return fragment
    fragment = dict(get(settings.cloud).collector_exporter())
    exporters = fragment["exporters"]
    if settings.cloud == "eks":
        otlp_http = exporters["otlp_http"]
        if settings.region:
            fragment["extensions"]["sigv4auth"]["region"] = settings.region
            otlp_http["traces_endpoint"] = f"https://xray.{settings.region}.amazonaws.com/v1/traces"
        if settings.endpoint:
            otlp_http["traces_endpoint"] = settings.endpoint
    elif settings.cloud in ("ack", "generic"):
        otlp_grpc = exporters["otlp_grpc"]
        if settings.endpoint:
            otlp_grpc["endpoint"] = settings.endpoint
        if settings.insecure is not None:
            otlp_grpc["tls"] = {"insecure": settings.insecure}
    return fragment


def _processors(settings: CollectorSettings) -> JsonObj:
    processors: JsonObj = {
        # First in the pipeline: refuses data (the sender retries) before the pod runs out of memory.
        "memory_limiter": {
            "check_interval": "1s",
            "limit_percentage": settings.memory_limit_percentage,
            "spike_limit_percentage": settings.memory_spike_limit_percentage,
        },
        # Before batch: it matches a span to its pod by the sender's connection IP, which batching drops.
        # These metadata need only pods' and namespaces' informers (no ReplicaSet one: the deployment name is
        # cut from the ReplicaSet name), see the ClusterRole in manifests/base/collector.yaml.
        "k8s_attributes": {
            "auth_type": "serviceAccount",
            "extract": {
                "metadata": [
                    "k8s.namespace.name",
                    "k8s.pod.name",
                    "k8s.pod.uid",
                    "k8s.pod.start_time",
                    "k8s.deployment.name",
                    "k8s.node.name",
                ],
                "labels": [{"tag_name": "mmfleet.inference", "key": INFERENCE_LABEL, "from": "pod"}],
            },
            "pod_association": [
                {"sources": [{"from": "resource_attribute", "name": "k8s.pod.uid"}]},
                {"sources": [{"from": "resource_attribute", "name": "k8s.pod.ip"}]},
                {"sources": [{"from": "connection"}]},
            ],
        },
        # override false: what the pod said about itself (OTEL_RESOURCE_ATTRIBUTES) wins over detection.
        "resource_detection": _resource_detection(settings.cloud),
    }
    if settings.resource_attributes:
        processors["resource"] = {
            "attributes": [
                {"key": key, "value": value, "action": "upsert"}
                for key, value in sorted(settings.resource_attributes.items())
            ]
        }
    processors["batch"] = {"send_batch_size": 512, "timeout": "5s"}
    return processors


def _resource_detection(cloud: ProfileName) -> JsonObj:
    """The cloud's detectors, each told which attributes to set: the cluster-wide ones only."""
    detection: JsonObj = {"detectors": list(DETECTORS[cloud]), "timeout": "5s", "override": False}
    for detector in DETECTORS[cloud]:
        if detector in DETECTOR_ATTRIBUTES:
            detection[detector] = {
                "resource_attributes": {
                    name: {"enabled": name in DETECTED_ATTRIBUTES} for name in DETECTOR_ATTRIBUTES[detector]
                }
            }
    return detection


def collector_config(settings: CollectorSettings | None = None) -> JsonObj:
    """The whole collector configuration for one cloud: receivers, processors, exporters, one traces pipeline."""
    settings = settings or CollectorSettings()
    fragment = _exporters(settings)
    processors = _processors(settings)
    extensions: JsonObj = {
        # The Deployment's probes; on the pod's IP only (the collector's security guidance is to not bind 0.0.0.0).
        "health_check": {"endpoint": f"${{env:MY_POD_IP}}:{HEALTH_PORT}"},
        **fragment["extensions"],
    }
    return {
        "extensions": extensions,
        "receivers": {
            "otlp": {
                "protocols": {
                    "grpc": {"endpoint": f"${{env:MY_POD_IP}}:{OTLP_GRPC_PORT}"},
                    "http": {"endpoint": f"${{env:MY_POD_IP}}:{OTLP_HTTP_PORT}"},
                }
            }
        },
        "processors": processors,
        "exporters": fragment["exporters"],
        "service": {
            "extensions": list(extensions),
            "pipelines": {
                "traces": {
                    "receivers": ["otlp"],
                    "processors": list(processors),
                    "exporters": list(fragment["exporters"]),
                }
            },
        },
    }


def component_types(config: Mapping[str, Any]) -> set[tuple[str, str]]:
    """(section, type) of every component a config names, e.g. ("exporters", "otlp_http")."""
    found: set[tuple[str, str]] = set()
    for section in ("receivers", "processors", "exporters", "extensions", "connectors"):
        for name in config.get(section) or {}:
            found.add((section, str(name).split("/", 1)[0]))
    return found


def header(settings: CollectorSettings) -> str:
    """Comment lines for the top of a generated config: what made it, and what its Secret must hold."""
    lines = [
        f"# OpenTelemetry Collector {COLLECTOR_VERSION} configuration for cloud {settings.cloud}",
        "# generated by `mmfleet collector-config` (mmfleet.clouds.collector); do not edit.",
    ]
    keys = secret_keys(settings)
    if keys:
        lines.append(f"# Reads from the environment (Secret {COLLECTOR_SECRET}): {', '.join(keys)}.")
    if needs_region(settings):
        lines.append("# Reads AWS_REGION from the environment: the collector's Deployment must set it.")
    return "".join(f"{line}\n" for line in lines)


def env_patch_header(settings: CollectorSettings) -> str:
    """Comment lines for the top of a generated kustomize env patch."""
    lines = [
        f"# The collector's environment for cloud {settings.cloud}: the Secret's keys its configuration reads",
        "# (not optional: a missing Secret or key stops the pod, and TracingReady says CollectorNotReady).",
        f"# generated by `mmfleet collector-config --cloud {settings.cloud} --kustomize-env`; do not edit.",
    ]
    if needs_region(settings):
        lines.append("# AWS_REGION is a placeholder: set your region in an overlay of your own (docs/tracing.md, EKS).")
    return "".join(f"{line}\n" for line in lines)


def to_yaml(config: JsonObj, header: str = "") -> str:
    """The config as YAML in the order built (receivers before processors, as people read it)."""
    body = yaml.safe_dump(config, sort_keys=False, default_flow_style=False, width=120)
    return header + body
