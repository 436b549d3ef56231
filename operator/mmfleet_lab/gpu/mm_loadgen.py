# mypy: ignore-errors
# ruff: noqa
# Copied from shared/calibration/real-vllm-h200-mm/mm_loadgen.py (the calibration run of 2026-12-02, the load generator
# of requests_default.csv and requests_mm_cache_off.csv), so that the encode-tier run sends the very same requests.
# One change: the served model name comes from MM_LOADGEN_MODEL (default "qwen", as there; mmfleet serves "qwen-vl").
# Added for the PreprocessingBound run (results_preprocessing/): a phase may set its images per request, output tokens
# and words of text (rate:seconds:WxH:fmt:n_img:n_out:words); --prebuild builds every phase's bodies up front in worker
# processes (each request's images drawn from its own seed), --wait-health waits for the server after that, --warm
# sends a few sequential requests of each phase's kind first, --scrape-start scrapes /metrics before the first phase,
# and --phases-log writes each phase's wall-clock window. Without these the requests are the calibration's, as before.

"""Multimodal load against a vLLM /v1/chat/completions endpoint (images as base64 data URLs, streaming).

Two parts, both writing one CSV row per request:
- ``batch1``: one request at a time; 0, 1, 2, 4 images of 448x448 and of 1280x720 (JPEG), plus PNG and
  "the same image again" variants; every request has its own random text (no prefix-cache hit past the
  system prompt) and, except the "same" variants, its own freshly drawn images.
- load phases: open-loop Poisson arrivals at the given rates, each request one image (size and format
  per phase) + about 200 text tokens in, exactly ``--n-out`` tokens out (``ignore_eos``).

Columns: part, phase, rate, idx, kind, img_w, img_h, fmt, n_img, img_bytes (all images, before base64),
t_plan, t_send, t_first (first streamed chunk: vLLM sends the role chunk when the first token is out),
t_first_content, t_end (seconds from the phase start, perf_counter), prompt_tokens and completion_tokens
(the server's usage), n_out_req, n_chunks, err.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import csv
import io
import json
import os
import sys
import time

import aiohttp
import numpy as np
from PIL import Image

MODEL = os.environ.get("MM_LOADGEN_MODEL", "qwen")
WORDS = (
    "time year people way day man thing woman life child world school state family student group country problem "
    "hand part place case week company system program question work government number night point home water room "
    "mother area money story fact month lot right study book eye job word business issue side kind head house "
    "service friend father power hour game line end member law car city community name president team minute idea "
    "kid body information back parent face others level office door health person art war history party result "
    "change morning reason research girl guy moment air teacher force education"
).split()  # each is one Qwen2 token with its leading space
FIELDS = [
    "part",
    "phase",
    "rate",
    "idx",
    "kind",
    "img_w",
    "img_h",
    "fmt",
    "n_img",
    "img_bytes",
    "t_plan",
    "t_send",
    "t_first",
    "t_first_content",
    "t_end",
    "prompt_tokens",
    "completion_tokens",
    "n_out_req",
    "n_chunks",
    "err",
]


_POOL: dict[tuple[int, int], list[np.ndarray]] = {}


def make_image(rng: np.random.Generator, w: int, h: int, fmt: str) -> bytes:
    """A photo-like picture, different bytes on every call: one of 8 smooth random fields (coarse noise
    upsampled bicubically, plus fine noise), rolled by a random offset, with a random flat rectangle."""
    pool = _POOL.get((w, h))
    if pool is None:
        pool = []
        for _ in range(8):
            coarse = (rng.random((max(h // 40, 2), max(w // 40, 2), 3)) * 255).astype(np.uint8)
            base = np.asarray(Image.fromarray(coarse).resize((w, h), Image.BICUBIC)).astype(np.int16)
            base = base + rng.normal(0, 6, (h, w, 3)).astype(np.int16)
            pool.append(np.clip(base, 0, 255).astype(np.uint8))
        _POOL[(w, h)] = pool
    arr = np.roll(pool[int(rng.integers(len(pool)))], (int(rng.integers(h)), int(rng.integers(w))), axis=(0, 1))
    y, x = int(rng.integers(h - h // 8)), int(rng.integers(w - w // 8))
    arr[y : y + h // 8, x : x + w // 8] = rng.integers(0, 256, 3, dtype=np.uint8)
    buf = io.BytesIO()
    if fmt == "jpeg":
        Image.fromarray(arr).save(buf, format="JPEG", quality=90)
    else:
        Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def make_text(rng: np.random.Generator, n_words: int) -> str:
    return f"Request {rng.integers(1 << 40)}: " + " ".join(rng.choice(WORDS, n_words)) + ". Describe the image."


def body_for(images: list[tuple[bytes, str]], text: str, n_out: int) -> dict:
    content = [
        {"type": "image_url", "image_url": {"url": f"data:image/{fmt};base64,{base64.b64encode(b).decode()}"}}
        for b, fmt in images
    ]
    content.append({"type": "text", "text": text})
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": n_out,
        "min_tokens": n_out,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def one(session, url, body_json: bytes, t_base, rec):
    rec["t_send"] = time.perf_counter() - t_base
    n_chunks = 0
    try:
        async with session.post(url, data=body_json, headers={"Content-Type": "application/json"}) as resp:
            if resp.status != 200:
                rec["err"] = f"http{resp.status}:{(await resp.text())[:300]}"
                return
            buf = b""
            async for data in resp.content.iter_any():
                now = time.perf_counter() - t_base
                buf += data
                while b"\n\n" in buf:
                    ev, buf = buf.split(b"\n\n", 1)
                    ev = ev.strip()
                    if not ev.startswith(b"data:"):
                        continue
                    payload = ev[5:].strip()
                    if payload == b"[DONE]":
                        continue
                    try:
                        obj = json.loads(payload)
                    except Exception:
                        continue
                    if obj.get("usage"):
                        rec["prompt_tokens"] = obj["usage"].get("prompt_tokens")
                        rec["completion_tokens"] = obj["usage"].get("completion_tokens")
                    for ch in obj.get("choices") or []:
                        n_chunks += 1
                        if rec["t_first"] is None:
                            rec["t_first"] = now
                        if rec["t_first_content"] is None and (ch.get("delta") or {}).get("content"):
                            rec["t_first_content"] = now
            rec["t_end"] = time.perf_counter() - t_base
    except Exception as e:  # noqa: BLE001
        rec["err"] = f"{type(e).__name__}:{e}"[:200]
    finally:
        rec["n_chunks"] = n_chunks


def new_rec(**kw):
    rec = dict.fromkeys(FIELDS)
    rec.update(err="", **kw)
    return rec


async def sequential(session, url, writer, imgs, text, n_out, part, idx, kind, w, h, fmt):
    """One request sent alone (no phase, no rate), its row written; the row."""
    body = json.dumps(body_for(imgs, text, n_out)).encode()
    rec = new_rec(
        part=part,
        phase=-1,
        rate=0,
        idx=idx,
        kind=kind,
        img_w=w,
        img_h=h,
        fmt=fmt,
        n_img=len(imgs),
        img_bytes=sum(len(b) for b, _ in imgs),
        t_plan=0.0,
        n_out_req=n_out,
    )
    await one(session, url, body, time.perf_counter(), rec)
    writer.writerow(rec)
    return rec


async def batch1(url, writer, n_out, reps, seed):
    """One request at a time. Kinds: text only; n fresh images; PNG; the same image as the previous request."""
    rng = np.random.default_rng(seed)
    plan = []  # (kind, w, h, fmt, n_img)
    plan += [("warm", 448, 448, "jpeg", 1)] * 2 + [("warm", 1280, 720, "jpeg", 1)] * 2 + [("warm", 0, 0, "", 0)] * 2
    for w, h in ((448, 448), (1280, 720)):
        for n in (0, 1, 2, 4):
            if n == 0 and (w, h) != (448, 448):
                continue
            plan += [("fresh", w, h, "jpeg", n)] * reps
        plan += [("png", w, h, "png", 1)] * reps
        plan += [("same", w, h, "jpeg", 1)] * reps
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as session:
        same_cache = {}
        warm_errs: list[str] = []
        for i, (kind, w, h, fmt, n) in enumerate(plan):
            if kind == "same":
                key = (w, h)
                if key not in same_cache:
                    same_cache[key] = make_image(rng, w, h, "jpeg")
                imgs = [(same_cache[key], "jpeg")]
            else:
                imgs = [(make_image(rng, w, h, fmt), fmt) for _ in range(n)]
            rec = await sequential(session, url, writer, imgs, make_text(rng, 190), n_out, "batch1", i, kind, w, h, fmt)
            ttft = rec["t_first"]
            print(
                f"batch1 {kind} {w}x{h} {fmt} n={n}: ttft {ttft if ttft is None else round(ttft * 1e3, 1)} ms "
                f"e2e {rec['t_end'] and round(rec['t_end'], 3)} s prompt {rec['prompt_tokens']} "
                f"out {rec['completion_tokens']} {rec['err']}",
                flush=True,
            )
            if i == 1 and plan[0][0] == "warm" and all(r for r in warm_errs + [rec["err"]]):
                raise SystemExit("the first two requests failed: " + rec["err"])
            warm_errs.append(rec["err"])
            await asyncio.sleep(0.3)


def plan_times(rng, rate, dur):
    t, plan = 0.0, []
    while True:
        t += rng.exponential(1.0 / rate)
        if t >= dur:
            break
        plan.append(t)
    return plan


def build_one(args):
    """One request's body from its own seed (for --prebuild's worker processes): (body, image bytes)."""
    seed, i, w, h, fmt, n_img, n_out, words = args
    rng = np.random.default_rng([seed, i])
    imgs = [(make_image(rng, w, h, fmt), fmt) for _ in range(n_img)]
    return json.dumps(body_for(imgs, make_text(rng, words), n_out)).encode(), sum(len(b) for b, _ in imgs)


async def run_phase(
    url, writer, phase, rate, dur, drain, w, h, fmt, n_out, seed, n_img=1, words=190, prebuilt=None, phases_log=None
):
    rng = np.random.default_rng(seed)
    plan = plan_times(rng, rate, dur)
    t0 = time.perf_counter()
    if prebuilt is not None:
        bodies = prebuilt[: len(plan)]
    else:
        bodies = []
        for _ in plan:
            imgs = [(make_image(rng, w, h, fmt), fmt) for _ in range(n_img)]
            bodies.append(
                (json.dumps(body_for(imgs, make_text(rng, words), n_out)).encode(), sum(len(b) for b, _ in imgs))
            )
    print(
        f"phase {phase} rate {rate} dur {dur:.0f}s {w}x{h} {fmt}"
        + (f" x{n_img} out {n_out} words {words}" if (n_img, words) != (1, 190) else "")
        + f": {len(plan)} requests (bodies {'prebuilt' if prebuilt is not None else 'built in'}"
        f"{'' if prebuilt is not None else f' {time.perf_counter() - t0:.1f}s'})",
        flush=True,
    )
    epoch_start = time.time()
    conn = aiohttp.TCPConnector(limit=0)
    recs, tasks = [], []
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as session:
        t_base = time.perf_counter()
        for i, (t_plan, (body, nb)) in enumerate(zip(plan, bodies)):
            delay = t_plan - (time.perf_counter() - t_base)
            if delay > 0:
                await asyncio.sleep(delay)
            rec = new_rec(
                part="load",
                phase=phase,
                rate=rate,
                idx=i,
                kind="fresh",
                img_w=w,
                img_h=h,
                fmt=fmt,
                n_img=n_img,
                img_bytes=nb,
                t_plan=t_plan,
                n_out_req=n_out,
            )
            recs.append(rec)
            tasks.append(asyncio.create_task(one(session, url, body, t_base, rec)))
        t_last = time.perf_counter() - t_base
        done, pending = await asyncio.wait(tasks, timeout=drain) if tasks else (set(), set())
        for p in pending:
            p.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        t_fin = time.perf_counter() - t_base
    if phases_log:
        with open(phases_log, "a") as f:
            f.write(
                json.dumps(
                    {
                        "phase": phase,
                        "rate": rate,
                        "dur": dur,
                        "w": w,
                        "h": h,
                        "fmt": fmt,
                        "n_img": n_img,
                        "n_out": n_out,
                        "words": words,
                        "n": len(recs),
                        "epoch_start": epoch_start,
                        "epoch_last_send": epoch_start + t_last,
                        "epoch_end": epoch_start + t_fin,
                    }
                )
                + "\n"
            )
    for r in recs:
        if r["t_end"] is None and not r["err"]:
            r["err"] = "unfinished"
        writer.writerow(r)
    ok = [r for r in recs if not r["err"]]
    ttft = np.array([r["t_first"] - r["t_send"] for r in ok]) if ok else np.array([np.nan])
    e2e = np.array([r["t_end"] - r["t_send"] for r in ok]) if ok else np.array([np.nan])
    print(
        f"phase {phase} rate {rate}: sent {len(recs)} ok {len(ok)} last send {t_last:.1f}s end {t_fin:.1f}s "
        f"ttft p50 {np.median(ttft) * 1e3:.0f} ms p90 {np.percentile(ttft, 90) * 1e3:.0f} ms "
        f"e2e p50 {np.median(e2e):.2f} s p90 {np.percentile(e2e, 90):.2f} s",
        flush=True,
    )


async def scrape(base, path, tag):
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(base + "/metrics") as r:
                txt = await r.text()
    except Exception as e:  # noqa: BLE001
        txt = f"# scrape failed: {e}\n"
    with open(path, "a") as f:
        f.write(f"### SCRAPE {tag} {time.time():.3f}\n")
        f.write(txt)
    return txt


def parse_phase(spec, default_n_out):
    """rate:seconds[:WxH[:fmt[:n_img[:n_out[:words]]]]] -> (rate, dur, w, h, fmt, n_img, n_out, words)."""
    parts = spec.split(":")
    rate, dur = float(parts[0]), float(parts[1])
    wh = parts[2] if len(parts) > 2 and parts[2] else "448x448"
    fmt = parts[3] if len(parts) > 3 and parts[3] else "jpeg"
    n_img = int(parts[4]) if len(parts) > 4 and parts[4] else 1
    n_out = int(parts[5]) if len(parts) > 5 and parts[5] else default_n_out
    words = int(parts[6]) if len(parts) > 6 and parts[6] else 190
    iw, ih = (int(x) for x in wh.split("x"))
    return rate, dur, iw, ih, fmt, n_img, n_out, words


def phase_seed(base_seed, rate, iw, ih):
    # the seed depends on the rate and size only, so the same phase in another run sends the same requests
    return base_seed + int(rate * 100) + iw * 7 + ih


def prebuild(phases, base_seed, jobs):
    """Every phase's bodies, built in worker processes: {phase index: [(body, image bytes), ...]}."""
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing

    t0 = time.perf_counter()
    work, owner = [], []
    for k, (rate, dur, iw, ih, fmt, n_img, n_out, words) in enumerate(phases):
        seed = phase_seed(base_seed, rate, iw, ih)
        n = len(plan_times(np.random.default_rng(seed), rate, dur))
        work += [(seed, i, iw, ih, fmt, n_img, n_out, words) for i in range(n)]
        owner += [k] * n
    out: dict[int, list] = {k: [] for k in range(len(phases))}
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
        for k, built in zip(owner, pool.map(build_one, work, chunksize=16)):
            out[k].append(built)
    size = sum(len(b) for bs in out.values() for b, _ in bs)
    print(
        f"prebuilt {len(work)} bodies ({size / 1e9:.2f} GB) in {time.perf_counter() - t0:.1f}s with {jobs} workers",
        flush=True,
    )
    return out


async def wait_health(base, seconds):
    until = time.time() + seconds
    async with aiohttp.ClientSession() as s:
        while time.time() < until:
            try:
                async with s.get(base + "/health", timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status == 200:
                        print(f"server healthy at {time.strftime('%H:%M:%S', time.gmtime())}", flush=True)
                        return True
            except Exception:  # noqa: BLE001
                pass
            await asyncio.sleep(1.0)
    print("server not healthy in time", flush=True)
    return False


async def warm(url, writer, phases, n, seed):
    """n sequential requests of each distinct phase kind, before the load (rows with part "warm")."""
    rng = np.random.default_rng(seed + 1)
    kinds = sorted({(iw, ih, fmt, n_img, n_out, words) for _, _, iw, ih, fmt, n_img, n_out, words in phases})
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        for k, (iw, ih, fmt, n_img, n_out, words) in enumerate(kinds):
            for i in range(n):
                imgs = [(make_image(rng, iw, ih, fmt), fmt) for _ in range(n_img)]
                text = make_text(rng, words)
                rec = await sequential(session, url, writer, imgs, text, n_out, "warm", k * n + i, "fresh", iw, ih, fmt)
                print(
                    f"warm {iw}x{ih} {fmt} x{n_img} out {n_out}: ttft {rec['t_first']} e2e {rec['t_end']} "
                    f"prompt {rec['prompt_tokens']} out {rec['completion_tokens']} {rec['err'][:300]}",
                    flush=True,
                )


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="http://127.0.0.1:8000")
    ap.add_argument(
        "--phases", default="2:60,5:45,10:45,20:45", help="rate:seconds[:WxH[:fmt[:n_img[:n_out[:words]]]]],..."
    )
    ap.add_argument("--drain", type=float, default=30.0)
    ap.add_argument("--n-out", type=int, default=150)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=20261202)
    ap.add_argument("--deadline", type=float, default=0.0, help="epoch seconds; later phases are skipped or shrunk")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--tag", default="run")
    ap.add_argument("--skip-batch1", action="store_true")
    ap.add_argument("--prebuild", type=int, default=0, help="build all bodies first in this many worker processes")
    ap.add_argument("--wait-health", type=float, default=0.0, help="seconds to wait for /health before the load")
    ap.add_argument("--warm", type=int, default=0, help="sequential requests of each phase kind before the load")
    ap.add_argument("--scrape-start", action="store_true", help="scrape /metrics before the first phase")
    ap.add_argument("--phases-log", default="", help="a JSON line per phase: its wall-clock window")
    a = ap.parse_args()
    url = a.base + "/v1/chat/completions"
    mpath = os.path.join(a.out, f"metrics_{a.tag}.txt")
    phases = [parse_phase(spec, a.n_out) for spec in a.phases.split(",")]
    built = prebuild(phases, a.seed, a.prebuild) if a.prebuild else None
    if a.wait_health and not await wait_health(a.base, a.wait_health):
        return 1
    with open(os.path.join(a.out, f"requests_{a.tag}.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        if not a.skip_batch1:
            await batch1(url, w, a.n_out, a.reps, a.seed)
            f.flush()
            await scrape(a.base, mpath, "after-batch1")
        if a.warm:
            await warm(url, w, phases, a.warm, a.seed)
            f.flush()
        if a.scrape_start:
            await scrape(a.base, mpath, "start")
        for k, (rate, dur, iw, ih, fmt, n_img, n_out, words) in enumerate(phases):
            drain = a.drain
            if a.deadline:
                left = a.deadline - time.time()
                if left < dur + drain + 10:
                    dur = min(dur, left - drain - 15)
                if dur < 15:
                    print(f"phase {k} rate {rate}: skipped, {left:.0f}s left", flush=True)
                    continue
            seed = phase_seed(a.seed, rate, iw, ih)
            await run_phase(
                url,
                w,
                k,
                rate,
                dur,
                drain,
                iw,
                ih,
                fmt,
                n_out,
                seed,
                n_img=n_img,
                words=words,
                prebuilt=None if built is None else built.pop(k),
                phases_log=a.phases_log or None,
            )
            f.flush()
            await asyncio.sleep(2.0)
            await scrape(a.base, mpath, f"after-phase{k}-rate{rate}")


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
