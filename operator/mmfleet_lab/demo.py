"""``mmfleet demo``: the main job on the embedded default, from nothing to a fleet riding a spike.

A local control plane (built on first use) with Prometheus, the CRD, the operator as its own
process, the examples that can run on kwok GPU nodes, then a traffic spike served by the digital
twin (``mmfleet twin serve``) while the operator scales the autoscaled example: replicas and P90
against the target live on the terminal, and a PNG of the run at the end. The real OpenTelemetry
Collector (``cluster.collector``) runs beside them on 127.0.0.1 and writes every span it receives to a
file: the operator's (each reconcile and scale decision) and the twin's request spans, so the end of the
run can say where the spike's spans landed and show its slowest request and the decisions it caused.
The cluster, the collector included, stays up afterwards so the user can explore it with kubectl.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from mmfleet import crd, telemetry
from mmfleet.api import GROUP, PLURAL, VERSION
from mmfleet_lab import spike
from mmfleet_lab.cluster import Cluster, NodePool, attach, ensure_binaries, up
from mmfleet_lab.cluster import collector as otelcol
from mmfleet_lab.cluster.crds import wait_established
from mmfleet_lab.cluster.kubectl import kubectl, run_kubectl
from mmfleet_lab.twin import spans as twin_spans
from mmfleet_lab.twin.serve import Spike

CLUSTER = "mmfleet"
NAMESPACE = "ml"
# Examples whose nodes the demo cluster has; internvl-ack needs a storage provisioner for its PVC cache.
EXAMPLES = ("qwen-vl-eks.yaml", "llama-vision-trtllm-aks.yaml", "minimal.yaml")
SECRETS = ("hf-token",)
POD_READY_DELAY = "8s"
SCRAPE_INTERVAL = "2s"  # Prometheus'; the demo's 20 s SLO window needs several scrapes in it
# GPU nodes labelled as each example's cloud labels them, so every example lands on its own pool.
POOLS = (
    NodePool(cloud="eks", gpu_type="H100", count=2),
    NodePool(cloud="aks", gpu_type="A100", count=2),
    NodePool(cloud="ack", gpu_type="H20", count=1),
)
WAIT_SECONDS = 180
# The spike: the autoscaled example at 4 req/s, five times that for 90 s, then back, with a short scale-down delay;
# tests/e2e/test_spike.py and test_argocd.py play the same. The twin's ServeGen mix has long answers: one H100
# replica's e2e P90 over 20 s windows, as Prometheus interpolates it in vLLM's 2.5-5 s bucket, reaches 4.2 s at
# 4 req/s and 4.1 s at 2 req/s (seeds 0-19), so a 3 s target broke at base load (CI, 2026-12-06). 5 s is that
# bucket's edge; under it one replica holds about 11 req/s (capacity_at_slo). The example says 2 s over 60 s.
SCALED = "qwen-vl"
BASE_RATE = 4.0
SPIKE = Spike(start=100.0, end=190.0, factor=5.0)
DEMO_SLO = {"metric": "e2e", "percentile": 90, "target": "5s", "window": "20s"}
DEMO_AUTOSCALING = {"scaleDownDelay": "45s", "slo": DEMO_SLO}
# Past the spike's end, its 45 s scale-down delay and the two minutes between scale-down steps (policy.DOWN_PAUSE): the
# first step often frees one replica while the rate window still reads the spike's tail, the second the rest.
SPIKE_SECONDS = 420
AUTOSCALE_INTERVAL = "5s"
# The SDK's batch span processors send every 5 s (OTEL_BSP_SCHEDULE_DELAY) and the collector's file exporter
# flushes every second: after this wait the file holds the spans of the run's last sample.
SPAN_FLUSH_SECONDS = 7.0


def _say(line: str) -> None:
    print(line, flush=True)


def _examples_dir() -> Path:
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "examples" / EXAMPLES[0]).exists():
            return parent / "examples"
    raise FileNotFoundError("examples/ not found next to the mmfleet source tree")


def examples_policy(namespace: str = NAMESPACE) -> str:
    """``examples/admin/policy.yaml``'s policy (what the examples may name), as ``MMFLEET_POLICY`` takes it, with its
    per-namespace grants moved to ``namespace`` (a glob: the tests make a namespace per fleet)."""
    policy: dict[str, Any] = yaml.safe_load((_examples_dir() / "admin" / "policy.yaml").read_text())["policy"]
    for setting in ("secrets", "claims", "identities"):
        policy[setting] = [f"{namespace}/{grant.partition('/')[2]}" for grant in policy.get(setting, [])]
    if policy.get("warmStandbyNamespaces"):
        policy["warmStandbyNamespaces"] = [namespace]
    return json.dumps(policy)


def _start_collector(cluster: Cluster) -> otelcol.RunningCollector:
    """The collector (built once into the cache, as ``make binaries`` builds it), recorded with the cluster so
    that ``mmfleet cluster down`` stops it with the operator and the twin that keep sending to it."""
    running = otelcol.start_collector(cluster.state_dir / "collector", progress=lambda line: _say(f"   {line}"))
    attach(cluster.name, otelcol.COMPONENT, running.proc.pid, running.log)
    return running


def _start_operator(cluster: Cluster, otlp_endpoint: str) -> int:
    """``mmfleet run`` as its own process; its spans go to ``otlp_endpoint`` whatever the shell's OTEL_* say."""
    log = cluster.logs_dir / "operator.log"
    env = {
        **{key: value for key, value in os.environ.items() if not key.startswith("OTEL_")},
        "KUBECONFIG": str(cluster.kubeconfig),
        "MMFLEET_PROMETHEUS_URL": cluster.prometheus_url or "",
        "MMFLEET_AUTOSCALE_INTERVAL": AUTOSCALE_INTERVAL,
        "MMFLEET_POLICY": examples_policy(),
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_endpoint,
        "OTEL_SERVICE_NAME": telemetry.SERVICE_NAME,
    }
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mmfleet.cli", "run", "--health-address", "", "--metrics-address", ""],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    attach(cluster.name, "operator", proc.pid)
    return proc.pid


def _table(items: list[dict[str, Any]]) -> list[str]:
    rows = [("NAME", "BACKEND", "PHASE", "READY", "MESSAGE")]
    for item in items:
        status = item.get("status") or {}
        conditions: dict[str, dict[str, Any]] = {c["type"]: c for c in status.get("conditions", [])}
        ready, degraded = conditions.get("Ready", {}), conditions.get("Degraded", {})
        message = degraded.get("message") if degraded.get("status") == "True" else ready.get("message", "")
        rows.append(
            (
                item["metadata"]["name"],
                status.get("backend", ""),
                status.get("phase", "Pending"),
                f"{status.get('readyReplicas', 0)}/{status.get('desiredReplicas', '?')}",
                (message or "")[:70],
            )
        )
    widths = [max(len(str(row[i])) for row in rows) for i in range(5)]
    return ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]


def run_demo() -> int:
    _say("== 1/6 local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok GPU nodes)")
    cluster = up(
        CLUSTER, pod_ready_delay=POD_READY_DELAY, nodes=POOLS, scrape_interval=SCRAPE_INTERVAL,
        progress=lambda line: _say(f"   {line}"),
    )  # fmt: skip
    kubeconfig = cluster.kubeconfig
    _say(kubectl(kubeconfig, "get", "nodes", "-L", "node.kubernetes.io/instance-type,nvidia.com/gpu.product"))

    _say("== 2/6 the MultimodalInference CRD (generated from the pydantic models)")
    _say("   " + kubectl(kubeconfig, "apply", "--server-side", "-f", "-", stdin=crd.crd_yaml()).strip())
    wait_established(cluster.api_client(), "multimodalinferences.mmfleet.io")

    _say("== 3/6 the OpenTelemetry Collector on 127.0.0.1 (OTLP in, its file exporter out)")
    collector = _start_collector(cluster)
    _say(f"   pid {collector.proc.pid}, OTLP/gRPC {collector.endpoint}, spans to {collector.output}")

    _say("== 4/6 the operator (mmfleet run), logging to " + str(cluster.logs_dir / "operator.log"))
    _say(f"   pid {_start_operator(cluster, collector.endpoint)}, its spans to the collector")

    _say(f"== 5/6 examples into namespace {NAMESPACE}: {', '.join(EXAMPLES)}")
    run_kubectl(kubeconfig, "create", "namespace", NAMESPACE)  # already there on a second run
    for secret in SECRETS:  # the examples read model credentials; kwok never starts the container
        run_kubectl(kubeconfig, "-n", NAMESPACE, "create", "secret", "generic", secret, "--from-literal=HF_TOKEN=demo")
    for example in EXAMPLES:
        _say("   " + kubectl(kubeconfig, "-n", NAMESPACE, "apply", "-f", str(_examples_dir() / example)).strip())

    from kubernetes import client

    custom = client.CustomObjectsApi(cluster.api_client())
    deadline = time.monotonic() + WAIT_SECONDS
    last: list[str] = []
    while time.monotonic() < deadline:
        items = custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)["items"]
        table = _table(items)
        if table != last:
            _say(f"-- {time.strftime('%H:%M:%S')}")
            _say("\n".join(table))
            last = table
        if items and all((i.get("status") or {}).get("phase") == "Ready" for i in items):
            break
        time.sleep(2)
    else:
        _say(f"not every fleet was Ready within {WAIT_SECONDS}s; see {cluster.logs_dir / 'operator.log'}")
        return 1

    _say("\n" + kubectl(kubeconfig, "-n", NAMESPACE, "get", "mmi,deployments,pods,services"))
    code = _play_spike(cluster, collector)
    _say("The cluster stays up (the twin keeps serving the base rate, the collector writing spans); explore it with:")
    for env in cluster.env_line().splitlines():
        _say(f"   {env}")
    _say(f"   {ensure_binaries().kubectl} get mmi -n {NAMESPACE} -w")
    _say(f"   {ensure_binaries().kubectl} explain mmi.spec.autoscaling.slo")
    _say(f"   curl -s '{cluster.prometheus_url}/api/v1/query?query=vllm:num_requests_running'")
    _say(f"   less {collector.output}   (the spans, one OTLP JSON request a line; grep a trace id)")
    _say("Stop everything (control plane, Prometheus, operator, twin, collector) with:  .venv/bin/mmfleet cluster down")
    return code


def _play_spike(cluster: Cluster, collector: otelcol.RunningCollector) -> int:
    """The twin serves every fleet; the autoscaled one meets a spike while we watch; then where its spans went."""
    _say(f"== 6/6 a traffic spike on {NAMESPACE}/{SCALED}: {BASE_RATE:g} req/s, x{SPIKE.factor:g} from "
         f"{SPIKE.start:g}s to {SPIKE.end:g}s (mmfleet twin serve, the digital twin, serves the pods)")  # fmt: skip
    tracing = json.loads(
        kubectl(cluster.kubeconfig, "-n", NAMESPACE, "get", "mmi", SCALED, "-o", "jsonpath={.spec.tracing}") or "{}"
    )
    changes: dict[str, Any] = {"autoscaling": DEMO_AUTOSCALING}
    if not tracing.get("enabled"):  # the spans are half the show; turning them on rolls the pods once
        changes["tracing"] = {"enabled": True}
    patch = json.dumps({"spec": changes}, separators=(",", ":"))
    kubectl(cluster.kubeconfig, "-n", NAMESPACE, "patch", "mmi", SCALED, "--type", "merge", "-p", patch)
    why = "the demo's SLO and scale-down delay" + ("" if tracing.get("enabled") else ", and tracing on")
    _say(f"   kubectl patch mmi {SCALED} --type merge -p '{patch}'   ({why})")
    ratio = tracing.get("sampleRatio", "the default")
    _say(f"   its pods' request spans (sample ratio {ratio}, spec.tracing) go to the collector, as the operator's do")
    twin = spike.Twin(
        cluster,
        BASE_RATE,
        (SPIKE,),
        cluster.logs_dir / "twin.log",
        _examples_dir().parent / "tests" / "data",
        otlp_endpoint=collector.endpoint,
    )
    _say(f"   twin pid {twin.proc.pid}, log {cluster.logs_dir / 'twin.log'}; Prometheus {cluster.prometheus_url}")
    samples: list[spike.Sample] = []
    for sample in spike.follow(cluster, NAMESPACE, SCALED, twin.started):
        samples.append(sample)
        for event in sample.events:
            _say(f"   event: {event}")
        if len(samples) % 3 == 1 or sample.events:
            _say("   " + spike.line(sample, (SPIKE,)))
        if sample.t >= SPIKE_SECONDS:
            break
    png = cluster.logs_dir.parent / "demo-spike.png"
    spike.plot(samples, (SPIKE,), f"{NAMESPACE}/{SCALED} through a x{SPIKE.factor:g} spike", png)
    peak = max(s.replicas for s in samples)
    over = [s for s in samples if s.latency is not None and s.latency > s.target]
    _say(f"   replicas: {samples[0].replicas} -> {peak} at the peak -> {samples[-1].replicas} at the end; "
         f"P90 over target in {len(over)} of {len(samples)} samples; plot: {png}")  # fmt: skip
    time.sleep(SPAN_FLUSH_SECONDS)  # the operator's and the twin's last batches, then the file exporter's flush
    ready = _condition(cluster.kubeconfig, "TracingReady")
    _say(
        "\n".join(span_summary(otelcol.read_spans(collector.output), collector.output, NAMESPACE, SCALED, twin.started))
    )
    if ready:
        said = f"{ready.get('status')} {ready.get('reason')}: {ready.get('message')}"
        _say(f"   TracingReady of {NAMESPACE}/{SCALED}: {said}")
        _say("   (the pods here are kwok's, so the twin sends their spans to the collector on 127.0.0.1 itself)")
    return 0


def _condition(kubeconfig: Path, kind: str) -> dict[str, Any]:
    found = run_kubectl(kubeconfig, "-n", NAMESPACE, "get", "mmi", SCALED, "-o", "json")
    conditions = (json.loads(found.stdout or "{}").get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), {})


# What the summary calls the operator's spans, by span name.
OPERATOR_SPANS = (
    (telemetry.RECONCILE, "reconcile"),
    (telemetry.APPLY, "apply"),
    (telemetry.STATUS_WRITE, "status write"),
    (telemetry.AUTOSCALE_CYCLE, "autoscaling cycle"),
    (telemetry.OBSERVE, "Prometheus read"),
    (telemetry.DECIDE, "scale decision"),
)
MAX_DECISIONS = 12


def _seconds(span: dict[str, Any]) -> float:
    return (int(span["endTimeUnixNano"]) - int(span["startTimeUnixNano"])) / 1e9


def _at(span: dict[str, Any], started: float) -> float:
    """The span's start in seconds since the twin started, the clock of the spike's lines."""
    return int(span["startTimeUnixNano"]) / 1e9 - started


def span_summary(spans: list[dict[str, Any]], output: Path, namespace: str, name: str, started: float) -> list[str]:
    """Where the spans landed, counted by kind, then the fleet's slowest request's trace, phase by phase, and the
    operator's scale decisions for the fleet with what they were decided on: what a user would look up in the
    tracing service after a spike, read from the collector's file (``collector.read_spans``).

    ``started`` (epoch seconds) is the twin's start, so times read like the spike's ``t=`` lines.
    """
    lines = [f"== where the spans landed: {output}", f"   {len(spans)} spans from the collector on 127.0.0.1"]
    by_name = Counter(str(s.get("name", "")) for s in spans)
    operator = ", ".join(f"{label} {by_name[span]}" for span, label in OPERATOR_SPANS)
    decisions = [s for s in spans if s.get("name") == telemetry.DECIDE]
    fleet = [s for s in decisions if _is_fleet(otelcol.attributes(s.get("attributes", [])), namespace, name)]
    scaled = [s for s in fleet if otelcol.attributes(s.get("attributes", [])).get(telemetry.SCALED)]
    lines.append(
        f"   operator spans (service {telemetry.SERVICE_NAME}): {operator}, {len(scaled)} of them scaling {name}"
    )
    requests = [s for s in spans if s.get("name") == twin_spans.REQUEST_SPAN]
    ours = [s for s in requests if _is_fleet(s["resource"], namespace, name)]
    phases = sum(by_name[phase] for phase in twin_spans.PHASES)
    lines.append(
        f"   request spans (mmfleet twin serve, as the pods' servers send them): {twin_spans.REQUEST_SPAN} "
        f"{len(requests)}, {len(ours)} of them {namespace}/{name}'s, and {phases} phase spans under them"
    )
    if ours:
        lines += _slowest(ours, spans, namespace, name, started)
    else:
        lines.append(f"   no request span of {namespace}/{name} yet (does its spec turn tracing on?)")
    observations = {(s.get("traceId"), s.get("spanId")): s for s in spans if s.get("name") == telemetry.OBSERVE}
    lines.append(f"   scale decisions of {namespace}/{name} ({telemetry.DECIDE} spans with {telemetry.SCALED} true):")
    for span in sorted(scaled, key=lambda s: int(s["startTimeUnixNano"]))[:MAX_DECISIONS]:
        lines += [f"      {line}" for line in _decision(span, observations, started)]
    if len(scaled) > MAX_DECISIONS:
        lines.append(f"      ... and {len(scaled) - MAX_DECISIONS} more")
    if not scaled:
        lines.append("      none")
    return lines


def _is_fleet(attributes: dict[str, Any], namespace: str, name: str) -> bool:
    return attributes.get(telemetry.NAMESPACE) == namespace and attributes.get(telemetry.INFERENCE) == name


def _slowest(
    ours: list[dict[str, Any]], spans: list[dict[str, Any]], namespace: str, name: str, started: float
) -> list[str]:
    """The slowest request's trace: its span, then each phase with its duration."""
    slowest = max(ours, key=_seconds)
    resource, tokens = slowest["resource"], otelcol.attributes(slowest.get("attributes", []))
    lines = [
        f"   slowest request of {namespace}/{name}: {_seconds(slowest):.2f} s end to end, arrived at "
        f"t={_at(slowest, started):.0f}s, {tokens.get(twin_spans.PROMPT_TOKENS, '?')} prompt and "
        f"{tokens.get(twin_spans.COMPLETION_TOKENS, '?')} output tokens, pod {resource.get('k8s.pod.name', '?')}, "
        f"trace {slowest.get('traceId')}"
    ]
    children = [
        s
        for s in spans
        if s.get("traceId") == slowest.get("traceId") and s.get("parentSpanId") == slowest.get("spanId")
    ]
    total = _seconds(slowest) or 1.0
    for phase in sorted(children, key=lambda s: int(s["startTimeUnixNano"])):
        share = _seconds(phase) / total
        lines.append(f"      {phase.get('name', ''):8} {_seconds(phase):7.2f} s  {'#' * round(share * 40)}")
    return lines


def _decision(span: dict[str, Any], observations: dict[tuple[Any, Any], dict[str, Any]], started: float) -> list[str]:
    """One scale decision: when, from how many replicas to how many, on what signals and which Prometheus read
    (its link), then the policy's reason in full on a line of its own."""
    attributes = otelcol.attributes(span.get("attributes", []))
    before, after = attributes.get(telemetry.REPLICAS_BEFORE), attributes.get(telemetry.REPLICAS_AFTER)
    latency, rate = attributes.get(telemetry.LATENCY), attributes.get(telemetry.REQUEST_RATE)
    signals = ", ".join(
        text
        for text in (
            None if latency is None else f"P{attributes.get(telemetry.SLO_PERCENTILE, '')} {float(latency):.2f} s",
            None if rate is None else f"{float(rate):.1f} req/s",
        )
        if text
    )
    read = next((observations.get((link.get("traceId"), link.get("spanId"))) for link in span.get("links", [])), None)
    linked = "" if read is None else f", linked to the Prometheus read {read.get('spanId')}"
    return [
        f"t={_at(span, started):5.0f}s  {before} -> {after} replicas on {signals or 'no signal'}{linked}",
        f"         {attributes.get(telemetry.REASON, '')}",
    ]
