"""The routers of a fleet (`router:` in a fleet file; kvplan/fleet/run.py runs them), one class per
name of the registry kvplan/workload/routing.ROUTERS.

`router: round_robin`, or a mapping `{policy: prefix_aware, sync_interval_s: 0.1, overlap_weight: 1.0}`
(each policy's own keys: kvplan/workload/routing.RouterSpec):
- round_robin: request i goes to replica i mod N (a Kubernetes Service, vLLM's production stack);
- random: uniformly, from the workload's seed (a baseline);
- least_outstanding: the replica with the fewest requests sent and not finished;
- least_kv: the replica with the smallest share of its KV blocks in use, counting the prompt
  blocks of what was sent since the last refresh;
- prefix_aware: NVIDIA Dynamo's KV-aware cost, overlap_weight x the prompt tokens a replica would
  have to prefill (beyond the longest prefix the router sent it before, by its own index of each
  replica's cache) + the KV tokens the replica holds; the cheapest wins. Cached prefix and load in
  one score, as llm-d's prefix-cache and load scorers weigh them too;
- llm_d: llm-d's inference scheduler, its weighted queue, KV-utilisation and prefix-cache scorers
  with an approximate or a precise prefix index (`LlmD`);
- sglang: SGLang's cache-aware router (`Sglang`);
- vllm_dp: vLLM's own load balancer over the data-parallel ranks of one server (`VllmDp`), whose
  ties go to the first rank as vLLM's do.

The routers that look at the replicas see them as they were at the last refresh (every
`sync_interval_s` of arrival time), plus what they sent since. Their ties go to a seeded random
choice among the tied replicas, as deployed routers break them (llm-d's scheduler picks at random
among the best-scored pods; Dynamo's KV router samples among equal costs): ties to the lowest index
would pile an idle fleet's requests onto replica 0 (8 replicas at low load got 241, 92, 40 ... 2).
vllm_dp alone takes the first of the tied ranks: vLLM's own balancer does.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from typing import Iterator

import numpy as np

from kvplan.errors import WorkloadError
from kvplan.sim.data_parallel import Balancer
from kvplan.workload.routing import MAX_PREFIX_BLOCKS, ROUTER_NAMES, RouterSpec

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
        step = self.spec.interval_s
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


class SentIndex:
    """A router's own record of the prompt blocks it sent each replica: block key (the chain of
    hash ids up to that block) -> bitmask of the replicas it went to, and per replica an LRU of its
    keys, of at most the capacity `remember` is given (as many blocks as the replica's KV holds)."""

    def __init__(self, n: int):
        self.holders: dict[int, int] = {}
        self.lru = [OrderedDict() for _ in range(n)]

    @staticmethod
    def keys(ids, blocks: int) -> list[int]:
        key, out = 0, []
        for h in ids[:blocks]:
            key = hash((key, h))
            out.append(key)
        return out

    def depths(self, keys: list[int]) -> dict[int, int]:
        """Dynamo's overlap: the replicas sent at least the first block of `keys`, each with how
        many leading blocks of them it was sent (every other replica: none)."""
        depth: dict[int, int] = {}
        live = self.holders.get(keys[0], 0) if keys else 0
        for d in range(1, len(keys)):
            nxt = live & self.holders.get(keys[d], 0)
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
        return depth

    def greedy_matches(self, keys: list[int], n: int) -> list[int]:
        """llm-d's approximate match (its matchLongestPrefix): walking the blocks in order while any
        replica holds the block, each replica counts the blocks it holds."""
        counts = [0] * n
        for k in keys:
            held = self.holders.get(k, 0)
            if not held:
                break
            while held:
                bit = held & -held
                counts[bit.bit_length() - 1] += 1
                held ^= bit
        return counts

    def remember(self, r: int, keys: list[int], capacity: int) -> None:
        lru, bit = self.lru[r], 1 << r
        for k in keys:
            if k in lru:
                lru.move_to_end(k)
                continue
            lru[k] = None
            self.holders[k] = self.holders.get(k, 0) | bit
            if len(lru) > capacity:
                old, _ = lru.popitem(last=False)
                left = self.holders[old] & ~bit
                if left:
                    self.holders[old] = left
                else:
                    del self.holders[old]


def _hash_capacity(replica, size: int) -> int:
    """The hash blocks of `size` tokens a replica's KV pool holds."""
    return max(1, replica.setup.num_blocks * replica.setup.block_size // max(size, 1))


def _min_max(values: list, *, lower_is_better: bool = False) -> list[float]:
    """Each value scaled to [0, 1] over the replicas, the best 1 (all 1 when they are equal), as
    llm-d's queue scorer normalises."""
    low, high = min(values), max(values)
    if high == low:
        return [1.0] * len(values)
    return [((high - v) if lower_is_better else (v - low)) / (high - low) for v in values]


def _min_max_of_holders(hits: list[int]) -> list[float]:
    """The precise prefix scorer's normalisation before May 2026: the index scores only the pods
    that hold the prompt's first block (llm-d-kv-cache-manager, pkg/kvcache/kvblock_scorer.go,
    LongestPrefixScorer: the pods of the first key, then their intersection key by key), and the
    scorer scales those to [0, 1] by their own min and max (1 when they hold alike), every other
    pod 0 (llm-d-inference-scheduler, pkg/plugins/scorer/utils.go, indexedScoresToNormalizedScoredPods
    at 5176573e, 2025-10-23). So a pod holding less of the prompt than another holder scores as a
    pod holding none: [20, 18, 0] blocks score [1, 0, 0], not [1, 0.9, 0]."""
    held = [h for h in hits if h > 0]
    if not held:
        return [0.0] * len(hits)
    low, high = min(held), max(held)
    if high == low:
        return [1.0 if h > 0 else 0.0 for h in hits]
    return [(h - low) / (high - low) if h > 0 else 0.0 for h in hits]


def _pick(values: list, target, draw: float) -> int:
    """The replica whose value is `target`; among several, the one a uniform `draw` picks."""
    if values.count(target) == 1:  # the usual case, without a scan in Python
        return values.index(target)
    return _drawn([r for r, v in enumerate(values) if v == target], draw)


def _drawn(tied: list[int], draw: float) -> int:
    """Of the tied replicas (in index order), the one a uniform `draw` picks."""
    return tied[0] if len(tied) == 1 else tied[int(draw * len(tied))]


class PrefixAware(Router):
    """NVIDIA Dynamo's KV-router cost: for each replica, overlap_weight x the prompt tokens it
    would have to prefill (those beyond the longest prefix the router sent it before) + the KV
    tokens it holds (in use at the last refresh, plus the prompts sent to it since); the cheapest
    wins, ties to a seeded random one of them. The index (SentIndex): the prompt blocks it sent
    each replica, as many as its pool holds, in the stream's hash blocks."""

    looks = True

    def __init__(self, spec, replicas, seed):
        super().__init__(spec, replicas, seed)
        self.index = SentIndex(self.n)

    def sync(self) -> None:
        self.held = [r.blocks_used * r.setup.block_size for r in self.replicas]

    def assign(self, chunk) -> np.ndarray:
        held, w = self.held, self.spec.overlap_weight
        out = np.empty(len(chunk), dtype=np.int64)
        size = chunk.hash_block_size
        draws = self.tie.random(len(chunk)).tolist()
        for i, p in enumerate(chunk.prompt_len.tolist()):
            keys = self.index.keys(chunk.hash_ids[i], p // max(size, 1)) if chunk.hash_ids is not None else []
            # A replica's cost is w x max(p - depth x size, 0) + held. One sent none of the prompt
            # costs w x p + held, and one sent part of it no more at the same held (w >= 0). So the
            # cheapest cost is w x p + the least held of all, or less at a replica sent part of the
            # prompt; the other replicas' costs are needed only for ties.
            deep = {r: w * max(p - d * size, 0) + held[r] for r, d in self.index.depths(keys).items()}
            base = w * p
            least = base + min(held)
            target = min(least, *deep.values()) if deep else least
            tied = sorted(r for r, c in deep.items() if c == target)
            if target == least:
                tied = sorted(tied + [r for r, h in enumerate(held) if r not in deep and base + h == target])
            best = _drawn(tied, draws[i])
            out[i] = best
            held[best] += p
            if keys:
                self.index.remember(best, keys, _hash_capacity(self.replicas[best], size))
        return out


class LlmD(Router):
    """llm-d's inference scheduler (llm-d/llm-d-inference-scheduler, its max-score picker over
    weighted scorers), each score in [0, 1] from the pods' metrics at the last refresh:
    - queue-scorer: (max waiting - waiting) / (max waiting - min waiting) over the replicas, 1 when
      all wait alike (vllm:num_requests_waiting);
    - kv-cache-utilization-scorer: 1 - the share of KV blocks in use (vllm:kv_cache_usage_perc);
    - active-request-scorer (weight active_request_weight): the requests sent a pod and not finished,
      counted by the scheduler itself as it picks (its inflight-load-producer), so fresh within a
      refresh too: 1 for an idle pod, else (most - its count) / most (llm-d-inference-scheduler,
      scorer/activerequest, idleThreshold 0, maxBusyScore 1);
    - prefix-cache-scorer, `index: approximate`: of the prompt's first max_prefix_tokens (256
      blocks of the first replica's block size unless set), the
      blocks this replica holds by the scheduler's own LRU of what it sent (its matchLongestPrefix:
      blocks counted while any replica holds one) / the blocks looked at; `index: precise`: the
      leading blocks the replica's cache holds now (vLLM's KV events), / the prompt's blocks
      (`prefix_score: ratio`) or min-max normalised over the replicas that hold its first block,
      the others 0 (`min_max`, _min_max_of_holders).
    The highest weighted sum wins; ties to a seeded random one of them."""

    looks = True

    def __init__(self, spec, replicas, seed):
        super().__init__(spec, replicas, seed)
        self.index = SentIndex(self.n) if spec.index == "approximate" else None
        # the prompt tokens the approximate index matches at most: the file's, or 256 blocks of the
        # block size the first pod reports (the plugin's getBlockSize reads pods[0]'s metrics)
        self.max_prefix = spec.max_prefix_tokens or MAX_PREFIX_BLOCKS * replicas[0].setup.block_size
        # the tokens the approximate index remembers per pod: lruCapacityPerServer blocks of the pod's
        # block size where the file sets it, else the pod's KV pool (_hash_capacity)
        self.lru_tokens = ([spec.lru_capacity_blocks * r.setup.block_size for r in replicas]
                           if spec.lru_capacity_blocks is not None else None)

    def sync(self) -> None:
        self.queue = _min_max([r.waiting for r in self.replicas], lower_is_better=True)
        self.free = [1.0 - r.blocks_used / max(r.setup.num_blocks, 1) for r in self.replicas]
        self.active = [r.outstanding for r in self.replicas]

    def _prefix(self, ids, prompt: int, size: int) -> tuple[list[float], list[int]]:
        """Each replica's prefix-cache score, and the block keys the approximate index is to
        remember for the replica chosen (none for the precise index)."""
        n, spec = self.n, self.spec
        if ids is None or size <= 0 or prompt < size:
            return [0.0] * n, []
        if self.index is not None:
            blocks = min(prompt // size, max(self.max_prefix // size, 1))
            keys = self.index.keys(ids, blocks)
            if not keys:  # hash ids shorter than the prompt's blocks
                return [0.0] * n, []
            return [c / len(keys) for c in self.index.greedy_matches(keys, n)], keys
        total = prompt // size
        hits = [min(r.cached_hash_blocks(ids[:total]), total) for r in self.replicas]
        return ([h / total for h in hits] if spec.prefix_score == "ratio" else _min_max_of_holders(hits)), []

    def assign(self, chunk) -> np.ndarray:
        spec, n = self.spec, self.n
        out = np.empty(len(chunk), dtype=np.int64)
        size = chunk.hash_block_size
        draws = self.tie.random(len(chunk)).tolist()
        wq, wk, wp, wa = spec.queue_weight, spec.kv_cache_weight, spec.prefix_weight, spec.active_request_weight
        base = [wq * q + wk * f for q, f in zip(self.queue, self.free)]
        active = self.active
        for i, p in enumerate(chunk.prompt_len.tolist()):
            ids = chunk.hash_ids[i] if chunk.hash_ids is not None else None
            prefix, keys = self._prefix(ids, p, size) if wp else ([0.0] * n, [])
            scores = [b + wp * x for b, x in zip(base, prefix)]
            if wa:
                most = max(active)
                scores = [s + wa * (1.0 if a <= 0 else (most - a) / most) for s, a in zip(scores, active)]
            best = _pick(scores, max(scores), draws[i])
            active[best] += 1
            out[i] = best
            if keys:
                capacity = (max(1, self.lru_tokens[best] // max(size, 1)) if self.lru_tokens is not None
                            else _hash_capacity(self.replicas[best], size))
                self.index.remember(best, keys, capacity)
        return out


class Sglang(Router):
    """SGLang's model gateway, its cache_aware policy: the loads are the requests it sent each
    replica and not finished. When max load - min load > balance_abs_threshold and max load >
    balance_rel_threshold x min load, the least loaded replica; else, by its radix tree of the
    prompts it sent (here its index of prompt blocks, as large as each replica's KV), the replica
    with the longest match when that covers more than cache_threshold of the prompt, and the least
    loaded otherwise. Ties to a seeded random one."""

    looks = True

    def __init__(self, spec, replicas, seed):
        super().__init__(spec, replicas, seed)
        self.index = SentIndex(self.n)

    def sync(self) -> None:
        self.load = [r.outstanding for r in self.replicas]

    def assign(self, chunk) -> np.ndarray:
        spec, load = self.spec, self.load
        out = np.empty(len(chunk), dtype=np.int64)
        size = chunk.hash_block_size
        draws = self.tie.random(len(chunk)).tolist()
        matches = self.tie.random(len(chunk)).tolist()
        for i, p in enumerate(chunk.prompt_len.tolist()):
            keys = (self.index.keys(chunk.hash_ids[i], p // size)
                    if chunk.hash_ids is not None and size > 0 else [])
            low, high = min(load), max(load)
            best = None
            if not (high - low > spec.balance_abs_threshold and high > spec.balance_rel_threshold * low) and keys:
                depth = self.index.depths(keys)
                top = max(depth.values(), default=0)
                if top * size > spec.cache_threshold * p:
                    tied = sorted(r for r, d in depth.items() if d == top)
                    best = _drawn(tied, matches[i])
            if best is None:
                best = _pick(load, low, draws[i])
            out[i] = best
            load[best] += 1
            if keys:
                self.index.remember(best, keys, _hash_capacity(self.replicas[best], size))
        return out


class VllmDp(Router):
    """vLLM's own load balancer over the data-parallel ranks of one `vllm serve --data-parallel-size
    D` (docs/serving/data_parallel_deployment.md: "This will work with both dense and MoE models";
    a dense model's ranks are independent engines, each with its own scheduler and KV cache, so a
    fleet of D replicas is exactly them; a MoE model's ranks step in lockstep: `parallel:` of a serve
    workload, kvplan/sim/data_parallel.py). The API server sends each request to the rank of least
    waiting x 4 + running over the counts the DP coordinator publishes every 100 ms (the router's
    refresh), each pick adding one to its rank's waiting until the next publication, and takes the
    FIRST rank on a tie (vllm/v1/engine/core_client.py, DPLBAsyncMPClient.get_core_engine_for_request:
    a scan from rank 0 with one API server): vLLM's rule, not a seeded random one, so an idle fleet's
    requests go to rank 0 until its count rises (the balancer is data_parallel.Balancer, shared with
    the lockstep engine)."""

    looks = True

    def __init__(self, spec, replicas, seed):
        super().__init__(spec, replicas, seed)
        self.balancer = Balancer(self.n, interval=0)

    def sync(self) -> None:
        self.balancer.publish((r.waiting, r.outstanding - r.waiting) for r in self.replicas)

    def assign(self, chunk) -> np.ndarray:
        choose = self.balancer.choose
        return np.array([choose() for _ in range(len(chunk))], dtype=np.int64)


IMPLEMENTATIONS = {"round_robin": RoundRobin, "random": Random, "least_outstanding": LeastOutstanding,
                   "least_kv": LeastKv, "prefix_aware": PrefixAware, "llm_d": LlmD, "sglang": Sglang,
                   "vllm_dp": VllmDp}
assert tuple(IMPLEMENTATIONS) == ROUTER_NAMES, "every router of the registry, and only those, is implemented here"


def make_router(spec: RouterSpec, replicas, seed: int) -> Router:
    """The router `spec` names, over `replicas` (Replica objects of kvplan/fleet/run.py)."""
    if not replicas:
        raise WorkloadError("a fleet needs at least one replica", field="replicas")
    return IMPLEMENTATIONS[spec.policy](spec, replicas, seed)
