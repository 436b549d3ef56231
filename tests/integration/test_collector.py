"""The real OpenTelemetry Collector (built by ``ensure_collector``) on every generated configuration, and on 127.0.0.1.

- ``validate`` accepts each cloud's configuration, with and without the user's overrides (the cases of
  tests/unit/operator/test_collector_config.py), given what the collector's Secret would hold;
- it refuses a configuration with a key the component does not have, and one whose Secret is missing,
  so a passing validate means something;
- a span sent with the OpenTelemetry SDK over OTLP/gRPC and OTLP/HTTP comes out of the file exporter.

Needs only the collector binary, not the local control plane.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from mmfleet.clouds.collector import (
    AWS_REGION_PLACEHOLDER,
    DETECTOR_ATTRIBUTES,
    CollectorSettings,
    collector_config,
    kustomize_env_patch,
    secret_keys,
)
from mmfleet_lab.cluster.build import COLLECTOR_COMPONENTS
from mmfleet_lab.cluster.collector import PodEnvironmentError, Validation, run_collector, validate
from tests.helpers.collector import CASES
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.integration

# Dummy values for what each cloud's Secret holds: the collector checks their shape, and nothing is sent.
SECRET_VALUES = {
    "APPLICATIONINSIGHTS_CONNECTION_STRING": (
        "InstrumentationKey=00000000-0000-0000-0000-000000000000;IngestionEndpoint=https://eastus-8.in.applicationinsights.azure.com/"
    ),
    "ARMS_OTLP_ENDPOINT": "tracing-analysis-dc-hz-internal.aliyuncs.com:8090",
    "ARMS_TOKEN": "not-a-token",
    "SLS_ENDPOINT": "cn-hangzhou.log.aliyuncs.com",
    "SLS_PROJECT": "ml-traces",
    "SLS_LOGSTORE": "spans",
    "SLS_ACCESS_KEY_ID": "not-a-key",
    "SLS_ACCESS_KEY_SECRET": "not-a-secret",
    "OTLP_ENDPOINT": "otel.example.com:4317",
}


def _validate(config: dict[str, Any], tmp_path: Path, env: dict[str, str]) -> Validation:
    try:
        return validate(config, tmp_path, env)
    except PodEnvironmentError as error:
        pytest.skip(str(error))


def _secret_env(settings: CollectorSettings) -> dict[str, str]:
    env = {key: SECRET_VALUES[key] for key in secret_keys(settings)}
    if settings.cloud == "eks":
        env["AWS_REGION"] = "us-east-1"  # what the IRSA / Pod Identity webhook sets
    return env


@pytest.mark.parametrize("case", CASES)
def test_the_collector_accepts_each_generated_configuration(case: str, tmp_path: Path) -> None:
    settings = CollectorSettings(**CASES[case])
    result = _validate(collector_config(settings), tmp_path, _secret_env(settings))
    assert result.ok, f"{case}: the collector refused the generated configuration:\n{result.output}"


@pytest.mark.parametrize(
    ("cloud", "section", "component", "key"),
    [
        ("eks", "extensions", "sigv4auth", "service"),
        ("generic", "processors", "k8s_attributes", "pod_association"),
        ("generic", "processors", "batch", "send_batch_size"),
    ],
)
def test_the_collector_refuses_a_key_its_component_does_not_have(
    cloud: str, section: str, component: str, key: str, tmp_path: Path
) -> None:
    """A misspelt key fails. Not in every component: azure_monitor, otlp_http and resource_detection take any key
    (for the detectors' attributes, see test_each_detectors_attributes_are_those_of_the_built_module)."""
    settings = CollectorSettings(cloud=cloud)  # type: ignore[arg-type]
    config = collector_config(settings)
    config[section][component][key + "s"] = config[section][component].pop(key)
    result = _validate(config, tmp_path, _secret_env(settings))
    assert not result.ok
    assert f"has invalid keys: {key}s" in result.output


def test_the_collector_refuses_an_unknown_detector(tmp_path: Path) -> None:
    config = collector_config(CollectorSettings(cloud="ack"))
    config["processors"]["resource_detection"]["detectors"] = ["ack"]  # there is no ACK detector
    result = _validate(config, tmp_path, _secret_env(CollectorSettings(cloud="ack")))
    assert not result.ok
    assert "ack" in result.output


def test_a_missing_secret_fails_validation(tmp_path: Path) -> None:
    """With no OTLP_ENDPOINT (the Secret absent), the generic exporter has no endpoint and the collector says so."""
    result = _validate(collector_config(CollectorSettings(cloud="generic")), tmp_path, {})
    assert not result.ok
    assert 'exporters::otlp_grpc: requires a non-empty "endpoint"' in result.output


def test_the_eks_overlays_placeholder_region_stops_the_collector(tmp_path: Path) -> None:
    """Unset, AWS_REGION makes https://xray..amazonaws.com, which validate accepts: a collector that starts and
    exports nowhere. The kustomize EKS overlay's placeholder instead fails at start, as an unset Secret key does."""
    settings = CollectorSettings(cloud="eks")
    container = kustomize_env_patch(settings)["spec"]["template"]["spec"]["containers"][0]  # type: ignore[index]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert env == {"AWS_REGION": AWS_REGION_PLACEHOLDER}
    result = _validate(collector_config(settings), tmp_path, env)
    assert not result.ok
    assert "traces_endpoint must be a valid URL" in result.output


# Where each detector of DETECTOR_ATTRIBUTES lives in the resourcedetectionprocessor module.
_DETECTOR_DIRS = {
    "eks": "aws/eks",
    "ec2": "aws/ec2",
    "aks": "azure/aks",
    "azure": "azure",
    "alibaba_ecs": "alibaba/ecs",
}


def _resourcedetection_module() -> Path:
    gomod = next(m for (s, t), m in COLLECTOR_COMPONENTS.items() if t == "resource_detection")
    module, version = gomod.split(" ")
    go = shutil.which("go")
    cache = subprocess.run([go, "env", "GOMODCACHE"], capture_output=True, text=True, check=False).stdout if go else ""
    path = Path(cache.strip() or Path.home() / "go/pkg/mod") / f"{module}@{version}"
    if not path.is_dir():
        pytest.skip(f"{module}@{version} is not in the Go module cache (ensure_collector fills it)")
    return path


@pytest.mark.parametrize("detector", sorted(_DETECTOR_DIRS))
def test_each_detectors_attributes_are_those_of_the_built_module(detector: str) -> None:
    """The collector takes any key under a detector, so a misspelt attribute would silently stay on: compare every
    name mmfleet turns on or off with the detector's own metadata.yaml at the version built."""
    metadata = _resourcedetection_module() / "internal" / _DETECTOR_DIRS[detector] / "metadata.yaml"
    names = set(yaml.safe_load(metadata.read_text())["resource_attributes"])
    assert set(DETECTOR_ATTRIBUTES[detector]) == names


def _send_span(protocol: str, endpoint: str, name: str) -> None:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        exporter: Any = GrpcExporter(endpoint=endpoint, insecure=True)
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        exporter = HttpExporter(endpoint=f"{endpoint}/v1/traces")
    provider = TracerProvider(resource=Resource.create({"service.name": "mmfleet-test", "mmfleet.inference": "qwen"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("tests").start_as_current_span(name) as span:
        span.set_attribute("mmfleet.replicas.after", 3)
    provider.shutdown()


def test_a_span_sent_over_otlp_comes_out_of_the_file_exporter(tmp_path: Path) -> None:
    with run_collector(tmp_path) as collector:
        _send_span("grpc", collector.endpoint, "over-grpc")
        _send_span("http", collector.http_endpoint, "over-http")
        wait_for(
            lambda: len(collector.spans()) >= 2,
            20,
            lambda: f"two spans exported (collector log:\n{collector.log.read_text()[-2000:]})",
            interval=0.2,
        )
    spans = {span["name"]: span for span in collector.spans()}
    assert set(spans) == {"over-grpc", "over-http"}, f"collector log:\n{collector.log.read_text()[-2000:]}"
    for span in spans.values():
        assert span["resource"]["service.name"] == "mmfleet-test"
        assert span["resource"]["mmfleet.inference"] == "qwen"
        assert {"key": "mmfleet.replicas.after", "value": {"intValue": "3"}} in span["attributes"]
