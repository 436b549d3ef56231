"""The autoscalers users run today, re-implemented exactly enough to race ours on the same trace;
one module per competitor, and ``baselines`` for the set the benchmark runs.

Each class reproduces one real control law with its shipped defaults, as read from the upstream
source its docstring names (repository, path and commit). They are pure: the
memory each one keeps between cycles (stabilisation windows, moving averages, panic mode) lives
in the frozen state it returns. They see only what an ``Observation`` carries, so where the real
system reads per-pod series we say how the fleet-wide sums stand in for them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from mmfleet.autoscaler import Policy
from mmfleet_lab.bench.baselines.aibrix import AibrixApaPolicy
from mmfleet_lab.bench.baselines.dynamo import DynamoPlannerPolicy
from mmfleet_lab.bench.baselines.hpa import HpaPolicy
from mmfleet_lab.bench.baselines.keda import KedaPolicy
from mmfleet_lab.bench.baselines.knative import KpaPolicy
from mmfleet_lab.bench.baselines.kubeai import KubeAiPolicy
from mmfleet_lab.bench.baselines.static import StaticPolicy
from mmfleet_lab.bench.baselines.wva import WvaSaturationPolicy


def baselines(
    capacity_per_replica: float,
    max_num_seqs: int,
    *,
    inflight_per_replica: float | None = None,
    prompt_tokens_per_request: float = 3000.0,
    output_tokens_per_request: float = 150.0,
    demand_replicas: Sequence[int] | np.ndarray | None = None,
) -> list[Policy]:
    """B0-B7 as the benchmark runs them (docs/benchmarks.md, the autoscale section), for replicas that
    each sustain ``capacity_per_replica`` req/s at the SLO and admit ``max_num_seqs`` sequences.

    ``inflight_per_replica``: the in-flight count per replica at that capacity (Little: μ_SLO × mean
    E2E); None takes μ_SLO × the SLO target, right for an E2E SLO. The token sizes turn μ_SLO into the
    Dynamo planner's token throughputs (its profiling defaults: ISL 3000, OSL 150).
    ``demand_replicas``: the oracle's per-window need c_w; when given, adds static-peak (max) and
    static-mean (ceil of the mean).
    """
    policies: list[Policy] = []
    if demand_replicas is not None:
        c = np.asarray(demand_replicas, dtype=float)
        policies.append(StaticPolicy(int(c.max()), name="static-peak"))
        policies.append(StaticPolicy(math.ceil(float(c.mean()) - 1e-9), name="static-mean"))
    policies += [
        HpaPolicy(name="hpa-waiting", metric="waiting", target=5.0),
        HpaPolicy(
            name="hpa-inflight",
            metric="running+waiting",
            target=inflight_per_replica,
            capacity_per_replica=capacity_per_replica,
        ),
        KedaPolicy(name="keda"),
        KedaPolicy(name="keda-zero", min_replica_count=0, keep_alive=True),
        KpaPolicy(container_concurrency=max_num_seqs),
        AibrixApaPolicy(
            metric="running+waiting", target=inflight_per_replica, capacity_per_replica=capacity_per_replica
        ),
        KubeAiPolicy(target_requests=inflight_per_replica, capacity_per_replica=capacity_per_replica),
        WvaSaturationPolicy(),
        DynamoPlannerPolicy(
            prefill_tokens_per_replica=capacity_per_replica * prompt_tokens_per_request,
            decode_tokens_per_replica=capacity_per_replica * output_tokens_per_request,
        ),
    ]
    return policies
