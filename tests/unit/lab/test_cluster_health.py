"""`up` on a recorded cluster: a busy API server that misses one `/readyz` answer is not a dead cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmfleet_lab.cluster import cluster as lab
from mmfleet_lab.cluster import process
from mmfleet_lab.cluster.process import Proc


def running(tmp_path: Path) -> lab.Cluster:
    procs = tuple(Proc(c, 1, c, str(tmp_path / f"{c}.log")) for c in lab.COMPONENTS)
    return lab.Cluster("c", tmp_path, tmp_path / "kubeconfig", "https://127.0.0.1:1", "2s", procs)


@pytest.fixture
def slow_readyz(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every component alive; `/readyz` times out twice, then answers ok. Returns the calls made."""
    calls: list[str] = []

    def http_get(url: str, context: object = None) -> str:
        calls.append(url)
        if len(calls) <= 2:
            raise TimeoutError("timed out")
        return "ok"

    monkeypatch.setattr(process, "alive", lambda _: True)
    monkeypatch.setattr(process, "http_get", http_get)
    monkeypatch.setattr(lab, "_tls", lambda _: None)
    monkeypatch.setattr("time.sleep", lambda _: None)
    return calls


def test_a_cluster_whose_api_server_misses_an_answer_is_still_healthy_within_the_patience(
    tmp_path: Path, slow_readyz: list[str]
) -> None:
    assert lab._healthy(running(tmp_path), patience=15.0)
    assert len(slow_readyz) == 3


def test_without_patience_one_missed_answer_is_unhealthy(tmp_path: Path, slow_readyz: list[str]) -> None:
    assert not lab._healthy(running(tmp_path))
    assert len(slow_readyz) == 1


def test_a_dead_component_is_unhealthy_at_once(
    tmp_path: Path, slow_readyz: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(process, "alive", lambda p: p.component != "etcd")
    assert not lab._healthy(running(tmp_path), patience=15.0)
    assert slow_readyz == []
