"""The real OpenTelemetry Collector on 127.0.0.1, for tests and the demo: validate a config, or run one.

The binary is the one ``build.ensure_collector`` compiles with the Collector Builder: the components of
the generated per-cloud configurations plus the file exporter, so a test can check a configuration with the
collector's own ``validate`` and see real spans arrive in a file.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mmfleet_lab.cluster import process
from mmfleet_lab.cluster.build import Progress, ensure_collector, silent

COMPONENT = "otelcol"  # its name in process logs and in a cluster's state, when attached to one


@dataclass(frozen=True)
class Validation:
    """What ``otelcol validate`` said: ok, and its output (the reason, naming the component, when not ok)."""

    ok: bool
    output: str


class PodEnvironmentError(RuntimeError):
    """The pod-like environment ``validate`` needs (a private mount namespace) cannot be made here."""


# The collector's ``validate`` builds every component, and some look at their surroundings while being built:
# the ``eks`` detector loads the in-cluster Kubernetes config (rest.InClusterConfig: KUBERNETES_SERVICE_HOST/PORT
# and the service-account token file at a fixed path), and ``sigv4auth`` resolves the AWS credential chain. A pod
# has both; here the token file is a dummy mounted in a private mount namespace of the validate process only
# (``unshare``), the credentials are a fake pair in the environment (never used: nothing is sent), and EC2 instance
# metadata is switched off so nothing is asked of the network.
_TOKEN_DIR = "/run/secrets/kubernetes.io/serviceaccount"
POD_ENVIRONMENT = {
    "MY_POD_IP": "127.0.0.1",
    "KUBERNETES_SERVICE_HOST": "127.0.0.1",
    "KUBERNETES_SERVICE_PORT": "6443",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
    "AWS_SECRET_ACCESS_KEY": "not-a-secret",
}
_IN_POD = f'mount -t tmpfs tmpfs /run && mkdir -p {_TOKEN_DIR} && echo not-a-token > {_TOKEN_DIR}/token && exec "$@"'


def pod_environment() -> list[str]:
    """The command prefix that runs a program in the pod-like environment, probed whole (``true`` run through it).

    Probing ``unshare -m`` alone is not enough: some hosts grant the mount namespace but refuse the tmpfs mount,
    and every validate would then fail with the mount's error instead of saying it cannot run here.
    """
    unshare = shutil.which("unshare")
    if unshare is None:
        raise PodEnvironmentError("cannot run the collector's validate as in a pod: no unshare command")
    command = [unshare, "-m", "--propagation", "private", "sh", "-c", _IN_POD, "sh"]
    probe = subprocess.run(
        [*command, "true"], capture_output=True, text=True, check=False, env={"PATH": "/usr/bin:/bin"}
    )
    if probe.returncode != 0:
        raise PodEnvironmentError(
            "cannot run the collector's validate as in a pod (a private mount namespace with a tmpfs on /run for "
            f"the service-account token): {probe.stderr.strip() or f'exit {probe.returncode}'}"
        )
    return command


def validate(config: Mapping[str, Any], workdir: Path, env: Mapping[str, str] | None = None) -> Validation:
    """Run the collector's ``validate --config`` on ``config`` as it would run in a pod (``POD_ENVIRONMENT``).

    ``env`` adds the variables the config's ``${env:...}`` references read (what the Secret would hold).
    ``PodEnvironmentError`` when this host cannot make that environment (tests skip on it).
    """
    command = pod_environment()
    path = workdir / "validate.yaml"
    path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
    done = subprocess.run(
        [*command, str(ensure_collector()), "validate", f"--config={path}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PATH": "/usr/bin:/bin", **POD_ENVIRONMENT, **(env or {})},
    )
    return Validation(ok=done.returncode == 0, output=(done.stdout + done.stderr).strip())


@dataclass(frozen=True)
class RunningCollector:
    """A collector receiving OTLP on 127.0.0.1 and writing every span it gets to ``output`` (OTLP JSON lines)."""

    endpoint: str  # OTLP/gRPC, http://127.0.0.1:<port>
    http_endpoint: str  # OTLP/HTTP base URL; traces go to <http_endpoint>/v1/traces
    output: Path
    log: Path
    proc: process.Proc

    def spans(self) -> list[dict[str, Any]]:
        """Every span written so far, each with its resource's attributes under ``"resource"`` (flat dict)."""
        return read_spans(self.output)


def read_spans(output: Path) -> list[dict[str, Any]]:
    """The spans in a file exporter's output (one OTLP JSON request a line), each with its resource's attributes
    under ``"resource"`` (flat dict); a line cut short by a collector still writing is skipped, not fatal."""
    found: list[dict[str, Any]] = []
    if not output.exists():
        return found
    for line in output.read_text().splitlines():
        try:
            request = json.loads(line) if line.strip() else {}
        except json.JSONDecodeError:
            continue
        for resource_spans in request.get("resourceSpans", []):
            resource = attributes(resource_spans.get("resource", {}).get("attributes", []))
            for scope in resource_spans.get("scopeSpans", []):
                for span in scope.get("spans", []):
                    found.append({**span, "resource": resource})
    return found


def attributes(items: list[dict[str, Any]]) -> dict[str, Any]:
    """OTLP JSON key/value attributes as a dict (int64 values are strings in OTLP JSON, as sent)."""
    out: dict[str, Any] = {}
    for item in items:
        value = item.get("value", {})
        out[item["key"]] = next(iter(value.values()), None) if value else None
    return out


def file_config(grpc_port: int, http_port: int, output: Path) -> dict[str, Any]:
    """OTLP (gRPC and HTTP) on 127.0.0.1 -> the file exporter, flushed each second; the collector's own metrics off.

    The file is rotated at 100 MB with one backup kept: the demo's collector stays up with the cluster, and
    would otherwise fill the disk at the twin's base rate over days.
    """
    return {
        "receivers": {
            "otlp": {
                "protocols": {
                    "grpc": {"endpoint": f"127.0.0.1:{grpc_port}"},
                    "http": {"endpoint": f"127.0.0.1:{http_port}"},
                }
            }
        },
        "exporters": {
            "file": {
                "path": str(output),
                "flush_interval": "1s",
                "rotation": {"max_megabytes": 100, "max_backups": 1},
            }
        },
        "service": {
            "pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["file"]}},
            "telemetry": {"metrics": {"level": "none"}},
        },
    }


def start_collector(workdir: Path, progress: Progress = silent) -> RunningCollector:
    """Start the collector with ``file_config`` in ``workdir`` and return once both receivers listen.

    The caller stops it (``process.stop``), or hands it to something that will (the demo attaches it to
    the local cluster, so ``mmfleet cluster down`` ends it); if it never comes up, it is stopped here.
    """
    binary = ensure_collector(progress)
    workdir.mkdir(parents=True, exist_ok=True)
    grpc_port, http_port = process.free_port(), process.free_port()
    output = workdir / "spans.jsonl"
    path = workdir / "collector.yaml"
    path.write_text(yaml.safe_dump(file_config(grpc_port, http_port, output), sort_keys=False))
    log = workdir / "collector.log"
    proc = process.start(COMPONENT, binary, [f"--config={path}"], log, workdir)
    try:
        process.wait_healthy(proc, lambda: _listening(grpc_port) and _listening(http_port), timeout=60)
    except BaseException:
        process.stop([proc], grace=5)
        raise
    return RunningCollector(
        endpoint=f"http://127.0.0.1:{grpc_port}",
        http_endpoint=f"http://127.0.0.1:{http_port}",
        output=output,
        log=log,
        proc=proc,
    )


@contextmanager
def run_collector(workdir: Path, progress: Progress = silent) -> Iterator[RunningCollector]:
    """``start_collector``, yielded, and stopped on exit.

    Stopping is SIGTERM: the collector drains its pipeline and the file exporter flushes, so ``spans()``
    after the block sees everything that was accepted.
    """
    running = start_collector(workdir, progress)
    try:
        yield running
    finally:
        process.stop([running.proc], grace=30)


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0
