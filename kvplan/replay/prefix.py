"""Prefix caching over a request stream: trace replay with block hashes, hit-rate sweeps, and
synthetic shared prefixes (system prompts, multi-turn conversations).

Replay model (`replay_prefix_cache`): requests are taken in arrival order (times are ignored) into
a PrefixCachingBlockManager of `num_blocks` blocks of `block_size` tokens. Each request looks up
its prompt blocks, takes new blocks for the rest (evicting least recently freed cached blocks) and
holds them for its lifetime; `max_running` requests hold blocks at once, and the oldest finishes
(frees) when a newer one needs its slot or its blocks, first in, first out. `max_running=1` (the
default) runs each request to completion before the next: a pure LRU cache replay of the prompt
blocks, which is what Mooncake's trace analysis (FAST'25) does. With `hold_output=True` a request
also holds blocks for its output tokens (unique to it, never cached). A prompt that needs more
blocks than the whole pool is skipped and counted, not replayed.

Block identities: a trace gives one hash id per `hash_block_size` (H) prompt tokens. When the
simulated block size B divides H, trace block j covers simulated blocks j*H/B .. (j+1)*H/B - 1,
whose identities are (hash id, sub-index), encoded as the int hash_id * (H/B) + sub-index. Only
full trace blocks count: a partial last trace block (Mooncake's) and every token past the last id
are unique to their request. A B that does not divide H is a KvplanError. The cache chains
identities from the first block, so equal ids only match behind equal prefixes.

Synthetic prefixes: `PrefixSpec` holds the YAML `prefix:` section key for key (system prompts,
their popularity, multi-turn conversations); `with_prefixes(chunks, spec, rng)` rewrites a request
stream lazily so that prompts start with them, attaching hash ids; `synthetic_prefixes` does the
same for plain arrays.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from kvplan.errors import KvplanError
from kvplan.memory.paged import OutOfBlocks
from kvplan.memory.prefix_cache import PrefixCachingBlockManager, PrefixCacheStats
from kvplan.workload.records import RequestChunk

POPULARITY = ("uniform", "zipf")


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


def blocks_per_hash(hash_block_size: int, block_size: int) -> int:
    """H / B: simulated blocks per trace hash block; a KvplanError unless B divides H."""
    if hash_block_size < 1 or block_size < 1 or hash_block_size % block_size:
        raise KvplanError(f"block size {block_size} does not divide the trace's hash block size "
                          f"{hash_block_size}: each trace block must map onto whole simulated "
                          f"blocks (use a block size that divides {hash_block_size})")  # fmt: skip
    return hash_block_size // block_size


@dataclass(frozen=True, slots=True)
class PrefixReplayResult:
    """One replay: the pool, the model, and the cache's counters (vLLM's definitions).

    requests: replayed; skipped: prompts (plus outputs, with hold_output) larger than the pool.
    hit_rate = hits / queries over prompt tokens; prefill_tokens_saved = hits.
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
        d["stats"] = self.stats.to_dict()
        d["hit_rate"] = self.hit_rate
        d["cache_tokens"] = self.cache_tokens
        return d


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
        outputs = chunk.output_len.tolist() if self.hold_output else [0] * len(chunk)
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


# ---- synthetic shared prefixes ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PrefixSpec:
    """Shared prompt starts for a synthetic workload (the YAML `prefix:` section, key for key).

    system_prompts: distinct system prompts (0: none). system_prompt_len: their length in tokens
    (one int for all, or one per prompt). popularity: uniform | zipf (prompt k is picked with
    probability proportional to (k + 1) ** -zipf_a). turns: requests per conversation; each
    turn's prompt is the previous turn's prompt and answer followed by the request's own new
    tokens. sessions: conversations open at once (each request continues one of them, picked
    uniformly). hash_block_size: tokens per generated hash id (use the simulated block size or
    a multiple of it). max_prompt_len: a conversation that would pass it starts afresh.
    """

    system_prompts: int = 8
    system_prompt_len: int | tuple[int, ...] = 1024
    popularity: str = "zipf"
    zipf_a: float = 1.2
    turns: int = 1
    sessions: int = 16
    hash_block_size: int = 16
    max_prompt_len: int | None = None

    def __post_init__(self) -> None:
        for name, lo in (("system_prompts", 0), ("turns", 1), ("sessions", 1),
                         ("hash_block_size", 1), ("max_prompt_len", 1)):  # fmt: skip
            value = getattr(self, name)
            if not (value is None and name == "max_prompt_len") and not _is_int(value, lo):
                raise _bad(name, value, f"an integer >= {lo}")
        lens = self.system_prompt_len
        lens = (lens,) * self.system_prompts if _is_int(lens, 1) else lens
        if (not isinstance(lens, (list, tuple)) or len(lens) != self.system_prompts
                or not all(_is_int(n, 1) for n in lens)):  # fmt: skip
            raise _bad("system_prompt_len", lens, f"{self.system_prompts} lengths >= 1, or one")
        object.__setattr__(self, "system_prompt_len", tuple(int(n) for n in lens))
        if self.popularity not in POPULARITY:
            raise _bad("popularity", self.popularity, " or ".join(POPULARITY))
        a = self.zipf_a
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 < a < float("inf"):
            raise _bad("zipf_a", a, "a number > 0")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["system_prompt_len"] = list(self.system_prompt_len)
        return d


def _is_int(value, lo: int) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= lo


def _bad(name: str, value, want: str) -> KvplanError:
    return KvplanError(f"got {value!r}; expected {want}", field=f"prefix.{name}")


class _Conversation:
    """One conversation's token history as hash ids of its full blocks plus a partial tail."""

    __slots__ = ("ids", "length", "turns")

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.length = self.turns = 0


class PrefixGenerator:
    """Rewrites requests' prompts to start with shared prefixes (see PrefixSpec).

    Hash ids: full blocks of a system prompt get ids fixed per (prompt, block); every other
    block (the one straddling the end of a system prompt, messages, answers) gets a fresh id,
    kept by its conversation for later turns. Equal ids therefore mean equal content behind
    equal prefixes, as in the traces.
    """

    def __init__(self, spec: PrefixSpec, rng: np.random.Generator) -> None:
        self.spec, self.rng = spec, rng
        h, lens = spec.hash_block_size, spec.system_prompt_len
        self._sys_base = np.concatenate(([0], np.cumsum([n // h for n in lens]))).tolist()
        self._next_id = self._sys_base[-1]
        weights = (np.arange(1, len(lens) + 1, dtype=float) ** -spec.zipf_a
                   if spec.popularity == "zipf" else np.ones(len(lens)))  # fmt: skip
        self._weights = weights / weights.sum() if len(lens) else weights
        self._open: list[_Conversation | None] = [None] * (spec.sessions if spec.turns > 1 else 1)

    def _fresh(self, n: int) -> list[int]:
        self._next_id += n
        return list(range(self._next_id - n, self._next_id))

    def _push(self, conv: _Conversation, tokens: int) -> None:
        """Append `tokens` unique tokens to the conversation."""
        h = self.spec.hash_block_size
        conv.ids += self._fresh((conv.length + tokens) // h - conv.length // h)
        conv.length += tokens

    def _start(self, k: int) -> _Conversation:
        """A new conversation opening with system prompt k (none without system prompts)."""
        conv = _Conversation()
        if self.spec.system_prompts:
            conv.ids = list(range(self._sys_base[k], self._sys_base[k + 1]))
            conv.length = self.spec.system_prompt_len[k]
        return conv

    def apply(self, chunk: RequestChunk) -> RequestChunk:
        """The chunk with prompts lengthened by their prefixes and hash ids attached."""
        spec, limit = self.spec, self.spec.max_prompt_len
        prompts, outputs = chunk.prompt_len.tolist(), chunk.output_len.tolist()
        n = len(prompts)
        slots = self.rng.integers(len(self._open), size=n).tolist()
        system = (self.rng.choice(spec.system_prompts, size=n, p=self._weights).tolist()
                  if spec.system_prompts else [0] * n)  # fmt: skip
        new_len, ids = [], []
        for own, answer, slot, k in zip(prompts, outputs, slots, system):
            conv = self._open[slot]
            if conv is None or (limit is not None and conv.length + own > limit):
                conv = self._open[slot] = self._start(k)
            self._push(conv, own)
            length = conv.length if limit is None else min(conv.length, limit)
            new_len.append(length)
            ids.append(tuple(conv.ids[: length // spec.hash_block_size]))
            self._push(conv, answer)
            conv.turns += 1
            if conv.turns == spec.turns:
                self._open[slot] = None
        return RequestChunk(chunk.arrival, np.asarray(new_len, dtype=np.int64), chunk.output_len,
                            ids, spec.hash_block_size, chunk.cut)  # fmt: skip


def with_prefixes(chunks: Iterable[RequestChunk], spec: PrefixSpec,
                  rng: np.random.Generator) -> Iterator[RequestChunk]:  # fmt: skip
    """Lazily apply one PrefixGenerator to a stream of chunks (state carries across chunks)."""
    gen = PrefixGenerator(spec, rng)
    return (gen.apply(chunk) for chunk in chunks)


def synthetic_prefixes(prompt_len: np.ndarray, output_len: np.ndarray, rng: np.random.Generator,
                       **spec) -> tuple[np.ndarray, list[tuple[int, ...]]]:  # fmt: skip
    """Prompt lengths and hash ids for requests whose own new tokens are `prompt_len` and whose
    answers are `output_len`, under PrefixSpec(**spec), e.g. system_prompts=8,
    system_prompt_len=1024, popularity="zipf", zipf_a=1.2, turns=4."""
    n = len(prompt_len)
    chunk = RequestChunk(np.zeros(n), np.asarray(prompt_len, dtype=np.int64),
                         np.asarray(output_len, dtype=np.int64))  # fmt: skip
    out = PrefixGenerator(PrefixSpec(**spec), rng).apply(chunk)
    return out.prompt_len, out.hash_ids
