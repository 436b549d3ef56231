"""The end-to-end tests' cluster and load."""

from __future__ import annotations

import os
import sys

from mmfleet_lab import demo

CLUSTER = f"mmfleet-e2e-{os.getpid()}"
COLD_START = "10s"  # kwok's pod-ready delay: what a new pod costs before it serves
# The demo's load and SLO (mmfleet_lab.demo says why a 5 s P90 over 20 s windows)
BASE_RATE = demo.BASE_RATE
SLO = demo.DEMO_SLO


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
