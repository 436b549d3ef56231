"""GitOps with a real Argo CD: an Application syncs a MultimodalInference from Git, and Argo CD and the operator agree.

Argo CD v3.5.3's application controller and repo server, built from its Go module, run against the local control
plane (``mmfleet_lab.cluster.argocd``) with our health check merged into ``argocd-cm`` from the committed
``manifests/argocd/argocd-cm-patch.yaml``. The Git repository is a bare repository on disk (a ``file://`` URL),
holding ``examples/qwen-vl-eks.yaml`` with the edits a local cluster needs. The cluster, Prometheus, the twin
and the operator are those of ``test_spike``: the operator scales on the twin's load for real.

One test, in the order a user lives it: sync, Healthy through our Lua, a spike the operator scales for while Argo
CD stays Synced (no drift, no sync loop), a commit that rolls the fleet, a commit that cannot work shown Degraded, and a
commit that adds an encode tier shown Healthy once both tiers serve, and Degraded once it is moved to a GPU type no
node has.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from mmfleet_lab.cluster import Cluster
from mmfleet_lab.cluster.argocd import NAMESPACE as ARGOCD_NAMESPACE
from mmfleet_lab.cluster.argocd import GitRepo, RunningArgoCD, run_argocd
from mmfleet_lab.cluster.kubectl import kubectl
from mmfleet_lab.spike import Twin
from mmfleet_lab.twin.serve import Spike
from tests.helpers.repo import ROOT
from tests.helpers.spike import BASE_RATE, SLO
from tests.helpers.wait import wait_for

# A module cluster and Argo CD started, then a spike run to its end and a roll from Git: past the default timeout.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

APP = "qwen-vl"
NAMESPACE = "gitops"
PATH = "fleet/qwen-vl.yaml"
RESYNC = 10  # seconds between Argo CD's comparisons of the Application with Git
SPIKE = Spike(start=100.0, end=220.0, factor=5.0)  # after test_spike's warm-up: series cover the rate window


def fleet_manifest(spec: dict[str, Any] | None = None, **backend: Any) -> str:
    """``examples/qwen-vl-eks.yaml`` for the local cluster: in the Application's namespace, no model download
    secret, no tracing (no collector here), and test_spike's SLO so the twin's spike breaks it; ``spec`` and
    ``backend`` are added to it."""
    resource = yaml.safe_load((ROOT / "examples" / "qwen-vl-eks.yaml").read_text())
    resource["metadata"]["namespace"] = NAMESPACE
    del resource["spec"]["model"]["credentialsSecret"], resource["spec"]["tracing"]
    resource["spec"]["autoscaling"]["slo"] = SLO
    resource["spec"]["backend"].update(backend)
    resource["spec"].update(spec or {})
    return yaml.safe_dump(resource, sort_keys=False)


def application(repo_url: str) -> dict[str, Any]:
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {"name": APP, "namespace": ARGOCD_NAMESPACE},
        "spec": {
            "project": "default",
            "source": {"repoURL": repo_url, "targetRevision": "main", "path": "fleet"},
            "destination": {"server": "https://kubernetes.default.svc", "namespace": NAMESPACE},
            "syncPolicy": {
                "automated": {"prune": True, "selfHeal": True},
                "syncOptions": ["CreateNamespace=true", "ServerSideApply=true"],
            },
        },
    }


@pytest.fixture(scope="module")
def argocd(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningArgoCD]:
    patch = ROOT / "manifests" / "argocd" / "argocd-cm-patch.yaml"
    workdir = tmp_path_factory.mktemp("argocd")
    with run_argocd(cluster.kubeconfig, workdir, cm_patches=(patch,), resync_seconds=RESYNC) as running:
        yield running


class View:
    """What a user would look at with kubectl: the Application, the MultimodalInference, its Deployment."""

    def __init__(self, argocd: RunningArgoCD) -> None:
        self.argocd = argocd

    def get(self, *args: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(kubectl(self.argocd.kubeconfig, "get", "-o", "json", *args))
        return found

    def app(self) -> dict[str, Any]:
        return self.get("-n", ARGOCD_NAMESPACE, f"applications.argoproj.io/{APP}")

    def fleet(self) -> dict[str, Any]:
        return self.get("-n", NAMESPACE, f"multimodalinferences.mmfleet.io/{APP}")

    def deployment(self) -> dict[str, Any]:
        return self.get("-n", NAMESPACE, f"deployment/{APP}")

    def fleet_health(self) -> dict[str, Any]:
        """Argo CD's health of the MultimodalInference, from the Application's resource list."""
        resources = self.app().get("status", {}).get("resources", [])
        found = [r for r in resources if r.get("kind") == "MultimodalInference" and r.get("name") == APP]
        return found[0].get("health", {}) if found else {}

    def synced_at(self, revision: str) -> dict[str, Any] | None:
        """The Application once it is Synced to ``revision`` with its sync operation done, else None."""
        app = self.app()
        status = app.get("status", {})
        done = status.get("operationState", {}).get("phase") == "Succeeded"
        sync = status.get("sync", {})
        synced = sync.get("status") == "Synced" and sync.get("revision") == revision
        return app if done and synced else None

    def condition(self, kind: str) -> dict[str, Any]:
        conditions = self.fleet().get("status", {}).get("conditions", [])
        return next((c for c in conditions if c["type"] == kind), {})

    def failure(self) -> str:
        return f"\nApplication status: {json.dumps(self.app().get('status', {}), indent=1)}\n{self.argocd.logs()}"


def _container_command(deployment: dict[str, Any]) -> list[str]:
    command: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    return command


def test_argocd_syncs_reports_health_stays_synced_through_a_spike_and_rolls_from_git(
    cluster: Cluster,
    operator: Any,
    argocd: RunningArgoCD,
    tmp_path: Path,
) -> None:
    view = View(argocd)
    repo = GitRepo(tmp_path / "git")
    first = repo.commit({PATH: fleet_manifest()}, "qwen-vl: the EKS example")
    kubectl(argocd.kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(application(repo.url)))

    # Synced to the commit, the operator reconciles, and Argo CD's health is our script's: Healthy, with the
    # Ready condition's message (Argo CD's default for a custom resource has no message, and is Healthy at once).
    app = wait_for(lambda: view.synced_at(first), 120, f"the Application Synced at {first}")
    wait_for(lambda: view.fleet().get("status", {}).get("phase") == "Ready", 90, "the fleet Ready")
    health = wait_for(lambda: view.fleet_health().get("status") == "Healthy" and view.fleet_health(), 60, "Healthy")
    assert health["message"] == view.condition("Ready")["message"] == "1/1 replicas ready", view.failure()
    wait_for(lambda: view.app()["status"]["health"]["status"] == "Healthy", 30, "the Application Healthy")
    generation = view.fleet()["metadata"]["generation"]
    history = len(app["status"].get("history", []))
    started = app["status"]["operationState"]["startedAt"]

    # A spike: the operator scales the Deployment (a child Argo CD does not own) and writes status on the
    # resource Argo CD does own. Argo CD keeps seeing Git's spec: Synced throughout, no new sync operation.
    twin = Twin(cluster, BASE_RATE, (SPIKE,), tmp_path / "twin.log", ROOT / "tests" / "data")
    sync_states: set[str] = set()
    try:
        deadline = time.monotonic() + SPIKE.end + 30
        while view.deployment()["spec"]["replicas"] < 2:
            assert time.monotonic() < deadline, f"no scale-up during the spike; see {tmp_path / 'twin.log'}"
            sync_states.add(view.app()["status"]["sync"]["status"])
            time.sleep(2)
        scaled = view.deployment()["spec"]["replicas"]
        print(f"scaled to {scaled} replicas {time.time() - twin.started:.0f}s after the twin started", file=sys.stderr)
        hold = time.monotonic() + 2 * RESYNC + 5  # two more of Argo CD's comparisons with Git after the scale-up
        while time.monotonic() < hold:
            sync_states.add(view.app()["status"]["sync"]["status"])
            time.sleep(2)
    finally:
        twin.stop()
    app = view.app()
    assert sync_states == {"Synced"}, view.failure()
    assert len(app["status"].get("history", [])) == history, view.failure()
    assert app["status"]["operationState"]["startedAt"] == started, view.failure()
    assert view.fleet()["metadata"]["generation"] == generation  # nobody wrote the spec

    # A commit in Git rolls the fleet: synced, a new generation, the Deployment's pods get the new flag.
    second = repo.commit({PATH: fleet_manifest(maxNumSeqs=64)}, "qwen-vl: at most 64 sequences")
    wait_for(lambda: view.synced_at(second), 120, f"the Application Synced at {second}")

    def rolled() -> bool:
        args = _container_command(view.deployment())
        return args[args.index("--max-num-seqs") + 1] == "64"

    wait_for(rolled, 60, "the Deployment rolled to --max-num-seqs 64")
    assert view.fleet()["metadata"]["generation"] == generation + 1

    # A spec only the operator can judge: Degraded in Argo CD, with the operator's message.
    third = repo.commit({PATH: fleet_manifest(extraArgs=["--port=9000"])}, "qwen-vl: a port the server owns")
    wait_for(lambda: view.synced_at(third), 120, f"the Application Synced at {third}")
    degraded = wait_for(lambda: view.fleet_health().get("status") == "Degraded" and view.fleet_health(), 60, "Degraded")
    assert "spec.backend.extraArgs[0]: --port=9000 clashes with --port" in degraded["message"], view.failure()
    assert degraded["message"] == view.condition("Degraded")["message"]
    wait_for(lambda: view.app()["status"]["health"]["status"] == "Degraded", 30, "the Application Degraded")

    # An encode tier from Git: Healthy once both tiers serve (EncodeReady True, read by our Lua).
    tier = {"disaggregation": {"encode": {"replicas": 2}}}
    fourth = repo.commit({PATH: fleet_manifest(tier)}, "qwen-vl: vision encoding on a tier of its own")
    wait_for(lambda: view.synced_at(fourth), 120, f"the Application Synced at {fourth}")
    wait_for(lambda: view.fleet_health().get("status") == "Healthy", 90, "Healthy with its encode tier")
    assert view.condition("EncodeReady")["reason"] == "EncodeReplicasReady", view.failure()
    encode = view.get("-n", NAMESPACE, f"deployment/{APP}-encode")
    assert encode["status"]["readyReplicas"] == 2

    # The encode tier moved to a GPU type no node has (H200: Hopper, as the fleet's flash-attn-3 needs, which the API
    # server checks): Degraded in Argo CD with the operator's EncodeReady message, while the serving tier serves.
    moved = {"disaggregation": {"encode": {"replicas": 2, "gpu": {"type": "H200"}}}}
    fifth = repo.commit({PATH: fleet_manifest(moved)}, "qwen-vl: the encode tier on H200s")
    failing = wait_for(lambda: view.fleet_health().get("status") == "Degraded" and view.fleet_health(), 120,
                       "Degraded: the encode tier's new pod cannot be scheduled")  # fmt: skip
    assert view.app()["status"]["sync"]["revision"] == fifth, view.failure()
    assert failing["message"] == view.condition("EncodeReady")["message"], view.failure()
    assert "Unschedulable" in failing["message"] and f"pod {APP}-encode-" in failing["message"], failing
    assert view.condition("Ready")["status"] == "True", view.failure()
