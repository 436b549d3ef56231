"""The fuzzer's schema draws reach the CRD's bounds (issue 23, item 2): lists beyond 3 items up to their maxItems and
one over, strings at their maxLength, so that the API server and the operator are checked to agree at the limits."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from mmfleet_lab import fuzz


def _lists(doc: Any) -> Iterator[int]:
    if isinstance(doc, dict | list):
        yield len(doc)
        for value in doc.values() if isinstance(doc, dict) else doc:
            yield from _lists(value)


def _strings(doc: Any) -> Iterator[str]:
    if isinstance(doc, str):
        yield doc
    elif isinstance(doc, dict):
        for key, value in doc.items():
            yield key
            yield from _strings(value)
    elif isinstance(doc, list):
        for value in doc:
            yield from _strings(value)


def test_schema_draws_reach_the_bounds_of_lists_maps_and_strings() -> None:
    specs = fuzz.schema_specs(200, 13)
    lengths = [n for spec in specs for n in _lists(spec)]
    strings = {len(s) for spec in specs for s in _strings(spec)}
    assert max(lengths) >= 32  # placement.tolerations' maxItems, or one over
    assert sum(n > 3 for n in lengths) >= 20
    assert max(strings) >= 253
    # Candidates at their maxLength: DNS subdomains and model names (253), the ACK role (256), label keys (317), the
    # image (512). Which of them 200 draws hit depends on hypothesis' search, so the candidates are checked directly.
    for high, pattern in ((253, None), (256, r"^\S+$"), (317, r"^[^/]+/[^/]+$"), (512, None)):
        node = {"maxLength": high, **({"pattern": pattern} if pattern else {})}
        assert high in {len(s) for s in fuzz._strings(node)}, high
