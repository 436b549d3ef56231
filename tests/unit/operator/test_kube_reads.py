"""The claim reads and a pod's log are plain GETs (no typed API, whose first use imports its models; no dynamic
client, whose every 404 formats a traceback): each answer is read whole and mapped as the dynamic client's were."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from mmfleet import kube as kube_module
from mmfleet.kube import Kube, RetryableError


class Answer:
    """What ``ApiClient.call_api`` returns: a status, headers and a body read once."""

    def __init__(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.status, self.reason, self.body, self.headers = status, "Reason", body, headers or {}
        self.reads = 0

    def read(self) -> bytes:
        self.reads += 1
        return self.body


class ApiClient:
    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: list[tuple[str, list[tuple[str, str]], dict[str, str]]] = []

    def param_serialize(
        self, method: str, path: str, **kwargs: Any
    ) -> tuple[str, str, dict[str, str], None, list[Any]]:
        self.requests.append((path, kwargs["query_params"], kwargs["header_params"]))
        return method, path, kwargs["header_params"], None, []

    def call_api(self, *request: Any, _request_timeout: Any) -> Answer:
        return self.answer


class Resource:
    def path(self, name: str, namespace: str | None) -> str:
        return f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}"


def client_answering(monkeypatch: pytest.MonkeyPatch, answer: Answer) -> tuple[Kube, ApiClient]:
    resources = type("Resources", (), {"get": lambda self, **_: Resource()})()
    monkeypatch.setattr(kube_module, "DynamicClient", lambda _: type("Dynamic", (), {"resources": resources})())
    api = ApiClient(answer)
    return Kube(api), api  # type: ignore[arg-type]


def test_a_name_nobody_holds_reads_as_none_and_one_held_as_its_object(monkeypatch: pytest.MonkeyPatch) -> None:
    absent = Answer(404, b'{"kind":"Status","reason":"NotFound"}')
    kube, api = client_answering(monkeypatch, absent)
    assert kube.get_each([("v1", "ServiceAccount", "ml", "qwen")], cached=True) == [None]
    assert absent.reads == 1
    assert api.requests == [
        ("/api/v1/namespaces/ml/serviceaccounts/qwen", [("resourceVersion", "0")], {"Accept": "application/json"})
    ]
    held = Answer(200, b'{"kind":"ServiceAccount","metadata":{"name":"qwen"}}')
    kube, _ = client_answering(monkeypatch, held)
    assert kube.get_each([("v1", "ServiceAccount", "ml", "qwen")]) == [
        {"kind": "ServiceAccount", "metadata": {"name": "qwen"}}
    ]


def test_a_refused_read_keeps_its_status_and_body(monkeypatch: pytest.MonkeyPatch) -> None:
    forbidden = Answer(403, b'{"kind":"Status","message":"serviceaccounts is forbidden"}')
    kube, _ = client_answering(monkeypatch, forbidden)
    with pytest.raises(ApiException) as raised:
        kube.get_each([("v1", "ServiceAccount", "ml", "qwen")])
    assert raised.value.status == 403 and "forbidden" in str(raised.value.body)
    assert forbidden.reads == 1


def test_an_overloaded_api_server_is_retried_after_what_it_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    busy = Answer(503, b"", {"Retry-After": "7"})
    kube, _ = client_answering(monkeypatch, busy)
    with pytest.raises(RetryableError) as raised:
        kube.pod_log("ml", "qwen-0", "server", 1024)
    assert raised.value.retry_after == 7
    assert busy.reads == 1


def test_a_pods_log_is_its_text_and_a_missing_pod_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    log = Answer(200, "INFO weights loaded in 12.5 s \xe9".encode()[:-1])  # cut inside the last character
    kube, api = client_answering(monkeypatch, log)
    assert kube.pod_log("ml", "qwen-0", "server", 1024) == "INFO weights loaded in 12.5 s \ufffd"
    assert api.requests == [
        ("/api/v1/namespaces/ml/pods/qwen-0/log", [("container", "server"), ("limitBytes", "1024")], {"Accept": "*/*"})
    ]
    kube, _ = client_answering(monkeypatch, Answer(404, b'{"kind":"Status","reason":"NotFound"}'))
    with pytest.raises(ApiException) as raised:
        kube.pod_log("ml", "gone", "server", 1024)
    assert raised.value.status == 404
