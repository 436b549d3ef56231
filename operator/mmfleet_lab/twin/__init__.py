"""The digital twin of a fleet of multimodal vLLM replicas (see ``docs/twin.md``).

The benchmark uses this API: ``scenario`` builds a workload, ``simulate`` runs a policy, or the
autoscaler the operator ships (``Shipped``), on a fleet serving it (seeing only what Prometheus and
the API server would show), and ``capacity_at_slo`` gives one replica's sustainable rate at an SLO
(the oracle's mu_SLO).
"""

from mmfleet_lab.twin.replica import (
    H100_QWEN25VL7B,
    H200_QWEN25VL7B,
    H200_QWEN25VL7B_WAKE_S,
    PROFILES,
    ReplicaParams,
    derive_profile,
)
from mmfleet_lab.twin.scenarios import NAMES as SCENARIOS
from mmfleet_lab.twin.scenarios import scenario
from mmfleet_lab.twin.shipped import Shipped
from mmfleet_lab.twin.sim import capacity_at_slo, simulate
from mmfleet_lab.twin.types import Requests, RunResult, Scenario

__all__ = [
    "H100_QWEN25VL7B",
    "H200_QWEN25VL7B",
    "H200_QWEN25VL7B_WAKE_S",
    "PROFILES",
    "SCENARIOS",
    "ReplicaParams",
    "Requests",
    "RunResult",
    "Scenario",
    "Shipped",
    "capacity_at_slo",
    "derive_profile",
    "scenario",
    "simulate",
]
