"""Prefix caching over a request stream: trace replay with block hashes, hit-rate sweeps, and
synthetic shared prefixes (system prompts, multi-turn conversations).

Replay model (`replay_prefix_cache`): requests are taken in arrival order (times are ignored) into
a PrefixCachingBlockManager of `num_blocks` blocks of `block_size` tokens. Each request looks up
its prompt blocks, takes new blocks for the rest (evicting least recently freed cached blocks) and
holds them for its lifetime; `max_running` requests hold blocks at once, and the oldest finishes
(frees) when a newer one needs its slot or its blocks, first in, first out. `max_running=1` (the
default) runs each request to completion before the next: a pure LRU cache replay of the prompt
blocks, which is what Mooncake's trace analysis (FAST'25) does. With `hold_output=True` a request
also holds blocks for its output tokens but the last (whose KV is never computed: it ends holding
prompt + output - 1, as in the serve engine; unique to it, never cached). A prompt that needs
more blocks than the whole pool is skipped and counted, not replayed. The serve engine with
prefix caching and one request at a time (max_num_seqs 1) finds the same hits
(tests/test_sim_prefix_serve.py).

Block identities: a trace gives one hash id per `hash_block_size` (H) prompt tokens. When the
simulated block size B divides H, trace block j covers simulated blocks j*H/B .. (j+1)*H/B - 1,
whose identities are (hash id, sub-index), encoded as the int hash_id * (H/B) + sub-index. Only
full trace blocks count: a partial last trace block (Mooncake's) and every token past the last id
are unique to their request. A B that does not divide H is a KvplanError. The cache chains
identities from the first block, so equal ids only match behind equal prefixes.

Synthetic prefixes (`PrefixSpec`, `with_prefixes`) live in kvplan/workload/prefixes.py, since
the serve engine reads them too.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Sequence

import numpy as np

from kvplan.errors import KvplanError
from kvplan.memory.paged import OutOfBlocks
from kvplan.memory.prefix_cache import PrefixCachingBlockManager, PrefixCacheStats
from kvplan.workload.prefixes import blocks_per_hash
from kvplan.workload.chunks import RequestChunk

def prompt_block_ids(hash_ids: Sequence[int] | None, prompt_len: int, hash_block_size: int,
                     block_size: int) -> list:  # fmt: skip
    """Identities of the full simulated blocks of a prompt described by trace hash ids.

    Trace block j (hash id h) covers simulated blocks j*k .. j*k + k - 1, k = H / B, whose
    identities are h * k + sub-index (a one-to-one code of (h, sub-index)). The replay passes
    hash ids to the cache as runs instead (same result); this is the reference spelled out.
    """
    if not hash_ids:
        return []
    per = blocks_per_hash(hash_block_size, block_size)
    ids = np.asarray(hash_ids[: prompt_len // hash_block_size], dtype=np.int64)
    return (ids[:, None] * per + np.arange(per)).ravel().tolist()


@dataclass(frozen=True, slots=True)
class PrefixReplayResult:
    """One replay: the pool, the model, and the cache's counters (kvplan/memory/prefix_cache.py
    names them; nothing is admitted twice, so prefill_tokens_saved = hit_tokens).

    requests: replayed; skipped: prompts (plus outputs, with hold_output) larger than the pool.
    """

    num_blocks: int
    block_size: int
    max_running: int
    hold_output: bool
    enable_caching: bool
    requests: int
    skipped: int
    stats: PrefixCacheStats

    @property
    def hit_rate(self) -> float:
        return self.stats.hit_rate

    @property
    def cache_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def to_dict(self) -> dict:
        d = asdict(self)
        d["stats"] = stats_dict(self.stats)
        d["hit_rate"] = self.hit_rate
        d["cache_tokens"] = self.cache_tokens
        return d


def stats_dict(s: PrefixCacheStats) -> dict:
    """The counters under the replay's output keys (frozen; older than the counters' names)."""
    return {"requests": s.lookups, "queries": s.query_tokens, "hits": s.hit_tokens,
            "blocks_reused": s.blocks_reused, "blocks_evicted": s.blocks_evicted,
            "hit_rate": s.hit_rate, "prefill_tokens_saved": s.prefill_tokens_saved}


def replay_prefix_cache(
    chunks: Iterable[RequestChunk], num_blocks: int, block_size: int, *, max_running: int = 1,
    hold_output: bool = False, enable_caching: bool = True, demand: int | None = None,
) -> PrefixReplayResult:  # fmt: skip
    """Replay requests in arrival order through a prefix cache of `num_blocks` blocks (see the
    module docstring for the model).

    `demand`, when known, is the blocks all the requests together could ever hold: a cache of
    that many never evicts, so a larger one is built at that size (same results, bounded
    memory) and still reported at `num_blocks`.
    """
    if isinstance(max_running, bool) or not isinstance(max_running, int) or max_running < 1:
        raise KvplanError(f"max_running must be an integer >= 1, got {max_running!r}")
    replay = _Replay(num_blocks, block_size, max_running, hold_output)
    mgr: PrefixCachingBlockManager | None = None
    for chunk in chunks:
        if mgr is None:  # one identity per H / B blocks: the first chunk says what H is
            per = blocks_per_hash(chunk.hash_block_size, block_size) if chunk.hash_ids else 1
            built = num_blocks if demand is None else max(1, min(num_blocks, demand))
            mgr = PrefixCachingBlockManager(built, block_size, enable_caching=enable_caching,
                                            blocks_per_id=per)  # fmt: skip
        replay.run(mgr, chunk)
    stats = mgr.stats() if mgr is not None else PrefixCacheStats()
    return PrefixReplayResult(num_blocks, block_size, max_running, hold_output, enable_caching,
                              replay.requests, replay.skipped, stats)  # fmt: skip


class _Replay:
    """The running window of a replay and its counts."""

    def __init__(self, num_blocks: int, block_size: int, max_running: int, hold_output: bool):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.max_running, self.hold_output = max_running, hold_output
        self.running: deque[int] = deque()
        self.requests = self.skipped = 0

    def run(self, mgr: PrefixCachingBlockManager, chunk: RequestChunk) -> None:
        hashes, size = chunk.hash_ids, chunk.hash_block_size
        if hashes is not None and size != mgr.blocks_per_id * self.block_size:
            raise KvplanError(f"hash block size {size} differs from the stream's first "
                              f"({mgr.blocks_per_id * self.block_size}), or the first chunk "
                              "had no hash ids")  # fmt: skip
        # the last output token is sampled but its KV never computed (vLLM; the serve engine's rule)
        outputs = (np.maximum(chunk.output_len, 1) - 1).tolist() if self.hold_output else [0] * len(chunk)
        for i, (prompt, output) in enumerate(zip(chunk.prompt_len.tolist(), outputs)):
            if mgr.blocks_for(prompt + output) > self.num_blocks:
                self.skipped += 1
                continue
            while len(self.running) >= self.max_running:
                mgr.free(self.running.popleft())
            rid = self.requests = self.requests + 1
            ids = hashes[i][: prompt // size] if hashes is not None else None
            self._admit(mgr, lambda: mgr.add_request(rid, prompt, ids))
            if output:
                self._admit(mgr, lambda: mgr.append_tokens(rid, output))
            self.running.append(rid)

    def _admit(self, mgr: PrefixCachingBlockManager, call: Callable[[], object]) -> None:
        """Run call; while it is out of blocks, finish the oldest running request and retry."""
        while True:
            try:
                call()
                return
            except OutOfBlocks:
                if not self.running:  # cannot happen: the request alone fits in the pool
                    raise
                mgr.free(self.running.popleft())


def hit_rate_sweep(
    make_chunks: Callable[[], Iterable[RequestChunk]], cache_blocks: Sequence[int],
    block_size: int, **options,
) -> tuple[PrefixReplayResult, ...]:  # fmt: skip
    """One replay per pool size in `cache_blocks` (blocks of `block_size`), same options each."""
    sizes = [int(n) for n in cache_blocks]
    if not sizes or min(sizes) < 1:
        raise KvplanError(f"cache sizes must be a non-empty list of block counts >= 1, "
                          f"got {cache_blocks!r}")  # fmt: skip
    demand = None
    if max(sizes) > LARGE_CACHE:  # one pass to learn how large a cache could ever fill
        demand = _demand(make_chunks(), block_size, options.get("hold_output", False))
    return tuple(replay_prefix_cache(make_chunks(), n, block_size, demand=demand, **options)
                 for n in sizes)


LARGE_CACHE = 1 << 20  # blocks; above this a cache is built no larger than the stream can fill


def _demand(chunks: Iterable[RequestChunk], block_size: int, hold_output: bool) -> int:
    """Blocks that every request of the stream together could hold (each counted in full)."""
    total = 0
    for chunk in chunks:
        lengths = chunk.prompt_len + (chunk.output_len if hold_output else 0)
        total += int(np.sum(-(-lengths // block_size)))
    return total
