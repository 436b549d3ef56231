"""A traffic spike against a fleet on the local cluster, watched as a user would watch it.

``make demo`` plays it live and the end-to-end test asserts on the same record: the twin
(``mmfleet twin serve``) serves the fleet's pods and multiplies its traffic for a while; every
couple of seconds we read what a user can see: the Deployment's replicas and Ready pods, the
fleet's percentile latency as Prometheus computes it from the pods' histograms (the very query
the operator runs), and the operator's conditions and scale events.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmfleet.api import GROUP, PLURAL, VERSION, MultimodalInference, seconds
from mmfleet.autoscaler.metrics import Prometheus, Target
from mmfleet_lab.cluster import Cluster, process
from mmfleet_lab.twin.serve import Spike


@dataclass(frozen=True)
class Sample:
    """What a user sees of one fleet at ``t`` seconds after the twin started."""

    t: float
    replicas: int  # the Deployment's spec.replicas: what the autoscaler asked for
    ready: int
    latency: float | None  # the SLO percentile over the SLO window, from Prometheus; None: no answer
    target: float
    metrics_available: str  # the MetricsAvailable condition's status
    events: tuple[str, ...]  # scale events that appeared since the previous sample


class Twin:
    """``mmfleet twin serve`` for one cluster, as its own process, logging to a file."""

    def __init__(
        self,
        cluster: Cluster,
        rate: float,
        spikes: tuple[Spike, ...],
        log: Path,
        traces: Path,
        otlp_endpoint: str | None = None,
    ) -> None:
        """``otlp_endpoint``: where the pods with tracing on send their request spans (``--otlp-endpoint``)."""
        self.port = process.free_port()
        self.log = log
        argv = ["twin", "serve", "--cluster", cluster.name, "--port", str(self.port), "--rate", f"{rate:g}"]
        argv += [arg for s in spikes for arg in ("--spike", f"{s.start:g}:{s.end:g}:{s.factor:g}")]
        argv += ["--otlp-endpoint", otlp_endpoint] if otlp_endpoint else []
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mmfleet.cli", *argv, "--traces", str(traces)],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=dict(os.environ),
            )  # fmt: skip
        self.started = time.time()
        deadline = time.monotonic() + 30
        while not self._healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mmfleet twin serve did not come up; see {log}")
            time.sleep(0.2)

    def _healthy(self) -> bool:
        try:
            return process.http_get(f"http://127.0.0.1:{self.port}/healthz") == "ok"
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=15)


def follow(cluster: Cluster, namespace: str, name: str, started: float, interval: float = 2.0) -> Iterator[Sample]:
    """Samples of one autoscaled fleet every ``interval`` seconds, forever (the caller stops)."""
    from kubernetes import client

    api = cluster.api_client()
    apps, core, custom = client.AppsV1Api(api), client.CoreV1Api(api), client.CustomObjectsApi(api)
    prometheus = Prometheus(cluster.prometheus_url or "http://127.0.0.1:9")
    seen: set[str] = set()
    try:
        while True:
            tick = time.monotonic()
            obj: dict[str, Any] = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            inference = MultimodalInference.model_validate(obj)
            autoscaling = inference.spec.autoscaling
            assert autoscaling is not None and autoscaling.slo is not None, f"{namespace}/{name} is not autoscaled"
            slo = autoscaling.slo
            target = Target.of(inference)
            now = time.time()
            readings = prometheus.read([target], now)
            signals = readings.signals.get(target.key)
            deployment = apps.read_namespaced_deployment(name, namespace)
            conditions = {c.get("type"): c for c in (obj.get("status") or {}).get("conditions", [])}
            found = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
            fresh = [e for e in found if e.reason in ("ScaledUp", "ScaledDown") and e.metadata.uid not in seen]
            seen.update(e.metadata.uid for e in fresh)
            yield Sample(
                t=now - started,
                replicas=deployment.spec.replicas or 0,
                ready=deployment.status.ready_replicas or 0,
                latency=None if signals is None else signals.latency,
                target=seconds(slo.target),
                metrics_available=conditions.get("MetricsAvailable", {}).get("status", "Unknown"),
                events=tuple(e.message for e in sorted(fresh, key=lambda e: e.metadata.creation_timestamp)),
            )
            time.sleep(max(0.0, interval - (time.monotonic() - tick)))
    finally:
        prometheus.close()
        api.close()


def line(sample: Sample, spikes: tuple[Spike, ...]) -> str:
    """One terminal line: time, traffic, replicas, latency against the target."""
    factor = next((s.factor for s in spikes if s.start <= sample.t < s.end), 1.0)
    latency = "   -  " if sample.latency is None else f"{sample.latency:5.2f}s"
    mark = " OVER" if sample.latency is not None and sample.latency > sample.target else ""
    metrics = "" if sample.metrics_available == "True" else f"  metrics: {sample.metrics_available}"
    return (
        f"t={sample.t:5.0f}s  traffic x{factor:g}  replicas {sample.replicas} (ready {sample.ready})  "
        f"P90 {latency} / target {sample.target:g}s{mark}{metrics}"
    )


def plot(samples: list[Sample], spikes: tuple[Spike, ...], title: str, path: Path) -> None:
    """Replicas and latency against the target over the run, the spike shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.t for s in samples]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    top.step(t, [s.replicas for s in samples], where="post", label="replicas (desired)")
    top.step(t, [s.ready for s in samples], where="post", label="ready", linestyle="--")
    bottom.plot(t, [float("nan") if s.latency is None else s.latency for s in samples], label="P90 (Prometheus)")
    bottom.axhline(samples[0].target if samples else 0.0, color="black", linestyle="--", label="target")
    for axis in (top, bottom):
        for s in spikes:
            axis.axvspan(s.start, s.end, color="orange", alpha=0.15)
    top.set_ylabel("pods")
    bottom.set_ylabel("P90 latency (s)")
    bottom.set_xlabel("seconds since the traffic started (spike shaded)")
    top.set_title(title)
    top.legend(fontsize=8)
    bottom.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
