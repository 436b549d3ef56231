"""A real local Kubernetes control plane with kwok-simulated GPU nodes, built and run by mmfleet itself.

``up()`` builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok from their Go
modules on first use (``build``), makes certificates (``pki``), starts the processes on 127.0.0.1
(``cluster``) and creates fake GPU nodes labelled like each cloud's (``nodes``); kwok moves pods to
Ready after a delay (``stages``). ``collector`` validates configurations with, and runs, the real
OpenTelemetry Collector. A Prometheus server (``prometheus``) scrapes the pods that
``mmfleet twin serve`` simulates. Integration and end-to-end tests run against it.
"""

from mmfleet_lab.cluster.build import (
    Binaries,
    ensure_argocd,
    ensure_binaries,
    ensure_collector,
    ensure_epp,
    ensure_gateway_standin,
    ensure_helm,
    ensure_inference_sim,
)
from mmfleet_lab.cluster.cluster import (
    Cluster,
    attach,
    down,
    env,
    get,
    start_prometheus,
    status,
    stop_prometheus,
    up,
)
from mmfleet_lab.cluster.commands import register_cli
from mmfleet_lab.cluster.nodes import NodePool
from mmfleet_lab.cluster.process import ClusterError
from mmfleet_lab.cluster.stages import READY_DELAY_ANNOTATION

__all__ = [
    "READY_DELAY_ANNOTATION",
    "Binaries",
    "Cluster",
    "ClusterError",
    "NodePool",
    "attach",
    "down",
    "ensure_argocd",
    "ensure_binaries",
    "ensure_collector",
    "ensure_epp",
    "ensure_gateway_standin",
    "ensure_helm",
    "ensure_inference_sim",
    "env",
    "get",
    "register_cli",
    "start_prometheus",
    "status",
    "stop_prometheus",
    "up",
]
