"""The handlers' judgements: hand edits, replicas ownership, caching, status writes, liveness, and what each watch
event asks of the work queue."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from typing import Any, cast

import kopf
import pytest

from mmfleet import workqueue
from mmfleet.api import MultimodalInferenceStatus
from mmfleet.handlers import autoscale, children, connection, memo, reconcile, register, settings, triggers
from mmfleet.handlers.records import FleetRecord, parse_spec, render_children, write_status
from mmfleet.render import INFERENCE_LABEL
from mmfleet.routing import ALL_SERVED
from tests.helpers.aiohttp_server import served
from tests.helpers.operator_state import KEY, RecordingKube, fleet_body, indexes, operator, workers
from tests.helpers.wait import until

NOW = "2026-12-01T00:00:00Z"


def deployment(uid: str, generation: int) -> dict[str, object]:
    return {"metadata": {"uid": uid, "generation": generation, "resourceVersion": str(100 + generation)}}


def test_only_a_newer_generation_than_our_apply_is_a_hand_edit() -> None:
    applied = children.fingerprint(deployment("u1", 4))
    assert not children.edited_by_hand(deployment("u1", 4), applied)  # status-only updates keep the generation
    assert not children.edited_by_hand(deployment("u1", 3), applied)  # a late event about an older generation
    assert children.edited_by_hand({**deployment("u1", 5), "spec": {"paused": True}}, applied)
    assert not children.edited_by_hand(deployment("unknown", 9), None)  # nothing applied yet: nothing to compare


def test_kinds_without_generation_compare_resource_versions() -> None:
    account = {"metadata": {"uid": "sa", "resourceVersion": "7"}}
    applied = children.fingerprint(account)
    assert not children.edited_by_hand(account, applied)
    assert children.edited_by_hand({"metadata": {"uid": "sa", "resourceVersion": "8"}}, applied)


SCALER_FIELDS = {"manager": "mmfleet-autoscaler", "subresource": "scale", "fieldsV1": {"f:spec": {"f:replicas": {}}}}


def scaled(generation: int, replicas: int, managers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    meta = {"uid": "d", "generation": generation, "managedFields": managers}
    return {"metadata": meta, "spec": {"replicas": replicas, "template": {"image": "vllm"}, **spec}}


def test_the_autoscalers_own_scale_is_not_a_hand_edit_but_a_hand_scale_or_spec_edit_is() -> None:
    applied = children.fingerprint(scaled(4, 3, [SCALER_FIELDS]))
    assert not children.edited_by_hand(scaled(5, 7, [SCALER_FIELDS]), applied)  # the autoscaler went 3 -> 7
    kubectl = {"manager": "kubectl", "fieldsV1": {"f:spec": {"f:replicas": {}}}}
    assert children.edited_by_hand(scaled(5, 7, [kubectl]), applied)  # kubectl scale took the field over
    assert children.edited_by_hand(scaled(5, 3, [SCALER_FIELDS], paused=True), applied)  # an edit beside replicas
    # The first apply of an autoscaled fleet: replicas defaulted to 1, owned by no one; then the autoscaler's clamp.
    first = children.fingerprint(scaled(1, 1, [{"manager": "mmfleet", "fieldsV1": {"f:spec": {"f:template": {}}}}]))
    assert not children.edited_by_hand(scaled(2, 2, [SCALER_FIELDS]), first)
    fixed = children.fingerprint(scaled(4, 3, [{"manager": "mmfleet", "fieldsV1": {"f:spec": {"f:replicas": {}}}}]))
    assert children.edited_by_hand(scaled(5, 7, [kubectl]), fixed)  # no autoscaling: kubectl scale is repaired


def test_replicas_owned_by_the_scaler_through_the_scale_subresource_or_apply() -> None:
    owned = {
        "metadata": {
            "managedFields": [
                {"manager": "mmfleet", "fieldsV1": {"f:spec": {"f:template": {}}}},
                {"manager": "mmfleet-autoscaler", "subresource": "scale", "fieldsV1": {"f:spec": {"f:replicas": {}}}},
            ]
        }
    }
    assert children.scaler_owns_replicas(owned)
    renderer_only = {
        "metadata": {"managedFields": [{"manager": "mmfleet", "fieldsV1": {"f:spec": {"f:replicas": {}}}}]}
    }
    assert not children.scaler_owns_replicas(renderer_only)
    assert children.scaler_owns_replicas({"metadata": {"scalerOwnsReplicas": True}})  # as the index keeps it


SERVER = {'k:{"name":"server"}': {".": {}, "f:name": {}, "f:image": {}}}
OURS = {
    "manager": "mmfleet",
    "operation": "Apply",
    "fieldsV1": {"f:spec": {"f:template": {"f:spec": {"f:containers": SERVER}}}},
}
ROLLOUT_RESTART = {
    "manager": "kubectl-rollout",
    "operation": "Update",
    "fieldsV1": {
        "f:spec": {
            "f:template": {"f:metadata": {"f:annotations": {".": {}, "f:kubectl.kubernetes.io/restartedAt": {}}}}
        }
    },
}
STATUS = {"manager": "kube-controller-manager", "subresource": "status", "fieldsV1": {"f:status": {"f:replicas": {}}}}
KUBECTL_SCALE = {"manager": "kubectl", "subresource": "scale", "fieldsV1": {"f:spec": {"f:replicas": {}}}}
# kubectl edit: a sidecar, hostNetwork, an env var on the server container, and a label on the Deployment.
EDIT = {
    "manager": "kubectl-edit",
    "operation": "Update",
    "fieldsV1": {
        "f:metadata": {"f:labels": {"f:team": {}}},
        "f:spec": {
            "f:template": {
                "f:spec": {
                    "f:hostNetwork": {},
                    "f:containers": {
                        'k:{"name":"sidecar"}': {".": {}, "f:name": {}, "f:image": {}},
                        'k:{"name":"server"}': {"f:env": {'k:{"name":"EVIL"}': {".": {}, "f:name": {}, "f:value": {}}}},
                    },
                }
            }
        },
    },
}


def managed(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"managedFields": list(entries)}}


def test_fields_another_manager_set_in_a_childs_spec_are_foreign_but_what_others_may_keep_is_not() -> None:
    """Issue 23, item 5: a sidecar, hostNetwork and an env var added by hand are the operator's to remove; the
    autoscaler's and kubectl's replicas, a rollout restart, status and metadata are not; defaults belong to no one."""
    steady = managed(OURS, SCALER_FIELDS, STATUS, ROLLOUT_RESTART, KUBECTL_SCALE)
    assert children.foreign_fields(steady) == {}  # nothing to repair: no request beyond the apply
    foreign = children.foreign_fields(managed(OURS, EDIT, ROLLOUT_RESTART))
    assert list(foreign) == ["kubectl-edit"]
    assert children.field_names(foreign["kubectl-edit"]) == [
        "spec.template.spec.containers[name=server].env[name=EVIL]",
        "spec.template.spec.containers[name=sidecar]",
        "spec.template.spec.hostNetwork",
    ]


def test_foreign_fields_are_moved_to_the_operators_apply_and_nothing_else_changes_hands() -> None:
    child = managed(OURS, EDIT, ROLLOUT_RESTART, STATUS)
    entries = children.taken_over(child, children.foreign_fields(child))
    ours, edit, restart, status = entries
    assert (restart, status) == (ROLLOUT_RESTART, STATUS)
    assert edit == {**EDIT, "fieldsV1": {"f:metadata": {"f:labels": {"f:team": {}}}}}  # its label stays its own
    pod_spec = ours["fieldsV1"]["f:spec"]["f:template"]["f:spec"]
    assert set(pod_spec) == {"f:hostNetwork", "f:containers"}
    evil = EDIT["fieldsV1"]["f:spec"]["f:template"]["f:spec"]["f:containers"]['k:{"name":"server"}']["f:env"]
    assert pod_spec["f:containers"]['k:{"name":"server"}'] == {**SERVER['k:{"name":"server"}'], "f:env": evil}
    assert set(pod_spec["f:containers"]) == {'k:{"name":"server"}', 'k:{"name":"sidecar"}'}
    assert children.foreign_fields({**child, "metadata": {"managedFields": entries}}) == {}
    # No apply entry of the operator's (managedFields cleared by hand): one is made for it.
    made = children.taken_over(managed(EDIT), children.foreign_fields(managed(EDIT)))
    assert made[-1]["manager"] == "mmfleet" and made[-1]["operation"] == "Apply"


def test_the_event_names_at_most_ten_fields_and_counts_the_rest() -> None:
    env = {f'k:{{"name":"E{i:02}"}}': {".": {}, "f:name": {}} for i in range(25)}
    many = {"manager": "helm", "fieldsV1": {"f:spec": {"f:template": {"f:spec": {"f:containers": {
        'k:{"name":"server"}': {"f:env": env}}}}}}}  # fmt: skip
    message = children.foreign_fields_message("Deployment", "ml/vl", children.foreign_fields(managed(OURS, many)))
    assert message.startswith("removed from Deployment ml/vl")
    assert "env[name=E09]" in message and "env[name=E10]" not in message
    assert "and 15 more (set by helm)" in message


def test_the_autoscaler_snapshot_takes_fleets_with_autoscaling_and_their_children() -> None:
    def fleet(name: str, **extra: object) -> dict[str, object]:
        meta = {"name": name, "namespace": "ml", "uid": f"u-{name}", **extra}
        return {"metadata": meta, "spec": {"autoscaling": {"maxReplicas": 4}}}

    def deployment(name: str, replicas: int) -> dict[str, object]:  # a fleet's own, as the index keeps it
        return {"metadata": {"name": name, "controller": f"u-{name}"}, "spec": {"replicas": replicas}}

    fleets = {
        ("ml", "a"): [fleet("a")],
        ("ml", "leaving"): [fleet("leaving", deletionTimestamp="2026-11-29T00:00:00Z")],
        ("ml", "fixed"): [{"metadata": {"name": "fixed", "namespace": "ml"}, "spec": {"replicas": 2}}],
    }
    deployments = {("ml", "a"): [deployment("a", 3)], ("ml", "fixed"): [deployment("fixed", 2)]}
    pods = {("ml", "a"): [{"metadata": {"name": f"a-{i}", "deployment": "a"}} for i in (1, 2)]}
    # Plain mappings stand in for kopf's indexes.
    views = autoscale.autoscaled_fleets({"fleets": fleets, "fleet_deployments": deployments, "fleet_pods": pods})
    assert [(v.key, v.deployment, len(v.pods)) for v in views] == [(("ml", "a"), deployment("a", 3), 2)]


def test_liveness_turns_red_when_the_autoscaling_loop_stops_cycling() -> None:
    """kopf's /healthz answers 500 when a probe raises PermanentError (kopf 1.45.2, ``probing.py``)."""

    async def loop() -> None:
        await asyncio.Event().wait()

    async def scenario() -> list[str]:
        op = operator(RecordingKube())
        said = []
        op.autoscaler = asyncio.create_task(loop())  # alive
        interval = op.config.autoscale_interval
        op.autoscaler_cycled = time.monotonic() - interval  # cycling
        said.append(await autoscale.check_autoscaler(memo(op)))
        op.autoscaler_cycled = time.monotonic() - 3 * interval - autoscale.STALL_MARGIN - 1  # stuck
        for ended in (False, True):
            if ended:
                op.autoscaler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await op.autoscaler
                op.autoscaler_cycled = time.monotonic()
            with pytest.raises(kopf.PermanentError) as red:
                await autoscale.check_autoscaler(memo(op))
            said.append(str(red.value))
        return said

    cycling, stuck, ended = asyncio.run(scenario())
    assert cycling.startswith("last cycle") and "no autoscaling cycle finished" in stuck and "ended" in ended


def test_every_handler_is_registered_explicitly_and_none_on_import() -> None:
    """The operator's handlers live in the registry ``cli run`` builds, not in kopf's default one; kopf runs no
    change handler (so it writes no annotation on fleets), only watch events, indexes and the operator's loops."""
    registry = kopf.OperatorRegistry()
    register(registry)
    assert not list(kopf.get_default_registry()._watching.get_all_handlers())
    watched = {h.id for h in registry._watching.get_all_handlers()}
    assert watched == {"fleet_events", *(f"watch_{plural}" for _, _, plural in children.CHILD_KINDS)}
    assert {h.id for h in registry._indexing.get_all_handlers()} == set(children.INDEXES)
    assert not list(registry._changing.get_all_handlers())


def test_each_child_watch_asks_the_api_server_for_exactly_what_its_handlers_take() -> None:
    """The cluster's other objects of a child kind never reach kopf: every child kind's watch carries the label
    selector its handlers filter by, and the fleets' own watch none."""
    registry = kopf.OperatorRegistry()
    register(registry)
    configured = kopf.OperatorSettings()
    op = operator(RecordingKube())
    op.tracer_provider = cast(Any, "set up")  # no telemetry set up here
    settings.configure_operator(configured, memo(op))
    every = [*registry._watching.get_all_handlers(), *registry._indexing.get_all_handlers()]
    assert len(every) == len(children.CHILD_KINDS) + 4
    for handler in every:
        sel = handler.selector
        assert sel is not None
        resource = kopf.Resource(sel.group or "", sel.version or "", sel.any_name or "")
        sent = configured.watching.label_selectors.collect(resource)
        assert sent == ([settings.label_selector(handler.labels)] if handler.labels else []), handler.id
    assert settings.label_selector(children.CHILD_LABELS) == "app.kubernetes.io/managed-by=mmfleet,mmfleet.io/inference"
    assert settings.label_selector(children.POD_LABELS) == "mmfleet.io/inference"
    for kopfs_own in (("", "v1", "namespaces"), ("apiextensions.k8s.io", "v1", "customresourcedefinitions"),
                      ("", "v1", "events"), ("events.k8s.io", "v1", "events")):  # fmt: skip
        assert configured.watching.label_selectors.collect(kopf.Resource(*kopfs_own)) == []
    with pytest.raises(TypeError, match="label a"):
        settings.label_selector({"a": kopf.ABSENT})


def test_a_spec_is_parsed_once_per_generation_and_afresh_after_a_change() -> None:
    def body(generation: int, replicas: int) -> dict[str, Any]:
        return {
            "apiVersion": "mmfleet.io/v1alpha1",
            "kind": "MultimodalInference",
            "metadata": {"name": "a", "namespace": "ml", "uid": "u-parse", "generation": generation},
            "spec": {"model": {"name": "Qwen/Qwen2.5-VL-3B-Instruct"}, "replicas": replicas},
        }

    op, record = operator(RecordingKube()), FleetRecord()
    first = parse_spec(op, record, body(1, 2))
    assert parse_spec(op, record, body(1, 2)) is first  # the autoscaler's every cycle, a status refresh
    assert render_children(op, record, first, "eks", False, ALL_SERVED) is render_children(
        op, record, first, "eks", False, ALL_SERVED
    )
    changed = parse_spec(op, record, body(2, 3))
    assert changed.spec.replicas == 3
    deployment = next(
        c for c in render_children(op, record, changed, "eks", False, ALL_SERVED) if c["kind"] == "Deployment"
    )
    assert deployment["spec"]["replicas"] == 3


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
    op, record = operator(kube), FleetRecord()
    reconciled = status(("Ready", "False", "0/1 ready"), ("MetricsAvailable", "Unknown", "no pod is Ready"))
    assert write_status(op, record, body, reconciled, None)
    autoscaled = status(("MetricsAvailable", "Unknown", "no pod is Ready"), ("Ready", "False", "0/1 ready"))
    assert not write_status(op, record, body, autoscaled, None)  # the autoscaler lists its conditions first
    assert write_status(op, record, body, status(("Ready", "False", "1/2 ready")), None)
    assert [[c["type"] for c in w["conditions"]] for w in kube.written] == [["Ready", "MetricsAvailable"], ["Ready"]]


def child_event(type_: str, kind: str, uid: str = "c1", **meta: object) -> kopf.RawEvent:
    raw = {"kind": kind, "metadata": {"name": "a", "uid": uid, **meta}}
    return cast(kopf.RawEvent, {"type": type_, "object": raw})


def test_child_events_queue_a_status_refresh_once_per_debounce_and_a_repair_only_for_hand_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(triggers, "STATUS_DEBOUNCE", 0.05)
    op = operator(RecordingKube())
    labels = {INFERENCE_LABEL: KEY[1]}
    held = indexes(fleet_body())

    async def events() -> None:
        op.queue = queue = workqueue.WorkQueue(reconcile.api_retry_delay)
        op.record(KEY).applied["svc"] = (0, "5")

        async def event(type_: str, kind: str, uid: str = "c1", **meta: object) -> None:
            await triggers.on_child_event(child_event(type_, kind, uid, **meta), KEY[0], labels, memo(op), **held)

        for type_, kind in (("ADDED", "Pod"), ("MODIFIED", "Deployment"), ("MODIFIED", "Pod")):
            await event(type_, kind)
        await event("MODIFIED", "Service", "svc", resourceVersion="5")  # our own apply, echoed
        assert (len(queue), queue.waiting()) == (0, 1), "three events, one refresh, later"
        await until(lambda: len(queue) == 1, what="the debounced refresh")
        assert not op.records[KEY].drifted
        assert await queue.get() == KEY
        queue.done(KEY)
        await event("DELETED", "Service", "svc")
        assert len(queue) == 1 and op.records[KEY].drifted, "a deleted child is repaired now"
        assert "svc" not in op.records[KEY].applied
        queue.shut_down()

    asyncio.run(events())


def test_a_deleted_fleet_leaves_nothing_behind_so_a_namesake_starts_afresh() -> None:
    op = operator(RecordingKube())

    async def scenario() -> None:
        op.queue = workqueue.WorkQueue(reconcile.api_retry_delay)
        record = op.record(KEY, "fleet-uid")
        record.written = MultimodalInferenceStatus.model_validate({"phase": "Ready"})
        record.scaling = autoscale.cycle.Memory(cold_start=42.0)
        body = fleet_body(uid="fleet-uid")
        await triggers.on_fleet_event(
            cast(kopf.RawEvent, {"type": "MODIFIED", "object": body}), *KEY, body["metadata"], memo(op)
        )
        assert op.records[KEY] is record, "only a deletion forgets"
        await triggers.on_fleet_event(
            cast(kopf.RawEvent, {"type": "DELETED", "object": body}), *KEY, body["metadata"], memo(op)
        )
        assert KEY not in op.records and len(op.queue) == 0
        assert op.record(KEY, "namesake-uid").written is None
        op.record(KEY, "fleet-uid").scaling = autoscale.cycle.Memory(cold_start=1.0)
        assert op.record(KEY, "another-uid").scaling is None, "a missed deletion: another uid starts afresh"

    asyncio.run(scenario())


def test_the_resync_reconciles_every_fleet_in_kopfs_context_and_survives_a_failing_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker")
    token = marker.set("kopf's")
    op = operator(RecordingKube(), workers=2)
    op.kopf_context = contextvars.copy_context()
    marker.reset(token)
    monkeypatch.setattr(triggers, "RESYNC_SECONDS", 0.05)
    seen: list[tuple[tuple[str, str], str | None]] = []

    def reconcile_(_: Any, snapshot: reconcile.Snapshot, __: Any) -> reconcile.Result:
        seen.append((snapshot.key, marker.get(None)))
        if snapshot.key == ("ml", "bad"):
            raise RuntimeError("a bug")
        return reconcile.Result("ok")

    monkeypatch.setattr(triggers, "reconcile", reconcile_)
    held: dict[str, Any] = {
        "fleets": {("ml", "bad"): [{"metadata": {}}], ("ml", "good"): [{"metadata": {}}]},
        "fleet_deployments": {},
        "fleet_pods": {},
    }

    async def two_rounds() -> None:
        async with workers(op, held):
            await until(lambda: len(seen) >= 4, what="two rounds")

    asyncio.run(two_rounds())
    assert sorted(key for key, _ in seen[:4]) == [("ml", "bad")] * 2 + [("ml", "good")] * 2
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

        async with (
            served(serve) as url,
            ClientSession(connector=TCPConnector(limit=0), middlewares=(connection.RequestBound(3),)) as session,
        ):
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

    asyncio.run(scenario())
    assert running["most"] == 3
