"""A synthetic benchmark cell: Poisson arrivals at a rate per minute, served by the calibrated replica."""

from __future__ import annotations

import numpy as np

from mmfleet.api import SloSpec
from mmfleet_lab.bench.oracle import Cell
from mmfleet_lab.twin import H200_QWEN25VL7B, Requests, Scenario

SLO = SloSpec(target="10s")
WINDOW = 60.0
START = 60.0
RATES = (60.0, 60.0, 135.0, 210.0, 210.0, 60.0, 15.0, 90.0, 180.0, 45.0)  # req/s per minute; the first: warm-up


def piecewise(rates: tuple[float, ...], seed: int = 0) -> Requests:
    """Poisson arrivals at ``rates[k]`` in minute k, 500 prompt and 200 output tokens each."""
    rng = np.random.default_rng(seed)
    parts = []
    for k, rate in enumerate(rates):
        t = np.cumsum(rng.exponential(1.0 / rate, size=int(rate * WINDOW * 1.5)))
        parts.append(k * WINDOW + t[t < WINDOW])
    arrival = np.concatenate(parts)
    n = arrival.size
    return Requests(arrival, np.full(n, 500), np.full(n, 200), np.zeros(n))


def make_cell(max_replicas: int = 16, rates: tuple[float, ...] = RATES) -> Cell:
    scn = Scenario("synthetic", piecewise(rates), WINDOW * len(rates))
    return Cell(scn, H200_QWEN25VL7B, SLO, initial=2, max_replicas=max_replicas, start=START, window=WINDOW,
                label="synthetic")  # fmt: skip
