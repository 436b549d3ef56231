"""The lab's ports stay clear of the range the kernel gives outgoing connections.

A component binds the port it was given seconds later; a port from the ephemeral range can meanwhile become
the local end of another process's outgoing connection, and the component dies with "address already in use"
(Prometheus did so in CI on 2026-12-07).
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from mmfleet_lab.cluster.process import free_port


def _ephemeral_range() -> tuple[int, int]:
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return int(low), int(high)


def test_ports_are_below_the_ephemeral_range_distinct_and_bindable() -> None:
    low, _ = _ephemeral_range()
    if low < 11000:
        pytest.skip(f"the ephemeral range starts at {low}: no room below it")
    ports = [free_port() for _ in range(50)]
    assert all(port < low for port in ports), [port for port in ports if port >= low]
    assert len(set(ports)) == len(ports)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[-1]))
