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
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import kopf

# Requests (lists, patches, events) that may hold a connection at once, beside the open watch streams.
REQUEST_CONNECTIONS = 24


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


async def login(**kwargs: Any) -> kopf.AiohttpSession | None:
    """kopf's default login (in-cluster, else kubeconfig), through a session with bounded requests."""
    info = await asyncio.to_thread(kopf.login_via_client, **kwargs)
    if info is None:
        return None
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ssl=info.as_ssl_context()),
        headers=info.as_http_headers(),
        middlewares=(RequestBound(REQUEST_CONNECTIONS),),
    )
    return kopf.AiohttpSession(
        server=info.server,
        default_namespace=info.default_namespace,
        expiration=info.expiration,
        priority=info.priority,
        aiohttp_session=session,
    )
