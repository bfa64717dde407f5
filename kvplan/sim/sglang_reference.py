"""SGLang's scheduler step by step: slow, plain, and the definition of the semantics that the fast
kernel (kernel.py's sg_* functions, driven by kvplan/sim/sglang.py) reproduces to the byte.

kvplan/sim/sglang.py's docstring states every rule and the SGLang source it comes from; this
module is those rules written out with lists, sets and Python floats, one scheduler iteration at
a time (`step`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvplan.memory.prefix_cache import PrefixCacheStats
from kvplan.model.sglang_memory import draft_tokens
from kvplan.model.step_time import prefill_pairs
from kvplan.sim.inputs import SimSetup, make_setup, prepared_chunks
from kvplan.sim.metrics import RawRun, ServeResult, build_result
from kvplan.sim.sampling import TIMELINE_POINTS, TimelineSampler
from kvplan.sim.sglang import (CLIP_MAX_NEW_TOKENS, IN_BATCH_CHECK, IN_BATCH_DEPRIORITIZE, LPM_QUEUE_LIMIT,
                               RETRACT_DECODE_STEPS, new_token_ratios, stalled_sglang)
from kvplan.workload.records import Workload
from kvplan.workload.spec import AllocatorSpec


@dataclass(slots=True)
class SReq:
    rid: int
    arrival: int
    prompt: int
    output: int
    nodes: list = field(default_factory=list)  # its identity blocks' trie nodes, root first
    sent: int = -1
    generated: int = 0
    held: int = 0  # tokens whose KV is computed (from the tree or its own)
    target: int = 0  # tokens its prefill must reach: the prompt, or prompt + generated after a retraction
    shared: int = 0  # of `held`, the tokens that live in radix tree nodes (the rest are its own)
    locked: int = 0  # leading nodes of `nodes` it holds a lock on
    match: int = 0  # tokens the tree holds of its prompt, as the last match found (lpm's key)
    admitted: int = -1
    first_token: int = -1
    finish: int = -1
    preemptions: int = 0
    hit_tokens: int = 0
    done: bool = False


class SglangReference:
    def __init__(self, setup: SimSetup, reqs: list[SReq], per: int, num_nodes: int, parent: list[int],
                 timeline_points: int):
        g = setup.sglang
        self.s, self.g, self.clock, self.reqs = setup, g, setup.clock, reqs
        self.H = per
        self.radix = setup.prefix_caching
        self.policy = g.schedule_policy if self.radix else "fcfs"  # SchedulePolicy: no tree, no lpm
        self.init_ratio, self.min_ratio, self.decay = new_token_ratios(g.schedule_conservativeness)
        self.ratio = self.init_ratio
        self.spec = setup.speculative
        # check_decode_mem's tokens per request: decode_mem_cache_buf_multiplier, with speculative
        # decoding (topk 1) num_draft_tokens + topk x num_steps = 2k + 1
        self.buffer = 1 if self.spec is None else draft_tokens(self.spec.k)
        self.max_running = g.max_running_requests
        self.chunk = g.chunked_prefill_size if g.chunked_prefill_size > 0 else None
        self.free = setup.slots
        self.evictable = 0
        self.cached = [False] * num_nodes
        self.lock = [0] * num_nodes
        self.stamp = [0] * num_nodes
        self.kids = [0] * num_nodes
        self.parent = parent
        self.leaves: set[int] = set()  # evictable leaves: cached, no cached child, unlocked
        self.clock_stamp = 0
        self.mark = [0] * num_nodes
        self.pass_id = 0
        self.waiting: list[SReq] = []
        self.running: list[SReq] = []  # the decode batch; finished requests stay until filtered
        self.chunked: SReq | None = None
        self.batch_full = False
        self.next_arrival = 0
        self.t = reqs[0].arrival if reqs else 0
        self.origin = self.t
        self.steps = self.preemptions = self.recomputed = self.peak = 0
        self.demotions = self.chunks = self.reorders = 0  # what the tests check the random runs exercise
        self.stats = dict.fromkeys(("lookups", "query", "hit", "saved", "evicted", "reused"), 0)
        self.integrals = dict.fromkeys(("time", "running", "tokens", "allocated", "final", "external"), 0)
        self.sampler = TimelineSampler(self.origin, setup.clock, timeline_points)

    # -- the radix tree ----------------------------------------------------------------------------

    def touch_path(self, nodes) -> None:
        for node in nodes:
            self.clock_stamp += 1
            self.stamp[node] = self.clock_stamp

    def hits(self, r: SReq) -> int:
        k = 0
        while k < len(r.nodes) and self.cached[r.nodes[k]]:
            k += 1
        return k

    def lock_node(self, node: int) -> None:
        if self.lock[node] == 0:
            self.evictable -= self.H
            self.leaves.discard(node)
        self.lock[node] += 1

    def unlock_node(self, node: int) -> None:
        self.lock[node] -= 1
        if self.lock[node] == 0:
            self.evictable += self.H
            if self.kids[node] == 0:
                self.leaves.add(node)

    def evict(self, n: int) -> None:
        evicted = 0
        while evicted < n and self.leaves:
            x = min(self.leaves, key=lambda node: self.stamp[node])
            self.leaves.remove(x)
            self.cached[x] = False
            self.free += self.H
            self.evictable -= self.H
            evicted += self.H
            self.stats["evicted"] += self.H
            p = self.parent[x]
            if p >= 0:
                self.kids[p] -= 1
                if self.kids[p] == 0 and self.lock[p] == 0:
                    self.leaves.add(p)

    def evict_if_needed(self, n: int) -> None:
        if self.free < n:
            self.evict(n)

    def insert(self, r: SReq) -> None:
        """cache_unfinished_req / cache_finished_req: its computed identity blocks join the tree
        (a block another request inserted first is freed as a duplicate); the path is touched."""
        if not self.radix:
            return
        H = self.H
        if r.shared < r.locked * H <= r.held:  # the tokens recomputed after a match cut short
            self.free += r.locked * H - r.shared
            r.shared = r.locked * H
        j = r.locked
        while j < len(r.nodes) and (j + 1) * H <= r.held:
            node = r.nodes[j]
            if self.cached[node]:
                self.free += H
            else:
                self.cached[node] = True
                self.evictable += H  # unlocked for an instant: lock_node takes it off again
                p = self.parent[node]
                if p >= 0:
                    self.kids[p] += 1
                    self.leaves.discard(p)
                self.leaves.add(node)
            self.lock_node(node)
            r.shared += H
            j += 1
        r.locked = j
        self.touch_path(r.nodes[:j])

    def release(self, r: SReq) -> None:
        """Its own tokens go back to the pool; its path is unlocked (evictable from now on)."""
        self.free += r.held - r.shared
        for node in reversed(r.nodes[:r.locked]):
            self.unlock_node(node)
        r.locked = r.shared = 0

    # -- the loop ----------------------------------------------------------------------------------

    def run(self) -> None:
        while self.advance():
            pass

    def advance(self) -> bool:
        reqs = self.reqs
        while self.next_arrival < len(reqs) and reqs[self.next_arrival].arrival <= self.t:
            self.waiting.append(reqs[self.next_arrival])
            self.next_arrival += 1
        batch = self.prefill_batch()
        if batch:
            self.prefill_step(batch)
            return True
        if any(not r.done for r in self.running):
            self.decode_step()
            return True
        stale = bool(self.running)  # only finished requests left: update_running_batch filters them
        self.running = []
        self.batch_full = False
        self.ratio = self.init_ratio  # the event loop's idle branch
        if stale:
            return True  # an iteration that runs nothing; the next one may prefill
        if self.next_arrival >= len(reqs):
            if self.waiting or self.chunked is not None:
                raise stalled_sglang()
            return False
        self.idle_until(reqs[self.next_arrival].arrival)
        return True

    def idle_until(self, until: int) -> None:
        dt = until - self.t
        if dt <= 0:
            raise stalled_sglang()
        self.integrals["time"] += dt
        self.sampler.record(self.t, until, (0, len(self.waiting), 0, 0, 0, 0, self.s.slots))
        self.t = until

    # -- get_new_batch_prefill ---------------------------------------------------------------------

    def calc_priority(self) -> None:
        if self.policy != "lpm" or len(self.waiting) > LPM_QUEUE_LIMIT:
            return
        self.pass_id += 1
        demoted = set()
        for r in self.waiting:
            k = self.hits(r)
            self.touch_path(r.nodes[:k])
            r.match = k * self.H
            if r.match <= IN_BATCH_CHECK:
                m = 0
                while m < len(r.nodes) and self.mark[r.nodes[m]] == self.pass_id:
                    m += 1
                if m * self.H >= IN_BATCH_DEPRIORITIZE:
                    demoted.add(r.rid)
                else:
                    for node in r.nodes:
                        self.mark[node] = self.pass_id
        before = [r.rid for r in self.waiting]
        self.waiting.sort(key=lambda r: float("inf") if r.rid in demoted else -r.match)
        self.demotions += len(demoted)
        self.reorders += [r.rid for r in self.waiting] != before

    def prefill_batch(self) -> list[tuple[SReq, int]]:
        if (self.batch_full or not self.waiting) and self.chunked is None:
            return []
        running_bs = len(self.running)
        if running_bs >= self.max_running:
            self.batch_full = True
            return []
        self.calc_priority()
        offset = 0.0
        for r in self.running:
            offset += min(r.output - r.generated, CLIP_MAX_NEW_TOKENS) * self.ratio
        self.total_offset, self.cur_offset = offset, 0
        self.rem_input = self.g.max_prefill_tokens
        self.rem_chunk = self.chunk
        batch: list[tuple[SReq, int]] = []
        new_chunked = None
        if self.chunked is not None:
            r = self.chunked
            ext = r.target - r.held
            limit = min(self.rem_chunk, int(self.rem_total()))
            if limit > 0:
                truncated = ext > limit
                n = min(ext, limit)
                batch.append((r, n))
                self.prefill_one(n, 0 if truncated else min(r.output - r.generated, CLIP_MAX_NEW_TOKENS))
                if not truncated:
                    self.chunked = None
        for r in self.waiting:
            if running_bs + len(batch) >= self.max_running:
                self.batch_full = True
                break
            result, n = self.add_one(r, bool(batch))
            if n > 0:
                batch.append((r, n))
                if n < r.target - r.held:
                    new_chunked = r
            if result == "continue":
                continue
            if result == "no_token":
                self.batch_full = True
            break
        if not batch:
            return []
        admitted = {r.rid for r, _ in batch}
        self.waiting = [r for r in self.waiting if r.rid not in admitted]
        if new_chunked is not None:
            self.chunked = new_chunked
        total = sum(n for _, n in batch)
        self.evict_if_needed(total)
        if self.free < total:
            raise stalled_sglang()
        self.free -= total
        return batch

    def rem_total(self) -> float:
        return self.free + self.evictable - self.total_offset

    def prefill_one(self, ext: int, max_new: int) -> None:
        self.total_offset += ext + max_new
        self.cur_offset += ext
        self.rem_input -= ext
        if self.rem_chunk is not None:
            self.rem_chunk -= ext

    def budget_state(self) -> str:
        if self.rem_total() <= 0 or self.free + self.evictable - self.cur_offset <= 0:
            return "no_token"
        if self.rem_input <= 0 or (self.rem_chunk is not None and self.rem_chunk <= 0):
            return "other"
        return "continue"

    def add_one(self, r: SReq, others: bool) -> tuple[str, int]:
        """PrefillAdder.add_one_req: (the verdict for the next candidate, tokens r prefills now)."""
        H = self.H
        k = self.hits(r) if self.radix else 0
        m = min(k * H, r.target - 1)
        k = -(-m // H) if m > 0 else 0
        self.touch_path(r.nodes[:k])
        ext = r.target - m
        total = ext + min(r.output - r.generated, CLIP_MAX_NEW_TOKENS)
        if total >= self.rem_total():
            return "no_token", 0
        if ext > self.rem_input and others:
            return "other", 0
        unheld = sum(H for node in r.nodes[:k] if self.lock[node] == 0)
        if total > self.rem_total() - unheld:
            return "no_token", 0
        if self.rem_chunk is None or ext <= self.rem_chunk:
            n, max_new = ext, min(r.output - r.generated, CLIP_MAX_NEW_TOKENS)
        else:
            n, max_new = self.rem_chunk, 0
            if n <= 0:
                return "other", 0
        for j, node in enumerate(r.nodes[:k]):
            if self.lock[node] == 0:
                self.stats["reused"] += min(H, m - j * H)
            self.lock_node(node)
        r.held = r.shared = m
        r.locked = k
        self.stats["saved"] += m
        if r.admitted < 0:
            r.admitted = self.t
            r.hit_tokens = m
            self.stats["lookups"] += 1
            self.stats["query"] += r.prompt
            self.stats["hit"] += m
        self.prefill_one(n, max_new)
        return self.budget_state(), n

    # -- the steps ---------------------------------------------------------------------------------

    def prefill_step(self, batch: list[tuple[SReq, int]]) -> None:
        kv = sum(self.s.kv_read(r.held) for r, _ in batch)
        tokens = sum(n for _, n in batch)
        pairs = sum(prefill_pairs(n, r.held) for r, n in batch)
        if self.spec is None:
            dt = self.clock.step_ticks(kv, tokens, len(batch), pairs)
        else:
            dt = self.spec.sglang_step_ticks(self.clock, kv, tokens, len(batch), pairs, 0, 0)
        self.account(len(batch), dt)
        end = self.t + dt
        shrunk = False
        for r, n in batch:
            r.held += n
            if r.held < r.target:  # the chunked request: cached so far, kept out of the running batch
                self.chunks += 1
                self.insert(r)
                shrunk = True
                continue
            r.generated += 1
            if r.generated == 1:
                r.first_token = end
            if r.generated == r.output:
                self.finish(r, end)
                shrunk = True
            else:
                self.insert(r)
                self.running.append(r)
        if shrunk:
            self.batch_full = False
        self.t = end
        self.steps += 1

    def finish(self, r: SReq, end: int) -> None:
        r.finish = end
        r.done = True
        self.insert(r)
        self.release(r)

    def decode_step(self) -> None:
        initial = len(self.running)
        self.running = [r for r in self.running if not r.done]
        n = len(self.running)
        self.evict_if_needed(n * self.buffer)  # check_decode_mem
        if self.free < n * self.buffer:
            self.retract()
        else:
            self.ratio = max(self.ratio - self.decay, self.min_ratio)
        if len(self.running) < initial:
            self.batch_full = False
        n = len(self.running)
        self.evict_if_needed(n * self.buffer)
        if self.free < n * self.buffer:
            raise stalled_sglang()
        kv = sum(self.s.kv_read(r.held) for r in self.running)
        if self.spec is None:
            dt = self.clock.step_ticks(kv, n, n, 0)
        else:
            dt = self.spec.sglang_step_ticks(self.clock, kv, n * (1 + self.spec.k), n, 0, n, kv)
        for r in self.running:
            # the drafts the step accepts (drawn as vLLM's engine draws them), at most what the
            # output has left after the step's own token
            a = 0 if self.spec is None else min(self.spec.accepted(r.rid, r.generated, self.spec.k),
                                                r.output - r.generated - 1)
            r.held += 1 + a
            r.generated += a
            self.free -= 1 + a
        self.account(n, dt)
        end = self.t + dt
        for r in self.running:
            r.generated += 1
            if r.generated == r.output:
                self.finish(r, end)
        self.t = end
        self.steps += 1

    def retract(self) -> None:
        """ScheduleBatch.retract_decode: fewest outputs first (then the longest prompt), until the
        free pool holds RETRACT_DECODE_STEPS tokens for each request left, at least one. With
        speculative decoding the batch keeps its order (the last retracted first) and each request
        left needs the drafts' headroom too (topk x num_steps + num_draft_tokens = 2k + 1)."""
        order = list(range(len(self.running)))
        if self.spec is None:
            order.sort(key=lambda i: (self.running[i].generated, -self.running[i].prompt), reverse=True)
        need = RETRACT_DECODE_STEPS + (0 if self.spec is None else self.buffer)
        retracted = []
        first = True
        while self.free < need * len(order) or first:
            if len(order) == 1:
                break
            first = False
            r = self.running[order.pop()]
            retracted.append(r)
            self.recomputed += r.held
            self.release(r)
            r.held = 0
            r.target = r.prompt + r.generated
            r.preemptions += 1
            self.preemptions += 1
            self.evict_if_needed(RETRACT_DECODE_STEPS * len(order))
        self.running = [self.running[i] for i in order]
        decoded = sum(r.generated for r in self.running)
        wanted = sum(r.output for r in self.running)
        self.ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(self.running)) / wanted)
        self.waiting.extend(retracted)

    def account(self, n: int, dt: int) -> None:
        used = self.s.slots - self.free - self.evictable
        for key, value in (("time", 1), ("running", n), ("tokens", used), ("allocated", used)):
            self.integrals[key] += value * dt
        self.peak = max(self.peak, n)
        self.sampler.record(self.t, self.t + dt, (n, len(self.waiting), used, 0, 0, 0, self.s.slots - used))

    def raw(self, clipped: int) -> RawRun:
        def col(name):
            return np.array([getattr(r, name) for r in self.reqs], dtype=np.int64)

        st = self.stats
        return RawRun(
            arrival=col("arrival"), admitted=col("admitted"), first_token=col("first_token"),
            finish=col("finish"), prompt=col("prompt"), output=col("output"),
            preemptions=col("preemptions"), clipped=clipped, steps=self.steps,
            preemptions_total=self.preemptions, swap_outs=0, recomputed_tokens=self.recomputed,
            peak_running=self.peak, t_origin=self.origin, t_end=self.t, integrals=dict(self.integrals),
            timeline=self.sampler.array(), timeline_delta=self.sampler.delta,
            prefix=PrefixCacheStats(st["lookups"], st["query"], st["hit"], st["saved"], st["evicted"], st["reused"])
            if self.radix else None,
            hit_tokens=col("hit_tokens") if self.radix else None,
        )  # fmt: skip


def sglang_reference(workload: Workload, allocator: AllocatorSpec,
                     timeline_points: int = TIMELINE_POINTS) -> tuple[SglangReference, int, bool]:
    """The reference loaded with the workload's requests, not run yet; the requests clipped; and
    whether the API server delays them."""
    setup = make_setup(workload, allocator)
    reqs, clipped, delayed, per, parent = [], 0, False, 1, {}
    for chunk in prepared_chunks(workload, setup):
        clipped += chunk.clipped
        sent = chunk.sent if chunk.sent is not None else chunk.arrival
        delayed |= chunk.sent is not None
        paths = [[] for _ in range(len(chunk))]
        if chunk.ids is not None:
            per = chunk.ids.per
            nodes, start = chunk.ids.nodes.tolist(), 0
            for i, count in enumerate(chunk.ids.counts.tolist()):
                paths[i] = nodes[start:start + count]
                start += count
                for j, node in enumerate(paths[i]):
                    parent[node] = paths[i][j - 1] if j else -1
        for i, (a, p, o, t) in enumerate(zip(chunk.arrival.tolist(), chunk.prompt.tolist(), chunk.output.tolist(),
                                             sent.tolist())):
            reqs.append(SReq(len(reqs), a, p, o, nodes=paths[i], sent=t, target=p))
    num_nodes = max(parent) + 1 if parent else 0
    parents = [parent.get(node, -1) for node in range(num_nodes)]
    return SglangReference(setup, reqs, per, num_nodes, parents, timeline_points), clipped, delayed


def simulate_sglang_reference(workload: Workload, allocator: AllocatorSpec, *, record_requests: bool = False,
                              timeline_points: int = TIMELINE_POINTS) -> ServeResult:
    """Run the reference: the same result as the kernel's (kvplan/sim/sglang_state.py)."""
    sim, clipped, delayed = sglang_reference(workload, allocator, timeline_points)
    sim.run()
    raw = sim.raw(clipped)
    if delayed:
        from dataclasses import replace

        raw = replace(raw, sent=np.array([r.sent for r in sim.reqs], dtype=np.int64))
    return build_result(raw, sim.s, record_requests=record_requests)
