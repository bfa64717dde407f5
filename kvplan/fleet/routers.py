"""The routers of a fleet (`router:` in a fleet file; kvplan/fleet/run.py runs them), one class per
name of the registry kvplan/workload/routing.ROUTERS.

`router: round_robin`, or a mapping `{policy: prefix_aware, sync_interval_s: 0.1, overlap_weight: 1.0}`:
- round_robin: request i goes to replica i mod N (a Kubernetes Service, vLLM's production stack);
- random: uniformly, from the workload's seed (a baseline);
- least_outstanding: the replica with the fewest requests sent and not finished (ties: the lowest
  index);
- least_kv: the replica with the smallest share of its KV blocks in use, counting the prompt
  blocks of what was sent since the last refresh;
- prefix_aware: NVIDIA Dynamo's KV-aware cost, overlap_weight x the prompt tokens a replica would
  have to prefill (beyond the longest prefix the router sent it before, by its own index of each
  replica's cache) + the KV tokens the replica holds; the cheapest wins. Cached prefix and load in
  one score, as llm-d's prefix-cache and load scorers weigh them too.

The routers that look at the replicas see them as they were at the last refresh (every
`sync_interval_s` of arrival time), plus what they sent since.
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


class LeastOutstanding(Router):
    looks = True

    def sync(self) -> None:
        self.heap = [(r.outstanding, i) for i, r in enumerate(self.replicas)]
        heapq.heapify(self.heap)

    def assign(self, chunk) -> np.ndarray:
        heap, out = self.heap, np.empty(len(chunk), dtype=np.int64)
        for i in range(len(chunk)):
            load, r = heap[0]  # the fewest outstanding, then the lowest index
            heapq.heapreplace(heap, (load + 1, r))
            out[i] = r
        return out


class LeastKv(Router):
    looks = True

    def sync(self) -> None:
        self.heap = [(r.blocks_used / max(r.setup.num_blocks, 1), i) for i, r in enumerate(self.replicas)]
        heapq.heapify(self.heap)

    def assign(self, chunk) -> np.ndarray:
        heap, out = self.heap, np.empty(len(chunk), dtype=np.int64)
        for i, p in enumerate(chunk.prompt_len.tolist()):
            used, r = heap[0]
            setup = self.replicas[r].setup
            heapq.heapreplace(heap, (used + -(-p // setup.block_size) / max(setup.num_blocks, 1), r))
            out[i] = r
        return out


class PrefixAware(Router):
    """NVIDIA Dynamo's KV-router cost: for each replica, overlap_weight x the prompt tokens it
    would have to prefill (those beyond the longest prefix the router sent it before) + the KV
    tokens it holds (in use at the last refresh, plus the prompts sent to it since); the cheapest
    wins, ties to the lowest index. The index: block key (the chain of hash ids up to that block)
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
            best, best_cost = 0, None
            for r in range(n):
                cost = w * max(p - depth[r] * size, 0) + held[r]
                if best_cost is None or cost < best_cost:
                    best, best_cost = r, cost
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
