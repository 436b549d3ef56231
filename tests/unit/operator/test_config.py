"""Operator settings from the environment and flags: values, defaults, and the errors a user sees."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmfleet import cli
from mmfleet.config import OperatorConfig, env_variables
from mmfleet.kube import CredentialsError, credentials

VARIABLES = (
    "MMFLEET_NAMESPACES",
    "MMFLEET_PROMETHEUS_URL",
    "MMFLEET_AUTOSCALE_INTERVAL",
    "MMFLEET_COLD_START",
    "MMFLEET_DEFAULT_CLOUD",
    "MMFLEET_LOG_FORMAT",
    "MMFLEET_WORKERS",
    "MMFLEET_HEALTH_ADDRESS",
    "MMFLEET_METRICS_ADDRESS",
    "MMFLEET_COLLECTOR_ENDPOINT",
    "MMFLEET_CLUSTER_DOMAIN",
    "MMFLEET_LEADER_ELECTION_LEASE",
    "MMFLEET_LEADER_ELECTION_NAMESPACE",
    "MMFLEET_POLICY",
    "MMFLEET_PICKER_CLUSTER_ROLE",
    "MMFLEET_PICKER_IMAGE",
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("text", "seconds"), [("15s", 15.0), ("1m30s", 90.0), ("3m", 180.0), ("90", 90.0), ("2.5", 2.5)]
)
def test_autoscale_interval_and_cold_start_take_durations_or_seconds(
    monkeypatch: pytest.MonkeyPatch, text: str, seconds: float
) -> None:
    monkeypatch.setenv("MMFLEET_AUTOSCALE_INTERVAL", text)
    monkeypatch.setenv("MMFLEET_COLD_START", text)
    config = OperatorConfig.load()
    assert (config.autoscale_interval, config.default_cold_start) == (seconds, seconds)


def test_defaults() -> None:
    assert OperatorConfig.load() == OperatorConfig(
        namespaces=(),
        prometheus_url="http://prometheus-operated.monitoring.svc:9090",
        autoscale_interval=15.0,
        default_cold_start=120.0,
        default_cloud="auto",
        log_format="plain",
        workers=16,
        health_address="0.0.0.0:8080",
        metrics_address="0.0.0.0:8081",
        collector_endpoint="http://mmfleet-otel-collector.mmfleet-system.svc:4317",
        cluster_domain="cluster.local",
    )


@pytest.mark.parametrize(
    ("name", "text", "field", "value"),
    [
        ("MMFLEET_NAMESPACES", "a, b,", "namespaces", ("a", "b")),
        ("MMFLEET_PROMETHEUS_URL", "", "prometheus_url", ""),
        ("MMFLEET_AUTOSCALE_INTERVAL", "1m", "autoscale_interval", 60.0),
        ("MMFLEET_COLD_START", "0", "default_cold_start", 0.0),
        ("MMFLEET_DEFAULT_CLOUD", "aks", "default_cloud", "aks"),
        ("MMFLEET_LOG_FORMAT", "json", "log_format", "json"),
        ("MMFLEET_WORKERS", "4", "workers", 4),
        ("MMFLEET_HEALTH_ADDRESS", "", "health_address", ""),
        (
            "MMFLEET_COLLECTOR_ENDPOINT",
            "http://otel.observability:4317",
            "collector_endpoint",
            "http://otel.observability:4317",
        ),
        ("MMFLEET_CLUSTER_DOMAIN", "Corp.Example.", "cluster_domain", "corp.example"),
    ],
)
def test_each_variable_sets_its_setting(
    monkeypatch: pytest.MonkeyPatch, name: str, text: str, field: str, value: object
) -> None:
    monkeypatch.setenv(name, text)
    assert getattr(OperatorConfig.load(), field) == value


def test_flags_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MMFLEET_PROMETHEUS_URL", "http://env:9090")
    monkeypatch.setenv("MMFLEET_NAMESPACES", "env")
    monkeypatch.setenv("MMFLEET_WORKERS", "3")
    config = OperatorConfig.load(prometheus_url="http://flag:9090", namespaces=("flag",))
    assert (config.prometheus_url, config.namespaces, config.workers) == ("http://flag:9090", ("flag",), 3)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (
            "MMFLEET_AUTOSCALE_INTERVAL",
            "fast",
            "MMFLEET_AUTOSCALE_INTERVAL: 'fast': not a duration such as 15s, 2m or 90",
        ),
        (
            "MMFLEET_AUTOSCALE_INTERVAL",
            "500ms",
            "MMFLEET_AUTOSCALE_INTERVAL: '500ms': 0.5s is below the least accepted, 1s",
        ),
        ("MMFLEET_COLD_START", "inf", "MMFLEET_COLD_START: 'inf': not a duration such as 15s, 2m or 90"),
        ("MMFLEET_COLD_START", "-1", "MMFLEET_COLD_START: '-1': -1s is below the least accepted, 0s"),
        ("MMFLEET_WORKERS", "0", "MMFLEET_WORKERS: '0': 0 is below the least accepted, 1"),
        ("MMFLEET_WORKERS", "many", "MMFLEET_WORKERS: 'many': input should be a valid integer"),
        (
            "MMFLEET_DEFAULT_CLOUD",
            "gcp",
            "MMFLEET_DEFAULT_CLOUD: 'gcp': input should be 'auto', 'eks', 'aks', 'ack' or",
        ),
        ("MMFLEET_LOG_FORMAT", "text", "MMFLEET_LOG_FORMAT: 'text': input should be 'plain' or 'json'"),
        ("MMFLEET_COLLECTOR_ENDPOINT", "", "MMFLEET_COLLECTOR_ENDPOINT: '': not an OTLP/gRPC endpoint"),
        ("MMFLEET_CLUSTER_DOMAIN", "my_domain", "MMFLEET_CLUSTER_DOMAIN: 'my_domain': not a DNS domain"),
        ("MMFLEET_LEADER_ELECTION_LEASE", "Op_Lease", "MMFLEET_LEADER_ELECTION_LEASE: 'Op_Lease': not an object name"),
        ("MMFLEET_LEADER_ELECTION_NAMESPACE", "-ops", "MMFLEET_LEADER_ELECTION_NAMESPACE: '-ops': not an object name"),
        ("MMFLEET_POLICY", '{"secrets": ["hf-token"]}', "MMFLEET_POLICY.secrets[0]: 'hf-token': 'hf-token' is not"),
        ("MMFLEET_POLICY", '{"loadBalancer": {"allowed": "maybe"}}', "MMFLEET_POLICY.loadBalancer.allowed: 'maybe'"),
        ("MMFLEET_POLICY", "secrets: [a/b]", 'error parsing value for field "policy"'),
    ],
)
def test_a_bad_value_names_the_variable_the_value_and_what_is_accepted(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as raised:
        OperatorConfig.load()
    assert str(raised.value).startswith(message)


def test_run_exits_2_on_a_bad_setting_before_starting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MMFLEET_WORKERS", "0")
    assert cli.main(["run"]) == cli.EXIT_INVALID
    assert capsys.readouterr().err == "mmfleet run: MMFLEET_WORKERS: '0': 0 is below the least accepted, 1\n"


def test_the_variables_are_the_documented_ones() -> None:
    assert sorted(env_variables().values()) == sorted(VARIABLES)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "Invalid kube-config file. No configuration found."),
        (b"", "file is empty"),
        (b"clusters: [\n", "while parsing a flow node expected the node content"),
        (b"clusters: 5\ncontexts: 5\ncurrent-context: x\n", "TypeError"),
        (b"\xff\xfe", "can't decode byte 0xff"),
    ],
)
def test_run_exits_2_naming_a_kubeconfig_it_cannot_use_instead_of_retrying_forever(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    content: bytes | None,
    message: str,
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    if content is not None:
        kubeconfig.write_bytes(content)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    assert cli.main(["run"]) == cli.EXIT_INVALID
    err = capsys.readouterr().err
    assert err.startswith(f"mmfleet run: not in a pod (no service account), and the kubeconfig {kubeconfig} cannot be")
    assert message in err
    assert err.rstrip().endswith("expected a kubeconfig file (KUBECONFIG or ~/.kube/config) whose current context "
                                 "names a cluster and a user")  # fmt: skip
    assert err.count("\n") == 1


KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def test_a_usable_kubeconfig_passes_the_check_run_makes_before_starting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'missing'}:{kubeconfig}")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert credentials().host == "https://127.0.0.1:6443"


def test_an_empty_kubeconfig_variable_names_no_file_as_the_client_reads_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """kopf's login reads an empty KUBECONFIG as naming no file, even with a usable ~/.kube/config: so does the check,
    or it would pass and kopf retry its login forever."""
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text(KUBECONFIG)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("KUBECONFIG", "")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(CredentialsError, match="the kubeconfig '' cannot be used: Invalid kube-config file"):
        credentials()
