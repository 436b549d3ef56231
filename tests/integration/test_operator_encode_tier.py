"""spec.disaggregation.encode on the lab cluster: both tiers come up (kwok's pods), the encode tier scales without the
serving one and is kept at its spec, a tier with no node to run on says so while the fleet serves, and taking the tier
out takes its children and the sidecar away (the server back on the serving port)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.fleet import Fleet, mmi
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.integration

NAME = "epd"
ENCODE = f"{NAME}-encode"


def encode_status(fleet: Fleet) -> dict[str, Any]:
    found: dict[str, Any] = fleet.status(NAME).get("encode") or {}
    return found


def containers(fleet: Fleet, deployment: str) -> list[str]:
    return [c.name for c in fleet.deployment(deployment).spec.template.spec.containers]


def pods(fleet: Fleet, component: str) -> set[str]:
    selector = f"mmfleet.io/inference={NAME},app.kubernetes.io/component={component}"
    return {p.metadata.name for p in fleet.core.list_namespaced_pod(fleet.namespace, label_selector=selector).items}


def test_the_encode_tier_comes_up_scales_on_its_own_and_goes(fleet: Fleet) -> None:
    fleet.create(mmi(NAME, cloud="eks", gpu={"type": "H100"}, disaggregation={"encode": {"replicas": 2}}))
    fleet.wait_ready(NAME)
    fleet.wait_condition(NAME, "EncodeReady", status="True", reason="EncodeReplicasReady")
    assert encode_status(fleet) == {"deployment": ENCODE, "replicas": 2, "readyReplicas": 2, "desiredReplicas": 2}
    assert containers(fleet, NAME) == ["server", "encode-proxy"]
    assert containers(fleet, ENCODE) == ["server"]
    ports = {c.name: [p.name for p in c.ports] for c in fleet.deployment(NAME).spec.template.spec.containers}
    assert ports == {"server": ["server"], "encode-proxy": ["http"]}  # the sidecar on the serving port
    assert fleet.core.read_namespaced_service(ENCODE, fleet.namespace).spec.selector["app.kubernetes.io/component"] == (
        "encoder"
    )
    # The fleet's selector (the scale subresource's, the autoscaler's pods) holds the serving pod only.
    assert fleet.status(NAME)["selector"] == f"mmfleet.io/inference={NAME},app.kubernetes.io/component=inference-server"
    serving = pods(fleet, "inference-server")
    assert len(serving) == 1 and len(pods(fleet, "encoder")) == 2

    # The encode tier scales without the serving one: no new serving pod, its replicas as they were.
    fleet.patch(NAME, {"disaggregation": {"encode": {"replicas": 3}}})
    wait_for(lambda: encode_status(fleet).get("readyReplicas") == 3, 60, "3 encode replicas ready")
    fleet.wait_condition(NAME, "EncodeReady", status="True", reason="EncodeReplicasReady")
    assert pods(fleet, "inference-server") == serving
    assert fleet.deployment(NAME).spec.replicas == 1

    # The tier is kept at its spec: a hand-made scale is undone at the next reconcile.
    fleet.apps.patch_namespaced_deployment_scale(ENCODE, fleet.namespace, {"spec": {"replicas": 1}})
    wait_for(lambda: fleet.deployment(ENCODE).spec.replicas == 3, 60, "the encode Deployment back at 3 replicas")

    # No node of the encode tier's GPU type (the cluster's eks nodes are H100): the tier says why, the fleet serves.
    fleet.patch(NAME, {"disaggregation": {"encode": {"gpu": {"type": "L4"}}}})
    failing = fleet.wait_condition(NAME, "EncodeReady", status="False", reason="EncodeReplicasFailing", timeout=90)
    assert f"encode tier {ENCODE}: pod {ENCODE}-" in failing["message"]
    assert "Unschedulable" in failing["message"] and "encode their requests' images themselves" in failing["message"]
    assert fleet.condition(NAME, "Ready")["status"] == "True"

    # Taken out: its children go, the serving pods lose the sidecar and the Service points at the server again.
    fleet.patch(NAME, {"disaggregation": {"encode": None}})

    def gone() -> bool:
        return (
            fleet.deployment(ENCODE) is None
            and not fleet.core.list_namespaced_service(fleet.namespace, field_selector=f"metadata.name={ENCODE}").items
        )

    wait_for(gone, 60, "the encode Deployment and Service pruned")
    wait_for(lambda: containers(fleet, NAME) == ["server"], 60, "the sidecar gone from the serving pods")
    fleet.wait_ready(NAME)
    assert "encode" not in fleet.status(NAME)
    assert not fleet.condition(NAME, "EncodeReady")
    ports = {c.name: [p.name for p in c.ports] for c in fleet.deployment(NAME).spec.template.spec.containers}
    assert ports == {"server": ["http"]}
