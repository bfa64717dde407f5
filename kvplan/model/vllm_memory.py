"""What vLLM allocates at start-up, and whether it starts: the KV pool it will log.

vLLM V1 (`Worker.determine_available_memory`, vllm/v1/worker/gpu_worker.py, releases 0.9 and
later) takes a snapshot of the GPU after the CUDA context and NCCL are up, loads the weights,
runs one profiling forward pass of `max_num_batched_tokens` dummy tokens (and a sampler pass of
`min(max_num_seqs, max_num_batched_tokens)` rows), and then sets

    available KV = total x gpu_memory_utilization - (weights + activation peak + non-torch increase)

where `total` is what CUDA reports to the process (`torch.cuda.mem_get_info()[1]`, a little less
than nvidia-smi's figure), the activation peak is PyTorch's peak allocation during the profiling
run above what the weights hold, and the non-torch increase is memory allocated outside PyTorch
while profiling (cuBLAS and attention workspaces; NCCL and custom all-reduce buffers at tp > 1).
Before release 0.20 CUDA graphs were captured after the KV cache was allocated, in the memory
the utilization leaves over, so they did not shrink the pool. Since 0.20 (vllm-project/vllm#38284:
0.18-0.19 had it behind VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS, the 0.20.0 wheel turns it on,
though its log line says "default since v0.21.0") vLLM captures them once against a dummy KV
cache while profiling, logs "Estimated CUDA graph memory: X GiB total" and takes that from the
pool too; the same change raised the default utilization from 0.9 to 0.92. `--vllm-version` picks the rules (default: VLLM_RELEASE, the
current release; its CLI reference says "If unspecified, will use the default value of 0.92",
https://docs.vllm.ai/en/stable/cli/serve/). Prefix caching, on by default, also changes what a
hybrid recurrent-state model keeps per request (kvplan/model/vllm_kv_groups.py): since the
releases that cache Mamba state ("align" mode) one request holds two state pages per group.

The activation peak is modelled from the tensors alive at the two peaks of vLLM's profiling run
(`profile_run` in vllm/v1/worker/gpu_model_runner.py, every release 0.10-0.33: `_dummy_run` of
max_num_batched_tokens tokens spread over R = min(max_num_seqs, max_num_batched_tokens) dummy
requests, whose intermediate tensors are freed when the forward returns while its hidden states
stay alive, then `_dummy_sampler_run` over the R rows, one per request, inside the measured
window). The peak is the larger of the two, not their sum:

    forward = N x (A_HIDDEN x hidden + A_MLP x mlp_width / tp) x act_bytes
    sampler = (N + R) x hidden x act_bytes + R x vocab x k(release)
    peak = max(forward, sampler)

The logits are the full vocabulary on every rank (the vocab-parallel head is all-gathered, so
the sampler term does not shrink with TP) and are not chunked. k, the bytes the sampler holds
per logit, follows the sampler path (SAMPLER_BYTES): the V1 runner's top-k/top-p over a full sort
(bf16 logits, their float32 copy, sorted values and int64 indices, the sort's temporary buffer and
index input: 38 B; four sources of the corpus with the whole breakdown give 38.3-38.6) up to 0.16;
FlashInfer's top-k/top-p sampling from the logits (the bf16 logits, the float32 copy, the masked
logits and the probabilities: 14 B), and the in-place Triton kernel of 0.17 on, about as much.
Which path a server takes depends on its release and on whether FlashInfer is installed
(`EngineOptions.flashinfer`; vLLM logs "Using FlashInfer for top-p & top-k sampling" or "FlashInfer
is not available"): from 0.9.0 (vllm-project/vllm#15777, the FlashInfer 0.2.3 API) to 0.11.0 the V1
sampler takes FlashInfer whenever it is installed, as it is in vLLM's Docker image (a `pip
install vllm` has it only as the [flashinfer] extra then); 0.11.1 turned it off by default
(vllm-project/vllm#26859) until the Triton kernel (0.17) and FlashInfer again (0.21,
vllm-project/vllm#40376). The corpus's 0.10-0.11.0 logs agree with their own sampler line: 14 B
where they print "Using FlashInfer", 38 B where "FlashInfer is not available". (The V2 model
runner, every model's from 0.29, profiles a
sampler pass without top-k/top-p, 2 B a logit, until 0.33; the corpus's 0.29 logs, gpt-oss-20b on
L4s, leave about 2 GiB more than that would, so 0.29 keeps the 14 B until logs with the whole
breakdown show where it goes.) The dummy requests of the profile (temperature 0.5, top-p 0.9, top-k
the vocabulary less one) take the costliest path of each release.

The verdicts use vLLM's own wording (vllm/v1/core/kv_cache_utils.py):
- the weights alone pass the GPU: loading ends in CUDA out of memory;
- nothing is left for the KV cache: "No available memory for the cache blocks";
- one request of max_model_len needs more KV than the pool: "To serve at least one request with
  the model's max seq len ...", with the longest context that would fit, as vLLM estimates it;
- the pool is allocated, and then the sampler warm-up runs out of memory: "CUDA out of memory
  occurred when warming up sampler with N dummy requests" (vllm/v1/worker/gpu_model_runner.py).
  After the KV cache, `compile_or_warm_up_model` (gpu_worker.py) captures the CUDA graphs and then
  runs a forward pass of N = min(max_num_seqs, max_num_batched_tokens) tokens and the sampler over
  its N rows, with the profile's own sampling parameters: the profile's peak covered it, and the
  activation it freed is free again (no empty_cache runs after the KV cache). What it has:
      free = total x (1 - utilization) + activation peak - before profile - graphs outside the pool
  where "before profile" is what was in use before vLLM's snapshot (the CUDA context, the NCCL
  communicator pynccl builds at init) and the graphs count before 0.20, when they were captured
  outside the pool. At 0.95 of an 80 GB GPU that is about 4 GiB plus the freed peak: llm-d's
  Qwen3-32B at tp=2 on 0.11.0 (llm-d/llm-d#787) allocated 41.87 GiB of KV (kvplan: 41.53) and then
  failed here, through graphs larger than kvplan's estimate (two sets of 67, FULL_AND_PIECEWISE).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from kvplan.errors import UsageError

GiB = 2**30
VLLM_RELEASE = "0.29"  # the current release (v0.29.0, September 2026), whose rules are the default
GRAPHS_PROFILED_SINCE = 20  # minor release from which CUDA graph memory comes out of the pool (the
# 0.20.0 wheel already turns VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS on, though its log says 0.21)
# "GPU KV cache size" of a hybrid model: a 0.13 log (gemma-3-1b-it) prints num_blocks // groups x
# block, a 0.24 log (a gated-DeltaNet hybrid) the group-aware int(concurrency x max_model_len);
# releases between take the older form until a log shows otherwise.
GROUP_AWARE_TOKENS_SINCE = 24
OLDEST_RELEASE = 9  # the V1 engine's memory profile, as modelled here, from 0.9 on


@dataclass(frozen=True, slots=True)
class ReleaseRules:
    """What changes in vLLM's start-up memory from one release to another."""

    release: str
    default_utilization: float  # --gpu-memory-utilization when not given
    graphs_in_pool: bool  # CUDA graph memory is profiled and taken from the KV pool
    state_prefix_caching: bool  # hybrid recurrent-state models cache state with prefix caching on
    group_aware_tokens: bool  # "GPU KV cache size" as int(concurrency x max_model_len)


def release_version(release: str) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a vLLM release as written ("0.11" is 0.11.0); None for anything else."""
    match = re.fullmatch(r"v?(\d{1,3})\.(\d{1,3})(?:\.(\d{1,3}))?(?:\.\d{1,3})?(?:\.post\d+|rc\d+|\.dev\d+)*"
                         r"(?:\+[\w.]+)?", str(release).strip())
    return (int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)) if match else None


def release_number(release: str) -> tuple[int, int] | None:
    """(major, minor) of a vLLM release as written ("0.11", "0.21.1", "v0.29.0", "0.10.1.1"); None for
    anything else."""
    version = release_version(release)
    return version[:2] if version else None


def release_rules(release: str) -> ReleaseRules:
    """The rules of vLLM `release` ("0.11", "0.21.1", "v0.29.0"); UsageError for anything else."""
    major, minor = release_number(release) or (0, 0)
    if major == 0 and minor < OLDEST_RELEASE:
        raise UsageError(f"expected a vLLM release from 0.{OLDEST_RELEASE} on, such as {VLLM_RELEASE} or "
                         f"0.11.2, got {str(release)[:40]!r}", field="--vllm-version")
    new = major > 0 or minor >= GRAPHS_PROFILED_SINCE
    return ReleaseRules(str(release).strip(), 0.92 if new else 0.9, new, new,
                        major > 0 or minor >= GROUP_AWARE_TOKENS_SINCE)


DEFAULT_UTILIZATION = release_rules(VLLM_RELEASE).default_utilization  # vLLM's default, current release

# Live tensors at the activation peak (see the module docstring).
A_HIDDEN = 4  # residual stream, its normed copy, attention output, one more hidden-sized buffer
A_MLP = 3  # the gate_up projection's output (2 x width) and the activation's output (1 x width)
# Bytes the profile's sampler pass holds per logit (see the module docstring), by release:
# (first minor release, bytes).
SAMPLER_BYTES = ((OLDEST_RELEASE, 38), (17, 14))
FLASHINFER_SAMPLER_BYTES = 14
# The releases whose V1 sampler takes FlashInfer whenever it is installed: [first, last] as
# (major, minor, patch); outside them the release's own path (SAMPLER_BYTES) holds either way.
FLASHINFER_BY_DEFAULT = ((0, 9, 0), (0, 11, 0))
# Non-torch memory allocated while profiling: cuBLAS and attention workspaces, lazily loaded
# kernels; 0.1 GiB at tp=1, as the corpus's whole breakdowns show it (0.07-0.14 GiB: llm-d's H100
# runs, a Qwen3-4B log of 0.10.2). At tp > 1 also one NCCL communicator's buffers: 0.10-0.24 build
# the TP group's torch communicator lazily, at the logits' all-gather inside the profile
# (LogitsProcessor._gather_logits -> dist.all_gather_into_tensor); from 0.25 that all-gather takes
# the pynccl communicator made at init, whose ring and tree buffers NCCL 2.22 and later connect at
# its first collective when cuMem is on (vLLM 0.11 on), inside the profile as well. NCCL's own
# measurement of one communicator (NVIDIA/nccl#964, 4 A100s under PyTorch): "for group with only 2
# devices, it requires 544 MB. And for group with more than 2 devices, it requires 688 MB"; llm-d's
# two tp=2 H100 logs show 0.54-0.55 GiB in all. (NVLink SHARP buffers, only above 2 GPUs on an
# NVSwitch node, are 16 channels x 2 x 1 MiB per rank with NCCL 2.21 on: 0.125 GiB at tp=4.)
NON_TORCH_TP1 = int(0.1 * GiB)
NCCL_COMMUNICATOR_2 = 544 * 10**6
NCCL_COMMUNICATOR_MORE = 688 * 10**6
# In use before vLLM's memory snapshot (Worker.init_device, after the distributed environment is
# up), so outside the budget, in the share the utilization leaves: the CUDA context (about 0.5 GiB
# with lazy module loading), and at tp > 1 the communicator pynccl builds at init (the sizes above).
CUDA_CONTEXT = int(0.5 * GiB)


def nccl_communicator(tp: int) -> int:
    """GPU memory of one NCCL communicator over `tp` ranks (0 at tp=1; see NCCL_COMMUNICATOR_2)."""
    return 0 if tp <= 1 else NCCL_COMMUNICATOR_2 if tp == 2 else NCCL_COMMUNICATOR_MORE


def non_torch_memory(tp: int) -> int:
    """Non-torch memory vLLM's profile measures on each of `tp` ranks (see NON_TORCH_TP1)."""
    return NON_TORCH_TP1 + nccl_communicator(tp)


def before_profile(tp: int) -> int:
    """Memory in use on each of `tp` ranks before vLLM's snapshot (see CUDA_CONTEXT)."""
    return CUDA_CONTEXT + nccl_communicator(tp)


# CUDA graphs: a base plus a share per layer at vLLM's default capture sizes up to 512, scaled by
# how many sizes are captured (the capture's memory is its largest graph plus a little per graph
# more: vLLM's own estimate, profile_cudagraph_memory, counts it so).
CUDA_GRAPH_BASE = int(0.25 * GiB)
CUDA_GRAPH_PER_LAYER = int(0.008 * GiB)
CUDA_GRAPH_CAP = 512  # the largest default capture size (min(2 x max_num_seqs, 512, max_num_batched_tokens))
GPT_OSS_CAPTURE = 1024  # gpt-oss models capture up to 1,024 whatever max_num_seqs is (vLLM's override)


def capture_sizes(max_num_seqs: int, max_num_batched_tokens: int, cap: int | None = None) -> list[int]:
    """vLLM's default CUDA graph capture sizes (VllmConfig._set_cudagraph_sizes, 0.11.1 on): 1, 2,
    4, then steps of 8 to 248 and of 16 from 256, up to min(2 x max_num_seqs, 512) or `cap`, and
    never above max_num_batched_tokens."""
    top = min(cap if cap is not None else min(2 * max_num_seqs, CUDA_GRAPH_CAP), max_num_batched_tokens)
    sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, max(top, 256) + 1, 16))
    return [n for n in sizes if n <= top]


DEFAULT_CAPTURE = capture_sizes(CUDA_GRAPH_CAP, 2 * CUDA_GRAPH_CAP)  # the sizes CUDA_GRAPH_BASE/_PER_LAYER stand for


def flashinfer_decides(release: str) -> bool:
    """Whether FlashInfer being installed changes the profile's sampler in `release` (0.9-0.11.0)."""
    first, last = FLASHINFER_BY_DEFAULT
    return first <= (release_version(release) or (0, 0, 0)) <= last


def sampler_bytes(release: str, flashinfer: bool = True) -> int:
    """Bytes per logit of the profile's sampler pass in `release`, with or without FlashInfer
    installed (see the module docstring)."""
    if flashinfer and flashinfer_decides(release):
        return FLASHINFER_SAMPLER_BYTES
    major, minor = release_number(release) or (0, 0)
    minor = 10_000 if major > 0 else minor
    return [b for since, b in SAMPLER_BYTES if minor >= since][-1]


def cuda_graph_memory(layers: int, max_num_seqs: int, max_num_batched_tokens: int, cap: int | None = None) -> int:
    """CUDA graph memory of vLLM's default capture (see CUDA_GRAPH_BASE)."""
    share = len(capture_sizes(max_num_seqs, max_num_batched_tokens, cap)) / len(DEFAULT_CAPTURE)
    return int((CUDA_GRAPH_BASE + CUDA_GRAPH_PER_LAYER * layers) * share)


SERVE_BATCH_LARGE = (8192, 1024)  # (max_num_batched_tokens, max_num_seqs), see default_batch
SERVE_BATCH_SMALL = (2048, 256)


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """vLLM's start-up options that change its memory, with vLLM's names."""

    gpu_memory_utilization: float | None = None  # None: the release's default
    max_num_batched_tokens: int | None = None  # None: vLLM's default for the GPU
    max_num_seqs: int | None = None
    enforce_eager: bool = False
    release: str = VLLM_RELEASE
    enable_prefix_caching: bool = True
    flashinfer: bool = True  # FlashInfer installed (vLLM's Docker image); decides the sampler in 0.9-0.11.0

    @property
    def rules(self) -> ReleaseRules:
        return release_rules(self.release)

    @property
    def utilization(self) -> float:
        return (self.rules.default_utilization if self.gpu_memory_utilization is None
                else self.gpu_memory_utilization)

    @property
    def state_pages(self) -> int:
        """Pages of recurrent state one request keeps per state group (vllm_kv_groups.py)."""
        return 2 if self.enable_prefix_caching and self.rules.state_prefix_caching else 1


def default_batch(gpu_name: str, cuda_total: int) -> tuple[int, int]:
    """vLLM's `vllm serve` defaults (EngineArgs.get_batch_defaults): 8,192 batched tokens and 1,024
    sequences on GPUs of at least 70 GiB other than the A100, else 2,048 and 256."""
    if cuda_total >= 70 * GiB and "a100" not in gpu_name.lower():
        return SERVE_BATCH_LARGE
    return SERVE_BATCH_SMALL


@dataclass(frozen=True, slots=True)
class StartupMemory:
    """vLLM's start-up memory on one GPU, in bytes, and its verdict."""

    total: int  # as CUDA reports it
    utilization: float
    requested: int  # total x utilization
    weights: int
    activation: int
    non_torch: int
    kv: int  # requested - weights - activation - non_torch [- cuda_graphs] (negative: no start)
    cuda_graphs: int
    cuda_graphs_in_pool: bool  # release 0.20 on: the graphs come out of the pool
    max_num_batched_tokens: int
    max_num_seqs: int
    release: str
    before_profile: int = 0  # in use before vLLM's memory snapshot, outside the budget (CUDA context, NCCL)
    warmup: int = 0  # what the sampler warm-up after the KV cache holds at its peak

    @property
    def free_after_sizing(self) -> int:
        """What the GPU has free once the KV cache is allocated and the CUDA graphs captured: the
        share the utilization leaves out, plus the activation peak the profile freed, less what was
        in use before the snapshot and the graphs captured outside the pool (the module docstring)."""
        outside = 0 if self.cuda_graphs_in_pool else self.cuda_graphs
        return self.total - self.requested + self.activation - self.before_profile - outside

    def breakdown(self) -> dict:
        return {**asdict(self), "free_after_sizing": self.free_after_sizing}


def activation_peak(hidden: int, mlp_width: int, vocab: int, tp: int, act_bytes: int,
                    tokens: int, seqs: int, release: str = VLLM_RELEASE, flashinfer: bool = True,
                    sampler: bool = True) -> int:
    """Peak activation bytes of vLLM's profiling run (see the module docstring); `sampler` False:
    a pipeline stage before the last, which computes no logits and samples nothing
    (kvplan/model/parallel.py)."""
    rows = min(seqs, tokens)
    forward = tokens * (A_HIDDEN * hidden + A_MLP * -(-mlp_width // tp)) * act_bytes
    if not sampler:
        return forward
    sampling = (tokens + rows) * hidden * act_bytes + rows * vocab * sampler_bytes(release, flashinfer)
    return max(forward, sampling)


def warmup_peak(hidden: int, mlp_width: int, vocab: int, tp: int, act_bytes: int,
                tokens: int, seqs: int, release: str = VLLM_RELEASE, flashinfer: bool = True,
                sampler: bool = True) -> int:
    """Peak bytes of the sampler warm-up after the KV cache is allocated (`compile_or_warm_up_model`
    in vllm/v1/worker/gpu_worker.py, 0.10 on): a forward pass of R = min(max_num_seqs,
    max_num_batched_tokens) tokens, then the sampler over its R rows, with the profile's own
    sampling parameters; the profile's peak covered it, and the activation it freed is there again."""
    rows = min(seqs, tokens)
    return activation_peak(hidden, mlp_width, vocab, tp, act_bytes, rows, rows, release, flashinfer, sampler)


def startup_memory(*, total: int, gpu_name: str, weights: int, hidden: int, mlp_width: int,
                   vocab: int, layers: int, tp: int, act_bytes: int,
                   options: EngineOptions, model_type: str = "", sampler: bool = True,
                   groups_at_init: int = 0, groups_in_profile: int = 0) -> StartupMemory:
    """vLLM's start-up memory on one GPU (the module docstring). With data, expert or pipeline
    parallelism (kvplan/model/parallel.py): `sampler` False for a pipeline stage before the last
    (no logits: no sampler pass, and no all-gather to connect the TP communicator in), and the
    NCCL communicators of its other process groups, made at init (`groups_at_init` bytes, before
    the snapshot) and connected inside the profile (`groups_in_profile`, non-torch)."""
    tokens, seqs = default_batch(gpu_name, total)
    tokens = options.max_num_batched_tokens or tokens
    seqs = options.max_num_seqs or seqs
    rules = options.rules
    requested = int(total * options.utilization)
    activation = activation_peak(hidden, mlp_width, vocab, tp, act_bytes, tokens, seqs, rules.release,
                                 options.flashinfer, sampler)
    # the TP communicator connects at the logits' all-gather (NON_TORCH_TP1), which a stage before
    # the last of a pipeline never runs
    non_torch = (non_torch_memory(tp) if sampler else NON_TORCH_TP1) + groups_in_profile
    cap = GPT_OSS_CAPTURE if model_type == "gpt_oss" else None
    graphs = 0 if options.enforce_eager else cuda_graph_memory(layers, seqs, tokens, cap)
    kv = requested - weights - activation - non_torch - (graphs if rules.graphs_in_pool else 0)
    warmup = warmup_peak(hidden, mlp_width, vocab, tp, act_bytes, tokens, seqs, rules.release, options.flashinfer,
                         sampler)
    return StartupMemory(total, options.utilization, requested, weights, activation, non_torch, kv,
                         graphs, rules.graphs_in_pool, tokens, seqs, rules.release,
                         before_profile(tp) + groups_at_init, warmup)


def warmup_reason(rows: int) -> str:
    """vLLM's failure when the sampler warm-up after the KV cache runs out of memory
    (`_dummy_sampler_run`, vllm/v1/worker/gpu_model_runner.py)."""
    return (f"CUDA out of memory occurred when warming up sampler with {rows} dummy requests. Please try "
            "lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine.")


def no_kv_reason() -> str:
    return ("No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
            "initializing the engine.")


def max_len_reason(max_model_len: int, needed: int, available: int, estimated: int) -> str:
    estimate = (f"Based on the available memory, the estimated maximum model length is {estimated}. "
                if estimated > 0 else "")
    return (f"To serve at least one request with the model's max seq len ({max_model_len}), "
            f"({needed / GiB:.2f} GiB KV cache is needed, which is larger than the available KV cache "
            f"memory ({available / GiB:.2f} GiB). {estimate}Try increasing `gpu_memory_utilization` or "
            "decreasing `max_model_len` when initializing the engine.")


def long_max_len_reason(max_model_len: int, context: int) -> str:
    """vLLM's refusal of a max_model_len above the model's (ModelConfig's max-length check, which
    VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 turns into a warning)."""
    return (f"User-specified max_model_len ({max_model_len}) is greater than the derived max_model_len "
            f"({context}) of the model's config.json. To allow overriding this limit, set "
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (with caution: positions past it are not what the model was "
            "trained on).")


def weights_reason(weights: int, total: int) -> str:
    return (f"CUDA out of memory while loading the weights: they need {weights / GiB:.2f} GiB on each "
            f"GPU, and the GPU has a total capacity of {total / GiB:.2f} GiB.")
