"""The twin's engine: each replica advanced one vLLM engine step at a time, compiled with numba.

A plain-Python version of the same algorithm (``tests/helpers/twin_reference.py``) is the oracle it is tested
against, but costs Python time per step and per request. This engine runs that algorithm (the same
scheduling, preemption, dropping, routing at each arrival, and float operations in the same order),
in numba-compiled code over preallocated arrays:

- per request (indexed by request number): what a waiting request carries (effective prompt,
  tokens generated before a preemption, last token time, first-token and encoder flags), where it
  is (waiting, in a seat, or gone), and the links of the waiting queues and of the assigned lists;
- per replica: clock, KV used, the waiting queue as a doubly linked list through the request
  links, so a queue of any length costs nothing per step, and the requests sent to it in arrival
  order (so in deadline order), a singly linked list from which abandoned requests are taken at the
  head and finished ones dropped when they get there;
- per running seat (replica x ``max_num_seqs``): the running request and its hot fields (prompt,
  prefilled, generated, KV held, output length, last token time), the admission order as a list
  of seats, the free seats as a stack. A step reads one cache line per running request instead of
  fields scattered over all requests (which made it wait on memory), and a finished request frees
  its seat without moving the others.

The metric counters are bucketed inside the compiled code and folded into ``book`` whenever it is
read (a scrape, a new replica), exactly when the reference engine's book folds its queued observations:
so even the histograms' float ``_sum`` columns are added in the same grouping and come out
bit-identical. ``tests/unit/lab/test_twin_compiled.py`` checks outcomes and books against the reference.

With shared prefixes (``Workload.block_tokens`` > 0) each replica keeps an LRU list of the blocks in its prefix cache
and, for the endpoint picker, the picker's own approximate index of it (``_lru_touch``); both are per replica x block
arrays, as many blocks as the workload has distinct ones. The endpoint picker's flow control holds requests in
``held`` (in arrival order) and looks at the pool every ``FLOW_TICK_S`` while it holds any: those ticks are events
between arrivals, like the arrivals themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar, cast

import numba
import numpy as np

from mmfleet_lab.twin.engine import LEAST_OUTSTANDING, Outcomes, Router, Workload
from mmfleet_lab.twin.observe import E2E_BUCKETS, ITL_BUCKETS, LAYOUT, REQUEST_TOKEN_BUCKETS, TTFT_BUCKETS, MetricBook
from mmfleet_lab.twin.replica import ReplicaParams

_F = TypeVar("_F", bound=Callable[..., Any])


def _jit(f: _F) -> _F:
    """``numba.njit`` with numba's on-disk cache, typed for mypy as the function it compiles."""
    return cast(_F, numba.njit(cache=True)(f))


class _Work(NamedTuple):
    """Inputs: ``Workload`` with integer token counts, and ``T_dense`` below its last knot."""

    arrival: np.ndarray
    prompt: np.ndarray
    out: np.ndarray
    vis_ms: np.ndarray
    vis_images: np.ndarray
    vis_tokens: np.ndarray
    cpu_ms: np.ndarray
    deadline: np.ndarray
    dense_ms: np.ndarray  # ReplicaParams.dense_ms_at(n) for n < dense_tokens[-1] (np.interp, bit for bit)
    chain_start: np.ndarray  # Workload's shared prefixes
    chain: np.ndarray
    chain_chars: np.ndarray
    image_end: np.ndarray


class _Const(NamedTuple):
    """``ReplicaParams`` and the metric layout as scalars and tuples (no arrays: see ``_run``)."""

    dense_last_tokens: float  # beyond the last knot T_dense is proportional
    dense_last_ms: float
    kv_read_ms: float
    prefill_pair_ms: float
    logits_row_ms: float
    host_ms_base: float
    host_ms_per_seq: float
    vis_base_ms: float  # an encoder call's kernels, besides its images' (v0)
    launch_base_ms: float  # an encoder call's eager launch: base, per image
    launch_per_image_ms: float
    encoder_budget: int  # image tokens one step may encode
    request_overhead_s: float
    api_pass_ms: float  # the API pass per request running on the process: the grid image requests are released on
    api_procs: int  # API server processes per replica, each preprocessing one request at a time
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cap: int
    e2e_bounds: tuple[float, ...]
    ttft_bounds: tuple[float, ...]
    itl_bounds: tuple[float, ...]
    token_bounds: tuple[float, ...]  # of the per-request token histograms
    e2e_col: int
    ttft_col: int
    itl_col: int
    success_col: int
    prompt_col: int
    generation_col: int
    request_prompt_col: int
    request_generation_col: int
    placement: bool  # keep each request's replica and first admission (served_by, started)
    server_clock: bool  # the servers' latency histograms count from when a request reached its server (``sent``)
    block_tokens: int  # 0: no prefix caching
    cache_blocks: int  # blocks a replica's cache (and the picker's index of it) holds: its KV capacity in blocks
    router: int  # _LEAST, _ROUND_ROBIN or _PICKER
    prefix_weight: float
    queue_weight: float
    kv_weight: float
    window_chars: int
    block_chars: int
    queue_depth: int
    kv_saturated: float
    filter_queue_depth: int
    filter_kv: float
    flow_control: bool
    request_ttl: float


# A running seat's integer fields, side by side so that a step touches one cache line per request.
_REQ, _PROMPT, _PDONE, _GEN, _KV, _OUT = range(6)
_SEAT_FIELDS = 6
# Where a request is, besides its seat number when running.
_WAITING = -1
_GONE = -2  # finished, dropped or abandoned (or never sent)
_LEAST, _ROUND_ROBIN, _PICKER = range(3)
_ROUTERS = {"least-outstanding": _LEAST, "round-robin": _ROUND_ROBIN, "picker": _PICKER}
# The two LRU lists of a replica (lru_*[replica, list, block]): its prefix cache, the picker's index of it.
_CACHE, _INDEX = 0, 1
_ABSENT = -2  # lru_prev of a block not in the list
_HEAD, _TAIL, _COUNT = range(3)
_HELD_HEAD, _HELD_TAIL, _REJECTED = range(3)  # _REJECTED: held requests the picker answered 503 (TTL expired)
# Flow control dispatches on a 1 ms ticker (flowcontrol/controller/internal/processor.go:178-180) from the servers'
# metrics, which the picker refreshes every 50 ms (--refresh-metrics-interval, pkg/epp/server/options.go:153):
# the twin looks every 50 ms, and dispatches all it holds when the pool is not saturated.
FLOW_TICK_S = 0.05


class _State(NamedTuple):
    """Everything that changes (see the module docstring), and scratch space for one step."""

    # per request
    prompt: np.ndarray  # tokens to compute before decoding (+ generated ones after a preemption)
    gen: np.ndarray  # tokens generated, kept while preempted
    last_tok: np.ndarray
    first: np.ndarray
    vision_done: np.ndarray
    avail: np.ndarray  # when the engine may schedule it: preprocessed, + request overhead (+ the API pass with images)
    reach: np.ndarray  # when it reaches the replicas: its arrival, or when the encode tier delivered its embeddings
    encoded: np.ndarray  # its embeddings come from the encode tier: no encoder call here
    next: np.ndarray  # waiting-queue links (-1: none)
    prev: np.ndarray
    where: np.ndarray  # _WAITING, _GONE or the running seat
    anext: np.ndarray  # assigned-list link (-1: none)
    # Only with _Const.placement (else one unused element each, so a benchmark's millions of requests cost nothing):
    served_by: np.ndarray  # the replica a request was routed to (-1: none), for its trace (twin.serve)
    started: np.ndarray  # when a replica first admitted it (-1: not yet): its queue ends, its encoder starts
    sent: np.ndarray  # only with _Const.server_clock: when the request was sent to its replica
    ttft: np.ndarray  # the Outcomes arrays, written in place
    e2e: np.ndarray
    itl: np.ndarray
    cached: np.ndarray
    # per replica
    clock: np.ndarray
    kv_used: np.ndarray
    cpu_free: np.ndarray  # replicas x api_procs: when each API process is done with what it was given
    cpu_turn: np.ndarray  # the API process the next request goes to (in turn)
    pass_end: np.ndarray  # replicas x api_procs: the latest point of each API process's pass grid
    n_run: np.ndarray
    head: np.ndarray
    tail: np.ndarray
    n_wait: np.ndarray
    ahead: np.ndarray  # assigned list: oldest request sent to the replica not yet taken off it
    atail: np.ndarray
    counters: np.ndarray  # replicas x LAYOUT.width, accrued since the book last read them
    # per running seat: replicas x max_num_seqs
    order: np.ndarray  # the running requests' seats in admission order (first n_run)
    free: np.ndarray  # free seats (first max_num_seqs - n_run)
    seat: np.ndarray  # replicas x max_num_seqs x (_REQ, _PROMPT, _PDONE, _GEN, _KV, _OUT)
    seat_last: np.ndarray  # last token time
    # one step's schedule (seats)
    decodes: np.ndarray
    chunks: np.ndarray
    chunk_tokens: np.ndarray
    done: np.ndarray
    # shared prefixes: replicas x (_CACHE, _INDEX) x blocks (doubly linked LRU lists), and each list's ends
    lru_prev: np.ndarray
    lru_next: np.ndarray
    lru_end: np.ndarray  # replicas x 2 x (_HEAD, _TAIL, _COUNT)
    turn: np.ndarray  # [round-robin position, the picker's tie-break random state]
    held: np.ndarray  # flow control: requests held in the picker, in arrival order (from flow[_HELD_HEAD])
    flow: np.ndarray  # [_HELD_HEAD, _HELD_TAIL, _REJECTED]
    next_tick: np.ndarray  # [when flow control next looks at the pool while requests are held]


# ----------------------------------------------------------------------------- compiled code
@_jit
def _bucket(bounds: tuple[float, ...], v: float) -> int:
    """The histogram bucket of ``v`` (``le`` semantics, as ``np.searchsorted(..., side="left")``)."""
    b = 0
    while b < len(bounds) and bounds[b] < v:
        b += 1
    return b


@_jit
def _lru_touch(prev: np.ndarray, nxt: np.ndarray, end: np.ndarray, r: int, lst: int, b: int, cap: int) -> None:
    """Block ``b`` becomes the most recent of list ``lst`` of replica ``r`` (added if absent); the least recent
    go while the list holds more than ``cap``. Called per admission and per finished prefill, not per decode."""
    if prev[r, lst, b] != _ABSENT:
        p = prev[r, lst, b]
        n = nxt[r, lst, b]
        if p >= 0:
            nxt[r, lst, p] = n
        else:
            end[r, lst, _HEAD] = n
        if n >= 0:
            prev[r, lst, n] = p
        else:
            end[r, lst, _TAIL] = p
        end[r, lst, _COUNT] -= 1
    t = end[r, lst, _TAIL]
    prev[r, lst, b] = t
    nxt[r, lst, b] = -1
    if t >= 0:
        nxt[r, lst, t] = b
    else:
        end[r, lst, _HEAD] = b
    end[r, lst, _TAIL] = b
    end[r, lst, _COUNT] += 1
    while end[r, lst, _COUNT] > cap:
        h = end[r, lst, _HEAD]
        n = nxt[r, lst, h]
        end[r, lst, _HEAD] = n
        if n >= 0:
            prev[r, lst, n] = -1
        else:
            end[r, lst, _TAIL] = -1
        prev[r, lst, h] = _ABSENT
        end[r, lst, _COUNT] -= 1


@_jit
def _matched(prev: np.ndarray, r: int, lst: int, chain: np.ndarray, s0: int, s1: int) -> int:
    """The leading blocks of ``chain[s0:s1]`` in list ``lst`` of replica ``r``."""
    m = 0
    while s0 + m < s1 and prev[r, lst, chain[s0 + m]] != _ABSENT:
        m += 1
    return m


@_jit
def _window(chain_chars: np.ndarray, s0: int, s1: int, window_chars: int) -> int:
    """How many leading blocks of a chain the picker hashes: those starting inside its window."""
    m = 0
    seen = 0
    while s0 + m < s1 and seen < window_chars:
        seen += chain_chars[s0 + m]
        m += 1
    return m


@_jit
def _hashed(chain_chars: np.ndarray, s0: int, m: int, window_chars: int, block_chars: int) -> int:
    """The picker's blocks in the first ``m`` blocks of a chain, cut at its window (a partial block is not hashed)."""
    seen = 0
    for j in range(m):
        seen += chain_chars[s0 + j]
    return min(seen, window_chars) // block_chars


@_jit
def _pick(s: _State, w: _Work, c: _Const, i: int, eligible: np.ndarray, cand: np.ndarray, score: np.ndarray) -> int:
    """The endpoint picker's choice for request ``i`` (Gateway API Inference Extension v1.5.0; paths under its
    pkg/epp/, in ``framework/plugins/`` unless a path says otherwise).

    - Filter, ``utilization-detector`` (flowcontrol/saturationdetector/utilization/detector.go:139-168), only where
      the scheduling profile lists one (scheduling/scheduler_profile.go:138 runs the profile's filters; the picker's
      default profile does not, pkg/epp/config/loader/defaults.go:46-103; mmfleet's lists one for stale metrics only):
      replicas with ``filter_queue_depth`` or more waiting requests, or KV use at ``filter_kv`` or more, are dropped;
      if that drops all, all stay.
    - ``prefix-cache-scorer`` (scheduling/scorer/prefix/plugin.go:108-111): blocks matched in the picker's index of
      the replica / blocks hashed. The index hashes the messages' JSON in ``block_chars`` blocks up to
      ``window_chars`` (requestcontrol/dataproducer/approximateprefix/hashing.go:47-87); the twin knows sharing only
      at the trace's block grain, so a replica matches the leading trace blocks its index holds, counted in the
      picker's blocks. The picked replica's index records the hashed blocks (approximateprefix/plugin.go:167-180),
      LRU, as many as the replica's KV blocks (autoTune).
    - ``queue-scorer`` (scheduling/scorer/queuedepth/queue.go:78-107): (max - waiting) / (max - min) over the
      candidates, 1 if all equal.
    - ``kv-cache-utilization-scorer`` (scheduling/scorer/kvcacheutilization/kvcache_utilization.go:76-82): 1 - KV
      use.
    - The weighted sum (scheduling/scheduler_profile.go:167), and ``max-score-picker``
      (scheduling/picker/max_score_picker.go:85-95): the highest, ties broken at random (a seeded LCG here, so the
      reference draws the same).
    The picker reads the servers' metrics every 50 ms; the twin gives it the exact counts.
    """
    capf = float(max(c.kv_cap, 1))
    n_c = 0
    for q in range(eligible.size):
        e = eligible[q]
        if c.filter_queue_depth == 0 or (
            s.n_wait[e] < c.filter_queue_depth and min(float(s.kv_used[e]) / capf, 1.0) < c.filter_kv
        ):
            cand[n_c] = e
            n_c += 1
    if n_c == 0:
        for q in range(eligible.size):
            cand[q] = eligible[q]
        n_c = eligible.size
    lo = s.n_wait[cand[0]]
    hi = lo
    for q in range(1, n_c):
        lo = min(lo, s.n_wait[cand[q]])
        hi = max(hi, s.n_wait[cand[q]])
    s0, s1 = w.chain_start[i], w.chain_start[i + 1]
    m_win = _window(w.chain_chars, s0, s1, c.window_chars)
    total = _hashed(w.chain_chars, s0, m_win, c.window_chars, c.block_chars)
    best = -np.inf
    for q in range(n_c):
        e = cand[q]
        prefix = 0.0
        if total > 0:
            m = _matched(s.lru_prev, e, _INDEX, w.chain, s0, s0 + m_win)
            prefix = _hashed(w.chain_chars, s0, m, c.window_chars, c.block_chars) / total
        queue = 1.0 if hi == lo else (hi - s.n_wait[e]) / (hi - lo)
        kv = 1.0 - min(float(s.kv_used[e]) / capf, 1.0)
        score[q] = c.prefix_weight * prefix + c.queue_weight * queue + c.kv_weight * kv
        best = max(best, score[q])
    ties = 0
    for q in range(n_c):
        if score[q] == best:
            cand[ties] = cand[q]
            ties += 1
    s.turn[1] = (s.turn[1] * 1103515245 + 12345) % 2147483648
    chosen: int = cand[s.turn[1] % ties]
    for j in range(m_win):
        _lru_touch(s.lru_prev, s.lru_next, s.lru_end, chosen, _INDEX, w.chain[s0 + j], c.cache_blocks)
    return chosen


@_jit
def _run(
    s: _State, w: _Work, c: _Const, n_rep: int, t0: float, t1: float, idx: np.ndarray, eligible: np.ndarray
) -> None:
    """The reference's ``FineEngine.run``: before each arrival every replica is advanced to it
    (``ReplicaEngine.advance``, ``step_once``, ``_preempt``), then it goes to the eligible replica the router
    picks (``submit``); at the end every replica is advanced to ``t1``. With shared prefixes, a request admitted
    to a replica starts with the leading blocks its cache holds computed (all but its last token at most), and
    without its encoder call when they cover its images; a finished prefill puts its full blocks in the cache.

    One function on purpose: numba reference-counts each array handed to a helper, with atomic
    operations that cost more than a decode's bookkeeping; helpers here take scalars and tuples only.
    """
    arrival, avail, w_prompt, out, vis_ms, dense_ms = w.arrival, s.avail, w.prompt, w.out, w.vis_ms, w.dense_ms
    vis_images, vis_tokens = w.vis_images, w.vis_tokens
    deadline = w.deadline
    chain_start, chain, image_end = w.chain_start, w.chain, w.image_end
    lru_prev, lru_next, lru_end = s.lru_prev, s.lru_next, s.lru_end
    bt = c.block_tokens
    cand = np.empty(eligible.size, dtype=np.int64)
    score = np.empty(eligible.size)
    prompt, gen, last_tok, first, vision_done = s.prompt, s.gen, s.last_tok, s.first, s.vision_done
    nxt, prv, ttft_of, e2e_of, itl_of = s.next, s.prev, s.ttft, s.e2e, s.itl
    where, anext, ahead, atail = s.where, s.anext, s.ahead, s.atail
    started = s.started
    clock, kv_used, n_run, head, tail, n_wait = s.clock, s.kv_used, s.n_run, s.head, s.tail, s.n_wait
    counters, order, free = s.counters, s.order, s.free
    seat, seat_last = s.seat, s.seat_last
    decodes, chunks, chunk_tokens, done = s.decodes, s.chunks, s.chunk_tokens, s.done
    cap = c.kv_cap
    seats = c.max_num_seqs
    n_itl = len(c.itl_bounds)
    n_ttft = len(c.ttft_bounds)
    n_e2e = len(c.e2e_bounds)
    n_tb = len(c.token_bounds)
    # Only replicas with requests are advanced before each arrival: advancing an empty one just sets
    # its clock to the arrival time, which is done when a request comes to it (and at t1 for all).
    active = np.empty(n_rep, dtype=np.int64)
    n_active = 0
    for r in range(n_rep):
        if n_run[r] + n_wait[r] > 0:
            active[n_active] = r
            n_active += 1
    a = 0
    while True:
        # the next event: an arrival, a flow-control tick while requests are held, or t1
        until = max(s.reach[idx[a]], t0) if a < idx.size else t1
        tick = eligible.size > 0 and s.flow[_HELD_HEAD] < s.flow[_HELD_TAIL] and s.next_tick[0] < until
        if tick:
            until = s.next_tick[0]
        final = not tick and a == idx.size
        if final:
            n_active = n_rep
            for r in range(n_rep):
                active[r] = r
        q = 0
        while q < n_active:
            r = active[q]
            while clock[r] < until:
                # --- _abandon: requests past their deadline leave the queue or their seat
                while ahead[r] >= 0:
                    v = ahead[r]
                    if where[v] != _GONE and deadline[v] > clock[r]:
                        break
                    ahead[r] = anext[v]
                    if ahead[r] < 0:
                        atail[r] = -1
                    if where[v] == _WAITING:
                        h = nxt[v]
                        g = prv[v]
                        if g >= 0:
                            nxt[g] = h
                        else:
                            head[r] = h
                        if h >= 0:
                            prv[h] = g
                        else:
                            tail[r] = g
                        n_wait[r] -= 1
                    elif where[v] >= 0:
                        gone = np.uintp(where[v])  # its seat, typed as the seat lists are
                        kv_used[r] -= seat[r, gone, _KV]
                        n = n_run[r]
                        free[r, seats - n] = gone
                        j = 0
                        while order[r, j] != gone:
                            j += 1
                        while j < n - 1:
                            order[r, j] = order[r, j + 1]
                            j += 1
                        n_run[r] = n - 1
                    where[v] = _GONE
                if n_run[r] == 0 and n_wait[r] == 0:  # nothing to step or wait for
                    clock[r] = until
                    break
                # --- _preempt: while decodes cannot all get a KV slot, the newest running request
                # goes back to the head of the queue, to be recomputed
                n = n_run[r]
                if kv_used[r] + n > cap:
                    need = 0
                    for j in range(n):
                        k = order[r, j]
                        if seat[r, k, _PDONE] >= seat[r, k, _PROMPT]:
                            need += 1
                    while n > 0 and kv_used[r] + need > cap:
                        n -= 1
                        k = order[r, n]
                        free[r, seats - n - 1] = k
                        v = seat[r, k, _REQ]
                        where[v] = _WAITING
                        if seat[r, k, _PDONE] >= seat[r, k, _PROMPT]:
                            need -= 1
                        kv_used[r] -= seat[r, k, _KV]
                        prompt[v] = w_prompt[v] + seat[r, k, _GEN] if first[v] else seat[r, k, _PROMPT]
                        gen[v] = seat[r, k, _GEN]
                        last_tok[v] = seat_last[r, k]
                        h = head[r]
                        prv[v] = -1
                        nxt[v] = h
                        if h >= 0:
                            prv[h] = v
                        else:
                            tail[r] = v
                        head[r] = v
                        n_wait[r] += 1
                    n_run[r] = n
                # --- step_once: running requests in admission order take from the token budget
                budget = c.max_num_batched_tokens
                enc_budget = c.encoder_budget
                n_dec = 0
                n_chunk = 0
                ctx = 0  # sum over decodes of (context + 1)
                for j in range(n_run[r]):
                    if budget <= 0:
                        break
                    k = order[r, j]
                    if seat[r, k, _PDONE] >= seat[r, k, _PROMPT]:
                        decodes[n_dec] = k
                        n_dec += 1
                        ctx += seat[r, k, _KV] + 1
                        budget -= 1
                    else:
                        tc = min(seat[r, k, _PROMPT] - seat[r, k, _PDONE], budget)
                        chunks[n_chunk] = k
                        chunk_tokens[n_chunk] = tc
                        n_chunk += 1
                        budget -= tc
                # then waiting requests are admitted FCFS while seats, budget and KV allow
                while n_wait[r] > 0 and budget > 0 and n_run[r] < c.max_num_seqs:
                    i = head[r]
                    if avail[i] > clock[r]:
                        break
                    hit = 0
                    m = 0
                    if bt > 0:
                        m = _matched(lru_prev, r, _CACHE, chain, chain_start[i], chain_start[i + 1])
                        hit = min(m * bt, prompt[i] - 1)
                    tc = min(prompt[i] - hit, budget)
                    fits = kv_used[r] + hit + tc <= cap
                    if not fits and n_run[r] > 0:
                        break
                    # its images are encoded in this step, all of them, within the step's encoder budget (vLLM's
                    # scheduler stops short of an image it cannot encode; the twin waits for the next step)
                    if not vision_done[i] and hit < image_end[i]:
                        if vis_tokens[i] > enc_budget and enc_budget < c.encoder_budget:
                            break
                        enc_budget -= vis_tokens[i]
                    h = nxt[i]
                    head[r] = h
                    if h >= 0:
                        prv[h] = -1
                    else:
                        tail[r] = -1
                    n_wait[r] -= 1
                    if not fits:  # can never fit: dropped (its latencies stay inf)
                        where[i] = _GONE
                        continue
                    k = free[r, seats - n_run[r] - 1]
                    where[i] = k
                    if c.placement and started[i] < 0.0:
                        started[i] = clock[r]
                    order[r, n_run[r]] = k
                    n_run[r] += 1
                    seat[r, k, _REQ] = i
                    seat[r, k, _PROMPT] = prompt[i]
                    seat[r, k, _PDONE] = hit
                    seat[r, k, _GEN] = gen[i]
                    seat[r, k, _KV] = hit
                    kv_used[r] += hit
                    if bt > 0:
                        s.cached[i] = hit
                        if hit >= image_end[i]:
                            vision_done[i] = True
                        for j in range(m):
                            _lru_touch(
                                lru_prev, lru_next, lru_end, r, _CACHE, chain[chain_start[i] + j], c.cache_blocks
                            )
                    seat[r, k, _OUT] = out[i]
                    seat_last[r, k] = last_tok[i]
                    chunks[n_chunk] = k
                    chunk_tokens[n_chunk] = tc
                    n_chunk += 1
                    budget -= tc
                if n_dec == 0 and n_chunk == 0:  # advance: idle until the first waiting request is ready
                    ready = np.inf
                    node = head[r]
                    while node >= 0:
                        ready = min(ready, avail[node])
                        node = nxt[node]
                    if clock[r] < ready < until:
                        clock[r] = ready
                        continue
                    clock[r] = until
                    break
                # the step's time: ReplicaParams.step_gpu_ms + one batched encoder call (kernels, eager launch) +
                # host_ms, in the same operation order
                n_tok = n_dec
                pairs = 0.0
                sampling = 0
                vision = 0.0
                images = 0.0
                for j in range(n_chunk):
                    k = chunks[j]
                    tc = chunk_tokens[j]
                    n_tok += tc
                    pairs += tc * (seat[r, k, _PDONE] + (tc + 1) / 2.0)
                    if seat[r, k, _PDONE] + tc >= seat[r, k, _PROMPT]:
                        sampling += 1
                    if not vision_done[seat[r, k, _REQ]]:
                        vision += vis_ms[seat[r, k, _REQ]]
                        images += vis_images[seat[r, k, _REQ]]
                gpu = (
                    (dense_ms[n_tok] if n_tok < dense_ms.size else c.dense_last_ms * n_tok / c.dense_last_tokens)
                    + c.kv_read_ms * float(ctx)
                    + c.prefill_pair_ms * pairs
                    + c.logits_row_ms * (n_dec + sampling)
                )
                launch = 0.0
                if images > 0.0:
                    gpu += c.vis_base_ms + vision
                    launch = c.launch_base_ms + c.launch_per_image_ms * images
                host = c.host_ms_base + c.host_ms_per_seq * (n_dec + n_chunk)
                clock[r] += (gpu + host + launch) / 1000.0
                now = clock[r]
                # decodes make a token each (histogram sums accumulate one value at a time, as the
                # book's do; most decodes share a gap: its bucket is looked up and counted once)
                n_done = 0
                itl_sum = counters[r, c.itl_col + n_itl + 1]
                gap_seen = -1.0
                col = c.itl_col
                same = 0
                for j in range(n_dec):
                    k = decodes[j]
                    seat[r, k, _GEN] += 1
                    seat[r, k, _KV] += 1
                    gap = now - seat_last[r, k]
                    if gap != gap_seen:
                        counters[r, col] += same
                        gap_seen = gap
                        col = c.itl_col + _bucket(c.itl_bounds, gap)
                        same = 0
                    same += 1
                    itl_sum += gap
                    seat_last[r, k] = now
                    if seat[r, k, _GEN] >= seat[r, k, _OUT]:
                        done[n_done] = k
                        n_done += 1
                counters[r, col] += same
                kv_used[r] += n_dec
                counters[r, c.itl_col + n_itl + 1] = itl_sum
                counters[r, c.itl_col + n_itl + 2] += n_dec
                # prompt chunks are cached; a finished prompt samples its first token
                new_tokens = n_dec
                for j in range(n_chunk):
                    k = chunks[j]
                    tc = chunk_tokens[j]
                    i = seat[r, k, _REQ]
                    vision_done[i] = True
                    seat[r, k, _PDONE] += tc
                    seat[r, k, _KV] += tc
                    kv_used[r] += tc
                    if bt > 0 and seat[r, k, _PDONE] >= seat[r, k, _PROMPT]:
                        full = min(chain_start[i + 1] - chain_start[i], w_prompt[i] // bt)
                        for x in range(full):
                            _lru_touch(
                                lru_prev, lru_next, lru_end, r, _CACHE, chain[chain_start[i] + x], c.cache_blocks
                            )
                    if seat[r, k, _PDONE] >= seat[r, k, _PROMPT] and not first[i]:
                        first[i] = True
                        seat[r, k, _GEN] = 1
                        seat[r, k, _KV] += 1
                        kv_used[r] += 1
                        seat_last[r, k] = now
                        new_tokens += 1
                        ttft = now - arrival[i]
                        ttft_of[i] = ttft
                        if c.server_clock:
                            ttft = now - s.sent[i]
                        counters[r, c.ttft_col + _bucket(c.ttft_bounds, ttft)] += 1.0
                        counters[r, c.ttft_col + n_ttft + 1] += ttft
                        counters[r, c.ttft_col + n_ttft + 2] += 1.0
                        counters[r, c.prompt_col] += float(w_prompt[i])
                        if seat[r, k, _GEN] >= seat[r, k, _OUT]:
                            done[n_done] = k
                            n_done += 1
                counters[r, c.generation_col] += float(new_tokens)
                if n_done == 0:
                    continue
                for j in range(n_done):
                    k = done[j]
                    i = seat[r, k, _REQ]
                    kv_used[r] -= seat[r, k, _KV]
                    where[i] = _GONE
                    e2e = now - arrival[i]
                    e2e_of[i] = e2e
                    o = float(out[i])
                    itl_of[i] = (e2e - ttft_of[i]) / max(o - 1.0, 1.0) if o > 1.0 else 0.0
                    if c.server_clock:
                        e2e = now - s.sent[i]
                    counters[r, c.e2e_col + _bucket(c.e2e_bounds, e2e)] += 1.0
                    counters[r, c.e2e_col + n_e2e + 1] += e2e
                    counters[r, c.e2e_col + n_e2e + 2] += 1.0
                    counters[r, c.success_col] += 1.0
                    tok = float(w_prompt[i])
                    counters[r, c.request_prompt_col + _bucket(c.token_bounds, tok)] += 1.0
                    counters[r, c.request_prompt_col + n_tb + 1] += tok
                    counters[r, c.request_prompt_col + n_tb + 2] += 1.0
                    counters[r, c.request_generation_col + _bucket(c.token_bounds, o)] += 1.0
                    counters[r, c.request_generation_col + n_tb + 1] += o
                    counters[r, c.request_generation_col + n_tb + 2] += 1.0
                # a running request is done exactly when it has made its output: free those seats
                n = n_run[r]
                keep = 0
                for j in range(n):
                    k = order[r, j]
                    if seat[r, k, _GEN] < seat[r, k, _OUT]:
                        order[r, keep] = k
                        keep += 1
                    else:
                        free[r, seats - n] = k
                        n -= 1
                n_run[r] = keep
            if n_run[r] == 0 and n_wait[r] == 0:
                n_active -= 1
                active[q] = active[n_active]
            else:
                q += 1
        if final:
            break
        if tick:  # flow control: drop what expired, dispatch all if the pool is not saturated
            while s.flow[_HELD_HEAD] < s.flow[_HELD_TAIL]:
                h = s.held[s.flow[_HELD_HEAD]]
                if deadline[h] > until and arrival[h] + c.request_ttl > until:
                    break
                if deadline[h] > until:
                    s.flow[_REJECTED] += 1
                s.flow[_HELD_HEAD] += 1
            if not _saturated(s, c, eligible):
                while s.flow[_HELD_HEAD] < s.flow[_HELD_TAIL]:
                    h = s.held[s.flow[_HELD_HEAD]]
                    s.flow[_HELD_HEAD] += 1
                    n_active = _submit(s, w, c, h, _route(s, w, c, h, eligible, cand, score), until, active, n_active)
            s.next_tick[0] = until + FLOW_TICK_S
            continue
        # A request whose client has already given up (held at the gateway past its deadline) is not sent; with
        # flow control one waits in the picker while others do or while the pool is saturated.
        i = idx[a]
        a += 1
        if deadline[i] <= until:
            continue
        if c.flow_control and (s.flow[_HELD_HEAD] < s.flow[_HELD_TAIL] or _saturated(s, c, eligible)):
            if s.flow[_HELD_HEAD] == s.flow[_HELD_TAIL]:
                s.next_tick[0] = until + FLOW_TICK_S
            s.held[s.flow[_HELD_TAIL]] = i
            s.flow[_HELD_TAIL] += 1
            continue
        n_active = _submit(s, w, c, i, _route(s, w, c, i, eligible, cand, score), until, active, n_active)


@_jit
def _saturated(s: _State, c: _Const, eligible: np.ndarray) -> bool:
    """The ``utilization-detector``'s pool saturation (framework/plugins/flowcontrol/saturationdetector/utilization/
    detector.go:115-137): the mean over the replicas of max(waiting / ``queue_depth``, KV use / ``kv_saturated``);
    flow control holds requests while it reaches the static usage limit, 1.0 (framework/plugins/flowcontrol/
    usagelimits/usagelimitpolicy.go:53-56; flowcontrol/controller/internal/processor.go:329-345)."""
    capf = float(max(c.kv_cap, 1))
    total = 0.0
    for q in range(eligible.size):
        e = eligible[q]
        total += max(s.n_wait[e] / c.queue_depth, min(float(s.kv_used[e]) / capf, 1.0) / c.kv_saturated)
    return total / eligible.size >= 1.0


@_jit
def _route(s: _State, w: _Work, c: _Const, i: int, eligible: np.ndarray, cand: np.ndarray, score: np.ndarray) -> int:
    """The replica request ``i`` goes to (least outstanding: ties to the first)."""
    if c.router == _PICKER:
        return _pick(s, w, c, i, eligible, cand, score)
    if c.router == _ROUND_ROBIN:
        s.turn[0] += 1
        chosen: int = eligible[(s.turn[0] - 1) % eligible.size]
        return chosen
    best = eligible[0]
    fewest = s.n_wait[best] + s.n_run[best]
    for q in range(1, eligible.size):
        e = eligible[q]
        if s.n_wait[e] + s.n_run[e] < fewest:
            best, fewest = e, s.n_wait[e] + s.n_run[e]
    return int(best)


@_jit
def _submit(s: _State, w: _Work, c: _Const, i: int, best: int, until: float, active: np.ndarray, n_active: int) -> int:
    """Request ``i`` joins replica ``best``'s queue, ordered by readiness (after every one ready no later);
    returns the new count of ``active`` replicas."""
    if s.n_run[best] == 0 and s.n_wait[best] == 0:
        s.clock[best] = max(s.clock[best], until)
        active[n_active] = best
        n_active += 1
    s.prompt[i] = w.prompt[i]
    s.gen[i] = 0
    s.last_tok[i] = 0.0
    s.first[i] = False
    s.vision_done[i] = w.vis_images[i] <= 0.0 or s.encoded[i]
    s.where[i] = _WAITING
    # preprocessed on the replica's API processes in turn, each one request at a time, from when it reaches them
    p = s.cpu_turn[best] % c.api_procs
    s.cpu_turn[best] += 1
    done = max(s.reach[i], s.cpu_free[best, p]) + w.cpu_ms[i] / 1000.0
    s.cpu_free[best, p] = done
    ready = done + c.request_overhead_s
    # a request with images reaches the engine on the next point of its API process's pass grid, spaced
    # api_pass_ms x the replica's running requests per process, so those ready within one pass share an encoder
    # call: a fitted wait, not CPU work (the real API process used 0.46 core at 20 req/s; docs/twin.md, Images)
    period = c.api_pass_ms * s.n_run[best] / c.api_procs / 1000.0
    if w.vis_images[i] > 0.0 and period > 0.0:
        end = s.pass_end[best, p]
        if ready > end:
            end += np.ceil((ready - end) / period) * period
        s.pass_end[best, p] = end
        ready = end
    s.avail[i] = ready
    s.anext[i] = -1
    if c.placement:
        s.served_by[i] = best
        s.started[i] = -1.0
    if c.server_clock:
        s.sent[i] = until
    if s.atail[best] >= 0:
        s.anext[s.atail[best]] = i
    else:
        s.ahead[best] = i
    s.atail[best] = i
    node = s.tail[best]
    while node >= 0 and s.avail[node] > s.avail[i]:
        node = s.prev[node]
    after = s.head[best] if node < 0 else s.next[node]
    s.prev[i] = node
    s.next[i] = after
    if node < 0:
        s.head[best] = i
    else:
        s.next[node] = i
    if after < 0:
        s.tail[best] = i
    else:
        s.prev[after] = i
    s.n_wait[best] += 1
    return n_active


# ----------------------------------------------------------------------------- the engine
def _replica_arrays(n: int, seats: int, blocks: int, procs: int) -> dict[str, np.ndarray]:
    return {
        "cpu_free": np.zeros((n, procs)),
        "cpu_turn": np.zeros(n, dtype=np.int64),
        "pass_end": np.zeros((n, procs)),
        "lru_prev": np.full((n, 2, blocks), _ABSENT, dtype=np.int32),
        "lru_next": np.full((n, 2, blocks), -1, dtype=np.int32),
        "lru_end": np.tile(np.array([-1, -1, 0], dtype=np.int64), (n, 2, 1)),
        "clock": np.zeros(n),
        "kv_used": np.zeros(n, dtype=np.int64),
        "n_run": np.zeros(n, dtype=np.int64),
        "head": np.full(n, -1, dtype=np.int64),
        "tail": np.full(n, -1, dtype=np.int64),
        "n_wait": np.zeros(n, dtype=np.int64),
        "ahead": np.full(n, -1, dtype=np.int64),
        "atail": np.full(n, -1, dtype=np.int64),
        "counters": np.zeros((n, LAYOUT.width)),
        "seat": np.zeros((n, seats, _SEAT_FIELDS), dtype=np.int64),
        "seat_last": np.zeros((n, seats)),
        "order": np.zeros((n, seats), dtype=np.uintp),
        "free": np.tile(np.arange(seats - 1, -1, -1, dtype=np.uintp), (n, 1)),
    }


class _Book(MetricBook):
    """A ``MetricBook`` that takes in the engine's accrued counters each time it folds its updates."""

    def __init__(self, pull: Callable[[], None]) -> None:
        super().__init__()
        self._pull = pull

    def _flush(self) -> None:
        self._pull()
        super()._flush()


class CompiledEngine:
    """The reference engine's results at compiled speed (see the module docstring)."""

    def __init__(
        self,
        params: ReplicaParams,
        work: Workload,
        placement: bool = False,
        router: Router = LEAST_OUTSTANDING,
        server_clock: bool = False,
    ) -> None:
        """``placement``: keep each request's replica and first admission, for ``placement()``; ``router``: how
        each request picks its replica; ``server_clock``: the servers' TTFT and E2E histograms count from when the
        request reached its replica, as vLLM's do, rather than from the client's send (a hold in the picker or at the
        gateway is then in the clients' latency only)."""
        self.params = params
        self.book: MetricBook = _Book(self._sync)
        n = work.arrival.shape[0]
        self.outcomes = Outcomes(n)
        self.n_rep = 0
        self._accrued = False  # counters accrued since the last sync (a scrape reads the book once per pod)
        seats = params.max_num_seqs
        self._n_blocks = work.n_blocks
        self._w = _Work(
            arrival=np.ascontiguousarray(work.arrival, dtype=float),
            prompt=work.prompt.astype(np.int64),
            out=work.out.astype(np.int64),
            vis_ms=np.ascontiguousarray(work.vis_ms, dtype=float),
            vis_images=np.ascontiguousarray(work.vis_images, dtype=float),
            vis_tokens=np.ascontiguousarray(work.vis_tokens, dtype=np.int64),
            cpu_ms=np.ascontiguousarray(work.cpu_ms, dtype=float),
            deadline=np.ascontiguousarray(work.deadline, dtype=float),
            dense_ms=params.dense_ms_vec(np.arange(int(params.dense_tokens[-1]), dtype=float)),
            chain_start=work.chain_start,
            chain=work.chain,
            chain_chars=work.chain_chars,
            image_end=work.image_end,
        )
        self._c = _Const(
            dense_last_tokens=float(params.dense_tokens[-1]),
            dense_last_ms=float(params.dense_ms[-1]),
            kv_read_ms=float(params.kv_read_ms),
            prefill_pair_ms=float(params.prefill_pair_ms),
            logits_row_ms=float(params.logits_row_ms),
            host_ms_base=float(params.host_ms_base),
            host_ms_per_seq=float(params.host_ms_per_seq),
            vis_base_ms=float(params.vision_ms[0]),
            launch_base_ms=float(params.encoder_launch_ms[0]) if params.vision_eager else 0.0,
            launch_per_image_ms=float(params.encoder_launch_ms[1]) if params.vision_eager else 0.0,
            encoder_budget=int(params.encoder_budget_tokens),
            request_overhead_s=float(params.request_overhead_s),
            api_pass_ms=float(params.api_pass_ms),
            api_procs=int(params.api_server_count),
            max_num_seqs=int(seats),
            max_num_batched_tokens=int(params.max_num_batched_tokens),
            kv_cap=int(params.kv_capacity_tokens),
            e2e_bounds=tuple(float(x) for x in E2E_BUCKETS),
            ttft_bounds=tuple(float(x) for x in TTFT_BUCKETS),
            itl_bounds=tuple(float(x) for x in ITL_BUCKETS),
            token_bounds=tuple(float(x) for x in REQUEST_TOKEN_BUCKETS),
            e2e_col=LAYOUT.e2e,
            ttft_col=LAYOUT.ttft,
            itl_col=LAYOUT.itl,
            success_col=LAYOUT.success,
            prompt_col=LAYOUT.prompt,
            generation_col=LAYOUT.generation,
            request_prompt_col=LAYOUT.request_prompt,
            request_generation_col=LAYOUT.request_generation,
            placement=placement,
            server_clock=server_clock,
            block_tokens=work.block_tokens,
            cache_blocks=params.kv_capacity_tokens // max(work.block_tokens, 1),
            router=_ROUTERS[router.kind],
            prefix_weight=router.prefix_weight,
            queue_weight=router.queue_weight,
            kv_weight=router.kv_weight,
            window_chars=router.window_chars,
            block_chars=router.block_chars,
            queue_depth=router.queue_depth,
            kv_saturated=router.kv_saturated,
            filter_queue_depth=router.filter_queue_depth,
            filter_kv=router.filter_kv,
            flow_control=router.flow_control,
            request_ttl=router.request_ttl,
        )
        self._s = _State(
            prompt=np.zeros(n, dtype=np.int64),
            gen=np.zeros(n, dtype=np.int64),
            last_tok=np.zeros(n),
            first=np.zeros(n, dtype=np.bool_),
            vision_done=np.zeros(n, dtype=np.bool_),
            avail=np.zeros(n),
            reach=np.array(work.arrival, dtype=float),
            encoded=np.zeros(n, dtype=np.bool_),
            next=np.full(n, -1, dtype=np.int64),
            prev=np.full(n, -1, dtype=np.int64),
            where=np.full(n, _GONE, dtype=np.int64),
            anext=np.full(n, -1, dtype=np.int64),
            served_by=np.full(n if placement else 1, -1, dtype=np.int64),
            started=np.full(n if placement else 1, -1.0),
            sent=np.zeros(n if server_clock else 1),
            ttft=self.outcomes.ttft,
            e2e=self.outcomes.e2e,
            itl=self.outcomes.itl,
            cached=self.outcomes.cached,
            decodes=np.zeros(seats, dtype=np.uintp),
            chunks=np.zeros(seats, dtype=np.uintp),
            chunk_tokens=np.zeros(seats, dtype=np.int64),
            done=np.zeros(seats, dtype=np.uintp),
            turn=np.array([0, router.seed % 2147483648], dtype=np.int64),
            held=np.zeros(n if router.flow_control else 1, dtype=np.int64),
            flow=np.zeros(3, dtype=np.int64),
            next_tick=np.zeros(1),
            **_replica_arrays(8, seats, work.n_blocks, params.api_server_count),
        )

    def add_replica(self) -> int:
        rid = self.book.add_replica()
        cap = self._s.clock.shape[0]
        if self.n_rep == cap:  # double the per-replica arrays
            more = _replica_arrays(cap, self.params.max_num_seqs, self._n_blocks, self.params.api_server_count)
            self._s = self._s._replace(**{k: np.concatenate((getattr(self._s, k), v)) for k, v in more.items()})
        self.n_rep += 1
        return rid

    def placement(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For requests ``idx``: the replica each went to (-1: none), and when it was first admitted (-1: not yet)."""
        if not self._c.placement:
            raise ValueError("this engine was built without placement=True")
        return self._s.served_by[idx].copy(), self._s.started[idx].copy()

    def ready_at(self, idx: np.ndarray) -> np.ndarray:
        """When requests ``idx`` could first be scheduled on their replica (preprocessed, the request overhead and,
        with images, the API pass), s: what the calibration sets against the server's own time before its engine."""
        return np.array(self._s.avail[idx])

    def encoded(self, idx: np.ndarray, at: np.ndarray) -> None:
        """Requests ``idx`` reach the replicas at ``at`` with their images' embeddings (from the encode tier): route
        them in the order of ``at``; no replica runs their encoder."""
        self._s.reach[idx] = at
        self._s.encoded[idx] = True

    def outstanding(self) -> np.ndarray:
        s = self._s
        return np.asarray(s.n_run[: self.n_rep] + s.n_wait[: self.n_rep], dtype=np.int64)

    def held(self) -> int:
        """Requests flow control holds in the picker now (the picker's ``inference_extension_flow_control_queue_size``;
        an expired one counts until the next 50 ms look drops it)."""
        f = self._s.flow
        return int(f[_HELD_TAIL] - f[_HELD_HEAD])

    def rejected(self) -> int:
        """Held requests the picker answered 503 so far: their ``defaultRequestTTL`` ran out while the client
        still waited."""
        return int(self._s.flow[_REJECTED])

    def gauges(self, rid: int) -> tuple[float, float, float]:
        s = self._s
        cap = max(self._c.kv_cap, 1)
        return float(s.n_run[rid]), float(s.n_wait[rid]), min(float(s.kv_used[rid]) / cap, 1.0)

    def run(self, t0: float, t1: float, idx: np.ndarray, eligible: np.ndarray) -> None:
        idx = np.ascontiguousarray(idx, dtype=np.int64)
        if idx.size and eligible.size == 0:  # the compiled code does not check bounds
            raise ValueError("requests to route but no eligible replica")
        eligible = np.ascontiguousarray(eligible, dtype=np.int64)
        _run(self._s, self._w, self._c, self.n_rep, float(t0), float(t1), idx, eligible)
        self._accrued = True

    def _sync(self) -> None:
        """Hand the counters accrued since the book last folded its updates to the book."""
        if not self._accrued:
            return
        self._accrued = False
        acc = self._s.counters[: self.n_rep]
        rids = np.arange(self.n_rep)
        for col in np.nonzero(acc.any(axis=0))[0]:
            self.book.add(int(col), rids, acc[:, col].copy())
        acc[:] = 0.0
