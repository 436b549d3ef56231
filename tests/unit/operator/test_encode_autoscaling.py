"""spec.disaggregation.encode.autoscaling: the encode tier scaled on its own signal (the items its serving pods send
it, their wait for it, against its share of the SLO), the serving tier held to the rest, and what status says."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from mmfleet import render
from mmfleet.api import MultimodalInference
from mmfleet.autoscaler import cycle, metrics
from mmfleet.autoscaler.encode import EncodeMemory, EncodeOutcome, decide_encode, encode_target
from mmfleet.render import SpecError
from mmfleet.status import ConditionRow, EncodeScaling, EncodeSeen, Observed, Scaling, compute_status
from mmfleet.validation import parse
from tests.helpers.operator_state import KEY, RecordingKube, fleet_body, operator, reconcile_once
from tests.helpers.repo import spec_doc
from tests.helpers.status import NOW, deployment
from tests.helpers.status import inference as status_inference

SLO = {"slo": {"metric": "ttft", "target": "1s", "percentile": 90}, "minReplicas": 1, "maxReplicas": 8}
SCALED = {"replicas": 2, "autoscaling": {"minReplicas": 1, "maxReplicas": 6, "share": 0.3}}
PRESENT: ConditionRow = ("EncodeMetricsAvailable", True, "SeriesPresent", "read")


def fleet(encode: dict[str, Any] | None = None, **spec: Any) -> MultimodalInference:
    spec.setdefault("autoscaling", SLO)
    return status_inference(disaggregation={"encode": encode or SCALED}, **spec)


def signals(**values: Any) -> metrics.Signals:
    base: dict[str, Any] = {
        "latency": 0.1, "request_rate": 20.0, "waiting": 0.0, "running": 4.0, "reporting": 2, "failing": 0.0
    }  # fmt: skip
    return metrics.Signals(**{**base, **values})


def run(
    inference: MultimodalInference,
    cycles: list[metrics.Signals | None],
    current: int = 2,
    ready: int = 2,
    outage: str | None = None,
) -> list[EncodeOutcome]:
    """Cycles 15 s apart on a tier of ``current`` replicas, ``ready`` Ready; the replicas it sets are Ready at once."""
    memory, outcomes = EncodeMemory(), []
    for i, seen in enumerate(cycles):
        if outcomes and outcomes[-1].scaled:
            current = ready = outcomes[-1].replicas
        outcome = decide_encode(
            inference,
            current,
            cycle.Pods(ready=ready),
            seen,
            outage,
            memory,
            NOW + timedelta(seconds=15 * i),
            interval=15,
            cold_start=60,
        )
        memory = outcome.memory
        outcomes.append(outcome)
    return outcomes


def test_the_tiers_split_the_slo_target_by_the_share() -> None:
    inference = fleet()
    assert encode_target(inference) == pytest.approx(0.3)
    assert cycle.serving_target(inference) == pytest.approx(0.7)
    assert cycle.serving_target(fleet({"replicas": 2})) == pytest.approx(1.0)  # a tier of fixed size takes no share


def test_a_slow_encode_tier_grows_alone_once_its_series_span_a_rate_window() -> None:
    """Its calls wait 0.6 s at P90 against its 0.3 s, its queue standing: once a latency window has passed on the
    same replicas, the policy's latency feedback."""
    outcomes = run(fleet(), [signals(latency=0.6, waiting=30.0)] * 10)
    assert all(o.replicas == 2 and "rate window" in o.reason for o in outcomes[:4])
    grown = next(o for o in outcomes if o.scaled)
    assert grown.replicas > 2
    assert "items/s" in grown.reason and "req/s" not in grown.reason
    assert "encode tier: 30% of 1s" in grown.reason
    assert grown.target == pytest.approx(0.3)


def test_an_encode_tier_within_its_share_stays() -> None:
    outcomes = run(fleet(), [signals(latency=0.1)] * 10)
    assert [o.replicas for o in outcomes] == [2] * 10


def test_the_encode_tier_stays_within_its_bounds() -> None:
    outcomes = run(fleet(), [signals(latency=3.0, waiting=400.0, request_rate=200.0)] * 40)
    assert max(o.replicas for o in outcomes) == 6  # maxReplicas
    below = run(fleet(), [signals()], current=0, ready=0)
    assert below[0].replicas == 1 and "0 -> 1, within minReplicas and maxReplicas" in below[0].reason


@pytest.mark.parametrize(
    ("seen", "outage", "words"),
    [
        (None, "http://prometheus:9090 unreachable", "http://prometheus:9090 unreachable"),
        (metrics.Signals(failed="a query refused"), None, "a query refused"),
        (
            signals(waiting=None, missing=("vllm:num_requests_waiting{mmfleet_io_encode}",)),
            None,
            "Prometheus has no vllm:num_requests_waiting{mmfleet_io_encode} for namespace=ml, fleet qwen",
        ),
        (signals(latency=float("inf")), None, "not trusted: latency = inf"),
        (signals(request_rate=-3.0), None, "not trusted: items/s = -3"),
        # the encode tier answers, fast, with no encoder outputs: the servers encode, and its signal reads low
        (signals(latency=0.005, failing=0.9), None, "90% of the calls to the encode tier brought no encoder outputs"),
    ],
)
def test_silence_and_bad_data_hold_the_encode_tier(
    seen: metrics.Signals | None, outage: str | None, words: str
) -> None:
    outcomes = run(fleet(), [seen] * 8, outage=outage)
    assert all(o.replicas == 2 for o in outcomes)
    assert words in outcomes[-1].reason and outcomes[-1].reason.endswith("holding 2")
    kind, ok, _, message = outcomes[-1].metrics
    assert (kind, ok) == ("EncodeMetricsAvailable", False) and words in message


def test_an_encode_tier_with_no_pod_ready_says_so() -> None:
    missing = signals(waiting=None, running=None, missing=("vllm:num_requests_waiting{mmfleet_io_encode}",))
    (outcome,) = run(fleet(), [missing], ready=0)
    assert (
        outcome.reason == "encode tier metrics unavailable (no encode pod is Ready, so none is scraped yet): holding 2"
    )
    assert outcome.metrics[1:3] == (None, "NoPodServing")


def test_the_encode_signals_count_the_queue_in_items() -> None:
    """Two images per request: 10 calls/s carry 20 items/s, so 3 waiting requests hold 6 items."""
    target = metrics.Target.of(fleet())
    assert target.encode is not None and target.slo.front_door is False
    key = ("ml", "qwen", "vllm")
    answers: dict[metrics.Query, metrics.Found] = {
        target.encode: {key: 0.25},
        "encode_items": {key: 20.0},
        "encode_calls": {key: 10.0},
        "encode_failures": {key: 1.0},
        "encode_waiting": {key: 3.0},
        "encode_running": {key: 1.0},
        "encode_reporting": {key: 2.0},
    }
    got = metrics.encode_signals(target, answers)
    assert (got.latency, got.request_rate, got.waiting, got.running, got.reporting) == (0.25, 20.0, 6.0, 2.0, 2)
    assert got.failing == 0.1  # one call in ten brought no outputs
    idle = metrics.encode_signals(target, {**answers, target.encode: {key: float("nan")}, "encode_calls": {key: 0.0}})
    assert idle.latency is None and idle.waiting == 3.0  # no call in the window: no percentile, one item a request
    gone = metrics.encode_signals(target, {k: v for k, v in answers.items() if k != "encode_waiting"})
    assert gone.missing == ("vllm:num_requests_waiting{mmfleet_io_encode}",)
    refused = metrics.encode_signals(target, answers, {"encode_items": "refused"})
    assert refused.failed == "refused"


def test_the_encode_queries_are_sent_only_for_fleets_that_scale_their_encode_tier() -> None:
    plain = metrics.Target.of(fleet({"replicas": 2}))
    assert plain.encode is None and plain.slo.front_door is True
    assert not any(
        isinstance(q, metrics.EncodeLatency) or q in metrics.ENCODE_QUERIES for q in metrics.build_queries([plain])
    )
    scaled = metrics.build_queries([metrics.Target.of(fleet())])
    assert set(metrics.ENCODE_QUERIES) <= set(scaled)
    waiting = scaled["encode_waiting"]
    assert 'vllm:num_requests_waiting{mmfleet_io_encode!=""}' in waiting
    assert '"mmfleet_io_inference", "$1", "mmfleet_io_encode"' in waiting
    (latency,) = [q for q in scaled if isinstance(q, metrics.EncodeLatency)]
    assert "mmfleet_encode_call_seconds_bucket" in scaled[latency]
    # the serving tier's part: its servers' own histogram, not the front door's
    (slo,) = [q for q in scaled if isinstance(q, metrics.Slo)]
    assert "mmfleet_front_door" not in scaled[slo] and "vllm:time_to_first_token_seconds_bucket" in scaled[slo]


def test_the_autoscaled_encode_deployment_leaves_its_replicas_to_the_scaler() -> None:
    scaled = render.render(parse(spec_doc(autoscaling=SLO, disaggregation={"encode": SCALED})), "eks")
    fixed = render.render(parse(spec_doc(autoscaling=SLO, disaggregation={"encode": {"replicas": 2}})), "eks")
    encode = {c["metadata"]["name"]: c for c in scaled if c["kind"] == "Deployment"}["qwen-encode"]
    assert "replicas" not in encode["spec"]
    assert {c["metadata"]["name"]: c for c in fixed if c["kind"] == "Deployment"}["qwen-encode"]["spec"][
        "replicas"
    ] == 2


@pytest.mark.parametrize(
    ("autoscaling", "words"),
    [
        ({"slo": {"metric": "itl", "target": "50ms"}}, "but spec has slo.metric itl"),
        ({"enabled": False}, "but spec has autoscaling off"),
        (None, "but spec has autoscaling off"),
    ],
)
def test_encode_autoscaling_needs_an_slo_it_can_take_a_share_of(autoscaling: dict[str, Any] | None, words: str) -> None:
    doc = spec_doc(disaggregation={"encode": SCALED})
    if autoscaling is not None:
        doc["spec"]["autoscaling"] = autoscaling
    with pytest.raises(SpecError) as caught:
        parse(doc)
    assert caught.value.problems[0].startswith("spec.disaggregation.encode.autoscaling: set, but")
    assert words in caught.value.problems[0]


def test_encode_autoscaling_bounds_are_checked() -> None:
    doc = spec_doc(autoscaling=SLO, disaggregation={"encode": {"autoscaling": {"minReplicas": 4, "maxReplicas": 2}}})
    with pytest.raises(SpecError) as caught:
        parse(doc)
    assert "minReplicas: 4 exceeds maxReplicas: 2" in caught.value.problems[0]


def test_status_shows_the_encode_tiers_decision_and_keeps_it_between_cycles() -> None:
    inference = fleet(replicas=2)
    decision = EncodeScaling(4, True, "P90 0.6s > target 0.3s, ...: 2 -> 4", 0.6, 0.3, PRESENT)
    scaling = Scaling(2, False, "held", 0.5, False, 1.0, (), encode=decision)
    status = compute_status(
        inference, Observed(deployment(2, 2), scaling=scaling, encode=EncodeSeen(deployment(2, 2))), None, NOW
    )
    assert status.encode is not None
    assert (status.encode.desired_replicas, status.encode.latency, status.encode.target) == (4, "0.6s", "0.3s")
    assert status.encode.last_scale_reason == "P90 0.6s > target 0.3s, ...: 2 -> 4"
    # 2 of the 4 the autoscaler asked for are ready
    assert next(c for c in status.conditions if c.type == "EncodeReady").status == "False"
    held = EncodeScaling(4, False, "holding 4", 0.2, 0.3, PRESENT)
    later = compute_status(
        inference,
        Observed(deployment(2, 2), scaling=Scaling(2, False, "held", 0.5, False, 1.0, (), encode=held),
                 encode=EncodeSeen(deployment(4, 4))),
        status,
        NOW,
    )  # fmt: skip
    assert later.encode is not None
    assert (later.encode.latency, later.encode.last_scale_reason) == ("0.2s", status.encode.last_scale_reason)
    assert next(c for c in later.conditions if c.type == "EncodeReady").status == "True"
    # a reconcile's status (no cycle) keeps the autoscaler's part
    refreshed = compute_status(inference, Observed(deployment(2, 2), encode=EncodeSeen(deployment(4, 4))), later, NOW)
    assert refreshed.encode is not None and refreshed.encode.latency == "0.2s"
    assert refreshed.encode.desired_replicas == 4
    # a cycle that measured nothing keeps the last percentile; the serving tier's SLO is shown against its part
    quiet = Scaling(
        2, False, "held", 0.5, False, 1.0, (), encode=EncodeScaling(4, False, "holding 4", None, 0.3, PRESENT)
    )
    idle = compute_status(
        inference, Observed(deployment(2, 2), scaling=quiet, encode=EncodeSeen(deployment(4, 4))), refreshed, NOW
    )
    assert idle.encode is not None and idle.encode.latency == "0.2s"
    assert idle.slo is not None and idle.slo.target == "0.7s"


def reconciled(live: int | None, applied: int, scaler_owns: bool = True) -> list[tuple[str, int]]:
    """One reconcile of an encode-autoscaled fleet whose encode Deployment the index shows at ``live`` replicas (None:
    not made yet) while the API server has ``applied`` (the scaler's last change may be newer than the index);
    ``scaler_owns``: whether the scaler already co-owns its replicas (not before its autoscaling is turned on)."""
    kube = RecordingKube()
    op = operator(kube)
    body = fleet_body(generation=2, replicas=1)
    body["spec"]["autoscaling"] = SLO
    body["spec"]["disaggregation"] = {"encode": SCALED}
    uid = body["metadata"]["uid"]
    if live is not None:
        meta = {"name": "qwen-encode", "controller": uid, "scalerOwnsReplicas": scaler_owns}
        op.indexes = {**op.indexes, "fleet_deployments": {KEY: [{"metadata": meta, "spec": {"replicas": live}}]}}
    kube.live_replicas["qwen-encode"] = applied
    assert not reconcile_once(op, body).retry
    return [scaled for scaled in kube.scaled_names if scaled[0] == "qwen-encode"]


def test_a_reconcile_leaves_the_encode_tiers_replicas_to_its_autoscaler() -> None:
    assert reconciled(live=2, applied=4) == [], "the scaler's newer 4 stands, however stale the index"
    assert reconciled(live=4, applied=9) == [("qwen-encode", 6)], "within maxReplicas"
    assert reconciled(live=None, applied=1) == [("qwen-encode", 2)], "a new tier starts at its spec's replicas"
    # Turned on for a tier of 3: the scaler takes the field over at 3 before the apply that leaves it out (server-side
    # apply would reset a field its only manager stops applying).
    assert reconciled(live=3, applied=3, scaler_owns=False) == [("qwen-encode", 3)]


def test_turning_the_encode_autoscaling_off_clears_its_fields_from_status() -> None:
    """A merge patch keeps the keys it does not name: those the autoscaler wrote in status.encode are named null."""
    kube = RecordingKube()
    op = operator(kube)
    body = fleet_body(generation=3, replicas=1)
    body["spec"]["autoscaling"] = SLO
    body["spec"]["disaggregation"] = {"encode": {"replicas": 2}}  # its autoscaling just taken out
    autoscaled = {"deployment": "qwen-encode", "replicas": 2, "readyReplicas": 2, "desiredReplicas": 2}
    tier = {**autoscaled, "latency": "0.6s", "target": "0.3s", "lastScaleReason": "...: 2 -> 4"}
    body["status"] = {"observedGeneration": 2, "encode": tier}
    assert not reconcile_once(op, body).retry
    written = kube.written[-1]["encode"]
    assert (written["latency"], written["target"], written["lastScaleReason"]) == (None, None, None)
    assert written["deployment"] == "qwen-encode"
