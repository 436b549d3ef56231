"""Which scenario is for what: train (tune on it), validation (check the tuning), test (report, never tune).

The split was fixed before any baseline was swept (docs/benchmarks.md, the autoscale section): a scenario's
role is its base trace's, so a spike on a test trace is a test scenario. Tuning goes through
``tuning_scenarios``, which refuses a test scenario; a user's own ``--trace`` is a test trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from mmfleet_lab.twin.scenarios import BASES, NAMES, ON, SPIKES, parse

Role = Literal["train", "validation", "test"]
ROLES: dict[str, Role] = {
    "azure-conv": "train",
    "servegen-mm": "validation",
    "azure-code": "test",
    "servegen-language": "test",
    "servegen-reason": "test",
    "gentd-diffusion": "test",
    "trace": "test",
}
# What the sweep runs (a steady hour and a x4 step on the training trace), and what a tuned policy is checked on.
TRAIN: tuple[str, ...] = ("azure-conv", "spike-x4")
VALIDATION: tuple[str, ...] = ("servegen-mm", f"spike-x4{ON}servegen-mm")
# One cell per test trace, and the spikes on the held-out azure-code.
TEST: tuple[str, ...] = (
    *(b for b in BASES if ROLES[b] == "test"),
    *(f"{s}{ON}azure-code" for s in SPIKES),
)


class HeldOutError(ValueError):
    """A test scenario was handed to code that tunes."""


def role(name: str) -> Role:
    """The role of a scenario: its base trace's."""
    if name not in NAMES:
        raise ValueError(f"unknown scenario {name!r}")
    return ROLES[parse(name)[0]]


def tuning_scenarios(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` if none is a test scenario; raises ``HeldOutError`` otherwise."""
    held_out = [n for n in names if role(n) == "test"]
    if held_out:
        raise HeldOutError(f"{', '.join(held_out)}: test scenarios, held out from tuning (bench/traces.py)")
    return tuple(names)
