"""The fast discrete-event serving simulator: `simulate(workload, allocator)`.

Same semantics as the step-by-step reference (`reference.py`, whose docstring defines them), and
the same result to the last bit; it is fast because it does not step token by token. Between
events (an arrival that could be admitted, a finish, a block the pool cannot serve, a prefill)
the running batch only decodes, and the compiled kernel (`kernel.py`) advances over all those
steps in one closed-form jump. Requests are read lazily chunk by chunk; per request the engine
keeps one row of 12 int64 (96 bytes), and the running batch is a small array of request ids.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from kvplan.sim import kernel as K
from kvplan.sim.inputs import PreparedChunk, SimSetup, make_setup, prepared_chunks
from kvplan.sim.metrics import INTEGRALS, RawRun, ServeResult, build_result
from kvplan.sim.sampling import TIMELINE_POINTS, initial_delta
from kvplan.workload.records import AllocatorSpec, Workload

EVENTS_PER_CALL = 200_000  # kernel events between progress reports


def _config(setup: SimSetup, timeline_points: int) -> np.ndarray:
    s, c = setup.sched, setup.clock
    cf = np.zeros(K.NCONF, dtype=np.int64)
    values = {
        K.C_PAGED: setup.paged, K.C_B: setup.block_size, K.C_NB: setup.num_blocks,
        K.C_SLOTS: setup.slots, K.C_SEQS: s.max_num_seqs, K.C_TOK: s.max_num_batched_tokens,
        K.C_CHUNK: s.chunked_prefill, K.C_SWAP: s.preemption == "swap",
        K.C_SWSLOTS: s.swap_slots, K.C_TIMED: c.timed, K.C_OVH: c.overhead, K.C_W: c.weights,
        K.C_KV: c.kv_per_token, K.C_FLOP: c.compute_per_token, K.C_TAIL: setup.tail_slots,
        K.C_TLMAX: timeline_points, K.C_QCAP: s.max_num_seqs + 1,
    }  # fmt: skip
    for key, value in values.items():
        cf[key] = int(value)
    return cf


class KernelState:
    """The arrays the kernel works on, and the loading of request chunks into them."""

    def __init__(self, setup: SimSetup, timeline_points: int = TIMELINE_POINTS):
        if timeline_points < 2 or timeline_points % 2:
            raise ValueError(f"timeline points must be an even number >= 2, got {timeline_points}")
        self.setup = setup
        seqs = setup.sched.max_num_seqs
        self.cf = _config(setup, timeline_points)
        self.st = np.zeros(K.NSTATE, dtype=np.int64)
        self.st[K.S_FREE] = setup.num_blocks if setup.paged else 0
        self.st[K.S_TLD] = initial_delta(setup.clock)
        self.rq = np.zeros((0, K.NFIELDS), dtype=np.int64)
        self.runq = np.zeros(seqs, dtype=np.int64)
        self.work = np.zeros(seqs, dtype=np.int64)
        self.qbuf = np.zeros(seqs + 1, dtype=np.int64)
        self.wbuf = np.zeros(seqs + 1, dtype=np.int64)
        self.frs = np.zeros(seqs + 2, dtype=np.int64)
        self.frl = np.zeros(seqs + 2, dtype=np.int64)
        self.frl[0] = setup.slots
        self.st[K.S_NFR] = 1
        self.tl = np.zeros((timeline_points, 8), dtype=np.int64)
        self.acc = np.zeros((K.NACC, 4), dtype=np.int64)
        self.clipped = 0

    @property
    def loaded(self) -> int:
        return int(self.st[K.S_NLOAD])

    def load(self, chunk: PreparedChunk) -> None:
        """Append a chunk's requests (growing the table by doubling)."""
        n, m = self.loaded, len(chunk)
        if n + m > len(self.rq):
            grown = np.zeros((max(2 * len(self.rq), n + m, 1024), K.NFIELDS), dtype=np.int64)
            grown[:n] = self.rq[:n]
            self.rq = grown
        rows = self.rq[n:n + m]
        rows[:] = 0
        rows[:, K.ARR], rows[:, K.PRM], rows[:, K.OUT] = chunk.arrival, chunk.prompt, chunk.output
        rows[:, K.TGT], rows[:, K.RSV] = chunk.prompt, chunk.reserve
        rows[:, K.ADM:K.FIN + 1] = -1  # admitted, first token, finish: not yet
        if n == 0:
            self.st[K.S_T] = self.st[K.S_ORIGIN] = chunk.arrival[0]
        self.st[K.S_NLOAD] = n + m
        self.clipped += chunk.clipped

    def run(self, final: bool, progress: Callable[[int, int], None] | None = None) -> None:
        """Simulate as far as the loaded requests allow (to the end when `final`)."""
        if self.loaded == 0:
            return
        self.st[K.S_FINAL] = int(final)
        while True:
            code = K.run(self.cf, self.st, self.rq, self.runq, self.work, self.qbuf, self.wbuf,
                         self.frs, self.frl, self.tl, self.acc, EVENTS_PER_CALL)
            if progress is not None:
                progress(int(self.st[K.S_DONE]), self.loaded)
            if code != 2:
                return

    def raw(self) -> RawRun:
        n = self.loaded
        rq, st = self.rq[:n], self.st
        if n and int(st[K.S_DONE]) != n:
            left = n - int(st[K.S_DONE])
            raise AssertionError(f"the simulation ended with {left} requests unfinished")
        integrals = {name: sum(int(limb) << (31 * i) for i, limb in enumerate(self.acc[row]))
                     for row, name in enumerate(INTEGRALS)}

        def col(field):
            return rq[:, field].copy()

        return RawRun(
            arrival=col(K.ARR), admitted=col(K.ADM), first_token=col(K.FTOK), finish=col(K.FIN),
            prompt=col(K.PRM), output=col(K.OUT), preemptions=col(K.NPRE), clipped=self.clipped,
            steps=int(st[K.S_STEPS]), preemptions_total=int(st[K.S_PRE]),
            swap_outs=int(st[K.S_SWO]), recomputed_tokens=int(st[K.S_RECOMP]),
            peak_running=int(st[K.S_PEAK]), t_origin=int(st[K.S_ORIGIN]), t_end=int(st[K.S_T]),
            integrals=integrals, timeline=self.tl[:int(st[K.S_TLN])].copy(),
            timeline_delta=int(st[K.S_TLD]),
        )  # fmt: skip


def simulate(workload: Workload, allocator: AllocatorSpec, *,
             progress: Callable[[int, int], None] | None = None,
             record_requests: bool = False,
             timeline_points: int = TIMELINE_POINTS) -> ServeResult:
    """Replay the workload's requests through one allocator, as a continuous-batching server would.

    `progress(completed, loaded)` is called now and then. `record_requests` keeps per-request
    columns in the result (`ServeResult.requests`). Raises WorkloadError for settings that could
    never serve a request (see `inputs.make_setup`).
    """
    setup = make_setup(workload, allocator)
    state = KernelState(setup, timeline_points)
    for chunk in prepared_chunks(workload, setup):
        state.load(chunk)
        state.run(final=False, progress=progress)
    state.run(final=True, progress=progress)
    return build_result(state.raw(), setup, record_requests=record_requests)


def serve_document(workload: Workload, *,
                   progress: Callable[[int, int], None] | None = None) -> dict:
    """Every allocator of a serve workload, as plain data (the shape of `capacity_document`)."""
    results = [simulate(workload, spec, progress=progress) for spec in workload.allocators]
    return document_of(workload, results)


def document_of(workload: Workload, results: list[ServeResult]) -> dict:
    """The serve document of results already simulated, one per allocator of the workload."""
    return {
        "workload": workload.name, "experiment": "serve", "pool_slots": workload.pool.slots,
        "num_requests": workload.num_requests,
        "time_unit": results[0].time_unit if results else None,
        "results": [r.to_dict() for r in results],
    }  # fmt: skip
