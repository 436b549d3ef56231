"""The collector configuration per cloud (mmfleet.clouds.collector): shape, overrides, refusals, no secrets.

That the collector accepts each configuration is checked by the collector itself in
tests/integration/test_collector.py; here, what the generator promises.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from mmfleet import cli
from mmfleet.api import PROFILE_NAMES
from mmfleet.clouds import COLLECTOR_ENDPOINT
from mmfleet.clouds.collector import (
    AWS_REGION_PLACEHOLDER,
    COLLECTOR_NAME,
    COLLECTOR_NAMESPACE,
    DETECTOR_ATTRIBUTES,
    CollectorSettings,
    collector_config,
    component_types,
    kustomize_env_patch,
    needs_region,
    secret_env,
    secret_keys,
    to_yaml,
)
from mmfleet_lab.cluster.build import COLLECTOR_COMPONENTS
from tests.helpers.collector import CASES


def config(case: str) -> dict[str, Any]:
    return collector_config(CollectorSettings(**CASES[case]))


def test_the_service_the_pods_are_given_is_the_collector_installed() -> None:
    assert f"http://{COLLECTOR_NAME}.{COLLECTOR_NAMESPACE}.svc:4317" == COLLECTOR_ENDPOINT


@pytest.mark.parametrize("case", CASES)
def test_one_traces_pipeline_with_the_processors_in_order(case: str) -> None:
    generated = config(case)
    pipeline = generated["service"]["pipelines"]["traces"]
    assert list(generated["service"]["pipelines"]) == ["traces"]
    assert pipeline["receivers"] == ["otlp"]
    extra = ["resource"] if CASES[case].get("resource_attributes") else []
    assert pipeline["processors"] == ["memory_limiter", "k8s_attributes", "resource_detection", *extra, "batch"]
    assert pipeline["exporters"] == list(generated["exporters"])
    assert generated["service"]["extensions"] == list(generated["extensions"])
    protocols = generated["receivers"]["otlp"]["protocols"]
    assert protocols == {"grpc": {"endpoint": "${env:MY_POD_IP}:4317"}, "http": {"endpoint": "${env:MY_POD_IP}:4318"}}


@pytest.mark.parametrize(
    ("cloud", "detectors"),
    [
        ("eks", ["env", "eks", "ec2"]),
        ("aks", ["env", "aks", "azure"]),
        ("ack", ["env", "alibaba_ecs"]),
        ("generic", ["env"]),
    ],
)
def test_resource_detection_per_cloud(cloud: str, detectors: list[str]) -> None:
    assert config(cloud)["processors"]["resource_detection"]["detectors"] == detectors


# What each detector may set, from its metadata.yaml at resourcedetectionprocessor v0.158.0 (read there, and
# compared with the module itself by tests/integration/test_collector.py when the Go module cache has it).
HOST_ATTRIBUTES = {"host.id", "host.name", "host.type", "host.image.id", "os.type", "os.description"}


@pytest.mark.parametrize("cloud", PROFILE_NAMES)
def test_detectors_set_only_cluster_wide_attributes_never_the_collectors_host(cloud: str) -> None:
    """A gateway collector's detectors see the collector's node: its host, VM and zone must not reach the spans."""
    detection = config(cloud)["processors"]["resource_detection"]
    assert "system" not in detection["detectors"]
    for detector in detection["detectors"]:
        if detector == "env":
            assert detector not in detection
            continue
        attributes = detection[detector]["resource_attributes"]
        assert set(attributes) == set(DETECTOR_ATTRIBUTES[detector]), detector  # every one written, on or off
        enabled = {name for name, value in attributes.items() if value == {"enabled": True}}
        assert enabled <= {"cloud.provider", "cloud.platform", "cloud.region", "cloud.account.id", "k8s.cluster.name"}
        assert not enabled & HOST_ATTRIBUTES
        assert not any(n.startswith(("host.", "os.", "azure.vm.")) or n == "cloud.availability_zone" for n in enabled)
        assert {"cloud.provider", "cloud.platform"} <= enabled, detector


def test_detector_attributes_are_those_of_the_pinned_processor() -> None:
    assert DETECTOR_ATTRIBUTES["aks"] == ("cloud.platform", "cloud.provider", "k8s.cluster.name")
    assert "k8s.cluster.name" in DETECTOR_ATTRIBUTES["eks"]
    assert {"azure.vm.name", "azure.vm.size", "host.name"} <= set(DETECTOR_ATTRIBUTES["azure"])
    for detector in ("ec2", "alibaba_ecs"):
        assert {"host.id", "host.name", "host.type", "host.image.id"} <= set(DETECTOR_ATTRIBUTES[detector])
    config_eks = config("eks")["processors"]["resource_detection"]
    assert config_eks["eks"]["resource_attributes"]["k8s.cluster.name"] == {"enabled": True}
    assert config_eks["ec2"]["resource_attributes"]["host.name"] == {"enabled": False}


def test_k8s_attributes_gives_the_senders_node() -> None:
    """The pod's node, which the detectors no longer guess from the collector's, comes from its pod."""
    assert "k8s.node.name" in config("generic")["processors"]["k8s_attributes"]["extract"]["metadata"]


def test_k8s_attributes_adds_pod_metadata_and_the_inference_label() -> None:
    k8s = config("generic")["processors"]["k8s_attributes"]
    assert {"k8s.namespace.name", "k8s.pod.name", "k8s.deployment.name"} <= set(k8s["extract"]["metadata"])
    assert k8s["extract"]["labels"] == [{"tag_name": "mmfleet.inference", "key": "mmfleet.io/inference", "from": "pod"}]
    assert {"sources": [{"from": "connection"}]} in k8s["pod_association"]


def test_eks_exports_to_xray_signed_with_sigv4() -> None:
    generated = config("eks")
    assert generated["exporters"] == {
        "otlp_http": {
            "traces_endpoint": "https://xray.${env:AWS_REGION}.amazonaws.com/v1/traces",
            "auth": {"authenticator": "sigv4auth"},
        }
    }
    assert generated["extensions"]["sigv4auth"] == {"region": "${env:AWS_REGION}", "service": "xray"}
    assert "sigv4auth" in generated["service"]["extensions"]


def test_eks_region_goes_into_the_endpoint_and_the_signer() -> None:
    generated = config("eks-overrides")
    assert generated["exporters"]["otlp_http"]["traces_endpoint"] == "https://xray.eu-west-1.amazonaws.com/v1/traces"
    assert generated["extensions"]["sigv4auth"]["region"] == "eu-west-1"
    assert generated["processors"]["resource"] == {
        "attributes": [{"key": "deployment.environment", "value": "prod", "action": "upsert"}]
    }


def test_aks_exports_to_azure_monitor_with_the_connection_string_from_the_environment() -> None:
    assert config("aks")["exporters"] == {
        "azure_monitor": {"connection_string": "${env:APPLICATIONINSIGHTS_CONNECTION_STRING}"}
    }


def test_ack_arms_and_sls() -> None:
    assert config("ack")["exporters"]["otlp_grpc"] == {
        "endpoint": "${env:ARMS_OTLP_ENDPOINT}",
        "tls": {"insecure": True},
        "headers": {"Authentication": "${env:ARMS_TOKEN}"},
    }
    assert config("ack-overrides")["exporters"]["otlp_grpc"]["tls"] == {"insecure": False}
    sls = config("ack-sls-overrides")["exporters"]["alibabacloud_logservice"]
    assert (sls["endpoint"], sls["project"], sls["logstore"]) == ("cn-hangzhou.log.aliyuncs.com", "ml-traces", "spans")
    assert sls["access_key_id"] == "${env:SLS_ACCESS_KEY_ID}"
    assert sls["access_key_secret"] == "${env:SLS_ACCESS_KEY_SECRET}"


def test_generic_exports_plain_otlp() -> None:
    assert config("generic")["exporters"] == {"otlp_grpc": {"endpoint": "${env:OTLP_ENDPOINT}"}}
    assert config("generic-overrides")["exporters"] == {
        "otlp_grpc": {"endpoint": "otel.example.com:4317", "tls": {"insecure": True}}
    }


@pytest.mark.parametrize(
    ("case", "keys"),
    [
        ("eks", ()),
        ("aks", ("APPLICATIONINSIGHTS_CONNECTION_STRING",)),
        ("ack", ("ARMS_OTLP_ENDPOINT", "ARMS_TOKEN")),
        ("ack-overrides", ("ARMS_TOKEN",)),
        ("ack-sls-overrides", ("SLS_ACCESS_KEY_ID", "SLS_ACCESS_KEY_SECRET")),
        ("generic", ("OTLP_ENDPOINT",)),
        ("generic-overrides", ()),
    ],
)
def test_secret_keys_are_exactly_the_variables_the_config_reads(case: str, keys: tuple[str, ...]) -> None:
    assert secret_keys(CollectorSettings(**CASES[case])) == keys
    variables = set(re.findall(r"\$\{env:(\w+)\}", to_yaml(config(case))))
    assert variables - {"MY_POD_IP", "AWS_REGION"} == set(keys)


@pytest.mark.parametrize("case", CASES)
def test_the_secrets_keys_become_required_env_entries(case: str) -> None:
    """One secretKeyRef per key, never optional: a missing Secret or key must stop the collector's pod."""
    settings = CollectorSettings(**CASES[case])
    env = secret_env(settings)
    assert [e["name"] for e in env] == list(secret_keys(settings))
    for entry in env:
        assert entry["valueFrom"] == {"secretKeyRef": {"name": "mmfleet-otel-collector", "key": entry["name"]}}


@pytest.mark.parametrize(
    ("case", "region"), [("eks", True), ("eks-overrides", False), ("eks-endpoint", True), ("aks", False)]
)
def test_eks_without_a_region_written_in_needs_aws_region_set(case: str, region: bool) -> None:
    settings = CollectorSettings(**CASES[case])
    assert needs_region(settings) is region
    assert ("${env:AWS_REGION}" in to_yaml(collector_config(settings))) is region


def test_the_kustomize_env_patch_replaces_the_bases_keys_with_the_clouds() -> None:
    def env(cloud: str) -> list[Any]:
        patch = kustomize_env_patch(CollectorSettings(cloud=cloud))  # type: ignore[arg-type]
        assert (patch["kind"], patch["metadata"]) == (
            "Deployment",
            {"name": COLLECTOR_NAME, "namespace": "mmfleet-system"},
        )
        return patch["spec"]["template"]["spec"]["containers"][0]["env"]  # type: ignore[index,no-any-return]

    assert env("generic") == secret_env(CollectorSettings())
    assert env("aks") == [{"name": "OTLP_ENDPOINT", "$patch": "delete"}, *secret_env(CollectorSettings(cloud="aks"))]
    eks = env("eks")
    assert eks[0] == {"name": "OTLP_ENDPOINT", "$patch": "delete"}
    assert eks[1:] == [{"name": "AWS_REGION", "value": AWS_REGION_PLACEHOLDER}]
    assert " " in AWS_REGION_PLACEHOLDER  # so https://xray.<it>.amazonaws.com is no URL and the collector stops


def test_cli_prints_the_kustomize_env_patch(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["collector-config", "--cloud", "ack", "--kustomize-env"]) == 0
    printed = capsys.readouterr().out
    assert "--kustomize-env" in printed.splitlines()[2]
    assert yaml.safe_load(printed) == kustomize_env_patch(CollectorSettings(cloud="ack"))


# Keys whose value is a credential in some exporter or extension of the pinned collector.
SECRET_FIELDS = {"connection_string", "instrumentation_key", "access_key_id", "access_key_secret", "security_token"}


def _secret_values(node: Any, key: str = "") -> list[tuple[str, Any]]:
    if isinstance(node, dict):
        return [pair for k, v in node.items() for pair in _secret_values(v, str(k))]
    if isinstance(node, list):
        return [pair for v in node for pair in _secret_values(v, key)]
    return [(key, node)] if key in SECRET_FIELDS or key.lower() in ("authentication", "authorization") else []


@pytest.mark.parametrize("case", CASES)
def test_credentials_are_only_environment_references(case: str) -> None:
    for key, value in _secret_values(config(case)):
        assert re.fullmatch(r"\$\{env:\w+\}", str(value)), f"{key}: {value!r} is not an ${{env:...}} reference"


@pytest.mark.parametrize("case", CASES)
def test_every_component_is_one_the_built_collector_has(case: str) -> None:
    assert component_types(config(case)) <= set(COLLECTOR_COMPONENTS)


def test_the_built_collector_has_nothing_the_configs_do_not_use_but_the_file_exporter() -> None:
    used = set().union(*(component_types(config(case)) for case in CASES))
    assert set(COLLECTOR_COMPONENTS) - used == {("exporters", "file")}


@pytest.mark.parametrize(
    ("values", "field", "says"),
    [
        ({"cloud": "eks", "region": "Oregon"}, "region", "not a cloud region name such as us-east-1"),
        ({"cloud": "aks", "region": "us-east-1"}, "region applies to cloud eks, not aks", ""),
        ({"cloud": "aks", "endpoint": "x:1"}, "endpoint applies to cloud eks or ack or generic, not aks", ""),
        ({"cloud": "generic", "endpoint": "${env:X}"}, "endpoint", "not a host:port or an http(s) URL"),
        ({"cloud": "ack", "sls_project": "ml-traces"}, "apply to ack_backend sls, not arms", ""),
        ({"cloud": "ack", "ack_backend": "sls", "sls_logstore": "A!"}, "sls_logstore", "not an SLS name"),
        ({"cloud": "generic", "resource_attributes": {"a": "${env:TOKEN}"}}, "resource_attributes", "literal"),
        ({"cloud": "generic", "resource_attributes": {"bad key": "v"}}, "resource_attributes", "not an attribute"),
        ({"cloud": "generic", "memory_limit_percentage": 99}, "memory_limit_percentage", "less than or equal to 95"),
        ({"cloud": "gke"}, "cloud", "'eks', 'aks', 'ack' or 'generic'"),
        ({"cloud": "eks", "access_key": "AKIA..."}, "access_key", "Extra inputs are not permitted"),
    ],
)
def test_refusals_name_the_field_the_value_and_what_is_accepted(values: dict[str, Any], field: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(field)) as raised:
        CollectorSettings.parse(**values)
    assert says in str(raised.value)


def test_cli_prints_the_config_as_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["collector-config", "--cloud", "eks", "--region", "ap-south-1", "--resource-attribute", "a=b"]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("# OpenTelemetry Collector")
    assert yaml.safe_load(printed) == collector_config(
        CollectorSettings(cloud="eks", region="ap-south-1", resource_attributes={"a": "b"})
    )


def test_cli_refuses_with_one_line_per_problem(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["collector-config", "--cloud", "aks", "--region", "x", "--resource-attribute", "novalue"])
    assert code == cli.EXIT_INVALID
    assert capsys.readouterr().err.strip() == "--resource-attribute: 'novalue': not KEY=VALUE"
    assert cli.main(["collector-config", "--cloud", "eks", "--region", "Oregon"]) == cli.EXIT_INVALID
    assert capsys.readouterr().err.startswith("region: 'Oregon': 'Oregon' is not a cloud region name")


def test_the_builder_manifest_pins_one_release_but_three_documented_modules(tmp_path: Any) -> None:
    from mmfleet.clouds.collector import COLLECTOR_VERSION
    from mmfleet_lab.cluster.build import collector_manifest

    older = {"k8sattributesprocessor": "v0.160.0", "sigv4authextension": "v0.159.0"}
    older["resourcedetectionprocessor"] = "v0.158.0"
    for gomod in COLLECTOR_COMPONENTS.values():
        module, version = gomod.split(" ")
        assert version == older.get(module.rsplit("/", 1)[1], f"v{COLLECTOR_VERSION}"), gomod
    manifest = collector_manifest(tmp_path)
    assert manifest["dist"]["output_path"] == str(tmp_path)  # type: ignore[index]
    listed = [c["gomod"] for s in ("receivers", "processors", "exporters", "extensions") for c in manifest[s]]  # type: ignore[attr-defined]
    assert sorted(listed) == sorted(COLLECTOR_COMPONENTS.values())
