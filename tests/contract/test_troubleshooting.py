"""docs/troubleshooting.md explains every condition the operator writes and every reason each can give.

The reasons are the members of the enums in ``mmfleet.api.conditions``, one per condition type, from which the
operator builds its conditions; each condition's section must list exactly its enum's reasons.
"""

from __future__ import annotations

import re

from mmfleet.api import CONDITION_TYPES, REASONS
from mmfleet.autoscaler.standby import FAILED_EVENT, WOKE_EVENT
from tests.helpers.repo import ROOT

DOC = ROOT / "docs/troubleshooting.md"
# The events' own reasons (``status.events``, ``autoscaler.cycle.Outcome.event_reason``, warm standby's); the rest
# are conditions'.
EVENT_REASONS = {"Ready", "ScaledUp", "ScaledDown", WOKE_EVENT, FAILED_EVENT}


def sections() -> dict[str, str]:
    """The first word of each ``##`` heading -> the text under it, its subsections included."""
    parts = re.split(r"^## (\w+).*$", DOC.read_text(), flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_every_condition_has_its_own_section() -> None:
    headings = re.findall(r"^## (\w+)", DOC.read_text(), re.MULTILINE)
    assert [h for h in headings if h in CONDITION_TYPES] == list(CONDITION_TYPES)


def test_each_condition_section_lists_exactly_its_reasons() -> None:
    assert tuple(REASONS) == CONDITION_TYPES
    text = sections()
    for kind, reasons in REASONS.items():
        listed = set(re.findall(r"^\| `(?:True|False|Unknown)` \| `(\w+)` \|", text[kind], re.MULTILINE))
        given = {str(reason) for reason in reasons}
        assert listed == given, f"## {kind}: not explained {given - listed}, not the operator's {listed - given}"


def test_every_event_reason_is_in_the_events_section() -> None:
    listed = set(re.findall(r"`([A-Z][A-Za-z]+)`", sections()["Events"]))
    assert not EVENT_REASONS - listed
