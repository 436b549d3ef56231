"""The end-to-end tests' cluster and load."""

from __future__ import annotations

import os
import sys

CLUSTER = f"mmfleet-e2e-{os.getpid()}"
COLD_START = "10s"  # kwok's pod-ready delay: what a new pod costs before it serves
BASE_RATE = 4.0  # req/s: one H100 replica holds P90 under 3 s up to about 10 req/s (capacity_at_slo)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
