"""How long one serving step takes on one GPU of a tensor-parallel group: the physics, term by term.

A step of vLLM runs every layer once over the tokens it schedules (a prefill chunk of many tokens,
one token per decoding request). Its GPU time is the sum of the kernels it runs one after another
(the work is combined, not the larger of two separate estimates), and the engine core's host
time (scheduling, input preparation, the sampled tokens' bookkeeping) comes on top of it or
beside it:

    gpu  = layer_overhead x layers + moe_layer_overhead x moe_layers    fixed GPU time a step
         + lm_head x requests
         + linear(n)                          the weight matrices, for n tokens
         + kv_read x kv_per_token             decode attention reads every held token's KV
         + pairs x attention_per_pair         prefill attention: chunk x context token pairs
         + allreduce(n)                       tp > 1: two all-reduces per layer
    host = step_overhead + request_overhead x requests
    step = gpu + host                         synchronous scheduling (vLLM before 0.14, V0)
    step = max(gpu, host)                     async scheduling (vLLM's default from 0.14): the
                                              engine core prepares step n + 1 while the GPU runs n

vLLM's engine core loop (vllm/v1/engine/core.py) is schedule -> execute_model -> update_from_output;
with async scheduling (vllm/v1/core/sched/async_scheduler.py, vllm-project/vllm#19970, the default
since #27614) the scheduler runs one step ahead with placeholders for the tokens not yet sampled,
so the host work hides behind the GPU's until it is the longer. Detokenizing and streaming every
token happen in another process, the API server (AsyncLLM's output handler), and cost no engine
step: they are frontend_latency_s and stream_token_s below.

Names in lower case below (bandwidth_efficiency, gemm_tile_tokens, layer_overhead_s ...) are the
fields of the dataclass StepConstants: CONSTANTS holds their values (fitted, or measured or fixed
where a field says so), and a timing profile (`kvplan calibrate`) replaces the fitted ones. Names
in capitals (MIN_TILE_TOKENS, SHORT_WINDOW, PCIE_NCCL_SHARE ...) are module constants, which no
timing profile changes.

- linear(n): each GEMM is bound by reading its weights or by its FLOPs, whichever is slower:
  max(bytes read / (HBM x bandwidth_efficiency), 2 x params x n / (MAMF x gemm_efficiency(n))).
  MAMF is the GPU's measured maximum achievable matmul FLOP/s at the GEMMs' dtype (mamf_bf16_flops
  / mamf_fp8_flops in kvplan/model/gpus.json, with their source; a data-sheet peak is never
  reached). gemm_efficiency(n) = gemm_efficiency x n / (t x ceil(n / t)): tile quantization
  (NVIDIA, "Matrix Multiplication Background User's Guide"): the token dimension is computed in
  whole tiles of t rows, the smallest power of two that covers n between MIN_TILE_TOKENS (16, the
  tensor-core MMA's M) and gemm_tile_tokens (the large-GEMM tile); so 4 tokens cost the compute of
  16 (memory-bound anyway), 200 that of 256, and a large prefill reaches the ceiling.
  gemm_efficiency is what LLM-shaped GEMMs reach of the best shape's MAMF.
  Dense weights are read whole every step (the input embedding is a gather of n rows, so only the
  lm_head's copy of the vocabulary matrix counts). MoE experts: n tokens choosing top_k of E
  experts touch E x (1 - (1 - top_k / E)^n) distinct experts on average, and only those are read;
  each gets n x top_k / that many tokens, which sets its GEMM efficiency. Quantized checkpoints
  read their bytes as loaded (kvplan/model/weights.py); fp8 weights with fp8 activations (W8A8:
  fp8 checkpoints, compressed-tensors float8 groups, vLLM's online fp8) run at the GPU's fp8 MAMF
  where it has fp8 units; weight-only schemes (GPTQ, AWQ, MXFP4 on Hopper) compute in bf16.
- HBM: the data sheet's hbm_bytes_per_s (the default), or with achievable_hbm on (a switch, not
  fitted) the GPU's measured achievable bandwidth: hbm_achievable_bytes_per_s in kvplan/model/
  gpus.json, the best published copy / STREAM-like kernel on that GPU (BabelStream-style nvbench
  runs of NVIDIA's CCCL, RRZE's gpu-stream, AMD's rocprofiler-compute roofline; each entry cites
  its run), or for a GPU not measured HBM_DEFAULT_SHARE (0.859, the median measured share) of its
  data sheet: the memory analogue of MAMF. How much of the data sheet a copy reaches differs by
  part: the MI300-series parts 0.71-0.74, NVIDIA's 0.84-0.94, so an MI300X reads 14% slower
  relative to its data sheet than a GPU at the median. bandwidth_efficiency then means what LLM
  kernels reach of a copy's figure (refitted: 0.78; bench/timing_fidelity.py MEASURED_HBM). Not
  the default: held out by source it lowers the error overall (throughput 15.4 -> 11.6%, E2E 20.2
  -> 17.5%, ITL 19.1 -> 16.7%), of single requests' throughput and E2E, offline tables and ITL in
  every regime, and moves the SGLang MI300X MoE runs a third of the way (throughput +42% -> +30%),
  but it loses single requests' TTFT (13.6 -> 15.7%), light-load E2E, near-saturation throughput
  and E2E, closed loops' E2E and TTFT, and vLLM's MI300X runs (GLM-4.6 throughput -8% -> -13%):
  what the SGLang MI300X runs lack (+50-76% throughput, -30-70% ITL) is no bandwidth share, and
  the same GPU's vLLM runs are slow already.
- The lm_head runs on one token per request: its FLOPs are part of the per-request term.
- kv_per_token: the KV bytes of one held token on this GPU, at the KV dtype (fp8 KV halves it).
  The engine counts what a step reads: every held token of full-attention layers, and with vLLM's
  hybrid KV cache manager only the last `window` tokens of sliding-window layers
  (kvplan/sim/reference.py, kv_read).
- attention_per_pair: a prefill token attending to one earlier token costs 2 x heads x (qk head
  dim + v head dim) FLOPs per attention layer (QK^T and PV), at the bf16 peak x
  attention_efficiency. A chunk of c tokens after h held ones makes c x h + c (c + 1) / 2 pairs.
- Short sliding windows (window <= SHORT_WINDOW tokens, e.g. gpt-oss's 128): a prefill token
  attends to at most `window` earlier tokens there (FlashAttention skips the blocks outside the
  window), so those layers are charged `window` pairs a token (a per-token term, exact once a
  sequence is past its window) instead of the chunk's pairs. Longer windows (Mistral's 4,096,
  Llama 4's 8,192-token chunks) are charged like full attention, exact while a context is inside
  the window. (Exact pairs per layer group need the engine to pass them per group.)
- allreduce(n): 2 per layer, each allreduce_latency_s + 2 (tp - 1) / tp x n x hidden x 2 B over
  the GPU's link (NVLink on SXM parts, PCIe on L4/L40S/A10G) at link_efficiency of its figure on
  NVLink, PCIE_NCCL_SHARE of it on PCIe (NCCL's own rating of a PCIe link; see there).
- Fixed GPU time: layer_overhead_s per layer (each of a layer's ~10 kernels ramps up and drains,
  a few us inside a CUDA graph: the same on an H100 and an H200, which is why a batch-1 decode
  gains far less than the bandwidth from the faster HBM), moe_layer_overhead_s per MoE layer (the
  router, top-k, sorting tokens by expert, permute and unpermute kernels), and
  eager_overhead_per_layer_s per layer with --enforce-eager (kernel launches).
- MoE experts at a narrow per-GPU width w (moe_intermediate_size / tp) stream their weights at
  w / (w + expert_half_width) of the HBM rate (the default): a fused-MoE kernel tiles each
  expert's slab, and an expert of 2,048 columns split 8 ways gives too few tiles to keep HBM busy.
  The term is an empirical stand-in: one width for every GPU and batch, it over-predicts NVIDIA's
  MoE decode steps at large batches (vLLM's ITL +12.6%, SGLang's +20% median, bench/
  sglang_fidelity.py --moe) and the SGLang MI300X runs still come out fast.
- Opt-in (expert_tiles_per_unit > 0, which replaces the width term): the fused-MoE kernel's tiles
  against the GPU's compute units. The experts stream at the HBM rate only when the kernel has
  enough thread blocks in flight. The kernel (vLLM's and SGLang's Triton fused_moe; ROCm's aiter
  MoE) runs each GEMM as a grid of (row blocks of each touched expert) x (output tiles): the
  tokens are sorted by expert and each expert's rows padded to MOE_BLOCK_M (16) rows, the output
  columns cut into MOE_BLOCK_N (64) tiles (block sizes of vLLM's tuned configs at decode batches;
  the constants' comment cites them). With a touched experts of per-GPU width w (moe_intermediate_size / tp)
  receiving m tokens each, gate_up (2w columns, K = hidden) has a x ceil(m / 16) x ceil(2w / 64)
  tiles and down (hidden columns, K = w) a x ceil(m / 16) x ceil(hidden / 64). A GEMM whose tiles
  are fewer than the GPU's compute units (SMs / CUs, compute_units in kvplan/model/gpus.json) x
  expert_tiles_per_unit leaves units idle and streams at tiles / (units x expert_tiles_per_unit) of
  the rate (Little's law: the bytes in flight are the blocks in flight times each one's pipeline);
  gate_up carries 2/3 of an expert's bytes, down 1/3. So a decode of batch 1 on 8 GPUs (8 experts
  192 columns wide: 48 gate_up tiles) is far from saturating a B200's 148 SMs or an MI300X's 304
  CUs, and a batch of 64 touching most experts saturates both. ROCm's aiter counts its tile groups
  against the CU count the same way (get_block_size_M, get_ksplit). With EP (parallel_step.py) a
  rank's whole experts are tiled at full width. Not the default: fitted alone (bench/
  timing_fidelity.py TILE_MODEL, 1.94 tiles a unit) and held out by source, it lowers closed
  loops' ITL (19.0% -> 9.7%), single requests' throughput and E2E (16.5 -> 6.1%, 20.0 -> 7.5%),
  SGLang's E2E and ITL (25.0 -> 21.9%, 28.1 -> 24.8%) and bench/parallel_fidelity.py's held-out
  EP decode rows (46.5% -> 39.4%), but raises TTFT (single requests 13.6 -> 28.1%, closed loops
  38.3 -> 43.8%) and offline throughput (19.6 -> 24.0%). By engine and vendor (bench/
  sglang_fidelity.py --moe) it fixes NVIDIA's MoE ITL (signed medians: vLLM +12.6% -> +2.4%,
  SGLang +20.0% -> -3.9%) and loses the MI300X runs (SGLang throughput +42% -> +71%, vLLM's
  GLM-4.6 -8% -> +50%): their large-batch steps want time that the width term happens to add
  and that no tile count gives (their experts are many and touched), and the corpus has no dense
  MI300X run to tell an MI300X-wide shortfall (TTFT is fast there too) from the MoE kernel's.
  On runs nothing was fitted to it is the better decode model: over bench/silicon_rows.py's 707
  NVIDIA runs (`--set expert_half_width=0 --set expert_tiles_per_unit=1.94`) SGLang's TPOT error
  falls 30.0 -> 15.7% (DeepSeek-R1/V3 at TP 8, experts 256 columns wide there: +43-45% -> -8%)
  and vLLM's 14.7 -> 13.2% (its Qwen3-235B-FP8 runs -16.8 -> -30.5%), and parallel_fidelity's
  held-out step rows 31.4 -> 21.8%. Much of that evidence is suspect: the DeepSeek rows it fixes
  (aiconfigurator's, SGLang's and TensorRT-LLM's) state no speculative decoding, aiconfigurator's
  deployments of DeepSeek ran one MTP draft token by default then, and with one (kvplan's published
  acceptance, nothing fitted) the width term's predictions already come within a median 15.5% on
  SGLang's 78 such runs served again by SGLang's engine drafting it (44.2% as plain decodes) and
  13.0% on the 20 held-out TensorRT-LLM rows of 2026-01-14 (30.0%; bench/silicon_rows.py,
  bench/parallel_fidelity.py: their what-if tables). Also,
  SGLang's TTFT error rises 32.1 -> 39.5%, and refitting every constant with it (`--fit`) leaves
  held-out TTFT worse (all but bursts 31.7 -> 35.5%, single requests 25.3 -> 36.3%, closed loops
  43.8 -> 53.5%) for better throughput, E2E and ITL.
  What it uncovers is TTFT: the MoE runs' measured TTFT exceeds kvplan's by an amount that does
  not grow with the prompt (SGLang on B200, single requests: Qwen3-235B +46 ms at 1,000 prompt
  tokens and +38 ms at 8,000, DeepSeek-R1 +92 ms; aiconfigurator's DeepSeek-R1 H200 rows +104 to
  +166 ms at 4-64 clients, while their TPOT comes within 10%), which the width term hides by
  slowing every MoE step, prefill included. Where that per-request time goes is not settled. One
  candidate has a measurement: SGLang ran a prefill forward without CUDA graphs until its
  piecewise graphs became the default (sgl-project/sglang#16331, January 2026), and such a forward
  of DeepSeek-V3 with one new token took 82.6 ms, against 23.1 ms captured in a graph
  (sgl-project/sglang#12160: launch-bound, ~1 ms a layer); that is one point of one model (its GPU
  not stated), and other engines' eager-minus-graph prefill runs 0.3 ms a layer for a dense 4B
  (wejoncy/sfllm#46), too few and too varied to calibrate a term by source.
- Host time: step_overhead_s a step and request_overhead_s per scheduled request (the engine
  core's Python work), in series or overlapped as above.
- Weight-only quantized GEMMs (GPTQ, AWQ, MXFP4 and NVFP4 where the GPU has no fp4 units)
  dequantize in their inner loop: their compute runs at weight_only_gemm x the bf16 efficiency.
- frontend_latency_s: what a client measures on top of the engine's TTFT and E2E (HTTP,
  tokenization, the first streamed response); it adds to latencies, not to steps.
- stream_token_s: the same process streams every output token (incremental detokenizing, one
  SSE chunk, its write), so at a token rate R it is busy rho = R x stream_token_s of the time, and
  its per-request work (frontend_latency_s) runs in what is left: a processor-sharing stretch of
  1 / (1 - rho), rho taken at the request's send from the engine's token rate then (a fluid
  approximation; kvplan/sim/metrics.client_frontend). vLLM scales this process out with
  --api-server-count because of it.
- frontend_request_s: the API server handles requests one at a time (a single process parses,
  tokenizes and dispatches each), so a burst reaches the engine spread out by this much per
  request (kvplan/sim/inputs.prepared_chunks); it matters only when requests arrive faster.

Figures of the GPU (HBM bandwidth, dense bf16 and fp8 peaks, link bandwidth) are data-sheet
values from kvplan/model/gpus.json; its achievable matmul FLOP/s and memory bandwidth
(hbm_achievable_bytes_per_s, read at with achievable_hbm on) are measured ones
(mamf_bf16_flops, mamf_fp8_flops in the same file, with their source; where none is measured,
MAMF_DEFAULT_SHARE of the peak). The fields of StepConstants are the global constants fitted on the
cited measurements of tests/data/step_time_measurements.yaml (bench/timing_fidelity.py --fit, on
every source but the all-at-once bursts; validated leave-one-source-out), each within
PHYSICAL_RANGES; none depends on a model or a GPU. `kvplan calibrate` fits them on a user's own
runs instead (kvplan/model/timing_profile.py).
ENGINE_OVERHEAD_FACTOR and SERVER_FRONTEND_FACTOR only restate other engines' and servers'
published measurements for that comparison (vLLM's, what kvplan simulates, are 1).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from kvplan.model.config_reader import ConfigReader
from kvplan.model.gpus import GPU, MAMF_DEFAULT_SHARE, achievable_hbm_bytes_per_s
from kvplan.model.layout import KVLayout
from kvplan.model.spec import ModelSpec
from kvplan.model.weights import WeightEstimate, moe_layers, moe_shape


@dataclass(frozen=True, slots=True)
class StepConstants:
    """The fitted global constants (see the module docstring)."""

    # Fitted by bench/timing_fidelity.py --fit on the corpus (bursts left out), each within the
    # range the physics allows (PHYSICAL_RANGES below); what each stands for:
    bandwidth_efficiency: float = 0.67  # share of the data-sheet HBM bandwidth a decode step's weight
    #   and KV reads reach (STREAM-like copies reach 0.71-0.94 of it by part, gpus.json
    #   hbm_achievable_bytes_per_s; the fit's lower figure also carries what a step reads and waits for
    #   beyond its GEMMs and attention: norms, rotary, sampling); with achievable_hbm on, the share of
    #   the GPU's measured copy figure instead
    gemm_efficiency: float = 0.792  # LLM-shaped GEMMs against the best shape's MAMF (cuBLAS loses to
    #   wave quantization and epilogues on N, K of a few thousand)
    gemm_tile_tokens: float = 128.0  # rows of a GEMM tile (CUTLASS / cuBLAS tiles of 64-256 rows)
    attention_efficiency: float = 0.408  # FlashAttention prefill FLOP/s against the bf16 data-sheet
    #   peak (FlashAttention-2 reaches 0.5-0.7 of A100's, FlashAttention-3 0.6-0.75 of H100's in the
    #   forward pass, less on short chunks and varlen batches)
    step_overhead_s: float = 0.000731  # the engine core's host time a step (scheduling, input
    #   preparation, sampler bookkeeping, handing the outputs over): serial with the GPU under
    #   synchronous scheduling, overlapped with it under async scheduling
    eager_overhead_per_layer_s: float = 60e-6  # --enforce-eager: the launches of a layer's ~15
    #   kernels at ~4 us each (not fitted: no eager run in the corpus)
    request_overhead_s: float = 2.24e-05  # the engine core's host time per scheduled request and step
    #   (its scheduler entry, input rows, the sampled token's bookkeeping)
    layer_overhead_s: float = 5.65e-06  # GPU time a layer costs whatever its work: the ~10 kernels of a
    #   layer each ramp up and drain (a few us each inside a CUDA graph), the same on every GPU of a
    #   generation; it is why a small batch gains less than the bandwidth from a faster HBM
    moe_layer_overhead_s: float = 1.76e-05  # GPU time of an MoE layer's routing (router GEMV, top-k,
    #   sorting tokens by expert, permute and unpermute kernels) on top of its expert GEMMs
    expert_half_width: float = 277.0  # the per-GPU width (intermediate columns) of one expert at which
    #   a fused-MoE kernel's weight stream reaches half of the HBM rate: a narrow expert slab (an
    #   expert of 2,048 columns split 8 ways) gives too few tiles per expert to keep HBM busy;
    #   0 = every width streams at full rate
    expert_tiles_per_unit: float = 0.0  # opt-in, 0 = off: the fused-MoE kernel's tiles per compute unit
    #   (SM / CU) that keep the experts' weight stream at the HBM rate (fused_moe_stream_factor); above 0
    #   it replaces expert_half_width. Little's law puts it near 0.4-0.6 (one block's pipeline of 2-5
    #   stages of 64 x 64-128 bf16 weights, 16-40 KB in flight, against a unit's share of the HBM
    #   rate x ~0.6-1 us of latency) up to the blocks a unit holds at once (2-4). Fitted with the width
    #   term off: 1.94 (bench/timing_fidelity.py TILE_MODEL), which does not beat the width term on
    #   the corpus as a whole (see there), so not the default
    allreduce_latency_s: float = 3.09e-05  # one all-reduce's fixed cost (NCCL / custom all-reduce
    #   launch and synchronization: 10-30 us on NVLink)
    link_efficiency: float = 0.589  # share of the link's data-sheet bandwidth an all-reduce reaches
    weight_only_gemm: float = 1.0  # weight-only quantized GEMMs (GPTQ/AWQ/MXFP4...): share of bf16's
    #   efficiency left after dequantizing in the inner loop (fitted at the top of its range: the
    #   corpus's weight-only runs are as fast as bf16 GEMMs would be, their dequantizing hidden)
    frontend_latency_s: float = 10e-3  # vLLM's API server's share of TTFT and E2E (HTTP, chat template,
    #   tokenization, the hop to the engine core, the first streamed chunk; not a GPU step). Measured,
    #   not fitted: a client's TTFT exceeds the server's own vllm:time_to_first_token_seconds by
    #   8.4-12.2 ms over 6 runs (vllm-project/vllm#54628), and vLLM online over offline adds 4 ms
    #   (tenstorrent/tt-inference-server#190); 10 ms
    frontend_request_s: float = 0.00845  # the API server's time per request, served one at a time
    stream_token_s: float = 0.000183  # the API server's CPU time per streamed output token (detokenizing,
    #   the SSE chunk, its write), which slows its per-request work as the token rate grows
    achievable_hbm: float = 0.0  # a switch, not fitted: 1 = weights and KV are read at bandwidth_efficiency x
    #   the GPU's measured achievable bandwidth (hbm_achievable_bytes_per_s in gpus.json), 0 = x its data sheet's

    def to_dict(self) -> dict:
        return asdict(self)


CONSTANTS = StepConstants()
# What the physics allows each fitted constant (kvplan calibrate and bench/timing_fidelity.py fit
# inside these; a timing profile outside them is refused). gemm_tile_tokens and
# eager_overhead_per_layer_s are not fitted (no run in the corpus informs them).
# bandwidth_efficiency is the share of the data sheet's bandwidth (achievable_hbm off, the default):
# 0.6-0.92, a STREAM-like copy reaching 0.84-0.94 on NVIDIA's parts (gpus.json). With achievable_hbm
# on it is the share of a copy's measured figure that LLM kernels reach, 0.65-1.1 (a decode step's
# weight stream is read-only, and read-only kernels beat a copy's read-and-write mix: 1.06x on an
# H100 PCIe, 1.2-1.3x on an MI350X; gpus.json sources); its fit there, 0.78 (bench/timing_fidelity.py
# MEASURED_HBM), lies inside both, so the range stays the default's.
PHYSICAL_RANGES = {
    "bandwidth_efficiency": (0.6, 0.92), "gemm_efficiency": (0.4, 1.0), "attention_efficiency": (0.3, 0.8),
    "step_overhead_s": (0.1e-3, 6e-3), "request_overhead_s": (1e-6, 80e-6),
    "layer_overhead_s": (0.0, 40e-6), "moe_layer_overhead_s": (0.0, 80e-6), "expert_half_width": (0.0, 1024.0),
    "expert_tiles_per_unit": (0.0, 4.0),
    "allreduce_latency_s": (3e-6, 50e-6), "link_efficiency": (0.3, 0.95), "weight_only_gemm": (0.15, 1.0),
    "frontend_latency_s": (0.5e-3, 60e-3), "frontend_request_s": (0.0, 10e-3), "stream_token_s": (0.0, 300e-6),
}  # fmt: skip
# vLLM schedules asynchronously by default from this release (vllm-project/vllm#27614, "[Core] Enable
# async scheduling by default", opened 2025-10-27; on by default in v0.14.0 of 2026-01-17 as its
# users report, deepjavalibrary/djl#3833): the engine core schedules step n + 1 while the GPU runs
# step n. Before it, the engine core's loop was schedule -> execute -> update, in series.
SCHEDULER_ASYNC_FROM = (0, 14)
# CPU-side overheads (per step and per request) of other serving engines relative to vLLM V1's,
# for comparing with their published measurements (bench/timing_fidelity.py, fitted within its
# FACTOR_PARAMS): vLLM V0 keeps its host work on the GPU's critical path, SGLang overlaps it, a C++
# runtime (TensorRT-LLM) schedules and samples with less host time than Python ones. kvplan
# simulates vLLM V1, whose factor is 1.
ENGINE_OVERHEAD_FACTOR = {"vllm": 1.0, "vllm-v0": 1.72, "sglang": 1.0, "tensorrt-llm": 0.0601,
                          "tensorrt-llm-pytorch": 0.337, "other": 1.0}
# The API server's share of a client's latencies (frontend_latency_s) by the server in front of
# the engine, relative to vLLM's OpenAI server; its intake and streaming costs (frontend_request_s,
# stream_token_s) scale by the factor where it is below 1 (a slower answer is not a slower intake).
# trtllm-serve and NIM are OpenAI servers in Python (FastAPI) like vLLM's, taken as equal to it;
# SGLang's hands a request from its tokenizer process to its scheduler and back through a
# detokenizer process (fitted: 23 ms where vLLM's is 10; the SGLang runs of several sources want
# more; refitted with the runs restated by SGLang's own pool and scheduler and its overlap
# scheduler's extra step, bench/sglang_fidelity.py: 2.35 on all sources, 2.16-4.6 with one source
# held out, so 2.3 stays; the engine factor stays at 1.0, its range's top, either way),
# Triton's server is C++ (fitted); offline benchmarks (trtllm-bench, TensorRT-LLM's gptSessionBenchmark)
# time the engine itself, with no server at all.
SERVER_FRONTEND_FACTOR = {"vllm-openai": 1.0, "trtllm-serve": 1.0, "nim": 1.0, "sglang": 2.3, "triton": 0.47,
                          "trtllm-bench": 0.0, "gptSessionBenchmark": 0.0}


def engine_constants(constants: StepConstants, engine: str = "vllm", server: str | None = None) -> StepConstants:
    """The constants restated for another engine's runtime and the API server in front of it (by
    default the engine's own, ENGINE_SERVER): `scale_overheads` by ENGINE_OVERHEAD_FACTOR[engine]
    and SERVER_FRONTEND_FACTOR[server]."""
    return scale_overheads(constants, ENGINE_OVERHEAD_FACTOR.get(engine, 1.0),
                           SERVER_FRONTEND_FACTOR.get(server if server is not None else ENGINE_SERVER.get(engine, ""), 1.0))


def scale_overheads(constants: StepConstants, engine_factor: float, server_factor: float) -> StepConstants:
    """The engine core's host time a step and a request scaled by `engine_factor`, the API server's
    answer by `server_factor`. A server slower to answer one request (SGLang hands each on between
    three processes) is not slower to take requests in or to stream tokens, so its intake and
    streaming costs scale only by a factor below 1 (Triton's C++ is faster at all)."""
    if engine_factor == 1.0 and server_factor == 1.0:
        return constants
    stream = min(server_factor, 1.0)
    return replace(constants, step_overhead_s=constants.step_overhead_s * engine_factor,
                   request_overhead_s=constants.request_overhead_s * engine_factor,
                   frontend_latency_s=constants.frontend_latency_s * server_factor,
                   frontend_request_s=constants.frontend_request_s * stream,
                   stream_token_s=constants.stream_token_s * stream)


# the server each engine runs behind by default (`vllm serve`'s OpenAI server, `python -m
# sglang.launch_server`'s own)
ENGINE_SERVER = {"vllm": "vllm-openai", "sglang": "sglang"}

STREAM_BUSY_CAP = 0.9  # the busiest the API server is taken to be (stream_token_s): past it the
# fluid stretch would grow without bound, and the server's own queue, not modelled, takes over


def api_server_s(constants: StepConstants, tokens_per_s: float) -> float:
    """The API server's share of one request's TTFT and E2E while the engine streams
    `tokens_per_s` (frontend_latency_s stretched by 1 / (1 - rho), rho = rate x stream_token_s)."""
    busy = min(tokens_per_s * constants.stream_token_s, STREAM_BUSY_CAP)
    return constants.frontend_latency_s / (1.0 - busy)


@dataclass(frozen=True, slots=True)
class StepModel:
    """The step-time model of one model on one GPU of a TP group; every size is per GPU."""

    hbm_bytes_per_s: float
    peak_flops: float  # data-sheet peak of the linear layers' dtype: fp8 for W8A8 where the GPU has it
    attention_flops: float  # bf16 peak, for attention
    link_bytes_per_s: float
    tp: int
    dense_bytes: int  # weights read every step (all but routed experts and the input embedding)
    dense_flops_per_token: float
    expert_bytes: int  # all routed experts
    expert_flops_per_token: float  # the top_k experts one token passes
    num_experts: int
    top_k: int
    lm_head_flops_per_request: float
    kv_bytes_per_token: int  # every layer's KV of one token (the engine windows sliding layers' reads)
    attention_flops_per_pair: float  # layers that attend to every earlier token (full, MLA, long windows)
    hidden: int
    num_layers: int
    window_flops_per_token: float = 0.0  # short-window layers: a token attends to `window` earlier ones
    enforce_eager: bool = False
    weight_only: bool = False  # weight-only quantized linear layers (dequantized in the GEMM)
    constants: StepConstants = CONSTANTS
    matmul_flops: float = 0.0  # the GPU's measured achievable matmul FLOP/s (MAMF) at that dtype; 0: peak_flops
    pcie_link: bool = False  # the GPUs talk over PCIe (no NVLink): all-reduces are NCCL rings through the host
    moe_layers: int = 0  # layers with routed experts
    expert_width: int = 0  # one routed expert's intermediate columns on this GPU (moe_intermediate_size / tp)
    async_scheduling: bool = True  # the engine core schedules step n + 1 while the GPU runs step n
    #   (vLLM's default from 0.14, SCHEDULER_ASYNC_FROM): its host time overlaps the GPU's
    compute_units: int = 0  # the GPU's SMs / CUs (kvplan/model/gpus.json); 0: not stated (the experts'
    #   tiles then never limit their weight stream)
    hbm_achievable_bytes_per_s: float = 0.0  # the GPU's measured achievable bandwidth (a copy's; gpus.
    #   achievable_hbm_bytes_per_s), read at with constants.achievable_hbm on; 0: hbm_bytes_per_s

    def with_constants(self, constants: StepConstants) -> "StepModel":
        return replace(self, constants=constants)

    # -- the terms, in seconds ---------------------------------------------------------------------

    def gemm_efficiency(self, tokens: float) -> float:
        c = self.constants
        ceiling = c.gemm_efficiency * (c.weight_only_gemm if self.weight_only else 1.0)
        if tokens <= 0:
            return ceiling
        # the kernel takes the smallest tile that covers the rows, from the MMA instruction's 16
        # (mma.sync m16n8k16) up to gemm_tile_tokens; larger batches are cut into whole tiles
        tile = min(c.gemm_tile_tokens, max(MIN_TILE_TOKENS, 2.0 ** math.ceil(math.log2(tokens))))
        return ceiling * tokens / (tile * math.ceil(tokens / tile))

    def _matmul(self) -> float:
        return self.matmul_flops or self.peak_flops

    def read_bandwidth(self) -> float:
        """Bytes per second a step reads weights and KV at: bandwidth_efficiency x the GPU's achievable
        bandwidth (constants.achievable_hbm on) or its data-sheet one."""
        c = self.constants
        measured = self.hbm_achievable_bytes_per_s if c.achievable_hbm else 0.0
        return (measured or self.hbm_bytes_per_s) * c.bandwidth_efficiency

    def active_experts(self, tokens: int) -> float:
        """Expected distinct experts n tokens choosing top_k of E touch (per MoE layer)."""
        if not self.num_experts or tokens <= 0:
            return 0.0
        return self.num_experts * -math.expm1(tokens * math.log1p(-self.top_k / self.num_experts)) \
            if self.top_k < self.num_experts else float(self.num_experts)

    def linear_parts(self, tokens: int) -> dict:
        """Seconds of the dense and expert GEMMs for `tokens` tokens, each as (memory, compute)."""
        bw = self.read_bandwidth()
        parts = {"dense": (self.dense_bytes / bw,
                           self.dense_flops_per_token * tokens / (self._matmul() * self.gemm_efficiency(tokens)))}
        if self.num_experts and tokens > 0:
            active = self.active_experts(tokens)
            per_expert = tokens * self.top_k / active
            parts["experts"] = (self.expert_bytes * active / self.num_experts / bw
                                * self.expert_stream_factor(active, per_expert),
                                self.expert_flops_per_token * tokens
                                / (self._matmul() * self.gemm_efficiency(per_expert)))
        return parts

    def expert_stream_factor(self, active: float, per_expert: float) -> float:
        """How much longer than at the full HBM rate the routed experts' weights take to stream,
        `active` experts touched with `per_expert` tokens each (fused_moe_stream_factor)."""
        return fused_moe_stream_factor(self.constants, self.compute_units, active, per_expert,
                                       self.expert_width, self.hidden)

    def linear_s(self, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        return sum(max(mem, comp) for mem, comp in self.linear_parts(tokens).values())

    def allreduce_s(self, tokens: int) -> float:
        if self.tp <= 1 or tokens <= 0:
            return 0.0
        c = self.constants
        data = 2 * (self.tp - 1) / self.tp * tokens * self.hidden * 2
        share = PCIE_NCCL_SHARE if self.pcie_link else c.link_efficiency
        return 2 * self.num_layers * (c.allreduce_latency_s + data / (self.link_bytes_per_s * share))

    def window_attention_s(self, tokens: int) -> float:
        """Short-window layers' attention FLOPs of `tokens` tokens (each attends to `window` others)."""
        return tokens * self.window_flops_per_token / (self.attention_flops * self.constants.attention_efficiency)

    def per_token_s(self, tokens: int) -> float:
        """What the kernel tabulates: linear layers, all-reduces and short-window attention of a step
        of `tokens` tokens."""
        return self.linear_s(tokens) + self.allreduce_s(tokens) + self.window_attention_s(tokens)

    def per_token_table(self, size: int) -> list[float]:
        """[per_token_s(n) for n in range(size)], the same operations in the same order with what
        does not depend on n computed once (a search tabulates dozens of these; a test checks
        every entry against per_token_s, bit for bit)."""
        c = self.constants
        ceiling = c.gemm_efficiency * (c.weight_only_gemm if self.weight_only else 1.0)
        tile_cap, matmul, bw = c.gemm_tile_tokens, self._matmul(), self.read_bandwidth()
        dense_mem, dense_flops = self.dense_bytes / bw, self.dense_flops_per_token
        experts = bool(self.num_experts)
        if experts:
            expert_flops = self.expert_flops_per_token
        reduce = self.tp > 1
        if reduce:
            share = PCIE_NCCL_SHARE if self.pcie_link else c.link_efficiency
            ring = 2 * (self.tp - 1) / self.tp
            link = self.link_bytes_per_s * share
        window = self.window_flops_per_token
        window_rate = self.attention_flops * c.attention_efficiency

        def efficiency(tokens):
            if tokens <= 0:
                return ceiling
            tile = min(tile_cap, max(MIN_TILE_TOKENS, 2.0 ** math.ceil(math.log2(tokens))))
            return ceiling * tokens / (tile * math.ceil(tokens / tile))

        out = []
        for n in range(size):
            if n <= 0:
                linear = 0.0
            else:
                linear = max(dense_mem, dense_flops * n / (matmul * efficiency(n)))
                if experts:
                    active = self.active_experts(n)
                    per_expert = n * self.top_k / active
                    linear += max(self.expert_bytes * active / self.num_experts / bw
                                  * self.expert_stream_factor(active, per_expert),
                                  expert_flops * n / (matmul * efficiency(per_expert)))
            allreduce = (2 * self.num_layers * (c.allreduce_latency_s + ring * n * self.hidden * 2 / link)
                         if reduce and n > 0 else 0.0)
            out.append(linear + allreduce + n * window / window_rate)
        return out

    @property
    def gpu_overhead_s(self) -> float:
        """GPU time every step costs whatever its work: each layer's fixed cost, each MoE layer's
        routing, and with --enforce-eager the kernel launches of every layer."""
        c = self.constants
        return (c.layer_overhead_s * self.num_layers + c.moe_layer_overhead_s * self.moe_layers
                + (c.eager_overhead_per_layer_s * self.num_layers if self.enforce_eager else 0.0))

    @property
    def gpu_per_request_s(self) -> float:
        """GPU time per scheduled request: the lm_head on its one sampled position."""
        return self.lm_head_flops_per_request / (self._matmul() * self.constants.gemm_efficiency)

    @property
    def overhead_s(self) -> float:
        """The fixed ticks every step is charged in series: the GPU's, and under synchronous
        scheduling also the engine core's host time (async: see host_step_s)."""
        host = 0.0 if self.async_scheduling else self.constants.step_overhead_s
        return self.gpu_overhead_s + host

    @property
    def per_request_s(self) -> float:
        host = 0.0 if self.async_scheduling else self.constants.request_overhead_s
        return self.gpu_per_request_s + host

    @property
    def host_step_s(self) -> float:
        """Async scheduling: the engine core's host time a step, overlapped with the GPU's."""
        return self.constants.step_overhead_s if self.async_scheduling else 0.0

    @property
    def host_request_s(self) -> float:
        return self.constants.request_overhead_s if self.async_scheduling else 0.0

    @property
    def kv_read_s_per_token(self) -> float:
        return self.kv_bytes_per_token / self.read_bandwidth()

    @property
    def attention_s_per_pair(self) -> float:
        return self.attention_flops_per_pair / (self.attention_flops * self.constants.attention_efficiency)

    def step_s(self, *, tokens: int, requests: int, kv_read: int, pairs: int) -> float:
        """One step: its GPU time plus the host's (synchronous scheduling), or the longer of the
        two (async scheduling: the host prepares step n + 1 while the GPU runs step n)."""
        gpu = (self.overhead_s + self.per_request_s * requests + self.per_token_s(tokens)
               + self.kv_read_s_per_token * kv_read + self.attention_s_per_pair * pairs)
        return max(gpu, self.host_step_s + self.host_request_s * requests)

    def breakdown(self, *, tokens: int, requests: int, kv_read: int, pairs: int) -> dict:
        """One step's seconds by term (what `kvplan step` prints)."""
        parts = self.linear_parts(tokens) if tokens > 0 else {}
        weights_read = sum(mem for mem, _ in parts.values())
        gemm = sum(max(m, c) for m, c in parts.values())
        out = {
            "overhead": self.gpu_overhead_s,
            "host": self.constants.step_overhead_s + self.constants.request_overhead_s * requests,
            "host_overlapped": self.async_scheduling,
            "linear": gemm,
            "linear_weights_read": weights_read,
            "linear_flops": sum(c for _, c in parts.values()),
            "lm_head": self.gpu_per_request_s * requests,
            "kv_read": self.kv_read_s_per_token * kv_read,
            "attention": self.attention_s_per_pair * pairs + self.window_attention_s(tokens),
            "communication": self.allreduce_s(tokens),
        }
        out["total"] = self.step_s(tokens=tokens, requests=requests, kv_read=kv_read, pairs=pairs)
        return out


def steady_state(model: StepModel, prompt: float, output: float, max_num_seqs: int, budget: int,
                 slots: int) -> dict:
    """A saturated server in steady state, in closed form: B requests running, each step decodes one
    token of each and prefills the prompts of the B / output requests that replace the finished
    ones, so a step processes B (1 + prompt / output) tokens over B requests holding prompt +
    output / 2 tokens each on average. B is the largest that max_num_seqs, the token budget and
    the KV pool allow; the server then finishes B / (output x step) requests a second."""
    output = max(output, 1.0)
    per_request = prompt + output / 2
    batch = min(float(max_num_seqs), budget / (1 + prompt / output), slots / max(per_request, 1.0))
    batch = max(batch, 1.0)
    step = model.step_s(tokens=round(batch * (1 + prompt / output)), requests=round(batch),
                        kv_read=round(batch * per_request), pairs=round(batch / output * prompt * (prompt + 1) / 2))
    return {"batch": batch, "step_s": step, "requests_per_s": batch / (output * step),
            "output_tokens_per_s": batch / step}


def prefill_pairs(chunk: int, held: int) -> int:
    """Token pairs a prefill chunk of `chunk` tokens after `held` computed ones attends over."""
    return chunk * held + chunk * (chunk + 1) // 2


def fp8_compute(raw: dict, scheme_name: str) -> bool:
    """Whether the linear layers run fp8 x fp8 (W8A8) rather than dequantizing to bf16."""
    name = scheme_name.lower()
    if name.startswith("fp8") or name == "modelopt fp8":
        return True
    if name != "compressed-tensors":
        return False
    groups = (raw.get("quantization_config") or {}).get("config_groups") or {}
    for group in groups.values() if isinstance(groups, dict) else ():
        acts = group.get("input_activations") if isinstance(group, dict) else None
        if isinstance(acts, dict) and acts.get("num_bits") == 8 and acts.get("type") == "float":
            return True
    return False


def achievable_matmul_flops(gpu: GPU, fp8: bool) -> float:
    """The GPU's measured maximum achievable matmul FLOP/s (MAMF) at the linear layers' dtype:
    its mamf_bf16_flops / mamf_fp8_flops in kvplan/model/gpus.json (each with its source), or for a
    GPU not measured its data-sheet peak x MAMF_DEFAULT_SHARE (the same file)."""
    measured, peak, key = ((gpu.mamf_fp8_flops, gpu.peak_fp8_flops, "fp8") if fp8
                           else (gpu.mamf_bf16_flops, gpu.peak_bf16_flops, "bf16"))
    return measured or peak * MAMF_DEFAULT_SHARE[key]


# PCIe-connected GPUs (L4, L40S, A10G, RTX 4090/5090, H100 PCIe without bridges): vLLM's custom
# all-reduce needs NVLink for more than two GPUs (custom_all_reduce.py: "not supported on more than two
# PCIe-only GPUs") and TensorRT-LLM's likewise falls back to NCCL, whose ring crosses the PCIe switch or
# the CPU's root complex. NCCL's own topology rates a PCIe Gen4 x16 link at 24 GB/s of the 32 on paper
# ("PCI[24.0]", "maxBw 24.0" in its INFO log, https://github.com/NVIDIA/nccl-tests/issues/307), and its
# maintainers note that a PCIe system's all-reduce is bound by what the CPU and memory deliver, every
# GPU a flow in both directions (https://github.com/NVIDIA/nccl/issues/1639): so a PCIe all-reduce gets
# this share of the link figure instead of link_efficiency (fitted on NVLink parts). Not fitted.
PCIE_NCCL_SHARE = 0.75
# A link of at most PCIe Gen5 x16's 64 GB/s each way is PCIe: every NVLink part in the GPU catalog has
# 150 GB/s or more (V100's NVLink 2), every PCIe-only part 32 or 64 (kvplan/model/gpus.json sources).
PCIE_LINK_MAX_BYTES_PER_S = 64e9

# The fused-MoE kernel's tiles at decode and small batches (the module docstring, "MoE experts"):
# vLLM's Triton fused_moe (vllm/model_executor/layers/fused_moe/fused_moe.py, fused_moe_kernel: a grid
# of cdiv(EM, BLOCK_SIZE_M) x cdiv(N, BLOCK_SIZE_N) programs, the tokens sorted by expert and each
# expert's rows padded to BLOCK_SIZE_M, moe_align_block_size) takes its tuned configs (configs/E=..,
# N=..,device_name=...json, try_get_optimal_moe_config) with BLOCK_SIZE_M 16 and BLOCK_SIZE_N 64 at
# decode batches, e.g. E=128,N=192 on H100 (M 1-4 and 64) and E=128,N=384 on MI300X (M 1); its
# get_default_config for untuned shapes also takes BLOCK_SIZE_M 16 when M <= E. SGLang's Triton
# fused_moe is the same kernel. ROCm's aiter CK/asm MoE (aiter/fused_moe.py, get_block_size_M and
# get_ksplit) counts its tile groups of tileN 128 columns against the GPU's CU count (get_cu_num) in
# the same way: it picks the block size that wastes fewest CUs and, when tile groups < CUs ("all cu
# already active" otherwise), splits K to fill them.
MOE_BLOCK_M = 16
MOE_BLOCK_N = 64
# gate and up are two of an expert's three matrices (SwiGLU experts: w13 of 2 x width columns,
# w2 of hidden columns)
GATE_UP_SHARE = 2.0 / 3.0


def fused_moe_tiles(active: float, per_expert: float, columns: int) -> float:
    """Thread blocks of one fused-MoE GEMM: `active` touched experts, each with `per_expert` tokens
    padded to whole MOE_BLOCK_M rows, times the output `columns` in MOE_BLOCK_N tiles."""
    return active * math.ceil(max(per_expert, 1.0) / MOE_BLOCK_M) * math.ceil(columns / MOE_BLOCK_N)


def fused_moe_stream_factor(constants: StepConstants, compute_units: int, active: float, per_expert: float,
                            width: int, hidden: int) -> float:
    """How much longer than at the full HBM rate `active` touched experts of `width` intermediate
    columns on this GPU take to stream, each receiving `per_expert` tokens. With
    expert_tiles_per_unit t > 0 and the GPU's compute units U known: each of the two GEMMs
    (gate_up: 2 x width columns; down: hidden columns) streams at min(1, tiles / (U x t)) of the
    rate, for its share of the bytes (2/3 and 1/3). Else the older width term: w / (w + expert_half_width)."""
    tiles = constants.expert_tiles_per_unit
    if tiles > 0 and compute_units > 0:
        if active <= 0 or width <= 0:
            return 1.0
        slots = compute_units * tiles
        gate_up = min(1.0, fused_moe_tiles(active, per_expert, 2 * width) / slots)
        down = min(1.0, fused_moe_tiles(active, per_expert, hidden) / slots)
        return GATE_UP_SHARE / gate_up + (1.0 - GATE_UP_SHARE) / down
    half = constants.expert_half_width
    return (width + half) / width if half > 0 and width > 0 else 1.0


MIN_TILE_TOKENS = 16.0  # the M of the tensor cores' mma.sync.m16n8k16 instruction: no GEMM tile is smaller

SHORT_WINDOW = 1024  # tokens: prefill attention of sliding windows up to this is charged per token (docstring)


def _short_window(layer) -> bool:
    return layer.kind == "sliding" and layer.window is not None and layer.window <= SHORT_WINDOW


def _pair_dims(spec: ModelSpec, layer) -> int:
    """qk head dim + v head dim of one attention layer (MLA prefill runs in its expanded form)."""
    if layer.kind == "mla":
        cfg = ConfigReader(spec.raw, spec.source)
        return cfg.int("qk_nope_head_dim") + cfg.int("qk_rope_head_dim") + cfg.int("v_head_dim")
    return layer.head_dim + (layer.v_head_dim or layer.head_dim)


def step_model(spec: ModelSpec, layout: KVLayout, weights: WeightEstimate, gpu: GPU, tp: int = 1, *,
               enforce_eager: bool = False, constants: StepConstants = CONSTANTS,
               async_scheduling: bool = True) -> StepModel:
    """The step-time model of `spec` on `gpu`, one of `tp` ranks (see the module docstring)."""
    parts = {kind: (params, size) for kind, params, size in weights.components}
    experts_params, experts_bytes = parts.get("experts", (0, 0))
    embed_params, embed_bytes = parts.get("embeddings", (0, 0))
    lm_head_params = spec.vocab_size * spec.hidden_size
    lm_head_bytes = embed_bytes // (1 if spec.tie_embeddings else 2)
    # the expert bytes streamed are the checkpoint's share of each rank, without the padding of
    # MXFP4 layouts that the memory counts (kvplan/model/mxfp4.py): the constants were fitted so
    per_gpu, expert_bytes = weights.split_bytes_per_gpu(tp), -(-experts_bytes // tp)
    dense_bytes = per_gpu - expert_bytes - -(-embed_bytes // tp) + -(-lm_head_bytes // tp)
    active_expert_params = weights.active_params - (weights.params - experts_params)
    dense_active = weights.active_params - active_expert_params - embed_params
    num_experts, top_k = moe_shape(spec)
    moe_count, expert_size = moe_layers(spec) if experts_params else (0, 0)
    fp8 = fp8_compute(spec.raw, weights.scheme) and gpu.peak_fp8_flops > 0
    weight_only = weights.scheme != "none" and not fp8  # dequantized in the GEMM (fp8 too, without fp8 units)
    heads_per_gpu = max(spec.num_heads // tp, 1)
    attends = [mixer for layer in spec.layers for mixer in layer.mixers if mixer.kind in ("full", "sliding", "mla")]
    pair_flops = sum(2 * heads_per_gpu * _pair_dims(spec, mixer) for mixer in attends if not _short_window(mixer))
    window_flops = sum(2 * heads_per_gpu * _pair_dims(spec, mixer) * mixer.window
                       for mixer in attends if _short_window(mixer))
    return StepModel(
        hbm_bytes_per_s=gpu.hbm_bytes_per_s,
        hbm_achievable_bytes_per_s=achievable_hbm_bytes_per_s(gpu),
        peak_flops=gpu.peak_fp8_flops if fp8 else gpu.peak_bf16_flops,
        matmul_flops=achievable_matmul_flops(gpu, fp8),
        attention_flops=gpu.peak_bf16_flops,
        link_bytes_per_s=gpu.link_bytes_per_s or 32e9,
        pcie_link=(gpu.link_bytes_per_s or 32e9) <= PCIE_LINK_MAX_BYTES_PER_S,
        tp=tp,
        dense_bytes=max(dense_bytes, 0),
        dense_flops_per_token=2.0 * max(dense_active, 0) / tp,
        expert_bytes=expert_bytes,
        expert_flops_per_token=2.0 * active_expert_params / tp,
        num_experts=num_experts if experts_params else 0,
        top_k=top_k,
        lm_head_flops_per_request=2.0 * lm_head_params / tp,
        kv_bytes_per_token=layout.bytes_per_token,
        attention_flops_per_pair=float(pair_flops),
        window_flops_per_token=float(window_flops),
        hidden=spec.hidden_size,
        num_layers=len(spec.layers),
        enforce_eager=enforce_eager,
        weight_only=weight_only,
        constants=constants,
        moe_layers=moe_count,
        expert_width=-(-expert_size // tp),
        async_scheduling=async_scheduling,
        compute_units=gpu.compute_units,
    )


def step_report(spec: ModelSpec, layout: KVLayout, weights: WeightEstimate, gpu: GPU, *, tp: int = 1,
                batch: int = 64, context: int = 4096, chunk: int = 8192, enforce_eager: bool = False,
                constants: StepConstants = CONSTANTS, async_scheduling: bool = True) -> dict:
    """What `kvplan step` prints: one decode step of `batch` requests at `context` tokens each,
    and one prefill chunk of `chunk` tokens starting at token 0, each broken into its terms,
    with the tokens/s they imply."""
    model = step_model(spec, layout, weights, gpu, tp, enforce_eager=enforce_eager, constants=constants,
                       async_scheduling=async_scheduling)
    # what the engine's step reads for one request at `context` tokens: sliding-window layers only
    # their window (vLLM's hybrid KV cache manager), in tokens of every layer
    per_token = [(g.bytes_per_token, g.tokens_held(context)) for g in layout.groups if g.bytes_per_token]
    total = sum(b for b, _ in per_token)
    read = sum(b * held for b, held in per_token) // total if total else context
    decode = model.breakdown(tokens=batch, requests=batch, kv_read=batch * read, pairs=0)
    prefill = model.breakdown(tokens=chunk, requests=1, kv_read=0, pairs=prefill_pairs(chunk, 0))
    return {
        "model": spec.name, "gpu": gpu.name, "tp": tp, "batch": batch, "context": context, "chunk": chunk,
        "enforce_eager": enforce_eager, "kv_dtype": layout.kv_dtype, "weights_scheme": weights.scheme,
        "fp8_compute": model.peak_flops == gpu.peak_fp8_flops and gpu.peak_fp8_flops > 0,
        "decode_s": decode, "decode_tokens_per_s": batch / decode["total"],
        "decode_itl_s": decode["total"],
        "prefill_s": prefill, "prefill_tokens_per_s": chunk / prefill["total"],
        "api_server_s": {"per_request": model.constants.frontend_latency_s,
                         "while_decode_streams": api_server_s(model.constants, batch / decode["total"]),
                         "per_streamed_token": model.constants.stream_token_s,
                         "intake_one_at_a_time": model.constants.frontend_request_s},
        "constants": model.constants.to_dict(),
    }
