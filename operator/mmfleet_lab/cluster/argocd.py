"""Argo CD against a local cluster: what a sync needs, as local processes, and a Git repository on disk to sync from.

``start_argocd`` runs Argo CD's application controller and repo server (``build.ensure_argocd``) with Debian's
``redis-server`` as their cache, all on 127.0.0.1 but for one thing upstream hardcodes: the controller's metrics
server binds 0.0.0.0 (``controller/appcontroller.go``), on a free port. No API server, UI, Dex or ApplicationSet
controller. The controller runs with ``ARGOCD_FAKE_IN_CLUSTER=true``, Argo CD's own switch for running outside a
cluster (its Procfile), so the in-cluster destination ``https://kubernetes.default.svc`` is the cluster of its
kubeconfig. Installed in the cluster first: Argo CD's CRDs (Application, AppProject) and its settings
(``argocd-cm`` with the release's defaults, ``argocd-rbac-cm``, ``argocd-secret``) as the release's manifests hold
them, in the ``argocd`` namespace with the ``default`` AppProject, then the caller's ``argocd-cm`` patches, merged
as users are told to (``kubectl patch --type merge --patch-file``).

``GitRepo`` is a bare repository in a directory plus a work tree that commits and pushes to it; Applications
point at its ``file://`` URL, which the repo server clones like any other Git URL (Argo CD's own end-to-end tests
use file URLs).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mmfleet_lab.cluster import process
from mmfleet_lab.cluster.build import ARGOCD_VERSION, Progress, ensure_argocd, silent
from mmfleet_lab.cluster.cluster import api_client
from mmfleet_lab.cluster.crds import wait_established
from mmfleet_lab.cluster.kubectl import kubectl
from mmfleet_lab.cluster.process import ClusterError, Proc

NAMESPACE = "argocd"
REDIS = "redis-server"
_CRDS = ("applications.argoproj.io", "appprojects.argoproj.io")


def first_start_objects(server_secret_key: str) -> list[dict[str, Any]]:
    """The ``default`` project that lets Applications deploy anything anywhere, and the key Argo CD signs with in
    ``argocd-secret``: what Argo CD's API server creates on its first start (none runs here)."""
    return [
        {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "AppProject",
            "metadata": {"name": "default", "namespace": NAMESPACE},
            "spec": {
                "sourceRepos": ["*"],
                "destinations": [{"server": "*", "namespace": "*"}],
                "clusterResourceWhitelist": [{"group": "*", "kind": "*"}],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "argocd-secret", "namespace": NAMESPACE},
            "stringData": {"server.secretkey": server_secret_key},
        },
    ]


@dataclass(frozen=True)
class RunningArgoCD:
    """Argo CD's controller and repo server and their Redis, started by ``start_argocd``; ``stop`` ends them."""

    kubeconfig: Path
    workdir: Path
    redis: str  # host:port
    repo_server: str  # host:port, gRPC without TLS
    procs: tuple[Proc, ...]

    def stop(self, grace: float = 10.0) -> None:
        process.stop(self.procs, grace=grace)

    def logs(self, lines: int = 30) -> str:
        """The end of each component's log, for a failing test's message."""
        return "\n".join(f"--- {p.component} ({p.log})\n{process.tail(p.log, lines)}" for p in self.procs)


def install(kubeconfig: Path, cm_patches: Sequence[Path] = ()) -> None:
    """Argo CD's CRDs and settings as its release installs them, ``first_start_objects``, then each ``argocd-cm``
    patch file merged into ``argocd-cm``."""
    built = ensure_argocd()
    for crd in built.crds:  # server-side: the Application CRD is too big for the last-applied annotation
        kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(crd))
    api = api_client(kubeconfig)  # not `kubectl wait`: it exits 1 on a new CRD whose status has no conditions yet
    for name in _CRDS:
        wait_established(api, name)
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    kubectl(kubeconfig, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(namespace))
    settings = [arg for path in built.config for arg in ("-f", str(path))]
    kubectl(kubeconfig, "-n", NAMESPACE, "apply", "--server-side", "--force-conflicts", *settings)
    objects = yaml.safe_dump_all(first_start_objects(secrets.token_urlsafe(32)))
    # Another field manager than the release's settings: one manager's apply would drop argocd-secret's labels.
    kubectl(kubeconfig, "apply", "--server-side", "--field-manager=argocd-first-start", "-f", "-", stdin=objects)
    for patch in cm_patches:
        args = ("patch", "configmap", "argocd-cm", "--type", "merge", "--patch-file", str(patch))
        kubectl(kubeconfig, "-n", NAMESPACE, *args)


def _redis_binary() -> Path:
    found = shutil.which(REDIS)
    if found is None:
        raise ClusterError(f"{REDIS} is not installed; install Debian's package (apt-get install redis-server)")
    return Path(found)


def start_argocd(
    kubeconfig: Path,
    workdir: Path,
    cm_patches: Sequence[Path] = (),
    resync_seconds: int = 10,
    progress: Progress = silent,
) -> RunningArgoCD:
    """Install Argo CD's objects (``install``), start Redis, the repo server and the controller, and return once all
    three answer. ``resync_seconds`` is how often the controller compares Applications with Git, and how long the
    repo server caches what a branch points at (2 and 3 minutes upstream; short here, as no webhook tells Argo CD
    about a push). The caller stops them (``RunningArgoCD.stop``, or ``run_argocd``)."""
    built = ensure_argocd(progress)
    install(kubeconfig, cm_patches)
    workdir.mkdir(parents=True, exist_ok=True)
    for sub in ("tmp", "tls", "ssh", "gnupg", "plugins"):
        (workdir / sub).mkdir(exist_ok=True)
    logs = workdir / "logs"
    redis_port, repo_port, repo_metrics, controller_metrics = (process.free_port() for _ in range(4))
    redis, repo_server = f"127.0.0.1:{redis_port}", f"127.0.0.1:{repo_port}"
    # Argo CD's paths default to a container's (/app/config/..., /tmp/reposerver-ask-pass.sock): all under workdir.
    env = {
        **os.environ,
        "PATH": f"{built.repo_server.parent}{os.pathsep}{os.environ.get('PATH', '')}",  # git-verify-wrapper.sh
        "TMPDIR": str(workdir / "tmp"),  # the repo server clones into $TMPDIR/_argocd-repo
        "ARGOCD_TLS_DATA_PATH": str(workdir / "tls"),
        "ARGOCD_SSH_DATA_PATH": str(workdir / "ssh"),
        "ARGOCD_GNUPGHOME": str(workdir / "gnupg"),
        "ARGOCD_GPG_ENABLED": "false",  # no signed commits to verify
        "ARGOCD_PLUGINSOCKFILEPATH": str(workdir / "plugins"),
        "ARGOCD_ASK_PASS_SOCK": str(workdir / "askpass.sock"),
    }
    procs: list[Proc] = []
    try:
        redis_args = ["--bind", "127.0.0.1", "--port", str(redis_port), "--save", "", "--appendonly", "no"]
        procs.append(process.start(REDIS, _redis_binary(), redis_args, logs / "redis.log", workdir))
        process.wait_healthy(procs[-1], lambda: _listening(redis_port), timeout=30)

        repo_args = [
            "--address=127.0.0.1",
            f"--port={repo_port}",
            "--metrics-address=127.0.0.1",
            f"--metrics-port={repo_metrics}",
            "--disable-tls",
            "--client-ca-path=",  # its default, a mounted Secret's path, is refused together with --disable-tls
            f"--redis={redis}",
            f"--revision-cache-expiration={resync_seconds}s",
            "--logformat=text",
        ]
        procs.append(
            process.start("argocd-repo-server", built.repo_server, repo_args, logs / "repo-server.log", workdir, env)
        )
        # full=true: it calls its own gRPC health service, so this answers once gRPC serves
        process.wait_healthy(procs[-1], _answers(f"http://127.0.0.1:{repo_metrics}/healthz?full=true"), timeout=60)

        controller_args = [
            f"--kubeconfig={kubeconfig}",
            f"--namespace={NAMESPACE}",
            f"--repo-server={repo_server}",
            "--repo-server-plaintext",
            f"--redis={redis}",
            f"--metrics-port={controller_metrics}",
            f"--app-resync={resync_seconds}",
            "--app-resync-jitter=0",  # up to 60 s more by default
            "--persist-resource-health",  # each resource's health in .status.resources, where kubectl shows it
            "--logformat=text",
        ]
        controller_env = {**env, "ARGOCD_FAKE_IN_CLUSTER": "true", "KUBECONFIG": str(kubeconfig)}
        log = logs / "application-controller.log"
        procs.append(
            process.start(
                "argocd-application-controller",
                built.application_controller,
                controller_args,
                log,
                workdir,
                controller_env,
            )
        )
        process.wait_healthy(procs[-1], _answers(f"http://127.0.0.1:{controller_metrics}/healthz"), timeout=60)
    except BaseException:
        process.stop(procs, grace=5)
        raise
    progress(f"Argo CD v{ARGOCD_VERSION} up: repo server {repo_server}, Redis {redis}")
    return RunningArgoCD(kubeconfig, workdir, redis, repo_server, tuple(procs))


@contextmanager
def run_argocd(
    kubeconfig: Path,
    workdir: Path,
    cm_patches: Sequence[Path] = (),
    resync_seconds: int = 10,
    progress: Progress = silent,
) -> Iterator[RunningArgoCD]:
    """``start_argocd``, yielded, and stopped on exit."""
    running = start_argocd(kubeconfig, workdir, cm_patches, resync_seconds, progress)
    try:
        yield running
    finally:
        running.stop()


def _answers(url: str) -> Callable[[], bool]:
    """A health check: True once ``url`` answers 200 (``http_get`` raises OSError until then)."""

    def check() -> bool:
        process.http_get(url)
        return True

    return check


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


class GitRepo:
    """A bare repository at ``<directory>/repo.git`` (what Argo CD clones, at ``url``) and a work tree that commits
    and pushes to it, on branch ``main``."""

    def __init__(self, directory: Path) -> None:
        self.bare = directory / "repo.git"
        self.tree = directory / "work"
        directory.mkdir(parents=True, exist_ok=True)
        self._git(directory, "init", "--quiet", "--bare", "--initial-branch=main", str(self.bare))
        self._git(directory, "clone", "--quiet", str(self.bare), str(self.tree))

    @property
    def url(self) -> str:
        return self.bare.as_uri()

    def commit(self, files: Mapping[str, str], message: str) -> str:
        """Write ``files`` (path in the repository -> text), commit them, push; the new commit's hash."""
        for name, text in files.items():
            path = self.tree / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        self._git(self.tree, "add", "--", *files)
        self._git(self.tree, "commit", "--quiet", "-m", message)
        self._git(self.tree, "push", "--quiet", "origin", "HEAD:main")
        return self._git(self.tree, "rev-parse", "HEAD").strip()

    @staticmethod
    def _git(cwd: Path, *args: str) -> str:
        identity = ("-c", "user.name=mmfleet lab", "-c", "user.email=lab@mmfleet.invalid")
        done = subprocess.run(["git", *identity, *args], cwd=cwd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ClusterError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout
