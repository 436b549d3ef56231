"""The reference engine: each replica advanced one vLLM engine step at a time, in plain Python.

It is the oracle the twin's compiled engine (``mmfleet_lab.twin.compiled``) is tested against
(``tests/unit/lab/test_twin_compiled.py``): the same algorithm written for reading rather than speed, so
a change to the compiled code that alters any schedule shows up as a mismatch. Too slow for the
benchmark (Python time per step and per request), so it lives with the tests. Routing, prefix caches and the
endpoint picker's flow control are written the same way: ``FineEngine.route``, ``pick`` and ``flow``.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque

import numpy as np

from mmfleet_lab.twin.compiled import FLOW_TICK_S
from mmfleet_lab.twin.engine import LEAST_OUTSTANDING, Outcomes, Router, Workload
from mmfleet_lab.twin.observe import LAYOUT, MetricBook
from mmfleet_lab.twin.replica import ReplicaParams


class _Req:
    __slots__ = ("first", "gen", "gone", "i", "kv", "last_tok", "out", "pdone", "prompt", "vision_done")

    def __init__(self, i: int, prompt: int, out: int, vision_done: bool) -> None:
        self.i = i
        self.prompt = prompt  # tokens to compute before decoding (+ generated ones after a preemption)
        self.out = out
        self.pdone = 0
        self.gen = 0
        self.kv = 0
        self.first = False
        self.vision_done = vision_done
        self.last_tok = 0.0
        self.gone = False  # finished, dropped or abandoned


class ReplicaEngine:
    """One replica, scheduled the way vLLM V1 does it.

    Each step: running requests in admission order take what they need from the token budget
    (a decode 1 token, a prefill a chunk of what is left of ``max_num_batched_tokens``), then
    waiting requests are admitted FCFS while seats (``max_num_seqs``), budget and KV cache allow.
    A request's images run through the encoder in the step of its first chunk. When decodes cannot
    get a KV slot, the newest running request is preempted and later recomputed (vLLM's default).
    Before each step, requests whose client has given up (past their deadline) leave the queue or
    their seat.

    With shared prefixes, ``cache`` holds the blocks of the replica's prefix cache, least recently used first:
    an admitted request starts with its leading cached blocks computed (all but its last token at most) and
    without its encoder call if they cover its images; a finished prefill adds its full blocks.
    """

    def __init__(self, rid: int, params: ReplicaParams, work: Workload, book: MetricBook, outcomes: Outcomes) -> None:
        self.rid = rid
        self.p = params
        self.w = work
        self.book = book
        self.outcomes = outcomes
        self.clock = 0.0
        self.cpu_free = [0.0] * params.api_server_count  # each API process: when it is done with what it was given
        self.cpu_turn = 0
        self.pass_end = [0.0] * params.api_server_count  # the latest point of each API process's pass grid
        self.avail: dict[int, float] = {}  # when each request sent here may be scheduled
        self.waiting: deque[_Req] = deque()
        self.running: list[_Req] = []
        self.assigned: deque[_Req] = deque()  # sent here, in arrival order (so in deadline order)
        self.kv_cap = params.kv_capacity_tokens
        self.kv_used = 0
        self.cache_blocks = self.kv_cap // max(work.block_tokens, 1)
        self.cache: OrderedDict[int, None] = OrderedDict()
        self.index: OrderedDict[int, None] = OrderedDict()  # the endpoint picker's approximation of ``cache``

    def chain(self, i: int) -> list[int]:
        w = self.w
        return [int(b) for b in w.chain[w.chain_start[i] : w.chain_start[i + 1]]]

    @staticmethod
    def matched(lru: OrderedDict[int, None], blocks: list[int]) -> int:
        m = 0
        while m < len(blocks) and blocks[m] in lru:
            m += 1
        return m

    def touch(self, lru: OrderedDict[int, None], blocks: list[int]) -> None:
        for b in blocks:
            lru[b] = None
            lru.move_to_end(b)
            while len(lru) > self.cache_blocks:
                lru.popitem(last=False)

    @property
    def outstanding(self) -> int:
        return len(self.waiting) + len(self.running)

    def submit(self, i: int, reach: float, encoded: bool) -> None:
        """Request ``i`` reaches this replica at ``reach`` (``encoded``: with its images' embeddings)."""
        w = self.w
        r = _Req(i, int(w.prompt[i]), int(w.out[i]), w.vis_images[i] <= 0.0 or encoded)
        # Preprocessed on the API processes in turn, one request at a time each; the engine queue is ordered by when
        # a request is ready.
        p = self.cpu_turn % len(self.cpu_free)
        self.cpu_turn += 1
        done = max(reach, self.cpu_free[p]) + w.cpu_ms[i] / 1000.0
        self.cpu_free[p] = done
        ready = done + self.p.request_overhead_s
        # with images it goes on at the next point of its process's pass grid (``compiled._submit``)
        period = self.p.api_pass_ms * len(self.running) / len(self.cpu_free) / 1000.0
        if w.vis_images[i] > 0.0 and period > 0.0:
            end = self.pass_end[p]
            if ready > end:
                end += math.ceil((ready - end) / period) * period
            self.pass_end[p] = end
            ready = end
        avail = self.avail
        avail[i] = ready
        pos = len(self.waiting)
        while pos > 0 and avail[self.waiting[pos - 1].i] > avail[i]:
            pos -= 1
        self.waiting.insert(pos, r)
        self.assigned.append(r)

    def _abandon(self) -> None:
        """Requests past their deadline leave: from the queue, or from their seat with their KV."""
        deadline = self.w.deadline
        while self.assigned:
            r = self.assigned[0]
            if not r.gone and deadline[r.i] > self.clock:
                return
            self.assigned.popleft()
            if r.gone:
                continue
            if r in self.running:
                self.running.remove(r)
                self.kv_used -= r.kv
            else:
                self.waiting.remove(r)
            r.gone = True

    def _preempt(self) -> None:
        while self.running:
            need = sum(1 for r in self.running if r.pdone >= r.prompt)
            if self.kv_used + need <= self.kv_cap:
                return
            v = self.running.pop()
            self.kv_used -= v.kv
            v.kv = 0
            if v.first:
                v.prompt = int(self.w.prompt[v.i]) + v.gen
            v.pdone = 0
            self.waiting.appendleft(v)

    def step_once(self) -> bool:
        """One engine step from ``clock``; False when nothing can be scheduled."""
        p = self.p
        w = self.w
        self._abandon()
        self._preempt()
        budget = p.max_num_batched_tokens
        enc_budget = p.encoder_budget_tokens
        decodes: list[_Req] = []
        chunks: list[tuple[_Req, int]] = []
        for r in self.running:
            if budget <= 0:
                break
            if r.pdone >= r.prompt:
                decodes.append(r)
                budget -= 1
            else:
                tc = min(r.prompt - r.pdone, budget)
                chunks.append((r, tc))
                budget -= tc
        while self.waiting and budget > 0 and len(self.running) < p.max_num_seqs:
            r = self.waiting[0]
            if self.avail[r.i] > self.clock:
                break
            hit, m = 0, 0
            if w.block_tokens > 0:
                m = self.matched(self.cache, self.chain(r.i))
                hit = min(m * w.block_tokens, r.prompt - 1)
            tc = min(r.prompt - hit, budget)
            if self.kv_used + hit + tc > self.kv_cap:
                if not self.running:  # can never fit: drop it (it stays at np.inf)
                    self.waiting.popleft().gone = True
                    continue
                break
            if not r.vision_done and hit < w.image_end[r.i]:  # all its images in this step's encoder budget
                if w.vis_tokens[r.i] > enc_budget and enc_budget < p.encoder_budget_tokens:
                    break
                enc_budget -= int(w.vis_tokens[r.i])
            self.waiting.popleft()
            r.pdone = r.kv = hit
            self.kv_used += hit
            if w.block_tokens > 0:
                self.outcomes.cached[r.i] = hit
                r.vision_done = r.vision_done or hit >= w.image_end[r.i]
                self.touch(self.cache, self.chain(r.i)[:m])
            self.running.append(r)
            chunks.append((r, tc))
            budget -= tc
        if not decodes and not chunks:
            return False
        sampling = sum(1 for r, tc in chunks if r.pdone + tc >= r.prompt)
        gpu = p.step_gpu_ms([r.kv for r in decodes], [(tc, r.pdone) for r, tc in chunks], sampling)
        vision, images = 0.0, 0.0
        for r, _ in chunks:
            if not r.vision_done:
                vision += float(w.vis_ms[r.i])
                images += float(w.vis_images[r.i])
        launch = 0.0
        if images > 0.0:  # one batched encoder call: its kernels and its eager launch
            gpu += p.vision_ms[0] + vision
            if p.vision_eager:
                a, b = p.encoder_launch_ms
                launch = a + b * images
        dt = (gpu + p.host_ms(len(decodes) + len(chunks)) + launch) / 1000.0
        self.clock += dt
        now = self.clock
        done: list[_Req] = []
        gaps: list[float] = []
        for r in decodes:
            r.gen += 1
            r.kv += 1
            self.kv_used += 1
            gaps.append(now - r.last_tok)
            r.last_tok = now
            if r.gen >= r.out:
                done.append(r)
        new_tokens = len(decodes)
        for r, tc in chunks:
            r.vision_done = True
            r.pdone += tc
            r.kv += tc
            self.kv_used += tc
            if w.block_tokens > 0 and r.pdone >= r.prompt:
                self.touch(self.cache, self.chain(r.i)[: int(w.prompt[r.i]) // w.block_tokens])
            if r.pdone >= r.prompt and not r.first:
                r.first = True
                r.gen = 1
                r.kv += 1
                self.kv_used += 1
                r.last_tok = now
                new_tokens += 1
                self.outcomes.ttft[r.i] = now - w.arrival[r.i]
                self.book.observe("ttft", self.rid, now - w.arrival[r.i])
                self.book.add(LAYOUT.prompt, self.rid, float(w.prompt[r.i]))
                if r.gen >= r.out:
                    done.append(r)
        if gaps:
            self.book.observe("itl", self.rid, np.asarray(gaps))
        self.book.add(LAYOUT.generation, self.rid, float(new_tokens))
        for r in done:
            r.gone = True
            self.running.remove(r)
            self.kv_used -= r.kv
            self.outcomes.finish(r.i, now, w.arrival[r.i], w.out[r.i])
            self.book.observe("e2e", self.rid, now - w.arrival[r.i])
            self.book.add(LAYOUT.success, self.rid, 1.0)
            self.book.observe("request_prompt", self.rid, float(w.prompt[r.i]))
            self.book.observe("request_generation", self.rid, float(w.out[r.i]))
        return True

    def advance(self, until: float) -> None:
        """Run steps until the clock reaches ``until`` (the last step may end after it)."""
        while self.clock < until:
            if self.step_once():
                continue
            nxt = min((self.avail[r.i] for r in self.waiting), default=math.inf)
            if self.clock < nxt < until:
                self.clock = nxt
                continue
            self.clock = until
            return

    def gauges(self) -> tuple[float, float, float]:
        cap = max(self.kv_cap, 1)
        return float(len(self.running)), float(len(self.waiting)), min(self.kv_used / cap, 1.0)


class FineEngine:
    """Replicas advanced step by step; each arrival is routed with the exact counts (``Router``)."""

    def __init__(self, params: ReplicaParams, work: Workload, router: Router = LEAST_OUTSTANDING) -> None:
        self.params = params
        self.work = work
        self.router = router
        self.turn = 0
        self.random = router.seed % 2147483648
        self.held: deque[int] = deque()  # flow control: requests waiting in the picker
        self.next_tick = 0.0
        self.book = MetricBook()
        self.outcomes = Outcomes(work.arrival.shape[0])
        self.replicas: list[ReplicaEngine] = []
        self.reach = np.array(work.arrival, dtype=float)  # when each request reaches the replicas
        self.from_encoder = np.zeros(work.arrival.shape[0], dtype=bool)  # its embeddings came from the encode tier

    def encoded(self, idx: np.ndarray, at: np.ndarray) -> None:
        self.reach[idx] = at
        self.from_encoder[idx] = True

    def send(self, i: int, replica: int) -> None:
        self.replicas[replica].submit(i, float(self.reach[i]), bool(self.from_encoder[i]))

    def add_replica(self) -> int:
        rid = self.book.add_replica()
        self.replicas.append(ReplicaEngine(rid, self.params, self.work, self.book, self.outcomes))
        return rid

    def outstanding(self) -> np.ndarray:
        return np.array([r.outstanding for r in self.replicas], dtype=np.int64)

    def gauges(self, rid: int) -> tuple[float, float, float]:
        return self.replicas[rid].gauges()

    def run(self, t0: float, t1: float, idx: np.ndarray, eligible: np.ndarray) -> None:
        for i in idx:
            t = max(float(self.reach[i]), t0)
            self.flow(t, eligible)
            for r in self.replicas:
                r.advance(t)
            if self.work.deadline[i] <= t:  # its client gave up at the gateway
                continue
            if self.router.flow_control and (self.held or self.saturated(eligible)):
                if not self.held:
                    self.next_tick = t + FLOW_TICK_S
                self.held.append(int(i))
                continue
            self.send(int(i), self.route(int(i), [int(e) for e in eligible]))
        self.flow(t1, eligible)
        for r in self.replicas:
            r.advance(t1)

    def saturated(self, eligible: np.ndarray) -> bool:
        """The picker's pool saturation (``compiled._saturated``)."""
        rt = self.router
        load = [
            max(len(self.replicas[e].waiting) / rt.queue_depth, self.replicas[e].gauges()[2] / rt.kv_saturated)
            for e in eligible
        ]
        return sum(load) / len(load) >= 1.0

    def flow(self, until: float, eligible: np.ndarray) -> None:
        """Flow control's looks at the pool before ``until`` while requests are held: those past their client's
        deadline or the picker's TTL go, the rest are dispatched when the pool is not saturated."""
        w = self.work
        while self.held and len(eligible) and self.next_tick < until:
            t = self.next_tick
            for r in self.replicas:
                r.advance(t)
            while self.held and (
                w.deadline[self.held[0]] <= t or w.arrival[self.held[0]] + self.router.request_ttl <= t
            ):
                self.held.popleft()
            if not self.saturated(eligible):
                while self.held:
                    i = self.held.popleft()
                    self.send(i, self.route(i, [int(e) for e in eligible]))
            self.next_tick = t + FLOW_TICK_S

    def route(self, i: int, eligible: list[int]) -> int:
        if self.router.kind == "round-robin":
            self.turn += 1
            return eligible[(self.turn - 1) % len(eligible)]
        if self.router.kind == "picker":
            return self.pick(i, eligible)
        counts = [self.replicas[e].outstanding for e in eligible]
        return eligible[int(np.argmin(counts))]

    def pick(self, i: int, eligible: list[int]) -> int:
        """The endpoint picker: filter saturated replicas, score, take the best (see ``compiled._pick``)."""
        rt, w = self.router, self.work

        def kv(e: int) -> float:
            return self.replicas[e].gauges()[2]

        cand = [e for e in eligible if len(self.replicas[e].waiting) < rt.filter_queue_depth and kv(e) < rt.filter_kv]
        cand = cand if rt.filter_queue_depth and cand else list(eligible)
        waits = [len(self.replicas[e].waiting) for e in cand]
        lo, hi = min(waits), max(waits)
        blocks = self.replicas[0].chain(i)
        chars = [int(c) for c in w.chain_chars[w.chain_start[i] : w.chain_start[i + 1]]]
        seen, m_win = 0, 0
        while m_win < len(blocks) and seen < rt.window_chars:
            seen += chars[m_win]
            m_win += 1

        def hashed(m: int) -> int:
            return min(sum(chars[:m]), rt.window_chars) // rt.block_chars

        total = hashed(m_win)
        scores = []
        for e, q in zip(cand, waits, strict=True):
            prefix = 0.0
            if total > 0:
                prefix = hashed(ReplicaEngine.matched(self.replicas[e].index, blocks[:m_win])) / total
            queue = 1.0 if hi == lo else (hi - q) / (hi - lo)
            scores.append(rt.prefix_weight * prefix + rt.queue_weight * queue + rt.kv_weight * (1.0 - kv(e)))
        ties = [e for e, v in zip(cand, scores, strict=True) if v == max(scores)]
        self.random = (self.random * 1103515245 + 12345) % 2147483648
        chosen = ties[self.random % len(ties)]
        target = self.replicas[chosen]
        target.touch(target.index, blocks[:m_win])
        return chosen
