"""The autoscaler ``mmfleet run`` ships, as the twin drives it: ``mmfleet.autoscaler.cycle.decide``.

The benchmark's ``mmfleet`` row must grade the configuration users get, so ``simulate`` does what the
operator's loop (``mmfleet.handlers.autoscale``) does every cycle: it hands ``cycle.decide`` the
Deployment's replicas, the pods as the API server lists them (Ready, starting, unschedulable, and
their measured creation -> Ready) and Prometheus' signals or why there are none, carries
``cycle.Memory`` to the next cycle and applies ``Outcome.replicas``. The fleet is a
``MultimodalInference`` that sets only the SLO and the replica bounds, and the interval and the
default cold start are ``OperatorConfig``'s defaults; so the capacity per replica is learned online,
and the warm-up hold, the idle rule and the clamp all apply.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from mmfleet.api import (
    AutoscalingSpec,
    DisaggregationSpec,
    EncodeAutoscalingSpec,
    EncodeTierSpec,
    ModelSpec,
    MultimodalInference,
    MultimodalInferenceSpec,
    ObjectMeta,
    RoutingSpec,
    SloSpec,
)
from mmfleet.autoscaler import cycle
from mmfleet.autoscaler.metrics import Signals, request_mix
from mmfleet.config import OperatorConfig
from mmfleet_lab.twin.observe import MetricView

_DEFAULTS = OperatorConfig.model_construct()  # the defaults, not this process' MMFLEET_* environment
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)  # the run's t = 0 on the operator's clock
MODEL = "Qwen/Qwen2.5-VL-7B-Instruct"  # the model the twin's replica profiles were calibrated on


def fleet(
    slo: SloSpec,
    min_replicas: int,
    max_replicas: int,
    capacity_per_replica: float | None = None,
    encode: EncodeAutoscalingSpec | None = None,
) -> MultimodalInference:
    """The resource a user would apply for the simulated fleet: the SLO, the replica bounds and, if given, a
    profiled capacity per replica; with ``encode``, an encode tier scaled on its own within those bounds and share
    (``spec.disaggregation.encode.autoscaling``: the serving tier is then held to the rest of the target); defaults
    elsewhere."""
    autoscaling = AutoscalingSpec(
        min_replicas=min_replicas, max_replicas=max_replicas, slo=slo, capacity_per_replica=capacity_per_replica
    )
    # minReplicas 0 needs the endpoint picker in front (its flow control holds requests while no replica is Ready).
    routing = RoutingSpec(mode="inferencePool" if min_replicas == 0 else "service")
    return MultimodalInference(
        metadata=ObjectMeta(name="twin"),
        spec=MultimodalInferenceSpec(
            model=ModelSpec(name=MODEL),
            autoscaling=autoscaling,
            routing=routing,
            disaggregation=DisaggregationSpec(
                encode=None if encode is None else EncodeTierSpec(replicas=encode.min_replicas, autoscaling=encode)
            ),
        ),
    )


def signals(view: MetricView, picker_held: float = 0.0, held: float | None = None) -> Signals:
    """The operator's ``Signals`` from the twin's answer to the same queries (``metrics.signals_for``); with
    ``picker_held``, the requests the picker's flow control holds count as waiting (a lab variant, see ``Shipped``);
    ``held``: the picker's held requests, which the operator reads for a fleet with minReplicas 0."""
    return Signals(
        held=held,
        latency=view.latency,
        request_rate=view.request_rate,
        waiting=None if view.waiting is None else view.waiting + picker_held,
        running=view.running,
        kv_cache_usage=view.kv_cache_usage,
        missing=view.missing,
        mix=request_mix(view.prompt_per_request, view.output_per_request),
    )


@dataclass(frozen=True)
class Shipped:
    """``cycle.decide`` with the operator's default settings, named ``mmfleet`` in the benchmark; with
    ``capacity_per_replica``, the fleet's spec also sets ``spec.autoscaling.capacityPerReplica`` (a profile)."""

    name: str = "mmfleet"
    capacity_per_replica: float | None = None
    # A lab variant, not what ships: the requests the picker's flow control holds (its gauge
    # ``inference_extension_flow_control_queue_size`` as last scraped) are added to the servers' waiting requests.
    picker_held: bool = False
    # E/PD: the fleet's encode tier scales on its own (its bounds and share); the serving tier is held to the rest of
    # the SLO's target (``cycle.serving_target``) on its servers' own latency (run it with ``server_clock``).
    encode: EncodeAutoscalingSpec | None = None
    interval: float = _DEFAULTS.autoscale_interval
    default_cold_start: float = _DEFAULTS.default_cold_start

    def initial_state(self) -> cycle.Memory:
        return cycle.Memory()

    def decide(self, inference: MultimodalInference, seen: cycle.Seen, t: float, memory: cycle.Memory) -> cycle.Outcome:
        return cycle.decide(
            inference,
            seen,
            memory,
            EPOCH + timedelta(seconds=t),
            interval=self.interval,
            default_cold_start=self.default_cold_start,
        )
