"""Speculative decoding in the serve engine (kvplan/model/speculative.py has vLLM's rules).

A decoding request is scheduled 1 + k tokens a step (fewer when the token budget runs out: the
drafts beyond it are dropped, as vLLM's scheduler trims spec_token_ids), its blocks cover those
plus the drafter's lookahead slots, and after the step it holds and has generated 1 + a more
tokens, a the drafts accepted (at most its output length). A request's first decode step already
carries drafts (vLLM's drafter proposes after the prefill's last chunk too). With an EAGLE-style
drafter a prefix-cache hit gives up its last block (vLLM's KVCacheManager(use_eagle=True):
find_longest_cache_hit pops the last matched block, whose hidden states the drafter needs).

How many drafts a step accepts is drawn, deterministically: u = the top 32 bits of splitmix64
over (seed, request id, tokens generated so far), and a = the number of leading positions i
(below the drafts scheduled) with u < threshold[i] = round(acceptance[i] x 2^32). The thresholds
never rise, so P(a >= i + 1) = acceptance[i], as vLLM's per-position metric means it. The draw
depends only on the request and its progress, not on the batch or the order of the run, so the
fast kernel (kvplan/sim/kernel.py, spec_draw) and the reference (this module's `draw`) agree by
construction; a test checks the two functions bit for bit.

Time: the target's step of the scheduled tokens (the clock's), plus the target's lm_head on each
draft position, plus the drafter's passes: one over every scheduled token, then k - 1 over one
token per decoding request (kvplan/model/speculative.Draft), tabulated in integer ticks like the
clock's linear layers. A pass's fixed and linear ticks are at least the proposer's time per pass
(Draft.pass_host_s, DRAFT_PASS_HOST_S): the floor is folded into the draft's linear table
(entries of 1 token and more), so the kernel's spec_pass_ticks and SpecSetup.pass_ticks read the
same numbers. Without the physical step model (steps as units, or the roofline) only the tokens
change.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.sim.timing import TABLE_LIMIT, StepClock, _ticks, table_ticks

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
ONE32 = 1 << 32


def draw(seed: int, rid: int, generated: int) -> int:
    """32 uniform bits for request `rid` after `generated` tokens (splitmix64's finalizer)."""
    x = (seed * GOLDEN + rid * MIX1 + generated) & MASK
    x ^= x >> 30
    x = (x * MIX1) & MASK
    x ^= x >> 27
    x = (x * MIX2) & MASK
    x ^= x >> 31
    return x >> 32


@dataclass(frozen=True, slots=True)
class SpecSetup:
    """The integer settings of a speculative serve run."""

    k: int
    lookahead: int
    seed: int
    thresholds: tuple[int, ...]  # per draft position, out of 2^32
    verify: int = 0  # ticks of the target's lm_head on one draft position
    overhead: int = 0  # ticks of a draft pass whatever its tokens
    per_request: int = 0  # ticks of a draft pass per request (its lm_head)
    kv_per_token: int = 0  # ticks of the draft layers reading one token of KV
    attention_per_pair: int = 0  # ticks of the draft layers' prefill attention per pair
    linear: tuple[int, ...] = (0,)  # ticks of a draft pass's linear layers for 0, 1, ... tokens
    linear_slope: int = 0
    max_model_len: int = 1 << 62  # caps a step's drafts and the lookahead slots (vLLM's scheduler)

    def tokens(self, held: int, budget: int) -> int:
        """Tokens a decoding request holding `held` is scheduled within `budget` (>= 1): its last
        token and k drafts, cut to max_model_len - 1 - held (at least 1) and to the budget."""
        return min(max(min(1 + self.k, self.max_model_len - 1 - held), 1), budget)

    def slots(self, held: int) -> int:
        """Slots a running request holding `held` after its step allocates (with the lookahead)."""
        return max(held, min(held + self.lookahead, self.max_model_len)) if self.lookahead else held

    def accepted(self, rid: int, generated: int, drafts: int) -> int:
        u = draw(self.seed, rid, generated)
        a = 0
        while a < drafts and u < self.thresholds[a]:
            a += 1
        return a

    def pass_ticks(self, tokens: int, requests: int, kv_read: int, pairs: int) -> int:
        if tokens <= 0 or self.overhead == 0:
            return 0
        return (self.overhead + self.per_request * requests + table_ticks(self.linear, self.linear_slope, tokens)
                + self.kv_per_token * kv_read + self.attention_per_pair * pairs)

    def step_ticks(self, clock: StepClock, kv_read: int, tokens: int, requests: int, pairs: int,
                   decoders: int, drafts: int, kv_decoders: int, extra_gpu: int = 0) -> int:
        """The step's ticks with the drafts verified and the drafter's passes (the physical clock's
        GPU work; steps as units or the roofline take none), and `extra_gpu` ticks of other GPU
        work (a DP rank's share of the MoE layers)."""
        extra = self.verify * drafts + extra_gpu
        if decoders > 0:
            extra += (self.pass_ticks(tokens, requests, kv_read, pairs)
                      + (self.k - 1) * self.pass_ticks(decoders, decoders, kv_decoders, 0))
        return clock.step_ticks(kv_read, tokens, requests, pairs, extra)

    def sglang_step_ticks(self, clock: StepClock, kv_read: int, tokens: int, requests: int, pairs: int,
                          decoders: int, kv_decoders: int) -> int:
        """A step of SGLang's EAGLE worker (kvplan/sim/sglang.py): step_ticks with `decoders`
        requests verifying k drafts each, and the draft's extend pass over a prefill step's tokens
        too (vLLM's drafter runs only beside decoding requests)."""
        extend = self.pass_ticks(tokens, requests, kv_read, pairs) if decoders == 0 else 0
        return self.step_ticks(clock, kv_read, tokens, requests, pairs, decoders, self.k * decoders, kv_decoders,
                               extra_gpu=extend)


def spec_setup(run, clock: StepClock, seed: int, token_budget: int, max_model_len: int = 1 << 62) -> SpecSetup:
    """The integer settings of `run` (a kvplan.workload.records.SpeculativeRun) for `clock`."""
    sp = run.setting
    thresholds = tuple(min(int(round(r * ONE32)), ONE32) for r in sp.acceptance)
    base = dict(k=sp.k, lookahead=sp.lookahead, seed=int(seed), thresholds=thresholds,
                max_model_len=int(max_model_len))
    draft = run.draft
    if draft is None or not clock.timed or not clock.physical:
        return SpecSetup(**base)
    if draft.model is None:  # n-gram: the host proposes, the GPU only verifies
        return SpecSetup(**base, verify=_ticks(draft.verify_lm_head_s))
    m = draft.model
    size = max(2, min(token_budget, TABLE_LIMIT) + 1)
    raw = tuple(_ticks(x) for x in m.per_token_table(size))
    overhead = max(_ticks(m.gpu_overhead_s), 1)
    floor = _ticks(draft.pass_host_s) - overhead  # the pass's fixed and linear part is at least the host's
    linear = (raw[0],) + tuple(max(x, floor) for x in raw[1:])
    return SpecSetup(**base, verify=_ticks(draft.verify_lm_head_s), overhead=overhead,
                     per_request=_ticks(m.gpu_per_request_s), kv_per_token=_ticks(m.kv_read_s_per_token),
                     attention_per_pair=_ticks(m.attention_s_per_pair), linear=linear,
                     linear_slope=max(raw[-1] - raw[-2], 0))
