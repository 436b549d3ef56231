"""Fixtures for every test tier; what tests import lives in ``tests.helpers``."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.repo import ROOT


@pytest.fixture
def root() -> Path:
    return ROOT


@pytest.fixture
def fresh_operator_state() -> Iterator[None]:
    """An empty operator memory for the test, the previous one back after it (``STATE`` is the process' one)."""
    from mmfleet.handlers.state import STATE, State

    kept = {f.name: getattr(STATE, f.name) for f in dataclasses.fields(State)}
    empty = State()
    for name in kept:
        setattr(STATE, name, getattr(empty, name))
    yield
    for name, value in kept.items():
        setattr(STATE, name, value)
