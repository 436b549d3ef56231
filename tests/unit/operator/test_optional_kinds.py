"""kopf's warning about the watch of an optional kind (PodMonitor, InferencePool, HTTPRoute) on a cluster without its
CRD: dropped, since kopf would repeat it on every CRD change; a warning naming another kind stays."""

from __future__ import annotations

import logging

import pytest
from kopf._cogs.structs.references import Selector
from kopf._core.reactor.observation import _disable_mismatched_selectors

from mmfleet.handlers.children import CHILD_KINDS, OPTIONAL_KINDS
from mmfleet.handlers.settings import quiet_optional_kinds

OBSERVER = "kopf._core.reactor.observation"


def warned(caplog: pytest.LogCaptureFixture, *kinds: tuple[str, str, str]) -> list[str]:
    """What kopf's own check logs when none of ``kinds`` is served, as the handlers register them."""
    quiet_optional_kinds()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=OBSERVER):
        _disable_mismatched_selectors(resources=set(), selectors=frozenset(Selector(*kind) for kind in kinds))
    return [r.getMessage() for r in caplog.records if r.name == OBSERVER]


def test_the_optional_kinds_unresolved_are_not_warned(caplog: pytest.LogCaptureFixture) -> None:
    assert set(OPTIONAL_KINDS) <= set(CHILD_KINDS)
    assert warned(caplog, *OPTIONAL_KINDS) == []


def test_another_kind_unresolved_is_still_warned(caplog: pytest.LogCaptureFixture) -> None:
    deployments = ("apps", "v1", "deployments")
    assert len(warned(caplog, deployments)) == 1
    (both,) = warned(caplog, *OPTIONAL_KINDS, deployments)
    assert "deployments" in both
