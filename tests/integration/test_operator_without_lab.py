"""`pip install .` without the lab extra runs the operator: a reconcile to Ready with the lab unimportable."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.helpers.fleet import Fleet
from tests.helpers.operator_process import LAB_MODULES, OperatorProcess
from tests.helpers.repo import ROOT

pytestmark = pytest.mark.integration

MINIMAL = ROOT / "examples" / "minimal.yaml"


@pytest.fixture
def fleet_without_lab(api: Any, namespace: str, operator: OperatorProcess) -> Iterator[Fleet]:
    """The session's operator, restarted unable to import the lab and its dependencies; restored after."""
    operator.stop()
    operator.without = LAB_MODULES
    operator.start()
    yield Fleet(api, namespace)
    operator.stop()
    operator.without = ()
    operator.start()


def test_the_minimal_example_reconciles_to_ready(fleet_without_lab: Fleet, operator: OperatorProcess) -> None:
    fleet_without_lab.create(yaml.safe_load(MINIMAL.read_text()))
    status = fleet_without_lab.wait_ready("minimal")
    assert status["desiredReplicas"] == 1
    assert operator.proc is not None and operator.proc.poll() is None, operator.tail()
    assert "Traceback" not in operator.tail(400)
