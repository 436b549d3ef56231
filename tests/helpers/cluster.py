"""The integration tests' session cluster: its name and shape."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

from mmfleet_lab.cluster import Cluster, NodePool, attach, get, process
from tests.helpers.repo import DATA
from tests.helpers.wait import wait_for

# One cluster per pytest process, so sessions running side by side (two developers' shells, two agents)
# never share, or tear down, each other's cluster; the pid in the name lets a later session clean up
# after one that was killed.
CLUSTER_PREFIX = "mmfleet-it-"
CLUSTER_NAME = f"{CLUSTER_PREFIX}{os.getpid()}"
POD_READY_DELAY = "2s"
SCRAPE_INTERVAL = "2s"  # Prometheus'; short, so a test sees a full rate() window within seconds
POOLS = (
    NodePool(cloud="eks", gpu_type="H100", count=2),
    NodePool(cloud="aks", gpu_type="A100", count=1),
    NodePool(cloud="ack", gpu_type="H20", count=1),
)


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "600"], start_new_session=True)


def down_leaves_nothing_behind(cluster: Cluster) -> None:
    """``mmfleet cluster down`` from another process, with an attached process and a twin serving the cluster, leaves
    nothing behind: the session cluster's teardown (tests/integration/conftest.py), so no test has to run last."""
    recorded = get(CLUSTER_NAME)  # not the fixture's: Prometheus may have been restarted since
    assert recorded is not None
    pids = recorded.pids
    components = {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "prometheus"}
    assert set(pids) >= components
    assert all(process.alive(p) for p in recorded.processes if p.component in components)
    attached = sleeper()  # an attached process (what ``mmfleet demo`` does with the operator) goes down too
    pids["sleeper"] = attached.pid
    attach(CLUSTER_NAME, "sleeper", attached.pid)
    twin = subprocess.Popen(  # so does a twin serving the cluster, which records itself
        [sys.executable, "-m", "mmfleet.cli", "twin", "serve", "--cluster", CLUSTER_NAME, "--traces", str(DATA)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pids["twin"] = twin.pid
    wait_for(partial(_recorded, "twin", twin.pid), 30, "the twin to record itself")
    done = subprocess.run(
        [sys.executable, "-m", "mmfleet_lab.cluster", "down", "--name", CLUSTER_NAME],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for component, pid in pids.items():
        _reap(pid)  # they were started by this process, so their zombies are ours to collect
        assert not Path(f"/proc/{pid}").exists(), f"{component} (pid {pid}) still exists"
    assert twin.wait(timeout=5) == 0  # stopped by SIGTERM, cleanly
    assert not cluster.state_dir.exists()
    assert get(CLUSTER_NAME) is None


def _recorded(component: str, pid: int) -> bool:
    state = get(CLUSTER_NAME)
    return state is not None and state.pids.get(component) == pid


def _reap(pid: int) -> None:
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)
