"""Scale to zero and back, for real: a fleet with minReplicas 0 idles to zero, a request arrives and is held by the
real endpoint picker (EPP v1.5.0, flow control as the operator rendered it), the operator reads the held request from
a real Prometheus scraping the picker, scales 0 -> 1, and the request is answered by the new replica's server (the llm-d
inference simulator at the pod's IP); when the new replica's server does not answer within the picker's request
TTL, the client gets the picker's refusal after the TTL.

Prometheus runs on the host and scrapes the picker's and the servers' /metrics inside the gateway's network namespace
through a small bridge (``MetricsBridge``), labelled as the rendered PodMonitors label them.
"""

from __future__ import annotations

import contextlib
import http.client
import random
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from mmfleet import routing
from mmfleet.api import MultimodalInference
from mmfleet_lab.cluster import Cluster
from mmfleet_lab.cluster import prometheus as prom
from mmfleet_lab.cluster.kubectl import run_kubectl
from mmfleet_lab.cluster.netns import Network, socket_in
from tests.helpers.fake_pods import PrometheusServer
from tests.helpers.fleet import Fleet, mmi
from tests.helpers.operator_process import OperatorProcess
from tests.helpers.routed import (
    FAST,
    NETNS_MARKS,
    POOL_API,
    Answer,
    RoutedPool,
    chat,
    listening,
    question,
    ready_pods,
    require_netns,
    serve_pool,
)
from tests.helpers.wait import wait_for

pytestmark = NETNS_MARKS

FLEET = "idle"
PICKER_METRICS = ("127.0.0.1", 9090)  # the picker's metrics port, in the gateway's namespace (options.go default)
AUTOSCALING = {
    "minReplicas": 0,
    "maxReplicas": 2,
    "slo": {"target": "2s", "window": "10s"},
    "scaleToZero": {"after": "1m"},
}


class MetricsBridge:
    """``/pods/<namespace>/<pod>/metrics`` on the host, read from ``routes[pod]`` inside the gateway's namespace."""

    def __init__(self, network: Network) -> None:
        self.routes: dict[str, tuple[str, int]] = {}
        bridge = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                where = bridge.routes.get(self.path.removesuffix("/metrics").rsplit("/", 1)[-1])
                body = bridge.fetch(network, where) if where else None
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, *_: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @staticmethod
    def fetch(network: Network, where: tuple[str, int]) -> bytes | None:
        connection = http.client.HTTPConnection(*where, timeout=2)
        try:
            sock = socket_in(network.gateway)
            sock.settimeout(2)
            sock.connect(where)
            connection.sock = sock
            connection.request("GET", "/metrics")
            return connection.getresponse().read()
        except OSError:
            return None
        finally:
            connection.close()

    def targets(self, namespace: str, inference: str) -> list[prom.Target]:
        return [prom.Target(self.address, namespace, pod, inference) for pod in self.routes]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def zero_operator(pool_operator: OperatorProcess, tmp_path: Path) -> Iterator[tuple[OperatorProcess, PrometheusServer]]:
    """The module's operator (a 1 s cold start, so a 30 s request TTL), reading a Prometheus of this test's every
    second; restored after."""
    server = PrometheusServer(tmp_path, "1s")
    server.start()
    saved = dict(pool_operator.env)
    pool_operator.stop()
    pool_operator.env.update(MMFLEET_PROMETHEUS_URL=server.url, MMFLEET_AUTOSCALE_INTERVAL="1s")
    pool_operator.start()
    try:
        yield pool_operator, server
    finally:
        pool_operator.stop()
        pool_operator.env.clear()
        pool_operator.env.update(saved)
        pool_operator.start()
        server.stop()


def replicas(fleet: Fleet) -> int:
    count: int = fleet.deployment(FLEET).spec.replicas
    return count


@dataclass
class AtZero:
    """Fleet ``FLEET`` idled to zero, served for real: its picker and the stand-in running, no replica and no server
    left, Prometheus scraping the picker."""

    fleet: Fleet
    routed: RoutedPool
    selector: dict[str, str]


@contextlib.contextmanager
def fleet_at_zero(
    cluster: Cluster, api: Any, namespace: str, server: PrometheusServer, tmp_path: Path
) -> Iterator[AtZero]:
    """A fleet of minReplicas 0 made, served through the real picker while its first replica lives, then left idle
    until the operator takes it to zero (after 1m, with its event and conditions); its last server stopped."""
    require_netns()
    fleet = Fleet(api, namespace)
    logs = tmp_path / "zero"
    logs.mkdir()
    targets = prom.targets_dir(server.state) / "routed.json"
    try:
        fleet.create(mmi(FLEET, routing={"mode": "inferencePool"}, autoscaling=AUTOSCALING))
        fleet.wait_condition(FLEET, "RoutingReady", status="True", timeout=90)
        pool = fleet.custom.get_namespaced_custom_object(*POOL_API, namespace, "inferencepools", FLEET)
        selector = pool["spec"]["selector"]["matchLabels"]
        pods = wait_for(lambda: ready_pods(fleet, selector, 1), 60, "the fleet's first replica (its initial scale)")
        with serve_pool(cluster, fleet, FLEET, pods, logs, None) as routed:
            bridge = MetricsBridge(routed.network)
            try:
                ((ip, pod),) = pods.items()
                bridge.routes = {f"{FLEET}-epp-0": PICKER_METRICS, pod: (ip, int(routed.flag("--port")))}
                prom.write_targets(targets, bridge.targets(namespace, FLEET))

                # Idle (the requests that checked the pool finished over a minute ago): down to zero after 1m.
                why = lambda: f"0 replicas; Idle: {fleet.condition(FLEET, 'Idle')}"  # noqa: E731
                wait_for(lambda: replicas(fleet) == 0, 240, why)
                down = wait_for(lambda: fleet.events(FLEET, "ScaledDown"), 30, "the ScaledDown event")
                assert any(m.endswith("(scaleToZero.after 1m): 1 -> 0") for m in down), down
                idle = fleet.wait_condition(FLEET, "Idle", reason="ScaledToZero", timeout=30)
                assert idle["status"] == "True"
                ready = fleet.wait_condition(FLEET, "Ready", reason="ScaledToZero", timeout=30)
                assert ready["status"] == "True"
                wait_for(lambda: not ready_pods(fleet, selector, 1), 60, "the last pod gone")
                Network.stop(routed.sims.pop(ip))
                routed.pods.clear()
                bridge.routes.pop(pod)
                prom.write_targets(targets, bridge.targets(namespace, FLEET))
                yield AtZero(fleet, routed, selector)
            finally:
                bridge.close()
    finally:
        targets.unlink(missing_ok=True)


@pytest.fixture
def at_zero(
    cluster: Cluster,
    api: Any,
    namespace: str,
    zero_operator: tuple[OperatorProcess, PrometheusServer],
    tmp_path: Path,
) -> Iterator[AtZero]:
    _, server = zero_operator
    with fleet_at_zero(cluster, api, namespace, server, tmp_path) as zero:
        yield zero


def hold(routed: RoutedPool, seed: int) -> tuple[threading.Thread, list[Answer]]:
    """A request sent to the pool in the background (waiting up to the picker's TTL and 30 s more); its answer is
    appended to the list once it comes."""
    answers: list[Answer] = []
    request = chat(routed.model, question(random.Random(seed)))
    sent = threading.Thread(target=lambda: answers.append(routed.post(request, routed.ttl + 30)))
    sent.start()
    return sent, answers


def test_an_idle_fleet_goes_to_zero_and_the_first_request_is_held_until_a_replica_serves_it(at_zero: AtZero) -> None:
    fleet, routed, selector = at_zero.fleet, at_zero.routed, at_zero.selector
    # A request to the empty pool is held by the picker; its held count brings one replica back.
    sent, answers = hold(routed, 26)
    wait_for(lambda: replicas(fleet) == 1, 30, lambda: f"0 -> 1 on the held request\n{routed.why()}")
    new = wait_for(lambda: ready_pods(fleet, selector, 1), 30, "the new replica Ready")
    _serve(routed, new)  # before looking for the event, which kopf posts later: the request's TTL runs meanwhile
    up = wait_for(lambda: fleet.events(FLEET, "ScaledUp"), 30, "the ScaledUp event")
    assert any("requests held by the endpoint picker after" in m and m.endswith(": 0 -> 1") for m in up), up
    sent.join(routed.ttl + 40)
    assert answers, "the held request got no answer"
    (answer,) = answers
    assert answer.status == 200, (answer, routed.why())
    assert answer.endpoint == routed.endpoint(next(iter(new))), answer
    assert answer.seconds < routed.ttl, "answered by the new replica, not by the picker's TTL"


# What EPP v1.5.0 answers for a request whose TTL ran out in flow control's queue: the request's context has the TTL
# as its deadline, with ErrTTLExpired as the cause (pkg/epp/flowcontrol/controller/controller.go:395); on it the
# controller finalizes the queued item (:366-370) as EvictedTTL, "request evicted from queue: request TTL expired"
# (controller/internal/item.go:174-193); the admission controller makes that a ServiceUnavailable error, "request
# timed out in queue: ..." (pkg/epp/requestcontrol/admission.go:225-226), and the ext_proc server answers it as an
# ImmediateResponse (pkg/epp/handlers/server.go:313): HTTP 503, the error's text as the body
# (pkg/common/error/error.go:46-47, 78-79, 94-95). The stand-in gives the client that status and body as they are.
EXPIRED_STATUS = 503
EXPIRED_BODY = (
    "inference error: ServiceUnavailable - request timed out in queue: request evicted from queue: request TTL expired"
)


def evicted_by_ttl(metrics: str) -> float:
    """Requests the picker's flow control evicted for their TTL, from its queue-duration histogram's count."""
    prefix = f"{routing.HELD_SECONDS_METRIC}_count{{"
    lines = [line for line in metrics.splitlines() if line.startswith(prefix) and 'outcome="EvictedTTL"' in line]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def test_a_request_held_past_the_ttl_gets_the_endpoint_pickers_error(at_zero: AtZero) -> None:
    """The request wakes the fleet, but the new replica's server never answers (its pod is Ready, nothing listens at
    its IP: a replica slower than the TTL): the picker, finding no replica with fresh metrics, holds the request for its
    TTL, then refuses it; the client gets that refusal then, not a hang and not a server's answer."""
    fleet, routed = at_zero.fleet, at_zero.routed
    sent, answers = hold(routed, 27)
    wait_for(lambda: replicas(fleet) >= 1, 30, lambda: f"0 -> 1 on the held request\n{routed.why()}")
    new = wait_for(lambda: ready_pods(fleet, at_zero.selector, replicas(fleet)), 30, "the new replicas Ready")
    for ip in new:  # the pod's IP exists (connections to it are refused), and no server is started there
        if ip not in routed.network.pods:
            routed.network.add_pod(ip)
    assert not any(listening(routed, ip) for ip in new), new
    sent.join(routed.ttl + 40)
    assert answers, f"the held request got no answer within the TTL ({routed.ttl:g}s) and 40 s"
    (answer,) = answers
    assert (answer.status, answer.body) == (EXPIRED_STATUS, EXPIRED_BODY), (answer, routed.why())
    assert routed.ttl - 1 <= answer.seconds < routed.ttl + 10, (answer, routed.ttl)
    assert answer.endpoint == "", f"served by {answer.endpoint}, not refused by the picker"
    assert evicted_by_ttl(routed.picker_metrics()) == 1, routed.why()


def _serve(routed: RoutedPool, pods: dict[str, str]) -> None:
    """A simulator for each new pod, at its IP (a namespace of its own, or the one its IP had before)."""
    for ip, name in pods.items():
        routed.pods[ip] = name
        if ip not in routed.network.pods:
            routed.network.add_pod(ip)
        routed.start_sim(ip, *FAST)


def dry_run(cluster: Cluster, namespace: str, spec: str) -> subprocess.CompletedProcess[str]:
    resource = (
        "apiVersion: mmfleet.io/v1alpha1\nkind: MultimodalInference\n"
        f"metadata: {{name: zero, namespace: {namespace}}}\nspec:\n  model: {{name: m}}\n{spec}"
    )
    return run_kubectl(cluster.kubeconfig, "apply", "--dry-run=server", "-f", "-", stdin=resource)


@pytest.mark.parametrize(
    ("spec", "refused"),
    [
        (
            "  autoscaling: {minReplicas: 0, slo: {target: 2s}}\n",
            "autoscaling.minReplicas: 0 needs spec.routing.mode inferencePool",
        ),
        (
            "  autoscaling: {minReplicas: 1, slo: {target: 2s}, scaleToZero: {after: 5m}}\n"
            "  routing: {mode: inferencePool}\n",
            "scaleToZero is read only with minReplicas 0",
        ),
        (
            "  autoscaling: {minReplicas: 0, slo: {target: 2s}, scaleToZero: {after: 30s}}\n"
            "  routing: {mode: inferencePool}\n",
            "spec.autoscaling.scaleToZero.after: 30s is not accepted; auto, or a duration from 1m to 24h",
        ),
        ("  autoscaling: {minReplicas: 0, enabled: false}\n", None),
        (
            "  autoscaling: {minReplicas: 0, slo: {target: 2s}, scaleToZero: {after: auto}}\n"
            "  routing: {mode: inferencePool}\n",
            None,
        ),
    ],
)
def test_the_api_server_and_the_operator_agree_on_what_scale_to_zero_accepts(
    cluster: Cluster, crd: None, namespace: str, spec: str, refused: str | None
) -> None:
    result = dry_run(cluster, namespace, spec)
    doc = {"apiVersion": "mmfleet.io/v1alpha1", "kind": "MultimodalInference", "metadata": {"name": "zero"}}
    doc["spec"] = {"model": {"name": "m"}, **yaml.safe_load(spec)}
    if refused is None:
        assert result.returncode == 0, result.stderr
        MultimodalInference.model_validate(doc)  # the operator serves what the API server admits
    else:
        assert result.returncode != 0, result.stdout
        assert refused in result.stderr, result.stderr
        with pytest.raises(ValidationError):
            MultimodalInference.model_validate(doc)
