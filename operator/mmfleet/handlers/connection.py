"""kopf's own connection to the API server (its watches, annotation patches and events).

kopf's built-in login opens as many connections as it has requests in flight (aiohttp's
``TCPConnector(limit=0)``, kopf 1.45.2 ``kopf/_cogs/clients/auth.py``), and asyncio gives every
TLS connection a 256 KiB read buffer. At 1,000 fleets created at once that was about 2,000
connections and 264 MB of buffers (tracemalloc, docs/benchmarks.md). The same credentials through
a session that lets at most ``REQUEST_CONNECTIONS`` requests hold a connection at once keep the
memory flat; requests beyond the bound wait.

Watches are outside that bound. kopf holds one stream per watched kind per namespace for as long as
it watches, and with a namespace pattern (``MMFLEET_NAMESPACES=helm-*``) every matching namespace
created later adds eight (fleets and their seven child kinds). A pool bound sized from the configured
namespaces counted the pattern as one namespace: from the fifth matching namespace on, the streams held
every connection and the new namespace's lists timed out waiting for one, so its fleets were never
reconciled.

A kind no longer served (its CRD deleted under the running operator): kopf reconnects a closed watch at once, and when
that is before its CRD observer has seen the deletion, the list or watch meets a plain ``404 page not found``, which
kopf 1.45.2 raises out of every watcher (``kopf/_cogs/clients/watching.py``: ``infinite_watch`` tolerates only 429),
and the whole operator exits (CI, 2026-12-03: the PodMonitor CRD deleted under a running operator). ``KindGone`` asks
again instead, until kopf's observer stops the watcher of a kind it no longer serves.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import kopf

from mmfleet.handlers.records import log
from mmfleet.kube import no_route

# Requests (lists, patches, events) that may hold a connection at once, beside the open watch streams.
REQUEST_CONNECTIONS = 24
# How long a list or watch of a kind found no longer served waits before it asks again; kopf stops it within moments.
GONE_KIND_RETRY_SECONDS = 1.0


class KindGone:
    """An aiohttp client middleware: a list or watch answered by no route at all (a plain-text ``404 page not found``,
    not a JSON Status: the kind is not served) is asked again every ``GONE_KIND_RETRY_SECONDS`` rather than answered,
    so kopf's watcher waits, to be cancelled by its observer or served by a CRD installed again, instead of raising.
    Discovery (``/apis/<group>/<version>``) is answered as it was: kopf's observer learns from its 404 that the kind
    is gone."""

    async def __call__(
        self, request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        waited = False
        while True:
            response = await handler(request)
            if request.method != "GET" or response.status != 404 or not _collection(request.url.path):
                return response
            if not no_route(response.status, await response.text()):
                return response
            response.release()
            if not waited:
                log.info("%s is no longer served; its watch waits for kopf to stop it", request.url.path)
                waited = True
            await asyncio.sleep(GONE_KIND_RETRY_SECONDS)


class RequestBound:
    """An aiohttp client middleware: at most ``limit`` requests other than watches at once, each keeping its slot
    until its body is read (and its connection is back in the pool); a watch stream passes unbounded."""

    def __init__(self, limit: int) -> None:
        self.slots = asyncio.Semaphore(limit)

    async def __call__(
        self, request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        if request.url.query.get("watch") == "true":
            return await handler(request)
        async with self.slots:
            response = await handler(request)
            await response.read()
            return response


def _collection(path: str) -> bool:
    """A path of a kind's objects (``/api/v1/pods``, ``/apis/<group>/<version>/namespaces/<ns>/<plural>``), not of
    discovery (``/api/v1``, ``/apis/<group>/<version>``)."""
    parts = path.strip("/").split("/")
    least = {"api": 3, "apis": 4}.get(parts[0])
    return least is not None and len(parts) >= least


async def login(**kwargs: Any) -> kopf.AiohttpSession | None:
    """kopf's default login (in-cluster, else kubeconfig), through a session with bounded requests."""
    info = await asyncio.to_thread(kopf.login_via_client, **kwargs)
    if info is None:
        return None
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ssl=info.as_ssl_context()),
        headers=info.as_http_headers(),
        middlewares=(KindGone(), RequestBound(REQUEST_CONNECTIONS)),
    )
    return kopf.AiohttpSession(
        server=info.server,
        default_namespace=info.default_namespace,
        expiration=info.expiration,
        priority=info.priority,
        aiohttp_session=session,
    )
