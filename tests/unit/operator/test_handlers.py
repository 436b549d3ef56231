"""The handlers' judgements: hand edits, replicas ownership, caching, status writes, liveness."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import socket
import time
from typing import Any, cast

import kopf
import pytest

from mmfleet.api import MultimodalInferenceStatus
from mmfleet.handlers import autoscale, connection, fleet
from mmfleet.handlers.state import STATE, parse_spec, render_children, write_status
from mmfleet.kube import Kube
from mmfleet.render import INFERENCE_LABEL

NOW = "2026-12-01T00:00:00Z"


pytestmark = pytest.mark.usefixtures("fresh_operator_state")  # each test starts from an empty operator memory


def deployment(uid: str, generation: int) -> dict[str, object]:
    return {"metadata": {"uid": uid, "generation": generation, "resourceVersion": str(100 + generation)}}


def test_only_a_newer_generation_than_our_apply_is_a_hand_edit() -> None:
    applied = fleet._fingerprint(deployment("u1", 4))
    assert not fleet.edited_by_hand(deployment("u1", 4), applied)  # status-only updates keep the generation
    assert not fleet.edited_by_hand(deployment("u1", 3), applied)  # a late event about an older generation
    assert fleet.edited_by_hand({**deployment("u1", 5), "spec": {"paused": True}}, applied)
    assert not fleet.edited_by_hand(deployment("unknown", 9), None)  # nothing applied yet: nothing to compare


def test_kinds_without_generation_compare_resource_versions() -> None:
    account = {"metadata": {"uid": "sa", "resourceVersion": "7"}}
    applied = fleet._fingerprint(account)
    assert not fleet.edited_by_hand(account, applied)
    assert fleet.edited_by_hand({"metadata": {"uid": "sa", "resourceVersion": "8"}}, applied)


SCALER_FIELDS = {"manager": "mmfleet-autoscaler", "subresource": "scale", "fieldsV1": {"f:spec": {"f:replicas": {}}}}


def scaled(generation: int, replicas: int, managers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    meta = {"uid": "d", "generation": generation, "managedFields": managers}
    return {"metadata": meta, "spec": {"replicas": replicas, "template": {"image": "vllm"}, **spec}}


def test_the_autoscalers_own_scale_is_not_a_hand_edit_but_a_hand_scale_or_spec_edit_is() -> None:
    applied = fleet._fingerprint(scaled(4, 3, [SCALER_FIELDS]))
    assert not fleet.edited_by_hand(scaled(5, 7, [SCALER_FIELDS]), applied)  # the autoscaler went 3 -> 7
    kubectl = {"manager": "kubectl", "fieldsV1": {"f:spec": {"f:replicas": {}}}}
    assert fleet.edited_by_hand(scaled(5, 7, [kubectl]), applied)  # kubectl scale took the field over
    assert fleet.edited_by_hand(scaled(5, 3, [SCALER_FIELDS], paused=True), applied)  # an edit beside replicas
    # The first apply of an autoscaled fleet: replicas defaulted to 1, owned by no one; then the autoscaler's clamp.
    first = fleet._fingerprint(scaled(1, 1, [{"manager": "mmfleet", "fieldsV1": {"f:spec": {"f:template": {}}}}]))
    assert not fleet.edited_by_hand(scaled(2, 2, [SCALER_FIELDS]), first)
    fixed = fleet._fingerprint(scaled(4, 3, [{"manager": "mmfleet", "fieldsV1": {"f:spec": {"f:replicas": {}}}}]))
    assert fleet.edited_by_hand(scaled(5, 7, [kubectl]), fixed)  # no autoscaling: kubectl scale is repaired


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


async def _healthz(port: int) -> int:
    """The status of the operator's liveness endpoint (``metrics_export``), with its probe handlers registered."""
    import aiohttp

    from mmfleet import metrics_export

    started = asyncio.Event()
    started.set()
    runner = await metrics_export.serve(
        f"127.0.0.1:{port}", started, settings=kopf.OperatorSettings(), indices=cast(Any, {}), memo=kopf.Memo()
    )
    try:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/healthz") as response:
            return response.status
    finally:
        await runner.cleanup()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def test_liveness_turns_red_when_the_autoscaling_loop_stops_cycling() -> None:
    async def loop() -> None:
        await asyncio.Event().wait()

    async def scenario() -> list[int]:
        STATE.autoscaler = asyncio.create_task(loop())  # alive
        interval = STATE.config.autoscale_interval
        try:
            STATE.autoscaler_cycled = time.monotonic() - interval  # cycling
            cycling = await _healthz(_free_port())
            STATE.autoscaler_cycled = time.monotonic() - 3 * interval - autoscale.STALL_MARGIN - 1  # stuck
            stuck = await _healthz(_free_port())
            STATE.autoscaler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await STATE.autoscaler
            STATE.autoscaler_cycled = time.monotonic()
            ended = await _healthz(_free_port())
        finally:
            STATE.autoscaler = None
        return [cycling, stuck, ended]

    assert asyncio.run(scenario()) == [200, 500, 500]


def test_a_spec_is_parsed_once_per_generation_and_afresh_after_a_change() -> None:
    def body(generation: int, replicas: int) -> dict[str, Any]:
        return {
            "apiVersion": "mmfleet.io/v1alpha1",
            "kind": "MultimodalInference",
            "metadata": {"name": "a", "namespace": "ml", "uid": "u-parse", "generation": generation},
            "spec": {"model": {"name": "Qwen/Qwen2.5-VL-3B-Instruct"}, "replicas": replicas},
        }

    first = parse_spec(body(1, 2))
    assert parse_spec(body(1, 2)) is first  # the autoscaler's every cycle, a status refresh
    assert render_children(first, "eks", False) is render_children(first, "eks", False)
    changed = parse_spec(body(2, 3))
    assert changed.spec.replicas == 3
    deployment = next(c for c in render_children(changed, "eks", False) if c["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 3


class RecordingKube(Kube):
    """Records status writes instead of sending them."""

    def __init__(self) -> None:
        self.written: list[dict[str, Any]] = []

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.written.append(status)


def test_status_is_written_only_when_it_changes_whatever_the_order_of_conditions() -> None:
    def status(*conditions: tuple[str, str, str]) -> MultimodalInferenceStatus:
        return MultimodalInferenceStatus.model_validate(
            {
                "conditions": [
                    {"type": t, "status": s, "message": m, "lastTransitionTime": NOW} for t, s, m in conditions
                ]
            }
        )

    body = {"metadata": {"name": "order", "namespace": "ml"}}
    kube = RecordingKube()
    STATE.kube = kube
    try:
        reconciled = status(("Ready", "False", "0/1 ready"), ("MetricsAvailable", "Unknown", "no pod is Ready"))
        assert write_status(body, reconciled, None)
        autoscaled = status(("MetricsAvailable", "Unknown", "no pod is Ready"), ("Ready", "False", "0/1 ready"))
        assert not write_status(body, autoscaled, None)  # the autoscaler lists its conditions first
        assert write_status(body, status(("Ready", "False", "1/2 ready")), None)
        assert [[c["type"] for c in w["conditions"]] for w in kube.written] == [
            ["Ready", "MetricsAvailable"],
            ["Ready"],
        ]
    finally:
        STATE.kube = None
        STATE.written.pop(("ml", "order"), None)


def test_the_diff_base_is_kopfs_essence() -> None:
    """Update handlers fire on the same changes as with kopf's own storage."""
    body = kopf.Body(
        cast(
            kopf.RawBody,
            {
                "apiVersion": "mmfleet.io/v1alpha1",
                "kind": "MultimodalInference",
                "metadata": {
                    "name": "a",
                    "labels": {"team": "vision"},
                    "annotations": {"note": "x", "mmfleet.io/last-handled-configuration": "{}"},
                    "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
                    "resourceVersion": "7",
                },
                "spec": {"model": {"name": "m"}, "replicas": 2},
                "status": {"phase": "Ready"},
            },
        )
    )
    ours = fleet.DiffBaseStorage(prefix="mmfleet.io", key="last-handled-configuration")
    kopfs = kopf.AnnotationsDiffBaseStorage(prefix="mmfleet.io", key="last-handled-configuration")
    assert ours.build(body=body) == kopfs.build(body=body)
    assert ours.build(body=body, extra_fields=["status.phase"]) == kopfs.build(body=body, extra_fields=["status.phase"])
    child = kopf.Body(cast(kopf.RawBody, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}}))
    assert ours.build(body=child) == {}  # no handler diffs the children: no essence to copy


def child_event(type_: str, kind: str, uid: str = "c1", **meta: object) -> kopf.RawEvent:
    raw = {"kind": kind, "metadata": {"name": "a", "uid": uid, **meta}}
    return cast(kopf.RawEvent, {"type": type_, "object": raw})


def test_child_events_refresh_a_fleets_status_once_per_debounce_and_repair_only_hand_changes(
    monkeypatch: Any,
) -> None:
    refreshed: list[tuple[str, str]] = []
    repaired: list[str] = []
    monkeypatch.setattr(fleet, "STATUS_DEBOUNCE", 0.05)
    monkeypatch.setattr(fleet, "refresh_status", lambda key, indexes: refreshed.append(key))
    monkeypatch.setattr(fleet, "reconcile", lambda parent, pods, deployment, prune: repaired.append(parent["name"]))
    indexes: dict[str, Any] = {
        "fleets": {("ml", "a"): [{"name": "a", "metadata": {"name": "a"}}]},
        "fleet_deployments": {},
        "fleet_pods": {},
    }
    labels = {INFERENCE_LABEL: "a"}
    STATE.applied["svc"] = (0, "5")

    async def events() -> None:
        for type_, kind in (("ADDED", "Pod"), ("MODIFIED", "Deployment"), ("MODIFIED", "Pod")):
            await fleet.observe_child(child_event(type_, kind), "ml", labels, indexes)
        await fleet.observe_child(child_event("MODIFIED", "Service", "svc", resourceVersion="5"), "ml", labels, indexes)
        await asyncio.sleep(0.1)
        assert (refreshed, repaired) == ([("ml", "a")], [])  # three events, one refresh; our own apply echoed
        await fleet.observe_child(child_event("MODIFIED", "Pod"), "ml", labels, indexes)
        await fleet.observe_child(child_event("DELETED", "Service", "svc"), "ml", labels, indexes)
        await asyncio.sleep(0.1)

    asyncio.run(events())
    assert (refreshed, repaired) == ([("ml", "a"), ("ml", "a")], ["a"])
    assert not STATE.refreshes


def test_a_deleted_fleet_leaves_nothing_behind_so_a_namesake_starts_afresh() -> None:
    key = ("ml", "gone")
    STATE.written[key] = MultimodalInferenceStatus.model_validate({"phase": "Ready"})
    STATE.scaling[key] = autoscale.cycle.Memory(cold_start=42.0)
    STATE.children[key] = {"child-uid"}
    STATE.applied["child-uid"] = (1, "")
    STATE.parsed["fleet-uid"] = cast(Any, object())
    modified = cast(kopf.RawEvent, {"type": "MODIFIED", "object": {"metadata": {"uid": "fleet-uid"}}})
    asyncio.run(fleet.forget_fleet(event=modified, namespace="ml", name="gone"))
    assert key in STATE.written, "only a deletion forgets"
    deleted = cast(kopf.RawEvent, {"type": "DELETED", "object": {"metadata": {"uid": "fleet-uid"}}})
    asyncio.run(fleet.forget_fleet(event=deleted, namespace="ml", name="gone"))
    assert key not in STATE.written and key not in STATE.scaling and key not in STATE.children
    assert "child-uid" not in STATE.applied and "fleet-uid" not in STATE.parsed


def test_the_status_resync_survives_a_failing_fleet_and_runs_in_kopfs_context(monkeypatch: Any) -> None:
    marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker")
    token = marker.set("kopf's")
    monkeypatch.setattr(STATE, "kopf_context", contextvars.copy_context())
    marker.reset(token)
    monkeypatch.setattr(fleet, "RESYNC_SECONDS", 0.01)
    seen: list[tuple[tuple[str, str], str | None]] = []

    def refresh(key: tuple[str, str], _: Any) -> None:
        seen.append((key, marker.get(None)))
        if key == ("ml", "bad"):
            raise RuntimeError("an API error")

    monkeypatch.setattr(fleet, "refresh_status", refresh)
    indexes = {"fleets": {("ml", "bad"): [], ("ml", "good"): []}}

    async def two_rounds() -> None:
        task = asyncio.create_task(fleet.resync_forever(indexes))
        while len(seen) < 4:
            await asyncio.sleep(0.01)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(asyncio.wait_for(two_rounds(), 5))
    assert [key for key, _ in seen[:4]] == [("ml", "bad"), ("ml", "good")] * 2
    assert {where for _, where in seen} == {"kopf's"}, "kopf.event needs the context kopf sets around handlers"


def test_requests_are_bounded_and_served_beside_more_open_watch_streams_than_the_bound() -> None:
    """Against a real HTTP server: 3 requests at a time at most, 40 at once all answered while 30 watch streams
    (more than any pool bound sized for requests) stay open, their bodies readable by the caller."""
    from aiohttp import ClientSession, TCPConnector, web

    running = {"now": 0, "most": 0}

    async def scenario() -> None:
        ended = asyncio.Event()

        async def serve(request: web.Request) -> web.StreamResponse:
            if request.query.get("watch") == "true":
                stream = web.StreamResponse()
                await stream.prepare(request)
                await stream.write(b'{"type": "ADDED"}\n')
                await ended.wait()
                return stream
            running["now"] += 1
            running["most"] = max(running["most"], running["now"])
            await asyncio.sleep(0.02)
            running["now"] -= 1
            return web.json_response({"kind": "List", "path": request.path})

        app = web.Application()
        app.router.add_get("/{tail:.*}", serve)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        url = f"http://127.0.0.1:{port}"
        async with ClientSession(connector=TCPConnector(limit=0), middlewares=(connection.RequestBound(3),)) as session:
            watches = [await session.get(f"{url}/ns-{i}/pods", params={"watch": "true"}) for i in range(30)]
            assert [await w.content.readline() for w in watches] == [b'{"type": "ADDED"}\n'] * 30

            async def get(i: int) -> Any:
                async with session.get(f"{url}/ns-{i}/deployments") as response:
                    return await response.json()

            answers = await asyncio.wait_for(asyncio.gather(*(get(i) for i in range(40))), 10)
            assert [a["path"] for a in answers] == [f"/ns-{i}/deployments" for i in range(40)]
            ended.set()
            for watch in watches:
                watch.close()
        await runner.cleanup()

    asyncio.run(scenario())
    assert running["most"] == 3
