"""Tables for the terminal and for docs/benchmarks.md, where each benchmark owns one section."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

HEADER = (
    "# Benchmarks\n\nEvery figure here was measured by the command above its table; rerun it to refresh the section.\n"
)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |" for row in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def write_section(path: Path, key: str, title: str, body: str, level: int = 2) -> None:
    """Replace (or append) the section marked with ``key``; other benchmarks' sections stay. ``level``: the title's
    heading level, 3 for a part of a page's section (docs/reliability.md)."""
    begin, end = f"<!-- bench:{key} -->", f"<!-- /bench:{key} -->"
    section = f"{begin}\n{'#' * level} {title}\n\n{body.rstrip()}\n{end}"
    text = path.read_text() if path.exists() else HEADER
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: section, text) if pattern.search(text) else f"{text.rstrip()}\n\n{section}\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
