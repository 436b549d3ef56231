"""The local cluster's pure parts, checked without starting anything (milliseconds; no marker needed)."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID

from mmfleet import clouds
from mmfleet.api import GpuSpec
from mmfleet_lab.cluster.build import COMPONENTS
from mmfleet_lab.cluster.nodes import NodePool, node_manifests, parse_pool
from mmfleet_lab.cluster.pki import write_pki
from mmfleet_lab.cluster.stages import READY_DELAY_ANNOTATION, STAGE_FILES, kwok_config, ready_delay_ms, stage


@pytest.mark.parametrize(("text", "ms"), [("5s", 5000), ("500ms", 500), ("1m30s", 90_000), ("1.5s", 1500), ("0s", 0)])
def test_ready_delays_are_durations(text: str, ms: int) -> None:
    assert ready_delay_ms(text) == ms


@pytest.mark.parametrize("text", ["5", "", "5 s", "s", "1d"])
def test_bad_ready_delays_are_refused_naming_the_value(text: str) -> None:
    with pytest.raises(ValueError, match=f"pod-ready delay: {text!r} is not a duration such as 500ms, 2s"):
        ready_delay_ms(text)


@pytest.mark.parametrize("file", STAGE_FILES)
def test_stage_templates_are_kwok_stages_with_their_source(file: str) -> None:
    text = stage(file)
    assert text.startswith("# Copied verbatim from kubernetes-sigs/kwok kustomize/stage/")
    assert "at tag v0.8.0" in text.splitlines()[0]
    assert yaml.safe_load(text)["metadata"]["name"] == file.removesuffix(".yaml")


def test_kwok_config_has_the_stages_the_ready_delay_and_the_server_log(tmp_path: Path) -> None:
    *stages, logs = yaml.safe_load_all(kwok_config("7s", tmp_path / "server.log"))
    assert logs["kind"] == "ClusterLogs"
    assert logs["spec"]["logs"] == [{"containers": ["server"], "logsFile": str(tmp_path / "server.log")}]
    assert [s["metadata"]["name"] for s in stages] == [
        "node-initialize",
        "node-heartbeat-with-lease",
        "pod-ready",
        "pod-complete",
        "pod-delete",
    ]
    assert all(s["apiVersion"] == "kwok.x-k8s.io/v1alpha1" and s["kind"] == "Stage" for s in stages)
    delay = stages[2]["spec"]["delay"]
    assert delay["durationMilliseconds"] == 7000
    assert READY_DELAY_ANNOTATION in delay["durationFrom"]["jq"]["expression"]


def _matches(term: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(e["operator"] == "In" and labels.get(e["key"]) in e["values"] for e in term["matchExpressions"])


@pytest.mark.parametrize(
    "pool", [NodePool(cloud="eks"), NodePool(cloud="aks", gpu_type="A100"), NodePool(cloud="ack", gpu_type="H20")]
)
def test_node_labels_satisfy_the_cloud_profiles_gpu_affinity(pool: NodePool) -> None:
    affinity = clouds.get(pool.cloud).gpu_node_affinity(GpuSpec(type=pool.gpu_type))
    assert affinity is not None
    terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]  # type: ignore[index]
    for node in node_manifests([pool]):
        assert any(_matches(term, node["metadata"]["labels"]) for term in terms)
        assert clouds.detect([node["spec"]["providerID"]]) == pool.cloud
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"


def test_provider_ids_and_host_names_are_unique_across_pools_and_every_kubelet_is_kwoks_on_loopback() -> None:
    nodes = node_manifests([NodePool(count=3), NodePool(count=2, name="more")])
    assert len({n["spec"]["providerID"] for n in nodes}) == 5
    addresses = [{a["type"]: a["address"] for a in n["status"]["addresses"]} for n in nodes]
    assert len({a["Hostname"] for a in addresses}) == 5
    assert {a["InternalIP"] for a in addresses} == {"127.0.0.1"}, "the API server reaches kwok there for logs"


def test_pool_syntax() -> None:
    assert parse_pool("aks:A100:3") == NodePool(cloud="aks", gpu_type="A100", count=3)
    with pytest.raises(ValueError, match="CLOUD:GPU:COUNT"):
        parse_pool("aks:A100")
    with pytest.raises(ValueError, match="cloud 'gcp' is not one of eks, aks, ack, generic"):
        parse_pool("gcp:A100:1")
    with pytest.raises(ValueError, match="GPU type 'V100' is not one of T4, "):
        parse_pool("aks:V100:1")


def test_certificates(tmp_path: Path) -> None:
    pki = write_pki(tmp_path)
    serving = x509.load_pem_x509_certificate(pki.serving.cert.read_bytes())
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"localhost", "kubernetes", "kubernetes.default.svc"} <= set(sans.get_values_for_type(x509.DNSName))
    assert ipaddress.ip_address("127.0.0.1") in sans.get_values_for_type(x509.IPAddress)
    admin = x509.load_pem_x509_certificate(pki.admin.cert.read_bytes())
    assert [a.value for a in admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == ["system:masters"]
    ca = x509.load_pem_x509_certificate(pki.ca.cert.read_bytes())
    for pair in (pki.serving, *pki.clients.values()):
        x509.load_pem_x509_certificate(pair.cert.read_bytes()).verify_directly_issued_by(ca)
    assert pki.sa_key.stat().st_mode & 0o077 == 0


def test_kubernetes_is_stamped_like_the_hand_run_build() -> None:
    k8s = next(c for c in COMPONENTS if c.key == "k8s")
    # The exact -ldflags of ~/.cache/mmfleet/src/k8s/build.sh: same flags, same order, same binary bytes.
    assert k8s.ldflags == (
        "-s -w -X k8s.io/component-base/version.gitVersion=v1.34.4 -X k8s.io/component-base/version.gitMajor=1 "
        "-X k8s.io/component-base/version.gitMinor=34 -X k8s.io/component-base/version.gitTreeState=clean "
        "-X k8s.io/client-go/pkg/version.gitVersion=v1.34.4 -X k8s.io/client-go/pkg/version.gitMajor=1 "
        "-X k8s.io/client-go/pkg/version.gitMinor=34"
    )
