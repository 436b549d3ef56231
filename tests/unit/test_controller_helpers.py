"""The controller's small judgements: what counts as a hand edit, and who owns a Deployment's replicas."""

from __future__ import annotations

from mmfleet import controller


def deployment(uid: str, generation: int) -> dict[str, object]:
    return {"metadata": {"uid": uid, "generation": generation, "resourceVersion": str(100 + generation)}}


def test_only_a_newer_generation_than_our_apply_is_a_hand_edit() -> None:
    controller.STATE.applied["u1"] = controller._fingerprint(deployment("u1", 4))
    assert not controller._edited_by_hand(deployment("u1", 4))  # status-only updates keep the generation
    assert not controller._edited_by_hand(deployment("u1", 3))  # a late event about an older generation
    assert controller._edited_by_hand(deployment("u1", 5))
    assert not controller._edited_by_hand(deployment("unknown", 9))  # nothing applied yet: nothing to compare


def test_kinds_without_generation_compare_resource_versions() -> None:
    account = {"metadata": {"uid": "sa", "resourceVersion": "7"}}
    controller.STATE.applied["sa"] = controller._fingerprint(account)
    assert not controller._edited_by_hand(account)
    assert controller._edited_by_hand({"metadata": {"uid": "sa", "resourceVersion": "8"}})


def test_replicas_owned_by_the_scaler_through_the_scale_subresource_or_apply() -> None:
    owned = {
        "metadata": {
            "managedFields": [
                {"manager": "mmfleet", "fieldsV1": {"f:spec": {"f:template": {}}}},
                {"manager": "mmfleet-autoscaler", "subresource": "scale", "fieldsV1": {"f:spec": {"f:replicas": {}}}},
            ]
        }
    }
    assert controller._scaler_owns_replicas(owned)
    renderer_only = {
        "metadata": {"managedFields": [{"manager": "mmfleet", "fieldsV1": {"f:spec": {"f:replicas": {}}}}]}
    }
    assert not controller._scaler_owns_replicas(renderer_only)
    assert controller._scaler_owns_replicas({"metadata": {"scalerOwnsReplicas": True}})  # as the index keeps it
