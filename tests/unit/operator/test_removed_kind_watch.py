"""A CRD deleted under the running operator: kopf's own watch loop, against a server that no longer serves the kind
(a plain ``404 page not found``, as kube-apiserver answers once a CRD is gone), keeps the operator up until kopf's
observer stops the watch, where kopf 1.45.2 alone raises out of every watcher and the operator exits. kopf's private
modules are imported here only to drive its real watch loop; the operator uses none."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import kopf
import pytest
from aiohttp import web
from kopf._cogs.clients import auth, errors, watching
from kopf._cogs.structs import credentials, references

from mmfleet.handlers import connection
from tests.helpers.aiohttp_server import served

PODMONITORS = references.Resource("monitoring.coreos.com", "v1", "podmonitors", namespaced=True)


async def _watch_for(seconds: float, middlewares: tuple[aiohttp.ClientMiddlewareType, ...]) -> tuple[list[object], int]:
    """kopf's ``infinite_watch`` of PodMonitors for ``seconds`` through a session with ``middlewares``, against a server
    where the kind is gone: the events it yielded and the requests the server answered."""
    asked = []

    async def gone(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.Response(status=404, text="404 page not found")

    seen: list[object] = []
    async with served(gone) as url, aiohttp.ClientSession(middlewares=middlewares) as session:
        vault = credentials.Vault()
        await vault.populate({"test": kopf.AiohttpSession(server=url, aiohttp_session=session)})
        auth.vault_var.set(vault)

        async def consume() -> None:
            stream: AsyncIterator[object] = watching.infinite_watch(
                settings=kopf.OperatorSettings(), resource=PODMONITORS, namespace=None
            )
            async for event in stream:
                seen.append(event)

        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(consume(), seconds)
    return seen, len(asked)


def test_a_kind_gone_keeps_kopfs_watch_waiting_and_asking_again() -> None:
    middlewares = (connection.KindGone(), connection.RequestBound(connection.REQUEST_CONNECTIONS))
    seen, asked = asyncio.run(_watch_for(2.5, middlewares))  # no raise: the watcher waits to be stopped
    assert seen == []
    assert 2 <= asked <= 4  # once a second (GONE_KIND_RETRY_SECONDS), not kopf's 0.1 s reconnect loop


async def _status_through_kind_gone(path: str, answer: web.Response) -> int:
    """The status a GET of ``path`` gets through ``KindGone`` from a server that always gives ``answer``."""

    async def serve(request: web.Request) -> web.Response:
        return answer

    async with (
        served(serve) as url,
        aiohttp.ClientSession(middlewares=(connection.KindGone(),)) as session,
        session.get(f"{url}{path}") as response,
    ):
        return response.status


def test_a_json_not_found_is_answered() -> None:
    """Only no route at all is waited out: a Status 404 (an object, not a kind, missing) reaches kopf as it was."""
    missing = web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)
    read = _status_through_kind_gone("/api/v1/namespaces/x/pods/y", missing)
    assert asyncio.run(asyncio.wait_for(read, 5)) == 404


@pytest.mark.parametrize("path", ["/apis/monitoring.coreos.com/v1", "/api/v1", "/apis"])
def test_discovery_of_a_gone_group_is_answered(path: str) -> None:
    """kopf's observer learns that a kind is gone from the 404 of its group's discovery: that one must reach it."""
    read = _status_through_kind_gone(path, web.Response(status=404, text="404 page not found"))
    assert asyncio.run(asyncio.wait_for(read, 5)) == 404


def test_without_it_kopf_raises_out_of_the_watcher() -> None:
    """What the operator died of: the 404 escapes ``infinite_watch`` (this notices a kopf that fixed it)."""
    with pytest.raises(errors.APINotFoundError):
        asyncio.run(_watch_for(2.5, ()))
