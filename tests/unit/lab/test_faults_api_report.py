"""The API-fault benchmark's row (trials, what did not converge, the percentiles, the conditions in general words), and
its flags."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from mmfleet_lab.faults_api import HEADERS, Counts, Trial, row
from mmfleet_lab.faults_crash import Audit
from tests.helpers.cli import run

NS = "bench"


def trial(converge: float | None, said: dict[str, list[str]], requests: int = 30, lost: int = 0) -> Trial:
    counts = Counts(during_fault=Counter({f"PATCH /apis/apps/v1/namespaces/{NS}/deployments/api-0": requests}))
    counts.faulted = 3
    return Trial("409-on-apply", 15.0, counts, converge, Audit(lost=lost), said)


def test_a_row_counts_what_did_not_converge_and_says_the_conditions_in_general_words() -> None:
    retry = "ApiServerRetrying: apply Deployment bench/{}: 409 Conflict; next in {} s"
    trials = [
        trial(4.0, {"api-0": ["RolledOut: 1/1 replicas ready", retry.format("api-0", 5)], "api-1": []}),
        trial(
            9.0,
            {
                "api-0": [retry.format("api-0", 10), "RolledOut: 2/2 ready"],
                "api-1": [retry.format("api-1", 5), retry.format("api-1", 10)],
            },
        ),
        trial(None, {"api-0": [], "api-1": []}, requests=60, lost=1),
    ]
    cells = dict(zip(HEADERS, row("409-on-apply", trials, NS), strict=True))
    assert (cells["trials"], cells["not converged"], cells["lost"]) == (3, 1, 1)
    assert (cells["converge p50 s"], cells["converge p99 s"]) == ("4.0", "9.0")  # nearest rank, of the converged
    assert cells["requests during the fault (non-watch, mean)"] == "40 in 15 s"
    assert cells["per s and fleet (max)"] == "2.0"  # 60 requests in 15 s, 2 fleets
    said = cells["Progressing seen (fleet-trials)"]
    assert said == '"ApiServerRetrying: apply Deployment <fleet>: 409 Conflict; next in N s" (3 of 6)', said
    assert cells["ApiServerRetrying kept"] == "2 of 3", "the second trial's api-0 lost it to RolledOut"


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--api-trials", "-1"], "--api-trials: -1: must be 0 (none) or more"),
        (["--kills", "0", "--api-trials", "0"], "--kills 0 and --api-trials 0: nothing to run"),
    ],
)
def test_bench_faults_refuses_a_bad_count_naming_it_before_starting_a_cluster(
    tmp_path: Path, flags: list[str], said: str
) -> None:
    docs = tmp_path / "reliability.md"
    result = run("bench", "faults", *flags, "--docs", str(docs))
    assert result.returncode == 2 and said in result.stderr and "Traceback" not in result.stderr
    assert not docs.exists()
