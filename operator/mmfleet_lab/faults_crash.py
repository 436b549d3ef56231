"""Crash mid-reconcile: SIGKILL the operator at random moments while fleets change, then audit.

Each trial applies a burst of random operations (create, update, scale, delete) to a small set of
fleets, SIGKILLs the operator at a random moment inside the burst, restarts it, and times how long
until the namespace is converged. ``audit`` says what a converged namespace is not allowed to hold:
lost children (a fleet without one of the kinds every fleet has), orphaned children (their fleet is
gone), duplicated children (two of a kind for one fleet), adopted children (controlled by another
fleet or by nothing), wrong status (observedGeneration behind, or Ready not matching the Deployment),
stuck deletions (deletionTimestamp set, still there). The API-fault runner (``faults_api``) uses it too.
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmfleet.api import GROUP, VERSION
from mmfleet.render import INFERENCE_LABEL

MODELS = ("Qwen/Qwen2.5-VL-3B-Instruct", "Qwen/Qwen2.5-VL-7B-Instruct")
CHILD_KINDS = ("deployments", "services", "serviceaccounts", "configmaps", "networkpolicies", "poddisruptionbudgets")
# What render.render builds for every fleet (a ConfigMap only when the backend writes files, a PodMonitor only with
# the Prometheus Operator's CRDs): a live fleet without one of these has lost it.
EVERY_FLEET_HAS = ("deployments", "services", "serviceaccounts", "networkpolicies", "poddisruptionbudgets")


@dataclass(frozen=True)
class Audit:
    lost: int = 0
    orphaned: int = 0
    duplicated: int = 0
    adopted: int = 0
    status_wrong: int = 0
    stuck_deletions: int = 0
    problems: tuple[str, ...] = ()

    @property
    def clean(self) -> bool:
        return not self.problems


def percentile(values: Iterable[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (the 99th of 100 ordered for 0.99); NaN for none."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


@dataclass
class Report:
    kills: int = 0
    converge_seconds: list[float] = field(default_factory=list)
    worst: Audit = field(default_factory=Audit)  # the audit of a trial that did not converge, if any
    unconverged: int = 0

    def percentile(self, q: float) -> float:
        return percentile(self.converge_seconds, q)

    def row(self) -> list[object]:
        w = self.worst
        return [
            self.kills,
            self.unconverged,
            w.lost,
            w.orphaned,
            w.duplicated,
            w.adopted,
            w.status_wrong,
            w.stuck_deletions,
            f"{self.percentile(0.5):.1f}",
            f"{self.percentile(0.99):.1f}",
            f"{statistics.fmean(self.converge_seconds):.1f}" if self.converge_seconds else "nan",
        ]


HEADERS = [
    "kills",
    "not converged",
    "lost",
    "orphaned",
    "duplicated",
    "adopted",
    "status wrong",
    "stuck deletions",
    "converge p50 s",
    "converge p99 s",
    "mean s",
]


def _controller(obj: dict[str, Any]) -> dict[str, Any] | None:
    return next((r for r in obj["metadata"].get("ownerReferences") or [] if r.get("controller")), None)


def audit(fleets: Iterable[dict[str, Any]], children: dict[str, list[dict[str, Any]]]) -> Audit:
    """What a converged namespace may not hold, from the fleets and their labelled children as listed."""
    fleets = list(fleets)
    by_uid = {f["metadata"]["uid"]: f for f in fleets}
    live = {f["metadata"]["name"]: f for f in fleets if not f["metadata"].get("deletionTimestamp")}
    problems: list[str] = []
    counts: Counter[str] = Counter()

    def found(kind: str, text: str) -> None:
        counts[kind] += 1
        problems.append(f"{kind}: {text}")

    deployments: dict[str, dict[str, Any]] = {}
    for kind, objects in children.items():
        per_fleet: Counter[str] = Counter()
        for obj in objects:
            meta = obj["metadata"]
            name = f"{kind}/{meta['name']}"
            fleet_name = meta["labels"][INFERENCE_LABEL]
            if meta.get("deletionTimestamp"):
                found("stuck_deletions", name)
                continue
            owner = _controller(obj)
            if owner is None or owner["uid"] not in by_uid:
                found("orphaned", f"{name} (controller {owner and owner['uid']})")
            elif by_uid[owner["uid"]]["metadata"]["name"] != fleet_name:
                found("adopted", f"{name} of {fleet_name} controlled by {by_uid[owner['uid']]['metadata']['name']}")
            per_fleet[fleet_name] += 1
            if kind == "deployments":
                deployments[fleet_name] = obj
        for fleet_name, n in per_fleet.items():
            if n > 1:
                found("duplicated", f"{n} {kind} for {fleet_name}")
        if kind in EVERY_FLEET_HAS:
            for fleet_name in live.keys() - per_fleet.keys():
                found("lost", f"{fleet_name} has no {kind}")
    for fleet in fleets:
        meta = fleet["metadata"]
        if meta.get("deletionTimestamp"):
            found("stuck_deletions", f"fleet {meta['name']}")
    for name, fleet in live.items():
        status, spec = fleet.get("status") or {}, fleet["spec"]
        deployment = deployments.get(name)
        ready_pods = ((deployment or {}).get("status") or {}).get("readyReplicas") or 0
        want = spec.get("replicas", 1)
        if status.get("observedGeneration") != fleet["metadata"]["generation"]:
            found(
                "status_wrong",
                f"{name} observedGeneration {status.get('observedGeneration')} "
                f"!= generation {fleet['metadata']['generation']}",
            )
        elif deployment is None or deployment["spec"].get("replicas") != want:
            found(
                "status_wrong",
                f"{name} Deployment replicas {deployment and deployment['spec'].get('replicas')} != spec {want}",
            )
        elif (status.get("phase") == "Ready") != (ready_pods == want) or status.get("readyReplicas", 0) != ready_pods:
            found(
                "status_wrong",
                f"{name} phase {status.get('phase')} readyReplicas {status.get('readyReplicas')}"
                f" with {ready_pods}/{want} Ready pods",
            )
        elif status.get("phase") != "Ready":
            problems.append(f"not yet Ready: {name}")  # converging, not wrong
    return Audit(
        counts["lost"],
        counts["orphaned"],
        counts["duplicated"],
        counts["adopted"],
        counts["status_wrong"],
        counts["stuck_deletions"],
        tuple(problems),
    )


class Namespace:
    """The fleets of one namespace through the official client."""

    def __init__(self, api: Any, namespace: str) -> None:
        from mmfleet_lab.cluster.discovery import dynamic_client

        self.namespace = namespace
        self.dyn = dynamic_client(api)
        self.fleets = self.dyn.resources.get(api_version=f"{GROUP}/{VERSION}", kind="MultimodalInference")
        self.kinds = {
            kind: self.dyn.resources.get(api_version=v, kind=k)
            for kind, (v, k) in {
                "deployments": ("apps/v1", "Deployment"),
                "services": ("v1", "Service"),
                "serviceaccounts": ("v1", "ServiceAccount"),
                "configmaps": ("v1", "ConfigMap"),
                "networkpolicies": ("networking.k8s.io/v1", "NetworkPolicy"),
                "poddisruptionbudgets": ("policy/v1", "PodDisruptionBudget"),
            }.items()
        }

    def audit(self) -> Audit:
        fleets = self.fleets.get(namespace=self.namespace).to_dict()["items"]
        children = {
            kind: r.get(namespace=self.namespace, label_selector=INFERENCE_LABEL).to_dict()["items"]
            for kind, r in self.kinds.items()
        }
        return audit(fleets, children)

    def operate(self, rng: random.Random, names: list[str]) -> None:
        """One random operation: create an absent fleet, or update, scale or delete a present one."""
        from kubernetes.client.exceptions import ApiException

        name = rng.choice(names)
        try:
            present = self.fleets.get(name=name, namespace=self.namespace).to_dict()
        except ApiException as error:
            if error.status != 404:
                raise
            present = None
        try:
            if present is None:
                self.fleets.create(
                    namespace=self.namespace,
                    body={
                        "apiVersion": f"{GROUP}/{VERSION}",
                        "kind": "MultimodalInference",
                        "metadata": {"name": name},
                        "spec": {"model": {"name": rng.choice(MODELS)}, "replicas": rng.randint(1, 2)},
                    },
                )
                return
            action = rng.choice(("update", "scale", "scale", "delete"))
            if action == "delete":
                self.fleets.delete(name=name, namespace=self.namespace)
                return
            spec = {"model": {"name": rng.choice(MODELS)}} if action == "update" else {"replicas": rng.randint(1, 2)}
            self.fleets.patch(
                name=name, namespace=self.namespace, body={"spec": spec}, content_type="application/merge-patch+json"
            )
        except ApiException as error:
            if error.status not in (404, 409):  # raced a deletion or a create in flight
                raise


def run(
    ns: Namespace,
    restart: Callable[[], None],
    kills: int,
    seed: int,
    fleets: int = 8,
    timeout: float = 120.0,
    progress: Callable[[str], None] = lambda _: None,
) -> Report:
    """``kills`` trials: a burst of operations with a SIGKILL at a random moment in it, then time to converge."""
    rng = random.Random(seed)
    names = [f"crash-{i}" for i in range(fleets)]
    report = Report()
    for trial in range(kills):
        burst, kill_at = rng.randint(3, 10), rng.uniform(0.0, 3.0)
        started, killed = time.monotonic(), False
        for _ in range(burst):
            ns.operate(rng, names)
            if not killed and time.monotonic() - started >= kill_at:
                restart()
                killed = True
            time.sleep(rng.uniform(0.0, 0.4))
        if not killed:
            time.sleep(max(0.0, kill_at - (time.monotonic() - started)))
            restart()
        restarted = time.monotonic()
        while True:
            result = ns.audit()
            if result.clean:
                report.converge_seconds.append(time.monotonic() - restarted)
                break
            if time.monotonic() - restarted > timeout:
                report.unconverged += 1
                report.worst = result
                break
            time.sleep(0.25)
        report.kills += 1
        progress(
            f"trial {trial + 1}/{kills}: {'converged' if result.clean else result.problems[:5]} "
            f"in {time.monotonic() - restarted:.1f}s"
        )
    return report


CLUSTER = "mmfleet-faults"
DOCS_KEY = "faults-crash"


def main(kills: int, seed: int, docs: Path, progress: Callable[[str], None]) -> int:
    """``mmfleet bench faults``: a fresh local cluster, the operator as its own process, ``kills`` trials; the table."""
    from mmfleet_lab.bench.operator_scale import NAMESPACE, _install
    from mmfleet_lab.bench.report import table, write_section
    from mmfleet_lab.cluster import down, up

    cluster = up(CLUSTER, pod_ready_delay="2s", progress=progress)
    log = cluster.state_dir / "operator.log"
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    procs: list[subprocess.Popen[bytes]] = []

    def restart() -> None:
        if procs:
            procs[-1].kill()
            procs[-1].wait(timeout=10)
        with log.open("ab") as out:
            command = [sys.executable, "-m", "mmfleet.cli", "run", "--health-address", "", "--metrics-address", ""]
            procs.append(subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT))

    try:
        api = _install(cluster)
        restart()
        report = run(Namespace(api, NAMESPACE), restart, kills, seed, progress=progress)
    finally:
        if procs:
            procs[-1].terminate()
            procs[-1].wait(timeout=15)
        down(CLUSTER, progress=progress)
    body = (
        f"{table(HEADERS, [report.row()])}\n\nSeed {seed}, 8 fleets; reproduce: "
        f"`mmfleet bench faults --kills {kills} --api-trials 0 --seed {seed}`"
    )
    write_section(docs, DOCS_KEY, "Crash mid-reconcile benchmark (`mmfleet bench faults`)", body)
    if report.unconverged:
        progress(f"{report.unconverged} trial(s) did not converge: {report.worst.problems[:10]}")
    return 1 if report.unconverged else 0
