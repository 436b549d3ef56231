"""kwok Stage objects: what the fake kubelet does to nodes and pods.

kwok v0.8.0 ships no default stages (commit 7f2c8f92 removed the fallback; with none it exits
"no stages found"), so ``--config`` carries these. Each template is package data in ``kwok-stages/``,
copied verbatim from kwok's ``kustomize/stage/...`` at v0.8.0 (Apache-2.0; each file names its
source), the same source the binary is built from; the only change, made here, is a delay on
``pod-ready``, so a pod turns Ready some time after it is bound, like a real server loading its model:

- node-initialize: marks a managed node Ready, keeping the capacity/allocatable/addresses it was created with.
- node-heartbeat-with-lease: refreshes node conditions every ~10 min; kwok renews the node Lease
  (``--node-lease-duration-seconds``), which is what keeps kube-controller-manager from tainting it.
- pod-ready: Pending -> Running/Ready after ``mmfleet.io/ready-delay`` (a Go duration such as
  ``"30s"``, per pod) or else the cluster's default delay.
- pod-complete: Job-owned pods succeed once running (there is no container to exit).
- pod-delete: deletes terminating pods, since no kubelet will confirm the deletion.

Beside them a ClusterLogs: kwok's kubelet API answers `kubectl logs` for every pod's server container from one file
(``Cluster.server_log``), so the operator's read of a server's log goes through the API server as on a real node.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import yaml

from mmfleet.api import seconds
from mmfleet.render import CONTAINER

READY_DELAY_ANNOTATION = "mmfleet.io/ready-delay"

# In the order kwok is given them.
STAGE_FILES = (
    "node-initialize.yaml",
    "node-heartbeat-with-lease.yaml",
    "pod-ready.yaml",
    "pod-complete.yaml",
    "pod-delete.yaml",
)


def stage(file: str) -> str:
    """One stage template as kwok ships it."""
    return (files("mmfleet_lab.cluster") / "kwok-stages" / file).read_text(encoding="utf-8")


def ready_delay_ms(delay: str) -> int:
    """The default pod-ready delay in milliseconds, from a duration such as ``5s`` or ``500ms``."""
    try:
        return round(seconds(delay) * 1000)
    except ValueError as error:
        raise ValueError(f"pod-ready delay: {error}") from None


def _with_ready_delay(stage: str, default_ms: int) -> str:
    delay = (
        "  delay:\n"
        f"    durationMilliseconds: {default_ms}\n"
        "    durationFrom:\n"
        "      jq:\n"
        f"        expression: '.metadata.annotations[\"{READY_DELAY_ANNOTATION}\"]'\n"
    )
    head, sep, tail = stage.partition("  next:\n")
    assert sep, "pod-ready template has no next:"
    return head + delay + sep + tail


def kwok_config(pod_ready_delay: str, server_log: Path) -> str:
    """The multi-document YAML for ``kwok --config``: the stages, and ``server_log`` as every pod's server log."""
    delay = ready_delay_ms(pod_ready_delay)
    stages = [_with_ready_delay(stage(f), delay) if f == "pod-ready.yaml" else stage(f) for f in STAGE_FILES]
    logs = {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "ClusterLogs",
        "metadata": {"name": "server-log"},
        "spec": {"logs": [{"containers": [CONTAINER], "logsFile": str(server_log)}]},
    }
    return "---\n".join([*stages, yaml.safe_dump(logs, sort_keys=False)])
