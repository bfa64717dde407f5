"""The fast discrete-event serving simulator: `simulate(workload, allocator)`.

Same semantics as the step-by-step reference (`reference.py`, whose docstring defines them), and
the same result to the last bit; it is fast because it does not step token by token. Between
events (an arrival that could be admitted, a finish, a block the pool cannot serve, a prefill)
the running batch only decodes, and the compiled kernel (`kernel.py`) advances over all those
steps in one closed-form jump. Requests are read lazily chunk by chunk; per request the engine
keeps one row of 21 int64 (168 bytes, named in kernel.py), and the running batch is a small array of
request ids. With prefix caching, the block identities of the loaded prompts not finished (one trie
node per trace hash block, `prefix_ids.py`, compacted now and then) and the cached entries live in
the four arrays of `px`; a CPU tier (`offload.py`) keeps three in `cx`: the CPU slot of each block
node, the slots, the loads in flight (`cx` is None without a tier, so that numba compiles the
tier's branches out).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np

from kvplan.errors import WorkloadError
from kvplan.sim import kernel as K
from kvplan.sim.prefix_ids import PrefixTrie, worth_dropping
from kvplan.sim.state import EVENTS_PER_CALL, EngineState, RequestColumns, grown, grown_rows, packed, segment_index
from kvplan.sim.inputs import PreparedChunk, SimSetup, make_setup, prepared_chunks
from kvplan.memory.prefix_cache import PrefixCacheStats
from kvplan.sim.offload import OffloadStats, stalled
from kvplan.sim.metrics import INTEGRALS, RawRun, ServeResult, build_result
from kvplan.sim.sampling import TIMELINE_POINTS, initial_delta
from kvplan.workload.records import Workload
from kvplan.workload.spec import AllocatorSpec

MAX_EVENT_TICKS = 1 << 61  # the most one step or jump may move the clock (see kernel.run)


def longest_step(setup: SimSetup) -> int:
    """Ticks of the longest step this setup can take: the whole pool read, a full token budget.

    Raises WorkloadError when even one step would pass what the int64 clock can hold.
    """
    c, s = setup.clock, setup.sched
    if not c.timed:
        return 1
    budget = s.max_num_batched_tokens
    if c.physical:  # every slot read, a full budget processed, the budget attending the whole pool
        step = max(c.overhead + c.per_request * s.max_num_seqs + c.linear_ticks(budget)
                   + c.kv_per_token * setup.slots + c.attention_per_pair * budget * (setup.slots + budget),
                   c.host + c.host_per_request * s.max_num_seqs)
    else:
        step = c.overhead + max(c.weights + c.kv_per_token * setup.slots, c.compute_per_token * budget)
    sp = setup.speculative
    if sp is not None and c.physical:  # every draft verified, and k draft passes as long as the longest
        step += sp.verify * budget + sp.k * sp.pass_ticks(budget, s.max_num_seqs, setup.slots,
                                                          budget * (setup.slots + budget))
    if step > MAX_EVENT_TICKS:
        raise WorkloadError(f"one step could take {step / 1e12:.3g} s of simulated time, more than "
                            "the simulator's clock holds; check the timing settings", field="timing")
    return step


def _config(setup: SimSetup, timeline_points: int) -> np.ndarray:
    s, c, h = setup.sched, setup.clock, setup.hybrid
    cfg = np.zeros(K.NUM_SETTINGS + max(len(c.linear), 1), dtype=np.int64)
    values = {
        K.PAGED: setup.paged, K.BLOCK_SIZE: setup.block_size, K.NUM_BLOCKS: setup.num_blocks,
        K.SLOTS: setup.slots, K.MAX_SEQS: s.max_num_seqs, K.TOKEN_BUDGET: s.max_num_batched_tokens,
        K.CHUNKED_PREFILL: s.chunked_prefill, K.SWAP: s.preemption == "swap",
        K.SWAP_SLOTS: s.swap_slots, K.TIMED: c.timed, K.OVERHEAD: c.overhead, K.WEIGHT_TICKS: c.weights,
        K.KV_TICKS: c.kv_per_token, K.FLOP_TICKS: c.compute_per_token, K.TAIL_SLOTS: setup.tail_slots,
        K.MAX_SAMPLES: timeline_points, K.QUEUE_CAP: s.max_num_seqs + 1,
        K.MAX_JUMP: max(1, min(K.KCAP, MAX_EVENT_TICKS // longest_step(setup))),
        K.PHYSICAL: c.physical, K.REQ_TICKS: c.per_request, K.ATTN_TICKS: c.attention_per_pair,
        K.LIN_LEN: len(c.linear), K.LIN_SLOPE: c.linear_slope,
        K.HOST_TICKS: c.host, K.HOST_REQ_TICKS: c.host_per_request,
        K.PREFIX: setup.prefix_caching, K.PER: 1,
        K.HYBRID: h is not None, K.HY_FULL: h.full if h else 1, K.HY_SLIDE: h.sliding if h else 0,
        K.HY_WINDOW: h.window if h else 0, K.HY_STATE: h.state if h else 0,
        K.HY_KV_FULL: h.kv_full if h else 1, K.HY_KV_SLIDE: h.kv_sliding if h else 0,
        K.OFFLOAD: setup.offload is not None,
        K.CPU_BLOCKS: setup.offload.num_blocks if setup.offload else 0,
        K.LOAD_TICKS: setup.offload.load_ticks if setup.offload else 0,
    }  # fmt: skip
    if setup.reads is not None:  # SGLang's one pool of a model with sliding-window layers (kernel.kv_read)
        values[K.HY_KV_FULL], values[K.HY_KV_SLIDE], values[K.HY_WINDOW] = setup.reads
    for key, value in values.items():
        cfg[key] = int(value)
    cfg[K.NUM_SETTINGS:K.NUM_SETTINGS + len(c.linear)] = np.asarray(c.linear, dtype=np.int64)
    if setup.speculative is not None:
        cfg = _speculative_config(cfg, setup.speculative)
    return cfg


def _speculative_config(cfg: np.ndarray, sp) -> np.ndarray:
    """cfg with the speculative settings (kvplan/sim/speculative.SpecSetup): its scalars, and the
    draft's linear table and the acceptance thresholds appended after the target's table."""
    lin_at = len(cfg)
    thr_at = lin_at + len(sp.linear)
    out = np.zeros(thr_at + len(sp.thresholds), dtype=np.int64)
    out[:lin_at] = cfg
    out[lin_at:thr_at] = np.asarray(sp.linear, dtype=np.int64)
    out[thr_at:] = np.asarray(sp.thresholds, dtype=np.int64)
    values = {K.SPEC_K: sp.k, K.SPEC_LOOKAHEAD: sp.lookahead, K.SPEC_SEED: sp.seed, K.SPEC_VERIFY: sp.verify,
              K.SPEC_OVERHEAD: sp.overhead, K.SPEC_REQ: sp.per_request, K.SPEC_KV: sp.kv_per_token,
              K.SPEC_ATTN: sp.attention_per_pair, K.SPEC_LIN_AT: lin_at, K.SPEC_LIN_LEN: len(sp.linear),
              K.SPEC_LIN_SLOPE: sp.linear_slope, K.SPEC_THR_AT: thr_at, K.SPEC_MAX_LEN: sp.max_model_len}
    for key, value in values.items():
        out[key] = int(value)
    return out


class KernelState(EngineState):
    """One serve engine's state: the arrays the kernel works on, the loading of request chunks
    into them, and what a caller may ask of a run in progress (`advance`, `outstanding`,
    `blocks_in_use`, `busy_ticks`, `columns`). Callers outside kvplan/sim/ use these and never the
    kernel's arrays."""

    def __init__(self, setup: SimSetup, timeline_points: int = TIMELINE_POINTS):
        if timeline_points < 2 or timeline_points % 2:
            raise ValueError(f"timeline points must be an even number >= 2, got {timeline_points}")
        self.setup = setup
        seqs = setup.sched.max_num_seqs
        self.cfg = _config(setup, timeline_points)
        self.st = np.zeros(K.NUM_SCALARS, dtype=np.int64)
        self.st[K.FREE_BLOCKS] = setup.num_blocks if setup.paged else 0
        self.st[K.SAMPLE_EVERY] = initial_delta(setup.clock)
        self.req = np.zeros((0, K.NUM_COLUMNS), dtype=np.int64)
        self.running = np.zeros(seqs, dtype=np.int64)
        self.sched = np.zeros(seqs, dtype=np.int64)
        self.requeued = np.zeros(seqs + 1, dtype=np.int64)
        self.swapped = np.zeros(seqs + 1, dtype=np.int64)
        self.run_start = np.zeros(seqs + 2, dtype=np.int64)
        self.run_len = np.zeros(seqs + 2, dtype=np.int64)
        self.run_len[0] = setup.slots
        self.st[K.NUM_FREE_RUNS] = 1
        self.timeline = np.zeros((timeline_points, 8), dtype=np.int64)
        self.acc = np.zeros((K.NUM_INTEGRALS, 4), dtype=np.int64)
        for scalar in (K.Q_HEAD, K.Q_TAIL, K.E_RECYCLED):
            self.st[scalar] = -1
        caching = setup.prefix_caching
        self.st[K.ANON_TAIL] = self.st[K.FREE_BLOCKS] if caching else 0
        # px: trie nodes of loaded prompts, entry held per identity block, first copy per block
        # node, entries (see kernel.py); 1-element dummies without prefix caching
        one = np.zeros(1, dtype=np.int64)
        self.ids, self.held, self.copies = one.copy(), one.copy(), np.full(1, -1, dtype=np.int64)
        self.ents = np.zeros(max(setup.num_blocks, 1) * K.NE if caching else 1, dtype=np.int64)
        self.n_ids = self.n_held = 0
        # offload: CPU slot per block node, the slots (grown as blocks could fill them), the loads
        self.cpu_slot, self.cpu = np.full(1, -1, dtype=np.int64), one.copy()
        self.loading = np.zeros(seqs + 1 if setup.offload else 1, dtype=np.int64)
        for scalar in (K.CPU_HEAD, K.CPU_TAIL):
            self.st[scalar] = -1
        self.clipped = 0
        self.sent: list[np.ndarray] = []  # client send ticks, when the API server delays requests

    @property
    def waiting(self) -> int:
        """Requests loaded and neither running nor finished (vLLM's num_requests_waiting)."""
        return self.outstanding - int(self.st[K.NUM_RUNNING])

    def cached_block(self, block_node: int) -> bool:
        """Whether the prefix cache holds a copy of this block node (trie node x blocks per hash
        block + sub-block; kvplan/sim/prefix_ids.py): what vLLM's KV events tell a precise index."""
        return block_node < len(self.copies) and self.copies[block_node] >= 0

    def holds_node(self, node: int, per: int) -> bool:
        """Whether the prefix cache holds every one of the `per` blocks of trie node `node`."""
        return all(self.cached_block(node * per + s) for s in range(per))

    @property
    def blocks_in_use(self) -> int:
        """KV blocks held by requests or by the prefix cache's unfreed entries (0 unpaged)."""
        return self.setup.num_blocks - int(self.st[K.FREE_BLOCKS]) if self.setup.paged else 0

    def columns(self) -> RequestColumns:
        """The loaded requests' arrival, first-token and finish ticks and output lengths."""
        req = self.req[:self.loaded]
        return RequestColumns(req[:, K.ARRIVAL], req[:, K.FIRST_TOKEN_AT], req[:, K.FINISHED_AT], req[:, K.OUTPUT])

    def load(self, chunk: PreparedChunk) -> None:
        """Append a chunk's requests (growing the table by doubling)."""
        n, m = self.loaded, len(chunk)
        self.req = grown_rows(self.req, n + m)
        rows = self.req[n:n + m]
        rows[:] = 0
        rows[:, K.ARRIVAL], rows[:, K.PROMPT] = chunk.arrival, chunk.prompt
        rows[:, K.OUTPUT] = chunk.output
        rows[:, K.PREFILL_END], rows[:, K.RESERVED] = chunk.prompt, chunk.reserve
        rows[:, K.ADMITTED_AT:K.FINISHED_AT + 1] = -1  # admitted, first token, finish: not yet
        rows[:, K.READY_AT] = -1
        if chunk.preload is not None:
            rows[:, K.PRELOAD] = chunk.preload
        self._took(chunk, rows, n)

    def _load_ids(self, rows: np.ndarray, ids) -> None:
        """Append a chunk's block identities to px (each array grown by doubling)."""
        if self.n_ids == 0 and self.n_held == 0:
            self.cfg[K.PER] = ids.per
        elif int(self.cfg[K.PER]) != ids.per:
            raise WorkloadError("the stream's hash block size changed", field="requests")
        per, counts = ids.per, ids.counts
        starts = self.n_ids + np.concatenate(([0], np.cumsum(counts)[:-1]))
        blocks = counts * per
        rows[:, K.ID_START], rows[:, K.ID_BLOCKS] = starts, blocks
        rows[:, K.E_START] = self.n_held + np.concatenate(([0], np.cumsum(blocks)[:-1]))
        self.ids = grown(self.ids, self.n_ids + len(ids.nodes), 0)
        self.ids[self.n_ids:self.n_ids + len(ids.nodes)] = ids.nodes
        self.n_ids += len(ids.nodes)
        self.n_held += int(blocks.sum())
        self.held = grown(self.held, self.n_held, 0)
        if len(ids.nodes):
            self.copies = grown(self.copies, (int(ids.nodes.max()) + 1) * per, -1)
        offload = self.setup.offload
        if offload is not None:
            self.cpu_slot = grown(self.cpu_slot, len(self.copies), -1)
            # the slots filled so far and a slot for every block the loaded requests could store
            self.cpu = grown(self.cpu, min(offload.num_blocks, int(self.st[K.CPU_USED]) + self.n_held) * K.NS, 0)

    def _compact(self, trie: PrefixTrie) -> None:
        """The open requests' identity entries packed (px[0], px[1]) when enough of them are
        finished; the trie keeps the nodes they name and those with a cached copy or a CPU slot,
        and when it renumbers them, so are px[0], the copies, the CPU slots and the entries' and
        slots' block nodes."""
        per, n, st = int(self.cfg[K.PER]), trie.num_nodes, self.st
        rids, counts, nodes = self._open_ids(self.req, K.FINISHED_AT, K.ID_START, K.ID_BLOCKS, per)
        copies = self.copies[:n * per]
        cached = np.flatnonzero(copies >= 0)
        live = np.zeros(n, dtype=bool)
        live[nodes] = True
        live[cached // per] = True
        tier = self.setup.offload is not None
        if tier:
            slots = self.cpu_slot[:n * per]
            stored = np.flatnonzero(slots >= 0)
            live[stored // per] = True
        remap = trie.compact(live)
        self._keep_ids(self.req, K.ID_START, rids, counts, nodes, remap)
        if worth_dropping(len(nodes) * per, self.n_held):
            self.held = packed(self.held[segment_index(self.req[rids, K.E_START], counts * per)])
            self.n_held = len(nodes) * per
            self.req[rids, K.E_START] = per * (np.cumsum(counts) - counts)
        if remap is None:
            return
        size = max(trie.num_nodes * per, 1)

        def moved(block_nodes: np.ndarray) -> np.ndarray:  # -1 for a dropped node's (stale ones)
            new = np.where(block_nodes >= 0, remap[np.maximum(block_nodes, 0) // per], -1)
            return np.where(new >= 0, new * per + block_nodes % per, -1)

        self.copies = np.full(size, -1, dtype=np.int64)
        self.copies[moved(cached)] = copies[cached]
        used = self.ents[K.E_NODE:int(st[K.E_NEW]) * K.NE:K.NE]  # every entry ever used (a view)
        used[:] = moved(used)
        if tier:
            self.cpu_slot = np.full(size, -1, dtype=np.int64)
            self.cpu_slot[moved(stored)] = slots[stored]
            filled = self.cpu[K.C_NODE:int(st[K.CPU_USED]) * K.NS:K.NS]
            filled[:] = moved(filled)

    def kernel_args(self) -> tuple:
        """The kernel's arrays, in `kernel.run`'s order (its state as of now: px grows on load)."""
        queues = (self.running, self.sched, self.requeued, self.swapped, self.run_start, self.run_len)
        px = (self.ids, self.held, self.copies, self.ents)
        cx = (self.cpu_slot, self.cpu, self.loading) if self.setup.offload is not None else None
        return self.cfg, self.st, self.req, px, cx, queues, self.timeline, self.acc

    def _kernel(self) -> int:
        return K.run(*self.kernel_args(), EVENTS_PER_CALL)

    def _stalled(self) -> WorkloadError:
        return stalled()

    def raw(self) -> RawRun:
        sums = self._integrals()
        req, st = self.req[:self.loaded], self.st
        integrals = dict(zip(INTEGRALS, sums))
        for name in ("tokens", "allocated"):  # a block shared during a jump counts once
            integrals[name] -= sums[K.ACC_SHARED]

        def col(field):
            return req[:, field].copy()

        return RawRun(
            arrival=col(K.ARRIVAL), admitted=col(K.ADMITTED_AT), first_token=col(K.FIRST_TOKEN_AT),
            finish=col(K.FINISHED_AT), prompt=col(K.PROMPT), output=col(K.OUTPUT),
            preemptions=col(K.PREEMPTED), clipped=self.clipped,
            steps=int(st[K.STEPS]), preemptions_total=int(st[K.PREEMPTIONS]),
            swap_outs=int(st[K.SWAP_OUTS]), recomputed_tokens=int(st[K.RECOMPUTED]),
            peak_running=int(st[K.PEAK_RUNNING]), t_origin=int(st[K.ORIGIN]), t_end=int(st[K.NOW]),
            integrals=integrals, timeline=self.timeline[:int(st[K.SAMPLES])].copy(),
            timeline_delta=int(st[K.SAMPLE_EVERY]),
            sent=np.concatenate(self.sent) if self.sent else None,
            prefix=PrefixCacheStats(int(st[K.PC_LOOKUPS]), int(st[K.PC_QUERY_TOKENS]), int(st[K.PC_HIT_TOKENS]),
                                int(st[K.PC_PREFILL_SAVED]), int(st[K.PC_BLOCKS_EVICTED]), int(st[K.PC_BLOCKS_REUSED]))
            if self.setup.prefix_caching else None,
            hit_tokens=col(K.HIT_TOKENS) if self.setup.prefix_caching else None,
            offload=OffloadStats(*(int(st[k]) for k in (K.OF_QUERY_TOKENS, K.OF_HIT_TOKENS, K.OF_LOADS,
                                                        K.OF_BLOCKS_LOADED, K.OF_LOAD_TICKS, K.OF_STORED,
                                                        K.OF_EVICTED)))
            if self.setup.offload is not None else None,
        )  # fmt: skip


def new_state(setup: SimSetup, timeline_points: int = TIMELINE_POINTS) -> EngineState:
    """The engine's state for a setup: SGLang's scheduler (sglang_state.py) when it has one, else
    vLLM's (KernelState); both load chunks and run alike."""
    if setup.sglang is not None:
        from kvplan.sim.sglang_state import SglangState

        return SglangState(setup, _config(setup, timeline_points), timeline_points)
    return KernelState(setup, timeline_points)


def simulate(workload: Workload, allocator: AllocatorSpec, *,
             progress: Callable[[int, int], None] | None = None,
             record_requests: bool = False,
             timeline_points: int = TIMELINE_POINTS, setup: SimSetup | None = None,
             stop: Callable[[EngineState], bool] | None = None) -> ServeResult | None:
    """Replay the workload's requests through one allocator, as a continuous-batching server would.

    `progress(completed, loaded)` is called now and then. `record_requests` keeps per-request
    columns in the result (`ServeResult.requests`). Raises WorkloadError for settings that could
    never serve a request (see `inputs.make_setup`). `setup`: make_setup(workload, allocator)
    made already (a caller running one setup at many arrival rates saves building its clock).
    `stop(state)`, asked after each chunk of requests, ends the run early: simulate returns None
    (a search that needs only a verdict stops once it is certain).
    """
    setup = make_setup(workload, allocator) if setup is None else setup
    if workload.parallel is not None:  # DP ranks in lockstep: data_parallel.py
        from kvplan.sim.data_parallel import simulate_data_parallel

        return simulate_data_parallel(workload, allocator, progress=progress, record_requests=record_requests,
                                      timeline_points=timeline_points, slo=slo_of(workload, setup))
    slo = slo_of(workload, setup)
    state = new_state(setup, timeline_points)
    for chunk in prepared_chunks(workload, setup):
        state.load(chunk)
        state.run(final=False, progress=progress)
        if stop is not None and stop(state):
            return None
    state.run(final=True, progress=progress)
    return build_result(state.raw(), setup, record_requests=record_requests, slo=slo)


def slo_of(workload: Workload, setup: SimSetup):
    """The workload's `slo:` (None without one); its limits are seconds, so it needs a run timed
    in seconds (a gpu), or it is refused naming `slo`."""
    slo = workload.spec.slo if workload.spec is not None else None
    if slo is not None and setup.clock.unit != "s":
        raise WorkloadError("limits in seconds need a run timed in seconds: give the workload a gpu",
                            field="slo")
    return slo


def simulate_all(workload: Workload, *, progress_for: Callable[[int], Callable | None] = lambda i: None,
                 record_requests: bool = False) -> list[ServeResult]:
    """Every allocator of the workload; a paged one whose prefix cache found anything is followed
    by the same run with caching off ("paged-B16 no-cache"), so the two read side by side, and
    one whose CPU tier found anything, first by the same run without the tier ("no-offload")."""
    results = []
    for i, spec in enumerate(workload.allocators):
        result = simulate(workload, spec, progress=progress_for(i), record_requests=record_requests)
        results.append(result)
        if result.offload is not None and result.offload["hit_tokens"] > 0 and spec.offload is None:
            results.append(simulate(workload, replace(spec, offload=False),
                                    progress=progress_for(i), record_requests=record_requests))
        if result.prefix is not None and result.prefix.prefill_tokens_saved > 0 and spec.prefix_caching is None:
            results.append(simulate(workload, replace(spec, prefix_caching=False),
                                    progress=progress_for(i), record_requests=record_requests))
    return results


def serve_document(workload: Workload, *,
                   progress: Callable[[int, int], None] | None = None) -> dict:
    """Every allocator of a serve workload, as plain data (the shape of `capacity_document`)."""
    return document_of(workload, simulate_all(workload, progress_for=lambda i: progress))


def document_of(workload: Workload, results: list[ServeResult]) -> dict:
    """The serve document of results already simulated, one per allocator of the workload."""
    doc = {
        "workload": workload.name, "experiment": "serve", "pool_slots": workload.pool.slots,
        "num_requests": workload.num_requests,
        "time_unit": results[0].time_unit if results else None,
        "results": [r.to_dict() for r in results],
    }  # fmt: skip
    if workload.parallel is not None:  # one rank's pool and clock; the ranks together (kvplan/sim/data_parallel.py)
        doc["parallel"] = {**workload.parallel.to_dict(), "pool_slots_per_rank": workload.pool.slots}
    run = workload.speculative
    if run is not None:  # what speculative decoding was simulated with (kvplan/sim/speculative.py)
        doc["speculative"] = {**run.setting.to_dict(),
                              "draft_kv_bytes_per_token": run.draft.kv_bytes_per_token if run.draft else None,
                              "draft_weight_bytes_per_gpu": run.draft.weight_bytes_per_gpu if run.draft else None}
    return doc
