"""A call the API server may answer next time: the retry waits what a Retry-After asks, and Progressing says which call
failed, what it met and when the next try is, through every status write until a reconcile goes through."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from mmfleet.handlers import autoscale, memo, reconcile, records, triggers
from mmfleet.kube import RetryableError, retry_after, transport_failure
from mmfleet.render import INFERENCE_LABEL
from mmfleet.workqueue import WorkQueue
from tests.helpers.operator_state import (
    KEY,
    RecordingKube,
    fleet_body,
    fleet_event,
    indexes,
    operator,
    reconcile_once,
    workers,
)
from tests.helpers.wait import until


@pytest.fixture(autouse=True)
def no_events(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(records, "kopf_event", lambda *args: None)  # kopf posts only inside its own handlers
    monkeypatch.setattr(autoscale, "kopf_event", lambda *args: None)


def progressing(written: dict[str, Any]) -> tuple[str, str, str]:
    found = next(c for c in written["conditions"] if c["type"] == "Progressing")
    return found["status"], found["reason"], found["message"]


def too_many(seconds: str | None, status: int = 429, reason: str = "Too Many Requests") -> ApiException:
    error = ApiException(status=status, reason=reason)
    error.headers = urllib3.HTTPHeaderDict({"retry-after": seconds} if seconds is not None else {})
    return error


def test_the_retry_after_header_is_read_as_client_go_reads_it() -> None:
    assert retry_after(too_many("2")) == 2  # header names are case-insensitive
    assert retry_after(too_many("7", 503, "Service Unavailable")) == 7
    assert retry_after(too_many(None)) is None
    assert retry_after(too_many("Wed, 02 Dec 2026 04:00:00 GMT")) is None  # client-go reads whole seconds only
    assert retry_after(too_many("²")) is None  # a digit to str.isdigit, not a number: no header, not a traceback
    assert retry_after(too_many("2", 409, "Conflict")) is None  # only a 429 or 5xx asks to wait


def test_the_next_try_waits_what_the_api_server_asked_within_bounds() -> None:
    delay = reconcile.api_retry_delay
    assert delay(0, 2) == 2.0
    assert delay(3, 2) == 2.0, "the header, not the doubling backoff (20 s at the fourth try)"
    assert delay(0, 0) == reconcile.RETRY_AFTER_MIN_SECONDS, "a 0 would spin"
    assert delay(0, 3600) == reconcile.RETRY_AFTER_MAX_SECONDS
    assert delay(0, None) == reconcile.RETRY_FIRST_SECONDS
    assert delay(2, None) == reconcile.retry_delay(2) == 20.0
    after = [delay(reconcile.RETRY_AFTER_ATTEMPTS + n, 1) for n in range(3)]
    assert after == [5.0, 10.0, 20.0], "a server that keeps asking for 1 s is backed off from after 10 tries"
    assert delay(reconcile.RETRY_AFTER_ATTEMPTS, 30) == 30.0, "never shorter than the header"


@pytest.mark.parametrize(
    ("fault", "attempt", "delay", "message"),
    [
        (
            RetryableError("429 Too Many Requests", call="apply Deployment ml/qwen", retry_after=2),
            0,
            2.0,
            "apply Deployment ml/qwen: 429 Too Many Requests; the API server asked to retry after 2 s; next in 2 s",
        ),
        (
            RetryableError("500 Internal Server Error", call="apply Deployment ml/qwen"),
            2,
            20.0,
            "apply Deployment ml/qwen: 500 Internal Server Error; next in 20 s",
        ),
        (
            RetryableError("no answer from the API server within 30 s", call="apply Deployment ml/qwen"),
            0,
            5.0,
            "apply Deployment ml/qwen: no answer from the API server within 30 s; next in 5 s",
        ),
    ],
)
def test_a_failed_call_is_retried_after_the_delay_and_progressing_names_it(
    fault: RetryableError, attempt: int, delay: float, message: str
) -> None:
    kube = RecordingKube(fault)
    result = reconcile_once(operator(kube), fleet_body(), attempt=attempt)
    assert result.retry and result.retry_after == fault.retry_after
    assert reconcile.api_retry_delay(attempt, result.retry_after) == delay
    assert progressing(kube.written[-1]) == ("False", "ApiServerRetrying", message)


def test_every_status_write_keeps_the_retry_until_a_reconcile_goes_through() -> None:
    """The autoscaler's cycle and a status refresh recompute Progressing; neither may drop the pending retry."""
    kube = RecordingKube(RetryableError("503 Service Unavailable", call="apply Deployment ml/qwen", retry_after=1))
    op = operator(kube)
    body = fleet_body(autoscaling=True)
    assert reconcile_once(op, body).retry
    said = progressing(kube.written[-1])
    assert said[:2] == ("False", "ApiServerRetrying")
    deployment = {"metadata": {"generation": 1}, "spec": {"replicas": 2}, "status": {"replicas": 1}}
    view = autoscale.FleetView(KEY, body, deployment, [])
    with ThreadPoolExecutor(1) as pool:  # no Prometheus: the cycle holds, and writes MetricsAvailable False
        autoscale.autoscale(op, [view], None, pool, lambda *_: (deployment, []))
    assert any(c["type"] == "MetricsAvailable" for c in kube.written[-1]["conditions"]), "the cycle wrote status"
    assert progressing(kube.written[-1]) == said

    kube.fault = None  # the retry goes through
    assert not reconcile_once(op, body, attempt=1, deployment=deployment).retry
    assert progressing(kube.written[-1])[1] != "ApiServerRetrying"
    with ThreadPoolExecutor(1) as pool:
        autoscale.autoscale(op, [view], None, pool, lambda *_: (deployment, []))
    assert progressing(kube.written[-1])[1] != "ApiServerRetrying"


@pytest.fixture
def server() -> Iterator[tuple[str, list[bool]]]:
    """A TCP server whose connections are held unanswered, or closed at once while ``close[0]``."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.1)
    close, held, stop = [False], [], threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn = listener.accept()[0]
            except TimeoutError:
                continue
            if close[0]:
                conn.recv(65536)
                conn.close()
            else:
                held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", close
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


def _failure(url: str, method: str, retries: int | bool) -> urllib3.exceptions.HTTPError:
    pool = urllib3.PoolManager()
    with pytest.raises(urllib3.exceptions.HTTPError) as raised:
        pool.request(method, url, body=b"{}", timeout=urllib3.Timeout(connect=1.0, read=0.3), retries=retries)
    return raised.value


def test_a_request_that_gets_no_answer_says_so(server: tuple[str, list[bool]]) -> None:
    url, close = server
    assert transport_failure(_failure(url, "PATCH", False)) == "no answer from the API server within 30 s"
    close[0] = True
    reset = "connection reset by the API server, without an answer"
    assert transport_failure(_failure(url, "PATCH", False)) == reset
    assert transport_failure(_failure(url, "GET", 1)) == reset  # urllib3 retried the GET, then gave up
    refused = socket.socket()
    refused.bind(("127.0.0.1", 0))  # bound, never listening: the connection is refused
    port = refused.getsockname()[1]
    assert transport_failure(_failure(f"http://127.0.0.1:{port}", "GET", False)).startswith(
        "could not connect to the API server: "
    )
    refused.close()


def test_a_failed_reconcile_is_tried_again_after_the_backoff_from_the_indexes_then_no_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failure half way (the Deployment applied with 2 replicas, the PodDisruptionBudget not) is reconciled again
    from the indexes as they are then (the spec back to 1 replica), with no event to ask for it."""
    monkeypatch.setattr(reconcile, "RETRY_FIRST_SECONDS", 0.05)
    kube = RecordingKube(RetryableError("500 Internal Server Error", call="apply Deployment ml/qwen"))
    op = operator(kube, workers=2)
    held = indexes(fleet_body())

    async def scenario() -> None:
        async with workers(op, held):
            await fleet_event(op, fleet_body())
            await until(lambda: bool(kube.written) and op.records[KEY].retrying is not None, what="the failure")
            held["fleets"][KEY] = [fleet_body(generation=3, replicas=1)]
            kube.fault = None
            await until(lambda: op.records[KEY].reconciled == 3, what="the retry")
            tries = len(kube.applied)
            await asyncio.sleep(0.3)
            assert len(kube.applied) == tries, "a success is not retried"

    asyncio.run(scenario())
    assert kube.written[-1]["observedGeneration"] == 3
    assert progressing(kube.written[-1])[1] != "ApiServerRetrying"
    assert op.queue is not None and op.queue.failures(KEY) == 0


def test_a_spec_changed_back_to_an_earlier_value_is_reconciled_and_a_status_write_asks_for_nothing() -> None:
    """Generation 2 (2 replicas), 3 (1 replica), then 4 (2 replicas again: the spec generation 2 had). kopf's change
    handlers saw no change in the last one; every new generation is reconciled here."""
    kube = RecordingKube()
    op = operator(kube, workers=2)
    held = indexes(fleet_body())

    async def scenario() -> None:
        async with workers(op, held):
            for generation, replicas in ((2, 2), (3, 1), (4, 2)):
                body = fleet_body(generation=generation, replicas=replicas)
                held["fleets"][KEY] = [body]
                await fleet_event(op, body)
                await until(lambda g=generation: op.records[KEY].reconciled == g, what=f"generation {generation}")
            applies = len(kube.applied)
            await fleet_event(op, fleet_body(generation=4, replicas=2))  # our own status write's event
            await asyncio.sleep(0.2)
            assert len(kube.applied) == applies

    asyncio.run(scenario())
    deployments = [a["spec"]["replicas"] for a in kube.applied if a["kind"] == "Deployment"]
    assert deployments == [2, 1, 2]


def test_a_status_refresh_that_fails_is_tried_again_without_another_event(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fault bench's one unconverged trial: the refresh after the last pod turned Ready met the fault, and no
    event came to ask for another, so the status said 1 of 2 ready until the resync, minutes later."""
    monkeypatch.setattr(reconcile, "RETRY_FIRST_SECONDS", 0.2)
    monkeypatch.setattr(reconcile, "FIRST_STATUS_WAIT", 0.0)
    kube = RecordingKube()
    op = operator(kube, workers=1)
    held = indexes(fleet_body())
    refused = [RetryableError("429 Too Many Requests", call="write the status of MultimodalInference ml/qwen")]
    calls: list[float] = []
    patch_status = kube.patch_status

    def flaky(namespace: str, name: str, status: dict[str, Any]) -> None:
        calls.append(time.monotonic())
        if refused:
            raise refused.pop()
        patch_status(namespace, name, status)

    async def scenario() -> None:
        async with workers(op, held):
            await fleet_event(op, fleet_body())
            await until(lambda: op.records[KEY].reconciled == 2, what="the apply")
            kube.patch_status = flaky  # type: ignore[method-assign]
            meta = {"name": "qwen", "generation": 1, "controller": "u-1"}  # the fleet's own, as the index keeps it
            held["fleet_deployments"][KEY] = [{"metadata": meta, "spec": {"replicas": 2}, "status": {"replicas": 2}}]
            assert op.queue is not None
            op.queue.add_after(KEY, 0.01)  # a Deployment event
            await until(lambda: len(calls) == 2, what="the second try")

    asyncio.run(scenario())
    assert calls[1] - calls[0] >= 0.2, "tried again after the first retry delay"


def test_pod_events_during_a_backoff_refresh_the_status_but_never_apply_early(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fleet waiting out its backoff (or a Retry-After) gets pod and Deployment events (a crash loop, a rollout):
    they refresh its status; the apply waits until the backoff is over."""
    monkeypatch.setattr(reconcile, "RETRY_FIRST_SECONDS", 0.6)
    monkeypatch.setattr(triggers, "STATUS_DEBOUNCE", 0.01)
    kube = RecordingKube(RetryableError("503 Service Unavailable", call="apply Deployment ml/qwen"))
    tried: list[float] = []
    apply = kube.apply

    def counted(manifest: dict[str, Any], manager: str = "mmfleet") -> dict[str, Any]:
        if manifest["kind"] == "Deployment":
            tried.append(time.monotonic())
        return apply(manifest, manager)

    kube.apply = counted  # type: ignore[method-assign]
    op = operator(kube, workers=2)
    held = indexes(fleet_body())
    labels = {INFERENCE_LABEL: "qwen"}
    pod: Any = {"type": "MODIFIED", "object": {"kind": "Pod", "metadata": {"name": "qwen-1", "uid": "p"}}}

    async def scenario() -> None:
        async with workers(op, held):
            await fleet_event(op, fleet_body())
            await until(lambda: len(tried) == 1, what="the first, failing, apply")
            written = len(kube.written)
            for _ in range(5):  # five pod events in the first 0.3 s of the 0.6 s backoff
                await triggers.on_child_event(pod, KEY[0], labels, memo(op), **held)
                await asyncio.sleep(0.06)
            assert len(tried) == 1, "no apply before the backoff is over"
            kube.fault = None
            await until(lambda: len(tried) == 2 and op.records[KEY].retrying is None, what="the retry")
            assert tried[1] - tried[0] >= 0.55
            assert len(kube.written) > written, "the status was refreshed meanwhile"

    asyncio.run(scenario())


def test_a_namesakes_creation_seen_before_the_old_fleets_deletion_keeps_its_record_and_its_turn() -> None:
    """kopf handles each uid's events apart: ``kubectl replace --force`` can bring the new fleet's ADDED before the
    old one's DELETED."""
    op = operator(RecordingKube())

    async def scenario() -> None:
        op.queue = WorkQueue(reconcile.api_retry_delay)
        old, new = fleet_body(uid="old"), fleet_body(generation=1, uid="new")
        await fleet_event(op, old, "ADDED")
        assert await op.queue.get() == KEY
        op.queue.done(KEY)
        await fleet_event(op, new, "ADDED")
        await fleet_event(op, old, "DELETED")
        assert op.records[KEY].uid == "new" and len(op.queue) == 1
        await fleet_event(op, new, "DELETED")
        assert KEY not in op.records and len(op.queue) == 0

    asyncio.run(scenario())


def test_cleanup_waits_for_the_reconciles_under_way() -> None:
    """No apply may go on after the operator stops (and its Lease is released)."""
    kube = RecordingKube()
    op = operator(kube, workers=1)
    started, release = threading.Event(), threading.Event()
    apply = kube.apply

    def slow(manifest: dict[str, Any], manager: str = "mmfleet") -> dict[str, Any]:
        started.set()
        release.wait(5)
        return apply(manifest, manager)

    kube.apply = slow  # type: ignore[method-assign]

    async def scenario() -> None:
        await triggers.start_workers(memo=memo(op), **indexes(fleet_body()))
        await fleet_event(op, fleet_body())
        await until(started.is_set, what="an apply under way")
        stopping = asyncio.create_task(triggers.stop_workers(memo=memo(op)))
        await asyncio.sleep(0.2)
        assert not stopping.done(), "cleanup returned while an apply was under way"
        release.set()
        await asyncio.wait_for(stopping, 5)

    asyncio.run(scenario())


def test_a_namespace_deleted_under_a_reconcile_ends_it_quietly_not_with_a_traceback(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Its fleet went with it: the apply's 404 names the namespace, not the child (seen in CI as a logged traceback)."""
    body = '{"kind":"Status","status":"Failure","message":"namespaces \\"ml\\" not found","reason":"NotFound",'
    body += '"details":{"name":"ml","kind":"namespaces"},"code":404}'
    gone = ApiException(status=404, reason="Not Found")
    gone.body = body
    kube = RecordingKube()

    def apply(manifest: dict[str, Any], manager: str = "") -> dict[str, Any]:
        with kube._errors(f"apply {manifest['kind']}"):
            raise gone

    monkeypatch.setattr(kube, "apply", apply)
    result = reconcile_once(operator(kube), fleet_body(generation=1))
    assert result.outcome == "ok" and not result.retry
    assert "Traceback" not in caplog.text and not [r for r in caplog.records if r.exc_info]
    other = ApiException(status=404, reason="Not Found")
    other.body = '{"kind":"Status","code":404,"details":{"name":"qwen","kind":"deployments"}}'
    with pytest.raises(ApiException), kube._errors("apply Deployment"):
        raise other
