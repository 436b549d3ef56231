"""A real local control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok and Prometheus.

Everything listens on 127.0.0.1 on ports the OS hands out, so several clusters (and a developer's
own) can coexist. Layout, by default under ``~/.cache/mmfleet/clusters/`` (``$MMFLEET_CACHE/clusters``):

- ``<name>.json``: the state file (ports, pids, paths); ``down`` and ``env`` find the cluster by it,
  also when ``up`` was given another ``state_dir``.
- ``<name>/``: the state dir: ``kubeconfig`` (admin), ``pki/``, ``etcd/`` data, ``kwok.yaml`` stages and logs,
  ``server.log`` (what ``kubectl logs`` shows of every pod's server container),
  ``prometheus/`` (configuration, TSDB, file_sd targets) and ``logs/<component>.log``. ``down`` deletes
  it (only a dir holding the ``.mmfleet-cluster`` marker ``up`` writes); a failed ``up`` keeps it for its logs.

Nothing here needs root, containers or network beyond loopback; kwok stands in for kubelets.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import re
import shutil
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mmfleet_lab.cluster import process, prometheus
from mmfleet_lab.cluster.build import (
    ETCD_VERSION,
    K8S_VERSION,
    KWOK_VERSION,
    Binaries,
    Progress,
    cache_root,
    ensure_binaries,
    file_lock,
    silent,
)
from mmfleet_lab.cluster.nodes import DEFAULT_POOLS, KWOK_ANNOTATION, NodePool, create_nodes
from mmfleet_lab.cluster.pki import CertPair, Pki, write_pki
from mmfleet_lab.cluster.process import ClusterError, Proc
from mmfleet_lab.cluster.stages import kwok_config, ready_delay_ms

DEFAULT_NAME = "mmfleet"
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"  # kwok hands out pod IPs from here; must not overlap SERVICE_CIDR
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
NODE_LEASE_SECONDS = 40  # kwok renews each node's Lease; kcm's default grace is 50s
_HEALTH_PATHS = "/healthz,/readyz,/livez,/metrics"  # unauthenticated on kcm/scheduler, for probes and Prometheus
# The audit log records, at level Metadata (who, verb, resource; no bodies), each request of a workload's
# ServiceAccount (kcm's controllers, in kube-system, are left out) when it completes, and a watch also when it starts
# (ResponseStarted): what an operator run with a ServiceAccount's token really calls, which the chart's
# least-privilege RBAC test compares with what the ClusterRole grants.
AUDIT_POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "userGroups": ["system:serviceaccounts:kube-system"]},
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
        {"level": "None"},
    ],
}
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
_MARKER = ".mmfleet-cluster"  # marks a state dir as ours, so only ours are ever deleted
# The client-side rate limits of kcm (20/30) and the scheduler (50/100) would make a 1,000-pod
# test measure those limits rather than the operator; managed control planes raise them, and
# kwokctl lifts them for the same reason (disableQPSLimits).
_CLIENT_RATE = ("--kube-api-qps=500", "--kube-api-burst=1000")
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?$")


@dataclass(frozen=True)
class Cluster:
    """A running local cluster; ``kubeconfig`` holds admin (system:masters) credentials."""

    name: str
    state_dir: Path
    kubeconfig: Path
    server: str
    pod_ready_delay: str
    processes: tuple[Proc, ...] = ()
    prometheus_url: str = ""  # empty when started without Prometheus
    scrape_interval: str = ""

    @property
    def prometheus_targets(self) -> Path:
        """Where ``mmfleet twin serve`` writes the simulated pods for Prometheus to scrape (file_sd)."""
        return prometheus.targets_dir(self.state_dir)

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def audit_log(self) -> Path:
        """kube-apiserver's audit log: one JSON event per line, for requests of ServiceAccounts (AUDIT_POLICY)."""
        return self.logs_dir / "audit.log"

    @property
    def server_log(self) -> Path:
        """What `kubectl logs` answers for every pod's ``server`` container (kwok's ClusterLogs), in the CRI log
        format a node's runtime writes; empty until a test writes a server's log there."""
        return self.state_dir / "server.log"

    @property
    def pids(self) -> dict[str, int]:
        return {p.component: p.pid for p in self.processes}

    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` for this cluster (the official client, admin credentials)."""
        return api_client(self.kubeconfig)

    def env_line(self) -> str:
        """Shell lines that point kubectl, the operator and the tests at this cluster and its Prometheus."""
        line = f"export KUBECONFIG={self.kubeconfig}"
        return f"{line}\nexport MMFLEET_PROMETHEUS_URL={self.prometheus_url}" if self.prometheus_url else line


def api_client(kubeconfig: Path) -> Any:
    """A ``kubernetes.client.ApiClient`` for ``kubeconfig`` (the official client)."""
    from kubernetes import config

    load: Any = config.new_client_from_config  # Any: untyped upstream, whatever mypy is told about kubernetes
    return load(config_file=str(kubeconfig))


def clusters_dir() -> Path:
    return cache_root() / "clusters"


def state_file(name: str) -> Path:
    return clusters_dir() / f"{name}.json"


def _check_name(name: str) -> None:
    if not _NAME.match(name):
        raise ValueError(f"cluster name {name!r}: use lower-case letters, digits and '-'")


def _save(cluster: Cluster) -> None:
    data = {
        "name": cluster.name,
        "state_dir": str(cluster.state_dir),
        "kubeconfig": str(cluster.kubeconfig),
        "server": cluster.server,
        "pod_ready_delay": cluster.pod_ready_delay,
        "processes": [dataclasses.asdict(p) for p in cluster.processes],
        "prometheus_url": cluster.prometheus_url,
        "scrape_interval": cluster.scrape_interval,
        "versions": {"kubernetes": K8S_VERSION, "etcd": ETCD_VERSION, "kwok": KWOK_VERSION},
    }
    path = state_file(cluster.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def get(name: str = DEFAULT_NAME) -> Cluster | None:
    """The cluster recorded under ``name`` (running or not), or None; a record that is not one ``up`` wrote raises
    ``ClusterError`` naming the file."""
    path = state_file(name)
    try:
        data = json.loads(path.read_text())
        return Cluster(
            name=data["name"],
            state_dir=Path(data["state_dir"]),
            kubeconfig=Path(data["kubeconfig"]),
            server=data["server"],
            pod_ready_delay=data["pod_ready_delay"],
            processes=tuple(Proc(**p) for p in data["processes"]),
            prometheus_url=data.get("prometheus_url", ""),
            scrape_interval=data.get("scrape_interval", ""),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ClusterError(
            f"{path}: not a record of a cluster `mmfleet cluster up` started ({type(error).__name__}: {error}); "
            f"if no cluster {name} runs, delete that file"
        ) from error


def _tls(pki_dir: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki_dir / "ca.crt"))
    context.load_cert_chain(str(pki_dir / "admin.crt"), str(pki_dir / "admin.key"))
    return context


def _healthy(cluster: Cluster, patience: float = 0.0) -> bool:
    """Every component alive and ``/readyz`` ok within ``patience`` seconds: an API server busy on two cores can miss
    one 3 s answer, and `up` tears down a cluster it finds unhealthy."""
    core = [p for p in cluster.processes if p.component in COMPONENTS]
    deadline = time.monotonic() + patience
    while len(core) == len(COMPONENTS) and all(process.alive(p) for p in core):
        try:
            if process.http_get(f"{cluster.server}/readyz", _tls(cluster.state_dir / "pki")) == "ok":
                return True
        except OSError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(1.0)
    return False


def _kubeconfig(name: str, server: str, ca: Path, user: str, client: CertPair) -> dict[str, Any]:
    def b64(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority-data": b64(ca)}}],
        "users": [
            {"name": user, "user": {"client-certificate-data": b64(client.cert), "client-key-data": b64(client.key)}}
        ],
        "contexts": [{"name": name, "context": {"cluster": name, "user": user}}],
        "current-context": name,
    }


def up(
    name: str = DEFAULT_NAME,
    state_dir: str | Path | None = None,
    pod_ready_delay: str = "5s",
    nodes: Sequence[NodePool] = DEFAULT_POOLS,
    progress: Progress = silent,
    timeout: float = 120.0,
    with_prometheus: bool = True,
    scrape_interval: str = prometheus.DEFAULT_SCRAPE_INTERVAL,
) -> Cluster:
    """Start the cluster (building binaries the first time) or return it if it already runs.

    ``pod_ready_delay`` (a duration such as ``5s``) is how long after binding a pod turns Ready unless it
    carries the ``mmfleet.io/ready-delay`` annotation. ``timeout`` bounds each component's health wait.
    Prometheus scrapes and evaluates every ``scrape_interval`` (a duration such as ``15s``); a running
    cluster whose Prometheus was stopped (``stop_prometheus``) gets it started again.
    """
    _check_name(name)
    ready_delay_ms(pod_ready_delay)  # reject a bad value before starting anything
    if with_prometheus:
        prometheus.interval_ms(scrape_interval)
        prometheus.binary()
    clusters_dir().mkdir(parents=True, exist_ok=True)
    with file_lock(_lock_path(name)):
        existing = get(name)
        if existing is not None:
            if _healthy(existing, patience=15.0):
                progress(f"cluster {name} is already running ({existing.server})")
                if existing.pod_ready_delay != pod_ready_delay:
                    progress(f"  note: it keeps its pod ready delay {existing.pod_ready_delay}, not {pod_ready_delay}")
                if existing.prometheus_url and existing.scrape_interval != scrape_interval:
                    progress(f"  note: it keeps its scrape interval {existing.scrape_interval}, not {scrape_interval}")
                if existing.prometheus_url and _prometheus_proc(existing) is None:
                    progress("  its Prometheus was stopped: starting it again")
                    return _start_prometheus(existing, timeout)
                return existing
            progress(f"cluster {name} was recorded but is not healthy: stopping what is left and starting afresh")
            _teardown(existing)
        binaries = ensure_binaries(progress)
        state = Path(state_dir).expanduser().resolve() if state_dir else clusters_dir() / name
        _remove_state_dir(state)
        state.mkdir(parents=True)
        (state / _MARKER).write_text(f"local cluster {name}; mmfleet cluster down --name {name} deletes this dir\n")
        interval = scrape_interval if with_prometheus else ""
        return _start(name, state, pod_ready_delay, nodes, binaries, progress, timeout, interval)


def _start(
    name: str,
    state: Path,
    pod_ready_delay: str,
    nodes: Sequence[NodePool],
    binaries: Binaries,
    progress: Progress,
    timeout: float,
    scrape_interval: str,
) -> Cluster:
    """Start every component; Prometheus too unless ``scrape_interval`` is empty."""
    started = time.monotonic()
    logs = state / "logs"
    pki = write_pki(state / "pki")
    tls = _tls(state / "pki")
    etcd_port, peer_port, api_port, kcm_port, sched_port, kwok_port, prom_port = (process.free_port() for _ in range(7))
    server = f"https://127.0.0.1:{api_port}"
    kubeconfigs: dict[str, Path] = {}
    for component in ("admin", "kube-controller-manager", "kube-scheduler"):
        client = pki.clients[component]
        path = state / ("kubeconfig" if component == "admin" else f"{component}.kubeconfig")
        path.write_text(yaml.safe_dump(_kubeconfig(name, server, pki.ca.cert, component, client), sort_keys=False))
        path.chmod(0o600)
        kubeconfigs[component] = path
    cluster = Cluster(name, state, kubeconfigs["admin"], server, pod_ready_delay)
    cluster.server_log.touch()
    (state / "kwok.yaml").write_text(kwok_config(pod_ready_delay, cluster.server_log))
    if scrape_interval:
        prometheus.prepare(state, scrape_interval)
        url = f"http://127.0.0.1:{prom_port}"
        cluster = dataclasses.replace(cluster, prometheus_url=url, scrape_interval=scrape_interval)
    _save(cluster)  # recorded before anything starts, so ``down`` can always clean up

    def record(proc: Proc) -> Proc:
        nonlocal cluster
        cluster = dataclasses.replace(cluster, processes=(*cluster.processes, proc))
        _save(cluster)
        return proc

    def launch(component: str, exe: Path, args: list[str]) -> Proc:
        return record(process.start(component, exe, args, logs / f"{component}.log", state))

    def step(what: str, since: float) -> None:
        progress(f"  {what} ({time.monotonic() - since:.1f}s)")

    try:
        progress(f"starting cluster {name} (Kubernetes v{K8S_VERSION}, etcd v{ETCD_VERSION}, kwok v{KWOK_VERSION})")
        t = time.monotonic()
        etcd = launch("etcd", binaries.etcd, _etcd_args(state, etcd_port, peer_port))
        process.wait_healthy(etcd, lambda: _etcd_healthy(etcd_port), timeout)
        step(f"etcd ready on 127.0.0.1:{etcd_port}", t)

        t = time.monotonic()
        (state / "audit-policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY, sort_keys=False))
        apiserver_args = _apiserver_args(pki, etcd_port, api_port, state / "audit-policy.yaml", cluster.audit_log)
        apiserver = launch("kube-apiserver", binaries.kube_apiserver, apiserver_args)
        process.wait_healthy(apiserver, lambda: process.http_get(f"{server}/readyz", tls) == "ok", timeout)
        step(f"kube-apiserver ready on {server}", t)

        # The rest only need the API server: start them together, then wait for each.
        t = time.monotonic()
        kcm = launch("kube-controller-manager", binaries.kube_controller_manager, _kcm_args(pki, kubeconfigs, kcm_port))
        sched = launch("kube-scheduler", binaries.kube_scheduler, _scheduler_args(pki, kubeconfigs, sched_port))
        kwok = launch("kwok", binaries.kwok, _kwok_args(state, kubeconfigs["admin"], kwok_port))
        prom = record(prometheus.launch(state, prom_port)) if scrape_interval else None
        for proc, url, context in (
            (kcm, f"https://127.0.0.1:{kcm_port}/healthz", tls),
            (sched, f"https://127.0.0.1:{sched_port}/readyz", tls),
            (kwok, f"http://127.0.0.1:{kwok_port}/healthz", None),
        ):
            process.wait_healthy(proc, _says_ok(url, context), timeout)
        step("kube-controller-manager, kube-scheduler and kwok healthy", t)
        if prom is not None:
            t = time.monotonic()
            prometheus.wait_ready(prom, cluster.prometheus_url, timeout)
            step(f"prometheus ready on {cluster.prometheus_url} (scrape interval {scrape_interval})", t)

        t = time.monotonic()
        api = cluster.api_client()
        try:
            # Pods need the namespace's ServiceAccount (admission); its appearance shows kcm's controllers run.
            process.wait_healthy(kcm, lambda: _has_default_service_account(api), timeout)
            step("kube-controller-manager created the default ServiceAccount", t)
            if nodes:
                t = time.monotonic()
                try:
                    names = create_nodes(api, nodes, timeout)
                except Exception as error:  # API errors and timeouts alike: name the step and kwok's log
                    raise ClusterError(
                        f"creating the fake GPU nodes failed: {error}; end of {kwok.log}:\n{process.tail(kwok.log)}"
                    ) from error
                step(f"{len(names)} fake GPU node(s) Ready: {', '.join(names)}", t)
        finally:
            api.close()
    except BaseException:
        survivors = process.stop(cluster.processes)
        progress(f"cluster {name} failed to start; logs kept in {logs} (remove: mmfleet cluster down --name {name})")
        if survivors:
            progress(f"  could not stop: {', '.join(f'{p.component} (pid {p.pid})' for p in survivors)}")
        raise
    progress(f"cluster {name} up in {time.monotonic() - started:.1f}s; logs in {logs}")
    return cluster


def _says_ok(url: str, context: ssl.SSLContext | None) -> Callable[[], bool]:
    return lambda: process.http_get(url, context) == "ok"


def _etcd_healthy(port: int) -> bool:
    health = json.loads(process.http_get(f"http://127.0.0.1:{port}/health"))
    return bool(health.get("health") == "true")


def _has_default_service_account(api: Any) -> bool:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        client.CoreV1Api(api).read_namespaced_service_account("default", "default")
    except ApiException as error:
        if error.status == 404:
            return False
        raise OSError(f"reading serviceaccount default/default: {error.status} {error.reason}") from error
    return True


def _etcd_args(state: Path, port: int, peer_port: int) -> list[str]:
    peer = f"http://127.0.0.1:{peer_port}"
    client = f"http://127.0.0.1:{port}"
    return [
        "--name=default",
        f"--data-dir={state / 'etcd'}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=default={peer}",
        "--unsafe-no-fsync=true",  # test data: trade durability for speed on a small disk-bound machine
        "--log-level=warn",
    ]


def _apiserver_args(pki: Pki, etcd_port: int, port: int, audit_policy: Path, audit_log: Path) -> list[str]:
    return [
        f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",  # else it looks for a default route, which a sandbox may lack
        f"--secure-port={port}",
        f"--tls-cert-file={pki.serving.cert}",
        f"--tls-private-key-file={pki.serving.key}",
        f"--client-ca-file={pki.ca.cert}",
        f"--service-account-issuer={SA_ISSUER}",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # Request-header authn (aggregated APIs); without it kcm and the scheduler log "missing content
        # for CA bundle ... requestheader-client-ca-file" over and over.
        f"--requestheader-client-ca-file={pki.ca.cert}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki.clients['front-proxy'].cert}",
        f"--proxy-client-key-file={pki.clients['front-proxy'].key}",
        "--authorization-mode=RBAC",
        # As on clusters that enable it (OpenShift does): an owner reference with blockOwnerDeletion needs `update` on
        # the owner's finalizers, so a run with a ServiceAccount's token proves that the operator's RBAC grants it.
        "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
        "--allow-privileged=true",
        # No real node network: the default lease reconciler would publish 127.0.0.1 as the endpoint of
        # the ``kubernetes`` Service, which Endpoints validation rejects (loopback), and log errors forever.
        "--endpoint-reconciler-type=none",
        "--profiling=false",
        # kwok's kubelet API for `kubectl logs`: on loopback (nodes.KUBELET_ADDRESS), not at the node's name.
        "--kubelet-preferred-address-types=InternalIP",
        # Image volumes (an oci:// model source) as Kubernetes 1.35 serves them by default (pkg/features).
        "--feature-gates=ImageVolume=true",
        # On SIGTERM, drain ordinary requests, then close the HTTP server within 2s; by default it waits
        # up to --request-timeout (60s) for open watches (kubectl -w, a running operator) to end.
        "--shutdown-send-retry-after=true",
        f"--audit-policy-file={audit_policy}",
        f"--audit-log-path={audit_log}",
        "--audit-log-maxsize=100",  # MB, then rotated (an operator's watches and patches stay far below)
    ]


def _control_loop_args(pki: Pki, kubeconfig: Path, port: int) -> list[str]:
    """What kcm and the scheduler share: identity, a loopback secure port, probes, one instance, no QPS cap."""
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--authorization-always-allow-paths={_HEALTH_PATHS}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--tls-cert-file={pki.serving.cert}",
        f"--tls-private-key-file={pki.serving.key}",
        "--leader-elect=false",  # one instance; a restart must not wait out an old lease
        "--profiling=false",
        *_CLIENT_RATE,
    ]


def _kcm_args(pki: Pki, kubeconfigs: dict[str, Path], port: int) -> list[str]:
    return [
        *_control_loop_args(pki, kubeconfigs["kube-controller-manager"], port),
        "--use-service-account-credentials=true",
        "--controllers=*",
        f"--root-ca-file={pki.ca.cert}",
        f"--service-account-private-key-file={pki.sa_key}",
        f"--cluster-signing-cert-file={pki.ca.cert}",
        f"--cluster-signing-key-file={pki.ca.key}",
    ]


def _scheduler_args(pki: Pki, kubeconfigs: dict[str, Path], port: int) -> list[str]:
    return _control_loop_args(pki, kubeconfigs["kube-scheduler"], port)


def _kwok_args(state: Path, kubeconfig: Path, port: int) -> list[str]:
    return [
        f"--kubeconfig={kubeconfig}",
        f"--config={state / 'kwok.yaml'}",
        f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
        f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}",
        f"--cidr={POD_CIDR}",
        # /healthz, and the kubelet API the API server proxies `kubectl logs` to: every node's address is loopback
        # (nodes.KUBELET_ADDRESS) and its daemonEndpoints port this one (--node-port); the logs come from SERVER_LOG.
        f"--server-address=127.0.0.1:{port}",
        f"--node-port={port}",
    ]


def _remove_state_dir(state: Path) -> None:
    """Delete a state dir, but only one this module made (or an empty one): ``--state-dir ~`` must not wipe home."""
    if not state.exists():
        return
    if not (state / _MARKER).exists() and any(state.iterdir()):
        raise ClusterError(f"{state} exists and is not a local cluster's state dir; choose another --state-dir")
    shutil.rmtree(state)


def _teardown(cluster: Cluster, grace: float = 10.0) -> list[Proc]:
    survivors = process.stop(cluster.processes, grace)
    if survivors:
        return survivors
    _remove_state_dir(cluster.state_dir)
    state_file(cluster.name).unlink(missing_ok=True)
    return []


def down(name: str = DEFAULT_NAME, progress: Progress = silent, grace: float = 10.0) -> bool:
    """Stop every component (SIGTERM, SIGKILL after ``grace``) and delete the state; False if none was recorded."""
    _check_name(name)
    lock = _lock_path(name)
    with file_lock(lock):
        cluster = get(name)
        if cluster is None:
            _remove_state_dir(clusters_dir() / name)
            progress(f"no cluster named {name}")
        else:
            running = ", ".join(f"{p.component} ({p.pid})" for p in cluster.processes if process.alive(p))
            progress(f"stopping cluster {name}: {running or 'nothing running'}")
            survivors = _teardown(cluster, grace)
            if survivors:
                listed = ", ".join(f"{p.component} (pid {p.pid})" for p in survivors)
                raise ClusterError(f"could not stop {listed}; state kept in {cluster.state_dir}")
            progress(f"cluster {name} is down; removed {cluster.state_dir}")
        # Nothing of the cluster is left, so its lock file goes too (one per name would pile up otherwise).
        lock.unlink(missing_ok=True)
        return cluster is not None


def attach(name: str, component: str, pid: int, log: str | Path = "") -> Cluster:
    """Record another process (e.g. the operator started by ``mmfleet demo``) so that ``down`` stops it too.

    It does not count towards the cluster's health: a dead operator does not make ``up`` restart the cluster.
    Dead processes recorded under the same ``component`` are forgotten, so restarts do not pile up.
    """
    with file_lock(_lock_path(name)):
        cluster = get(name)
        if cluster is None:
            raise ClusterError(f"no cluster named {name} to attach {component} (pid {pid}) to")
        try:
            exe = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
        except OSError as error:
            raise ClusterError(f"{component} (pid {pid}) is not running: {error}") from error
        kept = tuple(p for p in cluster.processes if p.pid != pid and (p.component != component or process.alive(p)))
        cluster = dataclasses.replace(cluster, processes=(*kept, Proc(component, pid, exe, str(log))))
        _save(cluster)
        return cluster


def _prometheus_proc(cluster: Cluster) -> Proc | None:
    return next((p for p in cluster.processes if p.component == prometheus.COMPONENT and process.alive(p)), None)


def _start_prometheus(cluster: Cluster, timeout: float) -> Cluster:
    """Start Prometheus again on its recorded port, with its configuration and data; the caller holds the lock."""
    kept = tuple(p for p in cluster.processes if p.component != prometheus.COMPONENT)
    proc = prometheus.launch(cluster.state_dir, prometheus.port_of(cluster.prometheus_url))
    cluster = dataclasses.replace(cluster, processes=(*kept, proc))
    _save(cluster)
    prometheus.wait_ready(proc, cluster.prometheus_url, timeout)
    return cluster


def _with_prometheus(name: str) -> Cluster:
    cluster = get(name)
    if cluster is None:
        raise ClusterError(f"no cluster named {name}; start one with: mmfleet cluster up --name {name}")
    if not cluster.prometheus_url:
        raise ClusterError(f"cluster {name} was started without Prometheus (--no-prometheus)")
    return cluster


def stop_prometheus(name: str = DEFAULT_NAME, grace: float = 10.0) -> Cluster:
    """Stop only Prometheus (SIGTERM, SIGKILL after ``grace``); its data and port stay for ``start_prometheus``."""
    _check_name(name)
    with file_lock(_lock_path(name)):
        cluster = _with_prometheus(name)
        mine = [p for p in cluster.processes if p.component == prometheus.COMPONENT]
        survivors = process.stop(mine, grace)
        if survivors:
            raise ClusterError(f"could not stop prometheus (pid {survivors[0].pid})")
        cluster = dataclasses.replace(
            cluster, processes=tuple(p for p in cluster.processes if p.component != prometheus.COMPONENT)
        )
        _save(cluster)
        return cluster


def start_prometheus(name: str = DEFAULT_NAME, timeout: float = 60.0) -> Cluster:
    """Start Prometheus again after ``stop_prometheus`` (same URL, same TSDB); a no-op while it runs."""
    _check_name(name)
    with file_lock(_lock_path(name)):
        cluster = _with_prometheus(name)
        if _prometheus_proc(cluster) is not None:
            return cluster
        return _start_prometheus(cluster, timeout)


def _lock_path(name: str) -> Path:
    clusters_dir().mkdir(parents=True, exist_ok=True)
    return clusters_dir() / f".{name}.lock"


def env(name: str = DEFAULT_NAME) -> str:
    """The shell lines that point kubectl, the operator and tests at the cluster: ``export KUBECONFIG=...``
    and, with Prometheus, ``export MMFLEET_PROMETHEUS_URL=...``."""
    cluster = get(name)
    if cluster is None:
        raise ClusterError(f"no cluster named {name}; start one with: mmfleet cluster up --name {name}")
    return cluster.env_line()


def status(name: str = DEFAULT_NAME) -> str:
    """A short human report: each component's pid and whether it runs, and the API server's readiness."""
    cluster = get(name)
    if cluster is None:
        return f"no cluster named {name}"
    lines = [f"cluster {name}: {'running' if _healthy(cluster) else 'NOT healthy'}", f"  server     {cluster.server}"]
    lines.append(f"  kubeconfig {cluster.kubeconfig}")
    lines.append(f"  state      {cluster.state_dir}")
    if cluster.prometheus_url:
        running = "running" if _prometheus_proc(cluster) is not None else "stopped"
        lines.append(f"  prometheus {cluster.prometheus_url} ({running}, scrape interval {cluster.scrape_interval})")
    for proc in cluster.processes:
        lines.append(f"  {proc.component:<24} pid {proc.pid:<8} {'running' if process.alive(proc) else 'stopped'}")
    return "\n".join(lines)
