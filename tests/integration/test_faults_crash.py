"""Crash mid-reconcile (issue 13): SIGKILL the operator at random moments while fleets change.

``MMFLEET_CRASH_KILLS`` (default 10) trials, seeded by ``MMFLEET_CRASH_SEED`` (default 0); after each
restart the namespace must converge with 0 orphaned, duplicated or adopted children, status right
and no stuck deletion. ``MMFLEET_CRASH_REPORT=<file>`` writes the counts as a table row there.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from mmfleet_lab import faults_crash
from mmfleet_lab.bench.report import table
from mmfleet_lab.cluster import Cluster
from tests.helpers.operator_process import OperatorProcess

pytestmark = pytest.mark.integration


def test_sigkills_mid_reconcile_lose_duplicate_and_adopt_nothing(
    own_operator_only: None, cluster: Cluster, crd: None, api: Any, namespace: str, tmp_path: Path
) -> None:
    kills = int(os.environ.get("MMFLEET_CRASH_KILLS", "10"))
    seed = int(os.environ.get("MMFLEET_CRASH_SEED", "0"))
    process = OperatorProcess(cluster.kubeconfig, tmp_path / "operator.log")
    process.start()

    def restart() -> None:
        process.kill()
        process.start()

    try:
        report = faults_crash.run(
            faults_crash.Namespace(api, namespace), restart, kills, seed, progress=lambda line: print(line, flush=True)
        )
    finally:
        process.stop()
    if path := os.environ.get("MMFLEET_CRASH_REPORT"):
        Path(path).write_text(table(faults_crash.HEADERS, [report.row()]) + "\n")
    assert report.kills == kills
    assert report.unconverged == 0, f"{report.worst.problems}\n{process.tail()}"
