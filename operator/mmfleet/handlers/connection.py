"""kopf's own connection to the API server (its watches, annotation patches and events).

kopf's built-in login opens as many connections as it has requests in flight (aiohttp's
``TCPConnector(limit=0)``, kopf 1.45.2 ``kopf/_cogs/clients/auth.py``), and asyncio gives every
TLS connection a 256 KiB read buffer. At 1,000 fleets created at once that was about 2,000
connections and 264 MB of buffers (tracemalloc, docs/benchmarks.md). The same credentials
through a session with a bounded pool keep the memory flat; requests beyond the bound wait.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import kopf

from mmfleet.handlers.state import STATE

# Kinds kopf watches: fleets and six kinds of children (each once per watched namespace), plus its own
# watches of CRDs and namespaces; and room for its patches and events beside the open watch streams.
WATCHED_KINDS = 9
REQUEST_CONNECTIONS = 24


def api_connections(namespaces: int) -> int:
    """Connections enough for every watch stream, which holds one for its life, and the requests beside."""
    return WATCHED_KINDS * max(1, namespaces) + REQUEST_CONNECTIONS


@kopf.on.login()
async def login(**kwargs: Any) -> kopf.AiohttpSession | None:
    """kopf's default login (in-cluster, else kubeconfig), through a session with a bounded pool."""
    info = await asyncio.to_thread(kopf.login_via_client, **kwargs)
    if info is None:
        return None
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=api_connections(len(STATE.config.namespaces)), ssl=info.as_ssl_context()),
        headers=info.as_http_headers(),
    )
    return kopf.AiohttpSession(
        server=info.server,
        default_namespace=info.default_namespace,
        expiration=info.expiration,
        priority=info.priority,
        aiohttp_session=session,
    )
