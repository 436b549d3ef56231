"""The only module that talks to the Kubernetes API server.

Synchronous on purpose (the official client is); kopf runs sync handlers in worker threads,
so nothing here blocks the event loop. Every call is one API request, and ``requests`` counts
them so the operator benchmark can report requests per reconcile. Responses are read as plain
JSON (``serialize=False``): the dynamic client's ``ResourceInstance`` wraps every field in an
object, 3% of the operator's profile at 1,000 fleets (docs/benchmarks.md), only to be turned back
into dicts. Events go through ``kopf.event``.

Every request has a timeout (``REQUEST_TIMEOUT``, set on the client and passed on each call): a hung
request would hold its fleet's lock, and with it the autoscaler's cycle, for ever.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client import rest
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError, ResourceNotFoundError
from kubernetes.dynamic.resource import Resource

from mmfleet.api import API_VERSION, KIND
from mmfleet.render import FIELD_MANAGER

Obj = dict[str, Any]
log = logging.getLogger("mmfleet")
AUTOSCALER_FIELD_MANAGER = "mmfleet-autoscaler"
# (connect, read) seconds for one request. A reconcile makes a handful; a list of every node is the largest read.
REQUEST_TIMEOUT = (5.0, 30.0)


class RetryableError(Exception):
    """A call the API server may answer next time: it refused it for now (409, 429, 5xx) or did not answer.

    ``failure`` says what happened, ``call`` which request (``apply Deployment ml/foo``), for a condition;
    ``retry_after``: the whole seconds a 429 or 5xx asked to wait (its ``Retry-After``), else None.
    """

    def __init__(self, failure: str, *, call: str = "", retry_after: int | None = None) -> None:
        super().__init__(f"{call}: {failure}" if call else failure)
        self.failure, self.call, self.retry_after = failure, call, retry_after


class RefusedError(Exception):
    """The API server refused a write for good (400, 403, 422, ...): retrying the same request cannot help.

    ``message`` is the API server's own (the Status message names the field it refused), for a condition.
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class NamespaceTerminatingError(Exception):
    """The namespace is being deleted: nothing can be created in it, and nothing needs to be."""


def is_forbidden(error: BaseException) -> bool:
    """Whether the API server refused a request for want of RBAC (403), as opposed to failing it."""
    return isinstance(error, ApiException) and error.status == 403


def error_text(error: BaseException) -> str:
    """One line for a condition or a log: ``503 Service Unavailable`` for the API server's refusals."""
    if isinstance(error, ApiException):
        return f"{error.status} {error.reason}"
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def retry_after(error: ApiException) -> int | None:
    """The seconds a 429 or 5xx asks to wait in its ``Retry-After`` header, read as client-go reads it (whole seconds,
    ``checkWait`` and ``retryAfterSeconds`` in k8s.io/client-go/rest): None for another status, no header or a date."""
    if error.status != 429 and (error.status or 0) < 500:
        return None
    value = str((error.headers or {}).get("Retry-After") or "").strip()
    return int(value) if value.isascii() and value.isdigit() else None  # "²" is a digit to str.isdigit, not to int()


def transport_failure(error: urllib3.exceptions.HTTPError) -> str:
    """What a request that got no HTTP answer met, in a user's words (urllib3 nests the cause in MaxRetryError)."""
    if isinstance(error, urllib3.exceptions.MaxRetryError) and isinstance(error.reason, urllib3.exceptions.HTTPError):
        error = error.reason
    if isinstance(error, urllib3.exceptions.ReadTimeoutError):
        return f"no answer from the API server within {REQUEST_TIMEOUT[1]:g} s"
    if isinstance(error, (urllib3.exceptions.ConnectTimeoutError, urllib3.exceptions.NewConnectionError)):
        return f"could not connect to the API server: {error_text(error)}"
    if isinstance(error, urllib3.exceptions.ProtocolError):
        return "connection reset by the API server, without an answer"
    return f"no answer from the API server: {error_text(error)}"


def refusal_message(error: ApiException) -> str:
    """The message of the API server's Status body, else the HTTP reason."""
    try:
        body = json.loads(error.body or "{}")
    except (TypeError, ValueError):
        body = {}
    message = body.get("message") if isinstance(body, dict) else None
    return str(message or error.reason or "refused")


def _json(response: Any) -> Obj:
    """The body of a raw response (``serialize=False``) as plain dicts and lists.

    Every response must be read: only a response read to its end gives its connection back to
    urllib3's pool; an unread one costs the next request a new TLS handshake.
    """
    data: Obj = json.loads(response.data)
    return data


def _where(namespace: str | None, name: str) -> str:
    return f"{namespace}/{name}" if namespace else name


class Kube:
    """A thin, typed face over the dynamic client for the few calls the operator makes."""

    def __init__(self, api_client: client.ApiClient | None = None) -> None:
        self.api_client = api_client or load_client()
        self.dynamic = DynamicClient(self.api_client)
        self._resources: dict[tuple[str, str], Resource] = {}
        self._lock = threading.Lock()
        self._thread = threading.local()
        self.requests = 0

    def _count(self) -> None:
        with self._lock:
            self.requests += 1
        self._thread.requests = self.thread_requests() + 1

    def thread_requests(self) -> int:
        """Requests made by the calling thread so far; a handler's difference is its own cost."""
        count: int = getattr(self._thread, "requests", 0)
        return count

    def _resource(self, api_version: str, kind: str) -> Resource:
        key = (api_version, kind)
        if key not in self._resources:
            self._resources[key] = self.dynamic.resources.get(api_version=api_version, kind=kind)
        return self._resources[key]

    @contextmanager
    def _errors(self, call: str, refusals: bool = True) -> Iterator[None]:
        """Failures of ``call`` sorted by what the caller can do: retry (any call), give up on the namespace, or
        report (``refusals``, writes; a read's other errors stay ``ApiException``, e.g. 403 for ``is_forbidden``)."""
        try:
            yield
        except ApiException as error:
            if error.status in (409, 429) or (error.status or 0) >= 500:
                text = f"{error.status} {error.reason}"
                raise RetryableError(text, call=call, retry_after=retry_after(error)) from error
            if not refusals:
                raise
            if error.status == 403 and "NamespaceTerminating" in str(error.body or ""):
                raise NamespaceTerminatingError(str(error.reason)) from error
            if error.status is not None and 400 <= error.status < 500 and error.status != 404:
                raise RefusedError(error.status, refusal_message(error)) from error
            raise
        except urllib3.exceptions.HTTPError as error:  # timed out, connection reset or refused
            raise RetryableError(transport_failure(error), call=call) from error

    def apply(self, manifest: Obj, manager: str = FIELD_MANAGER) -> Obj:
        """Server-side apply one object under our field manager, taking over fields we own."""
        meta = manifest["metadata"]
        self._count()
        with self._errors(f"apply {manifest['kind']} {_where(meta.get('namespace'), meta['name'])}"):
            result = self.dynamic.server_side_apply(
                self._resource(manifest["apiVersion"], manifest["kind"]),
                # A UTF-8 string: the client's own json.dumps escapes a character outside the Basic Multilingual Plane
                # as a UTF-16 surrogate pair, which the API server's YAML decoder (an apply is YAML) refuses.
                body=json.dumps(manifest, ensure_ascii=False),
                name=meta["name"],
                namespace=meta.get("namespace"),
                field_manager=manager,
                force_conflicts=True,
                serialize=False,
                _request_timeout=REQUEST_TIMEOUT,
            )
        return _json(result)

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> Obj | None:
        self._count()
        with self._errors(f"get {kind} {_where(namespace, name)}", refusals=False):
            try:
                return _json(
                    self.dynamic.get(
                        self._resource(api_version, kind),
                        name=name,
                        namespace=namespace,
                        serialize=False,
                        _request_timeout=REQUEST_TIMEOUT,
                    )
                )
            except NotFoundError:
                return None

    def list_objects(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[Obj]:
        """A list; ``field_selector`` (``metadata.name=x``) looks one object up with the list verb alone."""
        self._count()
        with self._errors(f"list {kind}" + (f" in {namespace}" if namespace else ""), refusals=False):
            result = _json(
                self.dynamic.get(
                    self._resource(api_version, kind),
                    namespace=namespace,
                    label_selector=selector,
                    field_selector=field_selector,
                    serialize=False,
                    _request_timeout=REQUEST_TIMEOUT,
                )
            )
        items: list[Obj] = result.get("items", [])
        return items

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        """Delete if present; the garbage collector removes what it owns."""
        self._count()
        with self._errors(f"delete {kind} {namespace}/{name}"), contextlib.suppress(NotFoundError):
            _json(
                self.dynamic.delete(
                    self._resource(api_version, kind),
                    name=name,
                    namespace=namespace,
                    serialize=False,
                    _request_timeout=REQUEST_TIMEOUT,
                )
            )

    def scale(self, namespace: str, name: str, replicas: int, manager: str = AUTOSCALER_FIELD_MANAGER) -> None:
        """Set a Deployment's replicas through its scale subresource, as their owner.

        Server-side apply of an autoscaling/v1 Scale, not a merge patch: a patch that leaves the
        value unchanged records no owner, and the renderer's next apply (which leaves replicas out
        when autoscaling) would then reset the field to 1. Applied, the field is owned by
        ``manager`` even when the value does not change (checked on kube-apiserver 1.34).
        """
        body = {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas},
        }
        self._count()
        with self._errors(f"scale Deployment {namespace}/{name} to {replicas}"):
            response = self.dynamic.patch(
                self._resource("apps/v1", "Deployment").subresources["scale"],
                body=body,
                name=name,
                namespace=namespace,
                content_type="application/apply-patch+yaml",
                field_manager=manager,
                force_conflicts=True,
                serialize=False,
                _request_timeout=REQUEST_TIMEOUT,
            )
        _json(response)

    def patch_status(self, namespace: str, name: str, status: Obj) -> None:
        """Replace the fields of a MultimodalInference's status; never touches its spec."""
        self._count()
        with self._errors(f"write the status of {KIND} {namespace}/{name}"):
            response = self.dynamic.patch(
                self._resource(API_VERSION, KIND).subresources["status"],
                body={"status": status},
                name=name,
                namespace=namespace,
                content_type="application/merge-patch+json",
                field_manager=FIELD_MANAGER,
                serialize=False,
                _request_timeout=REQUEST_TIMEOUT,
            )
        _json(response)

    def provider_ids(self) -> list[str]:
        nodes = self.list_objects("v1", "Node")
        return [n.get("spec", {}).get("providerID") or "" for n in nodes]

    def has_api(self, api_version: str, kind: str) -> bool:
        """Whether a kind is served now (e.g. the Prometheus Operator's PodMonitor): asks discovery afresh, so a
        CRD installed or removed since the last look is seen (callers ask every few minutes, not per reconcile)."""
        self._resources.pop((api_version, kind), None)
        self.dynamic.resources.invalidate_cache()
        with self._errors(f"discover {kind}", refusals=False):
            try:
                self._resource(api_version, kind)
            except ResourceNotFoundError:
                return False
        return True


class _TimedRESTClient(rest.RESTClientObject):  # type: ignore[misc]  # the client has no type hints
    """The client's transport with ``REQUEST_TIMEOUT`` for requests that name none (discovery's, for one)."""

    def request(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["_request_timeout"] = kwargs.get("_request_timeout") or REQUEST_TIMEOUT
        return super().request(*args, **kwargs)


def load_client(pool_size: int = 32) -> client.ApiClient:
    """In-cluster credentials when running in a pod, else KUBECONFIG / ~/.kube/config.

    The connection pool is sized for the handler threads; the client's default (5 per CPU) would
    make concurrent reconciles open and drop connections.
    """
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        config.load_kube_config(client_configuration=configuration)
    configuration.connection_pool_maxsize = pool_size
    return timed(client.ApiClient(configuration))


def timed(api_client: client.ApiClient) -> client.ApiClient:
    """``api_client`` with ``REQUEST_TIMEOUT`` on every request that sets no timeout of its own."""
    api_client.rest_client = _TimedRESTClient(api_client.configuration)
    return api_client


# Leader election, as client-go's leaderelection does it: a Lease held for LEASE_SECONDS, renewed every
# RENEW_SECONDS; a leader that could not renew for RENEW_DEADLINE_SECONDS stops acting before anyone else may
# take the Lease (RENEW_DEADLINE_SECONDS < LEASE_SECONDS).
LEASE_SECONDS = 15
RENEW_SECONDS = 2.0
RENEW_DEADLINE_SECONDS = 10.0
POD_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def _micro_time(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Observed:
    """A Lease's record as this candidate last read it, and when it last changed by this process's monotonic clock
    (client-go's ``observedRecord`` and ``observedTime``).

    Expiry is judged from when the record was last seen to change, never from the holder's ``renewTime``: that is
    another machine's wall clock, and a skew between the two would let a standby take a live Lease early (its clock
    ahead) or wait for ever (behind). A standby that first sees a Lease therefore waits a full lease duration.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.record: Obj | None = None
        self.changed = -float("inf")

    def holder(self, record: Obj, identity: str) -> str | None:
        """Who else holds the Lease whose spec was just read as ``record``; None: free, expired or ``identity``'s."""
        now = self.clock()
        if record != self.record:
            self.record, self.changed = record, now
        holder = str(record.get("holderIdentity") or "")
        if not holder or holder == identity:
            return None
        duration = float(record.get("leaseDurationSeconds") or LEASE_SECONDS)
        return holder if now < self.changed + duration else None


def lease_namespace(configured: str) -> str:
    """``configured``, else the pod's own namespace, else ``default`` (out of a cluster)."""
    if configured:
        return configured
    with contextlib.suppress(OSError), open(POD_NAMESPACE_FILE, encoding="utf-8") as found:
        return found.read().strip() or "default"
    return "default"


class Elector:
    """Hold a Lease for as long as the process acts: ``wait`` until it is ours, then ``keep`` it renewed.

    Losing it (another holder, or no renewal for ``RENEW_DEADLINE_SECONDS``) calls ``lost``, which must stop
    every action at once: the default ends the process (as client-go's users do), and its restart waits again.
    """

    def __init__(self, kube: Kube, namespace: str, name: str, lost: Callable[[str], None] | None = None) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name
        self.identity = f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
        self.lost = lost or _exit
        self.observed = Observed()
        self.renewed = -float("inf")  # time.monotonic() of the last renewal
        self._stop = threading.Event()

    def try_hold(self) -> str | None:
        """One attempt to take or renew the Lease; None when it is ours now, else who holds it."""
        api = client.CoordinationV1Api(self.kube.api_client)
        now = datetime.now(UTC)
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": _micro_time(now),
        }
        self.kube._count()
        try:
            lease = api.read_namespaced_lease(self.name, self.namespace, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as error:
            if error.status != 404:
                raise
            body = {"metadata": {"name": self.name}, "spec": {**spec, "acquireTime": _micro_time(now)}}
            self.kube._count()
            try:
                api.create_namespaced_lease(self.namespace, body, _request_timeout=REQUEST_TIMEOUT)
            except ApiException as raced:
                if raced.status == 409:
                    return "another candidate (created at the same moment)"
                raise
            return None
        current = self.kube.api_client.sanitize_for_serialization(lease.spec) or {}
        holder = self.observed.holder(current, self.identity)
        if holder is not None:
            return holder
        if current.get("holderIdentity") != self.identity:
            spec["acquireTime"] = _micro_time(now)
            spec["leaseTransitions"] = int(current.get("leaseTransitions") or 0) + 1
        body = {"metadata": {"name": self.name, "resourceVersion": lease.metadata.resource_version}, "spec": spec}
        self.kube._count()
        try:  # an update, so a concurrent candidate's write makes this one fail (409) rather than both win
            api.replace_namespaced_lease(self.name, self.namespace, body, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as raced:
            if raced.status == 409:
                return "another candidate (updated at the same moment)"
            raise
        return None

    def wait(self) -> None:
        """Block until the Lease is ours; say who holds it meanwhile (once per holder)."""
        said = None
        while True:
            try:
                holder = self.try_hold()
            except Exception as error:
                holder = f"unknown ({error_text(error)})"
            if holder is None:
                self.renewed = time.monotonic()
                log.info("leader election: holding Lease %s/%s as %s", self.namespace, self.name, self.identity)
                return
            if holder != said:
                log.info("leader election: Lease %s/%s is held by %s; waiting", self.namespace, self.name, holder)
                said = holder
            time.sleep(RENEW_SECONDS)

    def keep(self) -> threading.Thread:
        """Renew the Lease every ``RENEW_SECONDS`` in a daemon thread; ``lost`` when that fails for good."""
        thread = threading.Thread(target=self._renew_forever, name="mmfleet leader election", daemon=True)
        thread.start()
        return thread

    def _renew_forever(self) -> None:
        while not self._stop.wait(RENEW_SECONDS):
            try:
                holder = self.try_hold()
            except Exception as error:
                holder = None if time.monotonic() - self.renewed < RENEW_DEADLINE_SECONDS else error_text(error)
                if holder is None:
                    log.warning("leader election: renewing Lease %s/%s failed: %s", self.namespace, self.name,
                                error_text(error))  # fmt: skip
                    continue
            else:
                if holder is None:
                    self.renewed = time.monotonic()
                    continue
            self.lost(f"Lease {self.namespace}/{self.name} lost ({holder})")
            return

    def release(self) -> None:
        """Stop renewing and free the Lease at once, so a successor need not wait for it to expire."""
        self._stop.set()
        api = client.CoordinationV1Api(self.kube.api_client)
        with contextlib.suppress(Exception):
            lease = api.read_namespaced_lease(self.name, self.namespace, _request_timeout=REQUEST_TIMEOUT)
            if lease.spec.holder_identity == self.identity:
                body = {
                    "metadata": {"name": self.name, "resourceVersion": lease.metadata.resource_version},
                    "spec": {"leaseDurationSeconds": 1, "renewTime": _micro_time(datetime.now(UTC))},
                }
                api.replace_namespaced_lease(self.name, self.namespace, body, _request_timeout=REQUEST_TIMEOUT)


def _exit(why: str) -> None:
    """Stop acting at once: no handler or autoscaling cycle may run past the loss of the Lease."""
    log.error("leader election: %s; exiting so that only the new holder acts", why)
    logging.shutdown()
    os._exit(3)
