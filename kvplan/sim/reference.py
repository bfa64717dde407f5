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
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from kvplan.memory.contiguous import ContiguousPool
from kvplan.model.step_time import prefill_pairs
from kvplan.sim.inputs import SimSetup, make_setup, prepared_chunks
from kvplan.sim.metrics import RawRun, ServeResult, build_result
from kvplan.sim.sampling import TIMELINE_POINTS, TimelineSampler
from kvplan.workload.records import AllocatorSpec, Workload


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
        self.cpu_used = 0
        self.t = reqs[0].arrival if reqs else 0
        self.origin = self.t
        self.steps = self.preemptions = self.swap_outs = self.recomputed = self.peak = 0
        self.integrals = dict.fromkeys(("time", "running", "tokens", "allocated", "final",
                                        "external"), 0)
        self.sampler = TimelineSampler(self.origin, setup.clock, timeline_points)

    # -- the loop --------------------------------------------------------------------------------

    def run(self) -> None:
        while True:
            reqs = self.reqs
            while self.next_arrival < len(reqs) and reqs[self.next_arrival].arrival <= self.t:
                self.waiting.append(reqs[self.next_arrival])
                self.next_arrival += 1
            if self.running or self.waiting or self.swapped:
                self.step()
            elif self.next_arrival < len(self.reqs):
                self.idle_until(self.reqs[self.next_arrival].arrival)
            else:
                return

    def idle_until(self, until: int) -> None:
        dt = until - self.t
        ext = self.s.tail_slots
        self.integrals["time"] += dt
        self.integrals["external"] += ext * dt
        self.sampler.record(self.t, until, (0, 0, 0, 0, 0, ext, self.s.slots - ext))
        self.t = until

    def step(self) -> None:
        work: dict[int, int] = {}  # rid -> tokens this step
        budget, preempted = self.schedule_running(work)
        if not preempted:
            budget = self.resume_swapped(work, budget)
            if not self.swapped:
                self.admit(work, budget)
        by_id = {r.rid: r for r in self.running}
        kv_read = sum(by_id[rid].held for rid in work)
        pairs = sum(prefill_pairs(n, by_id[rid].held) for rid, n in work.items() if by_id[rid].prefilling)
        dt = self.clock.step_ticks(kv_read, sum(work.values()), len(work), pairs)
        self.account(work, dt)
        self.execute(work, self.t + dt)
        self.t += dt
        self.steps += 1

    # -- phase 1: running requests ---------------------------------------------------------------

    def tokens_for(self, req: Req, budget: int) -> int:
        if not req.prefilling:
            return 1 if budget >= 1 else 0
        rest = req.target - req.held
        if self.sched.chunked_prefill:
            return min(rest, budget)
        return rest if rest <= budget else 0

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.s.block_size)

    def schedule_running(self, work: dict[int, int]) -> tuple[int, bool]:
        budget, preempted, i = self.sched.max_num_batched_tokens, False, 0
        while i < len(self.running):
            req = self.running[i]
            n = self.tokens_for(req, budget)
            if n == 0:
                i += 1
                continue
            need = self.blocks_for(req.held_after(n)) - req.blocks if self.s.paged else 0
            while need > self.free_blocks:
                victim = self.running.pop()
                assert victim.rid not in work
                self.preempt(victim)
                preempted = True
                if victim is req:
                    break
            else:
                self.free_blocks -= need
                req.blocks += need
                work[req.rid] = n
                budget -= n
                i += 1
        return budget, preempted

    def preempt(self, victim: Req) -> None:
        self.free_blocks += victim.blocks
        victim.preemptions += 1
        self.preemptions += 1
        size = victim.blocks * self.s.block_size
        if self.sched.preemption == "swap" and self.cpu_used + size <= self.sched.swap_slots:
            self.cpu_used += size
            self.swap_outs += 1
            self.swapped.append(victim)
            return
        self.recomputed += victim.held
        victim.held, victim.blocks = 0, 0
        victim.target = victim.prompt + victim.generated
        self.waiting.appendleft(victim)

    # -- phase 2: swapped and waiting requests ---------------------------------------------------

    def resume_swapped(self, work: dict[int, int], budget: int) -> int:
        while self.swapped and len(self.running) < self.sched.max_num_seqs:
            req = self.swapped[0]
            n = self.tokens_for(req, budget)
            need = self.blocks_for(req.held_after(n))
            if n == 0 or need > self.free_blocks:
                break
            self.swapped.popleft()
            self.cpu_used -= req.blocks * self.s.block_size
            self.free_blocks -= need
            req.blocks = need
            self.running.append(req)
            work[req.rid] = n
            budget -= n
        return budget

    def place(self, req: Req, tokens: int) -> bool:
        """Give a newly admitted request its memory; False (and nothing changed) if it cannot."""
        if self.s.paged:
            need = self.blocks_for(tokens)
            if need > self.free_blocks:
                return False
            self.free_blocks -= need
            req.blocks = need
            return True
        return self.pool.allocate(req.rid, req.reserve) is not None

    def admit(self, work: dict[int, int], budget: int) -> None:
        while self.waiting and len(self.running) < self.sched.max_num_seqs:
            req = self.waiting[0]
            n = self.tokens_for(req, budget)
            if n == 0 or not self.place(req, req.held_after(n)):
                break
            self.waiting.popleft()
            self.running.append(req)
            if req.admitted < 0:
                req.admitted = self.t
            work[req.rid] = n
            budget -= n

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
        tokens = sum(r.held_after(work[r.rid]) if r.rid in work else r.held for r in self.running)
        if self.s.paged:
            alloc, final = sum(r.blocks for r in self.running) * self.s.block_size, 0
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
        waiting = len(self.waiting) + len(self.swapped)
        self.sampler.record(self.t, self.t + dt, (n, waiting, tokens, reserved, internal, ext,
                                                  self.s.slots - alloc - ext))

    def execute(self, work: dict[int, int], end: int) -> None:
        for req in list(self.running):
            if req.rid not in work:
                continue
            req.held = req.held_after(work[req.rid])
            if req.held < req.target:  # a prefill chunk that produced no token yet
                continue
            req.generated += 1
            if req.generated == 1:
                req.first_token = end
            if req.generated == req.output:
                req.finish = end
                self.running.remove(req)
                self.free_blocks += req.blocks
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
        )  # fmt: skip


def simulate_reference(workload: Workload, allocator: AllocatorSpec, *, progress=None,
                       record_requests: bool = False,
                       timeline_points: int = TIMELINE_POINTS) -> ServeResult:
    """Run the reference simulator: same signature and result as `engine.simulate`."""
    setup = make_setup(workload, allocator)
    reqs, clipped = [], 0
    delayed = False
    for chunk in prepared_chunks(workload, setup):
        clipped += chunk.clipped
        sent = chunk.sent if chunk.sent is not None else chunk.arrival
        delayed |= chunk.sent is not None
        for a, p, o, r, t in zip(chunk.arrival.tolist(), chunk.prompt.tolist(),
                                 chunk.output.tolist(), chunk.reserve.tolist(), sent.tolist()):
            reqs.append(Req(len(reqs), a, p, o, r, target=p, sent=t))
    sim = ReferenceSim(setup, reqs, timeline_points)
    sim.run()
    if progress is not None:
        progress(len(reqs), len(reqs))
    raw = sim.raw(clipped)
    if delayed:
        from dataclasses import replace

        raw = replace(raw, sent=np.array([r.sent for r in reqs], dtype=np.int64))
    return build_result(raw, setup, record_requests=record_requests)
