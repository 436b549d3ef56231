"""A fleet of routing mode inferencePool served for real: the endpoint picker (EPP v1.5.0) with the configuration
the operator rendered, model servers (the llm-d inference simulator, with vLLM's API and metric names) at the fleet's
pod IPs, and the lab's gateway stand-in doing Envoy's part over ext_proc (``mmfleet_lab/gateway/standin``).

The picker and the simulators bind every interface, so each runs in a network namespace of its own
(``mmfleet_lab.cluster.netns``): the picker and the stand-in in a gateway namespace whose 127.0.0.1 leads to the API
server's port, each simulator in a namespace holding its pod's IP. Tests speak HTTP to the stand-in's Unix socket.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import random
import re
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from mmfleet.api import seconds
from mmfleet_lab.cluster import Cluster, ensure_epp, ensure_gateway_standin, ensure_inference_sim
from mmfleet_lab.cluster.collector import RunningCollector
from mmfleet_lab.cluster.netns import Network, isolated_network, socket_in
from tests.helpers.fleet import Fleet
from tests.helpers.tools import REQUIRED
from tests.helpers.wait import wait_for

# Network namespaces need root (and iproute2's ip: make system-deps). A developer who is not root skips the modules
# that use them before the cluster starts; under make integration (MMFLEET_REQUIRE_TOOLS=1) nothing skips,
# require_netns fails.
AS_ROOT = os.geteuid() == 0
NETNS_MARKS = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not AS_ROOT and not REQUIRED,
        reason="needs root for network namespaces (ip netns, setns); under make integration it fails instead",
    ),
]
POOL_API = ("inference.networking.k8s.io", "v1")
# The simulator's flags that make it a server of the fleet (llm-d-inference-sim v0.10.2 pkg/common/parser.go:115-231):
# no tokenizer download (a simulated one, tokenizer.go:54-70), its KV cache with vLLM's 16-token blocks, so
# ``vllm:cache_config_info`` tells the picker's prefix index the block size (metrics.go). POD_IP is needed with the KV
# cache (its events name the pod). --log-http: each request's headers in the simulator's log.
SIM_FLAGS: tuple[str, ...] = ("--force-dummy-tokenizer", "--enable-kvcache", "--block-size", "16", "--kv-cache-size")
SIM_FLAGS += ("4096", "--log-http")
FAST = ("--time-to-first-token", "10ms", "--inter-token-latency", "1ms")


@dataclass
class Answer:
    status: int
    endpoint: str
    body: str
    seconds: float


class UnixConnection(http.client.HTTPConnection):
    """HTTP over the stand-in's Unix socket."""

    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("gateway.local", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(str(self.socket_path))
        self.sock = sock


@dataclass
class RoutedPool:
    """The fleet's pods served by simulators, its picker and the stand-in, in ``network``."""

    network: Network
    fleet: Fleet
    serve: list[str]  # the rendered server's command
    ttl: float  # the rendered flowControl.defaultRequestTTL, in seconds
    logs: Path
    gateway_socket: Path
    pods: dict[str, str] = field(default_factory=dict)  # pod IP -> pod name
    sims: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)  # pod IP -> its simulator
    picker_log: Path = Path()
    collector: RunningCollector | None = None

    def flag(self, name: str) -> str:
        return self.serve[self.serve.index(name) + 1]

    @property
    def model(self) -> str:
        return self.flag("--served-model-name")

    def start_sim(self, ip: str, *extra: str) -> None:
        """A simulator as the fleet's server at ``ip`` (its model, served name, port, context length)."""
        if ip in self.sims:
            Network.stop(self.sims.pop(ip))
        argv = [str(ensure_inference_sim()), "--model", self.serve[2], "--served-model-name", self.model]
        argv += ["--port", self.flag("--port"), "--max-model-len", self.flag("--max-model-len")]
        argv += ["--max-num-seqs", self.flag("--max-num-seqs"), *SIM_FLAGS, *extra]
        env = {"POD_IP": ip, "POD_NAME": self.pods[ip], "POD_NAMESPACE": self.fleet.namespace}
        if "--enable-sleep-mode" in self.serve:  # warm standby: /sleep and /wake_up, as the rendered pod has them
            argv.append("--enable-sleep-mode")
            env["VLLM_SERVER_DEV_MODE"] = "1"
        self.sims[ip] = self.network.run(self.network.pods[ip], argv, self.logs / f"sim-{ip}.log", env)

    def post(self, body: dict[str, Any], timeout: float = 30.0, headers: dict[str, str] | None = None) -> Answer:
        connection = UnixConnection(self.gateway_socket, timeout)
        started = time.monotonic()
        try:
            payload = json.dumps(body).encode()
            sent = {"content-type": "application/json", **(headers or {})}
            connection.request("POST", "/v1/chat/completions", payload, sent)
            answer = connection.getresponse()
            text = answer.read().decode(errors="replace")
            endpoint = answer.getheader("x-mmfleet-endpoint") or ""
            return Answer(answer.status, endpoint, text, time.monotonic() - started)
        finally:
            connection.close()

    def picker_metrics(self) -> str:
        """The picker's /metrics, read inside the gateway namespace (its port is there only)."""
        return self._metrics("127.0.0.1", 9090)

    def server_metrics(self, ip: str) -> str:
        """The /metrics of the server at pod ``ip``, read from the gateway namespace, as the picker scrapes it."""
        return self._metrics(ip, int(self.flag("--port")))

    def _metrics(self, host: str, port: int) -> str:
        connection = http.client.HTTPConnection(host, port, timeout=5)
        sock = socket_in(self.network.gateway)
        sock.settimeout(5)
        sock.connect((host, port))
        connection.sock = sock
        try:
            connection.request("GET", "/metrics")
            return connection.getresponse().read().decode()
        finally:
            connection.close()

    def endpoint(self, ip: str) -> str:
        return f"{ip}:{self.flag('--port')}"

    def why(self) -> str:
        return "\n".join(self.picker_log.read_text(errors="replace").splitlines()[-30:])


def sample(exposition: str, name: str) -> float | None:
    """The value of the first sample of ``name`` in a Prometheus text exposition, with any labels; None if absent."""
    found = re.search(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", exposition, re.MULTILINE)
    return float(found[1]) if found else None


def chat(model: str, text: str, image: str | None = None, max_tokens: int = 4) -> dict[str, Any]:
    """An OpenAI chat request; with ``image``, a user turn of text then the image (a data: or http:// URL)."""
    content: Any = text
    if image is not None:
        content = [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": image}}]
    return {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": content}]}


def data_url(rng: random.Random, size: int = 6000) -> str:
    return "data:image/png;base64," + base64.b64encode(rng.randbytes(size)).decode()


def question(rng: random.Random) -> str:
    """A session's question, different from the first words: the picker hashes the messages in 64-byte blocks (16
    tokens of 4 characters, ``approximateprefix/hashing.go:47-87``), and a first block shared by every request would
    pull each new one to whichever replica saw it first."""
    return f"Session {uuid.UUID(int=rng.getrandbits(128))}: what does this picture show, and what is unusual in it?"


def require_netns() -> None:
    """Fail, naming what is missing, before the fleet is made: never a skip, so CI cannot pass without them."""
    missing = [] if AS_ROOT else ["root"]
    if shutil.which("ip") is None:
        missing.append("iproute2's ip (make system-deps)")
    if missing:
        pytest.fail(f"network namespaces need {' and '.join(missing)} (mmfleet_lab.cluster.netns)")


def ready_pods(fleet: Fleet, selector: dict[str, str], count: int) -> dict[str, str]:
    """The Ready pods (IP -> name) that ``selector`` picks, once there are ``count`` (none before)."""
    labels = ",".join(f"{key}={value}" for key, value in selector.items())
    pods = fleet.core.list_namespaced_pod(fleet.namespace, label_selector=labels).items
    ready = {
        pod.status.pod_ip: pod.metadata.name
        for pod in pods
        if pod.status.pod_ip
        and pod.metadata.deletion_timestamp is None
        and any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
    }
    return ready if len(ready) == count else {}


def listening(routed: RoutedPool, ip: str) -> bool:
    probe = socket_in(routed.network.gateway)
    probe.settimeout(1)
    try:
        probe.connect((ip, int(routed.flag("--port"))))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def api_server(cluster: Cluster) -> str:
    server: str = yaml.safe_load(cluster.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    return server


def picker_listening(routed: RoutedPool) -> bool:
    """The picker's log says its ext_proc gRPC server listens (``runnable/grpc.go``: "gRPC server listening")."""
    lines = routed.picker_log.read_text(errors="replace").splitlines() if routed.picker_log.exists() else []
    return any("gRPC server listening" in line and '"ext-proc"' in line for line in lines)


def serves_all(routed: RoutedPool) -> bool:
    """Distinct requests reach every replica (the picker has them all, with metrics)."""
    rng = random.Random()  # new questions at each try: a question asked before goes where it went
    seen = {routed.post(chat(routed.model, question(rng))).endpoint for _ in range(12)}
    return seen >= {routed.endpoint(ip) for ip in routed.pods}


@contextlib.contextmanager
def serve_pool(
    cluster: Cluster, fleet: Fleet, name: str, pods: dict[str, str], logs: Path, collector: RunningCollector | None
) -> Iterator[RoutedPool]:
    """Fleet ``name``'s picker, stand-in and a simulator at each of ``pods`` (IP -> pod name), in a network of their
    own, from what the operator rendered; with ``collector``, the picker's spans go to it."""
    core, custom = fleet.core, fleet.custom
    namespace = fleet.namespace
    pool = custom.get_namespaced_custom_object(*POOL_API, namespace, "inferencepools", name)
    config_text = core.read_namespaced_config_map(f"{name}-epp", namespace).data["config.yaml"]
    picker = fleet.apps.read_namespaced_deployment(f"{name}-epp", namespace).spec.template.spec.containers[0]
    server = fleet.apps.read_namespaced_deployment(name, namespace).spec.template.spec.containers[0]
    ttl = seconds(yaml.safe_load(config_text)["flowControl"]["defaultRequestTTL"])
    config = logs / "config.yaml"
    config.write_text(config_text)  # the rendered configuration, as it is
    assert str(pool["spec"]["targetPorts"][0]["number"]) == server.command[server.command.index("--port") + 1]
    with isolated_network() as network:
        routed = RoutedPool(network, fleet, server.command, ttl, logs, logs / "gateway.sock", pods=dict(pods))
        routed.collector = collector
        network.forward_tcp(urlsplit(api_server(cluster)).port or 443)
        for ip in pods:
            network.add_pod(ip)
            routed.start_sim(ip, *FAST)
        # The rendered container's arguments; only the configuration's path is this test's.
        args: list[str] = picker.args
        args[args.index("--config-file") + 1] = str(config)
        env = {e.name: e.value for e in picker.env or [] if e.value is not None}  # the rendered tracing settings
        if collector is not None:
            network.forward_tcp(urlsplit(collector.endpoint).port or 4317)
            env["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector.endpoint  # forwarded into the gateway namespace
        env.update(KUBECONFIG=str(cluster.kubeconfig), NAMESPACE=namespace, POD_NAME=f"{name}-epp-0-0")
        routed.picker_log = logs / "epp.log"
        network.run(network.gateway, [str(ensure_epp()), *args], routed.picker_log, env)
        standin = [str(ensure_gateway_standin()), "--listen", f"unix:{routed.gateway_socket}"]
        network.run(network.gateway, [*standin, "--ext-proc", "127.0.0.1:9002"], logs / "gateway.log")
        wait_for(routed.gateway_socket.exists, 30, "the stand-in's socket")
        # With no replica to serve through it, nothing else shows the picker is up before a test's first request.
        wait_for(lambda: picker_listening(routed), 60, lambda: f"the picker's ext_proc port\n{routed.why()}")
        if pods:
            wait_for(
                lambda: serves_all(routed), 60, lambda: f"every replica serving through the picker\n{routed.why()}"
            )
        yield routed
