"""The fast engine's compiled core: the reference's step, plus closed-form jumps between events.

Every compiled function lives in this one file on purpose: numba's on-disk cache is invalidated
per source file, so a callee in another file could be edited and leave a stale compiled caller.

The state is plain int64 arrays, made and loaded by `engine.KernelState`; each index below has a
name and a one-line meaning. The arrays every function takes, always in this order:

    cfg        settings of the run, fixed from start to end      cfg[SETTING]
    st         scalar state: the clock, queue heads, counters    st[SCALAR]
    req        one row per loaded request, in arrival order     req[rid, COLUMN]
    running    the running batch: request ids in admission order, running[0:st[NUM_RUNNING]]
    sched      tokens scheduled this step for running[i]
    requeued   ring buffer of requests preempted by recompute; they wait ahead of new arrivals
    swapped    ring buffer of requests swapped out to the CPU pool; they resume first
    run_start, run_len   contiguous allocators: the free runs of slots, sorted by start
    timeline   memory samples at fixed times, one row each (columns in `record_sample`)
    acc        time integrals as exact 124-bit sums: acc[ACC_ROW, limb], four limbs of 31 bits
    px         prefix caching (cfg[PREFIX] = 1; else four 1-element dummies), four int64 arrays:
               px[0] trie node of each identity (hash) block of every loaded request, from
               req[rid, ID_START]; px[1] the cached entry each request holds per identity block,
               from req[rid, E_START]; px[2] per block node (trie node x PER + sub-block) its
               first cached copy (-1: none); px[3] the cached entries, NE int64 each (E_* below)
    cx         a CPU tier (cfg[OFFLOAD] = 1), three int64 arrays: cx[0] per block node its CPU
               slot (-1: none), cx[1] the CPU slots, NS int64 each (C_* below), cx[2] the ring of
               requests loading. None without a tier: numba then compiles every branch under a
               bare `if cx is not None:` out (it prunes no other form of the test), so a run
               without a tier passes its hot functions no tier arrays (an array costs every call
               seven scalar arguments and a reference count); only functions with tier work take cx

The waiting queue is the requeued ring first, then the arrivals from req[st[NEXT_FRESH]] on
whose arrival tick has passed.

The three rules that decide everything, each on one screen below: `admit` (FCFS admission while
memory, max_num_seqs and the token budget allow, no skipping), `schedule_running` with `preempt`
(the running batch first; when blocks run out the most recently admitted request is preempted),
and `try_jump` with `do_jump` (the closed-form jump). A jump covers k decode-only steps in which
nothing can change but token counts: every running request decodes, none finishes before step
k - 1, no admission is possible (the head of the queue does not fit, and memory only shrinks
while nobody finishes), no preemption is needed (the blocks the k steps take fit in the free
pool), and no arrival could be admitted. Its time, integrals, blocks and timeline samples are
summed in closed form, in integers, so they equal the step-by-step sums exactly. With prefix
caching, a block shared by several running requests counts once (SHARED); with vLLM's hybrid
layer groups (cfg[HYBRID]) the run takes no jumps and steps one at a time, and so does a run with
speculative decoding (cfg[SPEC_K] > 0: a step's tokens depend on each request's draws; the spec_*
functions, kvplan/sim/speculative.py has the rules).

SGLang's scheduler (`engine: sglang`, kvplan/sim/sglang.py) has its own functions at the end of
this file (sg_*, driven by sg_run), on arrays of its own besides cfg, st, timeline and acc.
"""

from __future__ import annotations

import numpy as np

try:
    from numba import njit
except ImportError:  # pragma: no cover - numba is a dependency; this keeps the code importable

    def njit(*args, **kwargs):
        return args[0] if args and callable(args[0]) else (lambda f: f)


# -- req[rid, COLUMN]: one row per request ---------------------------------------------------------
ARRIVAL = 0         # tick it arrives
PROMPT = 1          # prompt tokens
OUTPUT = 2          # output tokens it generates in all
GENERATED = 3       # output tokens generated so far
HELD = 4            # tokens whose KV is computed and kept (prompt and output so far)
PREFILL_END = 5     # HELD must reach this before it samples again: the prompt, or after a recompute
                    # preemption the prompt plus what it had generated
BLOCKS = 6          # paged: blocks it holds now
START = 6           # contiguous: the first slot of its reservation (the same column as BLOCKS)
RESERVED = 7        # contiguous: slots reserved at admission by the policy; paged: unused
ADMITTED_AT = 8     # tick of its first admission (-1 before)
FIRST_TOKEN_AT = 9  # tick its first output token came out (-1 before)
FINISHED_AT = 10    # tick it finished (-1 before)
PREEMPTED = 11      # times it was preempted
ID_START = 12       # prefix caching: its first entry in the flat array of trie nodes (px[0])
ID_BLOCKS = 13      # prefix caching: its full prompt blocks that have an identity (F)
E_START = 14        # prefix caching: its first slot in px[1], the cached entry held per identity block
CACHED = 15         # prefix caching: leading identity blocks held as cached entries (hit or registered)
HIT_TOKENS = 16     # prefix caching: prompt tokens its first admission found cached
SKIPPED = 17        # hybrid: blocks per sliding-window group it has released (out of the window)
PRELOAD = 18        # prompt tokens whose KV arrives computed (a disaggregated decode replica's
                    # requests, their KV sent by a prefill replica); it admits holding them, and
                    # a recompute preemption drops them (its prefill is then all its own)
READY_AT = 19       # offload: tick its load from the CPU tier ends (-1: not loading, or load done)
STORED = 20         # offload: its identity blocks offered to the CPU tier so far (the next to store)
NUM_COLUMNS = 21

# -- st[SCALAR]: the scalar state ------------------------------------------------------------------
NOW = 0             # the clock, in ticks
NEXT_FRESH = 1      # first request that has never left the arrivals (before it: admitted once)
LOADED = 2          # requests loaded into req so far
ALL_LOADED = 3      # 1 once the last chunk is loaded (else stop before passing the last arrival)
NUM_RUNNING = 4     # requests in the running batch
FREE_BLOCKS = 5     # paged: free blocks in the pool
SWAP_USED = 6       # token slots in use in the CPU swap pool
REQUEUE_HEAD = 7    # index in `requeued` of the first request waiting after a recompute preemption
REQUEUE_LEN = 8     # requests in `requeued`
SWAPPED_HEAD = 9    # index in `swapped` of the first swapped-out request
SWAPPED_LEN = 10    # requests in `swapped`
NUM_FREE_RUNS = 11  # contiguous: free runs in run_start/run_len
STEPS = 12          # scheduler steps simulated (a jump of k steps counts k)
PREEMPTIONS = 13    # preemptions in all
SWAP_OUTS = 14      # preemptions that swapped out rather than recomputed
RECOMPUTED = 15     # tokens whose KV recompute preemptions dropped
PEAK_RUNNING = 16   # largest running batch of any step
DONE = 17           # requests finished
ORIGIN = 18         # tick of the first arrival: timeline samples fall at ORIGIN + k x SAMPLE_EVERY
SAMPLE_K = 19       # k of the next timeline sample
SAMPLE_EVERY = 20   # ticks between timeline samples (doubles whenever the buffer fills)
SAMPLES = 21        # rows of `timeline` in use
EVENTS = 22         # loop iterations: steps, jumps and idle gaps
JUMPS = 23          # closed-form jumps taken
Q_HEAD = 24         # prefix caching: first cached entry of the free queue (-1: none)
Q_TAIL = 25         # prefix caching: last cached entry of the free queue (-1: none)
ANON_TAIL = 26      # prefix caching: free blocks without a cached entry behind the queue's last entry
E_RECYCLED = 27     # prefix caching: head of the stack of evicted entry ids (-1: none)
E_NEW = 28          # prefix caching: entry ids never used start here
SHARED = 29         # prefix caching: blocks held by more than one running request, counted once less
                    # each: sum of CACHED over the running batch minus the distinct entries they hold
PC_LOOKUPS = 30         # prefix caching: first admissions looked up
PC_QUERY_TOKENS = 31    # prefix caching: their prompt tokens
PC_HIT_TOKENS = 32      # prefix caching: their prompt tokens found cached
PC_PREFILL_SAVED = 33   # prefix caching: tokens found cached at every admission (re-admissions too)
PC_BLOCKS_EVICTED = 34  # prefix caching: cached blocks evicted for new data
PC_BLOCKS_REUSED = 35   # prefix caching: hits on a cached block no running request held
HORIZON = 36        # before the last chunk: the run may go on to this tick even past the last
                    # arrival loaded (a fleet's router has sent it nothing before then); 0: none
IDLE = 37           # ticks spent idle, nothing running or waiting (busy time = span - IDLE)
LD_HEAD = 38        # offload: index in cx[2] of the first request loading (or loaded, waiting to run)
LD_LEN = 39         # offload: requests in cx[2]
LINK_FREE = 40      # offload: tick the host-to-device link finishes the loads started so far
LD_TOKENS = 41      # offload: tokens held by the requests in cx[2] (counted as held, as vLLM allocates them)
LD_BLOCKS = 42      # offload: blocks held by the requests in cx[2]
CPU_HEAD = 43       # offload: least recently used CPU slot (-1: none)
CPU_TAIL = 44       # offload: most recently used CPU slot
CPU_USED = 45       # offload: CPU slots holding a block (never falls: an eviction refills its slot)
CPU_PINNED = 46     # offload: CPU slots being loaded (C_REF > 0)
CPU_STAMP = 47      # offload: number of the last store batch (C_STAMP marks a batch's own blocks)
OF_QUERY_TOKENS = 48    # offload: first admissions' prompt tokens the GPU prefix cache did not hold
OF_HIT_TOKENS = 49      # offload: of those, the tokens found in the CPU tier
OF_LOADS = 50           # offload: loads started
OF_BLOCKS_LOADED = 51   # offload: blocks they load
OF_LOAD_TICKS = 52      # offload: their transfer ticks
OF_STORED = 53          # offload: blocks stored in the CPU tier
OF_EVICTED = 54         # offload: blocks evicted from it
NUM_SCALARS = 55

# -- cfg[SETTING]: fixed for the run ---------------------------------------------------------------
PAGED = 0           # 1 paged, 0 contiguous
BLOCK_SIZE = 1      # paged: tokens per block
NUM_BLOCKS = 2      # paged: blocks in the pool
SLOTS = 3           # token slots in the pool
MAX_SEQS = 4        # max_num_seqs
TOKEN_BUDGET = 5    # max_num_batched_tokens: tokens one step may process
CHUNKED_PREFILL = 6 # 1 when a prefill may be split across steps
SWAP = 7            # 1 when preemption swaps out (falling back to recompute when the CPU pool is full)
SWAP_SLOTS = 8      # token slots of the CPU swap pool
TIMED = 9           # 1 when steps take modelled time; 0: every step is one tick
OVERHEAD = 10       # ticks every step costs regardless of its work
WEIGHT_TICKS = 11   # ticks to read the weights once
KV_TICKS = 12       # ticks to read one token's KV
FLOP_TICKS = 13     # ticks of compute per processed token
TAIL_SLOTS = 14     # paged: pool slots beyond the last whole block (external fragmentation)
MAX_SAMPLES = 15    # rows of `timeline`
QUEUE_CAP = 16      # capacity of the `requeued` and `swapped` rings
MAX_JUMP = 17       # most steps one jump covers: KCAP, or fewer when steps are so long that a
                    # jump's closed-form time would not fit in int64
PHYSICAL = 18       # 1: the physical step model (kvplan/model/step_time.py); 0: the plain roofline
REQ_TICKS = 19      # physical: ticks per scheduled request
ATTN_TICKS = 20     # physical: ticks per prefill attention pair (a chunk token x an earlier token)
LIN_LEN = 21        # physical: entries of the per-step-tokens table at cfg[NUM_SETTINGS:]
LIN_SLOPE = 22      # physical: ticks per token beyond the table's last entry
PREFIX = 23         # 1: automatic prefix caching (paged, requests with block identities)
PER = 24            # prefix caching: simulated blocks per trace hash block (H / B)
HYBRID = 25         # 1: vLLM's hybrid KV cache manager rules (layer groups of several kinds)
HY_FULL = 26        # hybrid: full-attention groups (a block each per B tokens)
HY_SLIDE = 27       # hybrid: sliding-window groups
HY_WINDOW = 28      # hybrid: their window, in tokens
HY_STATE = 29       # hybrid: blocks of recurrent state a request holds (groups x pages)
HY_KV_FULL = 30     # hybrid: KV bytes per token of the full-attention layers
HY_KV_SLIDE = 31    # hybrid: KV bytes per token of the sliding-window layers
HOST_TICKS = 32     # physical, async scheduling: the engine core's host ticks a step (overlaps the GPU)
HOST_REQ_TICKS = 33 # physical, async scheduling: its host ticks per scheduled request
OFFLOAD = 34        # 1: a CPU tier behind the prefix cache (kvplan/sim/offload.py; needs PREFIX)
CPU_BLOCKS = 35     # offload: blocks the CPU tier holds
LOAD_TICKS = 36     # offload: ticks one block takes to load over the host-to-device link
SPEC_K = 37         # speculative decoding (kvplan/sim/speculative.py): drafts per decode step; 0: none
SPEC_LOOKAHEAD = 38 # speculative: KV slots a running request's allocation adds for the drafter
SPEC_SEED = 39      # speculative: the seed of the acceptance draws
SPEC_VERIFY = 40    # speculative, physical: ticks of the target's lm_head on one draft position
SPEC_OVERHEAD = 41  # speculative, physical: ticks of a draft pass whatever its tokens (0: no pass, n-gram)
SPEC_REQ = 42       # speculative, physical: ticks of a draft pass per request
SPEC_KV = 43        # speculative, physical: ticks of the draft layers reading one token of KV
SPEC_ATTN = 44      # speculative, physical: ticks of the draft layers' attention per prefill pair
SPEC_LIN_AT = 45    # speculative: cfg index of the draft's linear-ticks table (0, 1, ... tokens)
SPEC_LIN_LEN = 46   # speculative: its entries
SPEC_LIN_SLOPE = 47 # speculative: ticks per token beyond it
SPEC_THR_AT = 48    # speculative: cfg index of the k acceptance thresholds (out of 2^32)
SPEC_MAX_LEN = 49   # speculative: max_model_len, which caps a step's drafts and its lookahead slots
NUM_SETTINGS = 50   # cfg[NUM_SETTINGS + n]: ticks of the linear layers and all-reduces for n tokens

# -- acc[ACC_ROW, limb]: time integrals of ... dt ----------------------------------------------------
# np.int64, not Python ints: numba compiles a separate copy of a function for every distinct int
# literal argument.
ACC_TIME = np.int64(0)       # dt: the simulated time
ACC_RUNNING = np.int64(1)    # running requests x dt
ACC_TOKENS = np.int64(2)     # tokens held x dt
ACC_ALLOCATED = np.int64(3)  # slots allocated x dt
ACC_FINAL_LEN = np.int64(4)  # contiguous: final lengths of the running requests x dt
ACC_EXTERNAL = np.int64(5)   # externally fragmented slots x dt
ACC_SHARED = np.int64(6)     # jumps only: SHARED x B x dt, taken off tokens and allocated at the end
NUM_INTEGRALS = 7

ZERO, ONE = np.int64(0), np.int64(1)
KCAP = 1 << 16  # longest jump: keeps every closed-form partial sum inside int64
INF = 1 << 62
CLOCK_LIMIT = 1 << 62  # the run stops (code 3) once the clock passes this: about 53 days in ps
M31 = (1 << 31) - 1

# -- exact arithmetic ----------------------------------------------------------------------------


@njit(cache=True)
def mac(acc, row, x, y):
    """acc[row] += x * y exactly, for 0 <= x, y < 2**62 (limbs of 31 bits, no int64 overflow)."""
    x0, x1, y0, y1 = x & M31, x >> 31, y & M31, y >> 31
    lo, mid, hi = x0 * y0, x0 * y1 + x1 * y0, x1 * y1
    acc[row, 0] += lo & M31
    acc[row, 1] += (lo >> 31) + (mid & M31)
    acc[row, 2] += (mid >> 31) + (hi & M31)
    acc[row, 3] += hi >> 31
    for i in range(3):
        acc[row, i + 1] += acc[row, i] >> 31
        acc[row, i] &= M31


@njit(cache=True)
def cdiv(a, b):
    return -((-a) // b)


@njit(cache=True)
def sum_i(n):
    """Sum of i for 0 <= i < n."""
    return n * (n - 1) // 2


@njit(cache=True)
def sum_i2(n):
    """Sum of i**2 for 0 <= i < n."""
    return (n - 1) * n * (2 * n - 1) // 6 if n > 0 else 0


@njit(cache=True)
def floor_sum(v, b):
    """Sum of floor(u / b) for 0 <= u < v."""
    q = v // b
    return b * sum_i(q) + (v - q * b) * q


@njit(cache=True)
def floor_sum_i(v, b):
    """Sum of u * floor(u / b) for 0 <= u < v."""
    q = v // b
    r = v - q * b
    return b * b * sum_i2(q) + (b * (b - 1) // 2) * sum_i(q) + q * (r * q * b + r * (r - 1) // 2)


@njit(cache=True)
def block_sums(h, length, b):
    """For `length` decode steps from h held tokens: sum over steps i of the blocks held during
    step i (ceil((h + i + 1) / b)), and the same sum weighted by i."""
    q0 = h // b
    r0 = h - q0 * b
    d1 = floor_sum(r0 + length, b) - floor_sum(r0, b)
    d2 = floor_sum_i(r0 + length, b) - floor_sum_i(r0, b)
    return length * (q0 + 1) + d1, (q0 + 1) * sum_i(length) + d2 - r0 * d1


# -- step time -----------------------------------------------------------------------------------


@njit(cache=True)
def linear_ticks(cfg, tokens):
    """Physical model: ticks of the linear layers and all-reduces of a step of `tokens` tokens."""
    last = cfg[LIN_LEN] - 1
    if tokens <= last:
        return cfg[NUM_SETTINGS + tokens]
    return cfg[NUM_SETTINGS + last] + (tokens - last) * cfg[LIN_SLOPE]


@njit(cache=True)
def step_dt(cfg, kv_read, tokens, nreq, pairs):
    """Ticks of one step that reads kv_read tokens of KV and processes `tokens` for nreq
    requests, its prefills attending over `pairs` token pairs (see timing.py): the physical
    model's sum of terms, or the roofline overhead + max(weights + KV read, compute)."""
    if cfg[TIMED] == 0:
        return 1
    if cfg[PHYSICAL] != 0:
        gpu = (cfg[OVERHEAD] + cfg[REQ_TICKS] * nreq + linear_ticks(cfg, tokens)
               + cfg[KV_TICKS] * kv_read + cfg[ATTN_TICKS] * pairs)
        host = cfg[HOST_TICKS] + cfg[HOST_REQ_TICKS] * nreq
        return gpu if gpu > host else host
    memory = cfg[WEIGHT_TICKS] + cfg[KV_TICKS] * kv_read
    compute = cfg[FLOP_TICKS] * tokens
    return cfg[OVERHEAD] + (memory if memory > compute else compute)


@njit(cache=True)
def jump_params(cfg, h0, n):
    """Decode steps j = 0, 1, ... of n requests holding h0 tokens: dt_j = flat for j < jstar,
    then base + slope * j (the KV read grows by n tokens a step). The physical model is linear
    from the first step (jstar 0), unless async scheduling's host time is the longer at first:
    then flat is that host time, until the growing GPU time passes it."""
    if cfg[TIMED] == 0:
        return 1, 0, 0, INF
    if cfg[PHYSICAL] != 0:
        base = cfg[OVERHEAD] + cfg[REQ_TICKS] * n + linear_ticks(cfg, n) + cfg[KV_TICKS] * h0
        slope = cfg[KV_TICKS] * n
        host = cfg[HOST_TICKS] + cfg[HOST_REQ_TICKS] * n
        if host <= base:
            return base, base, slope, 0
        return host, base, slope, (INF if slope == 0 else cdiv(host - base, slope))
    memory = cfg[WEIGHT_TICKS] + cfg[KV_TICKS] * h0
    compute = cfg[FLOP_TICKS] * n
    slope = cfg[KV_TICKS] * n
    if memory >= compute:
        jstar = 0
    elif slope == 0:
        jstar = INF
    else:
        jstar = cdiv(compute - memory, slope)
    return cfg[OVERHEAD] + compute, cfg[OVERHEAD] + memory, slope, jstar


@njit(cache=True)
def cum(j, flat, base, slope, jstar):
    """Ticks taken by the first j steps of a jump."""
    total = (j if j < jstar else jstar) * flat
    if j > jstar:
        total += (j - jstar) * base + slope * (sum_i(j) - sum_i(jstar))
    return total


# -- queues --------------------------------------------------------------------------------------


@njit(cache=True)
def arrived_by(st, req, x):
    """Index of the first loaded request (from NEXT_FRESH on) arriving after tick x."""
    lo, hi = st[NEXT_FRESH], st[LOADED]
    while lo < hi:
        mid = (lo + hi) // 2
        if req[mid, ARRIVAL] <= x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def waiting_head(st, req, requeued):
    """The request at the front of the waiting queue (requeued first, then arrivals), or -1."""
    if st[REQUEUE_LEN] > 0:
        return requeued[st[REQUEUE_HEAD]]
    f = st[NEXT_FRESH]
    if f < st[LOADED] and req[f, ARRIVAL] <= st[NOW]:
        return f
    return -1


@njit(cache=True)
def pop_head(cfg, st):
    """Take the head off the waiting queue (see waiting_head)."""
    if st[REQUEUE_LEN] > 0:
        st[REQUEUE_HEAD] = (st[REQUEUE_HEAD] + 1) % cfg[QUEUE_CAP]
        st[REQUEUE_LEN] -= 1
    else:
        st[NEXT_FRESH] += 1


@njit(cache=True)
def waiting_count(st, req, when):
    """Requests waiting at tick `when`: requeued, swapped out, loading from the CPU tier, and
    arrived but never admitted."""
    return st[REQUEUE_LEN] + st[SWAPPED_LEN] + st[LD_LEN] + arrived_by(st, req, when) - st[NEXT_FRESH]


# -- contiguous free runs (first fit, coalesced, sorted by start) --------------------------------


@njit(cache=True)
def first_fit(st, run_start, run_len, need):
    """Cut `need` slots from the first free run that holds them; its start, or -1."""
    nfr = st[NUM_FREE_RUNS]
    for j in range(nfr):
        if run_len[j] >= need:
            start = run_start[j]
            if run_len[j] == need:
                for m in range(j, nfr - 1):
                    run_start[m], run_len[m] = run_start[m + 1], run_len[m + 1]
                st[NUM_FREE_RUNS] = nfr - 1
            else:
                run_start[j] += need
                run_len[j] -= need
            return start
    return -1


@njit(cache=True)
def free_run(st, run_start, run_len, start, length):
    """Return a run of slots to the free list, merging it with its neighbours."""
    nfr = st[NUM_FREE_RUNS]
    i = 0
    while i < nfr and run_start[i] < start:
        i += 1
    after = i < nfr and start + length == run_start[i]
    before = i > 0 and run_start[i - 1] + run_len[i - 1] == start
    if before and after:
        run_len[i - 1] += length + run_len[i]
        for m in range(i, nfr - 1):
            run_start[m], run_len[m] = run_start[m + 1], run_len[m + 1]
        st[NUM_FREE_RUNS] = nfr - 1
    elif before:
        run_len[i - 1] += length
    elif after:
        run_start[i] = start
        run_len[i] += length
    else:
        for m in range(nfr, i, -1):
            run_start[m], run_len[m] = run_start[m - 1], run_len[m - 1]
        run_start[i], run_len[i] = start, length
        st[NUM_FREE_RUNS] = nfr + 1


@njit(cache=True)
def largest_run(st, run_len):
    best = 0
    for j in range(st[NUM_FREE_RUNS]):
        best = max(best, run_len[j])
    return best


@njit(cache=True)
def external(cfg, st, req, requeued, run_len):
    """Paged: the tail slots. Contiguous: free runs too short for the waiting head, when the free
    slots in total would hold it (else a plain shortage: 0)."""
    if cfg[PAGED] != 0:
        return cfg[TAIL_SLOTS]
    head = waiting_head(st, req, requeued)
    if head < 0:
        return 0
    need = req[head, RESERVED]
    total = 0
    short = 0
    for j in range(st[NUM_FREE_RUNS]):
        total += run_len[j]
        if run_len[j] < need:
            short += run_len[j]
    return short if total >= need else 0


# -- prefix caching: vLLM's block pool, with the anonymous free blocks counted, not listed -------
#
# vLLM keeps every free block in one queue, evicting from the front; a freed request's blocks are
# appended tail first. Only full prompt blocks with an identity are cached: the kernel gives each
# such block an entry (px[3]) while it is cached, and every other free block is anonymous. The
# queue is kept as the cached entries in order, each with the count of anonymous blocks just in
# front of it (E_ANON), and ANON_TAIL behind the last: the same order as vLLM's list, with O(1)
# hits out of the middle. A block node may have several cached copies (vLLM does not
# de-duplicate two requests that computed the same block); a lookup takes the oldest (E_COPY
# chains them in the order they were cached).

NE = 6      # int64 per entry in px[3]
E_NODE = 0  # its block node
E_REF = 1   # running requests holding it (0: in the free queue, evictable)
E_PREV = 2  # free queue neighbours (-1: none)
E_NEXT = 3
E_ANON = 4  # anonymous free blocks just in front of it in the free queue
E_COPY = 5  # next cached copy of the same block node (-1: none); the recycled stack's link


@njit(cache=True)
def block_node(cfg, req, ids, rid, j):
    """The block node of request rid's identity block j: its trie node and sub-block."""
    per = cfg[PER]
    return ids[req[rid, ID_START] + j // per] * per + j % per


@njit(cache=True)
def q_unlink(st, ent, e):
    """Take entry e out of the free queue; its anonymous blocks move to the one behind it."""
    prev, nxt = ent[e * NE + E_PREV], ent[e * NE + E_NEXT]
    if nxt >= 0:
        ent[nxt * NE + E_ANON] += ent[e * NE + E_ANON]
        ent[nxt * NE + E_PREV] = prev
    else:
        st[ANON_TAIL] += ent[e * NE + E_ANON]
        st[Q_TAIL] = prev
    if prev >= 0:
        ent[prev * NE + E_NEXT] = nxt
    else:
        st[Q_HEAD] = nxt
    ent[e * NE + E_ANON] = 0


@njit(cache=True)
def q_append(st, ent, e):
    """Entry e (its last holder gone) joins the back of the free queue."""
    ent[e * NE + E_ANON] = st[ANON_TAIL]
    st[ANON_TAIL] = 0
    ent[e * NE + E_PREV] = st[Q_TAIL]
    ent[e * NE + E_NEXT] = -1
    if st[Q_TAIL] >= 0:
        ent[st[Q_TAIL] * NE + E_NEXT] = e
    else:
        st[Q_HEAD] = e
    st[Q_TAIL] = e


@njit(cache=True)
def evict(st, bcopy, ent, e):
    """Entry e's block is taken for new data: off its node's copies, its id recycled."""
    node = ent[e * NE + E_NODE]
    c = bcopy[node]
    if c == e:
        bcopy[node] = ent[e * NE + E_COPY]
    else:
        while ent[c * NE + E_COPY] != e:
            c = ent[c * NE + E_COPY]
        ent[c * NE + E_COPY] = ent[e * NE + E_COPY]
    ent[e * NE + E_COPY] = st[E_RECYCLED]
    st[E_RECYCLED] = e
    st[PC_BLOCKS_EVICTED] += 1


@njit(cache=True)
def take_blocks(cfg, st, px, m):
    """Allocate m blocks from the front of the free queue, evicting the cached ones met."""
    st[FREE_BLOCKS] -= m
    if cfg[PREFIX] == 0:
        return
    ent = px[3]
    while m > 0:
        e = st[Q_HEAD]
        if e < 0:
            st[ANON_TAIL] -= m
            return
        a = ent[e * NE + E_ANON]
        if a > 0:
            t = a if a < m else m
            ent[e * NE + E_ANON] = a - t
            m -= t
        else:
            q_unlink(st, ent, e)
            evict(st, px[2], ent, e)
            m -= 1


@njit(cache=True)
def new_entry(st, bcopy, ent, node):
    """A block just filled with identity `node` is cached: a fresh entry, held once, appended to
    the node's copies."""
    e = st[E_RECYCLED]
    if e >= 0:
        st[E_RECYCLED] = ent[e * NE + E_COPY]
    else:
        e = st[E_NEW]
        st[E_NEW] += 1
    ent[e * NE + E_NODE] = node
    ent[e * NE + E_REF] = 1
    ent[e * NE + E_PREV] = -1
    ent[e * NE + E_NEXT] = -1
    ent[e * NE + E_ANON] = 0
    ent[e * NE + E_COPY] = -1
    c = bcopy[node]
    if c < 0:
        bcopy[node] = e
    else:
        while ent[c * NE + E_COPY] >= 0:
            c = ent[c * NE + E_COPY]
        ent[c * NE + E_COPY] = e
    return e


@njit(cache=True)
def register(cfg, st, req, px, rid, upto):
    """Cache rid's identity blocks that are full once it holds `upto` tokens (vLLM caches them
    when the step that fills them is scheduled)."""
    full = min(req[rid, ID_BLOCKS], upto // cfg[BLOCK_SIZE])
    for j in range(req[rid, CACHED], full):
        px[1][req[rid, E_START] + j] = new_entry(st, px[2], px[3], block_node(cfg, req, px[0], rid, j))
    if full > req[rid, CACHED]:
        req[rid, CACHED] = full


@njit(cache=True)
def lookup(cfg, req, px, rid):
    """The cached prefix a waiting request would share: (blocks hit, of them held by nobody).

    At most the full blocks of PREFILL_END - 1 tokens: one token is always computed (vLLM's
    max_cache_hit_length); the walk stops at the first block not cached."""
    limit = min(req[rid, ID_BLOCKS], (req[rid, PREFILL_END] - 1) // cfg[BLOCK_SIZE])
    hits = 0
    idle = 0
    last_idle = 0
    for j in range(limit):
        e = px[2][block_node(cfg, req, px[0], rid, j)]
        if e < 0:
            break
        hits += 1
        last_idle = 1 if px[3][e * NE + E_REF] == 0 else 0
        idle += last_idle
    if hits > 0 and cfg[SPEC_LOOKAHEAD] != 0:  # an EAGLE-style drafter recomputes the last hit block
        hits -= 1
        idle -= last_idle
    return hits, idle


@njit(cache=True)
def touch(cfg, st, req, px, rid, hits):
    """rid shares its first `hits` identity blocks: each gains a holder, leaving the free queue
    if nobody held it."""
    ent = px[3]
    for j in range(hits):
        e = px[2][block_node(cfg, req, px[0], rid, j)]
        if ent[e * NE + E_REF] == 0:
            q_unlink(st, ent, e)
            st[FREE_BLOCKS] -= 1
            st[PC_BLOCKS_REUSED] += 1
        else:
            st[SHARED] += 1
        ent[e * NE + E_REF] += 1
        px[1][req[rid, E_START] + j] = e
    req[rid, CACHED] = hits


@njit(cache=True)
def count_hits(st, req, rid, tokens):
    """rid is admitted holding `tokens` prompt tokens from the cache: its prefill starts there.
    The hit rate counts first admissions (vLLM's queries and hits); re-admissions after a
    recompute preemption count only in PC_PREFILL_SAVED."""
    req[rid, HELD] = tokens
    st[PC_PREFILL_SAVED] += tokens
    if req[rid, ADMITTED_AT] < 0:
        st[PC_LOOKUPS] += 1
        st[PC_QUERY_TOKENS] += req[rid, PROMPT]
        st[PC_HIT_TOKENS] += tokens
        req[rid, HIT_TOKENS] = tokens


@njit(cache=True)
def give_back(cfg, st, req, px, rid):
    """Free rid's blocks as vLLM does, tail first: the blocks past its cached ones are
    anonymous; each cached entry loses a holder and joins the queue when it had the last."""
    if cfg[PREFIX] == 0:
        st[FREE_BLOCKS] += req[rid, BLOCKS]
        return
    cached = req[rid, CACHED]
    anon = req[rid, BLOCKS] - cached
    st[FREE_BLOCKS] += anon
    st[ANON_TAIL] += anon
    ent = px[3]
    for j in range(cached - 1, -1, -1):
        e = px[1][req[rid, E_START] + j]
        ent[e * NE + E_REF] -= 1
        if ent[e * NE + E_REF] == 0:
            q_append(st, ent, e)
            st[FREE_BLOCKS] += 1
        else:
            st[SHARED] -= 1
    req[rid, CACHED] = 0


# -- the CPU tier: vLLM's offloading connector (rules: kvplan/sim/offload.py) ---------------------
#
# The tier is kvplan/memory/cpu_tier.py's CpuTier in flat arrays: cx[0] maps a block node to its CPU
# slot, cx[1] holds the slots in one doubly linked list, least recently used first (CPU_HEAD).

NS = 5       # int64 per CPU slot in cx[1]
C_NODE = 0   # the block node it holds
C_PREV = 1   # LRU neighbours (-1: none)
C_NEXT = 2
C_REF = 3    # loads in flight reading it (pinned while > 0)
C_STAMP = 4  # the last store batch it belongs to (never evicted by its own batch)


@njit(cache=True)
def cpu_unlink(st, cs, s):
    prev, nxt = cs[s * NS + C_PREV], cs[s * NS + C_NEXT]
    if prev >= 0:
        cs[prev * NS + C_NEXT] = nxt
    else:
        st[CPU_HEAD] = nxt
    if nxt >= 0:
        cs[nxt * NS + C_PREV] = prev
    else:
        st[CPU_TAIL] = prev


@njit(cache=True)
def cpu_append(st, cs, s):
    """Slot s becomes the most recently used."""
    cs[s * NS + C_PREV] = st[CPU_TAIL]
    cs[s * NS + C_NEXT] = -1
    if st[CPU_TAIL] >= 0:
        cs[st[CPU_TAIL] * NS + C_NEXT] = s
    else:
        st[CPU_HEAD] = s
    st[CPU_TAIL] = s


@njit(cache=True)
def cpu_touch(cfg, st, req, px, cx, rid, end):
    """rid's identity blocks 0 .. end - 1 that the tier holds become the most recently used, block 0
    last (LRUCachePolicy.touch walks the keys in reverse)."""
    for j in range(end - 1, -1, -1):
        s = cx[0][block_node(cfg, req, px[0], rid, j)]
        if s >= 0 and s != st[CPU_TAIL]:
            cpu_unlink(st, cx[1], s)
            cpu_append(st, cx[1], s)


@njit(cache=True)
def cpu_lookup(cfg, req, px, cx, rid, start):
    """The identity blocks from `start` on that the tier holds, up to the first it does not: their
    number, and whether one of them is being loaded (get_num_new_matched_tokens's lookup)."""
    c = 0
    pinned = False
    for j in range(start, req[rid, ID_BLOCKS]):
        s = cx[0][block_node(cfg, req, px[0], rid, j)]
        if s < 0:
            break
        c += 1
        if cx[1][s * NS + C_REF] > 0:
            pinned = True
    return c, pinned


@njit(cache=True)
def cpu_pin(cfg, req, px, cx, rid, start, end, delta):
    """Identity blocks start .. end - 1 of rid gain (delta 1) or lose (-1) a load reading them; the
    count of pinned slots follows. Returns the change in that count."""
    change = 0
    for j in range(start, end):
        s = cx[0][block_node(cfg, req, px[0], rid, j)]
        before = cx[1][s * NS + C_REF]
        cx[1][s * NS + C_REF] = before + delta
        if before == 0:
            change += 1
        elif before + delta == 0:
            change -= 1
    return change


@njit(cache=True)
def cpu_store(cfg, st, req, px, cx, rid, upto):
    """Offer the tier rid's identity blocks that are full once it holds `upto` tokens, from the
    first not offered yet (one batch, CPUOffloadingManager.prepare_store: those held are skipped;
    the rest need free slots or evictions of unpinned blocks not of the batch, least recently used
    first; when too few can be evicted, nothing is stored). After a store, rid's prefix is touched."""
    full = min(req[rid, ID_BLOCKS], upto // cfg[BLOCK_SIZE])
    start = req[rid, STORED]
    if full <= start:
        return
    req[rid, STORED] = full
    cs, slot_of = cx[1], cx[0]
    st[CPU_STAMP] += 1
    stamp = st[CPU_STAMP]
    new = 0
    guarded = 0  # unpinned blocks of the batch already held: never evicted for it
    for j in range(start, full):
        s = slot_of[block_node(cfg, req, px[0], rid, j)]
        if s >= 0:
            cs[s * NS + C_STAMP] = stamp
            if cs[s * NS + C_REF] == 0:
                guarded += 1
        else:
            new += 1
    if new == 0 or new - (cfg[CPU_BLOCKS] - st[CPU_USED]) > st[CPU_USED] - st[CPU_PINNED] - guarded:
        return
    for j in range(start, full):
        node = block_node(cfg, req, px[0], rid, j)
        if slot_of[node] >= 0:
            continue
        if st[CPU_USED] < cfg[CPU_BLOCKS]:
            s = st[CPU_USED]
            st[CPU_USED] += 1
        else:
            s = st[CPU_HEAD]
            while cs[s * NS + C_REF] > 0 or cs[s * NS + C_STAMP] == stamp:
                s = cs[s * NS + C_NEXT]
            cpu_unlink(st, cs, s)
            slot_of[cs[s * NS + C_NODE]] = -1
            st[OF_EVICTED] += 1
        cs[s * NS + C_NODE] = node
        cs[s * NS + C_REF] = 0
        cs[s * NS + C_STAMP] = stamp
        cpu_append(st, cs, s)
        slot_of[node] = s
    st[OF_STORED] += new
    cpu_touch(cfg, st, req, px, cx, rid, full)


@njit(cache=True)
def store_pass(cfg, st, req, px, cx, running, sched, before):
    """After scheduling, each scheduled request offers the blocks its tokens complete, in vLLM's
    order (yield_req_data): the newly admitted (first admitted now), the running, the resumed."""
    n = st[NUM_RUNNING]
    now = st[NOW]
    for part in range(3):
        lo, hi = (before, n) if part != 1 else (0, before)
        for i in range(lo, hi):
            rid = running[i]
            if part != 1 and (req[rid, ADMITTED_AT] == now) != (part == 0):
                continue
            if sched[i] > 0 and req[rid, STORED] < req[rid, ID_BLOCKS]:
                cpu_store(cfg, st, req, px, cx, rid, req[rid, HELD] + sched[i])


@njit(cache=True)
def count_offload(cfg, st, req, rid, hits, cpu):
    """At its first admission, rid's tokens the GPU cache did not hold and those the tier did."""
    if req[rid, ADMITTED_AT] < 0:
        st[OF_QUERY_TOKENS] += req[rid, PROMPT] - hits * cfg[BLOCK_SIZE]
        st[OF_HIT_TOKENS] += cpu * cfg[BLOCK_SIZE]


@njit(cache=True)
def start_load(cfg, st, req, px, cx, rid, hits, cpu):
    """rid shares its GPU hits, takes GPU blocks for its `cpu` tier hits, pins them in the tier and
    waits for them (WAITING_FOR_REMOTE_KVS) in the ring cx[2]; the link carries one load at a time."""
    b = cfg[BLOCK_SIZE]
    touch(cfg, st, req, px, rid, hits)
    count_hits(st, req, rid, hits * b)
    count_offload(cfg, st, req, rid, hits, cpu)
    take_blocks(cfg, st, px, cpu)
    total = hits + cpu
    held = min(total * b, req[rid, PREFILL_END] - 1)  # a whole prompt: its last token is recomputed
    req[rid, BLOCKS] = total
    req[rid, SKIPPED] = 0
    req[rid, HELD] = held
    req[rid, STORED] = total
    st[CPU_PINNED] += cpu_pin(cfg, req, px, cx, rid, hits, total, ONE)
    dur = cpu * cfg[LOAD_TICKS]
    begin = max(st[NOW], st[LINK_FREE])
    req[rid, READY_AT] = begin + dur
    st[LINK_FREE] = begin + dur
    st[OF_LOADS] += 1
    st[OF_BLOCKS_LOADED] += cpu
    st[OF_LOAD_TICKS] += dur
    st[LD_TOKENS] += held
    st[LD_BLOCKS] += total
    ring = cx[2]
    ring[(st[LD_HEAD] + st[LD_LEN]) % cfg[QUEUE_CAP]] = rid
    st[LD_LEN] += 1


@njit(cache=True)
def loaded_start(cfg, req, rid, budget):
    """For a request whose load from the tier is done: the tokens it would be given within `budget`
    and the GPU blocks it needs beyond those it holds."""
    n = tokens_for(cfg, req, rid, budget)
    return n, blocks_held(cfg, ZERO, held_after(req, rid, n)) - req[rid, BLOCKS]


@njit(cache=True)
def admit_loaded(cfg, st, req, px, cx, running, sched, budget):
    """The ring's front, once its load has ended: its pins go, its loaded blocks join the GPU prefix
    cache, and it starts like a waiting request holding them. Returns the tokens it was given, 0 when
    the front is still loading (or the ring is empty), -1 when it cannot start (admission stops)."""
    if budget <= 0:
        return -1
    if st[LD_LEN] == 0:
        return 0
    rid = cx[2][st[LD_HEAD]]
    ready = req[rid, READY_AT]
    if ready > st[NOW]:
        return 0
    if ready >= 0:  # the load ended: complete_load, then the scheduler caches its blocks
        st[CPU_PINNED] += cpu_pin(cfg, req, px, cx, rid, req[rid, CACHED], req[rid, BLOCKS], -ONE)
        req[rid, READY_AT] = -1
        register(cfg, st, req, px, rid, req[rid, HELD])
    n, need = loaded_start(cfg, req, rid, budget)
    if n == 0 or need > st[FREE_BLOCKS]:
        return -1
    st[LD_TOKENS] -= req[rid, HELD]
    st[LD_BLOCKS] -= req[rid, BLOCKS]
    st[LD_HEAD] = (st[LD_HEAD] + 1) % cfg[QUEUE_CAP]
    st[LD_LEN] -= 1
    take_blocks(cfg, st, px, need)
    req[rid, BLOCKS] += need
    register(cfg, st, req, px, rid, held_after(req, rid, n))
    if req[rid, ADMITTED_AT] < 0:
        req[rid, ADMITTED_AT] = st[NOW]
    start_running(st, req, running, sched, rid, n)
    return n


@njit(cache=True)
def load_head(cfg, st, req, px, cx, rid, hits, idle):
    """The admission phase's tier lookup for the waiting head rid (after its `hits` GPU hits, `idle`
    of them held by nobody): it touches rid's blocks and, when the tier holds the next ones, starts
    their load. Returns 1 when the load started, 0 when the tier holds none, -1 when admission
    stops (max_concurrent_loads reached, a block being loaded already, or too few free blocks)."""
    if st[LD_LEN] >= cfg[MAX_SEQS]:  # max_concurrent_loads: the lookup is put off
        return -1
    cpu_touch(cfg, st, req, px, cx, rid, req[rid, ID_BLOCKS])
    cpu, pinned = cpu_lookup(cfg, req, px, cx, rid, hits)
    if cpu == 0:
        return 0
    if pinned or cpu + idle > st[FREE_BLOCKS]:
        return -1
    start_load(cfg, st, req, px, cx, rid, hits, cpu)
    pop_head(cfg, st)
    return 1


@njit(cache=True)
def front_admissible(cfg, st, req, cx, free, budget):
    """can_admit for the front of the loading ring: 1 when the step would start it (its load ended,
    or it is loaded and fits `free`), 0 when it is loaded and does not fit, -1 when the ring is
    empty or its front still loading (the waiting queue decides)."""
    if st[LD_LEN] == 0:
        return -1
    front = cx[2][st[LD_HEAD]]
    ready = req[front, READY_AT]
    if 0 <= ready <= st[NOW]:
        return 1  # its load ended: the step completes it
    if ready < 0:  # loaded, waiting to run at the front
        n, need = loaded_start(cfg, req, front, budget)
        return 1 if n > 0 and need <= free else 0
    return -1


@njit(cache=True)
def head_admissible(cfg, st, req, px, cx, rid, n, hits, idle, new, free, budget):
    """can_admit for the waiting head rid with a CPU tier: 1 when it would start or start loading,
    2 when an eviction of one of its `idle` GPU hits might turn it into a CPU hit, else 0."""
    if budget <= 0 or st[LD_LEN] >= cfg[MAX_SEQS]:
        return 0
    cpu, pinned = cpu_lookup(cfg, req, px, cx, rid, hits)
    if cpu > 0 and not pinned and cpu + idle <= free:
        return 1
    if cpu == 0 and n > 0 and new + idle <= free:
        return 1
    return 2 if idle > 0 else 0


@njit(cache=True)
def head_touch(cfg, st, req, px, cx, requeued, budget):
    """What the admission phase does to the tier when it cannot start the waiting head: it looks
    the head up, touching its blocks. A jump takes that touch once (repeating it changes nothing)."""
    if st[NUM_RUNNING] >= cfg[MAX_SEQS] or budget <= 0 or st[LD_LEN] >= cfg[MAX_SEQS]:
        return
    if st[LD_LEN] > 0 and req[cx[2][st[LD_HEAD]], READY_AT] <= st[NOW]:
        return
    rid = waiting_head(st, req, requeued)
    if rid >= 0:
        cpu_touch(cfg, st, req, px, cx, rid, req[rid, ID_BLOCKS])


@njit(cache=True)
def wait_for_load(cfg, st, req, px, cx, acc, timeline):
    """Nothing can be scheduled while loads are in flight: the clock waits for the first load to
    end, or the next arrival (or what is loaded so far); 4 when nothing could ever change."""
    target = INF
    ring = cx[2]
    for i in range(st[LD_LEN]):
        ready = req[ring[(st[LD_HEAD] + i) % cfg[QUEUE_CAP]], READY_AT]
        if ready > st[NOW]:
            target = ready
            break
    nxt = arrived_by(st, req, st[NOW])
    if nxt < st[LOADED]:
        target = min(target, req[nxt, ARRIVAL])
    elif st[ALL_LOADED] == 0:
        target = min(target, max(req[st[LOADED] - 1, ARRIVAL], st[HORIZON]))
    if target == INF or target <= st[NOW]:
        return 4
    shared = st[SHARED] * cfg[BLOCK_SIZE]
    tokens = st[LD_TOKENS] - shared
    alloc = st[LD_BLOCKS] * cfg[BLOCK_SIZE] - shared
    account_span(cfg, st, req, acc, timeline, target - st[NOW], ZERO, waiting_count(st, req, st[NOW]),
                 tokens, alloc, ZERO, cfg[TAIL_SLOTS])
    st[NOW] = target
    return 0


# -- per-request rules (the reference's Req methods) ---------------------------------------------


@njit(cache=True)
def tokens_for(cfg, req, rid, budget):
    """Tokens request rid would process this step within `budget`: 1 when decoding; its whole
    prefill (or, chunked, as much as fits); 0 when an unchunked prefill does not fit."""
    return tokens_from(cfg, req[rid, HELD], req[rid, PREFILL_END], budget)


@njit(cache=True, inline="always")
def tokens_from(cfg, held, tgt, budget):
    """tokens_for of a request holding `held` tokens whose prefill ends at `tgt`."""
    if held >= tgt:
        if cfg[SPEC_K] != 0:
            return spec_tokens(cfg, held, budget)
        return 1 if budget >= 1 else 0
    rest = tgt - held
    if cfg[CHUNKED_PREFILL] != 0:
        return rest if rest < budget else budget
    return rest if rest <= budget else 0


@njit(cache=True)
def spec_tokens(cfg, held, budget):
    """Speculative: a decoding request's last token and its k drafts, cut to max_model_len - 1 -
    held (vLLM's scheduler; at least the one token) and to the budget (speculative.SpecSetup.tokens)."""
    if budget < 1:
        return 0
    d = max(min(1 + cfg[SPEC_K], cfg[SPEC_MAX_LEN] - 1 - held), 1)
    return d if d < budget else budget


@njit(cache=True, inline="always")
def lookahead_slots(cfg, held):
    """Slots a running request holding `held` after its step allocates: with an EAGLE-style drafter
    the lookahead more, up to max_model_len (vLLM's allocate_slots, num_lookahead_tokens)."""
    if cfg[SPEC_LOOKAHEAD] == 0:
        return held
    return max(held, min(held + cfg[SPEC_LOOKAHEAD], cfg[SPEC_MAX_LEN]))


@njit(cache=True)
def held_after(req, rid, n):
    """Tokens held after processing n. A step that completes a prefill samples a token whose KV
    the next step computes (as vLLM's allocate_slots: ceil(prompt / B) blocks at admission)."""
    return req[rid, HELD] + n


@njit(cache=True, inline="always")
def skip_of(cfg, computed):
    """Hybrid: blocks a sliding-window group no longer needs once `computed` tokens are computed:
    those wholly before the last window - 1 tokens (vLLM's remove_skipped_blocks, run before each
    allocation on the request's computed tokens)."""
    first = computed - cfg[HY_WINDOW] + 1
    if cfg[HY_SLIDE] == 0 or first <= 0:
        return 0
    return first // cfg[BLOCK_SIZE]


@njit(cache=True, inline="always")
def blocks_held(cfg, skip, held):
    """Blocks a request holding `held` tokens takes in all (its sliding groups past `skip`)."""
    full = cdiv(held, cfg[BLOCK_SIZE])
    if cfg[HYBRID] == 0:
        return full
    return cfg[HY_FULL] * full + cfg[HY_SLIDE] * (full - skip) + cfg[HY_STATE]


@njit(cache=True, inline="always")
def kept_tokens(cfg, skip, held):
    """Slots of its blocks holding something: its tokens in every attention group (in a sliding
    group, those of the blocks kept) and whole pages of state."""
    if cfg[HYBRID] == 0:
        return held
    return (cfg[HY_FULL] * held + cfg[HY_SLIDE] * (held - skip * cfg[BLOCK_SIZE])
            + cfg[HY_STATE] * cfg[BLOCK_SIZE])


@njit(cache=True, inline="always")
def kv_read(cfg, held):
    """Tokens of KV a step reads for a request holding `held`, in tokens of every layer: the
    sliding-window layers read at most their window (the bytes-weighted mix, rounded down).
    HY_KV_SLIDE is set by vLLM's layer groups and by SGLang's one pool alike (SimSetup.read_mix),
    0 where every layer reads every token."""
    if cfg[HY_KV_SLIDE] == 0:
        return held
    window = held if held < cfg[HY_WINDOW] else cfg[HY_WINDOW]
    return (cfg[HY_KV_FULL] * held + cfg[HY_KV_SLIDE] * window) // (cfg[HY_KV_FULL] + cfg[HY_KV_SLIDE])


@njit(cache=True)
def release(cfg, st, req, px, run_start, run_len, rid):
    """Give a finished request's memory back: its blocks, or its reserved run of slots."""
    if cfg[PAGED] != 0:
        if cfg[PREFIX] != 0:
            give_back(cfg, st, req, px, rid)
        else:
            st[FREE_BLOCKS] += req[rid, BLOCKS]
    else:
        free_run(st, run_start, run_len, req[rid, START], req[rid, RESERVED])


# -- timeline --------------------------------------------------------------------------------------


@njit(cache=True)
def next_sample_at(st):
    """Tick of the next timeline sample."""
    return st[ORIGIN] + st[SAMPLE_K] * st[SAMPLE_EVERY]


@njit(cache=True)
def record_sample(cfg, st, timeline, when, n, waiting, tokens, reserved, internal, ext, free):
    """Append one sample; on a full buffer keep every other sample and double the spacing.

    Columns: tick, running, waiting, tokens held, reserved, internal, external, free slots.
    """
    i = st[SAMPLES]
    timeline[i, 0], timeline[i, 1], timeline[i, 2], timeline[i, 3] = when, n, waiting, tokens
    timeline[i, 4], timeline[i, 5], timeline[i, 6], timeline[i, 7] = reserved, internal, ext, free
    st[SAMPLES] = i + 1
    st[SAMPLE_K] += 1
    if st[SAMPLES] == cfg[MAX_SAMPLES]:
        half = cfg[MAX_SAMPLES] // 2
        for j in range(half):
            for c in range(8):
                timeline[j, c] = timeline[2 * j, c]
        st[SAMPLES] = half
        st[SAMPLE_EVERY] *= 2
        st[SAMPLE_K] = half


@njit(cache=True)
def memory_parts(cfg, tokens, alloc, final, ext):
    """(reserved, internal, free) from tokens, allocated, final lengths and external slots."""
    if cfg[PAGED] != 0:
        return 0, alloc - tokens, cfg[SLOTS] - alloc - ext
    return final - tokens, alloc - final, cfg[SLOTS] - alloc - ext


@njit(cache=True)
def account_span(cfg, st, req, acc, timeline, dt, n, waiting, tokens, alloc, final, ext):
    """Integrals and timeline samples of one step (or idle gap) whose state is constant."""
    mac(acc, ACC_TIME, ONE, dt)
    mac(acc, ACC_RUNNING, n, dt)
    mac(acc, ACC_TOKENS, tokens, dt)
    mac(acc, ACC_ALLOCATED, alloc, dt)
    mac(acc, ACC_FINAL_LEN, final, dt)
    mac(acc, ACC_EXTERNAL, ext, dt)
    reserved, internal, free = memory_parts(cfg, tokens, alloc, final, ext)
    end = st[NOW] + dt
    while next_sample_at(st) < end:
        record_sample(cfg, st, timeline, next_sample_at(st), n, waiting, tokens, reserved, internal, ext, free)


@njit(cache=True)
def idle_until(cfg, st, req, acc, timeline, until):
    """Nothing runs or waits: advance the clock to `until` (the next arrival)."""
    account_span(cfg, st, req, acc, timeline, until - st[NOW], ZERO, ZERO, ZERO, ZERO, ZERO, cfg[TAIL_SLOTS])
    st[IDLE] += until - st[NOW]
    st[NOW] = until


# -- one full step (the reference's phases 1 to 3) -----------------------------------------------


@njit(cache=True)
def preempt(cfg, st, req, px, requeued, swapped, v):
    """Preempt running request v (already taken off the batch): its blocks go back to the pool.

    swap: when the CPU pool has room, v's KV moves there and v joins the swapped ring, to resume
    first. Otherwise recompute: v drops its KV (HELD = 0), must prefill prompt + generated again,
    and waits at the front of the requeued ring.
    """
    give_back(cfg, st, req, px, v)
    req[v, PREEMPTED] += 1
    st[PREEMPTIONS] += 1
    size = req[v, BLOCKS] * cfg[BLOCK_SIZE]
    if cfg[SWAP] != 0 and st[SWAP_USED] + size <= cfg[SWAP_SLOTS]:
        st[SWAP_USED] += size
        st[SWAP_OUTS] += 1
        if st[SWAPPED_LEN] == cfg[QUEUE_CAP]:
            raise RuntimeError("swapped queue overflow")
        swapped[(st[SWAPPED_HEAD] + st[SWAPPED_LEN]) % cfg[QUEUE_CAP]] = v
        st[SWAPPED_LEN] += 1
        return
    st[RECOMPUTED] += req[v, HELD]
    req[v, HELD] = 0
    req[v, PRELOAD] = 0
    req[v, BLOCKS] = 0
    req[v, SKIPPED] = 0
    req[v, PREFILL_END] = req[v, PROMPT] + req[v, GENERATED]
    if st[REQUEUE_LEN] == cfg[QUEUE_CAP]:
        raise RuntimeError("requeue overflow")
    st[REQUEUE_HEAD] = (st[REQUEUE_HEAD] - 1) % cfg[QUEUE_CAP]
    requeued[st[REQUEUE_HEAD]] = v
    st[REQUEUE_LEN] += 1


@njit(cache=True)
def schedule_running(cfg, st, req, px, running, sched, requeued, swapped):
    """Phase 1, the preemption rule: schedule the running batch in admission order.

    Each request takes its tokens (tokens_for) and the blocks they need. While the free pool
    cannot serve it, the most recently admitted running request is preempted, and that may be
    the request itself. Returns the token budget left and whether anything was preempted.
    """
    budget = cfg[TOKEN_BUDGET]
    preempted = False
    i = 0
    while i < st[NUM_RUNNING]:
        rid = running[i]
        n = tokens_for(cfg, req, rid, budget)
        sched[i] = 0
        if n == 0:
            i += 1
            continue
        skip = skip_of(cfg, req[rid, HELD])
        need = (blocks_held(cfg, skip, lookahead_slots(cfg, held_after(req, rid, n))) - req[rid, BLOCKS]
                if cfg[PAGED] != 0 else 0)
        scheduled = True
        while need > st[FREE_BLOCKS]:
            st[NUM_RUNNING] -= 1
            victim = running[st[NUM_RUNNING]]
            preempt(cfg, st, req, px, requeued, swapped, victim)
            preempted = True
            if victim == rid:
                scheduled = False
                break
        if scheduled:
            if cfg[PREFIX] != 0:
                take_blocks(cfg, st, px, need)
            else:  # the common case inline (negative when sliding groups release more than they take)
                st[FREE_BLOCKS] -= need
            req[rid, BLOCKS] += need
            req[rid, SKIPPED] = skip
            if cfg[PREFIX] != 0 and req[rid, HELD] < req[rid, PREFILL_END]:
                register(cfg, st, req, px, rid, held_after(req, rid, n))
            sched[i] = n
            budget -= n
            i += 1
    return budget, preempted


@njit(cache=True)
def start_running(st, req, running, sched, rid, n):
    """Append rid to the running batch with n tokens scheduled."""
    pos = st[NUM_RUNNING]
    running[pos] = rid
    sched[pos] = n
    st[NUM_RUNNING] = pos + 1


@njit(cache=True)
def resume_swapped(cfg, st, req, px, running, sched, swapped, budget):
    """Phase 2a: swapped-out requests resume in order while seats, budget and blocks allow."""
    while st[SWAPPED_LEN] > 0 and st[NUM_RUNNING] < cfg[MAX_SEQS]:
        rid = swapped[st[SWAPPED_HEAD]]
        n = tokens_for(cfg, req, rid, budget)
        skip = skip_of(cfg, req[rid, HELD])
        need = blocks_held(cfg, skip, lookahead_slots(cfg, held_after(req, rid, n)))
        if n == 0 or need > st[FREE_BLOCKS]:
            break
        req[rid, SKIPPED] = skip
        st[SWAPPED_HEAD] = (st[SWAPPED_HEAD] + 1) % cfg[QUEUE_CAP]
        st[SWAPPED_LEN] -= 1
        st[SWAP_USED] -= req[rid, BLOCKS] * cfg[BLOCK_SIZE]
        take_blocks(cfg, st, px, need)
        req[rid, BLOCKS] = need
        start_running(st, req, running, sched, rid, n)
        budget -= n
    return budget


@njit(cache=True)
def waiting_need(cfg, req, px, rid, budget):
    """What admitting waiting request rid would take: (tokens now, blocks hit in the prefix
    cache, of them held by nobody, new blocks). Blocks it needs from the free pool: new + idle
    hits (a hit nobody holds leaves the free queue), as vLLM's allocate_slots counts them."""
    hits, idle = (0, 0)
    if cfg[PREFIX] != 0:
        hits, idle = lookup(cfg, req, px, rid)
    held = max(hits * cfg[BLOCK_SIZE], req[rid, PRELOAD])
    n = tokens_from(cfg, held, req[rid, PREFILL_END], budget)
    return n, hits, idle, blocks_held(cfg, ZERO, held + n) - hits


@njit(cache=True)
def admit(cfg, st, req, px, cx, running, sched, requeued, run_start, run_len, budget):
    """Phase 2b, the admission rule: first come, first served, no skipping.

    The head of the waiting queue (requeued first, then arrivals) starts while a seat is free
    (max_num_seqs), its tokens fit the budget left, and its memory fits: paged, the blocks for
    what it processes now; contiguous, a first-fit run of its whole reservation. The first head
    that does not fit stops admission for this step.
    """
    while st[NUM_RUNNING] < cfg[MAX_SEQS]:
        if cx is not None:  # requests whose loads ended come first (vLLM keeps them at the head)
            done = admit_loaded(cfg, st, req, px, cx, running, sched, budget)
            if done < 0:
                break
            if done > 0:
                budget -= done
                continue
        rid = waiting_head(st, req, requeued)
        if rid < 0:
            break
        if cfg[PAGED] != 0:
            n, hits, idle, new = waiting_need(cfg, req, px, rid, budget)
            if cx is not None:
                loading = load_head(cfg, st, req, px, cx, rid, hits, idle)
                if loading < 0:
                    break
                if loading > 0:
                    continue
            if n == 0 or new + idle > st[FREE_BLOCKS]:
                break
            if cx is not None:
                count_offload(cfg, st, req, rid, hits, ZERO)
            if cfg[PREFIX] != 0:
                touch(cfg, st, req, px, rid, hits)
                count_hits(st, req, rid, hits * cfg[BLOCK_SIZE])
            if req[rid, PRELOAD] > req[rid, HELD]:  # its KV came computed (kvplan/fleet/run.py's decode pools)
                req[rid, HELD] = req[rid, PRELOAD]
            take_blocks(cfg, st, px, new)
            req[rid, BLOCKS] = hits + new
            req[rid, SKIPPED] = 0
            if cfg[PREFIX] != 0:
                register(cfg, st, req, px, rid, held_after(req, rid, n))
        else:
            n = tokens_for(cfg, req, rid, budget)
            if n == 0:
                break
            start = first_fit(st, run_start, run_len, req[rid, RESERVED])
            if start < 0:
                break
            req[rid, START] = start
        pop_head(cfg, st)
        if req[rid, ADMITTED_AT] < 0:
            req[rid, ADMITTED_AT] = st[NOW]
        start_running(st, req, running, sched, rid, n)
        budget -= n


@njit(cache=True)
def batch_sums(cfg, req, running, sched, n):
    """Of the scheduled batch: KV read, tokens processed, tokens held after, allocated, final,
    requests scheduled, and the token pairs its prefill chunks attend over."""
    kv = 0
    processed = 0
    tokens = 0
    alloc = 0
    final = 0
    nreq = 0
    pairs = 0
    for i in range(n):
        rid = running[i]
        if sched[i] > 0:
            s = sched[i]
            held = req[rid, HELD]
            nreq += 1
            kv += kv_read(cfg, held)
            if held < req[rid, PREFILL_END]:
                pairs += s * held + s * (s + 1) // 2
            processed += s
            tokens += kept_tokens(cfg, req[rid, SKIPPED], held_after(req, rid, s))
        else:
            tokens += kept_tokens(cfg, req[rid, SKIPPED], req[rid, HELD])
        if cfg[PAGED] != 0:
            alloc += req[rid, BLOCKS] * cfg[BLOCK_SIZE]
        else:
            alloc += req[rid, RESERVED]
            final += req[rid, PROMPT] + req[rid, OUTPUT] - 1  # the KV it ends holding
    return kv, processed, tokens, alloc, final, nreq, pairs


# -- speculative decoding (kvplan/sim/speculative.py has the rules and the reference's twins) --------

U_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
U_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
U_MIX2 = np.uint64(0x94D049BB133111EB)


@njit(cache=True)
def spec_draw(seed, rid, generated):
    """32 uniform bits for request rid after `generated` tokens (speculative.draw, bit for bit)."""
    x = np.uint64(seed) * U_GOLDEN + np.uint64(rid) * U_MIX1 + np.uint64(generated)
    x ^= x >> np.uint64(30)
    x *= U_MIX1
    x ^= x >> np.uint64(27)
    x *= U_MIX2
    x ^= x >> np.uint64(31)
    return np.int64(x >> np.uint64(32))


@njit(cache=True)
def spec_accepts(cfg, rid, generated, drafts):
    """Of `drafts` drafts, those request rid's step accepts after `generated` tokens: the leading
    positions whose threshold its draw falls below (SpecSetup.accepted)."""
    u = spec_draw(cfg[SPEC_SEED], rid, generated)
    a = 0
    while a < drafts and u < cfg[cfg[SPEC_THR_AT] + a]:
        a += 1
    return a


@njit(cache=True)
def spec_advance(cfg, req, rid, s):
    """A decoding request's step of s tokens (s - 1 drafts): it holds and has generated 1 + a more,
    a the drafts accepted (at most what its output has left); the caller adds the last 1."""
    a = spec_accepts(cfg, rid, req[rid, GENERATED], s - 1)
    left = req[rid, OUTPUT] - req[rid, GENERATED] - 1
    if a > left:
        a = left
    req[rid, HELD] += 1 + a
    req[rid, GENERATED] += a


@njit(cache=True)
def spec_pass_ticks(cfg, tokens, nreq, kv, pairs):
    """Ticks of one draft pass (speculative.SpecSetup.pass_ticks)."""
    if tokens <= 0 or cfg[SPEC_OVERHEAD] == 0:
        return 0
    last = cfg[SPEC_LIN_LEN] - 1
    lin = (cfg[cfg[SPEC_LIN_AT] + tokens] if tokens <= last
           else cfg[cfg[SPEC_LIN_AT] + last] + (tokens - last) * cfg[SPEC_LIN_SLOPE])
    return cfg[SPEC_OVERHEAD] + cfg[SPEC_REQ] * nreq + lin + cfg[SPEC_KV] * kv + cfg[SPEC_ATTN] * pairs


@njit(cache=True)
def spec_step_dt(cfg, req, running, sched, n, kv, processed, nreq, pairs):
    """step_dt with the drafts verified and the drafter's passes (speculative.SpecSetup.step_ticks)."""
    if cfg[TIMED] == 0 or cfg[PHYSICAL] == 0:
        return step_dt(cfg, kv, processed, nreq, pairs)
    decoders = 0
    drafts = 0
    kv_dec = 0
    for i in range(n):
        rid = running[i]
        if sched[i] > 0 and req[rid, HELD] >= req[rid, PREFILL_END]:
            decoders += 1
            drafts += sched[i] - 1
            kv_dec += kv_read(cfg, req[rid, HELD])
    return physical_dt(cfg, kv, processed, nreq, pairs, spec_extra(cfg, processed, nreq, kv, pairs, decoders, drafts,
                                                                    kv_dec))


@njit(cache=True)
def spec_extra(cfg, tokens, nreq, kv, pairs, decoders, drafts, kv_dec):
    """The GPU ticks speculation adds to a step (speculative.SpecSetup.step_ticks): the verified
    drafts' lm_head and, beside decoding requests, the drafter's pass over the step's tokens and
    its k - 1 passes of one token per decoding request."""
    extra = cfg[SPEC_VERIFY] * drafts
    if decoders > 0:
        extra += (spec_pass_ticks(cfg, tokens, nreq, kv, pairs)
                  + (cfg[SPEC_K] - 1) * spec_pass_ticks(cfg, decoders, decoders, kv_dec, 0))
    return extra


@njit(cache=True)
def physical_dt(cfg, kv, tokens, nreq, pairs, extra):
    """The physical step model's ticks (step_dt) with `extra` ticks of GPU work (a speculative
    step's verified drafts and draft passes)."""
    gpu = (cfg[OVERHEAD] + cfg[REQ_TICKS] * nreq + linear_ticks(cfg, tokens)
           + cfg[KV_TICKS] * kv + cfg[ATTN_TICKS] * pairs + extra)
    host = cfg[HOST_TICKS] + cfg[HOST_REQ_TICKS] * nreq
    return gpu if gpu > host else host


@njit(cache=True)
def run_step(cfg, st, req, px, running, sched, requeued, run_start, run_len, timeline, acc):
    """Phase 3: time the step, account for it, apply its tokens, finish requests. Memory is
    counted once per block: a block several requests share counts for one."""
    n = st[NUM_RUNNING]
    kv, processed, tokens, alloc, final, nreq, pairs = batch_sums(cfg, req, running, sched, n)
    tokens += st[LD_TOKENS]  # requests loading from the CPU tier hold their blocks (0 without one)
    alloc += st[LD_BLOCKS] * cfg[BLOCK_SIZE]
    shared = st[SHARED] * cfg[BLOCK_SIZE]
    tokens -= shared
    alloc -= shared
    if cfg[SPEC_K] == 0:
        dt = step_dt(cfg, kv, processed, nreq, pairs)
    else:
        dt = spec_step_dt(cfg, req, running, sched, n, kv, processed, nreq, pairs)
    ext = external(cfg, st, req, requeued, run_len)
    account_span(cfg, st, req, acc, timeline, dt, n, waiting_count(st, req, st[NOW]), tokens, alloc, final, ext)
    st[PEAK_RUNNING] = max(st[PEAK_RUNNING], n)
    end = st[NOW] + dt
    kept = 0
    for i in range(n):
        rid = running[i]
        if sched[i] > 0:
            if cfg[SPEC_K] != 0 and req[rid, HELD] >= req[rid, PREFILL_END]:
                spec_advance(cfg, req, rid, sched[i])
            else:
                req[rid, HELD] = held_after(req, rid, sched[i])
            if req[rid, HELD] >= req[rid, PREFILL_END]:
                req[rid, GENERATED] += 1
                if req[rid, GENERATED] == 1:
                    req[rid, FIRST_TOKEN_AT] = end
                if req[rid, GENERATED] == req[rid, OUTPUT]:
                    req[rid, FINISHED_AT] = end
                    release(cfg, st, req, px, run_start, run_len, rid)
                    st[DONE] += 1
                    continue
        running[kept] = rid
        kept += 1
    st[NUM_RUNNING] = kept
    st[NOW] = end
    st[STEPS] += 1


@njit(cache=True)
def do_step(cfg, st, req, px, cx, running, sched, requeued, swapped, run_start, run_len, timeline, acc):
    """One scheduler step, as the reference's: the running batch, then (when nothing was
    preempted) swapped-out requests, then (when none is left swapped out) new admissions. With a
    CPU tier the scheduled requests then store their blocks, and a step with nothing to run while
    loads are in flight waits for them instead. Returns 4 when nothing could ever run, else 0."""
    budget, preempted = schedule_running(cfg, st, req, px, running, sched, requeued, swapped)
    before = st[NUM_RUNNING]
    if not preempted:
        budget = resume_swapped(cfg, st, req, px, running, sched, swapped, budget)
        if st[SWAPPED_LEN] == 0:
            admit(cfg, st, req, px, cx, running, sched, requeued, run_start, run_len, budget)
    if cx is not None:
        if st[NUM_RUNNING] == 0 and st[LD_LEN] > 0:
            return wait_for_load(cfg, st, req, px, cx, acc, timeline)
        store_pass(cfg, st, req, px, cx, running, sched, before)
    run_step(cfg, st, req, px, running, sched, requeued, run_start, run_len, timeline, acc)
    return 0


# -- jumps over decode-only stretches ------------------------------------------------------------


@njit(cache=True)
def demand(cfg, req, running, n, k):
    """Blocks the running batch takes in its next k decode steps."""
    total = 0
    for i in range(n):
        rid = running[i]
        total += cdiv(req[rid, HELD] + k, cfg[BLOCK_SIZE]) - req[rid, BLOCKS]
    return total


@njit(cache=True)
def fit_steps(cfg, req, running, n, k, free):
    """The most decode steps (at most k) whose blocks fit in `free`."""
    if demand(cfg, req, running, n, k) <= free:
        return k
    lo, hi = 0, k
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if demand(cfg, req, running, n, mid) <= free:
            lo = mid
        else:
            hi = mid
    return lo


@njit(cache=True)
def can_admit(cfg, st, req, px, cx, requeued, swapped, run_len, free, budget):
    """Whether the admission phase would start anything, given the free blocks after phase 1:
    0 no, 1 yes, 2 not now, but possibly once blocks are evicted.

    With prefix caching a head whose hits nobody holds counts them against the free pool; if
    one of them were evicted, its hits would end there and those blocks leave the count, so
    evictions can make room for it (2). It never needs fewer than its new blocks, which only
    grow as hits shrink: when those do not fit either, no eviction helps (0)."""
    if st[NUM_RUNNING] >= cfg[MAX_SEQS]:
        return 0
    if cx is not None:
        front = front_admissible(cfg, st, req, cx, free, budget)
        if front >= 0:
            return front
    rid = swapped[st[SWAPPED_HEAD]] if st[SWAPPED_LEN] > 0 else waiting_head(st, req, requeued)
    if rid < 0:
        return 0
    if cfg[PAGED] == 0:
        if tokens_for(cfg, req, rid, budget) == 0:
            return 0
        return 1 if largest_run(st, run_len) >= req[rid, RESERVED] else 0
    if st[SWAPPED_LEN] > 0:
        n = tokens_for(cfg, req, rid, budget)
        need = blocks_held(cfg, skip_of(cfg, req[rid, HELD]), lookahead_slots(cfg, held_after(req, rid, n)))
        return 1 if n > 0 and need <= free else 0
    n, hits, idle, new = waiting_need(cfg, req, px, rid, budget)
    if cx is not None:
        return head_admissible(cfg, st, req, px, cx, rid, n, hits, idle, new, free, budget)
    if n == 0:
        return 0
    if new + idle <= free:
        return 1
    return 2 if idle > 0 and new <= free else 0


@njit(cache=True)
def steps_before(delta, k, flat, base, slope, jstar):
    """How many of the next k steps start less than `delta` ticks from now (delta > 0)."""
    if cum(k, flat, base, slope, jstar) < delta:
        return k
    lo, hi = 0, k
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if cum(mid, flat, base, slope, jstar) < delta:
            lo = mid
        else:
            hi = mid
    return hi


@njit(cache=True)
def piece(cfg, st, req, running, acc, jump, j0, j1, d, e):
    """Integrals of jump steps j0..j1-1, whose durations are d + e * (j - j0). `jump`: what holds
    over the whole jump (requests running, tokens held before it, contiguous reservations and
    final lengths, external waste)."""
    n, h0, alloc, final, ext = jump
    length = j1 - j0
    sumdt = length * d + e * sum_i(length)
    if st[SHARED] != 0:
        mac(acc, ACC_SHARED, st[SHARED] * cfg[BLOCK_SIZE], sumdt)
    mac(acc, ACC_TIME, ONE, sumdt)
    mac(acc, ACC_RUNNING, n, sumdt)
    a = h0 + n * (j0 + 1)  # tokens held during step j0
    mac(acc, ACC_TOKENS, d, length * a + n * sum_i(length))
    mac(acc, ACC_TOKENS, e, a * sum_i(length) + n * sum_i2(length))
    if cfg[PAGED] != 0:
        sb = 0
        sjb = 0
        for i in range(n):
            if length == 1:  # the common short jump: one step, one division
                sb += cdiv(req[running[i], HELD] + j0 + 1, cfg[BLOCK_SIZE])
            else:
                x, y = block_sums(req[running[i], HELD] + j0, length, cfg[BLOCK_SIZE])
                sb += x
                sjb += y
        mac(acc, ACC_ALLOCATED, d, cfg[BLOCK_SIZE] * sb)
        mac(acc, ACC_ALLOCATED, e, cfg[BLOCK_SIZE] * sjb)
    else:
        mac(acc, ACC_ALLOCATED, alloc, sumdt)
        mac(acc, ACC_FINAL_LEN, final, sumdt)
    mac(acc, ACC_EXTERNAL, ext, sumdt)
    if st[LD_BLOCKS] != 0:  # requests loading from the CPU tier: constant over the jump
        mac(acc, ACC_TOKENS, st[LD_TOKENS], sumdt)
        mac(acc, ACC_ALLOCATED, st[LD_BLOCKS] * cfg[BLOCK_SIZE], sumdt)


@njit(cache=True)
def jump_samples(cfg, st, req, running, timeline, k, tp, jump):
    """Timeline samples falling inside the jump: each takes the state of its step."""
    flat, base, slope, jstar = tp
    n, h0, alloc, final, ext = jump
    t = st[NOW]
    end = t + cum(k, flat, base, slope, jstar)
    while next_sample_at(st) < end:
        when = next_sample_at(st)
        # the last step starting at or before `when`
        j = steps_before(when - t + 1, k, flat, base, slope, jstar) - 1
        tokens = h0 + n * (j + 1)
        if cfg[PAGED] != 0:
            alloc = 0
            for i in range(n):
                alloc += cdiv(req[running[i], HELD] + j + 1, cfg[BLOCK_SIZE]) * cfg[BLOCK_SIZE]
        shared = st[SHARED] * cfg[BLOCK_SIZE]
        tokens += st[LD_TOKENS] - shared
        alloc += st[LD_BLOCKS] * cfg[BLOCK_SIZE] - shared
        reserved, internal, free = memory_parts(cfg, tokens, alloc, final, ext)
        waiting = waiting_count(st, req, t + cum(j, flat, base, slope, jstar))
        record_sample(cfg, st, timeline, when, n, waiting, tokens, reserved, internal, ext, free)


@njit(cache=True)
def do_jump(cfg, st, req, px, running, requeued, run_start, run_len, timeline, acc, k, n, h0):
    """Advance the n running requests (holding h0 tokens in all) by k decode steps at once.

    The step time is flat while compute binds, then grows by `slope` ticks a step as the KV
    read grows (jump_params), so the integrals split into at most two pieces, each a closed
    form; then every request gains k tokens and its blocks, and those whose last token this
    was finish at the jump's end. As in the step-by-step rules, every block is taken before
    any finished request frees its own (it matters with prefix caching: the order of the free
    queue decides what is evicted).
    """
    tp = jump_params(cfg, h0, n)
    flat, base, slope, jstar = tp
    alloc = 0
    final = 0
    if cfg[PAGED] == 0:
        for i in range(n):
            alloc += req[running[i], RESERVED]
            final += req[running[i], PROMPT] + req[running[i], OUTPUT] - 1
    ext = external(cfg, st, req, requeued, run_len)
    split = min(jstar, k)
    jump = (n, h0, alloc, final, ext)
    if split > 0:
        piece(cfg, st, req, running, acc, jump, ZERO, split, flat, ZERO)
    if split < k:
        piece(cfg, st, req, running, acc, jump, split, k, base + slope * split, slope)
    jump_samples(cfg, st, req, running, timeline, k, tp, jump)
    end = st[NOW] + cum(k, flat, base, slope, jstar)
    taken = 0
    b = cfg[BLOCK_SIZE]
    paged = cfg[PAGED] != 0
    for i in range(n):
        rid = running[i]
        held = req[rid, HELD] + k
        req[rid, HELD] = held
        req[rid, GENERATED] += k
        if paged:
            blocks = (held + b - 1) // b
            taken += blocks - req[rid, BLOCKS]
            req[rid, BLOCKS] = blocks
    if cfg[PREFIX] != 0:
        take_blocks(cfg, st, px, taken)
    else:
        st[FREE_BLOCKS] -= taken
    kept = 0
    for i in range(n):
        rid = running[i]
        if req[rid, GENERATED] == req[rid, OUTPUT]:
            req[rid, FINISHED_AT] = end
            release(cfg, st, req, px, run_start, run_len, rid)
            st[DONE] += 1
        else:
            running[kept] = rid
            kept += 1
    st[NUM_RUNNING] = kept
    st[PEAK_RUNNING] = max(st[PEAK_RUNNING], n)
    st[STEPS] += k
    st[NOW] = end


@njit(cache=True)
def try_jump(cfg, st, req, px, cx, running, requeued, swapped, run_start, run_len, timeline, acc):
    """Jump over the decode-only steps before the next event; False when this step is an event.

    A jump is taken only when the next step is decode-only (no prefill left in the batch) and
    nothing but token counts can change: no admission is possible even after this step's
    blocks (can_admit), and k is cut to the steps whose blocks fit the free pool, to the
    first finish, and to the next arrival that could be admitted or the last one loaded.
    With prefix caching, when evictions could make room for the head (can_admit 2), k is also
    cut to the steps whose blocks come from the anonymous free blocks at the front of the
    queue, so that nothing is evicted.
    """
    n = st[NUM_RUNNING]
    if n == 0 or n > cfg[TOKEN_BUDGET] or cfg[HYBRID] != 0 or cfg[SPEC_K] != 0:  # hybrid and speculative
        #   runs step by step (a speculative step's tokens depend on each request's draws)
        return False
    k = cfg[MAX_JUMP]
    h0 = 0
    first = 0  # blocks the first step takes
    paged = cfg[PAGED] != 0
    for i in range(n):
        rid = running[i]
        held = req[rid, HELD]
        if held < req[rid, PREFILL_END]:
            return False
        k = min(k, req[rid, OUTPUT] - req[rid, GENERATED])
        h0 += held
        if paged:
            first += cdiv(held + 1, cfg[BLOCK_SIZE]) - req[rid, BLOCKS]
    admissible = can_admit(cfg, st, req, px, cx, requeued, swapped, run_len, st[FREE_BLOCKS] - first,
                           cfg[TOKEN_BUDGET] - n)
    if admissible == 1:
        return False
    if paged:
        free = st[FREE_BLOCKS]
        if admissible == 2 and st[Q_HEAD] >= 0:
            free = min(free, px[3][st[Q_HEAD] * NE + E_ANON])
        k = fit_steps(cfg, req, running, n, k, free)
        if k == 0:
            return False
    stop = INF
    fresh = st[NEXT_FRESH]
    if st[REQUEUE_LEN] == 0 and st[SWAPPED_LEN] == 0 and fresh < st[LOADED] and req[fresh, ARRIVAL] > st[NOW]:
        stop = req[fresh, ARRIVAL]  # the queue is empty and this arrival could be admitted
    if st[ALL_LOADED] == 0:  # never step past what is loaded (or the horizon beyond it)
        stop = min(stop, max(req[st[LOADED] - 1, ARRIVAL], st[HORIZON]))
    if cx is not None:
        if st[LD_LEN] > 0 and req[cx[2][st[LD_HEAD]], READY_AT] > st[NOW]:
            stop = min(stop, req[cx[2][st[LD_HEAD]], READY_AT])  # the front's load ends
        head_touch(cfg, st, req, px, cx, requeued, cfg[TOKEN_BUDGET] - n)
    if stop < INF:
        flat, base, slope, jstar = jump_params(cfg, h0, n)
        k = steps_before(stop - st[NOW], k, flat, base, slope, jstar)
    do_jump(cfg, st, req, px, running, requeued, run_start, run_len, timeline, acc, k, n, h0)
    st[JUMPS] += 1
    return True


# -- the loop --------------------------------------------------------------------------------------


@njit(cache=True)
def run(cfg, st, req, px, cx, queues, timeline, acc, max_events):
    """Simulate until done (0), until more requests must be loaded (1), for max_events (2),
    until the clock passes CLOCK_LIMIT (3), or until nothing can ever run (4: requests waiting
    behind a load from the CPU tier hold the pool). No event moves the clock by more than 2**61 ticks
    (engine.py bounds the longest step and MAX_JUMP), so it never overflows int64.

    `px`: the prefix cache's four arrays (ids, held, copies, entries); `cx`: the CPU tier's three
    (slot of each block node, slots, loading ring), or None without one; `queues`: the running
    batch, this step's schedule, the requeued and swapped queues and the contiguous free runs
    (start, length), as KernelState keeps them."""
    running, sched, requeued, swapped, run_start, run_len = queues
    for _ in range(max_events):
        t = st[NOW]
        if t > CLOCK_LIMIT:
            return 3
        loaded = st[LOADED]
        if st[ALL_LOADED] == 0 and t >= max(req[loaded - 1, ARRIVAL], st[HORIZON]):
            return 1
        fresh = st[NEXT_FRESH]
        arrived = fresh < loaded and req[fresh, ARRIVAL] <= t
        if (st[NUM_RUNNING] == 0 and st[REQUEUE_LEN] == 0 and st[SWAPPED_LEN] == 0 and st[LD_LEN] == 0
                and not arrived):
            if fresh >= loaded:
                return 0
            idle_until(cfg, st, req, acc, timeline, req[fresh, ARRIVAL])
        elif not try_jump(cfg, st, req, px, cx, running, requeued, swapped, run_start, run_len, timeline, acc):
            if do_step(cfg, st, req, px, cx, running, sched, requeued, swapped, run_start, run_len, timeline, acc):
                return 4
        st[EVENTS] += 1
    return 2


# -- SGLang's scheduler (rules: kvplan/sim/sglang.py; reference: sglang_reference.py) --------------
#
# Step by step (no jumps), on arrays of its own besides cfg, st (NOW, ORIGIN, the timeline's and
# the counters' scalars), timeline and acc:
#   gcfg  settings (G_*)                 gf  new_token_ratio: init, min, decay, current (F_*)
#   gst   scalar state (GS_*)            sr  one row per request (S_*)
#   ids   trie node of each identity block of every request, from sr[rid, S_ID_START]
#   nd    one row per trie node of the radix tree (N_*); LRU list of the evictable leaves, oldest
#         first (N_PREV/N_NEXT, GS_LRU_HEAD/TAIL), kept sorted by N_STAMP
#   wq    the waiting queue, wq[0:gst[GS_WLEN]]; rq the running batch, rq[0:gst[GS_NRUN]] (finished
#         requests stay until the next decode filters them); bt, bn this step's prefill batch and
#         its tokens; order scratch for retract_decode

G_LPM = 0        # 1: schedule_policy lpm (with the radix cache), 0: fcfs
G_RADIX = 1      # 1: the radix cache reuses prefixes
G_MAX_RUNNING = 2
G_CHUNK = 3      # chunked_prefill_size (0: no chunking)
G_MAX_PREFILL = 4
G_H = 5          # tokens per trie node (the hash block)
NUM_G = 6

F_INIT = 0
F_MIN = 1
F_DECAY = 2
F_RATIO = 3
F_TOTAL_OFFSET = 4  # PrefillAdder: rem_total_token_offset of the batch being formed
NUM_F = 5

GS_EVICTABLE = 0  # tokens of cached nodes nobody locks
GS_CHUNKED = 1    # the request mid-chunk (-1: none)
GS_FULL = 2       # running_batch.batch_is_full
GS_NRUN = 3
GS_WLEN = 4
GS_STAMP = 5      # last access stamp handed out
GS_PASS = 6       # lpm passes so far (N_MARK, S_DEMOTED)
GS_LRU_HEAD = 7
GS_LRU_TAIL = 8
GS_NBATCH = 9
GS_CUR_OFFSET = 10  # PrefillAdder: cur_rem_token_offset
GS_REM_INPUT = 11
GS_REM_CHUNK = 12
NUM_GS = 13

S_ARRIVAL = 0
S_PROMPT = 1
S_OUTPUT = 2
S_GEN = 3
S_HELD = 4
S_TARGET = 5
S_SHARED = 6    # tokens of HELD living in tree nodes
S_LOCKED = 7    # leading identity nodes it locks
S_MATCH = 8     # lpm's key: tokens the tree held at the last pass
S_ADMITTED = 9
S_FIRST = 10
S_FINISH = 11
S_PREEMPTED = 12
S_HIT = 13
S_ID_START = 14
S_ID_COUNT = 15
S_DONE = 16
S_DEMOTED = 17  # the lpm pass that put it last (in-batch prefix check)
NUM_S = 18

N_CACHED = 0
N_LOCK = 1
N_STAMP = 2
N_KIDS = 3      # cached children
N_PARENT = 4    # -1: a child of the root
N_MARK = 5      # the lpm pass whose waiting-queue tree holds it
N_PREV = 6
N_NEXT = 7
N_LISTED = 8    # 1: in the LRU list of evictable leaves
NUM_N = 9


@njit(cache=True)
def sg_lru_remove(gst, nd, x):
    p, q = nd[x, N_PREV], nd[x, N_NEXT]
    if p >= 0:
        nd[p, N_NEXT] = q
    else:
        gst[GS_LRU_HEAD] = q
    if q >= 0:
        nd[q, N_PREV] = p
    else:
        gst[GS_LRU_TAIL] = p
    nd[x, N_LISTED] = 0


@njit(cache=True)
def sg_lru_insert(gst, nd, x):
    """x joins the evictable leaves at its place by stamp (scanning from the most recent)."""
    q = -1
    p = gst[GS_LRU_TAIL]
    while p >= 0 and nd[p, N_STAMP] > nd[x, N_STAMP]:
        q = p
        p = nd[p, N_PREV]
    nd[x, N_PREV], nd[x, N_NEXT] = p, q
    if p >= 0:
        nd[p, N_NEXT] = x
    else:
        gst[GS_LRU_HEAD] = x
    if q >= 0:
        nd[q, N_PREV] = x
    else:
        gst[GS_LRU_TAIL] = x
    nd[x, N_LISTED] = 1


@njit(cache=True)
def sg_touch(gst, sr, ids, nd, rid, k):
    """The first k nodes of rid's path are accessed, root first (last_access_time)."""
    start = sr[rid, S_ID_START]
    for j in range(k):
        x = ids[start + j]
        gst[GS_STAMP] += 1
        nd[x, N_STAMP] = gst[GS_STAMP]
        if nd[x, N_LISTED] != 0 and gst[GS_LRU_TAIL] != x:
            sg_lru_remove(gst, nd, x)
            sg_lru_insert(gst, nd, x)


@njit(cache=True)
def sg_lock(gst, nd, h, x):
    if nd[x, N_LOCK] == 0:
        gst[GS_EVICTABLE] -= h
        if nd[x, N_LISTED] != 0:
            sg_lru_remove(gst, nd, x)
    nd[x, N_LOCK] += 1


@njit(cache=True)
def sg_unlock(gst, nd, h, x):
    nd[x, N_LOCK] -= 1
    if nd[x, N_LOCK] == 0:
        gst[GS_EVICTABLE] += h
        if nd[x, N_KIDS] == 0:
            sg_lru_insert(gst, nd, x)


@njit(cache=True)
def sg_evict(st, gst, nd, h, n):
    """RadixCache.evict(n): least recently used unlocked leaves until n tokens are freed."""
    evicted = 0
    while evicted < n and gst[GS_LRU_HEAD] >= 0:
        x = gst[GS_LRU_HEAD]
        sg_lru_remove(gst, nd, x)
        nd[x, N_CACHED] = 0
        st[FREE_BLOCKS] += h
        gst[GS_EVICTABLE] -= h
        evicted += h
        st[PC_BLOCKS_EVICTED] += h
        p = nd[x, N_PARENT]
        if p >= 0:
            nd[p, N_KIDS] -= 1
            if nd[p, N_KIDS] == 0 and nd[p, N_LOCK] == 0:
                sg_lru_insert(gst, nd, p)


@njit(cache=True)
def sg_evict_if_needed(st, gst, nd, h, n):
    if st[FREE_BLOCKS] < n:
        sg_evict(st, gst, nd, h, n)


@njit(cache=True)
def sg_hits(sr, ids, nd, rid):
    """Leading nodes of rid's path that the tree holds."""
    start, count = sr[rid, S_ID_START], sr[rid, S_ID_COUNT]
    k = 0
    while k < count and nd[ids[start + k], N_CACHED] != 0:
        k += 1
    return k


@njit(cache=True)
def sg_insert(gcfg, st, gst, sr, ids, nd, rid):
    """cache_(un)finished_req: rid's computed identity nodes join the tree, locked by rid (one
    another request inserted first is freed as a duplicate); its path is touched."""
    if gcfg[G_RADIX] == 0:
        return
    h = gcfg[G_H]
    locked_tokens = sr[rid, S_LOCKED] * h
    if sr[rid, S_SHARED] < locked_tokens and locked_tokens <= sr[rid, S_HELD]:
        st[FREE_BLOCKS] += locked_tokens - sr[rid, S_SHARED]
        sr[rid, S_SHARED] = locked_tokens
    start, count = sr[rid, S_ID_START], sr[rid, S_ID_COUNT]
    j = sr[rid, S_LOCKED]
    while j < count and (j + 1) * h <= sr[rid, S_HELD]:
        x = ids[start + j]
        if nd[x, N_CACHED] != 0:
            st[FREE_BLOCKS] += h
            sg_lock(gst, nd, h, x)
        else:
            nd[x, N_CACHED] = 1
            p = nd[x, N_PARENT]
            if p >= 0:
                nd[p, N_KIDS] += 1
                if nd[p, N_LISTED] != 0:
                    sg_lru_remove(gst, nd, p)
            nd[x, N_LOCK] = 1
        sr[rid, S_SHARED] += h
        j += 1
    sr[rid, S_LOCKED] = j
    sg_touch(gst, sr, ids, nd, rid, j)


@njit(cache=True)
def sg_release(gcfg, st, gst, sr, ids, nd, rid):
    """rid's own tokens go back to the pool; its path is unlocked, deepest first."""
    st[FREE_BLOCKS] += sr[rid, S_HELD] - sr[rid, S_SHARED]
    start = sr[rid, S_ID_START]
    for j in range(sr[rid, S_LOCKED] - 1, -1, -1):
        sg_unlock(gst, nd, gcfg[G_H], ids[start + j])
    sr[rid, S_LOCKED] = 0
    sr[rid, S_SHARED] = 0


@njit(cache=True)
def sg_calc_priority(gcfg, gst, sr, ids, nd, wq):
    """lpm: match every waiting request, put the in-batch duplicates last, sort by match (stable)."""
    w = gst[GS_WLEN]
    if gcfg[G_LPM] == 0 or w > 128:
        return
    gst[GS_PASS] += 1
    pid = gst[GS_PASS]
    h = gcfg[G_H]
    for i in range(w):
        rid = wq[i]
        k = sg_hits(sr, ids, nd, rid)
        sg_touch(gst, sr, ids, nd, rid, k)
        sr[rid, S_MATCH] = k * h
        if k * h <= 32:
            start, count = sr[rid, S_ID_START], sr[rid, S_ID_COUNT]
            m = 0
            while m < count and nd[ids[start + m], N_MARK] == pid:
                m += 1
            if m * h >= 32:
                sr[rid, S_DEMOTED] = pid
            else:
                for j in range(count):
                    nd[ids[start + j], N_MARK] = pid
    for i in range(1, w):  # stable insertion sort by (demoted, -match)
        rid = wq[i]
        dr = sr[rid, S_DEMOTED] == pid
        j = i
        while j > 0:
            other = wq[j - 1]
            do = sr[other, S_DEMOTED] == pid
            if do and not dr:
                pass
            elif not do and not dr and sr[other, S_MATCH] < sr[rid, S_MATCH]:
                pass
            else:
                break
            wq[j] = other
            j -= 1
        wq[j] = rid


@njit(cache=True)
def sg_rem_total(st, gst, gf):
    return (st[FREE_BLOCKS] + gst[GS_EVICTABLE]) - gf[F_TOTAL_OFFSET]


@njit(cache=True)
def sg_prefill_one(gcfg, gst, gf, ext, max_new):
    gf[F_TOTAL_OFFSET] += ext + max_new
    gst[GS_CUR_OFFSET] += ext
    gst[GS_REM_INPUT] -= ext
    if gcfg[G_CHUNK] > 0:
        gst[GS_REM_CHUNK] -= ext


@njit(cache=True)
def sg_budget_state(gcfg, st, gst, gf):
    """0 continue, 1 no token, 2 other (PrefillAdder.budget_state)."""
    if sg_rem_total(st, gst, gf) <= 0 or st[FREE_BLOCKS] + gst[GS_EVICTABLE] - gst[GS_CUR_OFFSET] <= 0:
        return 1
    if gst[GS_REM_INPUT] <= 0 or (gcfg[G_CHUNK] > 0 and gst[GS_REM_CHUNK] <= 0):
        return 2
    return 0


@njit(cache=True)
def sg_add_one(gcfg, st, gst, gf, sr, ids, nd, rid, others):
    """PrefillAdder.add_one_req: (verdict for the next candidate, tokens rid prefills now)."""
    h = gcfg[G_H]
    k = sg_hits(sr, ids, nd, rid) if gcfg[G_RADIX] != 0 else 0
    m = min(k * h, sr[rid, S_TARGET] - 1)
    k = cdiv(m, h) if m > 0 else 0
    sg_touch(gst, sr, ids, nd, rid, k)
    ext = sr[rid, S_TARGET] - m
    total = ext + min(sr[rid, S_OUTPUT] - sr[rid, S_GEN], 4096)
    if total >= sg_rem_total(st, gst, gf):
        return 1, 0
    if ext > gst[GS_REM_INPUT] and others:
        return 2, 0
    start = sr[rid, S_ID_START]
    unheld = 0
    for j in range(k):
        if nd[ids[start + j], N_LOCK] == 0:
            unheld += h
    if total > sg_rem_total(st, gst, gf) - unheld:
        return 1, 0
    if gcfg[G_CHUNK] == 0 or ext <= gst[GS_REM_CHUNK]:
        n, max_new = ext, min(sr[rid, S_OUTPUT] - sr[rid, S_GEN], 4096)
    else:
        n, max_new = gst[GS_REM_CHUNK], 0
        if n <= 0:
            return 2, 0
    for j in range(k):
        x = ids[start + j]
        if nd[x, N_LOCK] == 0:
            st[PC_BLOCKS_REUSED] += min(h, m - j * h)
        sg_lock(gst, nd, h, x)
    sr[rid, S_HELD] = m
    sr[rid, S_SHARED] = m
    sr[rid, S_LOCKED] = k
    st[PC_PREFILL_SAVED] += m
    if sr[rid, S_ADMITTED] < 0:
        sr[rid, S_ADMITTED] = st[NOW]
        sr[rid, S_HIT] = m
        st[PC_LOOKUPS] += 1
        st[PC_QUERY_TOKENS] += sr[rid, S_PROMPT]
        st[PC_HIT_TOKENS] += m
    sg_prefill_one(gcfg, gst, gf, n, max_new)
    return sg_budget_state(gcfg, st, gst, gf), n


@njit(cache=True)
def sg_prefill_batch(gcfg, st, gst, gf, sr, ids, nd, wq, rq, bt, bn):
    """get_new_batch_prefill: the batch in bt/bn (GS_NBATCH requests, 0: none), its tokens
    allocated; -1 when the pool cannot hold them."""
    gst[GS_NBATCH] = 0
    if (gst[GS_FULL] != 0 or gst[GS_WLEN] == 0) and gst[GS_CHUNKED] < 0:
        return 0
    running_bs = gst[GS_NRUN]
    if running_bs >= gcfg[G_MAX_RUNNING]:
        gst[GS_FULL] = 1
        return 0
    sg_calc_priority(gcfg, gst, sr, ids, nd, wq)
    offset = 0.0
    for i in range(running_bs):
        r = rq[i]
        offset += min(sr[r, S_OUTPUT] - sr[r, S_GEN], 4096) * gf[F_RATIO]
    gf[F_TOTAL_OFFSET] = offset
    gst[GS_CUR_OFFSET] = 0
    gst[GS_REM_INPUT] = gcfg[G_MAX_PREFILL]
    gst[GS_REM_CHUNK] = gcfg[G_CHUNK]
    nb = 0
    new_chunked = -1
    c = gst[GS_CHUNKED]
    if c >= 0:
        ext = sr[c, S_TARGET] - sr[c, S_HELD]
        limit = min(gst[GS_REM_CHUNK], int(sg_rem_total(st, gst, gf)))
        if limit > 0:
            truncated = ext > limit
            n = min(ext, limit)
            bt[nb], bn[nb] = c, n
            nb += 1
            sg_prefill_one(gcfg, gst, gf, n, 0 if truncated else min(sr[c, S_OUTPUT] - sr[c, S_GEN], 4096))
            if not truncated:
                gst[GS_CHUNKED] = -1
    w = gst[GS_WLEN]
    for i in range(w):
        if running_bs + nb >= gcfg[G_MAX_RUNNING]:
            gst[GS_FULL] = 1
            break
        rid = wq[i]
        verdict, n = sg_add_one(gcfg, st, gst, gf, sr, ids, nd, rid, nb > 0)
        if n > 0:
            bt[nb], bn[nb] = rid, n
            nb += 1
            if n < sr[rid, S_TARGET] - sr[rid, S_HELD]:
                new_chunked = rid
        if verdict == 0:
            continue
        if verdict == 1:
            gst[GS_FULL] = 1
        break
    if nb == 0:
        return 0
    kept = 0
    for i in range(w):  # the admitted leave the queue (the first in queue order, so a prefix of it
        rid = wq[i]     # is not assumed: requests are marked by their batch membership)
        chosen = False
        for b in range(nb):
            if bt[b] == rid:
                chosen = True
                break
        if not chosen:
            wq[kept] = rid
            kept += 1
    gst[GS_WLEN] = kept
    if new_chunked >= 0:
        gst[GS_CHUNKED] = new_chunked
    total = 0
    for b in range(nb):
        total += bn[b]
    sg_evict_if_needed(st, gst, nd, gcfg[G_H], total)
    if st[FREE_BLOCKS] < total:
        return -1
    st[FREE_BLOCKS] -= total
    gst[GS_NBATCH] = nb
    return nb


@njit(cache=True)
def sg_account(cfg, st, gst, acc, timeline, dt, n):
    used = cfg[SLOTS] - st[FREE_BLOCKS] - gst[GS_EVICTABLE]
    account_span(cfg, st, st, acc, timeline, dt, n, gst[GS_WLEN], used, used, ZERO, ZERO)
    if n > st[PEAK_RUNNING]:
        st[PEAK_RUNNING] = n


@njit(cache=True)
def sg_finish(gcfg, st, gst, sr, ids, nd, rid, end):
    sr[rid, S_FINISH] = end
    sr[rid, S_DONE] = 1
    st[DONE] += 1
    sg_insert(gcfg, st, gst, sr, ids, nd, rid)
    sg_release(gcfg, st, gst, sr, ids, nd, rid)


@njit(cache=True)
def sg_prefill_step(cfg, gcfg, st, gst, sr, ids, nd, rq, bt, bn, timeline, acc):
    nb = gst[GS_NBATCH]
    kv = 0
    tokens = 0
    pairs = 0
    for b in range(nb):
        held, s = sr[bt[b], S_HELD], bn[b]
        kv += kv_read(cfg, held)
        tokens += s
        pairs += s * held + s * (s + 1) // 2
    dt = sg_step_dt(cfg, kv, tokens, nb, pairs, 0, 0)
    sg_account(cfg, st, gst, acc, timeline, dt, nb)
    end = st[NOW] + dt
    shrunk = False
    for b in range(nb):
        rid = bt[b]
        sr[rid, S_HELD] += bn[b]
        if sr[rid, S_HELD] < sr[rid, S_TARGET]:
            sg_insert(gcfg, st, gst, sr, ids, nd, rid)
            shrunk = True
            continue
        sr[rid, S_GEN] += 1
        if sr[rid, S_GEN] == 1:
            sr[rid, S_FIRST] = end
        if sr[rid, S_GEN] == sr[rid, S_OUTPUT]:
            sg_finish(gcfg, st, gst, sr, ids, nd, rid, end)
            shrunk = True
        else:
            sg_insert(gcfg, st, gst, sr, ids, nd, rid)
            rq[gst[GS_NRUN]] = rid
            gst[GS_NRUN] += 1
    if shrunk:
        gst[GS_FULL] = 0
    st[NOW] = end
    st[STEPS] += 1


@njit(cache=True)
def sg_step_dt(cfg, kv, tokens, nreq, pairs, decoders, kv_dec):
    """A step's ticks (step_dt); with speculative decoding, SGLang's EAGLE worker's step
    (speculative.SpecSetup.sglang_step_ticks): the draft's extend pass over every token of the
    step, and in a decode step `decoders` requests verifying k drafts and k - 1 more draft passes."""
    if cfg[SPEC_K] == 0 or cfg[TIMED] == 0 or cfg[PHYSICAL] == 0:
        return step_dt(cfg, kv, tokens, nreq, pairs)
    extra = spec_extra(cfg, tokens, nreq, kv, pairs, decoders, cfg[SPEC_K] * decoders, kv_dec)
    if decoders == 0:  # the draft's extend pass follows a prefill step too
        extra += spec_pass_ticks(cfg, tokens, nreq, kv, pairs)
    return physical_dt(cfg, kv, tokens, nreq, pairs, extra)


@njit(cache=True)
def sg_decode_buffer(cfg):
    """check_decode_mem's tokens per request: 1, or with speculative decoding (topk 1)
    decode_mem_cache_buf_multiplier = num_draft_tokens + num_steps = 2k + 1."""
    return 1 if cfg[SPEC_K] == 0 else 2 * cfg[SPEC_K] + 1


@njit(cache=True)
def sg_retract(cfg, gcfg, st, gst, gf, sr, ids, nd, wq, rq, order):
    """retract_decode: fewest outputs first, then the longest prompt, the last of equals first;
    with speculative decoding the batch's own order, the last first, and a headroom of 2k + 1
    tokens per request besides RETRACT_DECODE_STEPS."""
    n = gst[GS_NRUN]
    k = cfg[SPEC_K]
    for i in range(n):  # order: stable sort of 0..n-1 by (generated, -prompt), descending
        a = rq[i]
        j = i
        while j > 0 and k == 0:
            b = rq[order[j - 1]]
            if sr[b, S_GEN] < sr[a, S_GEN] or (sr[b, S_GEN] == sr[a, S_GEN] and sr[b, S_PROMPT] > sr[a, S_PROMPT]):
                order[j] = order[j - 1]
                j -= 1
            else:
                break
        order[j] = i
    need = 20 + (2 * k + 1 if k > 0 else 0)
    left = n
    first = True
    while st[FREE_BLOCKS] < need * left or first:
        if left == 1:
            break
        first = False
        left -= 1
        rid = rq[order[left]]
        wq[gst[GS_WLEN]] = rid
        gst[GS_WLEN] += 1
        st[RECOMPUTED] += sr[rid, S_HELD]
        sg_release(gcfg, st, gst, sr, ids, nd, rid)
        sr[rid, S_HELD] = 0
        sr[rid, S_TARGET] = sr[rid, S_PROMPT] + sr[rid, S_GEN]
        sr[rid, S_PREEMPTED] += 1
        st[PREEMPTIONS] += 1
        sg_evict_if_needed(st, gst, nd, gcfg[G_H], 20 * left)
    for i in range(left):  # the batch in the sorted order (filter_batch(keep_indices=...))
        order[i] = rq[order[i]]
    decoded = 0
    wanted = 0
    for i in range(left):
        rq[i] = order[i]
        decoded += sr[rq[i], S_GEN]
        wanted += sr[rq[i], S_OUTPUT]
    gst[GS_NRUN] = left
    gf[F_RATIO] = min(1.0, (decoded + 20 * left) / wanted)


@njit(cache=True)
def sg_accepted(cfg, sr, rid):
    """Drafts a decoding request's step accepts (spec_advance's draw), at most what its output
    has left after the step's own token."""
    a = spec_accepts(cfg, rid, sr[rid, S_GEN], cfg[SPEC_K])
    left = sr[rid, S_OUTPUT] - sr[rid, S_GEN] - 1
    return a if a < left else left


@njit(cache=True)
def sg_decode_step(cfg, gcfg, st, gst, gf, sr, ids, nd, wq, rq, order, timeline, acc):
    """update_running_batch and the decode step; False when the pool cannot hold it."""
    initial = gst[GS_NRUN]
    n = 0
    for i in range(initial):
        if sr[rq[i], S_DONE] == 0:
            rq[n] = rq[i]
            n += 1
    gst[GS_NRUN] = n
    h = gcfg[G_H]
    m = sg_decode_buffer(cfg)
    sg_evict_if_needed(st, gst, nd, h, n * m)
    if st[FREE_BLOCKS] < n * m:
        sg_retract(cfg, gcfg, st, gst, gf, sr, ids, nd, wq, rq, order)
    else:
        gf[F_RATIO] = max(gf[F_RATIO] - gf[F_DECAY], gf[F_MIN])
    n = gst[GS_NRUN]
    if n < initial:
        gst[GS_FULL] = 0
    sg_evict_if_needed(st, gst, nd, h, n * m)
    if st[FREE_BLOCKS] < n * m:
        return False
    kv = 0
    for i in range(n):
        kv += kv_read(cfg, sr[rq[i], S_HELD])
    k = cfg[SPEC_K]
    if k == 0:
        dt = step_dt(cfg, kv, n, n, 0)
    else:
        dt = sg_step_dt(cfg, kv, n * (k + 1), n, 0, n, kv)
    for i in range(n):
        rid = rq[i]
        a = sg_accepted(cfg, sr, rid) if k > 0 else 0
        sr[rid, S_HELD] += 1 + a
        sr[rid, S_GEN] += a
        st[FREE_BLOCKS] -= 1 + a
    sg_account(cfg, st, gst, acc, timeline, dt, n)
    end = st[NOW] + dt
    for i in range(n):
        rid = rq[i]
        sr[rid, S_GEN] += 1
        if sr[rid, S_GEN] == sr[rid, S_OUTPUT]:
            sg_finish(gcfg, st, gst, sr, ids, nd, rid, end)
    st[NOW] = end
    st[STEPS] += 1
    return True


@njit(cache=True)
def sg_run(cfg, gcfg, st, gst, gf, sr, ids, nd, wq, rq, bt, bn, order, timeline, acc, max_events):
    """Simulate SGLang's scheduler until done (0), for max_events iterations (2), until the clock
    passes CLOCK_LIMIT (3), or until requests wait that the pool can never hold (4). Before the
    last request is loaded (st[ALL_LOADED] 0) it stops (1) once the clock reaches the last loaded
    arrival or st[HORIZON], whichever is later, as `run` does: a caller loads what arrives next
    and calls again, and the run goes on as if everything had been loaded at once."""
    nreq = st[LOADED]
    for _ in range(max_events):
        t = st[NOW]
        if t > CLOCK_LIMIT:
            return 3
        if st[ALL_LOADED] == 0 and t >= max(sr[nreq - 1, S_ARRIVAL], st[HORIZON]):
            return 1
        while st[NEXT_FRESH] < nreq and sr[st[NEXT_FRESH], S_ARRIVAL] <= t:
            wq[gst[GS_WLEN]] = st[NEXT_FRESH]
            gst[GS_WLEN] += 1
            st[NEXT_FRESH] += 1
        st[EVENTS] += 1
        nb = sg_prefill_batch(gcfg, st, gst, gf, sr, ids, nd, wq, rq, bt, bn)
        if nb < 0:
            return 4
        if nb > 0:
            sg_prefill_step(cfg, gcfg, st, gst, sr, ids, nd, rq, bt, bn, timeline, acc)
            continue
        live = False
        for i in range(gst[GS_NRUN]):
            if sr[rq[i], S_DONE] == 0:
                live = True
                break
        if live:
            if not sg_decode_step(cfg, gcfg, st, gst, gf, sr, ids, nd, wq, rq, order, timeline, acc):
                return 4
            continue
        stale = gst[GS_NRUN] > 0
        gst[GS_NRUN] = 0
        gst[GS_FULL] = 0
        gf[F_RATIO] = gf[F_INIT]
        if stale:
            continue
        if st[NEXT_FRESH] >= nreq:
            if gst[GS_WLEN] > 0 or gst[GS_CHUNKED] >= 0:
                return 4
            return 0
        until = sr[st[NEXT_FRESH], S_ARRIVAL]
        if until <= t:
            return 4
        account_span(cfg, st, st, acc, timeline, until - t, ZERO, gst[GS_WLEN], ZERO, ZERO, ZERO, ZERO)
        st[IDLE] += until - t
        st[NOW] = until
    return 2
