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

import kopf
import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from mmfleet.handlers import autoscale, fleet, state
from mmfleet.handlers.state import STATE
from mmfleet.kube import Kube, RetryableError, retry_after, transport_failure

pytestmark = pytest.mark.usefixtures("fresh_operator_state")

KEY = ("ml", "qwen")


def body(autoscaling: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"model": {"name": "Qwen/Qwen2.5-VL-7B-Instruct"}, "cloud": "eks", "replicas": 2}
    if autoscaling:
        spec["autoscaling"] = {"minReplicas": 1, "maxReplicas": 8, "slo": {"target": "2s"}}
    meta = {"name": "qwen", "namespace": "ml", "uid": "u-1", "generation": 2}
    return {"apiVersion": "mmfleet.io/v1alpha1", "kind": "MultimodalInference", "metadata": meta, "spec": spec}


class FaultyKube(Kube):
    """Applies echo back, status writes are recorded; the Deployment's apply raises ``fault`` while it is set."""

    def __init__(self, fault: RetryableError | None) -> None:
        self.fault = fault
        self.written: list[dict[str, Any]] = []

    def apply(self, manifest: dict[str, Any], manager: str = "mmfleet") -> dict[str, Any]:
        if self.fault is not None and manifest["kind"] == "Deployment":
            raise self.fault
        meta = {**manifest["metadata"], "uid": f"uid-{manifest['kind']}", "generation": 1}
        return {**manifest, "metadata": meta, "status": {"replicas": 2, "readyReplicas": 2, "updatedReplicas": 2}}

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        return None

    def has_api(self, api_version: str, kind: str) -> bool:
        return False

    def scale(self, namespace: str, name: str, replicas: int, manager: str = "") -> None:
        pass

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.written.append(status)

    def thread_requests(self) -> int:
        return 0


@pytest.fixture(autouse=True)
def no_events(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state, "kopf_event", lambda *args: None)  # kopf posts only inside its own handlers
    monkeypatch.setattr(autoscale, "kopf_event", lambda *args: None)


def progressing(written: dict[str, Any]) -> tuple[str, str, str]:
    found = next(c for c in written["conditions"] if c["type"] == "Progressing")
    return found["status"], found["reason"], found["message"]


def too_many(seconds: str | None, status: int = 429, reason: str = "Too Many Requests") -> ApiException:
    error = ApiException(status=status, reason=reason)
    error.headers = urllib3.HTTPHeaderDict({"retry-after": seconds} if seconds is not None else {})
    return error


def drain_retries(indexes: dict[str, Any]) -> None:
    """Run the operator's retry loop until the fleet's pending retry is gone (at most 5 s)."""

    async def scenario() -> None:
        loop = asyncio.create_task(fleet.retry_forever(indexes))
        deadline = time.monotonic() + 5
        while KEY in STATE.retries and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        loop.cancel()

    asyncio.run(scenario())


def test_the_retry_after_header_is_read_as_client_go_reads_it() -> None:
    assert retry_after(too_many("2")) == 2  # header names are case-insensitive
    assert retry_after(too_many("7", 503, "Service Unavailable")) == 7
    assert retry_after(too_many(None)) is None
    assert retry_after(too_many("Wed, 02 Dec 2026 04:00:00 GMT")) is None  # client-go reads whole seconds only
    assert retry_after(too_many("²")) is None  # a digit to str.isdigit, not a number: no header, not a traceback
    assert retry_after(too_many("2", 409, "Conflict")) is None  # only a 429 or 5xx asks to wait


def test_the_next_try_waits_what_the_api_server_asked_within_bounds() -> None:
    assert fleet.api_retry_delay(2, 0) == 2.0
    assert fleet.api_retry_delay(2, 3) == 2.0, "the header, not the doubling backoff (20 s at the fourth try)"
    assert fleet.api_retry_delay(0, 0) == fleet.RETRY_AFTER_MIN_SECONDS, "a 0 would spin"
    assert fleet.api_retry_delay(3600, 0) == fleet.RETRY_AFTER_MAX_SECONDS
    assert fleet.api_retry_delay(None, 0) == fleet.RETRY_FIRST_SECONDS
    assert fleet.api_retry_delay(None, 2) == fleet.retry_delay(2) == 20.0
    after = [fleet.api_retry_delay(1, fleet.RETRY_AFTER_ATTEMPTS + n) for n in range(3)]
    assert after == [5.0, 10.0, 20.0], "a server that keeps asking for 1 s is backed off from after 10 tries"
    assert fleet.api_retry_delay(30, fleet.RETRY_AFTER_ATTEMPTS) == 30.0, "never shorter than the header"


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
    kube = FaultyKube(fault)
    STATE.kube = kube
    with pytest.raises(kopf.TemporaryError) as raised:
        fleet.reconcile(body(), [], None, prune=False, attempt=attempt)
    assert raised.value.delay == delay
    assert progressing(kube.written[-1]) == ("False", "ApiServerRetrying", message)


def test_every_status_write_keeps_the_retry_until_a_reconcile_goes_through() -> None:
    """The autoscaler's cycle and a status refresh recompute Progressing; neither may drop the pending retry."""
    kube = FaultyKube(RetryableError("503 Service Unavailable", call="apply Deployment ml/qwen", retry_after=1))
    STATE.kube = kube
    fleet_body = body(autoscaling=True)
    with pytest.raises(kopf.TemporaryError):
        fleet.reconcile(fleet_body, [], None, prune=False)
    said = progressing(kube.written[-1])
    assert said[:2] == ("False", "ApiServerRetrying")
    deployment = {"metadata": {"generation": 1}, "spec": {"replicas": 2}, "status": {"replicas": 1}}
    view = autoscale.FleetView(KEY, fleet_body, deployment, [])
    with ThreadPoolExecutor(1) as pool:  # no Prometheus: the cycle holds, and writes MetricsAvailable False
        autoscale.autoscale([view], None, pool, lambda _: (deployment, []))
    assert any(c["type"] == "MetricsAvailable" for c in kube.written[-1]["conditions"]), "the cycle wrote status"
    assert progressing(kube.written[-1]) == said
    indexes: dict[str, Any] = {
        "fleets": {KEY: [fleet_body]},
        "fleet_deployments": {KEY: [deployment]},
        "fleet_pods": {KEY: []},
    }
    fleet.refresh_status(KEY, indexes)
    assert progressing(kube.written[-1]) == said

    kube.fault = None  # the retry goes through
    fleet.reconcile(fleet_body, [], None, prune=False, attempt=1)
    assert progressing(kube.written[-1])[1] != "ApiServerRetrying"
    with ThreadPoolExecutor(1) as pool:
        autoscale.autoscale([view], None, pool, lambda _: (deployment, []))
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


def test_a_failed_reconcile_kopf_does_not_retry_is_reconciled_by_the_retry_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kopf drops its retry when the spec returns to what it last handled (2 replicas applied by the failed attempt,
    then the spec back to 1): the retry loop must reconcile the fleet from the indexes after the grace period."""
    kube = FaultyKube(RetryableError("500 Internal Server Error", call="apply PodDisruptionBudget ml/qwen"))
    STATE.kube = kube
    with pytest.raises(kopf.TemporaryError) as raised:
        fleet.reconcile(body(), [], None, prune=False)
    pending = STATE.retries[KEY]
    assert pending.due - time.monotonic() == pytest.approx(raised.value.delay + fleet.KOPF_RETRY_GRACE_SECONDS, abs=1)
    kube.fault = None
    pending.due = time.monotonic()  # the grace has passed and kopf never called
    monkeypatch.setattr(fleet, "RETRY_TICK_SECONDS", 0.02)
    indexes: dict[str, Any] = {"fleets": {KEY: [body()]}, "fleet_deployments": {}, "fleet_pods": {}}
    drain_retries(indexes)
    assert KEY not in STATE.retries and KEY not in STATE.retrying
    assert progressing(kube.written[-1])[1] != "ApiServerRetrying"


def test_a_generation_no_handler_takes_up_is_reconciled_by_the_retry_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The retry loop's own success (2 replicas) was followed by the spec back to 1, which kopf had last handled: no
    update handler, so the Deployment kept 2. A newer generation than the last reconciled one leaves a retry."""
    kube = FaultyKube(None)
    STATE.kube = kube
    fleet.reconcile(body(), [], None, prune=False)  # generation 2, 2 replicas
    assert STATE.reconciled[KEY] == 2 and KEY not in STATE.retries
    reverted = body()
    reverted["metadata"]["generation"] = 3
    reverted["spec"]["replicas"] = 1
    event: Any = {"type": "MODIFIED", "object": reverted}
    asyncio.run(fleet.follow_generation(event, "ml", "qwen"))
    assert STATE.retries[KEY].due - time.monotonic() == pytest.approx(fleet.KOPF_RETRY_GRACE_SECONDS, abs=1)
    same: Any = {"type": "MODIFIED", "object": body()}
    STATE.retries.pop(KEY)
    asyncio.run(fleet.follow_generation(same, "ml", "qwen"))
    assert KEY not in STATE.retries, "a status write (same generation) asks for nothing"

    asyncio.run(fleet.follow_generation(event, "ml", "qwen"))
    STATE.retries[KEY].due = time.monotonic()  # the grace has passed and kopf never called
    monkeypatch.setattr(fleet, "RETRY_TICK_SECONDS", 0.02)
    indexes: dict[str, Any] = {"fleets": {KEY: [reverted]}, "fleet_deployments": {}, "fleet_pods": {}}
    drain_retries(indexes)
    assert STATE.reconciled[KEY] == 3 and KEY not in STATE.retries
    assert kube.written[-1]["observedGeneration"] == 3


def test_a_status_refresh_that_fails_is_tried_again_without_another_event(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fault bench's one unconverged trial: the refresh after the last pod turned Ready met the fault, and no
    event came to ask for another, so the status said 1 of 2 ready until the resync, minutes later."""
    calls: list[float] = []

    def refresh(key: Any, indexes: Any) -> None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise RetryableError("429 Too Many Requests", call="write the status of MultimodalInference ml/qwen")

    monkeypatch.setattr(fleet, "refresh_status", refresh)
    monkeypatch.setattr(fleet, "STATUS_DEBOUNCE", 0.01)
    monkeypatch.setattr(fleet, "RETRY_FIRST_SECONDS", 0.2)
    asyncio.run(fleet._refresh_later(KEY, {}))
    assert len(calls) == 2 and calls[1] - calls[0] >= 0.2, "tried again after the first retry delay"
    assert KEY not in STATE.refresh_again
