"""One SGLang server's state in the compiled kernel (kernel.py's sg_* functions), fed chunk by chunk.

The arrays of sg_run, grown as request chunks load, and what a caller may ask of a run in
progress. It answers to the same names as engine.KernelState (`load`, `advance`, `run`,
`outstanding`, `waiting`, `blocks_in_use`, `holds_node`, `busy_ticks`, `columns`, `raw`), so a
fleet's replica or a search's early stop drives either engine alike. A run fed its requests in
chunks, each run up to its last arrival or a horizon before the next is loaded, is the run fed
everything at once, to the byte (sg_run stops only between iterations, and an iteration sees
only arrivals up to its own clock).

What the SGLang server reports (its get_stats): token_usage counts the pool's tokens that neither
are free nor lie in the radix tree's evictable leaves, so `blocks_in_use` (page size 1: tokens)
leaves the evictable ones out, as a router scraping it sees; `waiting` counts the requests sent
and not running (the waiting queue, a retracted one among them)."""

from __future__ import annotations

import numpy as np

from kvplan.errors import WorkloadError
from kvplan.memory.prefix_cache import PrefixCacheStats
from kvplan.sim import kernel as K
from kvplan.sim.prefix_ids import PrefixTrie
from kvplan.sim.state import EVENTS_PER_CALL, EngineState, RequestColumns, grown, grown_rows
from kvplan.sim.inputs import PreparedChunk, SimSetup
from kvplan.sim.metrics import INTEGRALS, RawRun
from kvplan.sim.sampling import TIMELINE_POINTS, initial_delta
from kvplan.sim.sglang import new_token_ratios, stalled_sglang


class SglangState(EngineState):
    """SGLang's scheduler over the requests loaded so far (see the module docstring)."""

    def __init__(self, setup: SimSetup, cfg: np.ndarray, timeline_points: int = TIMELINE_POINTS):
        """`cfg`: the kernel's settings for this setup (engine.new_state makes them)."""
        g = setup.sglang
        self.setup = setup
        self.cfg = cfg
        self.st = np.zeros(K.NUM_SCALARS, dtype=np.int64)
        self.st[K.FREE_BLOCKS] = setup.slots
        self.st[K.SAMPLE_EVERY] = initial_delta(setup.clock)
        self.sr = np.zeros((0, K.NUM_S), dtype=np.int64)
        self.wq = np.zeros(1, dtype=np.int64)
        # the identity blocks' trie nodes of every loaded request, and the radix tree's nodes
        self.ids = np.zeros(1, dtype=np.int64)
        self.nd = self._nodes(1)
        self.n_ids = 0
        init, low, decay = new_token_ratios(g.schedule_conservativeness)
        self.gf = np.array([init, low, decay, init, 0.0], dtype=np.float64)
        self.gcfg = np.zeros(K.NUM_G, dtype=np.int64)
        self.gcfg[K.G_LPM] = int(g.schedule_policy == "lpm" and g.radix_cache)
        self.gcfg[K.G_RADIX] = int(g.radix_cache)
        self.gcfg[K.G_MAX_RUNNING] = g.max_running_requests
        self.gcfg[K.G_CHUNK] = g.chunked_prefill_size
        self.gcfg[K.G_MAX_PREFILL] = g.max_prefill_tokens
        self.gcfg[K.G_H] = 1
        self.gst = np.zeros(K.NUM_GS, dtype=np.int64)
        self.gst[K.GS_CHUNKED] = self.gst[K.GS_LRU_HEAD] = self.gst[K.GS_LRU_TAIL] = -1
        cap = g.max_running_requests + 2
        self.rq, self.bt, self.bn, self.order = (np.zeros(cap, dtype=np.int64) for _ in range(4))
        self.timeline = np.zeros((timeline_points, 8), dtype=np.int64)
        self.acc = np.zeros((K.NUM_INTEGRALS, 4), dtype=np.int64)
        self.clipped = 0
        self.sent: list[np.ndarray] = []
        self.has_ids = False

    @staticmethod
    def _nodes(n: int) -> np.ndarray:
        nd = np.zeros((n, K.NUM_N), dtype=np.int64)
        nd[:, K.N_PARENT] = nd[:, K.N_PREV] = nd[:, K.N_NEXT] = -1
        return nd

    @property
    def waiting(self) -> int:
        """Requests loaded and neither running nor finished: the waiting queue (SGLang's
        num_queue_reqs), a request between its prefill chunks, and those not yet taken in."""
        batch = self.rq[:int(self.gst[K.GS_NRUN])]
        return self.outstanding - int((self.sr[batch, K.S_DONE] == 0).sum())

    @property
    def blocks_in_use(self) -> int:
        """Tokens of the pool that are neither free nor evictable (SGLang's token_usage x pool)."""
        return self.setup.slots - int(self.st[K.FREE_BLOCKS]) - int(self.gst[K.GS_EVICTABLE])

    def holds_node(self, node: int, per: int) -> bool:
        """Whether the radix tree holds trie node `node` (every one of its tokens)."""
        return node < len(self.nd) and self.nd[node, K.N_CACHED] != 0

    def columns(self) -> RequestColumns:
        sr = self.sr[:self.loaded]
        return RequestColumns(sr[:, K.S_ARRIVAL], sr[:, K.S_FIRST], sr[:, K.S_FINISH], sr[:, K.S_OUTPUT])

    def load(self, chunk: PreparedChunk) -> None:
        """Append a chunk's requests (the tables grown by doubling)."""
        n, m = self.loaded, len(chunk)
        self.sr = grown_rows(self.sr, n + m)
        self.wq = grown(self.wq, len(self.sr), 0)  # the waiting queue holds every request at most
        rows = self.sr[n:n + m]
        rows[:] = 0
        rows[:, K.S_ARRIVAL], rows[:, K.S_PROMPT], rows[:, K.S_OUTPUT] = chunk.arrival, chunk.prompt, chunk.output
        rows[:, K.S_TARGET] = chunk.prompt
        rows[:, K.S_ADMITTED:K.S_FINISH + 1] = -1
        self._took(chunk, rows, n)

    def _load_ids(self, rows: np.ndarray, ids) -> None:
        """Append a chunk's identity blocks; a trie node seen for the first time gets its row of
        the tree, its parent the node before it on the prompt's path."""
        if not self.has_ids:
            self.gcfg[K.G_H] = ids.per
            self.has_ids = True
        elif int(self.gcfg[K.G_H]) != ids.per:
            raise WorkloadError("the stream's hash block size changed", field="requests")
        counts, nodes = ids.counts, ids.nodes
        rows[:, K.S_ID_COUNT] = counts
        rows[:, K.S_ID_START] = self.n_ids + np.concatenate(([0], np.cumsum(counts)[:-1]))
        self.ids = grown(self.ids, self.n_ids + len(nodes), 0)
        self.ids[self.n_ids:self.n_ids + len(nodes)] = nodes
        self.n_ids += len(nodes)
        if len(nodes):
            top = int(nodes.max()) + 1
            if top > len(self.nd):
                tree = self._nodes(max(2 * len(self.nd), top))
                tree[:len(self.nd)] = self.nd
                self.nd = tree
            first = np.zeros(len(nodes), dtype=bool)
            first[np.concatenate(([0], np.cumsum(counts)[:-1]))[counts > 0]] = True
            inner = np.flatnonzero(~first)
            self.nd[nodes[inner], K.N_PARENT] = nodes[inner - 1]  # a node's parent never changes

    def _compact(self, trie: PrefixTrie) -> None:
        """The open requests' identity nodes packed when enough of them are finished; the trie
        keeps the nodes they name and those in the tree (with every ancestor), and when it
        renumbers them, so are the ids and the tree's rows and links."""
        n, gst = trie.num_nodes, self.gst
        rids, counts, nodes = self._open_ids(self.sr, K.S_FINISH, K.S_ID_START, K.S_ID_COUNT)
        live = self.nd[:n, K.N_CACHED] != 0
        live[nodes] = True
        remap = trie.compact(live)
        self._keep_ids(self.sr, K.S_ID_START, rids, counts, nodes, remap)
        if remap is None:
            return
        kept = np.flatnonzero(remap >= 0)
        nd = self._nodes(max(len(kept), 1))
        nd[:len(kept)] = self.nd[kept]
        for col in (K.N_PARENT, K.N_PREV, K.N_NEXT):  # a link to a dropped node is a stale one
            links = nd[:len(kept), col]
            links[:] = np.where(links >= 0, remap[np.maximum(links, 0)], -1)
        for end in (K.GS_LRU_HEAD, K.GS_LRU_TAIL):
            if gst[end] >= 0:
                gst[end] = remap[gst[end]]
        self.nd = nd

    def _kernel(self) -> int:
        return K.sg_run(self.cfg, self.gcfg, self.st, self.gst, self.gf, self.sr, self.ids, self.nd, self.wq,
                        self.rq, self.bt, self.bn, self.order, self.timeline, self.acc, EVENTS_PER_CALL)

    def _stalled(self) -> WorkloadError:
        return stalled_sglang()

    def raw(self) -> RawRun:
        sums, st = self._integrals(), self.st
        sr, radix = self.sr[:self.loaded], bool(self.gcfg[K.G_RADIX])

        def col(field):
            return sr[:, field].copy()

        return RawRun(
            arrival=col(K.S_ARRIVAL), admitted=col(K.S_ADMITTED), first_token=col(K.S_FIRST), finish=col(K.S_FINISH),
            prompt=col(K.S_PROMPT), output=col(K.S_OUTPUT), preemptions=col(K.S_PREEMPTED),
            clipped=self.clipped, steps=int(st[K.STEPS]), preemptions_total=int(st[K.PREEMPTIONS]),
            swap_outs=0, recomputed_tokens=int(st[K.RECOMPUTED]), peak_running=int(st[K.PEAK_RUNNING]),
            t_origin=int(st[K.ORIGIN]), t_end=int(st[K.NOW]), integrals=dict(zip(INTEGRALS, sums)),
            timeline=self.timeline[:int(st[K.SAMPLES])].copy(), timeline_delta=int(st[K.SAMPLE_EVERY]),
            sent=np.concatenate(self.sent) if self.sent else None,
            prefix=PrefixCacheStats(*(int(st[k]) for k in (K.PC_LOOKUPS, K.PC_QUERY_TOKENS, K.PC_HIT_TOKENS,
                                                           K.PC_PREFILL_SAVED, K.PC_BLOCKS_EVICTED,
                                                           K.PC_BLOCKS_REUSED)))
            if radix else None,
            hit_tokens=col(K.S_HIT) if radix else None,
        )  # fmt: skip
