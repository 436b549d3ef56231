"""The encode tier's run against the aggregated server: TTFT and e2e per offered rate, as a markdown table.

Reads mm_loadgen.py's request CSVs (``part == "load"`` rows): the encode-tier run's, the same-machine aggregated
server's (if it ran), and the calibration's (``requests_default.csv`` for 448x448 JPEGs, ``requests_mm_cache_off.csv``
for the 1280x720 phase, as the calibration ran them). mm_loadgen draws a phase's requests from its rate and image size
alone, so a shorter phase sends a prefix of the calibration's same phase: the calibration's rows are cut to the send
times the run covered. TTFT is the first streamed chunk, e2e the last, both from the send (the client's clock).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

Key = tuple[float, str]  # offered rate, image size


def load(path: Path) -> dict[Key, list[dict[str, str]]]:
    phases: dict[Key, list[dict[str, str]]] = {}
    with path.open() as handle:
        for row in csv.DictReader(handle):
            if row["part"] == "load":
                phases.setdefault((float(row["rate"]), f"{row['img_w']}x{row['img_h']}"), []).append(row)
    return phases


def stats(rows: list[dict[str, str]]) -> dict[str, float]:
    ok = [r for r in rows if not r["err"]]
    out = {"n": float(len(rows)), "errors": float(len(rows) - len(ok))}
    if ok:
        ttft = np.array([float(r["t_first"]) - float(r["t_send"]) for r in ok]) * 1e3
        e2e = np.array([float(r["t_end"]) - float(r["t_send"]) for r in ok])
        out |= {
            "ttft50": float(np.percentile(ttft, 50)),
            "ttft90": float(np.percentile(ttft, 90)),
            "e2e50": float(np.percentile(e2e, 50)),
            "e2e90": float(np.percentile(e2e, 90)),
        }
    return out


def cell(s: dict[str, float]) -> str:
    if "ttft50" not in s:
        return f"{s['n']:.0f} ({s['errors']:.0f} err) | - | -"
    errors = f", {s['errors']:.0f} err" if s["errors"] else ""
    return f"{s['n']:.0f}{errors} | {s['ttft50']:.0f} / {s['ttft90']:.0f} | {s['e2e50']:.2f} / {s['e2e90']:.2f}"


def ratio(a: dict[str, float], b: dict[str, float]) -> str:
    if "ttft50" not in a or "ttft50" not in b:
        return "- | -"
    return (
        f"{a['ttft50'] / b['ttft50']:.2f} / {a['ttft90'] / b['ttft90']:.2f} | "
        f"{a['e2e50'] / b['e2e50']:.2f} / {a['e2e90'] / b['e2e90']:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epd", type=Path, required=True)
    parser.add_argument("--agg", type=Path, help="the same machine's aggregated server, if it ran")
    parser.add_argument("--calibration", type=Path, help="shared/calibration/real-vllm-h200-mm, for its columns")
    args = parser.parse_args()
    epd = load(args.epd)
    agg = load(args.agg) if args.agg and args.agg.exists() else {}
    calibration: dict[Key, list[dict[str, str]]] = {}
    if args.calibration is not None:
        calibration = load(args.calibration / "requests_default.csv")
        cache_off = load(args.calibration / "requests_mm_cache_off.csv")
        calibration |= {k: v for k, v in cache_off.items() if k[1] != "448x448"}
    head = "| offered | image | E/PD: n | TTFT p50 / p90, ms | e2e p50 / p90, s |"
    rule = "|---|---|---:|---|---|"
    if agg:
        head += " aggregated (same machine): n | TTFT p50 / p90 | e2e p50 / p90 | E/PD ÷ aggregated: TTFT | e2e |"
        rule += "---:|---|---|---|---|"
    if calibration:
        head += " calibration (H200, 2026-12-02): n | TTFT p50 / p90 | e2e p50 / p90 | E/PD ÷ calibration: TTFT | e2e |"
        rule += "---:|---|---|---|---|"
    print(head)
    print(rule)
    for key in sorted(epd, key=lambda k: (k[1] != "448x448", k[0])):
        rows = epd[key]
        covered = max(float(r["t_plan"]) for r in rows)
        ours = stats(rows)
        line = f"| {key[0]:g}/s | {key[1]} | {cell(ours)} |"
        if agg:
            theirs = stats(agg.get(key, []))
            line += f" {cell(theirs)} | {ratio(ours, theirs)} |"
        if calibration:
            cal = stats([r for r in calibration.get(key, []) if float(r["t_plan"]) <= covered])
            line += f" {cell(cal)} | {ratio(ours, cal)} |"
        print(line)


if __name__ == "__main__":
    main()
