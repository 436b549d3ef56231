"""Fixtures for every test tier; what tests import lives in ``tests.helpers``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.repo import ROOT


@pytest.fixture
def root() -> Path:
    return ROOT
