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
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client import rest
from kubernetes.client.exceptions import ApiException, NotFoundException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError, ResourceNotFoundError
from kubernetes.dynamic.resource import Resource

from mmfleet.api import API_VERSION, KIND
from mmfleet.render import FIELD_MANAGER, STANDBY_ANNOTATION

Obj = dict[str, Any]
# (apiVersion, kind, namespace, name) of one object.
ObjectRef = tuple[str, str, str | None, str]
log = logging.getLogger("mmfleet")
AUTOSCALER_FIELD_MANAGER = "mmfleet-autoscaler"
# (connect, read) seconds for one request. A reconcile makes a handful; a list of every node is the largest read.
REQUEST_TIMEOUT = (5.0, 30.0)
# A log comes from the node through the API server; the autoscaler's cycle does not wait on a slow one for long.
LOG_TIMEOUT = (2.0, 5.0)
# Reads of get_each in flight at once, for all callers: at most a reconcile's children for each of a few workers.
LOOKUP_THREADS = 16
# Threads beside the workers and get_each's that call the API server: the server-log readers (4), the standby's
# sleepers and wakers (8 each), the leader's renewals (1). tests/unit/operator/test_kube_pool.py holds it to them.
OTHER_CALLERS = 4 + 2 * 8 + 1


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


class KindNotServedError(RetryableError):
    """A write of a kind the API server no longer serves (its CRD removed since discovery said it was served): the
    caller asks discovery afresh and tries again."""

    def __init__(self, api_version: str, kind: str, call: str) -> None:
        super().__init__(f"404: the API server serves no {kind} ({api_version}) any more", call=call)
        self.api_version, self.kind = api_version, kind


def no_route(status: int | None, body: str) -> bool:
    """A 404 from no route at all (a plain-text ``404 page not found``, not a Status): the kind is not served."""
    return status == 404 and not body.lstrip().startswith("{")


def _kind_gone(error: ApiException) -> bool:
    return no_route(error.status, str(error.body or ""))


class NamespaceTerminatingError(Exception):
    """The namespace is being deleted, or is gone: nothing can be created in it, and nothing needs to be."""


def _namespace_gone(error: ApiException) -> bool:
    """A 404 about the namespace itself (a write into one deleted meanwhile), not about the object written."""
    try:
        details = json.loads(error.body or "{}").get("details") or {}
    except (ValueError, AttributeError):
        return False
    return error.status == 404 and details.get("kind") == "namespaces"


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
    """A thin, typed face over the Kubernetes client for the few calls the operator makes."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        self.dynamic = DynamicClient(self.api_client)
        self._resources: dict[tuple[str, str], Resource] = {}
        self._lock = threading.Lock()
        # The dynamic client's discovery cache is not thread-safe: a search while another thread invalidates or fills
        # it fails with KeyError 'resources' (seen in the fuzz test's live leg, get_each's threads beside has_api).
        self._discovery = threading.Lock()
        self._thread = threading.local()
        self.requests = 0
        # get_each's reads; its threads start on first use.
        self._lookups = ThreadPoolExecutor(LOOKUP_THREADS, thread_name_prefix="kube-get")

    def _count(self, requests: int = 1) -> None:
        with self._lock:
            self.requests += requests
        self._thread.requests = self.thread_requests() + requests

    def thread_requests(self) -> int:
        """Requests made by the calling thread so far; a handler's difference is its own cost."""
        count: int = getattr(self._thread, "requests", 0)
        return count

    def _resource(self, api_version: str, kind: str) -> Resource:
        key = (api_version, kind)
        found = self._resources.get(key)
        if found is None:
            with self._discovery:
                found = self._resources.get(key) or self.dynamic.resources.get(api_version=api_version, kind=kind)
                self._resources[key] = found
        return found

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
            if (error.status == 403 and "NamespaceTerminating" in str(error.body or "")) or _namespace_gone(error):
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
        call = f"apply {manifest['kind']} {_where(meta.get('namespace'), meta['name'])}"
        try:
            with self._errors(call):
                result = self.dynamic.server_side_apply(
                    self._resource(manifest["apiVersion"], manifest["kind"]),
                    # A UTF-8 string: the client's own json.dumps escapes a character outside the Basic Multilingual
                    # Plane as a UTF-16 surrogate pair, which the API server's YAML decoder (an apply is YAML) refuses.
                    body=json.dumps(manifest, ensure_ascii=False),
                    name=meta["name"],
                    namespace=meta.get("namespace"),
                    field_manager=manager,
                    force_conflicts=True,
                    serialize=False,
                    _request_timeout=REQUEST_TIMEOUT,
                )
        except ApiException as error:
            if _kind_gone(error):
                self._resources.pop((manifest["apiVersion"], manifest["kind"]), None)
                raise KindNotServedError(manifest["apiVersion"], manifest["kind"], call) from error
            raise
        return _json(result)

    def set_managed_fields(self, obj: Obj, managed_fields: list[Obj]) -> None:
        """Rewrite which manager owns which fields of ``obj`` (a merge patch of ``managedFields``), changing no field.

        At the resourceVersion ``obj`` was read at: a write since is a 409, retried, so an edit is never lost.
        """
        meta = obj["metadata"]
        body = {"metadata": {"resourceVersion": meta["resourceVersion"], "managedFields": managed_fields}}
        self._count()
        with self._errors(f"take over fields of {obj['kind']} {_where(meta.get('namespace'), meta['name'])}"):
            response = self.dynamic.patch(
                self._resource(obj["apiVersion"], obj["kind"]),
                body=body,
                name=meta["name"],
                namespace=meta.get("namespace"),
                content_type="application/merge-patch+json",
                field_manager=FIELD_MANAGER,
                serialize=False,
                _request_timeout=REQUEST_TIMEOUT,
            )
        _json(response)

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> Obj | None:
        """One object, or None."""
        self._count()
        return self._get(api_version, kind, namespace, name, cached=False)

    def get_each(self, wanted: Sequence[ObjectRef], cached: bool = False) -> list[Obj | None]:
        """``get`` of each (apiVersion, kind, namespace, name), at once: a reconcile waits one round trip, not one
        per object. Counted as the calling thread's requests; the first failure is raised. ``cached``: from the API
        server's watch cache (``resourceVersion=0``), which spares etcd a quorum read; it may lag a write by a
        moment, so only for a check that races its own write anyway."""
        self._count(len(wanted))

        def read(ref: ObjectRef) -> Obj | None:
            api_version, kind, namespace, name = ref
            return self._get(api_version, kind, namespace, name, cached)

        return list(self._lookups.map(read, wanted))

    def _get(self, api_version: str, kind: str, namespace: str | None, name: str, cached: bool) -> Obj | None:
        with self._errors(f"get {kind} {_where(namespace, name)}", refusals=False):
            path = self._resource(api_version, kind).path(name=quote(name, safe=""), namespace=namespace)
            query = [("resourceVersion", "0")] if cached else []
            try:
                data = self._read(path, query, "application/json", REQUEST_TIMEOUT)
            except NotFoundException:
                return None
        found: Obj = json.loads(data)
        return found

    def _read(self, path: str, query: list[tuple[str, str]], accept: str, timeout: tuple[float, float]) -> bytes:
        """A GET's body, read whole (so its connection goes back to the pool); a failure raised as ``ApiException``.

        Instead of the dynamic client, whose every 404 formats the traceback of its exception (a third of the CPU of
        a new fleet's claim reads, which all find nothing), and of the typed APIs, whose first use imports their
        models (``CoreV1Api``: 250 modules, 21 MB of the operator's memory, for a pod's log alone).
        """
        request = self.api_client.param_serialize(
            "GET", path, query_params=query, header_params={"Accept": accept}, auth_settings=["BearerToken"]
        )
        response = self.api_client.call_api(*request, _request_timeout=timeout)
        data: bytes = response.read()
        if not 200 <= response.status <= 299:  # from_response raises the status's own subclass itself
            raise ApiException.from_response(http_resp=response, body=data.decode("utf-8", "replace"), data=None)
        return data

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
        scale = self._resource("apps/v1", "Deployment").subresources["scale"]
        body = {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": name, "namespace": namespace}}
        self._apply_as(manager, scale, {**body, "spec": {"replicas": replicas}}, f"to {replicas}")

    def scale_with_standby(self, namespace: str, name: str, replicas: int, standby: int) -> None:
        """Set a Deployment's replicas and the count of them that are warm standby (its
        ``mmfleet.io/standby-replicas`` annotation; 0 removes it) in one server-side apply, as the scaler: the two
        never disagree, whatever fails between two reconciles."""
        annotations = {STANDBY_ANNOTATION: str(standby)} if standby else {}
        meta = {"name": name, "namespace": namespace, "annotations": annotations}
        body = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": {"replicas": replicas}}
        what = f"to {replicas} ({standby} warm standby)"
        self._apply_as(AUTOSCALER_FIELD_MANAGER, self._resource("apps/v1", "Deployment"), body, what)

    def _apply_as(self, manager: str, resource: Resource, body: Obj, what: str) -> None:
        """Server-side apply of the replicas of the Deployment ``body`` names, as ``manager``, taking them over."""
        meta = body["metadata"]
        self._count()
        with self._errors(f"scale Deployment {meta['namespace']}/{meta['name']} {what}"):
            response = self.dynamic.patch(
                resource,
                body=body,
                name=meta["name"],
                namespace=meta["namespace"],
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

    def mark_pod(self, namespace: str, name: str, labels: dict[str, str], annotations: dict[str, str | None]) -> None:
        """Merge ``labels`` and ``annotations`` (None removes one) into a pod's metadata."""
        self._count()
        with self._errors(f"label pod {namespace}/{name}"):
            response = self.dynamic.patch(
                self._resource("v1", "Pod"),
                body={"metadata": {"labels": labels, "annotations": annotations}},
                name=name,
                namespace=namespace,
                content_type="application/merge-patch+json",
                field_manager=FIELD_MANAGER,
                serialize=False,
                _request_timeout=REQUEST_TIMEOUT,
            )
        _json(response)

    def pod_log(self, namespace: str, name: str, container: str, limit_bytes: int) -> str:
        """The first ``limit_bytes`` of a container's log, as its node keeps it; a character cut at the limit (or
        not UTF-8) is replaced, not an error."""
        self._count()
        with self._errors(f"read the log of pod {namespace}/{name}", refusals=False):
            path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}/log"
            query = [("container", container), ("limitBytes", str(limit_bytes))]
            body = self._read(path, query, "*/*", LOG_TIMEOUT)  # a log is text/plain, which */* takes
        return body.decode("utf-8", errors="replace")

    def provider_ids(self) -> list[str]:
        nodes = self.list_objects("v1", "Node")
        return [n.get("spec", {}).get("providerID") or "" for n in nodes]

    def has_api(self, api_version: str, kind: str) -> bool:
        """Whether a kind is served now (e.g. the Prometheus Operator's PodMonitor): asks discovery afresh, so a
        CRD installed or removed since the last look is seen (callers ask every few minutes, not per reconcile)."""
        with self._discovery:
            self._resources.pop((api_version, kind), None)
            self.dynamic.resources.invalidate_cache()
        with self._errors(f"discover {kind}", refusals=False):
            try:
                self._resource(api_version, kind)
            except ResourceNotFoundError:
                return False
        return True

    # Leases, for leader election (``mmfleet.leader``): the typed client, read as plain JSON, needs no discovery.
    # A failure other than the one each call names raises as the client raises it (ApiException, or urllib3's).

    def _lease_call(self, call: Callable[[client.CoordinationV1Api, Obj], Any], absent: int) -> Obj | None:
        """One Lease request; None when the API server answers ``absent`` (404 to a read, 409 to a write)."""
        self._count()
        raw: Obj = {"_preload_content": False, "_request_timeout": REQUEST_TIMEOUT}
        try:
            return _json(call(client.CoordinationV1Api(self.api_client), raw))
        except ApiException as error:
            if error.status == absent:
                return None
            raise

    def get_lease(self, namespace: str, name: str) -> Obj | None:
        """A ``coordination.k8s.io/v1`` Lease, None when there is none."""
        return self._lease_call(lambda api, raw: api.read_namespaced_lease(name, namespace, **raw), absent=404)

    def create_lease(self, namespace: str, lease: Obj) -> bool:
        """Create a Lease; False when another writer created one of that name first (409)."""
        created = self._lease_call(lambda api, raw: api.create_namespaced_lease(namespace, lease, **raw), absent=409)
        return created is not None

    def replace_lease(self, namespace: str, lease: Obj) -> bool:
        """Replace a Lease at the ``resourceVersion`` its metadata names; False when it changed since (409).

        An update, not an apply: of two candidates writing at once, one fails rather than both win.
        """
        name = lease["metadata"]["name"]
        replaced = self._lease_call(
            lambda api, raw: api.replace_namespaced_lease(name, namespace, lease, **raw), absent=409
        )
        return replaced is not None


class _TimedRESTClient(rest.RESTClientObject):  # type: ignore[misc]  # the client has no type hints
    """The client's transport with ``REQUEST_TIMEOUT`` for requests that name none (discovery's, for one)."""

    def request(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["_request_timeout"] = kwargs.get("_request_timeout") or REQUEST_TIMEOUT
        return super().request(*args, **kwargs)


def pool_size(workers: int) -> int:
    """Connections to keep for ``workers`` reconcile and as many autoscaler threads: one for every thread that may
    hold a request at once. A smaller pool closes each connection it has no room for when it is given back, and
    every one opened again costs a TLS handshake on both sides (a pool of 32 closed 14-28 in a burst of 1,000 new
    fleets, and logged a warning for each)."""
    return 2 * workers + LOOKUP_THREADS + OTHER_CALLERS


class CredentialsError(ValueError):
    """Neither a pod's service account nor a usable kubeconfig: the operator cannot reach any API server."""


def credentials() -> client.Configuration:
    """In-cluster credentials when running in a pod, else KUBECONFIG / ~/.kube/config (and any credential command the
    kubeconfig names, as every client runs it). A kubeconfig that cannot be used raises ``CredentialsError`` naming it:
    the client's own errors name neither the file nor what it expects."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        # Read now, not when the client was imported (its default is fixed then), with the same meaning: kopf's login
        # reads that default, so both accept the same files (an empty KUBECONFIG names none).
        source = os.environ.get("KUBECONFIG", "~/.kube/config")
        try:
            config.load_kube_config(config_file=source, client_configuration=configuration)
        except (config.ConfigException, OSError, ValueError, TypeError, KeyError, AttributeError, yaml.YAMLError) as e:
            why = " ".join(str(e).split())  # YAML's errors run over lines
            why = f"{type(e).__name__}: {why}" if isinstance(e, (TypeError, KeyError, AttributeError)) else why
            raise CredentialsError(
                f"not in a pod (no service account), and the kubeconfig {source or repr(source)} cannot be used: "
                f"{why}; expected a kubeconfig file (KUBECONFIG or ~/.kube/config) whose current context names a "
                "cluster and a user"
            ) from e
    return configuration


def load_client(connections: int) -> client.ApiClient:
    """A client on ``credentials()`` with ``connections`` kept open (the client's default is 5 per CPU; ``pool_size``
    says how many the operator needs)."""
    configuration = credentials()
    configuration.connection_pool_maxsize = connections
    return timed(client.ApiClient(configuration))


def timed(api_client: client.ApiClient) -> client.ApiClient:
    """``api_client`` with ``REQUEST_TIMEOUT`` on every request that sets no timeout of its own."""
    api_client.rest_client = _TimedRESTClient(api_client.configuration)
    return api_client
