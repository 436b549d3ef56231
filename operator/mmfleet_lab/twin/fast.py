"""The fast engine: every replica advanced together in fixed ticks, with numpy.

Within a tick of ``dt`` seconds each replica runs a fluid version of the fine engine's schedule,
priced with the same calibrated step model:

- admission at the tick start, FCFS by readiness, while seats and KV cache allow;
- decode-only steps until the first pending prompt is ready, then *mixed* steps (every decode plus
  a prompt chunk of what the token budget leaves) until the pending prompt tokens are done, then
  decode-only steps for the rest of the tick. Prompts finish FCFS at the end of the step that
  completes them, never earlier than one mixed step after they became ready; a mixed step cut by
  the tick end carries over;
- the encoder time of images whose prompt starts this tick is charged before those steps;
- every decode gets one token per step of either kind. Decodes are not touched one by one: each
  replica keeps a token clock ``Z`` (tokens each of its decodes has made so far) and a decode
  finishes when ``Z`` passes its threshold; finish times are interpolated inside the tick.

Routing inside a tick uses the outstanding counts at the tick start plus what was routed in the
tick (completions inside the tick are not seen by the router). ``tests/unit/test_twin_engines.py``
measures the agreement with the fine engine.
"""

from __future__ import annotations

import math

import numpy as np

from mmfleet_lab.twin.engine import Outcomes, Workload, least_outstanding
from mmfleet_lab.twin.observe import LAYOUT, MetricBook
from mmfleet_lab.twin.replica import ReplicaParams

DEFAULT_DT = 0.1  # s; the agreement test runs this value

_PENDING = ("idx", "rid", "avail", "prompt", "out", "pdone", "gen", "kv", "adm", "first", "vis", "order")
_DECODING = ("d_idx", "d_rid", "d_thr", "d_kvb", "d_order")


def _seg_rank(keys: np.ndarray) -> np.ndarray:
    """Rank of each element inside its run of equal (sorted) keys: 0, 1, 2, ..."""
    n = keys.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    start = np.r_[True, keys[1:] != keys[:-1]]
    idx = np.arange(n)
    return idx - np.maximum.accumulate(np.where(start, idx, 0))


def _seg_cumsum(keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Inclusive cumulative sum of ``values`` inside runs of equal (sorted) keys."""
    if keys.size == 0:
        return np.zeros(0)
    c = np.cumsum(values)
    start = np.r_[True, keys[1:] != keys[:-1]]
    first = np.maximum.accumulate(np.where(start, np.arange(keys.size), 0))
    return np.asarray(c - (c[first] - values[first]))


class FastEngine:
    """All replicas of a fleet, advanced ``dt`` at a time (see the module docstring)."""

    def __init__(self, params: ReplicaParams, work: Workload, dt: float = DEFAULT_DT) -> None:
        self.p = params
        self.w = work
        self.dt = dt
        self.book = MetricBook()
        self.outcomes = Outcomes(work.arrival.shape[0])
        self.kv_cap = float(params.kv_capacity_tokens)
        self.n_rep = 0
        self._order = 0.0
        # per replica
        self.debt = np.zeros(0)  # encoder time that ran past the last tick
        self.phase = np.zeros(0)  # time already spent in a mixed step that the last tick cut
        self.z = np.zeros(0)  # token clock: tokens made by each decode of the replica so far
        self.n_dec = np.zeros(0)
        self.kv_dec = np.zeros(0)  # KV tokens held by the replica's decodes
        # requests not yet decoding (waiting or in prefill)
        self.idx = np.zeros(0, dtype=np.int64)
        self.rid = np.zeros(0, dtype=np.int64)
        self.avail = np.zeros(0)
        self.prompt = np.zeros(0)
        self.out = np.zeros(0)
        self.pdone = np.zeros(0)
        self.gen = np.zeros(0)
        self.kv = np.zeros(0)
        self.adm = np.zeros(0, dtype=bool)
        self.first = np.zeros(0, dtype=bool)
        self.vis = np.zeros(0)  # encoder ms still to charge
        self.order = np.zeros(0)
        # decoding requests: done when z[rid] >= thr; KV held = kvb + z[rid]
        self.d_idx = np.zeros(0, dtype=np.int64)
        self.d_rid = np.zeros(0, dtype=np.int64)
        self.d_thr = np.zeros(0)
        self.d_kvb = np.zeros(0)
        self.d_order = np.zeros(0)

    # ---------------------------------------------------------------- interface
    def add_replica(self) -> int:
        rid = self.book.add_replica()
        self.n_rep += 1
        for name in ("debt", "phase", "z", "n_dec", "kv_dec"):
            setattr(self, name, np.r_[getattr(self, name), 0.0])
        return rid

    def outstanding(self) -> np.ndarray:
        pend = np.bincount(self.rid, minlength=self.n_rep)
        return (pend + self.n_dec).astype(np.int64)

    def gauges(self, rid: int) -> tuple[float, float, float]:
        m = self.rid == rid
        started = self.adm[m] & ((self.pdone[m] > 0) | self.first[m])
        running = float(started.sum()) + float(self.n_dec[rid])
        waiting = float(m.sum()) - float(started.sum())
        kv = float(self.kv[m].sum()) + float(self.kv_dec[rid])
        return running, waiting, float(min(kv / max(self.kv_cap, 1.0), 1.0))

    def run(self, t0: float, t1: float, idx: np.ndarray, eligible: np.ndarray) -> None:
        idx = np.asarray(idx, dtype=np.int64)
        arr = np.maximum(self.w.arrival[idx], t0)
        t = t0
        lo = 0
        while t < t1 - 1e-12:
            b = min((math.floor(t / self.dt + 1e-9) + 1) * self.dt, t1)
            hi = int(np.searchsorted(arr, b, side="left")) if arr.size else 0
            if hi > lo:
                self._route(idx[lo:hi], eligible, t)
                lo = hi
            self._tick(t, b)
            t = b

    # ---------------------------------------------------------------- internals
    def _route(self, new: np.ndarray, eligible: np.ndarray, t: float) -> None:
        target = eligible[least_outstanding(self.outstanding()[eligible], new.size)]
        n = new.size
        cat = np.concatenate
        zf = np.zeros(n)
        zb = np.zeros(n, dtype=bool)
        self.idx = cat((self.idx, new))
        self.rid = cat((self.rid, target))
        self.avail = cat((self.avail, np.maximum(self.w.avail[new], t)))
        self.prompt = cat((self.prompt, self.w.prompt[new]))
        self.out = cat((self.out, self.w.out[new]))
        self.pdone = cat((self.pdone, zf))
        self.gen = cat((self.gen, zf))
        self.kv = cat((self.kv, zf))
        self.adm = cat((self.adm, zb))
        self.first = cat((self.first, zb))
        self.vis = cat((self.vis, self.w.vis_ms[new]))
        self.order = cat((self.order, zf))

    def _keep(self, names: tuple[str, ...], mask: np.ndarray) -> None:
        for f in names:
            setattr(self, f, getattr(self, f)[mask])

    def _preempt(self, used: np.ndarray) -> None:
        """Free KV where decodes no longer fit: the newest decodes go back to the queue to be recomputed."""
        for r in np.nonzero(used + self.n_dec > self.kv_cap)[0]:
            mine = np.nonzero(self.d_rid == r)[0]
            mine = mine[np.argsort(-self.d_order[mine])]
            over = used[r] + self.n_dec[r] - self.kv_cap
            drop: list[int] = []
            for j in mine:
                if over <= 0:
                    break
                held = self.d_kvb[j] + self.z[r]
                over -= held + 1.0
                drop.append(int(j))
            if not drop:
                continue
            d = np.asarray(drop, dtype=np.int64)
            i = self.d_idx[d]
            held = self.d_kvb[d] + self.z[r]
            gen = self.w.out[i] - (self.d_thr[d] - self.z[r])  # tokens generated so far
            self.n_dec[r] -= d.size
            self.kv_dec[r] -= held.sum()
            keep = np.ones(self.d_idx.size, dtype=bool)
            keep[d] = False
            self._keep(_DECODING, keep)
            cat = np.concatenate
            n = d.size
            self.idx = cat((self.idx, i))
            self.rid = cat((self.rid, np.full(n, r, dtype=np.int64)))
            self.avail = cat((self.avail, np.full(n, -1.0)))  # at the head of the queue
            self.prompt = cat((self.prompt, self.w.prompt[i] + np.floor(gen)))
            self.out = cat((self.out, self.w.out[i]))
            self.pdone = cat((self.pdone, np.zeros(n)))
            self.gen = cat((self.gen, gen))
            self.kv = cat((self.kv, np.zeros(n)))
            self.adm = cat((self.adm, np.zeros(n, dtype=bool)))
            self.first = cat((self.first, np.ones(n, dtype=bool)))
            self.vis = cat((self.vis, np.zeros(n)))
            self.order = cat((self.order, np.zeros(n)))

    def _tick(self, a: float, b: float) -> None:
        m = self.n_rep
        if self.idx.size == 0 and self.d_idx.size == 0:
            self.debt[:] = 0.0
            self.phase[:] = 0.0
            return
        p = self.p
        # --- KV pressure, then admission (FCFS by readiness, per replica)
        used = np.bincount(self.rid, weights=self.kv, minlength=m) + self.kv_dec
        if np.any(used + self.n_dec > self.kv_cap):
            self._preempt(used)
            used = np.bincount(self.rid, weights=self.kv, minlength=m) + self.kv_dec
        rid = self.rid
        running = np.bincount(rid[self.adm], minlength=m) + self.n_dec
        room = (running < p.max_num_seqs) & (used < self.kv_cap)
        wait = np.nonzero(~self.adm & (self.avail < b) & room[rid])[0] if np.any(room) else np.zeros(0, np.int64)
        if wait.size:
            wait = wait[np.lexsort((self.avail[wait], rid[wait]))]
            wr = rid[wait]
            ok = (_seg_rank(wr) < p.max_num_seqs - running[wr]) & (
                _seg_cumsum(wr, self.prompt[wait]) <= self.kv_cap - used[wr]
            )
            adm = wait[ok]
            if adm.size:
                self.adm[adm] = True
                self.order[adm] = self._order + np.arange(adm.size)
                self._order += adm.size
        pre = np.nonzero(self.adm)[0]
        n_d = self.n_dec
        ctx = self.kv_dec
        busy = n_d > 0
        # a replica works from its earliest ready request, after any carried-over encoder time
        start = np.where(busy, a, np.inf)
        np.minimum.at(start, rid[pre], np.maximum(self.avail[pre], a))
        start = np.maximum(start, a + self.debt)
        # --- pending prompts, FCFS inside each replica
        pre = pre[np.lexsort((self.order[pre], rid[pre]))]
        pr = rid[pre]
        rem = self.prompt[pre] - self.pdone[pre]
        p_tot = np.bincount(pr, weights=rem, minlength=m)
        n_p = np.bincount(pr, minlength=m).astype(float)
        ppt = (self.pdone[pre] + self.prompt[pre] + 1.0) / 2.0  # mean causal pairs per remaining prompt token
        pairs = np.bincount(pr, weights=rem * ppt, minlength=m)
        first_pre = np.full(m, np.inf)
        np.minimum.at(first_pre, pr, self.avail[pre])
        chunk = np.minimum(p_tot, np.maximum(p.max_num_batched_tokens - n_d, 0.0))
        has_p = chunk > 0
        safe_chunk = np.where(has_p, chunk, 1.0)
        safe_ptot = np.where(p_tot > 0, p_tot, 1.0)
        seq_mix = n_d + np.where(p_tot > 0, np.maximum(1.0, n_p * chunk / safe_ptot), 0.0)
        t_mix = (
            p.dense_ms_vec(n_d + chunk)
            + p.kv_read_ms * (ctx + n_d)
            + p.prefill_pair_ms * chunk * pairs / safe_ptot
            + p.logits_row_ms * (n_d + has_p)
            + np.minimum(p.host_ms_base + p.host_ms_per_seq * seq_mix, p.host_ms_max)
        ) / 1000.0
        t_dec0 = (
            p.dense_ms_vec(np.maximum(n_d, 1.0))
            + p.kv_read_ms * (ctx + n_d)
            + p.logits_row_ms * n_d
            + np.minimum(p.host_ms_base + p.host_ms_per_seq * n_d, p.host_ms_max)
        ) / 1000.0
        k_need = np.ceil(p_tot / safe_chunk - 1e-9) * has_p
        cum = _seg_cumsum(pr, rem)
        before = cum - rem
        # encoder: images of prompts whose first chunk can start this tick
        if pre.size:
            est = chunk[pr] * np.maximum(b - start[pr], 0.0) / t_mix[pr]
            vis_now = (self.vis[pre] > 0) & (before < est)
            vis_s = np.bincount(pr[vis_now], weights=self.vis[pre[vis_now]], minlength=m) / 1000.0
            self.vis[pre[vis_now]] = 0.0
        else:
            vis_s = np.zeros(m)
        finite = np.isfinite(start)
        begin = np.where(finite, start + vis_s, b)
        phase = np.where(has_p, self.phase, 0.0)
        # decode-only steps until the first pending prompt is ready (unless a mixed step is under way)
        begin_mix = np.where(has_p & (phase <= 0), np.maximum(begin, np.where(has_p, first_pre, begin)), begin)
        pre_time = np.where(busy, np.clip(np.minimum(begin_mix, b) - begin, 0.0, None), 0.0)
        mix_avail = np.maximum(b - begin_mix + phase, 0.0)  # counting the part of a step already run
        self.debt = np.where(finite & (begin > b), begin - b, 0.0)
        n_done = np.minimum(np.floor(mix_avail / t_mix + 1e-9), k_need) * has_p
        finished_mix = has_p & (n_done >= k_need)
        self.phase = np.where(has_p & ~finished_mix, mix_avail - n_done * t_mix, 0.0)
        mix_origin = begin_mix - phase  # when the first (possibly already started) mixed step began
        mix_end = np.where(has_p, mix_origin + n_done * t_mix, begin + pre_time)
        prog = n_done * chunk
        # --- prompt completions (a prompt that became ready late may finish just after the tick)
        t_first = np.maximum(
            mix_origin[pr] + np.ceil(cum / safe_chunk[pr] - 1e-9) * t_mix[pr], self.avail[pre] + t_mix[pr]
        )
        done_p = has_p[pr] & (cum <= prog[pr] + 1e-6)
        if np.any(done_p):
            t_first = np.minimum(t_first, self._one_by_one(pre, pr, rem, ppt, begin - phase, n_d, ctx, t_dec0))
        part = pre[~done_p]
        if part.size:
            gain = np.clip(prog[pr[~done_p]] - before[~done_p], 0.0, rem[~done_p])
            self.pdone[part] += gain
            self.kv[part] += gain
        fin_pre = pre[done_p]
        tf = t_first[done_p]
        fr = pr[done_p]
        is_new = ~self.first[fin_pre]
        newly = fin_pre[is_new]
        self.kv[fin_pre] += self.prompt[fin_pre] - self.pdone[fin_pre]
        if newly.size:
            i_new = self.idx[newly]
            ttft = tf[is_new] - self.w.arrival[i_new]
            self.gen[newly] = 1.0
            self.kv[newly] += 1.0
            self.outcomes.ttft[i_new] = ttft
            self.book.observe("ttft", rid[newly], ttft)
            self.book.add(LAYOUT.prompt, rid[newly], self.w.prompt[i_new])
            self.book.add(LAYOUT.generation, rid[newly], 1.0)
        # --- decode-only steps after the prompts, with the decodes there are then
        n_new = np.bincount(fr, minlength=m).astype(float)
        kv_new = np.bincount(fr, weights=self.kv[fin_pre], minlength=m)
        n_de = n_d + n_new
        t_dec = (
            p.dense_ms_vec(np.maximum(n_de, 1.0))
            + p.kv_read_ms * (ctx + kv_new + n_de)
            + p.logits_row_ms * n_de
            + np.minimum(p.host_ms_base + p.host_ms_per_seq * n_de, p.host_ms_max)
        ) / 1000.0
        post_time = np.where(~has_p | finished_mix, np.maximum(b - mix_end, 0.0), 0.0)
        # --- decodes running at the tick start: decode-only, mixed, then decode-only steps
        a_tok = pre_time / t_dec0
        post_tok = post_time / t_dec
        tok = np.where(busy, a_tok + n_done + post_tok, 0.0)
        z_old = self.z
        z_new = z_old + tok
        gen_tokens = n_d * tok
        itl_w = [n_d * a_tok, n_d * n_done, n_d * post_tok]
        if self.d_idx.size:
            fin = self.d_thr <= z_new[self.d_rid] + 1e-9
            if np.any(fin):
                fd = np.nonzero(fin)[0]
                frr = self.d_rid[fd]
                nd = self.d_thr[fd] - z_old[frr]
                fa, fk = a_tok[frr], n_done[frr]
                t_done = np.where(
                    nd <= fa,
                    begin[frr] + nd * t_dec0[frr],
                    np.where(
                        nd <= fa + fk,
                        mix_origin[frr] + (nd - fa) * t_mix[frr],
                        mix_end[frr] + (nd - fa - fk) * t_dec[frr],
                    ),
                )
                over = z_new[frr] - self.d_thr[fd]  # tokens the fluid gave after they were done
                gen_tokens = gen_tokens - np.bincount(frr, weights=over, minlength=m)
                itl_w[2] = np.maximum(itl_w[2] - np.bincount(frr, weights=over, minlength=m), 0.0)
                self.n_dec = self.n_dec - np.bincount(frr, minlength=m)
                # What these decodes held at the tick start; the n_dec * tok below only grows the survivors.
                self.kv_dec = self.kv_dec - np.bincount(frr, weights=self.d_kvb[fd] + z_old[frr], minlength=m)
                self._finish(self.d_idx[fd], frr, np.clip(t_done, a, b))
                self._keep(_DECODING, ~fin)
        self.kv_dec = self.kv_dec + self.n_dec * tok
        self.z = z_new
        # --- prompts finished in this tick decode for the rest of it, then join the token clock
        if fin_pre.size:
            t0 = np.maximum(tf, mix_end[fr])
            tk = np.where(post_time[fr] > 0, np.maximum(b - t0, 0.0) / t_dec[fr], 0.0)
            need = self.out[fin_pre] - self.gen[fin_pre]
            got = np.minimum(tk, need)
            gen_tokens = gen_tokens + np.bincount(fr, weights=got, minlength=m)
            itl_w[2] = itl_w[2] + np.bincount(fr, weights=got, minlength=m)
            done = tk >= need - 1e-9
            if np.any(done):
                t_done = np.where(need[done] <= 0, tf[done], t0[done] + need[done] * t_dec[fr[done]])
                self._finish(self.idx[fin_pre[done]], fr[done], np.clip(t_done, a, b))
            go = fin_pre[~done]
            if go.size:
                gr = fr[~done]
                z_entry = z_new[gr] - tk[~done]  # as if they had joined the clock at their first token
                kv_now = self.kv[go] + tk[~done]
                self.d_idx = np.concatenate((self.d_idx, self.idx[go]))
                self.d_rid = np.concatenate((self.d_rid, gr))
                self.d_thr = np.concatenate((self.d_thr, z_entry + need[~done]))
                self.d_kvb = np.concatenate((self.d_kvb, kv_now - z_new[gr]))
                self.d_order = np.concatenate((self.d_order, self.order[go]))
                self.n_dec = self.n_dec + np.bincount(gr, minlength=m)
                self.kv_dec = self.kv_dec + np.bincount(gr, weights=kv_now, minlength=m)
            keep = np.ones(self.idx.size, dtype=bool)
            keep[fin_pre] = False
            self._keep(_PENDING, keep)
        self.book.add(LAYOUT.generation, np.arange(m), gen_tokens)
        ar = np.arange(m)
        self.book.observe(
            "itl", np.concatenate((ar, ar, ar)), np.concatenate((t_dec0, t_mix, t_dec)), weight=np.concatenate(itl_w)
        )

    def _one_by_one(
        self,
        pre: np.ndarray,
        pr: np.ndarray,
        rem: np.ndarray,
        ppt: np.ndarray,
        begin: np.ndarray,
        n_d: np.ndarray,
        ctx: np.ndarray,
        t_dec0: np.ndarray,
    ) -> np.ndarray:
        """First-token times if each prompt ran in its own mixed step, FCFS (exact when arrivals are
        sparse; an upper bound when prompts queue, where the merged estimate is the better one).

        A max-plus recursion C_i = max(ready_i, C_{i-1}) + tau_i per replica, computed as
        S_i + max_{j<=i}(ready_j - S_{j-1}) with S the cumulative step times.
        """
        p = self.p
        d = n_d[pr]
        tau = (
            p.dense_ms_vec(d + rem)
            + p.kv_read_ms * (ctx[pr] + d)
            + p.prefill_pair_ms * rem * ppt
            + p.logits_row_ms * (d + 1.0)
            + np.minimum(p.host_ms_base + p.host_ms_per_seq * (d + 1.0), p.host_ms_max)
            + self.w.vis_ms[self.idx[pre]]
        ) / 1000.0
        # ``begin``: when the replica's first step with prompts started (a step cut by the last tick
        # started before this one); a prompt arriving later at a busy replica waits for the step under
        # way, half a step on average
        late = self.avail[pre] > begin[pr]
        ready = np.where(late, self.avail[pre] + np.where(d > 0, 0.5 * t_dec0[pr], 0.0), begin[pr])
        s_inc = _seg_cumsum(pr, tau)
        key = ready - (s_inc - tau)
        start = np.r_[True, pr[1:] != pr[:-1]] if pr.size else np.zeros(0, dtype=bool)
        seg = np.cumsum(start).astype(float)
        big = 1e7  # keeps the running maximum inside each replica's run (times are < 1e7 s)
        run_max = np.maximum.accumulate(key + seg * big) - seg * big
        return np.asarray(s_inc + run_max)

    def _finish(self, i: np.ndarray, r: np.ndarray, t_done: np.ndarray) -> None:
        arrival = self.w.arrival[i]
        self.outcomes.finish(i, t_done, arrival, self.w.out[i])
        self.book.observe("e2e", r, t_done - arrival)
        self.book.add(LAYOUT.success, r, 1.0)
