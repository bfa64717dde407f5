"""The routers of a fleet (`router:` in a fleet file; kvplan/fleet/run.py runs them), one class per
name of the registry kvplan/workload/routing.ROUTERS.

`router: round_robin`, or a mapping `{policy: prefix_aware, sync_interval_s: 0.1, overlap_weight: 1.0}`:
- round_robin: request i goes to replica i mod N (a Kubernetes Service, vLLM's production stack);
- random: uniformly, from the workload's seed (a baseline);
- least_outstanding: the replica with the fewest requests sent and not finished;
- least_kv: the replica with the smallest share of its KV blocks in use, counting the prompt
  blocks of what was sent since the last refresh;
- prefix_aware: NVIDIA Dynamo's KV-aware cost, overlap_weight x the prompt tokens a replica would
  have to prefill (beyond the longest prefix the router sent it before, by its own index of each
  replica's cache) + the KV tokens the replica holds; the cheapest wins. Cached prefix and load in
  one score, as llm-d's prefix-cache and load scorers weigh them too.

The routers that look at the replicas see them as they were at the last refresh (every
`sync_interval_s` of arrival time), plus what they sent since. Their ties go to a seeded random
choice among the tied replicas, as deployed routers break them (llm-d's scheduler picks at random
among the best-scored pods; Dynamo's KV router samples among equal costs): ties to the lowest index
would pile an idle fleet's requests onto replica 0 (8 replicas at low load got 241, 92, 40 ... 2).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from typing import Iterator

import numpy as np

from kvplan.errors import WorkloadError
from kvplan.workload.routing import ROUTER_NAMES, RouterSpec

class Router:
    looks = False  # True: it reads the replicas' state, refreshed every sync interval

    def __init__(self, spec: RouterSpec, replicas, seed: int):
        self.spec, self.replicas, self.n = spec, replicas, len(replicas)
        self.sent = 0
        self.tie = np.random.default_rng([seed, 0x71E5])  # tie-breaking keys, apart from Random's draws

    def assign(self, chunk) -> np.ndarray:
        raise NotImplementedError

    def sync(self) -> None:
        pass

    def windows(self, chunk) -> Iterator:
        """The chunk cut at every multiple of the sync interval (of arrival time): (begin, end,
        the requests in between)."""
        step = self.spec.sync_interval_s
        marks = np.floor(np.asarray(chunk.arrival) / step)
        cuts = np.flatnonzero(np.diff(marks)) + 1
        for a, b in zip(np.concatenate(([0], cuts)).tolist(), np.concatenate((cuts, [len(chunk)])).tolist()):
            yield a, b, (chunk if a == 0 and b == len(chunk) else chunk.take(slice(a, b)))


class RoundRobin(Router):
    def assign(self, chunk) -> np.ndarray:
        out = (self.sent + np.arange(len(chunk))) % self.n
        self.sent += len(chunk)
        return out


class Random(Router):
    def __init__(self, spec, replicas, seed):
        super().__init__(spec, replicas, seed)
        self.rng = np.random.default_rng([seed, 0xF1EE7])

    def assign(self, chunk) -> np.ndarray:
        return self.rng.integers(0, self.n, size=len(chunk))


class _Least(Router):
    """The replica of the smallest load, a heap of (load, a random key, replica): every entry
    gets a fresh uniform key when it is pushed, so among the replicas of equal load each is the
    smallest key, the one chosen, with equal chance (a seeded random tie-break)."""

    looks = True

    def load_of(self, replica) -> float:
        raise NotImplementedError

    def added(self, replica, prompt: int) -> float:
        raise NotImplementedError

    def sync(self) -> None:
        keys = self.tie.random(self.n).tolist()
        self.heap = [(self.load_of(r), k, i) for i, (r, k) in enumerate(zip(self.replicas, keys))]
        heapq.heapify(self.heap)

    def assign(self, chunk) -> np.ndarray:
        heap, out, replicas = self.heap, np.empty(len(chunk), dtype=np.int64), self.replicas
        for i, (p, key) in enumerate(zip(chunk.prompt_len.tolist(), self.tie.random(len(chunk)).tolist())):
            load, _, r = heap[0]
            heapq.heapreplace(heap, (load + self.added(replicas[r], p), key, r))
            out[i] = r
        return out


class LeastOutstanding(_Least):
    def load_of(self, replica) -> float:
        return replica.outstanding

    def added(self, replica, prompt: int) -> float:
        return 1


class LeastKv(_Least):
    def load_of(self, replica) -> float:
        return replica.blocks_used / max(replica.setup.num_blocks, 1)

    def added(self, replica, prompt: int) -> float:
        setup = replica.setup
        return -(-prompt // setup.block_size) / max(setup.num_blocks, 1)


class PrefixAware(Router):
    """NVIDIA Dynamo's KV-router cost: for each replica, overlap_weight x the prompt tokens it
    would have to prefill (those beyond the longest prefix the router sent it before) + the KV
    tokens it holds (in use at the last refresh, plus the prompts sent to it since); the cheapest
    wins, ties to a seeded random one of them. The index: block key (the chain of hash ids up to that block)
    -> bitmask of the replicas holding it, and per replica an LRU of its keys as large as its
    pool, in the stream's hash blocks."""

    looks = True

    def __init__(self, spec, replicas, seed):
        super().__init__(spec, replicas, seed)
        self.holders: dict[int, int] = {}
        self.lru = [OrderedDict() for _ in replicas]
        self.capacity: list[int] | None = None

    def sync(self) -> None:
        self.held = [r.blocks_used * r.setup.block_size for r in self.replicas]

    def assign(self, chunk) -> np.ndarray:
        held, n, w = self.held, self.n, self.spec.overlap_weight
        out = np.empty(len(chunk), dtype=np.int64)
        size = chunk.hash_block_size
        if chunk.hash_ids is not None and self.capacity is None:
            self.capacity = [max(1, r.setup.num_blocks * r.setup.block_size // max(size, 1)) for r in self.replicas]
        everyone = (1 << n) - 1
        draws = self.tie.random(len(chunk)).tolist()
        for i, p in enumerate(chunk.prompt_len.tolist()):
            keys, depth = [], [0] * n
            if chunk.hash_ids is not None:
                key = 0
                for h in chunk.hash_ids[i][:p // max(size, 1)]:
                    key = hash((key, h))
                    keys.append(key)
                live = everyone
                for d, k in enumerate(keys):
                    nxt = live & self.holders.get(k, 0)
                    gone = live & ~nxt
                    while gone:
                        bit = gone & -gone
                        depth[bit.bit_length() - 1] = d
                        gone ^= bit
                    live = nxt
                    if not live:
                        break
                while live:
                    bit = live & -live
                    depth[bit.bit_length() - 1] = len(keys)
                    live ^= bit
            costs = [w * max(p - d * size, 0) + h for d, h in zip(depth, held)]
            low = min(costs)
            tied = [r for r, c in enumerate(costs) if c == low]
            best = tied[0] if len(tied) == 1 else tied[int(draws[i] * len(tied))]
            out[i] = best
            held[best] += p
            if keys:
                self._remember(best, keys)
        return out

    def _remember(self, r: int, keys: list[int]) -> None:
        lru, bit, cap = self.lru[r], 1 << r, self.capacity[r]
        for k in keys:
            if k in lru:
                lru.move_to_end(k)
                continue
            lru[k] = None
            self.holders[k] = self.holders.get(k, 0) | bit
            if len(lru) > cap:
                old, _ = lru.popitem(last=False)
                left = self.holders[old] & ~bit
                if left:
                    self.holders[old] = left
                else:
                    del self.holders[old]


IMPLEMENTATIONS = {"round_robin": RoundRobin, "random": Random, "least_outstanding": LeastOutstanding,
                   "least_kv": LeastKv, "prefix_aware": PrefixAware}
assert tuple(IMPLEMENTATIONS) == ROUTER_NAMES, "every router of the registry, and only those, is implemented here"


def make_router(spec: RouterSpec, replicas, seed: int) -> Router:
    """The router `spec` names, over `replicas` (Replica objects of kvplan/fleet/run.py)."""
    if not replicas:
        raise WorkloadError("a fleet needs at least one replica", field="replicas")
    return IMPLEMENTATIONS[spec.policy](spec, replicas, seed)
