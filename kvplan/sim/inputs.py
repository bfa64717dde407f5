"""What both engines consume: checked settings, and the request stream clipped and in ticks.

Both the fast engine and the step-by-step reference read requests only through
`prepared_chunks`, so clipping, tick conversion and reservations are decided once.

Clipping (vLLM's limits, applied at load and counted in `clipped`):
- an output of 0 tokens becomes 1 (a prefill always produces one token, as vLLM's max_tokens >= 1);
- a prompt longer than max_model_len - 1 is cut to max_model_len - 1 (vLLM would reject it; the
  simulator keeps the request so every allocator sees the same number of requests);
- the output is then cut so that prompt + output <= max_model_len (vLLM stops generating there).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator

import numpy as np

from kvplan.errors import WorkloadError
from kvplan.memory.capacity import contiguous_reservations
from kvplan.memory.contiguous import POLICIES, reservation
from kvplan.model.speculative import SGLANG_METHODS, sglang_refusal
from kvplan.sim.offload import OffloadSetup, offload_setup
from kvplan.sim.prefix_ids import ChunkIds, PrefixTrie
from kvplan.sim.speculative import SpecSetup, spec_setup
from kvplan.sim.timing import StepClock, make_clock
from kvplan.workload.pool_rules import HybridBlocks, hybrid_rule, pool_bytes, read_bytes, usable_blocks
from kvplan.workload.records import SchedulerConfig, SglangConfig, Workload
from kvplan.workload.spec import AllocatorSpec

PREEMPTION_MODES = ("recompute", "swap")


@dataclass(frozen=True, slots=True, kw_only=True)
class SimSetup:
    """One allocator's run, checked: pool geometry, scheduler limits and the clock."""

    label: str
    paged: bool
    policy: str | None
    block_size: int  # paged: B; contiguous: 1 (a slot)
    num_blocks: int  # paged: slots // B less vLLM's null block; contiguous: slots
    slots: int
    limit: int  # contiguous per-request limit (the "max" reservation)
    sched: SchedulerConfig
    clock: StepClock
    prefix_caching: bool = False  # paged with scheduler.prefix_caching: full prompt blocks are shared
    hybrid: HybridBlocks | None = None  # paged, a model of several kinds of layers: vLLM's groups
    offload: OffloadSetup | None = None  # paged with prefix caching: a CPU tier (kvplan/sim/offload.py)
    speculative: SpecSetup | None = None  # speculative decoding (kvplan/sim/speculative.py)
    sglang: SglangConfig | None = None  # SGLang's scheduler (kvplan/sim/sglang.py): a token pool, page size 1
    reads: tuple[int, int, int] | None = None  # SGLang, sliding-window layers: (KV bytes per token of the
    #   layers that read every token, of the sliding ones, their window) for what a step reads

    @property
    def tail_slots(self) -> int:
        """Paged: the slots no request can use, counted as external waste: the slots % B left over
        after cutting whole blocks, and vLLM's null block (block 0, never handed out)."""
        return self.slots - self.num_blocks * self.block_size if self.paged else 0

    def kv_read(self, held: int) -> int:
        """The KV a step reads for a request holding `held` tokens, in tokens of every layer: the
        sliding-window layers (vLLM's groups, or SGLang's `reads`) read at most their window, the
        bytes-weighted mix rounded down (kernel.kv_read)."""
        h = self.hybrid
        mix = (h.kv_full, h.kv_sliding, h.window) if h is not None and h.kv_sliding else self.reads
        if mix is None:
            return held
        full, sliding, window = mix
        return (full * held + sliding * min(held, window)) // (full + sliding)


@dataclass(frozen=True, slots=True)
class PreparedChunk:
    """Requests ready to simulate: int64 arrival ticks, prompt, output, contiguous reservation."""

    arrival: np.ndarray  # ticks the engine sees the request (after the API server, if modelled)
    prompt: np.ndarray
    output: np.ndarray
    reserve: np.ndarray  # 0 for paged
    clipped: int
    sent: np.ndarray | None = None  # ticks the client sent it, when the API server delays it
    ids: ChunkIds | None = None  # prefix caching: the block identities of its prompts
    preload: np.ndarray | None = None  # prompt tokens whose KV arrives computed (kernel.PRELOAD)

    def __len__(self) -> int:
        return len(self.prompt)


def _int_at_least(value, minimum: int, field: str) -> int:
    if isinstance(value, bool) or int(value) != value or value < minimum:
        raise WorkloadError(f"must be an integer >= {minimum}, got {value!r}", field=field)
    return int(value)


def _check_scheduler(s: SchedulerConfig) -> None:
    _int_at_least(s.max_num_seqs, 1, "scheduler.max_num_seqs")
    tokens = _int_at_least(s.max_num_batched_tokens, 1, "scheduler.max_num_batched_tokens")
    model_len = _int_at_least(s.max_model_len, 2, "scheduler.max_model_len")
    _int_at_least(s.swap_slots, 0, "scheduler.swap_slots")
    if s.preemption not in PREEMPTION_MODES:
        raise WorkloadError(f"unknown preemption mode {s.preemption!r}; use recompute or swap",
                            field="scheduler.preemption")
    if not s.chunked_prefill and tokens < model_len:
        raise WorkloadError(f"without chunked prefill max_num_batched_tokens ({tokens}) must be >= "
                            f"max_model_len ({model_len}), or a long prompt could never be "
                            "scheduled (vLLM refuses this too)",
                            field="scheduler.max_num_batched_tokens")


def make_setup(workload: Workload, allocator: AllocatorSpec) -> SimSetup:
    """Check that `allocator` can serve `workload` at all, and fix the pool geometry (and the
    speculative decoding settings, where it has them)."""
    setup = _make_setup(workload, allocator)
    if workload.speculative is None:
        return setup
    if setup.sglang is not None and workload.speculative.setting.method not in SGLANG_METHODS:
        raise WorkloadError(sglang_refusal("engine: sglang"), field="speculative.method")
    if setup.hybrid is not None:
        raise WorkloadError("speculative decoding is modelled on models of one kind of attention layer; "
                            "this model's hybrid layer groups are not (remove speculative:)", field="speculative")
    spec = spec_setup(workload.speculative, setup.clock, workload.seed, setup.sched.max_num_batched_tokens,
                      setup.sched.max_model_len)
    return replace(setup, speculative=spec)


def _make_setup(workload: Workload, allocator: AllocatorSpec) -> SimSetup:
    s = workload.scheduler
    _check_scheduler(s)
    slots = _int_at_least(workload.pool.slots, 1, "pool.slots")
    clock = make_clock(workload.timing, workload.pool, s.max_num_batched_tokens)
    if workload.sglang is not None:
        return _sglang_setup(workload, allocator, clock, slots)
    if allocator.kind == "paged":
        b = _int_at_least(allocator.block_size, 1, "allocator.block_size")
        grouped = s.hybrid_kv_cache_manager if allocator.hybrid is None else allocator.hybrid
        hybrid = hybrid_rule(workload, b, grouped)
        if hybrid is not None:
            if workload.offload is not None and allocator.offload is not False:
                raise WorkloadError("a CPU tier needs prefix caching, which this model's hybrid layer groups "
                                    "run without", field="offload")
            return _hybrid_setup(workload, allocator, clock, *hybrid)
        num_blocks = usable_blocks(slots // b, s.null_block)
        if num_blocks * b < s.max_model_len:
            null = " (besides vLLM's null block)" if s.null_block else ""
            raise WorkloadError(f"the pool holds {num_blocks} blocks of {b} slots{null}, fewer than one "
                                f"request of max_model_len {s.max_model_len} needs",
                                field="pool.slots")
        caching = s.prefix_caching if allocator.prefix_caching is None else allocator.prefix_caching
        if caching and s.preemption == "swap":
            raise WorkloadError("prefix caching is modelled with recompute preemption only (vLLM V1 "
                                "preempts by recompute); set prefix_caching: false to swap",
                                field="scheduler.preemption")
        offload = None
        if workload.offload is not None and caching and allocator.offload is not False:
            offload = offload_setup(workload.offload, b, s.max_model_len)
        return SimSetup(label=allocator.label, paged=True, policy=None, block_size=b, num_blocks=num_blocks,
                        slots=slots, limit=0, sched=s, clock=clock, prefix_caching=caching, offload=offload)
    if allocator.kind != "contiguous" or allocator.policy not in POLICIES:
        raise WorkloadError(f"unknown allocator {allocator!r}", field="allocators")
    limit = _int_at_least(allocator.max_len or workload.contiguous_max_len, 1, "max_len")
    if limit < s.max_model_len:
        raise WorkloadError(f"the contiguous limit max_len ({limit}) is below max_model_len "
                            f"({s.max_model_len}): long requests could not be reserved",
                            field="max_len")
    need = reservation(allocator.policy, s.max_model_len, limit)
    if need > slots:
        raise WorkloadError(f"the pool has {slots} slots, fewer than one {allocator.policy} "
                            f"reservation of {need} for a max_model_len request",
                            field="pool.slots")
    return SimSetup(label=allocator.label, paged=False, policy=allocator.policy, block_size=1, num_blocks=slots,
                    slots=slots, limit=limit, sched=s, clock=clock)


def _sglang_setup(workload: Workload, allocator: AllocatorSpec, clock: StepClock, slots: int) -> SimSetup:
    """SGLang's pool: `slots` token slots with page size 1 (server_args.py: page_size 1), the radix
    cache on unless turned off (by `sglang.disable_radix_cache`, or the allocator's no-cache twin).
    Sliding-window layers keep every token there, as SGLang's one pool keeps them, or its hybrid SWA
    pool taken as the smaller of its two (kvplan/model/sglang_memory.py rule 5: `slots` is then
    SGLangMemory.serving_tokens); recurrent state is refused."""
    s, g = workload.scheduler, workload.sglang
    layout = workload.layout
    if layout is not None and any(grp.kind == "state" and grp.num_layers for grp in layout.groups):
        raise WorkloadError("SGLang's pools for recurrent state (Mamba, gated DeltaNet) are not modelled: "
                            "engine: sglang serves attention layers only", field="engine")
    if slots <= s.max_model_len:
        raise WorkloadError(f"the pool holds {slots} token slots, not more than one request of max_model_len "
                            f"{s.max_model_len} needs", field="pool.slots")
    if allocator.prefix_caching is False and g.radix_cache:
        g = replace(g, radix_cache=False)
    return SimSetup(label="sglang" + ("" if g.radix_cache else " no-cache"), paged=True, policy=None,
                    block_size=1, num_blocks=slots, slots=slots, limit=0, sched=s, clock=clock,
                    prefix_caching=g.radix_cache, sglang=g, reads=window_reads(layout))


def window_reads(layout) -> tuple[int, int, int] | None:
    """(KV bytes per token of the layers that read every token, of the sliding-window layers, the
    window) for a layout with sliding-window layers of one window, else None: their attention reads
    at most the window, whichever pool keeps their KV (kvplan/sim/kernel.py sg_kv_read)."""
    if layout is None:
        return None
    windows = {grp.window for grp in layout.groups if grp.kind == "sliding" and grp.num_layers}
    if len(windows) != 1:
        return None
    return (*read_bytes(layout), int(windows.pop()))


def _hybrid_setup(workload: Workload, allocator: AllocatorSpec, clock: StepClock, groups,
                  rule: HybridBlocks) -> SimSetup:
    """The pool as vLLM cuts it for layer groups: kv bytes // (page x group size) blocks of the
    groups' block size (larger than asked when recurrent state widens the page)."""
    s = workload.scheduler
    b = groups.attention_block_size
    pool_blocks = groups.num_blocks(pool_bytes(workload))
    num_blocks = usable_blocks(pool_blocks, s.null_block)
    need = groups.blocks_per_request(s.max_model_len, s.max_num_batched_tokens)
    if need > num_blocks:
        raise WorkloadError(f"the pool holds {num_blocks} blocks of the model's {groups.num_groups} layer "
                            f"groups, fewer than the {need} one request of max_model_len "
                            f"{s.max_model_len} needs (vLLM refuses to start)", field="pool")
    # prefix caching across layer groups (a hit needs every group's blocks, and a state checkpoint)
    # is not modelled: hybrid runs keep it off, and their results say so (prefix_caching: false)
    return SimSetup(label=f"paged-B{b}", paged=True, policy=None, block_size=b, num_blocks=num_blocks,
                    slots=pool_blocks * b, limit=0, sched=s, clock=clock, prefix_caching=False, hybrid=rule)


def clip_lengths(prompt, output, max_model_len: int, already=None) -> tuple[np.ndarray, np.ndarray, int]:
    """Apply the module's clipping rules; returns (prompt, output, number of requests changed),
    counting once a request that a trace reader had cut already (`already`, a mask)."""
    p, o, changed = clipped_lengths(prompt, output, max_model_len, already)
    return p, o, int(np.count_nonzero(changed))


def clipped_lengths(prompt, output, max_model_len: int, already=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """clip_lengths with the mask of the requests changed."""
    p0 = np.asarray(prompt, dtype=np.int64)
    o0 = np.asarray(output, dtype=np.int64)
    if p0.size and (p0.min() < 1 or o0.min() < 0):
        raise WorkloadError("prompt lengths must be >= 1 and output lengths >= 0", field="requests")
    p = np.minimum(p0, max_model_len - 1)
    o = np.minimum(np.maximum(o0, 1), max_model_len - p)
    changed = (p != p0) | (o != o0)
    if already is not None:
        changed |= already
    return p, o, changed


class ChunkPreparer:
    """Requests made ready for one run, chunk after chunk: clipped, in ticks, with reservations.

    With the physical clock's API-server service time s, requests reach the engine one at a time:
    the engine sees request i at max(sent_i, seen_{i-1} + s) (one server, in arrival order), so a
    burst of N requests spreads over N x s; latencies still count from the client's send. The
    state carried from chunk to chunk (the last arrival, the server's last request, the prefix
    trie) belongs to one run: a fleet keeps one per replica."""

    def __init__(self, setup: SimSetup) -> None:
        self.setup = setup
        self.last = -1
        self.seen_last: int | None = None
        self.trie = PrefixTrie(setup.block_size) if setup.prefix_caching else None

    def convert(self, chunk) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """What does not depend on the run's past: arrival ticks, clipped prompt and output, and
        which were clipped (a fleet converts a batch once per group, then prepares each replica's
        share of it with `prepare_parts`)."""
        ticks = self.setup.clock.arrival_ticks(chunk.arrival)
        return (ticks, *clipped_lengths(chunk.prompt_len, chunk.output_len, self.setup.sched.max_model_len,
                                        chunk.cut))

    def prepare(self, chunk) -> PreparedChunk:
        return self.prepare_parts(chunk, *self.convert(chunk))

    def prepare_parts(self, chunk, ticks, p, o, changed) -> PreparedChunk:
        """`chunk`'s requests converted already (`convert`); `chunk` is read only for its hash ids."""
        setup = self.setup
        # (slices, not np.diff / np.any: a fleet prepares a replica's one or two requests of every
        # refresh window, where numpy's function wrappers cost more than the work)
        if ticks[0] < self.last or (len(ticks) > 1 and (ticks[1:] < ticks[:-1]).any()):
            raise WorkloadError("request arrivals must be in nondecreasing order", field="arrival")
        self.last = int(ticks[-1])
        clipped = int(np.count_nonzero(changed))
        ids = self.trie.encode(chunk, p) if self.trie is not None else None
        preload = None
        if chunk.preload is not None:
            if not setup.paged or setup.hybrid is not None:
                raise WorkloadError("KV sent by a prefill replica needs a paged pool of one kind of layers "
                                    "(not contiguous, not hybrid groups)", field="allocators")
            preload = np.minimum(np.asarray(chunk.preload, dtype=np.int64), p - 1)
        if setup.paged:
            reserve = np.zeros(len(p), dtype=np.int64)
        else:
            reserve = contiguous_reservations(p + o - 1, setup.policy, setup.limit)  # final KV held
        service = setup.clock.frontend_service
        if service > 0:
            steps = service * np.arange(len(ticks), dtype=np.int64)
            floor = np.maximum.accumulate(ticks - steps)
            if self.seen_last is not None:
                floor = np.maximum(floor, self.seen_last + service)
            seen = floor + steps
            self.seen_last = int(seen[-1])
            return PreparedChunk(seen, p, o, reserve, clipped, sent=ticks, ids=ids, preload=preload)
        return PreparedChunk(ticks, p, o, reserve, clipped, ids=ids, preload=preload)


ID_PIECE = 1 << 17  # identity blocks (hash ids) in a piece of a chunk: 1 MiB of trie nodes, about


def id_pieces(chunk) -> list[slice]:
    """`chunk` (with hash ids) cut into as few consecutive pieces as hold ID_PIECE identity
    blocks each, of about equal identities: an engine loads the identities of every request it
    was sent and has not finished, so a piece at a time keeps that bounded where a chunk of 65,536
    long prompts can hold millions (equal pieces, so that the tables grown by doubling as pieces
    load end near the size they need)."""
    n = len(chunk)
    ends = np.cumsum(np.fromiter(map(len, chunk.hash_ids), dtype=np.int64, count=n))
    total = int(ends[-1]) if n else 0
    m = -(-total // ID_PIECE)
    if m <= 1:
        return [slice(0, n)]
    cuts = np.searchsorted(ends, total * np.arange(1, m, dtype=np.int64) // m, side="right")
    cuts = np.unique(np.concatenate(([0], np.clip(cuts, 1, n), [n])))
    return [slice(int(a), int(b)) for a, b in zip(cuts, cuts[1:])]


def prepared_chunks(workload: Workload, setup: SimSetup) -> Iterator[PreparedChunk]:
    """The workload's requests, chunk by chunk, ready for the engine (ChunkPreparer); a chunk
    with prefix identities in pieces (`id_pieces`; a run fed in pieces is the run fed at once, to
    the byte: engine.py)."""
    from kvplan.workload.prefixes import request_stream

    preparer = ChunkPreparer(setup)
    for chunk in request_stream(workload):
        if not len(chunk):
            continue
        if preparer.trie is not None and chunk.hash_ids is not None:
            for part in id_pieces(chunk):
                yield preparer.prepare(chunk.take(part))
        else:
            yield preparer.prepare(chunk)
