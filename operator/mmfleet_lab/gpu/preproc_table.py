"""Per phase of the PreprocessingBound run (preproc_run.sh): the three legs of the operator's PreprocessingBound
condition (operator/mmfleet/autoscaler/cycle.py ``_preprocessing_row``) as the server's own series give them, and what
the rule says, as a markdown table.

- mean TTFT, queue and prefill: the change of vllm:time_to_first_token_seconds, vllm:request_queue_time_seconds and
  vllm:request_prefill_time_seconds (sum / count) between the full /metrics scrape before the phase and the one after
  it (mm_loadgen --scrape-start and its scrape after each phase's drain), so every request of the phase counts once;
  outside = TTFT - queue - prefill, its share of the TTFT;
- waiting at most: vllm:num_requests_waiting over the 2 s samples (preproc_sampler.py) from the phase's first send to
  its end (drain included);
- API server CPU: the rate of process_cpu_seconds_total on the server's /metrics (the API server process) between the
  first sample after the phase's first send and the last one before its last send (the operator's rate, over the send
  window rather than 1m: phases are shorter than that); also over the whole scrape interval;
- the client's TTFT p50 / p90 (send to first streamed chunk), as the SLO would see it.

The rule, in the operator's order: False if the engines queued (waiting at most >= 1); else False if the share < 0.5;
else False if the API CPU < 0.9 cores; else True, given that the SLO is missed (the rule's first leg: the target is the
fleet's own, so the table gives the client's TTFT to read it against).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import re
from pathlib import Path

SHARE, CPU = 0.5, 0.9
LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def blocks(path: Path, marker: str) -> list[tuple[str, float, dict[str, float], list[str]]]:
    """(tag, epoch, {series name: value summed over its label sets}, other lines) per '### <marker> ...' block."""
    out: list[tuple[str, float, dict[str, float], list[str]]] = []
    for line in path.read_text().splitlines():
        if line.startswith(f"### {marker} "):
            parts = line.split()
            tag, epoch = (parts[2], float(parts[3])) if len(parts) > 3 else ("", float(parts[2]))
            out.append((tag, epoch, {}, []))
            continue
        if not out:
            continue
        m = LINE.match(line)
        if m and not line.startswith(("proc ", "gpu ")):
            name, labels, value = m.group(1), m.group(2) or "", m.group(3)
            if name == "vllm:num_requests_waiting_by_reason" or 'reason="' in labels:
                continue
            with contextlib.suppress(ValueError):
                out[-1][2][name] = out[-1][2].get(name, 0.0) + float(value)
        elif line.startswith(("proc ", "gpu ")):
            out[-1][3].append(line)
    return out


def mean_of(before: dict[str, float], after: dict[str, float], base: str) -> float | None:
    n = after.get(f"{base}_count", 0.0) - before.get(f"{base}_count", 0.0)
    return None if n <= 0 else (after.get(f"{base}_sum", 0.0) - before.get(f"{base}_sum", 0.0)) / n


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    if not v:
        return float("nan")
    k = (len(v) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def proc_cpu(extra: list[str]) -> dict[str, float]:
    """{'api': root's CPU seconds, 'engine': its children's} from the sampler's proc lines."""
    api = sum(float(ln.split()[3]) for ln in extra if ln.startswith("proc ") and ln.endswith(" root"))
    kids = sum(float(ln.split()[3]) for ln in extra if ln.startswith("proc ") and not ln.endswith(" root"))
    return {"api": api, "children": kids}


def gpu(extra: list[str]) -> float | None:
    for ln in extra:
        if ln.startswith("gpu ") and len(ln.split()) >= 2:
            try:
                return float(ln.split()[1])
            except ValueError:
                return None
    return None


def fmt(v: float | None, scale: float = 1e3, digits: int = 0) -> str:
    return "–" if v is None else f"{v * scale:.{digits}f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True, help="the run's results: requests_pre.csv, metrics_pre.txt, ...")
    ap.add_argument("--tag", default="pre")
    a = ap.parse_args()
    d = Path(a.dir)
    phases = [json.loads(ln) for ln in (d / f"phases_{a.tag}.jsonl").read_text().splitlines() if ln.strip()]
    scrapes = blocks(d / f"metrics_{a.tag}.txt", "SCRAPE")
    samples = blocks(d / "samples_2s.txt", "SAMPLE")
    rows = [r for r in csv.DictReader((d / f"requests_{a.tag}.csv").open()) if r["part"] == "load"]
    by_tag = {tag: (epoch, m) for tag, epoch, m, _ in scrapes}
    print(
        "| phase | images | offered /s | n (ok) | done /s | client TTFT p50 / p90 ms | mean TTFT ms | queue ms | "
        "prefill ms | outside ms (share) | waiting at most | running at most | API CPU cores (send window / "
        "interval) | engine proc CPU | GPU util % | rule |"
    )
    print("|---|---|---:|---:|---:|---|---:|---:|---:|---|---:|---:|---|---:|---:|---|")
    verdicts = []
    for ph in phases:
        k = ph["phase"]
        after = by_tag.get(f"after-phase{k}-rate{ph['rate']}")
        prev = [t for t, (ep, _) in by_tag.items() if ep < ph["epoch_start"]]
        before = by_tag[max(prev, key=lambda t: by_tag[t][0])] if prev else None
        rs = [r for r in rows if int(r["phase"]) == k]
        ok = [r for r in rs if not r["err"]]
        ttft = [(float(r["t_first"]) - float(r["t_send"])) * 1e3 for r in ok]
        span = (max(float(r["t_end"]) for r in ok) - min(float(r["t_send"]) for r in ok)) if ok else 0.0
        m_ttft = m_q = m_p = cpu_int = None
        if before and after:
            m_ttft = mean_of(before[1], after[1], "vllm:time_to_first_token_seconds")
            m_q = mean_of(before[1], after[1], "vllm:request_queue_time_seconds")
            m_p = mean_of(before[1], after[1], "vllm:request_prefill_time_seconds")
            dt = after[0] - before[0]
            cpu = "process_cpu_seconds_total"
            cpu_int = (after[1].get(cpu, 0.0) - before[1].get(cpu, 0.0)) / dt
        inside = [s for s in samples if ph["epoch_start"] <= s[1] <= ph["epoch_end"]]
        waiting = max((s[2].get("vllm:num_requests_waiting", 0.0) for s in inside), default=None)
        running = max((s[2].get("vllm:num_requests_running", 0.0) for s in inside), default=None)
        send = [s for s in inside if s[1] <= ph["epoch_last_send"] and "process_cpu_seconds_total" in s[2]]
        cpu_send = eng = gpu_mean = None
        if len(send) >= 2:
            dt = send[-1][1] - send[0][1]
            cpu_send = (send[-1][2]["process_cpu_seconds_total"] - send[0][2]["process_cpu_seconds_total"]) / dt
            pa, pb = proc_cpu(send[0][3]), proc_cpu(send[-1][3])
            eng = (pb["children"] - pa["children"]) / dt if pb["children"] and pa["children"] else None
            gs = [g for g in (gpu(s[3]) for s in send) if g is not None]
            gpu_mean = sum(gs) / len(gs) if gs else None
        outside = share = None
        if m_ttft is not None and m_q is not None and m_p is not None and m_ttft > 0:
            outside = m_ttft - m_q - m_p
            share = max(0.0, outside) / m_ttft
        if waiting is None or share is None or cpu_send is None:
            verdict = "Unknown (not measured)"
        elif len(ok) < 20:
            verdict = "Unknown (< 20 finished)"
        elif waiting >= 1:
            verdict = f"False: engine queued ({waiting:g} waiting)"
        elif share < SHARE:
            verdict = f"False: prefill is most of TTFT ({share:.0%} outside)"
        elif cpu_send < CPU:
            verdict = f"False: API server has CPU to spare ({cpu_send:.2f} cores)"
        else:
            verdict = "**True** (if the SLO is missed)"
        verdicts.append((k, verdict))

        img = f"{ph['n_img']}x {ph['w']}x{ph['h']} {ph['fmt']}, out {ph['n_out']}"
        print(
            f"| {k} | {img} | {ph['rate']:g} | {len(rs)} ({len(ok)}) | {len(ok) / span if span else 0:.1f} | "
            f"{pct(ttft, 50):.0f} / {pct(ttft, 90):.0f} | {fmt(m_ttft, digits=1)} | {fmt(m_q, digits=1)} | "
            f"{fmt(m_p, digits=1)} | "
            f"{fmt(outside, digits=1)} ({'–' if share is None else f'{share:.0%}'}) | {fmt(waiting, 1)} | "
            f"{fmt(running, 1)} | "
            f"{fmt(cpu_send, 1, 2)} / {fmt(cpu_int, 1, 2)} | {fmt(eng, 1, 2)} | {fmt(gpu_mean, 1)} | {verdict} |"
        )


if __name__ == "__main__":
    main()
