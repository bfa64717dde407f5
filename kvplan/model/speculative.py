"""Speculative decoding as vLLM V1 runs it (EAGLE, EAGLE-3, MTP, n-gram): the draft's cost, its KV,
the tokens a step verifies, and the tokens it accepts.

vLLM's `--speculative-config '{"method": M, "num_speculative_tokens": k, "model": ...}'`
(vllm/config/speculative.py, SpeculativeConfig; use_eagle() is true for eagle, eagle3 and mtp):

- Every decoding request is scheduled 1 + k tokens a step: its last sampled token and the k draft
  tokens proposed after the previous step (vllm/v1/core/sched/scheduler.py: num_new_tokens =
  num_tokens_with_spec - num_computed_tokens, capped by the token budget, the drafts cut to what
  fits). The target's forward verifies them all at once, the lm_head running on all 1 + k
  positions; the rejection sampler (vllm/v1/sample/rejection_sampler.py) keeps the drafts up to the
  first rejected one and samples one more token, so a step emits 1 + a tokens, a the accepted
  drafts, and the rejected drafts' slots are rolled back (num_computed_tokens -= rejected).
- EAGLE-style drafters (eagle, eagle3, mtp) get `num_lookahead_tokens = k` more KV slots at every
  allocation of a running request (scheduler.py: allocate_slots(..., num_lookahead_tokens); 0 for a
  waiting request, whose num_computed_tokens is 0), where the next drafts write their KV.
- The drafter (vllm/v1/spec_decode/eagle.py, EagleProposer.propose) runs after the target's
  forward: a first pass over every token the step scheduled (it needs the target's hidden states
  of each), then k - 1 passes of one token per decoding request, one after another. Each pass is
  the draft's decoder layer(s) and its lm_head. EAGLE / EAGLE-3 heads are one decoder layer of the
  target's shape plus an input projection (fc: 2 x hidden for EAGLE, 3 x hidden for EAGLE-3, which
  fuses three of the target's layers) and their own lm_head (EAGLE-3's Llama heads keep a draft
  vocabulary of 32,000 tokens: yuhuili/EAGLE3-LLaMA3.1-Instruct-8B's config.json,
  draft_vocab_size). MTP (DeepSeek-V3's num_nextn_predict_layers) is the model's own extra layer(s)
  with an eh_proj of 2 x hidden, sharing the target's lm_head. n-gram (vllm/v1/spec_decode/
  ngram_proposer.py) matches the context on the host: no GPU pass, no KV.
- The draft's layers keep their own KV (EAGLE's layer is a layer of the KV cache spec; the MTP
  layers are extra attention layers), so a token takes the target's KV bytes plus theirs, and the
  pool holds fewer tokens.

Sources read (vLLM V1, releases 0.9-0.11; the proposer loop later moved to
vllm/v1/spec_decode/llm_base_proposer.py): Scheduler.__init__ sets num_lookahead_tokens =
num_spec_tokens only when speculative_config.use_eagle() (or a draft model); schedule() passes it
to allocate_slots for running requests, and effective_lookahead_tokens = 0 for a waiting request
whose num_computed_tokens is 0; KVCacheManager.allocate_slots allocates min(computed + new +
lookahead, max_model_len) slots. EagleProposer.propose: one forward over the step's tokens, then
`for _ in range(num_speculative_tokens - 1)` one token per request, each pass with its lm_head.

With an EAGLE-style drafter vLLM's prefix cache gives up the last block of a hit
(vllm/v1/core/single_type_kv_cache_manager.py, find_longest_cache_hit with use_eagle), and so does
the serve engine. A draft pass takes the longer of its GPU work and the proposer's own time per
pass (DRAFT_PASS_HOST_S, 0 by default: the V1 model runner's Python loop between the draft's graph
replays, LOOP_PASS_HOST_S in releases 0.9-0.10, is not charged; see the constant).
Not modelled: n-gram proposes nothing when the context has no match (its steps then verify one
token; fold that into its acceptance); Model Runner V2's multi-step drafting in one CUDA graph
(vllm-project/vllm#29559, opt-in with VLLM_USE_V2_MODEL_RUNNER=1: no per-pass host time) and
parallel drafting; tree drafting (SGLang's topk > 1); the step's fixed speculative host time
(the sync after sampling, the rejection sampler, the first pass's metadata: vllm#20780's step
time at K -> 0 is 0.6-1.3 ms above the plain one, not charged, so batch-1 speedups with few
drafts come out a few % high); the n-gram matcher's host time; a draft TP other than the target's.

Acceptance per position (vLLM's spec-decode metrics, vllm/v1/spec_decode/metrics.py: "acceptance
rate per position" = accepted at position i / drafts): the probability that a step accepts at
least i + 1 drafts, so it never rises with i; the mean accepted drafts of a step are their sum.
Defaults (default_acceptance): EAGLE's and EAGLE-3's are geometric, a conditional rate r per
position (DEFAULT_RATE), each r read off a cited measurement; n-gram's and MTP's are measured lists
per position (MEASURED_ACCEPTANCE: vLLM reruns MTP's one layer for every draft, which accepts far
less past the first); a user's list replaces them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvplan.errors import UsageError

METHODS = ("eagle", "eagle3", "mtp", "ngram")
SGLANG_METHODS = ("eagle", "eagle3", "mtp")  # SGLang's EAGLE worker (NEXTN is its EAGLE); its n-gram one is not modelled
MAX_SPECULATIVE_TOKENS = 32  # more drafts than any published setting (vLLM's examples use 1-8)


def sglang_refusal(engine: str) -> str:
    """Why SGLang's engine does not take n-gram speculation, naming how the engine was chosen
    (`engine: sglang` in a file, `--engine sglang` on the command line)."""
    return (f"SGLang's n-gram speculation (a draft tree of its own) is not modelled; {engine} takes "
            f"{', '.join(SGLANG_METHODS[:-1])} or {SGLANG_METHODS[-1]}")


# The conditional acceptance r of each method (a draft is accepted with probability r given the
# one before it was), so position i's rate is r^(i+1). Each r is solved from a published mean:
DEFAULT_RATE = {
    # EAGLE-3, Llama-3.1-8B-Instruct, MT-bench, vLLM, k = 7, temperature 0: mean acceptance length
    # 3.53 (vllm-project/vllm#26191, "Previous AL=3.53", 12,208 accepted of 4,816 drafts): the sum
    # r + ... + r^7 = 2.53 gives r = 0.745
    "eagle3": 0.745,
    # EAGLE-1, Llama-3-8B-Instruct, MT-bench, vLLM V1, k = 2: acceptance length 1.89
    # (vllm-project/vllm#16035, comment of 2025-04-09): r + r^2 = 0.89 gives r = 0.567
    "eagle": 0.567,
    # MTP: its rates per position are a measured list (MTP_ACCEPTANCE below), not r^(i+1): past the
    # first position vLLM reruns the same MTP layer, which accepts far less there
    "mtp": 0.92,
    # n-gram (prompt lookup): its rates per position are the source's own (NGRAM_ACCEPTANCE below);
    # past them each further position keeps the last ratio of two (0.66 / 0.68)
    "ngram": 0.81,
}
# n-gram (prompt lookup), vLLM, k = 5, prompt_lookup_min 2, max 5, a code-editing set
# (vdaita/edit_5k_char): the acceptance rate per position, vLLM's metric (the share of steps that
# accept at least i + 1 drafts), 0.81 0.74 0.70 0.68 0.66 (vllm-project/vllm#24344), taken as they
# are: 3.59 tokens accepted a step at k = 5. The rate depends on how much the output repeats the
# prompt, chat sets far less: set --acceptance
NGRAM_ACCEPTANCE = (0.81, 0.74, 0.70, 0.68, 0.66)
# MTP drafts with the model's own num_nextn_predict_layers, one layer per draft position, cycling
# (vllm/model_executor/models/deepseek_mtp.py, DeepSeekMultiTokenPredictor.forward: layer
# spec_step_idx % num_mtp_layers); the models here have one (DeepSeek-V3/R1, GLM-4.5/4.6), so
# positions 2.. rerun a layer trained to predict the token after the target's own hidden state, fed
# its own hidden state instead, and vLLM warns that k > 1 "will run multiple times of forward on
# same MTP layer, which may result in lower acceptance rate" (vllm/config/speculative.py,
# SpeculativeConfig.__post_init__). The first position accepts about what DeepSeek-V3's report
# gives ("the acceptance rate of the second token prediction ranges between 85% and 90%",
# arXiv:2412.19437, section 5.4.3), the later ones much less than a geometric r^(i+1) would: vLLM v0.10.1, GLM-4.5-Air (one MTP layer), k = 3, GPQA-Main,
# acceptance per position 0.92, 0.68, 0.38 (SpecDecode-Bench, arXiv:2601.11580, project page
# "Reasoning Workloads"), taken as they are, a fourth position on at the last ratio of two (0.38 /
# 0.68). A geometric 0.875 would give 0.875, 0.766, 0.670 (2.31 accepted at k = 3, where this list
# gives 1.98); sgl-project/sglang#10281 measures 1.69 for DeepSeek-R1 at k = 3 on random prompts,
# and a Gemma-4 MTP run in vLLM prints 0.844, 0.599, 0.385, 0.271 at k = 4 (eugr/spark-vllm-docker
# #343): the same fall. A model with several MTP layers drafts its first positions with trained
# layers and would accept more there (not modelled: set --acceptance).
MTP_ACCEPTANCE = (0.92, 0.68, 0.38)
MEASURED_ACCEPTANCE = {"ngram": NGRAM_ACCEPTANCE, "mtp": MTP_ACCEPTANCE}


@dataclass(frozen=True, slots=True)
class Speculative:
    """One speculative-decoding setting: vLLM's method and num_speculative_tokens, and the
    acceptance rate of each draft position (P(at least i + 1 drafts accepted))."""

    method: str
    num_speculative_tokens: int
    acceptance: tuple[float, ...]
    acceptance_given: bool = False  # the user's list (else the method's cited default)

    @property
    def k(self) -> int:
        return self.num_speculative_tokens

    @property
    def mean_accepted(self) -> float:
        """Mean drafts a step accepts (with its bonus token a step emits 1 + this)."""
        return float(sum(self.acceptance))

    @property
    def lookahead(self) -> int:
        """KV slots vLLM allocates beyond the scheduled tokens (EAGLE-style drafters)."""
        return self.k if self.method in ("eagle", "eagle3", "mtp") else 0

    def to_dict(self) -> dict:
        return {"method": self.method, "num_speculative_tokens": self.k,
                "acceptance": list(self.acceptance), "acceptance_given": self.acceptance_given,
                "mean_accepted": self.mean_accepted}


def default_acceptance(method: str, k: int) -> tuple[float, ...]:
    """The method's published rates for k positions: r^(i + 1) from its DEFAULT_RATE, or the
    measured list of n-gram and MTP (MEASURED_ACCEPTANCE), extended at its last ratio of two."""
    measured = MEASURED_ACCEPTANCE.get(method)
    if measured is not None:
        rates = list(measured[:k])
        step = measured[-1] / measured[-2]
        while len(rates) < k:
            rates.append(rates[-1] * step)
        return tuple(round(x, 6) for x in rates)
    r = DEFAULT_RATE[method]
    return tuple(round(r ** (i + 1), 6) for i in range(k))


def make_speculative(method: str, k: int | None, acceptance=None, *, field: str = "--speculative",
                     k_field: str = "--num-speculative-tokens",
                     acceptance_field: str = "--acceptance") -> Speculative:
    """Check a setting (errors name the flag or key) and fill in the default acceptance."""
    if not isinstance(method, str) or method.lower() not in METHODS:
        raise UsageError(f"expected one of {', '.join(METHODS)}, got {method!r}", field=field)
    method = method.lower()
    if isinstance(acceptance, str):
        try:
            acceptance = [float(x) for x in acceptance.split(",") if x.strip()]
        except ValueError:
            raise UsageError(f"expected comma-separated rates like 0.8,0.6,0.4, got {acceptance!r}",
                             field=acceptance_field) from None
    if acceptance is not None:
        if not isinstance(acceptance, (list, tuple)) or not acceptance:
            raise UsageError("expected a list of per-position acceptance rates", field=acceptance_field)
        if k is None:
            k = len(acceptance)
    if k is None:
        k = 3
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
        raise UsageError(f"expected an integer from 1 to {MAX_SPECULATIVE_TOKENS}, got {k!r}", field=k_field)
    if acceptance is None:
        return Speculative(method, k, default_acceptance(method, k))
    rates = []
    for x in acceptance:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0.0 <= float(x) <= 1.0:
            raise UsageError(f"expected rates from 0 to 1, got {x!r}", field=acceptance_field)
        rates.append(float(x))
    if len(rates) != k:
        raise UsageError(f"expected {k} rates (one per speculative token), got {len(rates)}",
                         field=acceptance_field)
    if any(b > a for a, b in zip(rates, rates[1:])):
        raise UsageError("expected rates that never rise from one position to the next (position i's "
                         "rate is the share of steps accepting at least i + 1 drafts)", field=acceptance_field)
    return Speculative(method, k, tuple(rates), acceptance_given=True)


# -- the draft's cost and KV ---------------------------------------------------------------------

EAGLE3_DRAFT_VOCAB = 32000  # yuhuili/EAGLE3-LLaMA3.1-Instruct-8B config.json: draft_vocab_size

# The proposer's own time a draft pass takes (vLLM V1, releases 0.9-0.10): EagleProposer.propose
# runs its k passes as a Python loop after the step's sampled tokens reach the host, and between
# two graph replays of the draft model it issues a dozen eager ops (positions + 1, the clamp at
# max_model_len, the slot mapping from the block table, the attention metadata's seq_lens, the
# argmax); the loop does not sync, so the host runs ahead of the GPU and a pass takes the longer
# of the two, max(the draft's GPU pass, this). Read off vllm-project/vllm#20780 (Llama-3.1-8B-
# Instruct, batch 1, K = 2..7, TPOT and acceptance length per K): the step, TPOT x AL, grows by
# 0.740 ms per draft with EAGLE-1 and 1.016 ms with EAGLE-3 (least squares over K), where
# kvplan's GPU pass at batch 1 is 0.70 ms (EAGLE-1, full 128k vocabulary) and 0.36 ms (EAGLE-3,
# 32k): the host binds. The two slopes disagree by 0.28 ms (EAGLE-3's pass does no more GPU work;
# not resolved here): their mean, 0.88 ms, keeps every row of that source within 17%. The same
# structure is in SpecDecode-Bench's simulator for vLLM v0.10.1 (github.com/SpecDecode-Bench/
# simulator, predictor.py, Llama8BH100, fitted on its own H100 runs at batch 1-64): a draft time
# of 2.14 ms whatever the batch (k = 3: 0.71 ms a pass) plus a step overhead of 1.21 ms. The draft
# model itself ran as (piecewise) CUDA graphs then, the loop around it in Python (vllm-project/
# vllm#21477, 2025-07, on full graphs for the draft). SGLang captures its whole draft loop (all
# speculative_num_steps passes) in one CUDA graph (sglang/srt/speculative/
# eagle_draft_cuda_graph_runner.py, EAGLEDraftCudaGraphRunner), and so does vLLM's Model Runner V2
# (vllm-project/vllm#29559): no such per-pass time; bench/speculative_fidelity.py predicts SGLang's
# rows with 0.
LOOP_PASS_HOST_S = 0.88e-3
# What kvplan charges by default: nothing. With LOOP_PASS_HOST_S the two sources of releases
# 0.9-0.10 that state their acceptance come closer (vllm#20780 19.1% -> 8.8%, vllm#16035 14.9% ->
# 8.5%), but the rows at batch 2-64 (vLLM 0.31's, and SpecDecode-Bench's on 0.10.1) and the
# corpus's median get worse (9.1% -> 10.1%; bench/speculative_fidelity.py prints both): a default
# must beat the one before it in every regime where both apply, and this one does not, so which
# releases run the loop in Python, and what the rows at batch > 1 want instead, stays open.
DRAFT_PASS_HOST_S = 0.0


@dataclass(frozen=True, slots=True)
class Draft:
    """The drafter of one setting on one GPU: a StepModel of its layer(s) and lm_head (None for
    n-gram), the target's lm_head time per extra verified position, its KV bytes per token."""

    model: object  # StepModel or None
    verify_lm_head_s: float  # the target's lm_head on one more position (each draft verified)
    kv_bytes_per_token: int  # the draft layers' KV of one token on this GPU
    weight_bytes_per_gpu: int  # the weights the draft adds (an EAGLE head; MTP's layers, not its lm_head)
    pass_host_s: float = 0.0  # the proposer's own time each pass adds (DRAFT_PASS_HOST_S)

    def pass_s(self, tokens: int, requests: int, kv_read: int, pairs: int = 0) -> float:
        """Seconds one draft pass over `tokens` tokens of `requests` requests adds to the step:
        its GPU work and the proposer's per-pass time (DRAFT_PASS_HOST_S)."""
        if self.model is None or tokens <= 0:
            return 0.0
        m = self.model
        return (max(m.gpu_overhead_s + m.per_token_s(tokens), self.pass_host_s) + m.gpu_per_request_s * requests
                + m.kv_read_s_per_token * kv_read + m.attention_s_per_pair * pairs)


def mtp_layers(spec) -> int:
    """The model's multi-token-prediction layers (DeepSeek-V3, GLM-4.5: num_nextn_predict_layers;
    mtp_num_hidden_layers where a config names them so); 0 when it has none."""
    raw = spec.raw or {}
    for key in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
        value = raw.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def draft_of(spec, layout, weights, target, sp: Speculative, *, field: str = "--speculative") -> Draft:
    """The draft of `sp` for the target `spec` (its StepModel `target`, per GPU of tp ranks); an
    error naming `field` when the method needs what the model lacks (MTP layers)."""
    tp = target.tp
    layers = max(len(spec.layers), 1)
    kv_layers = sum(g.num_layers for g in layout.groups if g.bytes_per_token) or layers
    kv_per_layer = layout.bytes_per_token // kv_layers if kv_layers else 0
    verify = target.gpu_per_request_s
    if sp.method == "ngram":
        return Draft(None, verify, 0, 0)
    hidden = spec.hidden_size
    bytes_per_param = _dense_bytes_per_param(target, weights)
    # one decoder layer of the target's: its dense part (attention, dense or shared MLP), and for
    # MTP its experts too; the lm_head of the draft's vocabulary
    lm_head_params = spec.vocab_size * hidden
    dense_layer_bytes = max(target.dense_bytes - lm_head_params * bytes_per_param / tp, 0.0) / layers
    dense_layer_flops = target.dense_flops_per_token / layers
    if sp.method == "mtp":
        nextn = mtp_layers(spec)
        if not nextn:
            raise UsageError(f"mtp needs a model with multi-token-prediction layers (num_nextn_predict_layers in "
                             f"its config); {spec.name} has none: use eagle, eagle3 or ngram", field=field)
        proj = 2 * hidden * hidden  # eh_proj
        vocab = spec.vocab_size
        experts = target.num_experts
        expert_bytes = target.expert_bytes // max(target.moe_layers, 1) * nextn if experts else 0
        expert_flops = target.expert_flops_per_token / max(target.moe_layers, 1) * nextn if experts else 0.0
    else:
        nextn = 1
        proj = (3 if sp.method == "eagle3" else 2) * hidden * hidden  # fc
        vocab = min(spec.vocab_size, EAGLE3_DRAFT_VOCAB) if sp.method == "eagle3" else spec.vocab_size
        experts, expert_bytes, expert_flops = 0, 0, 0.0
    draft_bytes = int(nextn * (dense_layer_bytes + proj * bytes_per_param / tp) + vocab * hidden * bytes_per_param / tp)
    # the weights the draft adds on a GPU: all of an EAGLE head's (a checkpoint of its own, loaded
    # beside the target); MTP's layers with their experts and eh_proj (the module ships in the
    # checkpoint but is loaded only with MTP on; kvplan's weights count num_hidden_layers, not it),
    # not the embedding and lm_head it shares with the target (which its passes read all the same)
    own_bytes = draft_bytes if sp.method != "mtp" else int(
        nextn * (dense_layer_bytes + proj * bytes_per_param / tp) + expert_bytes)
    dense_flops = nextn * (dense_layer_flops + 2.0 * proj / tp)
    model = replace(
        target, dense_bytes=draft_bytes, dense_flops_per_token=dense_flops,
        expert_bytes=expert_bytes, expert_flops_per_token=expert_flops, num_experts=experts,
        lm_head_flops_per_request=2.0 * vocab * hidden / tp,
        kv_bytes_per_token=kv_per_layer * nextn,
        attention_flops_per_pair=target.attention_flops_per_pair / max(_attention_layers(spec), 1) * nextn,
        window_flops_per_token=0.0, num_layers=nextn, moe_layers=nextn if experts else 0,
        enforce_eager=False, async_scheduling=True)
    return Draft(model, verify, kv_per_layer * nextn, own_bytes, DRAFT_PASS_HOST_S)


def _attention_layers(spec) -> int:
    return sum(1 for layer in spec.layers for m in layer.mixers if m.kind in ("full", "sliding", "mla"))


def _dense_bytes_per_param(target, weights) -> float:
    """Bytes per dense parameter as loaded (2 for bf16, ~1 for fp8)."""
    parts = {kind: (params, size) for kind, params, size in weights.components}
    params = sum(p for k, (p, _) in parts.items() if k != "experts")
    size = sum(b for k, (_, b) in parts.items() if k != "experts")
    return size / params if params else 2.0


# -- one step with and without speculation --------------------------------------------------------


def speculative_step(target, draft: Draft, sp: Speculative, *, batch: int, read: int,
                     serial_host: bool = False) -> dict:
    """A decode step of `batch` requests each reading `read` tokens of KV, with and without
    speculation: the verify forward of batch x (1 + k) tokens, the draft's k passes, the tokens a
    step emits on average, and the time per output token and throughput they give. `serial_host`:
    the speculative step's host time adds to its GPU time (an engine that turns its overlap
    scheduler off to speculate, as SGLang's EAGLE worker does), the plain step keeping it hidden."""
    k = sp.k
    plain = target.step_s(tokens=batch, requests=batch, kv_read=batch * read, pairs=0)
    verify_tokens = batch * (1 + k)
    verify = (target.overhead_s + target.per_request_s * batch + target.per_token_s(verify_tokens)
              + target.kv_read_s_per_token * batch * read + draft.verify_lm_head_s * batch * k)
    draft_kv = batch * read
    first = draft.pass_s(verify_tokens, batch, draft_kv)
    rest = (k - 1) * draft.pass_s(batch, batch, draft_kv)
    gpu = verify + first + rest
    host = target.host_step_s + target.host_request_s * batch
    step = gpu + host if serial_host else max(gpu, host)
    emitted = 1.0 + sp.mean_accepted
    serial = {"serial_host_s": host} if serial_host else {}
    return {**serial,
        "tokens_verified": verify_tokens, "verify_s": verify, "draft_s": first + rest,
        "draft_first_pass_s": first, "draft_pass_s": draft.pass_s(batch, batch, draft_kv),
        "step_s": step, "tokens_per_request_step": emitted,
        "tpot_s": step / emitted, "tpot_plain_s": plain,
        "speedup": plain / (step / emitted),
        "output_tokens_per_s": batch * emitted / step, "output_tokens_per_s_plain": batch / plain,
    }


def speculative_section(spec, layout, weights, target, sp: Speculative, *, batch: int, read: int,
                        batches=(1, 2, 4, 8, 16, 32, 64, 128, 256), serial_host: bool = False) -> dict:
    """What `kvplan step --speculative` adds: the setting, the draft, one step at --batch, and
    the speedup at other batch sizes (it shrinks as the verify forward turns compute-bound);
    `serial_host` as speculative_step's."""
    draft = draft_of(spec, layout, weights, target, sp)
    at = speculative_step(target, draft, sp, batch=batch, read=read, serial_host=serial_host)
    curve = [{"batch": b, **{key: speculative_step(target, draft, sp, batch=b, read=read,
                                                   serial_host=serial_host)[key]
                             for key in ("tpot_s", "tpot_plain_s", "speedup")}} for b in batches]
    return {**sp.to_dict(), "draft_kv_bytes_per_token": draft.kv_bytes_per_token,
            "draft_weight_bytes_per_gpu": draft.weight_bytes_per_gpu, "lookahead_slots": sp.lookahead,
            "step": at, "by_batch": curve}
