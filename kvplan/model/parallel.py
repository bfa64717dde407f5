"""Expert, data and pipeline parallelism as vLLM runs them: who holds which weights and which KV.

vLLM's flags (vllm/config/parallel.py, ParallelConfig; `vllm serve --tensor-parallel-size T
--data-parallel-size D --pipeline-parallel-size P --enable-expert-parallel`) and what each does
to one GPU's memory:

- Tensor parallelism (T) splits every linear layer over T ranks (kvplan/model/weights.py).
- Data parallelism (D): D copies of the attention and dense layers, each its own engine core with
  its own scheduler and KV cache (vLLM's DPEngineCoreProc, one per DP rank, vllm/v1/engine/
  core.py). The MoE layers are not copied: "MoE layers will be sharded according to the product
  of the tensor ... and data parallel sizes" (ParallelConfig.data_parallel_size): without expert
  parallelism every expert is tensor-split over T x D ranks (FusedMoEParallelConfig.make,
  vllm/model_executor/layers/fused_moe/config.py, flattens TP across DP); with
  --enable-expert-parallel the EP group is those T x D ranks and each holds whole experts,
  ceil(E / EP) of them under vLLM's default "linear" placement (determine_expert_map: the first
  E mod EP ranks one more), its shared experts, router and attention tensor-split as before. A
  dense model under DP is D independent copies.
- Pipeline parallelism (P) splits the decoder layers into P stages (get_pp_indices,
  vllm/distributed/utils.py): L // P each, the remainder one more each to the stages before the
  last, counted back from the second to last; the first stage holds the input embedding (and a
  multimodal tower), the last the final norm and lm_head (both when the embedding is tied). Each
  stage keeps the KV of its own layers only, so a token's KV per GPU shrinks by about P. Each
  stage's worker profiles its own memory (only the last computes logits and samples, so the
  sampler's share of the activation peak is the last stage's alone) and the engine takes the
  smallest number of blocks of any stage for all of them (get_kv_cache_configs,
  vllm/v1/core/kv_cache_utils.py: "Change the num_blocks of each rank to the smallest among all
  ranks"): the stage with the fewest blocks decides the pool.

vLLM refuses expert parallelism on a model without experts (ModelConfig._verify_with_expert_
parallelism: "Number of experts in the model must be greater than 0 when expert parallelism is
enabled.") and kvplan refuses it the same way; more stages than layers leave a stage empty, which
vLLM does not run either.

NCCL communicators (kvplan/model/vllm_memory.py: at tp > 1 one communicator before the memory
snapshot, pynccl's, and one connected inside the profile): vLLM's initialize_model_parallel makes a
process group with a device communicator for each of TP, PP, DP and EP of more than one rank. The
PP group's and the DP group's are made at init and, like TP's, count before the snapshot; the EP
group of T x D ranks (when D > 1 and the model has experts) also carries the MoE layers'
dispatch and combine inside the profile run, so it is connected there as well (non-torch
memory), exactly as the TP group is. With D = 1 the EP group is the TP group's ranks and its
cost is already the TP rule's. Validated on the two parallel start-ups of
tests/data/vllm_startup_logs.yaml (DeepSeek-V2-Lite at tp=2 pp=2 on L4s; Qwen3-Coder-480B FP8 at
dp=8 with EP on H20s; tests/test_parallel.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvplan.errors import UsageError
from kvplan.model.spec import ModelSpec
from kvplan.model.vllm_memory import nccl_communicator
from kvplan.model.weights import WeightEstimate, moe_layer_indices, moe_shape

MAX_DEGREE = 1024  # the largest --dp / --pp taken (DeepSeek's decode ran EP144; PP beyond a few dozen is no deployment)
NODE_GPUS = 8  # GPUs that share one NVLink domain (an HGX / DGX node of 8): traffic beyond them crosses the network


@dataclass(frozen=True, slots=True)
class Parallelism:
    """vLLM's parallel sizes: tensor (tp), data (dp), pipeline (pp), and --enable-expert-parallel."""

    tp: int = 1
    dp: int = 1
    pp: int = 1
    expert_parallel: bool = False

    @property
    def plain(self) -> bool:
        """Tensor parallelism alone (what kvplan modelled before; its outputs stay as they were)."""
        return self.dp == 1 and self.pp == 1 and not self.expert_parallel

    @property
    def moe_ranks(self) -> int:
        """The ranks the routed experts are split over: T x D (whole experts with EP, widths without)."""
        return self.tp * self.dp

    @property
    def ep(self) -> int:
        """vLLM's EP size: T x D with --enable-expert-parallel, else 1."""
        return self.moe_ranks if self.expert_parallel else 1

    @property
    def gpus(self) -> int:
        return self.tp * self.dp * self.pp

    def to_dict(self) -> dict:
        return {"tp": self.tp, "dp": self.dp, "pp": self.pp, "enable_expert_parallel": self.expert_parallel,
                "ep": self.ep, "gpus": self.gpus}


def check_degrees(dp: int, pp: int) -> None:
    for flag, value in (("--dp", dp), ("--pp", pp)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DEGREE:
            raise UsageError(f"expected an integer from 1 to {MAX_DEGREE:,}, got {value!r}", field=flag)


def check(spec: ModelSpec, par: Parallelism) -> None:
    """Refuse what vLLM refuses (see the module docstring), naming the flag."""
    check_degrees(par.dp, par.pp)
    experts, _ = moe_shape(spec)
    if par.expert_parallel and not experts:
        raise UsageError(f"{spec.name} has no routed experts; vLLM refuses it: \"Number of experts in the model must "
                         "be greater than 0 when expert parallelism is enabled.\"", field="--enable-expert-parallel")
    if par.pp > len(spec.layers):
        raise UsageError(f"{par.pp} pipeline stages for {len(spec.layers)} decoder layers would leave a stage "
                         "without layers", field="--pp")


def pp_partition(layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage as vLLM splits them (get_pp_indices without VLLM_PP_LAYER_PARTITION)."""
    parts = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        parts[-i] += 1
    return parts


def stage_bounds(layers: int, pp: int) -> list[tuple[int, int]]:
    """[start, end) of each stage's layers."""
    out, start = [], 0
    for n in pp_partition(layers, pp):
        out.append((start, start + n))
        start += n
    return out


def stage_spec(spec: ModelSpec, start: int, end: int) -> ModelSpec:
    """The model as one pipeline stage sees it: its own decoder layers (what its KV is laid out for)."""
    return replace(spec, layers=spec.layers[start:end])


def experts_per_rank(spec: ModelSpec, par: Parallelism) -> int:
    """Routed experts one rank holds whole under EP (ceil(E / EP)); every expert without it."""
    experts, _ = moe_shape(spec)
    return -(-experts // par.ep) if par.expert_parallel else experts


def expert_bytes_per_gpu(spec: ModelSpec, weights: WeightEstimate, par: Parallelism, gpu=None,
                         mxfp4_backend: str = "auto") -> int:
    """The routed experts of every MoE layer one rank holds: whole experts under EP (an MXFP4
    expert padded as its kernels need, unsplit), else every expert's 1 / (T x D) share."""
    if not par.expert_parallel:
        return weights.expert_bytes_per_gpu(par.moe_ranks, gpu, mxfp4_backend)
    experts, _ = moe_shape(spec)
    whole = weights.expert_bytes_per_gpu(1, gpu, mxfp4_backend)  # every expert, unsplit
    return -(-whole * experts_per_rank(spec, par) // experts)


def stage_weight_bytes(spec: ModelSpec, weights: WeightEstimate, par: Parallelism, stage: int, gpu=None,
                       mxfp4_backend: str = "auto") -> int:
    """What one GPU of pipeline stage `stage` loads: its layers' attention and dense parts split
    over TP (K/V projections copied where TP exceeds the KV heads), its MoE layers' routers whole
    and their experts as expert_bytes_per_gpu, the input embedding on the first stage (with a
    vision tower) and the lm_head on the last (both, tied, where the embedding is tied). With one
    stage it is the whole model per GPU."""
    tp, layers = par.tp, len(spec.layers)
    start, end = stage_bounds(layers, par.pp)[stage]
    moe = moe_layer_indices(spec)
    f_layers = (end - start) / layers
    f_moe = sum(1 for i in moe if start <= i < end) / len(moe) if moe else 0.0
    embed = weights.part_bytes("embeddings")
    router = weights.part_bytes("router")
    experts_split = -(-weights.part_bytes("experts") // tp)
    layer_parts = weights.split_bytes_per_gpu(tp) - experts_split - router - -(-embed // tp)
    first, last = stage == 0, stage == par.pp - 1
    if spec.tie_embeddings:
        table = -(-embed // tp) if first or last else 0
    else:
        head = embed // 2
        table = (-(-(embed - head) // tp) if first else 0) + (-(-head // tp) if last else 0)
    vision = -(-weights.part_bytes("vision") // tp) if first else 0
    if par.pp == 1:
        body = layer_parts + router + expert_bytes_per_gpu(spec, weights, par, gpu, mxfp4_backend)
    else:
        body = (round(layer_parts * f_layers) + round(router * f_moe)
                + round(expert_bytes_per_gpu(spec, weights, par, gpu, mxfp4_backend) * f_moe))
    return body + table + vision


def communicators(spec: ModelSpec, par: Parallelism) -> tuple[int, int]:
    """(bytes made at init, before vLLM's snapshot; bytes connected inside the profile) of the NCCL
    communicators of the process groups beyond TP's (see the module docstring)."""
    experts, _ = moe_shape(spec)
    init = nccl_communicator(par.pp) + nccl_communicator(par.dp)
    profile = 0
    if par.dp > 1 and experts:
        init += nccl_communicator(par.moe_ranks)
        profile += nccl_communicator(par.moe_ranks)
    return init, profile
