"""The fast engine's compiled core: the reference's step, plus closed-form jumps between events.

Every compiled function lives in this one file on purpose: numba's on-disk cache is invalidated
per source file, so a callee in another file could be edited and leave a stale compiled caller.

State is plain int64 arrays (see `engine.KernelState`): `rq[request, field]` per request, `st`
scalars, `cf` constants, `runq` the running batch in admission order, `work` its tokens this step,
`qbuf`/`wbuf` ring buffers for the requeued and swapped queues, `frs`/`frl` the contiguous free
runs, `tl` the timeline, `acc` the time integrals as 128-bit integers in four base-2**31 limbs.

A jump covers k decode-only steps in which nothing can change but token counts: every running
request decodes, none finishes before step k - 1, no admission is possible (the head of the queue
does not fit, and memory only shrinks while nobody finishes), no preemption is needed (the blocks
the k steps take fit in the free pool), and no arrival could be admitted. Its time, integrals,
blocks and timeline samples are summed in closed form, in integers, so they equal the
step-by-step sums exactly.
"""

from __future__ import annotations

import numpy as np

try:
    from numba import njit
except ImportError:  # pragma: no cover - numba is a dependency; this keeps the code importable

    def njit(*args, **kwargs):
        return args[0] if args and callable(args[0]) else (lambda f: f)


# request fields: rq[rid, field]
ARR, PRM, OUT, GEN, HELD, TGT, NBLK, RSV, ADM, FTOK, FIN, NPRE = range(12)
NFIELDS = 12
# scalar state: st[...]
(S_T, S_FRESH, S_NLOAD, S_FINAL, S_NRUN, S_FREE, S_CPU, S_QH, S_QL, S_WH, S_WL, S_NFR, S_STEPS,
 S_PRE, S_SWO, S_RECOMP, S_PEAK, S_DONE, S_ORIGIN, S_TLK, S_TLD, S_TLN, S_EVENTS,
 S_JUMPS) = range(24)
NSTATE = 24
# constants: cf[...]
(C_PAGED, C_B, C_NB, C_SLOTS, C_SEQS, C_TOK, C_CHUNK, C_SWAP, C_SWSLOTS, C_TIMED, C_OVH, C_W,
 C_KV, C_FLOP, C_TAIL, C_TLMAX, C_QCAP) = range(17)
NCONF = 17
# time integrals: acc[row, limb]. Values passed to compiled functions are np.int64, not Python
# ints: numba compiles a separate copy of a function for every distinct int literal argument.
A_TIME, A_RUN, A_TOK, A_ALLOC, A_FINAL, A_EXT = (np.int64(i) for i in range(6))
NACC = 6
ZERO, ONE = np.int64(0), np.int64(1)
KCAP = 1 << 16  # longest jump: keeps every closed-form partial sum inside int64
INF = 1 << 62
M31 = (1 << 31) - 1

# -- exact arithmetic ----------------------------------------------------------------------------


@njit(cache=True)
def mac(acc, row, x, y):
    """acc[row] += x * y exactly, for 0 <= x, y < 2**62 (limbs of 31 bits, no int64 overflow)."""
    x0, x1, y0, y1 = x & M31, x >> 31, y & M31, y >> 31
    p0, p1, p2 = x0 * y0, x0 * y1 + x1 * y0, x1 * y1
    acc[row, 0] += p0 & M31
    acc[row, 1] += (p0 >> 31) + (p1 & M31)
    acc[row, 2] += (p1 >> 31) + (p2 & M31)
    acc[row, 3] += p2 >> 31
    for i in range(3):
        acc[row, i + 1] += acc[row, i] >> 31
        acc[row, i] &= M31


@njit(cache=True)
def cdiv(a, b):
    return -((-a) // b)


@njit(cache=True)
def s1(n):
    """Sum of i for 0 <= i < n."""
    return n * (n - 1) // 2


@njit(cache=True)
def s2(n):
    """Sum of i**2 for 0 <= i < n."""
    return (n - 1) * n * (2 * n - 1) // 6 if n > 0 else 0


@njit(cache=True)
def p1(v, b):
    """Sum of floor(u / b) for 0 <= u < v."""
    q = v // b
    return b * s1(q) + (v - q * b) * q


@njit(cache=True)
def p2(v, b):
    """Sum of u * floor(u / b) for 0 <= u < v."""
    q = v // b
    r = v - q * b
    return b * b * s2(q) + (b * (b - 1) // 2) * s1(q) + q * (r * q * b + r * (r - 1) // 2)


@njit(cache=True)
def block_sums(h, length, b):
    """For `length` decode steps from h held tokens: sum over steps i of the blocks held during
    step i (ceil((h + i + 1) / b)), and the same sum weighted by i."""
    q0 = h // b
    r0 = h - q0 * b
    d1 = p1(r0 + length, b) - p1(r0, b)
    d2 = p2(r0 + length, b) - p2(r0, b)
    return length * (q0 + 1) + d1, (q0 + 1) * s1(length) + d2 - r0 * d1


# -- step time -----------------------------------------------------------------------------------


@njit(cache=True)
def step_dt(cf, kv_read, tokens):
    if cf[C_TIMED] == 0:
        return 1
    memory = cf[C_W] + cf[C_KV] * kv_read
    compute = cf[C_FLOP] * tokens
    return cf[C_OVH] + (memory if memory > compute else compute)


@njit(cache=True)
def jump_params(cf, h0, n):
    """Decode steps j = 0, 1, ... of n requests holding h0 tokens: dt_j = flat for j < jstar,
    then base + slope * j (the KV read grows by n tokens a step)."""
    if cf[C_TIMED] == 0:
        return 1, 0, 0, INF
    memory = cf[C_W] + cf[C_KV] * h0
    compute = cf[C_FLOP] * n
    slope = cf[C_KV] * n
    if memory >= compute:
        jstar = 0
    elif slope == 0:
        jstar = INF
    else:
        jstar = cdiv(compute - memory, slope)
    return cf[C_OVH] + compute, cf[C_OVH] + memory, slope, jstar


@njit(cache=True)
def cum(j, flat, base, slope, jstar):
    """Ticks taken by the first j steps of a jump."""
    total = (j if j < jstar else jstar) * flat
    if j > jstar:
        total += (j - jstar) * base + slope * (s1(j) - s1(jstar))
    return total


# -- queues --------------------------------------------------------------------------------------


@njit(cache=True)
def arrived_by(st, rq, x):
    """Index of the first loaded request (from the fresh pointer on) arriving after tick x."""
    lo, hi = st[S_FRESH], st[S_NLOAD]
    while lo < hi:
        mid = (lo + hi) // 2
        if rq[mid, ARR] <= x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def waiting_head(st, rq, qbuf):
    """The request at the front of the waiting queue (requeued first, then arrivals), or -1."""
    if st[S_QL] > 0:
        return qbuf[st[S_QH]]
    f = st[S_FRESH]
    if f < st[S_NLOAD] and rq[f, ARR] <= st[S_T]:
        return f
    return -1


@njit(cache=True)
def pop_head(cf, st):
    if st[S_QL] > 0:
        st[S_QH] = (st[S_QH] + 1) % cf[C_QCAP]
        st[S_QL] -= 1
    else:
        st[S_FRESH] += 1


@njit(cache=True)
def waiting_count(st, rq, when):
    return st[S_QL] + st[S_WL] + arrived_by(st, rq, when) - st[S_FRESH]


# -- contiguous free runs (first fit, coalesced, sorted by start) --------------------------------


@njit(cache=True)
def first_fit(st, frs, frl, need):
    nfr = st[S_NFR]
    for j in range(nfr):
        if frl[j] >= need:
            start = frs[j]
            if frl[j] == need:
                for m in range(j, nfr - 1):
                    frs[m], frl[m] = frs[m + 1], frl[m + 1]
                st[S_NFR] = nfr - 1
            else:
                frs[j] += need
                frl[j] -= need
            return start
    return -1


@njit(cache=True)
def free_run(st, frs, frl, start, length):
    nfr = st[S_NFR]
    i = 0
    while i < nfr and frs[i] < start:
        i += 1
    after = i < nfr and start + length == frs[i]
    before = i > 0 and frs[i - 1] + frl[i - 1] == start
    if before and after:
        frl[i - 1] += length + frl[i]
        for m in range(i, nfr - 1):
            frs[m], frl[m] = frs[m + 1], frl[m + 1]
        st[S_NFR] = nfr - 1
    elif before:
        frl[i - 1] += length
    elif after:
        frs[i] = start
        frl[i] += length
    else:
        for m in range(nfr, i, -1):
            frs[m], frl[m] = frs[m - 1], frl[m - 1]
        frs[i], frl[i] = start, length
        st[S_NFR] = nfr + 1


@njit(cache=True)
def largest_run(st, frl):
    best = 0
    for j in range(st[S_NFR]):
        best = max(best, frl[j])
    return best


@njit(cache=True)
def external(cf, st, rq, qbuf, frl):
    """Paged: the tail slots. Contiguous: free runs too short for the waiting head, when the free
    slots in total would hold it (else a plain shortage: 0)."""
    if cf[C_PAGED] != 0:
        return cf[C_TAIL]
    head = waiting_head(st, rq, qbuf)
    if head < 0:
        return 0
    need = rq[head, RSV]
    total = 0
    short = 0
    for j in range(st[S_NFR]):
        total += frl[j]
        if frl[j] < need:
            short += frl[j]
    return short if total >= need else 0


# -- per-request rules (the reference's Req methods) ---------------------------------------------


@njit(cache=True)
def tokens_for(cf, rq, rid, budget):
    held, tgt = rq[rid, HELD], rq[rid, TGT]
    if held >= tgt:
        return 1 if budget >= 1 else 0
    rest = tgt - held
    if cf[C_CHUNK] != 0:
        return rest if rest < budget else budget
    return rest if rest <= budget else 0


@njit(cache=True)
def held_after(rq, rid, n):
    held, tgt = rq[rid, HELD], rq[rid, TGT]
    if held < tgt and held + n == tgt:
        return held + n + 1
    return held + n


@njit(cache=True)
def release(cf, st, rq, frs, frl, rid):
    if cf[C_PAGED] != 0:
        st[S_FREE] += rq[rid, NBLK]
    else:
        free_run(st, frs, frl, rq[rid, NBLK], rq[rid, RSV])


# -- timeline --------------------------------------------------------------------------------------


@njit(cache=True)
def tl_next(st):
    return st[S_ORIGIN] + st[S_TLK] * st[S_TLD]


@njit(cache=True)
def tl_record(cf, st, tl, when, n, waiting, tokens, reserved, internal, ext, free):
    """Append one sample; on a full buffer keep every other sample and double the spacing."""
    i = st[S_TLN]
    tl[i, 0], tl[i, 1], tl[i, 2], tl[i, 3] = when, n, waiting, tokens
    tl[i, 4], tl[i, 5], tl[i, 6], tl[i, 7] = reserved, internal, ext, free
    st[S_TLN] = i + 1
    st[S_TLK] += 1
    if st[S_TLN] == cf[C_TLMAX]:
        half = cf[C_TLMAX] // 2
        for j in range(half):
            for c in range(8):
                tl[j, c] = tl[2 * j, c]
        st[S_TLN] = half
        st[S_TLD] *= 2
        st[S_TLK] = half


@njit(cache=True)
def parts(cf, tokens, alloc, final, ext):
    """(reserved, internal, free) from tokens, allocated, final lengths and external slots."""
    if cf[C_PAGED] != 0:
        return 0, alloc - tokens, cf[C_SLOTS] - alloc - ext
    return final - tokens, alloc - final, cf[C_SLOTS] - alloc - ext


@njit(cache=True)
def account(cf, st, rq, acc, tl, dt, n, waiting, tokens, alloc, final, ext):
    """Integrals and timeline samples of one step (or idle gap) whose state is constant."""
    mac(acc, A_TIME, ONE, dt)
    mac(acc, A_RUN, n, dt)
    mac(acc, A_TOK, tokens, dt)
    mac(acc, A_ALLOC, alloc, dt)
    mac(acc, A_FINAL, final, dt)
    mac(acc, A_EXT, ext, dt)
    reserved, internal, free = parts(cf, tokens, alloc, final, ext)
    end = st[S_T] + dt
    while tl_next(st) < end:
        tl_record(cf, st, tl, tl_next(st), n, waiting, tokens, reserved, internal, ext, free)


@njit(cache=True)
def idle_until(cf, st, rq, acc, tl, until):
    account(cf, st, rq, acc, tl, until - st[S_T], ZERO, ZERO, ZERO, ZERO, ZERO, cf[C_TAIL])
    st[S_T] = until


# -- one full step (the reference's phases 1 to 3) -----------------------------------------------


@njit(cache=True)
def preempt(cf, st, rq, qbuf, wbuf, v):
    st[S_FREE] += rq[v, NBLK]
    rq[v, NPRE] += 1
    st[S_PRE] += 1
    size = rq[v, NBLK] * cf[C_B]
    if cf[C_SWAP] != 0 and st[S_CPU] + size <= cf[C_SWSLOTS]:
        st[S_CPU] += size
        st[S_SWO] += 1
        if st[S_WL] == cf[C_QCAP]:
            raise RuntimeError("swapped queue overflow")
        wbuf[(st[S_WH] + st[S_WL]) % cf[C_QCAP]] = v
        st[S_WL] += 1
        return
    st[S_RECOMP] += rq[v, HELD]
    rq[v, HELD] = 0
    rq[v, NBLK] = 0
    rq[v, TGT] = rq[v, PRM] + rq[v, GEN]
    if st[S_QL] == cf[C_QCAP]:
        raise RuntimeError("requeue overflow")
    st[S_QH] = (st[S_QH] - 1) % cf[C_QCAP]
    qbuf[st[S_QH]] = v
    st[S_QL] += 1


@njit(cache=True)
def schedule_running(cf, st, rq, runq, work, qbuf, wbuf):
    budget = cf[C_TOK]
    preempted = False
    i = 0
    while i < st[S_NRUN]:
        rid = runq[i]
        n = tokens_for(cf, rq, rid, budget)
        work[i] = 0
        if n == 0:
            i += 1
            continue
        need = cdiv(held_after(rq, rid, n), cf[C_B]) - rq[rid, NBLK] if cf[C_PAGED] != 0 else 0
        scheduled = True
        while need > st[S_FREE]:
            st[S_NRUN] -= 1
            victim = runq[st[S_NRUN]]
            preempt(cf, st, rq, qbuf, wbuf, victim)
            preempted = True
            if victim == rid:
                scheduled = False
                break
        if scheduled:
            st[S_FREE] -= need
            rq[rid, NBLK] += need
            work[i] = n
            budget -= n
            i += 1
    return budget, preempted


@njit(cache=True)
def start_running(st, rq, runq, work, rid, n):
    pos = st[S_NRUN]
    runq[pos] = rid
    work[pos] = n
    st[S_NRUN] = pos + 1


@njit(cache=True)
def resume_swapped(cf, st, rq, runq, work, wbuf, budget):
    while st[S_WL] > 0 and st[S_NRUN] < cf[C_SEQS]:
        rid = wbuf[st[S_WH]]
        n = tokens_for(cf, rq, rid, budget)
        need = cdiv(held_after(rq, rid, n), cf[C_B])
        if n == 0 or need > st[S_FREE]:
            break
        st[S_WH] = (st[S_WH] + 1) % cf[C_QCAP]
        st[S_WL] -= 1
        st[S_CPU] -= rq[rid, NBLK] * cf[C_B]
        st[S_FREE] -= need
        rq[rid, NBLK] = need
        start_running(st, rq, runq, work, rid, n)
        budget -= n
    return budget


@njit(cache=True)
def admit(cf, st, rq, runq, work, qbuf, frs, frl, budget):
    while st[S_NRUN] < cf[C_SEQS]:
        rid = waiting_head(st, rq, qbuf)
        if rid < 0:
            break
        n = tokens_for(cf, rq, rid, budget)
        if n == 0:
            break
        if cf[C_PAGED] != 0:
            need = cdiv(held_after(rq, rid, n), cf[C_B])
            if need > st[S_FREE]:
                break
            st[S_FREE] -= need
            rq[rid, NBLK] = need
        else:
            start = first_fit(st, frs, frl, rq[rid, RSV])
            if start < 0:
                break
            rq[rid, NBLK] = start
        pop_head(cf, st)
        if rq[rid, ADM] < 0:
            rq[rid, ADM] = st[S_T]
        start_running(st, rq, runq, work, rid, n)
        budget -= n


@njit(cache=True)
def batch_sums(cf, rq, runq, work, n):
    """Of the scheduled batch: KV read, tokens processed, tokens held after, allocated, final."""
    kv = 0
    processed = 0
    tokens = 0
    alloc = 0
    final = 0
    for i in range(n):
        rid = runq[i]
        if work[i] > 0:
            kv += rq[rid, HELD]
            processed += work[i]
            tokens += held_after(rq, rid, work[i])
        else:
            tokens += rq[rid, HELD]
        if cf[C_PAGED] != 0:
            alloc += rq[rid, NBLK] * cf[C_B]
        else:
            alloc += rq[rid, RSV]
            final += rq[rid, PRM] + rq[rid, OUT]
    return kv, processed, tokens, alloc, final


@njit(cache=True)
def run_step(cf, st, rq, runq, work, qbuf, frs, frl, tl, acc):
    """Phase 3: time the step, account for it, apply its tokens, finish requests."""
    n = st[S_NRUN]
    kv, processed, tokens, alloc, final = batch_sums(cf, rq, runq, work, n)
    dt = step_dt(cf, kv, processed)
    ext = external(cf, st, rq, qbuf, frl)
    account(cf, st, rq, acc, tl, dt, n, waiting_count(st, rq, st[S_T]), tokens, alloc, final, ext)
    st[S_PEAK] = max(st[S_PEAK], n)
    end = st[S_T] + dt
    kept = 0
    for i in range(n):
        rid = runq[i]
        if work[i] > 0:
            rq[rid, HELD] = held_after(rq, rid, work[i])
            if rq[rid, HELD] > rq[rid, TGT]:
                rq[rid, GEN] += 1
                if rq[rid, GEN] == 1:
                    rq[rid, FTOK] = end
                if rq[rid, GEN] == rq[rid, OUT]:
                    rq[rid, FIN] = end
                    release(cf, st, rq, frs, frl, rid)
                    st[S_DONE] += 1
                    continue
        runq[kept] = rid
        kept += 1
    st[S_NRUN] = kept
    st[S_T] = end
    st[S_STEPS] += 1


@njit(cache=True)
def do_step(cf, st, rq, runq, work, qbuf, wbuf, frs, frl, tl, acc):
    budget, preempted = schedule_running(cf, st, rq, runq, work, qbuf, wbuf)
    if not preempted:
        budget = resume_swapped(cf, st, rq, runq, work, wbuf, budget)
        if st[S_WL] == 0:
            admit(cf, st, rq, runq, work, qbuf, frs, frl, budget)
    run_step(cf, st, rq, runq, work, qbuf, frs, frl, tl, acc)


# -- jumps over decode-only stretches ------------------------------------------------------------


@njit(cache=True)
def demand(cf, rq, runq, n, k):
    """Blocks the running batch takes in its next k decode steps."""
    total = 0
    for i in range(n):
        rid = runq[i]
        total += cdiv(rq[rid, HELD] + k, cf[C_B]) - rq[rid, NBLK]
    return total


@njit(cache=True)
def fit_steps(cf, rq, runq, n, k, free):
    """The most decode steps (at most k) whose blocks fit in `free`."""
    if demand(cf, rq, runq, n, k) <= free:
        return k
    lo, hi = 0, k
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if demand(cf, rq, runq, n, mid) <= free:
            lo = mid
        else:
            hi = mid
    return lo


@njit(cache=True)
def can_admit(cf, st, rq, qbuf, wbuf, frl, free, budget):
    """Whether the admission phase would start anything, given the free blocks after phase 1."""
    if st[S_NRUN] >= cf[C_SEQS]:
        return False
    rid = wbuf[st[S_WH]] if st[S_WL] > 0 else waiting_head(st, rq, qbuf)
    if rid < 0:
        return False
    n = tokens_for(cf, rq, rid, budget)
    if n == 0:
        return False
    if cf[C_PAGED] != 0:
        return cdiv(held_after(rq, rid, n), cf[C_B]) <= free
    return largest_run(st, frl) >= rq[rid, RSV]


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
def piece(cf, rq, runq, acc, n, h0, j0, j1, d, e, alloc, final, ext):
    """Integrals of jump steps j0..j1-1, whose durations are d + e * (j - j0)."""
    length = j1 - j0
    sumdt = length * d + e * s1(length)
    mac(acc, A_TIME, ONE, sumdt)
    mac(acc, A_RUN, n, sumdt)
    a = h0 + n * (j0 + 1)  # tokens held during step j0
    mac(acc, A_TOK, d, length * a + n * s1(length))
    mac(acc, A_TOK, e, a * s1(length) + n * s2(length))
    if cf[C_PAGED] != 0:
        sb = 0
        sjb = 0
        for i in range(n):
            if length == 1:  # the common short jump: one step, one division
                sb += cdiv(rq[runq[i], HELD] + j0 + 1, cf[C_B])
            else:
                x, y = block_sums(rq[runq[i], HELD] + j0, length, cf[C_B])
                sb += x
                sjb += y
        mac(acc, A_ALLOC, d, cf[C_B] * sb)
        mac(acc, A_ALLOC, e, cf[C_B] * sjb)
    else:
        mac(acc, A_ALLOC, alloc, sumdt)
        mac(acc, A_FINAL, final, sumdt)
    mac(acc, A_EXT, ext, sumdt)


@njit(cache=True)
def jump_samples(cf, st, rq, runq, tl, k, n, h0, tp, alloc, final, ext):
    """Timeline samples falling inside the jump: each takes the state of its step."""
    flat, base, slope, jstar = tp
    t = st[S_T]
    end = t + cum(k, flat, base, slope, jstar)
    while tl_next(st) < end:
        when = tl_next(st)
        # the last step starting at or before `when`
        j = steps_before(when - t + 1, k, flat, base, slope, jstar) - 1
        tokens = h0 + n * (j + 1)
        if cf[C_PAGED] != 0:
            alloc = 0
            for i in range(n):
                alloc += cdiv(rq[runq[i], HELD] + j + 1, cf[C_B]) * cf[C_B]
        reserved, internal, free = parts(cf, tokens, alloc, final, ext)
        waiting = waiting_count(st, rq, t + cum(j, flat, base, slope, jstar))
        tl_record(cf, st, tl, when, n, waiting, tokens, reserved, internal, ext, free)


@njit(cache=True)
def do_jump(cf, st, rq, runq, qbuf, frs, frl, tl, acc, k, n, h0):
    tp = jump_params(cf, h0, n)
    flat, base, slope, jstar = tp
    alloc = 0
    final = 0
    if cf[C_PAGED] == 0:
        for i in range(n):
            alloc += rq[runq[i], RSV]
            final += rq[runq[i], PRM] + rq[runq[i], OUT]
    ext = external(cf, st, rq, qbuf, frl)
    split = min(jstar, k)
    if split > 0:
        piece(cf, rq, runq, acc, n, h0, ZERO, split, flat, ZERO, alloc, final, ext)
    if split < k:
        piece(cf, rq, runq, acc, n, h0, split, k, base + slope * split, slope, alloc, final, ext)
    jump_samples(cf, st, rq, runq, tl, k, n, h0, tp, alloc, final, ext)
    end = st[S_T] + cum(k, flat, base, slope, jstar)
    kept = 0
    for i in range(n):
        rid = runq[i]
        rq[rid, HELD] += k
        rq[rid, GEN] += k
        if cf[C_PAGED] != 0:
            blocks = cdiv(rq[rid, HELD], cf[C_B])
            st[S_FREE] -= blocks - rq[rid, NBLK]
            rq[rid, NBLK] = blocks
        if rq[rid, GEN] == rq[rid, OUT]:
            rq[rid, FIN] = end
            release(cf, st, rq, frs, frl, rid)
            st[S_DONE] += 1
        else:
            runq[kept] = rid
            kept += 1
    st[S_NRUN] = kept
    st[S_PEAK] = max(st[S_PEAK], n)
    st[S_STEPS] += k
    st[S_T] = end


@njit(cache=True)
def try_jump(cf, st, rq, runq, qbuf, wbuf, frs, frl, tl, acc):
    """Jump over the decode-only steps before the next event; False when this step is an event."""
    n = st[S_NRUN]
    if n == 0 or n > cf[C_TOK]:
        return False
    k = KCAP
    h0 = 0
    first = 0  # blocks the first step takes
    paged = cf[C_PAGED] != 0
    for i in range(n):
        rid = runq[i]
        held = rq[rid, HELD]
        if held < rq[rid, TGT]:
            return False
        k = min(k, rq[rid, OUT] - rq[rid, GEN])
        h0 += held
        if paged:
            first += cdiv(held + 1, cf[C_B]) - rq[rid, NBLK]
    if can_admit(cf, st, rq, qbuf, wbuf, frl, st[S_FREE] - first, cf[C_TOK] - n):
        return False
    if paged:
        k = fit_steps(cf, rq, runq, n, k, st[S_FREE])
        if k == 0:
            return False
    stop = INF
    fresh = st[S_FRESH]
    if st[S_QL] == 0 and st[S_WL] == 0 and fresh < st[S_NLOAD] and rq[fresh, ARR] > st[S_T]:
        stop = rq[fresh, ARR]  # the queue is empty and this arrival could be admitted
    if st[S_FINAL] == 0:
        stop = min(stop, rq[st[S_NLOAD] - 1, ARR])  # never step past what is loaded
    if stop < INF:
        flat, base, slope, jstar = jump_params(cf, h0, n)
        k = steps_before(stop - st[S_T], k, flat, base, slope, jstar)
    do_jump(cf, st, rq, runq, qbuf, frs, frl, tl, acc, k, n, h0)
    st[S_JUMPS] += 1
    return True


# -- the loop --------------------------------------------------------------------------------------


@njit(cache=True)
def run(cf, st, rq, runq, work, qbuf, wbuf, frs, frl, tl, acc, max_events):
    """Simulate until done (0), until more requests must be loaded (1), or for max_events (2)."""
    for _ in range(max_events):
        t = st[S_T]
        loaded = st[S_NLOAD]
        if st[S_FINAL] == 0 and t >= rq[loaded - 1, ARR]:
            return 1
        fresh = st[S_FRESH]
        arrived = fresh < loaded and rq[fresh, ARR] <= t
        if st[S_NRUN] == 0 and st[S_QL] == 0 and st[S_WL] == 0 and not arrived:
            if fresh >= loaded:
                return 0
            idle_until(cf, st, rq, acc, tl, rq[fresh, ARR])
        elif not try_jump(cf, st, rq, runq, qbuf, wbuf, frs, frl, tl, acc):
            do_step(cf, st, rq, runq, work, qbuf, wbuf, frs, frl, tl, acc)
        st[S_EVENTS] += 1
    return 2
