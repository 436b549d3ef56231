"""The handlers' small judgements: what counts as a hand edit, and who owns a Deployment's replicas."""

from __future__ import annotations

from mmfleet.handlers import autoscale, fleet


def deployment(uid: str, generation: int) -> dict[str, object]:
    return {"metadata": {"uid": uid, "generation": generation, "resourceVersion": str(100 + generation)}}


def test_only_a_newer_generation_than_our_apply_is_a_hand_edit() -> None:
    fleet.STATE.applied["u1"] = fleet._fingerprint(deployment("u1", 4))
    assert not fleet._edited_by_hand(deployment("u1", 4))  # status-only updates keep the generation
    assert not fleet._edited_by_hand(deployment("u1", 3))  # a late event about an older generation
    assert fleet._edited_by_hand(deployment("u1", 5))
    assert not fleet._edited_by_hand(deployment("unknown", 9))  # nothing applied yet: nothing to compare


def test_kinds_without_generation_compare_resource_versions() -> None:
    account = {"metadata": {"uid": "sa", "resourceVersion": "7"}}
    fleet.STATE.applied["sa"] = fleet._fingerprint(account)
    assert not fleet._edited_by_hand(account)
    assert fleet._edited_by_hand({"metadata": {"uid": "sa", "resourceVersion": "8"}})


def test_replicas_owned_by_the_scaler_through_the_scale_subresource_or_apply() -> None:
    owned = {
        "metadata": {
            "managedFields": [
                {"manager": "mmfleet", "fieldsV1": {"f:spec": {"f:template": {}}}},
                {"manager": "mmfleet-autoscaler", "subresource": "scale", "fieldsV1": {"f:spec": {"f:replicas": {}}}},
            ]
        }
    }
    assert fleet._scaler_owns_replicas(owned)
    renderer_only = {
        "metadata": {"managedFields": [{"manager": "mmfleet", "fieldsV1": {"f:spec": {"f:replicas": {}}}}]}
    }
    assert not fleet._scaler_owns_replicas(renderer_only)
    assert fleet._scaler_owns_replicas({"metadata": {"scalerOwnsReplicas": True}})  # as the index keeps it


def test_the_autoscaler_snapshot_takes_fleets_with_autoscaling_and_their_children() -> None:
    def fleet(name: str, **extra: object) -> dict[str, object]:
        return {"metadata": {"name": name, "namespace": "ml", **extra}, "spec": {"autoscaling": {"maxReplicas": 4}}}

    fleets = {
        ("ml", "a"): [fleet("a")],
        ("ml", "leaving"): [fleet("leaving", deletionTimestamp="2026-11-29T00:00:00Z")],
        ("ml", "fixed"): [{"metadata": {"name": "fixed", "namespace": "ml"}, "spec": {"replicas": 2}}],
    }
    deployments = {("ml", "a"): [{"spec": {"replicas": 3}}], ("ml", "fixed"): [{"spec": {"replicas": 2}}]}
    pods = {("ml", "a"): [{"metadata": {"name": "a-1"}}, {"metadata": {"name": "a-2"}}]}
    views = autoscale.autoscaled_fleets(fleets, deployments, pods)  # plain mappings stand in for kopf indexes
    assert [(v.key, v.deployment, len(v.pods)) for v in views] == [(("ml", "a"), {"spec": {"replicas": 3}}, 2)]
