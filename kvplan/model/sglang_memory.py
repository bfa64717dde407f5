"""What SGLang allocates at start-up: the KV pool's tokens, max_running_requests, and whether it starts.

Read from SGLang's own source (sgl-project/sglang, python/sglang/srt):

1. mem_fraction_static, when not given (`ServerArgs.__post_init__`, later
   `ServerArgs._handle_gpu_memory_settings`), from `gpu_mem`, the device's total memory in MiB as
   `get_device_memory_capacity` reads it: `get_nvgpu_memory_capacity` runs `nvidia-smi
   --query-gpu=memory.total` (the minimum over the visible GPUs), so the tiers and the fraction
   use nvidia-smi's total (gpus.GPU.memory_bytes: 46,068 MiB on an L40S), not CUDA's smaller
   one, which only the free memory before loading reflects. Read in three eras (`release_rules`):
   - before 0.4.7 (sgl-project/sglang#2044 and earlier): by the parallel size alone, 0.88 at
     tp=1, 0.87 at 2, 0.85 at 4, 0.81 at 8, 0.79 at 16; chunked_prefill_size 2048 below
     25,000 MiB, else 8192; cuda_graph_max_bs 8 (80 at tp >= 4) below 25,000 MiB, else 160.
   - 0.4.7 to 0.5.2 (sgl-project/sglang#7054, 2025-06-10, "Simplify the heuristics"): a reserve
     by memory tier, (2.8 + parallel/10) GiB below 35 GiB, (9.5 + parallel/2) GiB below 90 GiB,
     (12 + parallel/2) GiB below 160 GiB, else 32 GiB; mem_fraction_static =
     round((gpu_mem - reserve) / gpu_mem, 3); chunked_prefill_size 2048 below 35 GiB, 8192 below
     160 GiB, else 16384.
   - 0.5.3 on (sgl-project/sglang#10975, 2025-09-27, "more general heuristics"): chunked_prefill_size
     and cuda_graph_max_bs by tier (below 20 GiB 2048/8; below 35 GiB 2048/24, 80 at tp >= 4;
     below 60 GiB 4096/32, 160 at tp >= 4; below 160 GiB 8192/256, 512 at tp >= 4; else
     16384/512), then reserve (MiB) = 512 + 1.5 x max(chunked_prefill_size, 2048) + 2 x
     cuda_graph_max_bs + 1024 x tp x pp / 8, at least 10 GiB on GPUs above 60 GiB, and
     mem_fraction_static = round((gpu_mem - reserve) / gpu_mem, 3). (Later releases add a
     reserve for piecewise CUDA graphs when they are on; not modelled here.)
   The releases of each era are taken from the merge dates (0.4.7 and 0.5.3 are the first
   releases after them); `release_at` gives the era a log of a given date can have run. This
   module follows the 0.5.3-on rule by default (SGLANG_RELEASE); `release` picks another era.
   Multimodal models lower the fraction further, by rules that changed three times; none is
   modelled, because their release boundaries are not pinned:
   - early releases: `ModelRunner.__init__` multiplies the fraction, given or not, by 0.95 for an
     architecture of its multimodal list (Gemma3ForConditionalGeneration, Llama4ForConditionalGeneration,
     the Llava and Qwen2-VL families). The log of sgl-project/sglang#4826 (Gemma 3 4B, 2025-03-27)
     bears it out: 131.08 - 139.21 x (1 - 0.88 x 0.95) = 108.25 GB, and the log's K + V is 108.24 GB.
     kvplan, which keeps 0.88, is 5.7% high there. A later release lowered the factor to 0.90
     (sgl-project/sglang#6881 describes that state);
   - from #6881 (June 2025), `adjust_mem_fraction_for_vlm` scales only a fraction SGLang derives
     itself, by 0.95 x clamp(1 - 0.1 x (L x H^2 / (24 x 1024^2) - 1), 0.8, 1.05), where L and H are
     the vision tower's layers and width;
   - by late 2025 `ModelConfig` turns multimodal off by default for Gemma 3 and Llama 4
     (mm_disabled_models, "set --enable-multimodal"). On those releases the catalog's Gemma 3 and
     Llama 4 get no adjustment, as kvplan assumes.

2. The pool (`ModelRunner.profile_max_num_token`, later model_runner_kv_cache_mixin.py):
       rest = post_load - pre_load x (1 - mem_fraction_static)          [GB of 2^30 bytes]
       max_total_num_tokens = int(rest x 2^30) // cell_size, then // page_size x page_size
   where pre_load is the free memory before the weights load (the minimum over the TP ranks),
   post_load the free memory after, and cell_size the KV bytes of one token on one rank: K and V
   of the KV heads per rank over every attention layer (`get_num_kv_heads(tp)` keeps at least one
   head), or for MLA models (DeepSeek) the latent kv_lora_rank + qk_rope_head_dim over every layer,
   not split by TP. So the pool is pre_load x mem_fraction_static less the weights: the activations
   and CUDA graphs live in the share the fraction leaves, which is why SGLang's start-up never
   fails for them at sizing time. pre_load is the GPU's memory less what the process holds before
   the weights: the CUDA context, and at tp > 1 the distributed init (CUDA_CONTEXT, dist_init).

3. max_running_requests: max_num_reqs = min(max(int(tokens / context_len x 512), 2048), 4096)
   (`init_memory_pool`, later `_resolve_max_num_reqs`), the req_to_token pool holds max_num_reqs
   rows, and the scheduler runs min(tokens // 2, that pool) when --max-running-requests is not
   given (`TpModelWorker.__init__`), else min(the given, that pool). The 0.3-0.4 source builds
   `ReqToTokenPool(size=max_num_reqs + 1)` and the scheduler takes min(..., its size), so those
   releases print 2049 or 4097 (logs dated up to 2025-05 do); the 0.4.7-era source builds
   `size=max_num_reqs` (logs from 2025-07 print 2048). The release of that change is not pinned:
   it is taken as 0.4.7, with the fraction's rule.
   A pool of no tokens fails: "Not enough memory. Please try to increase --mem-fraction-static."

4. Speculative decoding (EAGLE, EAGLE-3, NEXTN/MTP; `speculative_steps` = speculative_num_steps
   with speculative_eagle_topk 1 and speculative_num_draft_tokens = steps + 1, the chain kvplan
   models): `_handle_speculative_decoding` sets max_running_requests to 48 when it is not given;
   the 0.5.3-era fraction keeps 2 GiB more for the draft model and its CUDA graphs
   (`_handle_gpu_memory_settings`: "eagle draft models and cuda graphs", added after the 10 GiB
   floor); and the pool, which the target and the draft share by index, holds
   max_num_reqs x (topk x steps + num_draft_tokens) + 100 tokens beyond the profiled ones
   (`init_memory_pool`: draft_runner_cache_size, "a headroom for" the draft and verify tokens
   allocated at once), max_num_reqs taken from the profiled tokens. The draft's own KV pool (the
   same tokens at the draft layers' cell size) and its weights come out of the share the fraction
   leaves, as the activations do; `draft_kv_pool` reports its bytes.

5. Sliding-window layers. SGLang keeps a separate pool for them only for the architectures of its
   hybrid SWA list (configs/model_config.py `is_hybrid_swa_model`: Llama4ForConditionalGeneration,
   GptOssForCausalLM, MiMo-V2-Flash, Step-3.5; Gemma 4 later), and `ServerArgs.
   _handle_model_specific_adjustments` turns it off again for gpt-oss (disable_hybrid_swa_memory =
   True at the end of its GptOssForCausalLM branch in the 0.5 releases; later releases keep it off
   only on the trtllm_mha attention backend, a change not modelled here) and for Gemma 2 and 3 ("not
   compatible with gemma2", which are not on the list either). Every other model, these among them,
   counts its sliding layers as full layers in one pool (rule 2's cell_size over all layers).
   On the hybrid pool (`set_num_token_hybrid_swa`) rule 2 profiles T tokens at the cell size of all
   layers, max_num_reqs is taken from T (rule 3), and T is split between a pool of the full layers
   and one of the sliding layers, r = --swa-full-tokens-ratio (0.8 by default) tokens of the second
   for each of the first, at the same memory:
       full = int(T x (F x n_full + S x n_swa) / (F x n_full + r x S x n_swa)), swa = int(full x r)
   (F, S the per-layer bytes of a token of each kind, n_full, n_swa their layers; the 0.5 releases
   write it with F = S, total_tokens / (r x n_swa + n_full), the same), each a whole number of pages;
   max_total_num_tokens is the full pool and max_running_requests follows from it as in rule 3.
   Llama 4's chunked-attention layers are its sliding ones (every fourth layer is full). Releases
   before 0.4.7 sized Llama 4's hybrid pool by another rule, opt-in (--hybrid-kvcache-ratio): not
   modelled, the hybrid pool is taken from 0.4.7 on.
   Serving on it (SWATokenToKVPoolAllocator, mem_cache/swa_radix_cache.py): a request allocates each
   token in both pools, and before sgl-project/sglang#17220 ("Evict swa kv cache during decoding",
   merged 2026-01-16) the radix tree took a running request's tokens only when its prefill or the
   request finished, so a running request holds every token in both pools, and the allocator's
   available_size is the smaller pool's. The serving engine (kvplan/sim/sglang.py) runs one pool of
   min(full, swa) tokens (SGLangMemory.serving_tokens). Not modelled: the tree's SWA tombstones
   (a cached prefix whose sliding-layer KV was evicted keeps its full-layer KV), and the decode-time
   eviction of the releases after #17220, which frees a running request's sliding-layer tokens
   beyond 2 x the window.
Models with recurrent state are not modelled yet (UsageError).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from kvplan.errors import UsageError

GiB = 2**30
MiB = 2**20
SPECULATIVE_MAX_RUNNING = 48  # server_args.py _handle_speculative_decoding: max_running_requests when not given
SPECULATIVE_RESERVE_MIB = 2 * 1024  # _handle_gpu_memory_settings: "eagle draft models and cuda graphs"
SPECULATIVE_POOL_BUFFER = 100  # init_memory_pool: draft_runner_cache_size's "buffer"
SGLANG_RELEASE = "0.5.3"  # the release whose rules apply by default (the rule of sgl-project/sglang#10975)
ERAS = ((0, 4, 7), (0, 5, 3))  # the first release of the 0.4.7 rule and of the 0.5.3 rule
OLDEST = (0, 3, 0)  # the oldest release whose rules are modelled (release_rules refuses older ones)
# Held by the process before the weights load (outside pre_load): the CUDA context, and at tp > 1
# what init_torch_distributed allocates, which SGLang logs as "Init torch distributed ends. mem
# usage=X GB". Read off SGLang's own logs (the sources are CALIBRATION in
# bench/sglang_memory_fidelity.py, reported apart from the held-out ones):
# - the context: 4 x L4 at tp=4 log "Load weight begin. avail mem=21.63 GB" after a distributed
#   init of 0.13 GB, against CUDA's 22.05 GiB: 22.05 - 21.63 - 0.13 = 0.29 GiB
#   (https://github.com/didier-durand/llms-in-clouds, docs/sglang.md);
# - the distributed init on PCIe GPUs (no NVLink: SGLang disables its custom all-reduce "on more
#   than two PCIe-only GPUs", NCCL allocates lazily): 0.13 GiB, the same log;
# - on NVLink GPUs SGLang's custom all-reduce buffers and NCCL's NVLink SHARP buffers come up at
#   init: 1.77-2.01 GB on the eight ranks of an 8 x H200 node
#   (https://github.com/sgl-project/sglang/pull/11716), 2.0 GiB taken.
CUDA_CONTEXT = int(0.29 * GiB)
DIST_INIT_PCIE = int(0.13 * GiB)
DIST_INIT_NVLINK = int(2.0 * GiB)
NVLINK_BYTES_PER_S = 64e9  # faster GPU-to-GPU links than PCIe Gen5 x16 are NVLink


def dist_init(tp: int, link_bytes_per_s: float) -> int:
    """What SGLang's distributed init holds on each of `tp` ranks (see CUDA_CONTEXT)."""
    if tp <= 1:
        return 0
    return DIST_INIT_NVLINK if link_bytes_per_s > NVLINK_BYTES_PER_S else DIST_INIT_PCIE
DEFAULT_PAGE_SIZE = 1
# Rule 5: the architectures SGLang runs on its hybrid SWA pool by default (gpt-oss is on its list but
# has the pool turned off, Gemma is off it), and the model types whose config names no architecture
# that stand for one (the catalog's Llama 4 is the text part of Llama4ForConditionalGeneration, the
# architecture of every published Llama 4 checkpoint).
HYBRID_SWA_ARCHITECTURES = ("Llama4ForConditionalGeneration", "MiMoV2FlashForCausalLM", "Step3p5ForCausalLM")
HYBRID_SWA_TYPES = ("llama4", "llama4_text")
SWA_FULL_TOKENS_RATIO = 0.8  # server_args.py swa_full_tokens_ratio


def hybrid_swa(model_type: str, architectures=()) -> bool:
    """Whether SGLang runs a model on its hybrid SWA pool by default (rule 5): by the config's
    architectures where it names them, else by its model type."""
    if architectures:
        return any(a in HYBRID_SWA_ARCHITECTURES for a in architectures)
    return model_type in HYBRID_SWA_TYPES


def model_identity(spec) -> dict:
    """The model_type and architectures of a ModelSpec, as startup_memory takes them (rule 5)."""
    raw = getattr(spec, "raw", None) or {}
    archs = raw.get("architectures") if isinstance(raw, dict) else None
    return {"model_type": getattr(spec, "model_type", "") or "",
            "architectures": tuple(a for a in archs if isinstance(a, str)) if isinstance(archs, list) else ()}


def hybrid_split(tokens: int, layout, ratio: float, page_size: int) -> tuple[int, int]:
    """(full, swa): the profiled `tokens` split between the full layers' pool and the sliding
    layers' at `ratio` swa tokens a full one (rule 5), each a whole number of pages."""
    full_groups = [g for g in layout.groups if g.kind != "sliding"]
    swa_groups = [g for g in layout.groups if g.kind == "sliding"]
    if len({g.bytes_per_token_per_layer for g in layout.groups}) == 1:  # the 0.5 releases' arithmetic
        n_full, n_swa = sum(g.num_layers for g in full_groups), sum(g.num_layers for g in swa_groups)
        full = int(tokens * (n_full + n_swa) / (ratio * n_swa + n_full))
    else:  # the per-layer bytes differ: the later releases' memory-based split
        full_bytes, swa_bytes = (sum(g.bytes_per_token for g in gs) for gs in (full_groups, swa_groups))
        full = int(tokens * (full_bytes + swa_bytes) / (full_bytes + ratio * swa_bytes))
    swa = int(full * ratio)
    return full // page_size * page_size, swa // page_size * page_size


def release_version(release: str) -> tuple[int, int, int]:
    """(major, minor, patch) of an SGLang release as written ("0.4.3.post2", "v0.5.4"); UsageError otherwise."""
    match = re.fullmatch(r"v?(\d{1,3})\.(\d{1,3})(?:\.(\d{1,3}))?(?:\.post\d+|rc\d+|\.dev\d+)*", str(release).strip())
    if not match:
        raise UsageError(f"expected an SGLang release such as {SGLANG_RELEASE} or 0.4.6.post1, got "
                         f"{str(release)[:40]!r}", field="--sglang-version")
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


@dataclass(frozen=True, slots=True)
class ReleaseRules:
    """What changes in SGLang's start-up memory between releases (the module docstring)."""

    release: str
    era: str  # "0.4" (before 0.4.7), "0.4.7" (to 0.5.2) or "0.5.3" (on)
    req_pool_extra: int  # rows the req_to_token pool holds beyond max_num_reqs (1 before 0.4.7)


# The merge dates of the pull requests that brought each era's mem_fraction_static rule: a log dated
# before one cannot have run its rule (the log's own timestamps; used where it states no release).
ERA_MERGED = (("2025-06-10", "0.4.7"), ("2025-09-27", "0.5.3"))  # sgl-project/sglang#7054, #10975


def release_at(date: str | None) -> str:
    """The era (as a release) a log of `date` ("YYYY-MM-DD") can have run; the current rules when unknown.
    A log dated after a merge may still run an older release: the corpus records the release where
    a log states it."""
    if not date:
        return SGLANG_RELEASE
    era = "0.4.0"
    for merged, release in ERA_MERGED:
        if str(date) >= merged:
            era = release
    return era


def release_rules(release: str) -> ReleaseRules:
    version = release_version(release)
    if version < OLDEST:
        # a 0.2 log (sgl-project/sglang#1191: Mixtral at tp=8 with mem_fraction_static 0.83 and 31
        # running requests) follows neither the fraction table nor the request rows of rule 1 and 3
        raise UsageError(f"SGLang {release} predates the releases whose rules kvplan models (0.3 on)",
                         field="--sglang-version")
    era = "0.5.3" if version >= ERAS[1] else "0.4.7" if version >= ERAS[0] else "0.4"
    return ReleaseRules(str(release).strip(), era, 1 if era == "0.4" else 0)


def draft_tokens(steps: int) -> int:
    """The tokens a request of SGLang's EAGLE worker (topk 1, `steps` = speculative_num_steps) has
    allocated at once in a decode step: topk x num_steps + num_draft_tokens = 2 x steps + 1
    (scheduler.py decode_mem_cache_buf_multiplier, which check_decode_mem asks per request, and
    init_memory_pool's draft_runner_cache_size per request: rule 4)."""
    return 2 * steps + 1


def batch_defaults(gpu_mem_mib: float, tp: int, era: str) -> tuple[int, int]:
    """(chunked_prefill_size, cuda_graph_max_bs) SGLang sets for a GPU of `gpu_mem_mib` MiB."""
    if era == "0.4":
        small = gpu_mem_mib < 25_000
        return (2048, 8 if tp < 4 else 80) if small else (8192, 160)
    if era == "0.4.7":
        if gpu_mem_mib < 35 * 1024:
            return 2048, 8 if tp < 4 else 80
        # the capture list of cuda_graph_runner: up to 160, to 256 above 96 GiB
        return (8192 if gpu_mem_mib < 160 * 1024 else 16384), (256 if gpu_mem_mib > 96 * 1024 else 160)
    big = tp >= 4
    if gpu_mem_mib < 20 * 1024:
        return 2048, 8
    if gpu_mem_mib < 35 * 1024:
        return 2048, 80 if big else 24
    if gpu_mem_mib < 60 * 1024:
        return 4096, 160 if big else 32
    if gpu_mem_mib < 160 * 1024:
        return 8192, 512 if big else 256
    return 16384, 512


def default_mem_fraction(gpu_mem_mib: float, tp: int, era: str, chunked_prefill_size: int,
                         cuda_graph_max_bs: int, pp: int = 1, speculative: bool = False) -> tuple[float, str]:
    """SGLang's default mem_fraction_static, and why, in words (the module docstring)."""
    parallel = tp * pp
    if era == "0.4":
        table = ((16, 0.79), (8, 0.81), (4, 0.85), (2, 0.87), (1, 0.88))
        value = next(f for n, f in table if parallel >= n)
        return value, f"SGLang's default for tp x pp = {parallel} (releases before 0.4.7)"
    if era == "0.4.7":
        if gpu_mem_mib < 35 * 1024:
            reserve = (2.8 + parallel / 10) * 1024
        elif gpu_mem_mib < 90 * 1024:
            reserve = (9.5 + parallel / 2) * 1024
        elif gpu_mem_mib < 160 * 1024:
            reserve = (12 + parallel / 2) * 1024
        else:
            reserve = 32 * 1024
    else:
        reserve = 512 + max(chunked_prefill_size, 2048) * 1.5 + cuda_graph_max_bs * 2 + parallel / 8 * 1024
        if gpu_mem_mib > 60 * 1024:
            reserve = max(reserve, 10 * 1024)
        if speculative:
            reserve += SPECULATIVE_RESERVE_MIB
    value = round((gpu_mem_mib - reserve) / gpu_mem_mib, 3)
    return value, (f"SGLang's default: {reserve / 1024:.2f} GiB of the GPU's {gpu_mem_mib / 1024:.2f} GiB kept for "
                   f"activations and CUDA graphs (the {era} rule)")


def cell_size(layout) -> int:
    """KV bytes of one token on one rank, as SGLang's pool lays it out (the module docstring)."""
    total = 0
    for g in layout.groups:
        if g.kind == "state":
            raise UsageError("models with recurrent state (Mamba, gated DeltaNet) are not modelled for engine "
                             "sglang yet", field="--engine")
        total += g.bytes_per_token  # sliding layers as full ones
    return total


@dataclass(frozen=True, slots=True)
class SGLangMemory:
    """SGLang's start-up memory on one GPU and what follows from it; bytes unless named otherwise."""

    release: str
    gpu_memory: int  # the device's memory as CUDA reports it
    mem_fraction_static: float
    mem_fraction_reason: str
    chunked_prefill_size: int
    cuda_graph_max_bs: int
    pre_load: int  # free before the weights load (pre_model_load_memory)
    weights: int  # this rank's weights
    post_load: int  # free after the weights load
    kv_pool: int  # rest: what the token pool may take
    cell_size: int  # KV bytes per token on this rank
    max_total_num_tokens: int
    context_len: int
    max_num_reqs: int  # the req_to_token pool's rows for requests
    max_running_requests: int
    page_size: int
    starts: bool
    reason: str | None  # why it does not start, in SGLang's words
    speculative_steps: int = 0  # speculative_num_steps (topk 1), 0 without speculative decoding
    draft_kv_pool: int = 0  # the draft's KV pool: the pool's tokens at the draft layers' cell size
    swa_tokens: int = 0  # the hybrid SWA pool's sliding-layer tokens (rule 5), 0 on one pool
    swa_full_tokens_ratio: float = 0.0  # the ratio that split it, 0 on one pool

    @property
    def hybrid(self) -> bool:
        """Whether SGLang runs this model on its hybrid SWA pool (rule 5)."""
        return self.swa_full_tokens_ratio > 0

    @property
    def serving_tokens(self) -> int:
        """The tokens the serving engine's one pool holds (kvplan/sim/sglang.py): max_total_num_tokens,
        on a hybrid pool the smaller of its two (rule 5: a running request holds every token in both)."""
        return min(self.max_total_num_tokens, self.swa_tokens) if self.hybrid else self.max_total_num_tokens

    def to_dict(self) -> dict:
        out = asdict(self)
        if not self.speculative_steps:  # a run without speculation reports what it always did
            del out["speculative_steps"], out["draft_kv_pool"]
        if not self.hybrid:  # nor does one on a single pool
            del out["swa_tokens"], out["swa_full_tokens_ratio"]
        return out


def request_rows(tokens: int, context_len: int) -> int:
    """max_num_reqs of a pool of `tokens` (the module docstring, rule 3): min(max(int(tokens /
    context_len x 512), 2048), 4096)."""
    return min(max(int(tokens / context_len * 512), 2048), 4096)


def max_running(tokens: int, rows: int, given: int | None = None) -> int:
    """max_running_requests of a pool of `tokens` whose req_to_token pool holds `rows` rows
    (request_rows of the profiled tokens, + 1 before 0.4.7): the scheduler runs min(tokens // 2,
    rows), or min(`given`, rows)."""
    return min(tokens // 2 if given is None else given, rows)


def startup_on(gpu, **options) -> SGLangMemory:
    """startup_memory on one GPU (the catalog's, or any object with its figures): its CUDA total for
    the memory free before the weights, nvidia-smi's total for the fraction and batch defaults, its
    link (PCIe or NVLink) for the distributed init at tp > 1; `options` the rest of startup_memory's."""
    return startup_memory(gpu_memory=getattr(gpu, "cuda_memory_bytes", 0) or gpu.memory_bytes,
                          smi_memory=gpu.memory_bytes, link_bytes_per_s=getattr(gpu, "link_bytes_per_s", 0.0),
                          **options)


def not_enough_memory(mem_fraction_static: float) -> str:
    return ("Not enough memory. Please try to increase --mem-fraction-static. "
            f"Current value: mem_fraction_static={mem_fraction_static}")


def startup_memory(*, layout, weights: int, gpu_memory: int, tp: int, context_len: int,
                   release: str = SGLANG_RELEASE, mem_fraction_static: float | None = None,
                   chunked_prefill_size: int | None = None, max_running_requests: int | None = None,
                   page_size: int = DEFAULT_PAGE_SIZE, model_type: str = "",
                   pre_load: int | None = None, link_bytes_per_s: float = 0.0,
                   smi_memory: int | None = None, speculative_steps: int = 0,
                   draft_cell_size: int = 0, architectures=(), swa_full_tokens_ratio: float | None = None,
                   disable_hybrid_swa_memory: bool = False) -> SGLangMemory:
    """SGLang's pool on one GPU: `layout` the per-rank KV layout (kvplan.model.build.build_layout with
    the KV dtype and tp), `weights` this rank's weight bytes, `gpu_memory` the device's memory as
    CUDA reports it, `context_len` the model's (or --context-length), the overrides as SGLang's
    flags, `link_bytes_per_s` the GPU's link to its peers (gpus.GPU.link_bytes_per_s: NVLink or PCIe);
    `pre_load` replaces the modelled free memory before loading (a log's own figure); `smi_memory`
    the device's memory.total as nvidia-smi prints it (gpus.GPU.memory_bytes), from which SGLang
    sets its fraction and batch defaults (rule 1), `gpu_memory` when not given; `speculative_steps`
    and `draft_cell_size` (the draft layers' KV bytes per token) a speculative server (rule 4);
    `model_type` and `architectures` (model_identity) whether the hybrid SWA pool applies, split at
    `swa_full_tokens_ratio` unless `disable_hybrid_swa_memory` (rule 5)."""
    if mem_fraction_static is not None and not 0 < mem_fraction_static <= 1:
        raise UsageError(f"expected a fraction in (0, 1], got {mem_fraction_static}", field="--mem-fraction-static")
    if swa_full_tokens_ratio is not None and not 0 < swa_full_tokens_ratio <= 64:
        raise UsageError(f"expected a ratio above 0 (at most 64), got {swa_full_tokens_ratio}",
                         field="--swa-full-tokens-ratio")
    rules = release_rules(release)
    hybrid = (not disable_hybrid_swa_memory and rules.era != "0.4" and hybrid_swa(model_type, architectures)
              and any(g.kind == "sliding" for g in layout.groups) and any(g.kind != "sliding" for g in layout.groups))
    if hybrid and speculative_steps:
        raise UsageError("speculative decoding on SGLang's hybrid sliding-window pool (its draft pool sized from "
                         "the split pool) is not modelled", field="--speculative")
    if swa_full_tokens_ratio is not None and not hybrid:
        raise UsageError("applies to a model SGLang runs on its hybrid sliding-window pool (Llama 4); this one "
                         "runs on one pool", field="--swa-full-tokens-ratio")
    gpu_mem_mib = (smi_memory or gpu_memory) / MiB
    chunk, graph_bs = batch_defaults(gpu_mem_mib, tp, rules.era)
    chunk = chunked_prefill_size if chunked_prefill_size is not None else chunk
    if mem_fraction_static is None:
        fraction, why = default_mem_fraction(gpu_mem_mib, tp, rules.era, chunk, graph_bs,
                                             speculative=speculative_steps > 0)
    else:
        fraction, why = mem_fraction_static, "as --mem-fraction-static gives it"
    if pre_load is None:
        pre_load = gpu_memory - CUDA_CONTEXT - dist_init(tp, link_bytes_per_s)
    post_load = pre_load - weights
    cell = cell_size(layout)
    rest = post_load / GiB - pre_load / GiB * (1 - fraction)
    tokens = max(int(rest * GiB) // cell, 0) if cell else 0
    tokens = tokens // page_size * page_size
    estimated = request_rows(tokens, context_len)
    swa, ratio = 0, 0.0
    if hybrid:  # rule 5: the request rows from the profiled tokens, the pool split after
        ratio = SWA_FULL_TOKENS_RATIO if swa_full_tokens_ratio is None else float(swa_full_tokens_ratio)
        tokens, swa = hybrid_split(tokens, layout, ratio, page_size)
    if speculative_steps and tokens > 0:  # rule 4: the request rows stay those of the profiled pool
        given = SPECULATIVE_MAX_RUNNING if max_running_requests is None else max_running_requests
        running = min(given, estimated + rules.req_pool_extra)
        tokens += estimated * draft_tokens(speculative_steps) + SPECULATIVE_POOL_BUFFER
    else:  # the request rows those of the profiled pool (rule 5 splits the tokens after)
        running = max_running(tokens, estimated + rules.req_pool_extra, max_running_requests)
    reason = None
    if weights > gpu_memory:
        reason = (f"CUDA out of memory while loading the weights: they need {weights / GiB:.2f} GiB on each GPU, "
                  f"and the GPU has {gpu_memory / GiB:.2f} GiB.")
    elif tokens <= 0:
        reason = not_enough_memory(fraction)
    return SGLangMemory(rules.release, gpu_memory, fraction, why, chunk, graph_bs, pre_load, weights, post_load,
                        max(int(rest * GiB), 0), cell, tokens, context_len, estimated, running, page_size,
                        reason is None, reason, speculative_steps, tokens * draft_cell_size if speculative_steps else 0,
                        swa, ratio)
