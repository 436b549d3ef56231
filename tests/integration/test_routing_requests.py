"""Routing mode inferencePool routes requests: the real endpoint picker (EPP v1.5.0) with the configuration the
operator rendered, real model servers (the llm-d inference simulator, with vLLM's API and metric names) at the
fleet's pod IPs, and the lab's gateway stand-in doing Envoy's part over ext_proc (``mmfleet_lab/gateway/standin``).

The picker and the simulators bind every interface, so each runs in a network namespace of its own
(``mmfleet_lab.cluster.netns``): the picker and the stand-in in a gateway namespace whose 127.0.0.1 leads to the API
server's port, each simulator in a namespace holding its pod's IP. The test speaks HTTP to the stand-in's Unix socket.
"""

from __future__ import annotations

import contextlib
import http.client
import random
import re
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from mmfleet import dashboard
from mmfleet_lab.cluster import Cluster
from mmfleet_lab.cluster.collector import run_collector
from mmfleet_lab.cluster.netns import Network
from tests.helpers.chart import has_default_sa
from tests.helpers.fleet import Fleet, mmi
from tests.helpers.operator_process import OperatorProcess
from tests.helpers.routed import (
    NETNS_MARKS,
    POOL_API,
    RoutedPool,
    chat,
    data_url,
    listening,
    question,
    ready_pods,
    require_netns,
    sample,
    serve_pool,
)
from tests.helpers.wait import wait_for

pytestmark = NETNS_MARKS

FLEET = "routed"
REPLICAS = 3
# The fleet traces every request; its spans go to a collector the test runs (only the endpoint is the test's).
TRACING = {"enabled": True, "sampleRatio": 1.0, "endpoint": "http://collector.observability:4317"}
# Seconds after its server's death by which a replica gets no more requests: the detector's staleness threshold
# (200 ms) and a scrape (50 ms), with room for two busy cores.
STALE_WITHIN = 0.5
# The simulators log each request's headers (--log-http), where the trace context is looked for.
TRACEPARENT = re.compile(r"Traceparent: 00-([0-9a-f]{32})-([0-9a-f]{16})-0[01]")


@pytest.fixture(scope="module")
def routed(
    cluster: Cluster, api: Any, pool_operator: OperatorProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RoutedPool]:
    require_netns()
    core = client.CoreV1Api(api)
    namespace = f"it-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": namespace}})
    wait_for(lambda: has_default_sa(api, namespace), 30, f"namespace {namespace}'s default ServiceAccount")
    fleet = Fleet(api, namespace)
    logs = tmp_path_factory.mktemp("routing")
    try:
        fleet.create(mmi(FLEET, replicas=REPLICAS, routing={"mode": "inferencePool"}, tracing=TRACING))
        fleet.wait_condition(FLEET, "RoutingReady", status="True", timeout=90)
        selector = fleet.custom.get_namespaced_custom_object(*POOL_API, namespace, "inferencepools", FLEET)["spec"][
            "selector"
        ]["matchLabels"]
        pods = wait_for(lambda: ready_pods(fleet, selector, REPLICAS), 60, "the fleet's pods")
        picker = fleet.apps.read_namespaced_deployment(f"{FLEET}-epp", namespace).spec.template.spec.containers[0]
        rendered = {e.name: e.value for e in picker.env if e.value is not None}
        assert rendered["OTEL_EXPORTER_OTLP_ENDPOINT"] == TRACING["endpoint"]  # the rendered tracing settings
        with (
            run_collector(logs / "collector") as collector,
            serve_pool(cluster, fleet, FLEET, pods, logs, collector) as routed,
        ):
            yield routed
    finally:
        core.delete_namespace(namespace)


def _fill(routed: RoutedPool, request: dict[str, Any]) -> None:
    """A request left waiting in a server or in the picker; its end (an answer, or the network's removal) unread."""
    with contextlib.suppress(OSError, http.client.HTTPException):
        routed.post(request, routed.ttl + 90)


def _waiting(routed: RoutedPool, ip: str) -> float:
    """The requests waiting in the server at ``ip``, as it exports them to the picker."""
    waiting = sample(routed.server_metrics(ip), "vllm:num_requests_waiting")
    assert waiting is not None, f"no vllm:num_requests_waiting from {ip}"
    return waiting


# 127.0.0.1 and ::1 as /proc/net/tcp{,6} write them.
LOOPBACK = {"0100007F", "00000000000000000000000001000000"}


def _host_ports_beyond_loopback() -> set[int]:
    """Ports listened on, in this (the host's) network namespace, on an address other than loopback:
    /proc/net/tcp{,6}, state 0A."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, _, state = line.split()[1:4]
            address, port = local.rsplit(":", 1)
            if state == "0A" and address not in LOOPBACK:
                ports.add(int(port, 16))
    return ports


def test_the_picker_and_the_servers_listen_only_in_their_namespaces(routed: RoutedPool) -> None:
    served = {int(routed.flag("--port")), 9002, 9003, 9090}  # the servers' port, the picker's (options.go defaults)
    assert not served & _host_ports_beyond_loopback()
    assert all(listening(routed, ip) for ip in routed.sims)


def test_the_same_image_goes_to_the_same_replica(routed: RoutedPool) -> None:
    rng = random.Random(24)
    sessions = [(question(rng), data_url(rng)) for _ in range(4)]
    sessions += [(question(rng), f"http://images.example/{uuid.UUID(int=rng.getrandbits(128))}.png") for _ in range(4)]
    served: dict[int, list[str]] = {i: [] for i in range(len(sessions))}
    for _ in range(3):  # each session's request three times, the sessions interleaved
        for i, (text, image) in enumerate(sessions):
            answer = routed.post(chat(routed.model, text, image))
            assert answer.status == 200, answer.body
            served[i].append(answer.endpoint)
    assert all(len(set(endpoints)) == 1 for endpoints in served.values()), served
    # Not one replica for everything: each session's first request went where the picker's tie-break sent it.
    assert len({endpoints[0] for endpoints in served.values()}) > 1, served


def test_distinct_text_requests_spread_over_replicas(routed: RoutedPool) -> None:
    rng = random.Random(25)
    endpoints = []
    for _ in range(12):
        answer = routed.post(chat(routed.model, question(rng) + " Answer in one sentence."))
        assert answer.status == 200, answer.body
        endpoints.append(answer.endpoint)
    assert len(set(endpoints)) > 1, endpoints
    assert set(endpoints) <= {routed.endpoint(ip) for ip in routed.pods}


def test_the_dashboards_picker_series_are_the_real_pickers(routed: RoutedPool) -> None:
    """Every picker series the shipped dashboard's Routing row reads is in the real picker's /metrics once it has
    routed requests (a vector shows no series before its first label set)."""
    exprs = " ".join(expr for _, expr in dashboard.expressions(dashboard.dashboard()))
    wanted = set(re.findall(r"\b(inference_(?:extension|pool)_[a-z_]+)\{", exprs))
    assert len(wanted) >= 5, wanted
    exposed = routed.picker_metrics()
    missing = {name for name in wanted if not re.search(rf"^{name}[{{ ]", exposed, re.MULTILINE)}
    assert not missing, f"{missing} not in the picker's /metrics:\n{exposed[:3000]}"


def test_the_pickers_spans_reach_the_collector_and_the_server_continues_the_clients_trace(
    routed: RoutedPool,
) -> None:
    """With the fleet's tracing on, the picker (started with the rendered tracing settings) exports its spans to the
    collector under the rendered service name, and the model server gets a ``traceparent`` in the client's trace.
    The picker's own spans do not join that trace: EPP v1.5.0 starts them from the ext_proc stream's context
    (``pkg/epp/handlers/server.go:149``; its gRPC server propagates no trace context), so each request's
    ``gateway.request`` is a root (docs/routing.md says so; this notices a picker that changes it)."""
    assert routed.collector is not None
    collector = routed.collector
    client_trace = uuid.uuid4().hex
    sent = f"00-{client_trace}-{uuid.uuid4().hex[:16]}-01"
    answer = routed.post(chat(routed.model, question(random.Random(26))), headers={"traceparent": sent})
    assert answer.status == 200, answer.body
    log = routed.logs / f"sim-{answer.endpoint.rsplit(':', 1)[0]}.log"
    seen = wait_for(lambda: TRACEPARENT.findall(log.read_text(errors="replace")), 5, "a traceparent at the server")
    assert client_trace in {trace for trace, _ in seen}

    def picker_spans() -> list[dict[str, Any]]:
        return [x for x in collector.spans() if x["resource"].get("service.name") == f"{FLEET}-epp"]

    spans = wait_for(picker_spans, 30, lambda: f"the picker's spans at the collector\n{routed.why()}")
    assert {"gateway.request", "gateway.request_orchestration"} <= {x["name"] for x in spans}
    roots = [x for x in spans if x["name"] == "gateway.request"]
    assert all(not x.get("parentSpanId") for x in roots)
    assert client_trace not in {x["traceId"] for x in spans}


def test_a_replica_whose_server_dies_stops_receiving_requests(routed: RoutedPool) -> None:
    """Its server killed, its pod still Ready (the kubelet's probe has not noticed yet): the picker stops choosing
    it once its metrics go stale (the utilization detector, a filter of the rendered profile, drops endpoints whose
    metrics are older than 200 ms: saturationdetector/utilization/detector.go:142-168, config.go), so within a few
    of its 50 ms scrapes; requests from then on are served by the others."""
    dead = sorted(routed.pods)[-1]
    Network.stop(routed.sims.pop(dead))
    killed = time.monotonic()
    rng = random.Random(27)
    answers = []
    while time.monotonic() - killed < 3:
        answers.append((time.monotonic() - killed, routed.post(chat(routed.model, question(rng)))))
    late = [(round(t, 3), a.status) for t, a in answers if a.endpoint == routed.endpoint(dead)]
    assert all(t < STALE_WITHIN for t, _ in late), late
    served = [a for t, a in answers if t >= STALE_WITHIN]
    assert len(served) > 10 and all(a.status == 200 for a in served), [(a.status, a.body[:200]) for a in served]
    # Then what the kubelet does: the pod not Ready, so it leaves the pool (and the next test's saturation).
    pod = routed.fleet.core.read_namespaced_pod_status(routed.pods[dead], routed.fleet.namespace)
    conditions = [
        {"type": c.type, "status": "False" if c.type in ("Ready", "ContainersReady") else c.status}
        for c in pod.status.conditions
    ]
    routed.fleet.core.patch_namespaced_pod_status(
        routed.pods[dead], routed.fleet.namespace, {"status": {"conditions": conditions}}
    )


def test_a_saturated_pool_holds_requests_then_answers_with_the_pickers_status(routed: RoutedPool) -> None:
    """Every replica busy (one request at a time, a minute to its first token): requests queue in the servers until
    each has the rendered queue depth waiting, the pool is saturated, and the picker's flow control holds the next
    request for the rendered TTL, then answers 503 itself (requestcontrol/admission.go:212-233)."""
    live = [ip for ip in routed.pods if ip in routed.sims]
    for ip in live:
        routed.start_sim(ip, "--max-num-seqs", "1", "--time-to-first-token", "60s")
    wait_for(lambda: all(listening(routed, ip) for ip in live), 30, "the slowed servers")
    config = yaml.safe_load((routed.logs / "config.yaml").read_text())
    depth = next(
        p["parameters"]["queueDepthThreshold"] for p in config["plugins"] if p["type"] == "utilization-detector"
    )
    rng = random.Random(28)
    # Fill until the servers' queues average the depth, the detector's rule (utilization/detector.go:106-136): paced
    # by what the servers report, not by a sleep a busy machine may outrun. Past it the picker holds what comes.
    sent = 0
    while (waiting := [_waiting(routed, ip) for ip in live]) and statistics.fmean(waiting) < depth:
        assert sent < 3 * len(live) * (depth + 2), (sent, waiting, routed.why())
        threading.Thread(target=_fill, args=(routed, chat(routed.model, question(rng))), daemon=True).start()
        sent += 1
        time.sleep(0.15)  # the picker sees each server's queue grow (it scrapes every 50 ms)
    time.sleep(0.5)  # and then the last of it
    held = routed.post(chat(routed.model, question(rng)), timeout=routed.ttl + 30)
    assert held.status == 503, (held, routed.why())
    assert held.body.startswith("inference error: ServiceUnavailable - request timed out in queue"), held.body
    assert routed.ttl - 1 <= held.seconds <= routed.ttl + 10, held.seconds
