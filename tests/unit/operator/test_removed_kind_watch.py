"""A CRD deleted under the running operator: kopf's own watch loop, against a server that no longer serves the kind
(a plain ``404 page not found``, as kube-apiserver answers once a CRD is gone), keeps the operator up until kopf's
observer stops the watch, where kopf 1.45.2 alone raises out of every watcher and the operator exits."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator

import kopf
import pytest
from aiohttp import web
from kopf._cogs.clients import auth, errors, watching
from kopf._cogs.structs import credentials, references

from mmfleet.handlers import settings
from tests.helpers.aiohttp_server import served

PODMONITORS = references.Resource("monitoring.coreos.com", "v1", "podmonitors", namespaced=True)


async def _watch_for(seconds: float, install: Callable[[], None]) -> tuple[list[object], int]:
    """kopf's ``infinite_watch`` of PodMonitors for ``seconds`` against a server where the kind is gone: the events it
    yielded and the requests the server answered."""
    asked = []

    async def gone(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.Response(status=404, text="404 page not found")

    seen: list[object] = []
    async with served(gone) as url:
        vault = credentials.Vault()
        await vault.populate({"test": credentials.ConnectionInfo(server=url)})
        auth.vault_var.set(vault)
        install()

        async def consume() -> None:
            stream: AsyncIterator[object] = watching.infinite_watch(
                settings=kopf.OperatorSettings(), resource=PODMONITORS, namespace=None
            )
            async for event in stream:
                seen.append(event)

        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(consume(), seconds)
    return seen, len(asked)


@pytest.fixture
def kopf_watch() -> Iterator[None]:
    """kopf's own ``continuous_watch`` for the test (``handlers.register`` in another test installs ours for good)."""
    installed = watching.continuous_watch
    watching.continuous_watch = settings.KOPF_CONTINUOUS_WATCH
    yield
    watching.continuous_watch = installed


def test_a_kind_gone_ends_kopfs_watch_quietly_and_it_asks_again(kopf_watch: None) -> None:
    seen, asked = asyncio.run(_watch_for(2.5, settings.survive_removed_kinds))  # no raise: kopf's loop runs on
    assert seen == []
    assert 2 <= asked <= 4  # once a second (GONE_KIND_RETRY_SECONDS), not kopf's 0.1 s reconnect loop


def test_without_it_kopf_raises_out_of_the_watcher(kopf_watch: None) -> None:
    """What the operator died of: the 404 escapes ``infinite_watch`` (this notices a kopf that fixed it)."""
    with pytest.raises(errors.APINotFoundError):
        asyncio.run(_watch_for(2.5, lambda: None))
