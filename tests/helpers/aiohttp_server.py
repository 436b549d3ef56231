"""A throwaway aiohttp server on 127.0.0.1 for tests that drive a client (kopf's, aiohttp's) against it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web


@contextlib.asynccontextmanager
async def served(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> AsyncIterator[str]:
    """``handler`` answering every GET at the yielded ``http://127.0.0.1:<port>``, until the block ends."""
    app = web.Application()
    app.router.add_get("/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
