"""spec.disaggregation.encode as rendered: an encode Deployment of encoder-only vLLM replicas, the serving replicas as
their consumers with the sidecar in front, and what reaches each (Services, NetworkPolicies, the InferencePool); and
as the status reports it (EncodeReady, status.encode)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mmfleet import render
from mmfleet.api import MultimodalInference
from mmfleet.backends import vllm
from mmfleet.render import SpecError
from mmfleet.status import EncodeSeen, Observed, PodProblem, compute_status
from mmfleet.validation import parse
from tests.helpers.operator_state import RecordingKube, fleet_body, operator, reconcile_once
from tests.helpers.repo import spec_doc
from tests.helpers.status import NOW, conditions, deployment
from tests.helpers.status import inference as status_inference

ENCODE = {"replicas": 2, "gpu": {"count": 1, "type": "L4"}, "cacheGiB": 3}


def children(**spec: Any) -> dict[tuple[str, str], dict[str, Any]]:
    inference = MultimodalInference.model_validate(spec_doc(**spec))
    return {(c["kind"], c["metadata"]["name"]): c for c in render.render(inference, "eks", monitoring_crds=True)}


def containers(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_the_encode_tier_runs_encoder_only_replicas_on_its_own_gpus() -> None:
    got = children(gpu={"count": 2, "type": "H100"}, disaggregation={"encode": ENCODE})
    encode = got[("Deployment", "qwen-encode")]
    assert encode["spec"]["replicas"] == 2
    assert encode["spec"]["selector"]["matchLabels"] == {
        "mmfleet.io/inference": "qwen",
        "app.kubernetes.io/component": "encoder",
    }
    (server,) = containers(encode).values()
    command = server["command"]
    assert flag(command, "--tensor-parallel-size") == "1"  # its own GPU count, not the serving tier's 2
    assert flag(command, "--ec-transfer-config") == (
        '{"ec_connector":"ECCPUConnector","ec_role":"ec_producer",'
        '"ec_connector_extra_config":{"ec_cpu_bytes":3221225472,"ec_enable_nixl":true}}'
    )
    env = {e["name"]: e for e in server["env"]}
    assert env["VLLM_USE_V2_MODEL_RUNNER"]["value"] == "1"
    assert env["VLLM_EC_SIDE_CHANNEL_HOST"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert {"name": "ec-side-channel", "containerPort": 5601, "protocol": "TCP"} in server["ports"]
    assert server["resources"]["requests"]["nvidia.com/gpu"] == "1"
    # The connector's region is in /dev/shm: 2 GiB per GPU and the 3 GiB of encoder outputs.
    volumes = {v["name"]: v for v in encode["spec"]["template"]["spec"]["volumes"]}
    assert volumes["dshm"]["emptyDir"]["sizeLimit"] == "5Gi"
    affinity = encode["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    values = str(affinity["requiredDuringSchedulingIgnoredDuringExecution"])
    assert "'l4'" in values and "h100" not in values


def test_an_encode_replica_preprocesses_for_the_serving_replicas_it_serves() -> None:
    """With multimodal.imagesPerSecond: the serving replicas at their most share the encode replicas."""
    multimodal = {"imagesPerSecond": 10, "largestItem": {"image": {"width": 1280, "height": 720}}}
    autoscaled = {"minReplicas": 1, "maxReplicas": 8, "slo": {"target": "2s"}}
    got = children(multimodal=multimodal, autoscaling=autoscaled, disaggregation={"encode": ENCODE})
    # 10 images/s x 40.6 ms, half busy: 0.81 cores per serving replica; 8 of them on 2 encode replicas: 3.24 each.
    serving = containers(got[("Deployment", "qwen")])["server"]["resources"]["requests"]["cpu"]
    encode = containers(got[("Deployment", "qwen-encode")])["server"]["resources"]["requests"]["cpu"]
    assert (serving, encode) == ("4812m", "7245m")


def test_an_encode_gpu_type_left_out_is_the_serving_tiers() -> None:
    got = children(gpu={"count": 1, "type": "H200"}, disaggregation={"encode": {}})
    encode = got[("Deployment", "qwen-encode")]
    assert "h200" in str(encode["spec"]["template"]["spec"]["affinity"])
    assert encode["spec"]["replicas"] == 1


def test_a_restarted_server_of_either_tier_starts_without_the_dead_ones_region(tmp_path: Path) -> None:
    """vLLM's connector maps /dev/shm/vllm_ec_<random>.mmap and only a clean exit removes it; /dev/shm outlives a
    container restart. The rendered command, run by a real shell (on a directory standing for /dev/shm, so as not to
    touch this machine's), removes the old region and then becomes vLLM (a stand-in printing its argv and pid): the
    shell's own process, so vLLM is the one the kubelet's SIGTERM reaches."""
    got = children(disaggregation={"encode": ENCODE})
    shm = tmp_path / "shm"
    shm.mkdir()
    stale, other = shm / "vllm_ec_1733_dp0.mmap", shm / "other"
    stand_in = [sys.executable, "-c", "import os, sys; print(os.getpid(), sys.argv[1:])"]
    for name in ("qwen", "qwen-encode"):
        command = containers(got[("Deployment", name)])["server"]["command"]
        argv = vllm.serve_argv(command)
        assert argv[:2] == ["vllm", "serve"] and "--ec-transfer-config" in argv
        shell, flag, script = command[: -len(argv)]
        assert script.count("/dev/shm/") == 1
        stale.write_bytes(b"x")
        other.write_bytes(b"x")
        run = subprocess.Popen(
            [shell, flag, script.replace("/dev/shm/", f"{shm}/"), *stand_in, "a b", "--x"],
            stdout=subprocess.PIPE,
            text=True,
        )
        out, _ = run.communicate(timeout=30)
        assert out.strip() == f"{run.pid} ['a b', '--x']", "vLLM's argv unchanged, in the shell's own process"
        assert not stale.exists() and other.exists(), "only the connector's regions are removed"
        other.unlink()
    aggregated = containers(children()[("Deployment", "qwen")])["server"]["command"]
    assert aggregated[:2] == ["vllm", "serve"], "no connector, no region: vLLM runs as the container's command"


def test_the_serving_tier_consumes_and_its_sidecar_takes_the_clients_requests() -> None:
    got = children(disaggregation={"encode": ENCODE}, autoscaling={"slo": {"target": "2s"}})
    serving = got[("Deployment", "qwen")]
    assert "replicas" not in serving["spec"]  # the autoscaler's, as without an encode tier
    pod = containers(serving)
    server, proxy = pod["server"], pod["encode-proxy"]
    assert '"ec_role":"ec_consumer"' in flag(server["command"], "--ec-transfer-config")
    # The sidecar takes the serving port, name and number; the server moves beside it, its probes and drain with it.
    assert proxy["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert server["ports"] == [{"name": "server", "containerPort": 8001, "protocol": "TCP"}]
    assert flag(server["command"], "--port") == "8001"
    assert {server[p]["httpGet"]["port"] for p in ("startupProbe", "readinessProbe", "livenessProbe")} == {"server"}
    assert "127.0.0.1:8001/metrics" in server["lifecycle"]["preStop"]["exec"]["command"][2]
    # The sidecar drains as the server does: it waits for the server to finish what it has before its SIGTERM.
    assert proxy["lifecycle"]["preStop"] == server["lifecycle"]["preStop"]
    assert proxy["image"] == server["image"]  # the server's image runs it: nothing more to pull or pin
    assert proxy["command"] == [
        *("python3", "/etc/mmfleet/encode_proxy.py", "--port", "8000"),
        *("--server", "http://127.0.0.1:8001", "--encoder", "http://qwen-encode.ml.svc:8000"),
        *("--shutdown-seconds", "30"),
    ]
    config = got[("ConfigMap", "qwen-config")]
    assert config["data"] == {"encode_proxy.py": render.PROXY_SOURCE}
    checksum = serving["spec"]["template"]["metadata"]["annotations"]["mmfleet.io/config-checksum"]
    assert checksum == render._config_checksum(config["data"])
    # The encode pods read nothing of the ConfigMap: a new sidecar does not roll their GPUs.
    encode_pod = got[("Deployment", "qwen-encode")]["spec"]["template"]
    assert "mmfleet.io/config-checksum" not in encode_pod["metadata"]["annotations"]
    assert "config" not in {v["name"] for v in encode_pod["spec"]["volumes"]}
    # Clients, the picker and Prometheus reach the serving port as before: a fleet rolling onto the tier keeps serving.
    service = got[("Service", "qwen")]
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "inference-server"
    encode_service = got[("Service", "qwen-encode")]
    assert encode_service["spec"]["selector"]["app.kubernetes.io/component"] == "encoder"


def test_only_the_serving_pods_reach_the_encode_pods() -> None:
    got = children(disaggregation={"encode": ENCODE})
    encode_policy = got[("NetworkPolicy", "qwen-encode")]["spec"]
    assert encode_policy["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "encoder"
    serving_pods = {"podSelector": {"matchLabels": render.selector_labels(parse(spec_doc()))}}
    assert encode_policy["ingress"] == [{"from": [serving_pods]}]
    serving_policy = got[("NetworkPolicy", "qwen")]["spec"]["ingress"]
    # Clients reach the sidecar's port only, not the server beside it.
    assert serving_policy[0]["ports"] == [{"port": "http", "protocol": "TCP"}]
    # NIXL's reads between the tiers: every port, from the encode pods only.
    assert {"from": [{"podSelector": {"matchLabels": render.encode_selector(parse(spec_doc()))}}]} in serving_policy


def test_the_encode_pods_series_stay_out_of_the_fleets() -> None:
    got = children(disaggregation={"encode": ENCODE})
    monitor = got[("PodMonitor", "qwen-encode")]["spec"]
    relabel = monitor["podMetricsEndpoints"][0]["relabelings"][0]
    assert relabel["targetLabel"] == "mmfleet_io_encode"
    fleet = got[("PodMonitor", "qwen")]["spec"]["podMetricsEndpoints"][0]["relabelings"][0]
    assert fleet["targetLabel"] == "mmfleet_io_inference"
    assert (
        got[("PodDisruptionBudget", "qwen-encode")]["spec"]["selector"]["matchLabels"]
        == monitor["selector"]["matchLabels"]
    )


def test_the_inference_pool_still_sends_to_the_serving_port() -> None:
    got = children(routing={"mode": "inferencePool"}, disaggregation={"encode": ENCODE})
    assert got[("InferencePool", "qwen")]["spec"]["targetPorts"] == [{"number": 8000}]


def test_without_an_encode_tier_nothing_changes() -> None:
    got = children()
    assert not [key for key in got if key[1] == "qwen-encode"]
    assert list(containers(got[("Deployment", "qwen")])) == ["server"]
    assert "--ec-transfer-config" not in containers(got[("Deployment", "qwen")])["server"]["command"]
    assert got[("Service", "qwen")]["spec"]["ports"][0]["targetPort"] == "http"
    assert ("ConfigMap", "qwen-config") not in got
    names = {name for _, _, name in render.optional_children(parse(spec_doc()))}
    assert {"qwen-encode"} <= names  # pruned when the tier is taken out


def test_a_warm_standby_sleeps_the_serving_replicas_only() -> None:
    got = children(
        routing={"mode": "inferencePool"},
        disaggregation={"encode": ENCODE},
        autoscaling={"slo": {"target": "2s"}, "warmStandby": {"replicas": 1}},
    )
    encode = containers(got[("Deployment", "qwen-encode")])["server"]
    assert "--enable-sleep-mode" not in encode["command"]
    assert "VLLM_SERVER_DEV_MODE" not in {e["name"] for e in encode["env"]}
    assert "--enable-sleep-mode" in containers(got[("Deployment", "qwen")])["server"]["command"]
    labels = got[("Deployment", "qwen-encode")]["spec"]["template"]["metadata"]["labels"]
    assert render.SERVING_LABEL not in labels


@pytest.mark.parametrize("flag_name", ["--ec-transfer-config", "--mm-encoder-only"])
def test_the_encode_flags_are_the_operators(flag_name: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse(spec_doc(backend={"extraArgs": [flag_name, "x"]}))
    assert "disaggregation.encode" in str(caught.value)


def test_flash_attention_3_needs_a_hopper_encode_tier_too() -> None:
    hopper = {"backend": {"attention": "flash-attn-3"}, "gpu": {"type": "H100"}}
    with pytest.raises(SpecError) as caught:
        parse(spec_doc(**hopper, disaggregation={"encode": {"gpu": {"type": "L4"}}}))
    assert caught.value.problems[0].startswith("spec.disaggregation.encode.gpu.type: L4 with spec.backend.attention")
    parse(spec_doc(**hopper, disaggregation={"encode": {"gpu": {"type": "H200"}}}))
    parse(spec_doc(**hopper, disaggregation={"encode": {}}))  # the serving tier's H100


def test_a_cache_too_small_for_one_image_is_refused() -> None:
    with pytest.raises(SpecError) as caught:
        parse(spec_doc(disaggregation={"encode": {"cacheGiB": 0.0001}}))
    assert "spec.disaggregation.encode.cacheGiB" in caught.value.problems[0]


def test_a_name_too_long_for_the_encode_service_is_refused() -> None:
    doc = spec_doc(disaggregation={"encode": {}})
    doc["metadata"]["name"] = "q" * 60
    with pytest.raises(SpecError) as caught:
        parse(doc)
    assert caught.value.problems[0].startswith(f"metadata.name: {'q' * 60} has 60 characters; with spec.disaggregation")
    assert "may have at most 56" in caught.value.problems[0]
    doc["metadata"]["name"] = "q" * 56
    parse(doc)


def encoded(seen: EncodeSeen | None, previous: Any = None, **spec: Any) -> Any:
    spec.setdefault("disaggregation", {"encode": ENCODE})
    spec.setdefault("replicas", 2)
    fleet = status_inference(**spec)
    return compute_status(fleet, Observed(deployment=deployment(2, 2), encode=seen), previous, NOW)


@pytest.mark.parametrize(
    ("seen", "expected", "words"),
    [
        (EncodeSeen(deployment(2, 2)), ("True", "EncodeReplicasReady"), "encode tier qwen-encode: 2/2 replicas ready"),
        (
            EncodeSeen(None),
            ("False", "EncodeReplicasNotReady"),
            "0/2 replicas ready, 0 on the current spec",
        ),
        (EncodeSeen(deployment(2, 1)), ("False", "EncodeReplicasNotReady"), "1/2 replicas ready"),
        # A rollout whose new pod does not come: the old replicas are ready, the spec's are not.
        (EncodeSeen(deployment(3, 2, updated=1)), ("False", "EncodeReplicasNotReady"), "1 on the current spec"),
        (
            EncodeSeen(deployment(3, 2, updated=1), [PodProblem("qwen-encode-8a-y", "Unschedulable", "0/3 nodes")]),
            ("False", "EncodeReplicasFailing"),
            "pod qwen-encode-8a-y: Unschedulable: 0/3 nodes",
        ),
        (
            EncodeSeen(deployment(2, 1), [PodProblem("qwen-encode-7f-x", "CrashLoopBackOff", "back-off 40s")]),
            ("False", "EncodeReplicasFailing"),
            "pod qwen-encode-7f-x: CrashLoopBackOff: back-off 40s (kubectl logs qwen-encode-7f-x)",
        ),
    ],
)
def test_encode_ready_says_whether_the_encode_tier_serves(
    seen: EncodeSeen, expected: tuple[str, str], words: str
) -> None:
    status = encoded(seen)
    assert conditions(status)["EncodeReady"] == expected
    assert words in next(c.message for c in status.conditions if c.type == "EncodeReady")
    # The serving tier serves either way: its sidecars fall back to encoding in the server.
    assert conditions(status)["Ready"] == ("True", "ReplicasReady")


def test_status_encode_counts_the_encode_replicas_and_is_kept_between_looks() -> None:
    status = encoded(EncodeSeen(deployment(2, 1)))
    assert status.encode is not None
    assert (status.encode.deployment, status.encode.replicas, status.encode.ready_replicas) == ("qwen-encode", 2, 1)
    assert status.encode.desired_replicas == 2
    again = encoded(None, previous=status)
    assert again.encode == status.encode
    assert conditions(again)["EncodeReady"] == ("False", "EncodeReplicasNotReady")
    assert conditions(encoded(None))["EncodeReady"] == ("Unknown", "NotChecked")


def test_without_an_encode_tier_there_is_no_encode_status() -> None:
    status = encoded(EncodeSeen(deployment(2, 2)), disaggregation={})
    assert status.encode is None
    assert "EncodeReady" not in conditions(status)


def test_a_fleet_that_never_had_an_encode_tier_reads_none_of_its_children() -> None:
    """Pruning reads an optional child only where the fleet may have had it: the encode tier's five children would be
    five more reads per reconcile of every fleet."""
    kube = RecordingKube()
    op = operator(kube)
    assert not reconcile_once(op, fleet_body(generation=2, replicas=1)).retry
    assert [read for read in kube.got if read[1].endswith("-encode")] == []


def test_an_encode_tier_taken_out_is_pruned() -> None:
    kube = RecordingKube()
    op = operator(kube)
    with_tier = fleet_body(generation=2, replicas=1)
    with_tier["spec"]["disaggregation"] = {"encode": {"replicas": 2}}
    assert not reconcile_once(op, with_tier).retry
    owner = [{"uid": with_tier["metadata"]["uid"], "controller": True}]
    for _, kind, name in render.encode_children(parse(with_tier)):
        kube.existing[(kind, name)] = {"metadata": {"name": name, "ownerReferences": owner}}
    assert not reconcile_once(op, fleet_body(generation=3, replicas=1)).retry
    assert {("Deployment", "qwen-encode"), ("Service", "qwen-encode")} <= set(kube.deleted)
