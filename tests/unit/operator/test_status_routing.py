"""RoutingReady and status.routing: whether the InferencePool and its endpoint picker serve, or what is missing."""

from __future__ import annotations

from typing import Any

import pytest

from mmfleet.routing import RoutingCrds
from mmfleet.status import Observed, PodProblem, RoutingSeen, compute_status
from tests.helpers.status import NOW, conditions, deployment, inference

POOL = {"mode": "inferencePool"}
PICKER_UP = deployment(1, 1)
PICKER_DOWN = deployment(1, 0)


def routed(spec: dict[str, Any], seen: RoutingSeen | None, previous: Any = None) -> Any:
    return compute_status(inference(routing=spec), Observed(deployment=deployment(2, 2), routing=seen), previous, NOW)


@pytest.mark.parametrize(
    ("spec", "seen", "expected", "words"),
    [
        (POOL, RoutingSeen(RoutingCrds(), PICKER_UP), ("True", "PickerReady"), "InferencePool qwen and its endpoint"),
        (POOL, RoutingSeen(RoutingCrds(), None), ("False", "PickerNotReady"), "qwen-epp has no ready replica"),
        (POOL, RoutingSeen(RoutingCrds(), PICKER_DOWN), ("False", "PickerNotReady"), "FailClose"),
        (
            POOL,
            RoutingSeen(RoutingCrds(), PICKER_DOWN, [PodProblem("qwen-epp-5d8-x", "CrashLoopBackOff", "back-off 40s")]),
            ("False", "PickerFailing"),
            "pod qwen-epp-5d8-x: CrashLoopBackOff: back-off 40s (kubectl logs qwen-epp-5d8-x)",
        ),
        (
            POOL,
            RoutingSeen(RoutingCrds(pool=False), None),
            ("False", "InferencePoolCRDMissing"),
            "InferencePool (inference.networking.k8s.io/v1) is not served",
        ),
        (
            {**POOL, "gateway": {"name": "inference"}},
            RoutingSeen(RoutingCrds(route=False), PICKER_UP),
            ("False", "GatewayAPIMissing"),
            "spec.routing.gateway: inference, but HTTPRoute (gateway.networking.k8s.io/v1) is not served",
        ),
    ],
)
def test_routing_ready_says_what_serves_or_what_is_missing(
    spec: dict[str, Any], seen: RoutingSeen, expected: tuple[str, str], words: str
) -> None:
    status = routed(spec, seen)
    assert conditions(status)["RoutingReady"] == expected
    assert words in next(c.message for c in status.conditions if c.type == "RoutingReady")


def test_status_routing_names_the_pool_and_the_pickers_readiness() -> None:
    status = routed(POOL, RoutingSeen(RoutingCrds(), PICKER_UP))
    assert status.routing is not None
    assert (status.routing.pool, status.routing.picker, status.routing.picker_ready) == ("qwen", "qwen-epp", True)
    # Without the CRD there is no pool to name.
    assert routed(POOL, RoutingSeen(RoutingCrds(pool=False), None)).routing is None


def test_a_status_write_that_did_not_look_keeps_what_was_seen() -> None:
    """The autoscaler's writes carry no RoutingSeen: RoutingReady and status.routing stay as last written."""
    before = routed(POOL, RoutingSeen(RoutingCrds(), PICKER_UP))
    after = routed(POOL, None, before)
    assert conditions(after)["RoutingReady"] == ("True", "PickerReady")
    assert after.routing == before.routing
    assert conditions(routed(POOL, None))["RoutingReady"] == ("Unknown", "NotChecked")


def test_service_mode_has_no_routing_condition() -> None:
    status = routed({}, None)
    assert "RoutingReady" not in conditions(status)
    assert status.routing is None
