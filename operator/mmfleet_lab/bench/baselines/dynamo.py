"""B7: the NVIDIA Dynamo SLA planner in throughput mode."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mmfleet.api import clamp_replicas
from mmfleet.autoscaler import Decision
from mmfleet_lab.bench.baselines._shared import (
    _hold,
    _s,
    _v,
    _verdict,
)
from mmfleet_lab.twin.policy import LabObservation


@dataclass(frozen=True)
class DynamoPlannerPolicy:
    """B7, Dynamo's SLA planner in throughput mode with the constant predictor (ai-dynamo/dynamo
    docs/planner/sla_planner.md @240df6a; defaults in components/src/dynamo/planner/config/defaults.py @1ca6015).

    Law, every 180 s, with next = the last interval (constant predictor), requests/s = arrivals (the
    frontend's count) and ISL/OSL = tokens per finished request:
    prefill = ceil(requests/s × ISL × min(1, TTFT / expected TTFT) / prefill tokens/s per replica);
    decode = ceil(requests/s × OSL / decode tokens/s per replica at ITL target / (ITL / expected ITL));
    desired = max(prefill, decode, min_endpoint) within [min, max]. Our replicas serve both phases
    (aggregated), so the larger of the two pools sizes the fleet. The throughputs are per replica at
    the SLA; ``decode_profile`` maps ITL (s) to decode tokens/s per replica for the corrected ITL
    (without one, the correction cannot change decode capacity). Like Dynamo, it holds while a
    previous scaling is still starting and when the interval saw no requests (NaN metrics).
    """

    prefill_tokens_per_replica: float
    decode_tokens_per_replica: float
    name: str = "dynamo-planner"
    interval: float = 180.0  # adjustment_interval
    ttft_target: float = 0.5
    itl_target: float = 0.05
    expected_ttft: float | None = None
    expected_itl: float | None = None
    decode_profile: tuple[tuple[float, float], ...] = ()
    min_endpoint: int = 1

    def initial_state(self) -> None:
        return None

    def _decode_capacity(self, itl: float) -> float:
        if not self.decode_profile:
            return self.decode_tokens_per_replica
        points = sorted(self.decode_profile)
        return float(np.interp(itl, [p[0] for p in points], [p[1] for p in points]))

    def decide(self, observation: LabObservation, state: None) -> Decision:
        obs = observation
        if obs.starting > 0:
            return _hold(obs, f"{obs.starting} pods from the last adjustment still starting", state)
        prompt, output, finished = obs.prompt_tokens_rate, obs.generation_tokens_rate, obs.request_rate
        if prompt is None or output is None or not finished:
            return _hold(obs, "no requests or token metrics this interval (skipping adjustment)", state)
        # next_requests (the frontend's request count, i.e. arrivals when known) x next_isl / interval.
        requests = obs.arrival_rate if obs.arrival_rate is not None else finished
        isl, osl = prompt / finished, output / finished
        p_corr = obs.mean_ttft / self.expected_ttft if obs.mean_ttft and self.expected_ttft else 1.0
        d_corr = obs.mean_itl / self.expected_itl if obs.mean_itl and self.expected_itl else 1.0
        prefill_load = requests * isl * min(1.0, p_corr)
        prefill = math.ceil(prefill_load / self.prefill_tokens_per_replica)
        corrected_itl = self.itl_target / d_corr
        decode = math.ceil(requests * osl / self._decode_capacity(corrected_itl))
        wanted = clamp_replicas(max(prefill, decode, self.min_endpoint), obs.min_replicas, obs.max_replicas)
        text = (
            f"{_v(requests)} req/s: prefill {_v(prefill_load)} tok/s (correction {_v(p_corr)}) needs {prefill}, "
            f"decode {_v(requests * osl)} tok/s at ITL {_s(corrected_itl)} needs {decode}"
        )
        return _verdict(obs, wanted, text, state)
