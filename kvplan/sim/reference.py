"""The step-by-step reference simulator: slow, plain, and the definition of the semantics.

The fast engine (`engine.py`) must reproduce this one exactly; tests compare them on many random
workloads. Time is in integer ticks (`timing.py`): one tick per step without a GPU, picoseconds
with one. A request is first seen by the step that starts at or after its arrival; when nothing
runs or waits, the clock jumps to the next arrival (an idle gap, counted with the pool empty).

One step, starting at time t (vLLM v1's scheduler, with v0's swap queue):
0. Requests with arrival <= t join the back of the waiting queue.
1. Running requests, oldest admission first, get their tokens for this step out of the budget of
   max_num_batched_tokens: 1 when decoding, else the rest of the prefill (chunked: at most the
   budget left; 0 tokens means skipped this step). A paged request takes the blocks it needs for
   the tokens it will hold after the step; when too few are free, the most recently admitted
   running request is preempted, repeatedly, and if that is the request itself it stops there.
   Recompute: free its blocks, put it at the front of the waiting queue, its next prefill is
   prompt + generated. Swap: its blocks go to the CPU pool (`swap_slots`), back of the swapped
   queue; recompute when the CPU pool is full. Contiguous requests never need to grow.
2. Only if nothing was preempted in this step: swapped requests come back first (FCFS), and the
   waiting queue is served only when none are swapped: in order, stopping at the first request
   that does not fit max_num_seqs, the budget (without chunked prefill the whole prefill must
   fit) or memory (paged blocks; contiguous: first fit of its whole reservation).
3. The step runs for `clock.step_ticks(...)`. A request holds the tokens whose KV is computed:
   the step that completes a prefill of P tokens holds P and samples the first output token,
   whose KV the next step computes (so a request of P prompt and O output tokens ends holding
   P + O - 1, and admission takes ceil(P / B) blocks, as vLLM's allocate_slots does). A request
   that reaches its output length finishes at the end of the step and frees its memory at once.

Automatic prefix caching (paged, `prefix_caching`) runs on kvplan/memory/prefix_cache.py's
BlockPool (vLLM V1's, whose rules and counters that module defines), with vLLM's null block when
kept: every free block waits in one queue, oldest first; a request's blocks are freed tail first
(appended to the back), and new blocks are taken from the front, evicting a cached block met
there. A full prompt block with an identity (`prefix_ids.py`: its trie node is its key) is cached
when the step that fills it is scheduled (copies are not merged: two requests that computed the
same block both cache theirs, and a lookup takes the oldest copy). A waiting request, at
admission, looks up its identity blocks from the first, stopping at the first one not cached and
keeping at least one prompt token to compute; it shares the blocks found (a free one leaves the
queue) and its prefill starts after them. It needs new blocks for what it computes now plus the
hit blocks nobody holds; if those do not fit, it waits (FCFS). Memory is counted per physical
block: a block several running requests share counts once.

A CPU tier (`SimSetup.offload`, vLLM's offloading connector) runs on kvplan/memory/cpu_tier.py's
CpuTier with the rules of kvplan/sim/offload.py: after each step's scheduling the scheduled
requests store the identity blocks their tokens complete; a waiting head touches its blocks in
the tier, and the blocks after its GPU hits that the tier holds are loaded (it waits, holding its
blocks, in `loading`, off the waiting queue); once its load has ended it runs ahead of the
waiting queue. A step with nothing to run while loads are in flight waits for them instead.

Hybrid models (vLLM's hybrid KV cache manager, `SimSetup.hybrid`): one pool of blocks shared by
layer groups. A request holds, per full-attention group, a block per B tokens; per sliding-window
group the same less the blocks wholly before its last window - 1 computed tokens (released before
each allocation, on the tokens computed before the step); per recurrent-state group a fixed
state. Admission, growth and preemption count every group's blocks; memory counts each group's
kept tokens (and whole state pages).

Speculative decoding (`SimSetup.speculative`, kvplan/sim/speculative.py): a decoding request is
scheduled 1 + k tokens (cut to the budget and to max_model_len - 1 - held), a running request's
blocks cover its lookahead slots too (EAGLE-style drafters), it advances by 1 + the drafts its
seeded draw accepts, a prefix hit gives up its last block (EAGLE-style), and a step's time adds
the drafts' verification and the drafter's passes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from kvplan.memory.contiguous import ContiguousPool
from kvplan.memory.cpu_tier import CpuTier
from kvplan.memory.prefix_cache import BlockPool
from kvplan.model.step_time import prefill_pairs
from kvplan.sim.inputs import SimSetup, make_setup, prepared_chunks
from kvplan.sim.metrics import RawRun, ServeResult, build_result
from kvplan.sim.offload import OffloadStats, stalled
from kvplan.sim.sampling import TIMELINE_POINTS, TimelineSampler
from kvplan.workload.records import Workload
from kvplan.workload.spec import AllocatorSpec


@dataclass(slots=True)
class Req:
    rid: int
    arrival: int
    prompt: int
    output: int
    reserve: int
    generated: int = 0
    held: int = 0  # tokens in the cache (prompt + generated once prefilled)
    target: int = 0  # tokens the current prefill must process
    blocks: int = 0
    admitted: int = -1
    first_token: int = -1
    finish: int = -1
    preemptions: int = 0
    sent: int = -1  # the client's send tick, when the API server delays the request (-1: its arrival)
    nodes: list = field(default_factory=list)  # prefix caching: block node of each identity block
    table: list = field(default_factory=list)  # prefix caching: its physical blocks, in order
    cached: int = 0  # prefix caching: leading blocks of `table` that are cached (hit or registered)
    hit_tokens: int = 0  # prefix caching: prompt tokens its first admission found cached
    swapped_slots: int = 0  # swap: CPU slots its KV takes while swapped out
    skip: int = 0  # hybrid: blocks per sliding group released at its last allocation
    preload: int = 0  # prompt tokens whose KV arrives computed (a disaggregated decode replica's)
    ready: int = -1  # offload: tick its load from the CPU tier ends (-1: not loading, or done)
    stored: int = 0  # offload: identity blocks offered to the CPU tier so far

    @property
    def prefilling(self) -> bool:
        return self.held < self.target

    def held_after(self, n: int) -> int:
        """Tokens held after processing `n` tokens. The token a completed prefill samples has its
        KV computed by the next step (vLLM's allocate_slots: ceil(prompt / B) blocks at admission)."""
        return self.held + n


class ReferenceSim:
    """One allocator, one workload, one step at a time."""

    def __init__(self, setup: SimSetup, reqs: list[Req], timeline_points: int):
        self.s, self.sched, self.clock, self.reqs = setup, setup.sched, setup.clock, reqs
        self.waiting: deque[Req] = deque()
        self.swapped: deque[Req] = deque()
        self.running: list[Req] = []
        self.next_arrival = 0
        self.free_blocks = setup.num_blocks
        self.pool = None if setup.paged else ContiguousPool(setup.slots)
        self.blocks = None  # prefix caching: the block pool (block 0 vLLM's null block, when kept)
        if setup.prefix_caching:
            null = setup.sched.null_block
            self.blocks = BlockPool(setup.num_blocks + int(null), null_block=null)
        self.cpu_used = 0
        self.tier = CpuTier(setup.offload.num_blocks) if setup.offload is not None else None
        self.loading: deque[Req] = deque()  # offload: loading from the tier, or loaded and waiting to run
        self.link_free = 0
        self.offload = dict.fromkeys(("query_tokens", "hit_tokens", "loads", "blocks_loaded", "load_ticks"), 0)
        self.t = reqs[0].arrival if reqs else 0
        self.origin = self.t
        self.steps = self.preemptions = self.swap_outs = self.recomputed = self.peak = 0
        self.integrals = dict.fromkeys(("time", "running", "tokens", "allocated", "final",
                                        "external"), 0)
        self.sampler = TimelineSampler(self.origin, setup.clock, timeline_points)

    # -- the loop --------------------------------------------------------------------------------

    def run(self) -> None:
        while self.advance():
            pass

    def advance(self) -> bool:
        """Take in the arrivals, then one step or one idle gap; False once everything is done."""
        reqs = self.reqs
        self.arrive()
        if self.busy():
            self.step()
        elif self.next_arrival < len(reqs):
            self.idle_until(reqs[self.next_arrival].arrival)
        else:
            return False
        return True

    def arrive(self) -> None:
        """Requests with arrival <= t join the back of the waiting queue."""
        reqs = self.reqs
        while self.next_arrival < len(reqs) and reqs[self.next_arrival].arrival <= self.t:
            self.waiting.append(reqs[self.next_arrival])
            self.next_arrival += 1

    def busy(self) -> bool:
        """Anything running, waiting, swapped out or loading."""
        return bool(self.running or self.waiting or self.swapped or self.loading)

    def idle_until(self, until: int) -> None:
        dt = until - self.t
        ext = self.s.tail_slots
        self.integrals["time"] += dt
        self.integrals["external"] += ext * dt
        self.sampler.record(self.t, until, (0, 0, 0, 0, 0, ext, self.s.slots - ext))
        self.t = until

    def step(self) -> None:
        work = self.schedule()
        if work is None:
            return
        self.run_step(work, self.step_cost(work))

    def schedule(self) -> dict[int, int] | None:
        """Phases 1 and 2: the tokens of each request this step (rid -> tokens); None when, with a
        CPU tier, nothing could run and the engine waited for a load instead."""
        work: dict[int, int] = {}  # rid -> tokens this step
        budget, preempted = self.schedule_running(work)
        before = len(self.running)
        if not preempted:
            budget = self.resume_swapped(work, budget)
            if not self.swapped:
                self.admit(work, budget)
        if self.tier is not None:
            if not self.running and self.loading:
                self.wait_for_load()
                return None
            self.store_pass(work, before)
        return work

    def step_inputs(self, work: dict[int, int]) -> tuple[int, int, int, int]:
        """What the clock prices a scheduled step by: (KV read, tokens, requests, prefill pairs)."""
        by_id = {r.rid: r for r in self.running}
        kv_read = sum(self.kv_read(by_id[rid].held) for rid in work)
        pairs = sum(prefill_pairs(n, by_id[rid].held) for rid, n in work.items() if by_id[rid].prefilling)
        return kv_read, sum(work.values()), len(work), pairs

    def step_cost(self, work: dict[int, int], extra_gpu: int = 0) -> int:
        """Ticks of the scheduled step on this engine's clock, with `extra_gpu` ticks of GPU work
        beside it (the MoE layers a DP rank shares with the others: kvplan/sim/data_parallel.py)."""
        kv_read, tokens, requests, pairs = self.step_inputs(work)
        if self.s.speculative is None:
            return self.clock.step_ticks(kv_read, tokens, requests, pairs, extra_gpu=extra_gpu)
        by_id = {r.rid: r for r in self.running}
        decoding = [rid for rid in work if not by_id[rid].prefilling]
        return self.s.speculative.step_ticks(self.clock, kv_read, tokens, requests, pairs,
                                             len(decoding), sum(work[rid] - 1 for rid in decoding),
                                             sum(self.kv_read(by_id[rid].held) for rid in decoding),
                                             extra_gpu=extra_gpu)

    def run_step(self, work: dict[int, int], dt: int) -> None:
        """Phase 3: the scheduled step runs for `dt` ticks."""
        self.account(work, dt)
        self.execute(work, self.t + dt)
        self.t += dt
        self.steps += 1

    # -- phase 1: running requests ---------------------------------------------------------------

    def tokens_for(self, req: Req, budget: int, held: int | None = None) -> int:
        held = req.held if held is None else held
        if held >= req.target:
            spec = self.s.speculative  # 1 + k: the last token and its drafts (speculative.py)
            return (1 if spec is None else spec.tokens(held, budget)) if budget >= 1 else 0
        rest = req.target - held
        if self.sched.chunked_prefill:
            return min(rest, budget)
        return rest if rest <= budget else 0

    def blocks_for(self, tokens: int, skip: int = 0) -> int:
        """Blocks a request holding `tokens` takes, its sliding groups having released `skip`."""
        full = -(-tokens // self.s.block_size)
        h = self.s.hybrid
        return full if h is None else h.full * full + h.sliding * (full - skip) + h.state

    def skip_for(self, computed: int) -> int:
        """Blocks per sliding group wholly out of the window once `computed` tokens are computed."""
        h = self.s.hybrid
        if h is None or not h.sliding:
            return 0
        return max(computed - h.window + 1, 0) // self.s.block_size

    def slots(self, held: int) -> int:
        """Slots a running request holding `held` after its step allocates: with an EAGLE-style
        drafter the lookahead more, up to max_model_len (vLLM's num_lookahead_tokens)."""
        return held if self.s.speculative is None else self.s.speculative.slots(held)

    def kv_read(self, held: int) -> int:
        """KV a step reads for a request, in tokens of every layer: sliding layers read their window."""
        return self.s.kv_read(held)

    def kept(self, req: Req, tokens: int) -> int:
        h = self.s.hybrid
        if h is None:
            return tokens
        return h.full * tokens + h.sliding * (tokens - req.skip * self.s.block_size) + h.state * self.s.block_size

    # -- paged memory, with or without the prefix cache ------------------------------------------

    def num_free(self) -> int:
        return self.blocks.num_free_blocks if self.blocks is not None else self.free_blocks

    def grow(self, req: Req, need: int, n: int) -> None:
        """A running (or resuming) request takes `need` more blocks for its `n` tokens."""
        if self.blocks is not None:
            if need:  # (no block taken: nothing to do in the pool)
                req.table += self.blocks.get_new_blocks(need).tolist()
            self.register(req, req.held + n)
        else:
            self.free_blocks -= need
        req.blocks += need

    def register(self, req: Req, upto: int) -> None:
        """Cache its identity blocks that are full once it holds `upto` tokens."""
        full = min(len(req.nodes), upto // self.s.block_size)
        if full > req.cached:
            self.blocks.cache_full_blocks(req.table[req.cached:full], req.nodes[req.cached:full])
            req.cached = full

    def release(self, req: Req) -> None:
        if self.blocks is not None:
            self.blocks.free_blocks(req.table[::-1])  # tail first: a shared head outlives the tails
            req.table, req.cached = [], 0
        else:
            self.free_blocks += req.blocks
        req.blocks = 0

    def shared_slots(self) -> int:
        """Slots counted twice or more by the per-request sums: blocks several requests hold."""
        if self.blocks is None:
            return 0
        held = [b for r in (*self.running, *self.loading) for b in r.table[:r.cached]]
        return (len(held) - len(set(held))) * self.s.block_size

    def schedule_running(self, work: dict[int, int]) -> tuple[int, bool]:
        budget, preempted, i = self.sched.max_num_batched_tokens, False, 0
        while i < len(self.running):
            req = self.running[i]
            n = self.tokens_for(req, budget)
            if n == 0:
                i += 1
                continue
            skip = self.skip_for(req.held)
            need = self.blocks_for(self.slots(req.held_after(n)), skip) - req.blocks if self.s.paged else 0
            while need > self.num_free():
                victim = self.running.pop()
                assert victim.rid not in work
                self.preempt(victim)
                preempted = True
                if victim is req:
                    break
            else:
                self.grow(req, need, n)
                req.skip = skip
                work[req.rid] = n
                budget -= n
                i += 1
        return budget, preempted

    def preempt(self, victim: Req) -> None:
        size = victim.blocks * self.s.block_size
        self.release(victim)
        victim.preemptions += 1
        self.preemptions += 1
        if self.sched.preemption == "swap" and self.cpu_used + size <= self.sched.swap_slots:
            self.cpu_used += size
            victim.swapped_slots = size
            self.swap_outs += 1
            self.swapped.append(victim)
            return
        self.recomputed += victim.held
        victim.held = victim.skip = victim.preload = 0  # a recompute has none of its KV, sent or not
        victim.target = victim.prompt + victim.generated
        self.waiting.appendleft(victim)

    # -- phase 2: swapped and waiting requests ---------------------------------------------------

    def resume_swapped(self, work: dict[int, int], budget: int) -> int:
        while self.swapped and len(self.running) < self.sched.max_num_seqs:
            req = self.swapped[0]
            n = self.tokens_for(req, budget)
            skip = self.skip_for(req.held)
            need = self.blocks_for(self.slots(req.held_after(n)), skip)
            if n == 0 or need > self.num_free():
                break
            req.skip = skip
            self.swapped.popleft()
            self.cpu_used -= req.swapped_slots
            self.grow(req, need, n)
            self.running.append(req)
            work[req.rid] = n
            budget -= n
        return budget

    def place(self, req: Req, budget: int) -> int:
        """Give the waiting request its memory for this step: the tokens it processes, or 0 (and
        nothing changed) if it cannot start."""
        if not self.s.paged:
            n = self.tokens_for(req, budget)
            return n if n and self.pool.allocate(req.rid, req.reserve) is not None else 0
        hits, unheld = [], 0
        if self.blocks is not None:
            limit = min(len(req.nodes), (req.target - 1) // self.s.block_size)  # one token computed
            hits = self.blocks.match_prefix(req.nodes[:limit])
            if hits and self.s.speculative is not None and self.s.speculative.lookahead:
                hits = hits[:-1]  # an EAGLE-style drafter recomputes the last hit block (speculative.py)
            unheld = self.blocks.num_unheld(hits)
        if self.tier is not None:
            if len(self.loading) >= self.sched.max_num_seqs:  # max_concurrent_loads: put off
                return 0
            self.tier.touch(req.nodes)
            cpu, pinned = self.tier.lookup(req.nodes[len(hits):])
            if cpu:
                if pinned or cpu + unheld > self.num_free():
                    return 0
                self.start_load(req, hits, cpu)
                return -1
        hit = len(hits) * self.s.block_size
        held = max(hit, req.preload)  # a decode replica's request arrives holding its sent KV
        n = self.tokens_for(req, budget, held)
        new = self.blocks_for(held + n) - len(hits)
        if n == 0 or new + unheld > self.num_free():
            return 0
        if self.tier is not None:
            self.count_offload(req, len(hits), 0)
        if self.blocks is not None:
            self.blocks.touch(hits)
            self.blocks.count_admission(req.prompt, hit, first=req.admitted < 0)
            req.table, req.cached, req.held, req.blocks = hits, len(hits), hit, len(hits)
            if req.admitted < 0:
                req.hit_tokens = hit
        req.held = max(req.held, req.preload)
        req.skip = 0
        self.grow(req, new, n)
        return n

    def admit(self, work: dict[int, int], budget: int) -> None:
        while len(self.running) < self.sched.max_num_seqs:
            if self.tier is not None:  # requests whose loads ended come first
                if budget <= 0:
                    break
                n = self.admit_loaded(work, budget)
                if n < 0:
                    break
                if n > 0:
                    budget -= n
                    continue
            if not self.waiting:
                break
            req = self.waiting[0]
            n = self.place(req, budget)
            if n < 0:  # it waits for a load from the CPU tier
                self.loading.append(self.waiting.popleft())
                continue
            if n == 0:
                break
            self.waiting.popleft()
            self.running.append(req)
            if req.admitted < 0:
                req.admitted = self.t
            work[req.rid] = n
            budget -= n

    # -- the CPU tier (kvplan/sim/offload.py) ----------------------------------------------------

    def count_offload(self, req: Req, hits: int, cpu: int) -> None:
        if req.admitted < 0:
            self.offload["query_tokens"] += req.prompt - hits * self.s.block_size
            self.offload["hit_tokens"] += cpu * self.s.block_size

    def start_load(self, req: Req, hits: list[int], cpu: int) -> None:
        """Share the GPU hits, take blocks for the tier's, pin those and start their load."""
        b, g = self.s.block_size, len(hits)
        self.blocks.touch(hits)
        self.blocks.count_admission(req.prompt, g * b, first=req.admitted < 0)
        if req.admitted < 0:
            req.hit_tokens = g * b
        self.count_offload(req, g, cpu)
        req.table = hits + self.blocks.get_new_blocks(cpu).tolist()
        req.cached, req.blocks, req.skip = g, g + cpu, 0
        req.held = min((g + cpu) * b, req.target - 1)  # a whole prompt: its last token is recomputed
        req.stored = g + cpu
        self.tier.pin(req.nodes[g:g + cpu])
        ticks = cpu * self.s.offload.load_ticks
        req.ready = self.link_free = max(self.t, self.link_free) + ticks
        for key, value in (("loads", 1), ("blocks_loaded", cpu), ("load_ticks", ticks)):
            self.offload[key] += value

    def admit_loaded(self, work: dict[int, int], budget: int) -> int:
        """The front of `loading` once its load has ended: unpinned, its blocks cached on the GPU,
        started. Its tokens; 0 when none has ended; -1 when it cannot start."""
        if not self.loading or self.loading[0].ready > self.t:
            return 0
        req = self.loading[0]
        if req.ready >= 0:
            self.tier.unpin(req.nodes[req.cached:req.blocks])
            req.ready = -1
            self.register(req, req.held)
        n = self.tokens_for(req, budget)
        need = self.blocks_for(req.held + n) - req.blocks
        if n == 0 or need > self.num_free():
            return -1
        self.loading.popleft()
        self.grow(req, need, n)
        self.running.append(req)
        if req.admitted < 0:
            req.admitted = self.t
        work[req.rid] = n
        return n

    def store_pass(self, work: dict[int, int], before: int) -> None:
        """The scheduled requests offer the tier their newly full blocks: the newly admitted, the
        running, the resumed (vLLM's yield_req_data)."""
        added = self.running[before:]
        order = ([r for r in added if r.admitted == self.t] + self.running[:before]
                 + [r for r in added if r.admitted != self.t])
        for req in order:
            if req.rid in work:
                full = min(len(req.nodes), (req.held + work[req.rid]) // self.s.block_size)
                if full > req.stored:
                    batch, req.stored = req.nodes[req.stored:full], full
                    if self.tier.store(batch):
                        self.tier.touch(req.nodes[:full])

    def wait_for_load(self) -> None:
        """Nothing to run while loads are in flight: wait for the first to end or the next arrival."""
        later = [r.ready for r in self.loading if r.ready > self.t]
        if self.next_arrival < len(self.reqs):
            later.append(self.reqs[self.next_arrival].arrival)
        if not later:
            raise stalled()
        until = min(later)
        dt, shared = until - self.t, self.shared_slots()
        tokens = sum(r.held for r in self.loading) - shared
        alloc = sum(r.blocks for r in self.loading) * self.s.block_size - shared
        ext = self.s.tail_slots
        for key, value in (("time", 1), ("tokens", tokens), ("allocated", alloc), ("external", ext)):
            self.integrals[key] += value * dt
        waiting = len(self.waiting) + len(self.swapped) + len(self.loading)
        self.sampler.record(self.t, until, (0, waiting, tokens, 0, alloc - tokens, ext,
                                            self.s.slots - alloc - ext))
        self.t = until

    # -- phase 3: the step runs ------------------------------------------------------------------

    def external(self) -> int:
        if self.s.paged:
            return self.s.tail_slots
        if not self.waiting:
            return 0
        need = self.waiting[0].reserve
        if self.pool.num_free_slots < need:
            return 0  # a plain shortage, not fragmentation
        return sum(length for _, length in self.pool.free_runs() if length < need)

    def account(self, work: dict[int, int], dt: int) -> None:
        shared = self.shared_slots()
        tokens = sum(self.kept(r, r.held_after(work[r.rid]) if r.rid in work else r.held)
                     for r in self.running)
        tokens += sum(r.held for r in self.loading) - shared
        if self.s.paged:
            held = sum(r.blocks for r in self.running) + sum(r.blocks for r in self.loading)
            alloc, final = held * self.s.block_size - shared, 0
        else:
            alloc = sum(r.reserve for r in self.running)
            final = sum(r.prompt + r.output - 1 for r in self.running)  # the KV each ends holding
        ext, n = self.external(), len(self.running)
        for key, value in (("time", 1), ("running", n), ("tokens", tokens), ("allocated", alloc),
                           ("final", final), ("external", ext)):
            self.integrals[key] += value * dt
        self.peak = max(self.peak, n)
        reserved = final - tokens if not self.s.paged else 0
        internal = alloc - (final if not self.s.paged else tokens)
        waiting = len(self.waiting) + len(self.swapped) + len(self.loading)
        self.sampler.record(self.t, self.t + dt, (n, waiting, tokens, reserved, internal, ext,
                                                  self.s.slots - alloc - ext))

    def execute(self, work: dict[int, int], end: int) -> None:
        for req in list(self.running):
            if req.rid not in work:
                continue
            if self.s.speculative is not None and not req.prefilling:  # 1 + accepted drafts
                a = self.s.speculative.accepted(req.rid, req.generated, work[req.rid] - 1)
                a = min(a, req.output - req.generated - 1)
                req.held += 1 + a
                req.generated += a
            else:
                req.held = req.held_after(work[req.rid])
            if req.held < req.target:  # a prefill chunk that produced no token yet
                continue
            req.generated += 1
            if req.generated == 1:
                req.first_token = end
            if req.generated == req.output:
                req.finish = end
                self.running.remove(req)
                if self.s.paged:
                    self.release(req)
                if self.pool is not None:
                    self.pool.free(req.rid)

    def raw(self, clipped: int) -> RawRun:
        def col(name):
            return np.array([getattr(r, name) for r in self.reqs], dtype=np.int64)

        return RawRun(
            arrival=col("arrival"), admitted=col("admitted"), first_token=col("first_token"),
            finish=col("finish"), prompt=col("prompt"), output=col("output"),
            preemptions=col("preemptions"), clipped=clipped, steps=self.steps,
            preemptions_total=self.preemptions, swap_outs=self.swap_outs,
            recomputed_tokens=self.recomputed, peak_running=self.peak,
            t_origin=self.origin, t_end=self.t, integrals=dict(self.integrals),
            timeline=self.sampler.array(), timeline_delta=self.sampler.delta,
            prefix=None if self.blocks is None else self.blocks.stats(),
            hit_tokens=None if self.blocks is None else col("hit_tokens"),
            offload=None if self.tier is None else OffloadStats(
                **self.offload, blocks_stored=self.tier.blocks_stored, blocks_evicted=self.tier.blocks_evicted),
        )  # fmt: skip


def _block_nodes(ids) -> list[list[int]]:
    """Each request's block nodes (trie node x H/B + sub-block), spelled out block by block."""
    ends = np.cumsum(ids.counts).tolist()
    nodes = ids.nodes.tolist()
    return [[node * ids.per + sub for node in nodes[end - count:end] for sub in range(ids.per)]
            for end, count in zip(ends, ids.counts.tolist())]


def reference_sim(workload: Workload, allocator: AllocatorSpec,
                  timeline_points: int = TIMELINE_POINTS) -> tuple[ReferenceSim, int, bool]:
    """The reference simulator loaded with the workload's requests, not run yet; also the number
    of requests clipped and whether the API server delays them (their send ticks differ)."""
    setup = make_setup(workload, allocator)
    reqs, clipped = [], 0
    delayed = False
    for chunk in prepared_chunks(workload, setup):
        clipped += chunk.clipped
        sent = chunk.sent if chunk.sent is not None else chunk.arrival
        delayed |= chunk.sent is not None
        nodes = _block_nodes(chunk.ids) if chunk.ids is not None else [[] for _ in range(len(chunk))]
        preload = chunk.preload.tolist() if chunk.preload is not None else [0] * len(chunk)
        for i, (a, p, o, r, t) in enumerate(zip(chunk.arrival.tolist(), chunk.prompt.tolist(),
                                                chunk.output.tolist(), chunk.reserve.tolist(),
                                                sent.tolist())):
            reqs.append(Req(len(reqs), a, p, o, r, target=p, sent=t,
                            nodes=nodes[i], preload=preload[i]))
    return ReferenceSim(setup, reqs, timeline_points), clipped, delayed


def simulate_reference(workload: Workload, allocator: AllocatorSpec, *, progress=None,
                       record_requests: bool = False,
                       timeline_points: int = TIMELINE_POINTS) -> ServeResult:
    """Run the reference simulator: same signature and result as `engine.simulate`."""
    sim, clipped, delayed = reference_sim(workload, allocator, timeline_points)
    sim.run()
    reqs = sim.reqs
    if progress is not None:
        progress(len(reqs), len(reqs))
    raw = sim.raw(clipped)
    if delayed:
        from dataclasses import replace

        raw = replace(raw, sent=np.array([r.sent for r in reqs], dtype=np.int64))
    return build_result(raw, sim.s, record_requests=record_requests)
