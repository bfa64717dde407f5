"""SGLang's scheduler in kvplan's serving engine (`engine: sglang` in a serve workload).

The rules, each read from SGLang's source (sgl-project/sglang, python/sglang/srt/, the scheduler
of the v0.4/v0.5 releases: managers/scheduler.py get_next_batch_to_run, get_new_batch_prefill,
update_running_batch; managers/schedule_policy.py SchedulePolicy, PrefillAdder; managers/
schedule_batch.py check_decode_mem, retract_decode; mem_cache/radix_cache.py; environ.py and
server_args.py for the defaults). The reference (sglang_reference.py) writes them out step by
step; the fast kernel (kernel.py's sg_* functions) must agree with it to the byte.

The pool holds `slots` tokens, page size 1 (server_args page_size). A request holds the tokens
whose KV is computed; as in vLLM's engine, a request of P prompt and O output tokens ends holding
P + O - 1.

One scheduler iteration (get_next_batch_to_run), at time t:
0. Arrivals with arrival <= t join the back of the waiting queue.
1. A prefill batch is tried first (get_new_batch_prefill). None when the batch is marked full or
   nothing waits (and no request is mid-chunk), or when the running batch holds
   max_running_requests (which marks it full). The waiting queue is ordered by the policy
   (SchedulePolicy.calc_priority): lpm matches every waiting request against the radix tree and
   sorts by the tokens found, longest first (stable); a request that found <= 32 tokens and shares
   >= 32 tokens with one ahead of it in this pass (the in-batch prefix check, thresholds
   IN_BATCH_PREFIX_CACHING_CHECK/DEPRIORITIZE_THRESHOLD) goes last; lpm falls back to fcfs when
   more than 128 wait (_determine_active_policy), and is fcfs when the radix cache is off.
   PrefillAdder: rem_total = free + evictable - sum over the running batch of
   min(output - generated, 4096) x new_token_ratio (CLIP_MAX_NEW_TOKENS). The request mid-chunk
   goes first (add_chunked_req: min(chunk left, rem_total) tokens, reserving its output only with
   its last chunk). Then, in queue order, while running + batch < max_running_requests
   (add_one_req): match the tree (at most target - 1 tokens: one is always computed); with
   extend = target - match and total = extend + min(output - generated, 4096) (the output still
   to come: a retracted request reserves what it has left, as add_one_req's max_new does since
   it subtracts len(output_ids)): refused (NO_TOKEN) if
   total >= rem_total, or total > rem_total less the matched tokens nobody held (the prefix the
   request would lock leaves the evictable count); stopped (OTHER) if extend > max_prefill_tokens
   left and the batch is not empty; else admitted whole if extend fits the chunk budget left,
   else as the new chunked request for the budget left. Each admission charges rem_total with
   its total (the output part 0 for a chunk that is not the last) and the input and chunk budgets with the
   tokens it prefills; the loop goes on while rem_total > 0, the budgets > 0. NO_TOKEN marks the
   batch full. The batch allocates its tokens, evicting from the tree when the free pool is short.
2. Without a prefill batch the running batch decodes (update_running_batch): finished requests
   leave it (which unmarks the batch full); check_decode_mem wants one free token per request
   (evicting when short); if still short, retract_decode: requests in order of fewest output
   tokens, then longest prompt (the last of equals first), are retracted until the free pool
   holds 20 tokens per request left (SGLANG_RETRACT_DECODE_STEPS), keeping at least one; each
   drops its own KV, unlocks its prefix, goes to the back of the waiting queue and later
   prefills prompt + generated again; new_token_ratio becomes min(1, (tokens decoded + 20 x
   requests) / their outputs) of the requests left. Otherwise new_token_ratio decays by
   (init - min) / 600 to its floor min = init x 0.14, from init = min(0.7 x conservativeness, 1)
   (SGLANG_INIT_NEW_TOKEN_RATIO, SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR,
   SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS). An iteration that runs nothing resets it to init.
3. Prefill and decode never share a step (enable_mixed_chunk is off by default). A step's time is
   vLLM's step-time model (kvplan/sim/timing.py) of the tokens it processes; with a physical
   clock the constants are restated for SGLang where the workload is built
   (step_time.engine_constants). After a prefill step the requests that finished their prefill
   join the running batch; one that reached its output length finishes and frees its memory.

Speculative decoding (`speculative:` eagle, eagle3 or mtp; SGLang's EAGLE worker, NEXTN being
EAGLE there): a chain of k = speculative_num_steps drafts (speculative_eagle_topk 1,
speculative_num_draft_tokens k + 1; SGLang's trees of topk > 1 and its n-gram worker are not
modelled). The rules that change (v0.4.9-v0.5 source: scheduler.py decode_mem_cache_buf_multiplier,
schedule_batch.py check_decode_mem and retract_decode, speculative/eagle_worker.py):
- check_decode_mem wants num_draft_tokens + topk x num_steps = 2k + 1 free tokens per request, not 1
  (the draft's k slots and the verify's k + 1, allocated within the step, the rejected ones freed);
- retract_decode keeps the batch's order ("For spec decoding, filter_batch API can only filter
  requests from the back"): the last request goes first, until the free pool holds
  RETRACT_DECODE_STEPS + 2k + 1 tokens per request left (its eviction inside the loop still asks
  for RETRACT_DECODE_STEPS per request);
- a decode step verifies k + 1 tokens a request and keeps 1 + a of them, a the drafts accepted
  (drawn as vLLM's engine draws them: kvplan/sim/speculative.py; at most what the output has left
  after the step's own token), so the request holds and has generated 1 + a more; the request's
  first decode step carries drafts (the draft extend after its prefill proposes them);
- a step's time (speculative.SpecSetup.sglang_step_ticks): the target's forward, the verified
  drafts' lm_head, the draft's extend pass over the step's tokens (after every prefill step too:
  the draft fills its KV for the prompt), and in a decode step k - 1 draft passes of one token a
  request (SGLang captures them in one CUDA graph: no proposer time per pass).
- the overlap scheduler is off (server_args.py `_handle_speculative_decoding`: disable_overlap_schedule
  for EAGLE, EAGLE3 and STANDALONE unless SGLANG_ENABLE_SPEC_V2, an opt-in through 2026-04:
  sgl-project/sgl-cookbook#240 still prepends SGLANG_ENABLE_SPEC_V2=1; sgl-project/sglang#27964 of
  2026-06-11 retires spec v1 with v2 "enabled by default"), so the engine's host time a step adds
  to the GPU's instead of hiding behind it (the step model's async_scheduling off, where the
  workload is built). Releases after the flip overlap again: not modelled.
SGLang's start-up with speculation (max_running_requests 48, the pool's headroom, 2 GiB more
reserved) is kvplan/model/sglang_memory.py's rule 4. PrefillAdder has no speculative term, so
admission is unchanged.

RadixAttention (mem_cache/radix_cache.py, page size 1): requests' prompts are known by their
prefix hash blocks (kvplan/sim/prefix_ids.py's trie of H-token blocks, H the trace's or the
prefix section's hash block); a trie node is H tokens of the tree. A match is token-granular: the
cached nodes from the root, at most target - 1 tokens (so the last node may be used in part, the
tokens after the cut recomputed and freed again at insertion). A request locks its matched path at
admission (inc_lock_ref); after each prefill step its computed identity blocks are inserted
(cache_unfinished_req; a block another request inserted first is freed as a duplicate) and
locked; a finished request is inserted and unlocked (cache_finished_req), a retracted one only
unlocked. Every match and insertion touches the nodes of the path (last_access_time). Eviction
(evict(n), when the free pool is short of n) takes unlocked leaves least recently used first
until n tokens are free, a parent left childless becoming a leaf. Simplification: the tokens of a
request past its identity blocks (the prompt's tail, the output) are freed when it finishes,
where SGLang keeps them as an evictable leaf under its path (they would be evicted first of that
path); admission counts free + evictable alike, so only which other prefixes survive differs.
Not modelled: the overlap scheduler's one-step lag (its host time is in the step-time model),
the ignore_eos admission path (taken only with the radix cache off), priority scheduling,
hierarchical cache.
"""

from __future__ import annotations

from kvplan.errors import WorkloadError

LPM_QUEUE_LIMIT = 128  # SchedulePolicy._determine_active_policy: lpm -> fcfs above this queue length
IN_BATCH_CHECK = 32  # IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD
IN_BATCH_DEPRIORITIZE = 32  # IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD
CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
INIT_NEW_TOKEN_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
NEW_TOKEN_RATIO_DECAY_STEPS = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS (global_config.retract_decode_steps)


def new_token_ratios(conservativeness: float) -> tuple[float, float, float]:
    """(init, min, decay per decode step) of new_token_ratio, as the Scheduler computes them."""
    init = min(INIT_NEW_TOKEN_RATIO * conservativeness, 1.0)
    low = min(init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
    return init, low, (init - low) / NEW_TOKEN_RATIO_DECAY_STEPS


def stalled_sglang() -> WorkloadError:
    """A run SGLang's scheduler could not go on with (requests wait and nothing can free memory)."""
    return WorkloadError("SGLang's scheduler could not go on: requests wait and the pool can never hold "
                         "them", field="pool")


def simulate_sglang(workload, setup, cfg, slo, *, progress=None, record_requests: bool = False,
                    events_per_call: int = 200_000):
    """Replay the workload through SGLang's scheduler with the compiled kernel (kernel.py's sg_run):
    the same result as sglang_reference.simulate_sglang_reference, to the byte. engine.simulate
    calls it with the run's setup (sglang set), the kernel's settings (`cfg`, engine._config) and
    the workload's SLO."""
    import numpy as np

    from kvplan.memory.prefix_cache import PrefixCacheStats
    from kvplan.sim import kernel as K
    from kvplan.sim.inputs import prepared_chunks
    from kvplan.sim.metrics import INTEGRALS, RawRun, build_result
    from kvplan.sim.sampling import initial_delta

    points = int(cfg[K.MAX_SAMPLES])
    g = setup.sglang
    chunks = list(prepared_chunks(workload, setup))
    n = sum(len(c) for c in chunks)
    sr = np.zeros((n, K.NUM_S), dtype=np.int64)
    paths, counts, per, at = [], [], 1, 0
    for c in chunks:
        rows = sr[at:at + len(c)]
        rows[:, K.S_ARRIVAL], rows[:, K.S_PROMPT], rows[:, K.S_OUTPUT] = c.arrival, c.prompt, c.output
        if c.ids is not None:
            per = c.ids.per
            paths.append(c.ids.nodes)
            counts.append(c.ids.counts)
        else:
            counts.append(np.zeros(len(c), dtype=np.int64))
        at += len(c)
    sr[:, K.S_TARGET] = sr[:, K.S_PROMPT]
    sr[:, K.S_ADMITTED:K.S_FINISH + 1] = -1
    ids = np.concatenate(paths).astype(np.int64) if paths else np.zeros(0, dtype=np.int64)
    count = np.concatenate(counts).astype(np.int64) if counts else np.zeros(0, dtype=np.int64)
    sr[:, K.S_ID_COUNT] = count
    sr[:, K.S_ID_START] = np.concatenate(([0], np.cumsum(count)[:-1])) if n else 0
    num_nodes = int(ids.max()) + 1 if len(ids) else 1
    nd = np.zeros((num_nodes, K.NUM_N), dtype=np.int64)
    nd[:, K.N_PARENT] = nd[:, K.N_PREV] = nd[:, K.N_NEXT] = -1
    if len(ids):
        first = np.zeros(len(ids), dtype=bool)
        first[sr[count > 0, K.S_ID_START]] = True
        inner = np.flatnonzero(~first)
        nd[ids[inner], K.N_PARENT] = ids[inner - 1]
    ids = ids if len(ids) else np.zeros(1, dtype=np.int64)

    st = np.zeros(K.NUM_SCALARS, dtype=np.int64)
    st[K.FREE_BLOCKS] = setup.slots
    st[K.SAMPLE_EVERY] = initial_delta(setup.clock)
    st[K.LOADED] = n
    if n:
        st[K.NOW] = st[K.ORIGIN] = sr[0, K.S_ARRIVAL]
    init, low, decay = new_token_ratios(g.schedule_conservativeness)
    gf = np.array([init, low, decay, init, 0.0], dtype=np.float64)
    gcfg = np.zeros(K.NUM_G, dtype=np.int64)
    gcfg[K.G_LPM] = int(g.schedule_policy == "lpm" and g.radix_cache)
    gcfg[K.G_RADIX] = int(g.radix_cache)
    gcfg[K.G_MAX_RUNNING] = g.max_running_requests
    gcfg[K.G_CHUNK] = g.chunked_prefill_size
    gcfg[K.G_MAX_PREFILL] = g.max_prefill_tokens
    gcfg[K.G_H] = per
    gcfg[K.G_NUM_REQS] = n
    gst = np.zeros(K.NUM_GS, dtype=np.int64)
    gst[K.GS_CHUNKED] = gst[K.GS_LRU_HEAD] = gst[K.GS_LRU_TAIL] = -1
    cap = g.max_running_requests + 2
    wq = np.zeros(max(n, 1), dtype=np.int64)
    rq, bt, bn, order = (np.zeros(cap, dtype=np.int64) for _ in range(4))
    timeline = np.zeros((points, 8), dtype=np.int64)
    acc = np.zeros((K.NUM_INTEGRALS, 4), dtype=np.int64)
    while n:
        code = K.sg_run(cfg, gcfg, st, gst, gf, sr, ids, nd, wq, rq, bt, bn, order, timeline, acc, events_per_call)
        if progress is not None:
            progress(int(st[K.DONE]), n)
        if code == 3:
            raise WorkloadError("the simulated time passed 2^62 ticks (53 days at the picosecond ticks of a "
                                "timed run): arrivals or steps too far apart", field="timing")
        if code == 4:
            raise stalled_sglang()
        if code == 0:
            break
    sums = [sum(int(limb) << (31 * i) for i, limb in enumerate(acc[row])) for row in range(K.NUM_INTEGRALS)]
    sent = [c.sent for c in chunks if c.sent is not None]

    def col(field):
        return sr[:, field].copy()

    raw = RawRun(
        arrival=col(K.S_ARRIVAL), admitted=col(K.S_ADMITTED), first_token=col(K.S_FIRST), finish=col(K.S_FINISH),
        prompt=col(K.S_PROMPT), output=col(K.S_OUTPUT), preemptions=col(K.S_PREEMPTED),
        clipped=sum(c.clipped for c in chunks), steps=int(st[K.STEPS]), preemptions_total=int(st[K.PREEMPTIONS]),
        swap_outs=0, recomputed_tokens=int(st[K.RECOMPUTED]), peak_running=int(st[K.PEAK_RUNNING]),
        t_origin=int(st[K.ORIGIN]), t_end=int(st[K.NOW]), integrals=dict(zip(INTEGRALS, sums)),
        timeline=timeline[:int(st[K.SAMPLES])].copy(), timeline_delta=int(st[K.SAMPLE_EVERY]),
        sent=np.concatenate(sent) if sent else None,
        prefix=PrefixCacheStats(*(int(st[k]) for k in (K.PC_LOOKUPS, K.PC_QUERY_TOKENS, K.PC_HIT_TOKENS,
                                                       K.PC_PREFILL_SAVED, K.PC_BLOCKS_EVICTED, K.PC_BLOCKS_REUSED)))
        if g.radix_cache else None,
        hit_tokens=col(K.S_HIT) if g.radix_cache else None,
    )  # fmt: skip
    return build_result(raw, setup, record_requests=record_requests, slo=slo)
