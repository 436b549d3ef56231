"""Generated hostile specs through kube-apiserver 1.34 and the running operator (``mmfleet_lab.fuzz``): what the API
server accepts, the operator serves or refuses naming the field; what it refuses, it refuses naming the field; nothing
crashes, hangs, loops or sticks.

The dry run sends ``MMFLEET_FUZZ_COUNT`` specs (default 1,200, seeded by ``MMFLEET_FUZZ_SEED``, default 13) and the 5
YAML attacks; the live leg creates ``MMFLEET_FUZZ_LIVE`` of the accepted ones (default 60, spread over the run; ``all``
for every one) for real under ``mmfleet run``, updates every ``fuzz.UPDATE_EVERY``-th once answered to another accepted
spec and the next one right after its creation, and plants ``fuzz.UPDATE_SHAPES`` (valid to invalid and back,
autoscaling on and off, vLLM to TensorRT-LLM, an update the API server refuses). ``MMFLEET_FUZZ_REPORT=path`` writes the
counts and a sample of each failure with its spec as JSON. ``mmfleet bench fuzz`` runs the same legs on a cluster of its
own and writes the table in ``docs/reliability.md``.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from mmfleet_lab import fuzz
from mmfleet_lab.cluster import Cluster
from mmfleet_lab.cluster.process import free_port
from tests.helpers.operator_process import OperatorProcess
from tests.helpers.wait import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("settled_pod_monitor_crd")]

# The released CRDs of the optional child kinds are served while this module runs (``pod_monitor_crd``: the Prometheus
# Operator's PodMonitor; ``routing_crds``: InferencePool and HTTPRoute), so that the operator renders those children as
# it would with the CRDs installed, and the API server validates them too.
SEED = int(os.environ.get("MMFLEET_FUZZ_SEED", "13"))
COUNT = int(os.environ.get("MMFLEET_FUZZ_COUNT", "1200"))  # half from the schema, half mutations of the examples
LIVE = os.environ.get("MMFLEET_FUZZ_LIVE", "60")


@pytest.fixture(scope="module")
def fuzz_namespace(api: Any) -> Iterator[str]:
    """The dry run's namespace, enforcing Pod Security "restricted", with its default ServiceAccount."""
    core = client.CoreV1Api(api)
    name = f"it-fuzz-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name, "labels": fuzz.RESTRICTED}})
    wait_for(lambda: core.list_namespaced_service_account(name).items, 30, "the default ServiceAccount")
    yield name
    core.delete_namespace(name)


@pytest.fixture(scope="module")
def dry_run(
    cluster: Cluster,
    api: Any,
    crd: None,
    pod_monitor_crd: None,
    routing_crds: None,
    fuzz_namespace: str,
    tmp_path_factory: Any,
) -> tuple[fuzz.Tally, list[dict[str, Any]]]:
    tally, started = fuzz.Tally(), time.monotonic()
    accepted = fuzz.dry_run(api, fuzz_namespace, fuzz.generated(COUNT, SEED), tally)
    fuzz.yaml_attacks(cluster.kubeconfig, tmp_path_factory.mktemp("yaml"), tally)
    tally.counts["seconds"] = round(time.monotonic() - started)
    return tally, accepted


def _report(tally: fuzz.Tally, leg: str) -> None:
    print(json.dumps(dict(tally.counts), indent=1))
    if os.environ.get("MMFLEET_FUZZ_REPORT"):
        path = Path(os.environ["MMFLEET_FUZZ_REPORT"])
        report = {"seed": SEED, "counts": dict(tally.counts), "failures": tally.failures, "kubectl": tally.yaml}
        path.with_name(f"{path.stem}-{leg}{path.suffix}").write_text(json.dumps(report, indent=1, default=str))


def test_generated_specs_are_served_or_refused_naming_the_field(dry_run: tuple[fuzz.Tally, Any]) -> None:
    tally, _ = dry_run
    _report(tally, "dry-run")
    assert tally.counts["specs"] >= 1000
    assert tally.counts["accepted, every child accepted"] >= 100, "too few specs got past the CRD to test the operator"
    assert tally.failures == {}, json.dumps(tally.failures, indent=1, default=str)[:20000]


def test_the_running_operator_serves_or_refuses_each_accepted_spec_naming_the_field(
    cluster: Cluster,
    api: Any,
    operator: OperatorProcess,
    dry_run: tuple[fuzz.Tally, Any],
    fuzz_namespace: str,
    tmp_path: Path,
) -> None:
    """Each accepted spec, created for real in a namespace enforcing "restricted", and of every three one updated to
    another once answered, one right after its creation: within ``fuzz.BOUND`` a status for the generation that serves
    it (a Deployment rendered from that generation's spec, pods admitted) or refuses it naming the field; the planted
    update shapes as planned (among them a refusal, and a refused fleet served once fixed); the operator neither exits,
    logs a traceback, repeats a failure in a loop nor fails /healthz; deletions complete."""
    _, accepted = dry_run
    size = len(accepted) if LIVE == "all" else min(int(LIVE), len(accepted))
    sample = accepted[:: max(1, len(accepted) // size)][:size]  # spread over schema draws and example mutations
    planned = fuzz.plans(sample, SEED)
    shapes = [
        (body, expected)
        for plan in fuzz.UPDATE_SHAPES
        for body, expected in zip((plan.body, plan.update), plan.expect, strict=True)
        if body is not None
    ]
    accepted_shapes = fuzz.dry_run(api, fuzz_namespace, [body for body, _ in shapes], fuzz.Tally())
    assert len(accepted_shapes) == sum(expected != fuzz.API_REFUSED for _, expected in shapes)
    health = f"127.0.0.1:{free_port()}"
    process = OperatorProcess(
        cluster.kubeconfig,
        tmp_path / "operator.log",
        env={"MMFLEET_PROMETHEUS_URL": cluster.prometheus_url, "MMFLEET_POLICY": fuzz.OPEN_POLICY},
        health_address=health,
    )
    url = f"http://{health}/healthz"
    tally, started = fuzz.Tally(), time.monotonic()
    operator.stop()  # one operator acts on the fleets: this one, whose log and /healthz are watched
    try:
        process.start()
        wait_for(lambda: fuzz.healthy(url), 60, f"the operator's /healthz ({process.tail()})")
        running = fuzz.Running(lambda: process.proc.poll() if process.proc else None, process.log, url)
        fuzz.live(api, planned, running, tally, lambda line: print(line, flush=True))
    finally:
        process.stop()
        operator.start()
    tally.counts["seconds"] = round(time.monotonic() - started)
    _report(tally, "live")
    assert tally.failures == {}, json.dumps(tally.failures, indent=1, default=str)[:20000] + process.tail()
    shapes_count = len(fuzz.UPDATE_SHAPES)
    racing = sum(plan.racing for plan in planned)
    assert tally.counts["live"] == len(planned) == size + shapes_count
    assert tally.counts["live: served"] + tally.counts["live: refused naming the field"] == len(planned) - racing
    assert tally.counts["live: refused naming the field"] >= 1  # the planted spec, at least
    updates = sum(plan.update is not None for plan in planned)
    assert updates >= 2 * (size // fuzz.UPDATE_EVERY) + shapes_count
    sent = ("updates", "updates refused by the API server", "updates that changed nothing")
    assert sum(tally.counts[k] for k in sent) == updates
    assert tally.counts["updates racing the creation"] == racing >= size // fuzz.UPDATE_EVERY
    assert tally.counts["update: served"] + tally.counts["update: refused naming the field"] == tally.counts["updates"]
    assert tally.counts["update shapes as planned"] == shapes_count
    # only the planted one: a random update is a spec the API server accepted on create, and the CRD has no oldSelf
    assert tally.counts["updates refused by the API server"] == sum(p.expect[1] == fuzz.API_REFUSED for p in planned)
