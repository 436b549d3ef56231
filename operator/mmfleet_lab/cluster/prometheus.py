"""The local cluster's Prometheus: Debian's ``prometheus`` package, run as one more component.

Its configuration is generated under ``<state>/prometheus/`` (``prometheus.yml``, TSDB in ``data/``).
It scrapes two jobs. ``mmfleet-pods``, whose targets come from ``file_sd_configs`` on
``targets/*.json``: the simulated pods ``mmfleet twin serve`` writes there (``write_targets``).
``mmfleet-operator``, the operator's own ``/metrics``, from ``operator-targets/*.json``
(``write_operator_target``): the job name and ``honor_labels`` of the chart's PodMonitor, so the
dashboard's and the alerts' queries read the same series here as in a cluster.
Each target group is one pod and carries the labels the rendered PodMonitor's relabelling gives the
series in a real cluster (``namespace``, ``pod``, ``mmfleet_io_inference``), so a PromQL query that
works here works there. ``--web.enable-lifecycle`` is on, for ``/-/reload`` and ``/-/quit``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mmfleet.api import seconds
from mmfleet.autoscaler.metrics import promql_duration
from mmfleet_lab.cluster import process
from mmfleet_lab.cluster.process import ClusterError, Proc

COMPONENT = "prometheus"
JOB = "mmfleet-pods"
OPERATOR_JOB = "mmfleet-operator"  # as charts/mmfleet/templates/podmonitor.yaml names it
DEFAULT_SCRAPE_INTERVAL = "15s"
TARGETS_REFRESH = "3s"  # file_sd also watches with inotify; this is the fallback re-read
_MAX_SCRAPE_TIMEOUT_MS = 10_000  # Prometheus' default timeout, which may not exceed the interval


@dataclass(frozen=True)
class Target:
    """One simulated pod as Prometheus should scrape it: ``address`` serves ``/pods/<ns>/<pod>/metrics``."""

    address: str
    namespace: str
    pod: str
    inference: str
    label: str = "mmfleet_io_inference"  # mmfleet_io_encode for an encode tier's pod, as its PodMonitor labels it


def interval_ms(text: str) -> int:
    """Milliseconds of a duration such as ``15s``, ``1m`` or ``500ms``; it must be positive."""
    try:
        ms = round(seconds(text) * 1000)
    except ValueError as error:
        raise ValueError(f"scrape interval {text!r}: {error}") from None
    if ms <= 0:
        raise ValueError(f"scrape interval {text!r}: must be more than 0")
    return ms


def home(state: Path) -> Path:
    return state / "prometheus"


def targets_dir(state: Path) -> Path:
    """Where target files (``*.json``, file_sd format) are picked up from."""
    return home(state) / "targets"


def operator_targets_dir(state: Path) -> Path:
    """Where the operator's metrics endpoint is written as a file_sd target (``write_operator_target``)."""
    return home(state) / "operator-targets"


def config(scrape_interval: str, targets: Path, operator_targets: Path | None = None) -> dict[str, Any]:
    """The configuration: the global intervals, the file_sd job of the simulated pods and the operator's."""
    operator_targets = operator_targets or targets.with_name("operator-targets")
    interval = promql_duration(scrape_interval)  # in the form Prometheus parses: whole seconds or milliseconds
    timeout = interval if interval_ms(scrape_interval) < _MAX_SCRAPE_TIMEOUT_MS else "10s"
    return {
        "global": {
            "scrape_interval": interval,
            "scrape_timeout": timeout,
            "evaluation_interval": interval,
        },
        "scrape_configs": [
            {
                "job_name": JOB,
                "file_sd_configs": [{"files": [str(targets / "*.json")], "refresh_interval": TARGETS_REFRESH}],
            },
            {
                "job_name": OPERATOR_JOB,
                # Its per-fleet series carry the fleet's namespace, as the PodMonitor's honorLabels keeps it.
                "honor_labels": True,
                "file_sd_configs": [{"files": [str(operator_targets / "*.json")], "refresh_interval": TARGETS_REFRESH}],
            },
        ],
    }


def binary() -> Path:
    found = shutil.which(COMPONENT)
    if found is None:
        raise ClusterError(
            "prometheus is not installed; install Debian's package (apt-get install prometheus, "
            "which `make system-deps` runs), or start the cluster without it (--no-prometheus)"
        )
    return Path(found)


def prepare(state: Path, scrape_interval: str) -> None:
    """Write the configuration and make the data and targets dirs."""
    targets_dir(state).mkdir(parents=True, exist_ok=True)
    operator_targets_dir(state).mkdir(exist_ok=True)
    (home(state) / "data").mkdir(exist_ok=True)
    text = yaml.safe_dump(config(scrape_interval, targets_dir(state), operator_targets_dir(state)), sort_keys=False)
    (home(state) / "prometheus.yml").write_text(text)


def launch(state: Path, port: int) -> Proc:
    """Start Prometheus on 127.0.0.1:``port`` with the prepared configuration and data (kept across restarts)."""
    args = [
        f"--config.file={home(state) / 'prometheus.yml'}",
        f"--storage.tsdb.path={home(state) / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--web.enable-lifecycle",
    ]
    return process.start(COMPONENT, binary(), args, state / "logs" / f"{COMPONENT}.log", state)


def wait_ready(proc: Proc, url: str, timeout: float) -> None:
    """Until ``/-/ready`` answers 200 (the TSDB is open and the configuration loaded)."""

    def ready() -> bool:
        process.http_get(f"{url}/-/ready")  # raises OSError until it answers 200
        return True

    process.wait_healthy(proc, ready, timeout)


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def target_groups(targets: Sequence[Target]) -> list[dict[str, Any]]:
    """file_sd target groups, one per pod, labelled as the PodMonitor relabelling labels a real pod's series."""
    return [
        {
            "targets": [t.address],
            "labels": {
                "__metrics_path__": f"/pods/{t.namespace}/{t.pod}/metrics",
                "namespace": t.namespace,
                "pod": t.pod,
                t.label: t.inference,
            },
        }
        for t in targets
    ]


def write_targets(path: Path, targets: Sequence[Target]) -> None:
    """Replace a target file atomically (a temporary file renamed over it): Prometheus never reads half of one.

    The temporary name does not end in ``.json``, so the ``*.json`` glob never picks it up.
    """
    _write_atomically(path, target_groups(targets))


def write_operator_target(state: Path, address: str, name: str = "operator") -> Path:
    """An operator's ``host:port`` serving /metrics, as a target of the ``mmfleet-operator`` job; the file's path."""
    path = operator_targets_dir(state) / f"{name}.json"
    _write_atomically(path, [{"targets": [address]}])
    return path


def _write_atomically(path: Path, groups: list[dict[str, Any]]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(groups, indent=1) + "\n")
    tmp.replace(path)
