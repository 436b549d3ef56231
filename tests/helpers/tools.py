"""Tests that need a tool the fast tier does not install (helm, kubectl, promtool, Lua, root for namespaces).

``make fast`` runs before anything is installed or built, so there such a test skips; ``make integration`` installs
and builds everything first and sets ``MMFLEET_REQUIRE_TOOLS=1``, under which a missing tool fails the test instead
of skipping it, so nothing that CI is meant to prove is skipped there.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

REQUIRED = os.environ.get("MMFLEET_REQUIRE_TOOLS") == "1"


def missing(why: str) -> NoReturn:
    """Skip for want of a tool, or fail where the tools are required."""
    if REQUIRED:
        pytest.fail(f"{why} (MMFLEET_REQUIRE_TOOLS=1: make integration installs and builds every tool first)")
    pytest.skip(why)
