"""The lab's ports: never one handed out before, and clear of the range the kernel picks ``bind(0)`` ports from.

A component binds the port it was given seconds later; a port the kernel picked for ``bind(0)`` can meanwhile be
picked again, for the next port drawn or for any server listening on port 0, and the component dies with "address
already in use" (Prometheus did so in CI on 2026-12-07).
"""

from __future__ import annotations

import socket

import pytest

from mmfleet_lab.cluster import process
from mmfleet_lab.cluster.process import free_port


def test_ports_are_below_the_ephemeral_range_distinct_and_bindable() -> None:
    low = process._ephemeral_low()
    if low < 11000:
        pytest.skip(f"the ephemeral range starts at {low}: no room below it")
    ports = [free_port() for _ in range(50)]
    assert all(port < low for port in ports), [port for port in ports if port >= low]
    assert len(set(ports)) == len(ports)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[-1]))


def test_without_room_below_the_range_the_kernel_picks_and_no_port_comes_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(process, "_ephemeral_low", lambda: 1024)
    earlier = free_port()
    picks = iter([earlier, earlier, earlier + 1])
    monkeypatch.setattr(process, "_kernel_port", lambda: next(picks))
    assert free_port() == earlier + 1
