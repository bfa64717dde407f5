"""What vLLM allocates at start-up, and whether it starts: the KV pool it will log.

vLLM V1 (`Worker.determine_available_memory`, vllm/v1/worker/gpu_worker.py, releases 0.9 to
0.11) takes a snapshot of the GPU after the CUDA context and NCCL are up, loads the weights,
runs one profiling forward pass of `max_num_batched_tokens` dummy tokens (and a sampler pass of
`min(max_num_seqs, max_num_batched_tokens)` rows), and then sets

    available KV = total x gpu_memory_utilization - (weights + activation peak + non-torch increase)

where `total` is what CUDA reports to the process (`torch.cuda.mem_get_info()[1]`, a little less
than nvidia-smi's figure), the activation peak is PyTorch's peak allocation during the profiling
run above what the weights hold, and the non-torch increase is memory allocated outside PyTorch
while profiling (cuBLAS and attention workspaces; NCCL and custom all-reduce buffers at tp > 1).
CUDA graphs are captured after the KV cache is allocated, in the memory the utilization leaves
over, so they do not shrink the pool; `cuda_graph_bytes` is reported beside it as an estimate.

The activation peak is modelled from the tensors alive at the peak of one layer and at the
sampler (each term below is a count of live tensors, not a fitted curve):

    peak = N x (A_HIDDEN x hidden + A_MLP x mlp_width / tp) x act_bytes + S x vocab x A_LOGITS x 4 B

with N = max_num_batched_tokens, S = min(max_num_seqs, N), mlp_width the widest MLP a token
passes (the dense intermediate size, or top_k x the expert intermediate size plus shared experts
for MoE), and the sampler's float32 words per logit. A_HIDDEN and A_MLP are tensor counts;
A_LOGITS is the one constant set from logs (two of them, named below); every other cited log in
tests/data/vllm_startup_logs.yaml is held out (bench/vllm_memory_fidelity.py prints both parts).

The verdicts use vLLM's own wording (vllm/v1/core/kv_cache_utils.py):
- the weights alone pass the GPU: loading ends in CUDA out of memory;
- nothing is left for the KV cache: "No available memory for the cache blocks";
- one request of max_model_len needs more KV than the pool: "To serve at least one request with
  the model's max seq len ...", with the longest context that would fit, as vLLM estimates it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

GiB = 2**30
VLLM_RELEASE = "0.11"  # the release whose rules and defaults this follows
DEFAULT_UTILIZATION = 0.9  # vLLM's --gpu-memory-utilization default

# Live tensors at the activation peak (see the module docstring).
A_HIDDEN = 4  # residual stream, its normed copy, attention output, one more hidden-sized buffer
A_MLP = 3  # the gate_up projection's output (2 x width) and the activation's output (1 x width)
# The sampler's dummy pass over S rows of the whole vocabulary holds, per logit, float32 copies
# for the logits, their temperature-scaled form, the softmax, the log-softmax (logprobs) and the
# top-k/top-p sort (values plus int64 indices): 4+4+4+4+4+8 = 28 bytes, 7 words; the two
# gpt-oss-120b logs on one H100 (the fitted part of the corpus, where the sampler dominates:
# a 201,088-token vocabulary x 1,024 rows) say 9 words, so 9 it is.
A_LOGITS = 9
# Non-torch memory allocated while profiling: cuBLAS/attention workspaces, plus at tp > 1 the
# NCCL and custom all-reduce buffers. 0.25 GiB is the middle of the 0.1-0.35 GiB the tp=1 logs
# of the corpus show; 1 GiB at tp > 1 is a round figure the corpus does not yet pin down (its
# two tp=2 logs say 0.25 and 3.58 GiB).
NON_TORCH_TP1 = int(0.25 * GiB)
NON_TORCH_TP = int(1.0 * GiB)
# CUDA graphs (outside the pool, so they change no prediction): a rough estimate of a base plus a
# share per layer; no log in the corpus states the capture's size yet.
CUDA_GRAPH_BASE = int(0.25 * GiB)
CUDA_GRAPH_PER_LAYER = int(0.008 * GiB)


SERVE_BATCH_LARGE = (8192, 1024)  # (max_num_batched_tokens, max_num_seqs), see default_batch
SERVE_BATCH_SMALL = (2048, 256)


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """vLLM's start-up options that change its memory, with vLLM's names."""

    gpu_memory_utilization: float = DEFAULT_UTILIZATION
    max_num_batched_tokens: int | None = None  # None: vLLM's default for the GPU
    max_num_seqs: int | None = None
    enforce_eager: bool = False


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
    kv: int  # requested - weights - activation - non_torch (negative: vLLM does not start)
    cuda_graphs: int  # captured after the KV cache, outside the utilization share
    max_num_batched_tokens: int
    max_num_seqs: int

    def breakdown(self) -> dict:
        return asdict(self)


def activation_peak(hidden: int, mlp_width: int, vocab: int, tp: int, act_bytes: int,
                    tokens: int, seqs: int) -> int:
    """Peak activation bytes of vLLM's profiling run (see the module docstring)."""
    per_token = A_HIDDEN * hidden + A_MLP * -(-mlp_width // tp)
    return tokens * per_token * act_bytes + min(seqs, tokens) * vocab * A_LOGITS * 4


def startup_memory(*, total: int, gpu_name: str, weights: int, hidden: int, mlp_width: int,
                   vocab: int, layers: int, tp: int, act_bytes: int,
                   options: EngineOptions) -> StartupMemory:
    tokens, seqs = default_batch(gpu_name, total)
    tokens = options.max_num_batched_tokens or tokens
    seqs = options.max_num_seqs or seqs
    requested = int(total * options.gpu_memory_utilization)
    activation = activation_peak(hidden, mlp_width, vocab, tp, act_bytes, tokens, seqs)
    non_torch = NON_TORCH_TP if tp > 1 else NON_TORCH_TP1
    graphs = 0 if options.enforce_eager else CUDA_GRAPH_BASE + CUDA_GRAPH_PER_LAYER * layers
    kv = requested - weights - activation - non_torch
    return StartupMemory(total, options.gpu_memory_utilization, requested, weights, activation,
                         non_torch, kv, graphs, tokens, seqs)


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


def weights_reason(weights: int, total: int) -> str:
    return (f"CUDA out of memory while loading the weights: they need {weights / GiB:.2f} GiB on each "
            f"GPU, and the GPU has a total capacity of {total / GiB:.2f} GiB.")
