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
