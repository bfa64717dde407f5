"""Step time with expert, data and pipeline parallelism: the terms they add to kvplan/model/step_time.py.

Each GPU of a pipeline stage runs the step-time model of its own layers (step_time.StepModel, its
per-layer terms scaled to the stage: dense weights, FLOPs, KV read, attention, all-reduces, fixed
costs; the lm_head on the last stage only). What parallelism adds, term by term:

- MoE experts split over R = T x D ranks (kvplan/model/parallel.py) when D > 1 or with EP. The
  tokens of every DP rank meet in the MoE layers: N = n x D tokens per step (n per DP rank), each
  choosing top_k of E experts.
  * with EP each rank holds ceil(E / R) whole experts and receives N x top_k / R (token, expert)
    pairs on average; the busiest rank receives `imbalance` times that (expert load is skewed;
    EXPERT_IMBALANCE below). Its weights stream as the distinct experts the step touches
    (each of its experts is touched with probability 1 - (1 - top_k / E)^N), at the HBM share of a
    full-width expert; its GEMMs run at the tile efficiency of the tokens one expert receives,
    N x top_k / E: at small batches that is a few tokens and the experts are weight-bound.
  * without EP every rank holds every expert's 1 / R slice (width moe_intermediate / R) and
    computes all N x top_k pairs on it: no imbalance, but a narrow slice streams slowly
    (expert_half_width of step_time.py; with its opt-in fused-MoE tile model, the tiles of the
    experts a rank touches, at their width there, against the GPU's compute units).
- all-to-all: with D > 1 the MoE layers exchange tokens (ParallelConfig.use_all2all). Per MoE
  layer a dispatch and a combine, each a fixed allreduce_latency_s plus its bytes over the
  slowest path they take: NVLink (link_bytes_per_s x link_efficiency) between the GPUs of one node
  (NODE_GPUS), the network (network_bytes_per_s x NETWORK_EFFICIENCY) beyond it. The tokens a rank
  sends are its own n / T (vLLM splits the tokens of a TP group over its ranks before the MoE when
  T > 1, use_sequence_parallel_moe). Backends (--all2all-backend, vLLM's names and default):
  * allgather_reducescatter (vLLM's default, ParallelConfig.all2all_backend): every rank gathers
    all N tokens (bf16 hidden states) and reduce-scatters the outputs back: (R - 1) / R x N x
    hidden x 2 B each way, whatever top_k;
  * deepep_low_latency (DeepEP's low-latency kernels, pure RDMA): each token goes to the ranks of
    its top_k experts only: n / T x top_k x hidden bytes out, dispatched in FP8 (1 B, with a
    4-byte scale per 128 values) and combined in bf16 (2 B), (R - 1) / R of them off the GPU, the
    share bound for other nodes (R - NODE_GPUS) / R over the network, one message per (token,
    expert) pair.
  * deepep_high_throughput (DeepEP's normal kernels): the same bytes per pair inside a node, but
    a token crosses the network once per other NODE its experts lie on, and the receiving node's
    GPU forwards it over NVLink to the GPUs that hold them (DeepEP README: "forwarding data from
    NVLink domain to RDMA domain"; tests/test_internode.py counts the RDMA bytes as
    num_rdma_token_sent, the (token, node) pairs deduplicated per node). The expected other nodes
    a token touches, its top_k experts drawn from E spread evenly over N = R / NODE_GPUS nodes:
    (N - 1) x (1 - C(E - E/N, top_k) / C(E, top_k)) (remote_nodes); with group-limited routing
    (DeepSeek-V3's n_group 8 / topk_group 4: a token's experts come from topk_group groups of
    E / n_group) the nodes a token touches are at most min(N, topk_group x max(1, N / n_group)),
    the own node among them with chance 1 / N. At EP 32 (4 nodes, top-8 of 256) that is 2.7 other
    nodes against 6 remote (token, expert) pairs: 2.2 x fewer network bytes. Check against
    DeepEP's own V1 figures (docs/legacy.md; H800, 4,096 tokens, top-8, one CX7 400 Gb/s NIC per
    GPU): EP 32 reaches 58 GB/s of "logical" RDMA bandwidth, which counts the own node's share
    too (3.6 nodes a token): 58 x 2.7 / 3.6 = 43.5 GB/s on the wire, 0.87 of the NIC's 50 GB/s;
    EP 64 (4 of 8 node groups) 51 x 3.5 / 4 = 44.6 GB/s, 0.89: NETWORK_EFFICIENCY (0.85) below.
  With --enable-dbo (vLLM's dual-batch overlap, SGLang's two-batch overlap, DeepSeek's two
  micro-batches) the step is two micro-batches of half the tokens, the all-to-all of one running
  under the other's compute: compute = twice a half-batch's compute (each micro-batch reads the
  weights again), a2a = twice a half-batch's all-to-all, and the overlap hides DBO_HIDDEN_SHARE of
  the shorter of the two: step = compute + a2a - DBO_HIDDEN_SHARE x min(compute, a2a). A perfect
  overlap (share 1, the step the longer of the two) is not what the engines measure: the kernels
  that overlap share the GPU (DeepEP's normal kernels take deep_ep.Buffer.num_sms = 20 of a
  Hopper's 132 SMs while they run; LMSYS's profile: under two-batch overlap the communication
  kernels run slower than their unit tests and the GEMMs slower than without overlap), and a
  micro-batch's all-to-all can only hide under the one compute piece the other micro-batch runs
  at that moment. DBO_HIDDEN_SHARE = 0.5, from measurements of the overlap restated on this
  model's own compute and all-to-all (share = (compute + a2a - measured step) / min(compute, a2a)):
  LMSYS's DeepSeek-V3 prefill on 32 H100s, EP 32, 16K tokens a GPU
  (https://lmsys.org/blog/2025-05-05-large-scale-ep/: two-batch overlap 27-35% faster than
  without, "Ablation Study: Two-batch Overlap"): 0.45-0.55; its simulated perfect EPLB run
  (7,417 tokens/s per GPU): 0.44; DeepSeek's own prefill profile (deepseek-ai/profile-data,
  balanced routing, EP 32, 7,839 tokens/s per H800 as LMSYS reads it): 0.53; LMSYS's decode on
  72 H100s at 256 tokens a GPU (25.5% faster with the overlap): 0.69 (there the two half-batches
  re-read the weights, which this model charges in full). Range 0 (no overlap) to 1 (perfect).
- Pipeline parallelism: P stages in series, vLLM keeping P batches in flight (one per stage:
  the engine core's batch queue of max_concurrent_batches = P). In steady state each stage works
  on one micro-batch of `batch` requests per stage time, so a DP rank produces batch / max(stage)
  tokens/s, and a request waits P x max(stage) between its tokens. Between stages the hidden
  states and the residual (2 x n x hidden x 2 B) are sent, over NVLink when the T x P GPUs of a
  pipeline fit one node, else over the network.

Constants (none fitted on the corpus of bench/parallel_fidelity.py, except DBO_HIDDEN_SHARE, which
restates the measured overlap speedups of two of its sources, above):
- NETWORK_DEFAULT: 400 Gb/s per GPU, one ConnectX-7 NIC per GPU in NVIDIA's DGX/HGX H100, H200
  and B200 reference designs (kvplan/model/gpus.json network_bytes_per_s, where a GPU has none).
- NETWORK_EFFICIENCY: DeepEP's own measurements on H800s with one 400 Gb/s CX7 InfiniBand NIC per
  GPU (https://github.com/deepseek-ai/DeepEP, README "Performance"): its normal kernels reach 43-58
  GB/s of RDMA bandwidth across 2-8 nodes, the NIC's line rate (50 GB/s) or more, counting what
  its NVLink forwarding saves; low-latency kernels reach 39-46 GB/s at EP 16-256. Taken as 0.85.
- EXPERT_IMBALANCE: the busiest EP rank's share of the expert work over the mean. ROCm/ATOM#1210
  (DeepSeek-V4-Pro, EP 8, DP attention, prefill) measured 6.48 req/s without EPLB and 8.68 req/s
  with it (64 redundant experts, "biased"): a rank 1.34 x busier than balance at least; with EPLB
  the residual is small (set --expert-imbalance 1.0-1.1). Default 1.3, settable.
"""

from __future__ import annotations

from dataclasses import replace

from kvplan.errors import UsageError
from kvplan.model.build import build_layout
from kvplan.model.config_reader import ConfigReader
from kvplan.model.gpus import GPU
from kvplan.model.layout import KVLayout
from kvplan.model.parallel import NODE_GPUS, Parallelism, stage_bounds, stage_spec
from kvplan.model.spec import ModelSpec
from kvplan.model.step_time import (CONSTANTS, StepConstants, StepModel, fused_moe_stream_factor, prefill_pairs,
                                     step_model)
from kvplan.model.weights import WeightEstimate, moe_layer_indices, moe_layers, moe_shape

NETWORK_DEFAULT = 50e9
NETWORK_EFFICIENCY = 0.85
EXPERT_IMBALANCE = 1.3
# The share of the shorter of a dual-batch overlap's compute and all-to-all that the overlap hides
# (module docstring: 0.44-0.69 from LMSYS's and DeepSeek's measured two-batch overlaps).
DBO_HIDDEN_SHARE = 0.5
ALL2ALL_BACKENDS = ("allgather_reducescatter", "deepep_high_throughput", "deepep_low_latency")
ALL2ALL_DEFAULT = "allgather_reducescatter"
# bytes per hidden element sent: (dispatch, combine)
ELEMENT_BYTES = {"allgather_reducescatter": (2.0, 2.0),
                 "deepep_high_throughput": (1.0 + 4 / 128, 2.0), "deepep_low_latency": (1.0 + 4 / 128, 2.0)}
PP_SEND_TENSORS = 2  # hidden states and residual cross each stage boundary


def _read_tokens(layout: KVLayout, context: int) -> int:
    """Tokens of every layer one request at `context` reads (sliding layers their window), as
    step_time.step_report counts it."""
    per_token = [(g.bytes_per_token, g.tokens_held(context)) for g in layout.groups if g.bytes_per_token]
    total = sum(b for b, _ in per_token)
    return sum(b * held for b, held in per_token) // total if total else context


def _gpu_s(parts: dict) -> float:
    return (parts["overhead"] + parts["linear"] + parts["lm_head"] + parts["kv_read"] + parts["attention"]
            + parts["communication"])


class ParallelStep:
    """The step-time model of one DP rank's pipeline, every stage on its own GPUs (see the module docstring)."""

    def __init__(self, spec: ModelSpec, weights: WeightEstimate, gpu: GPU, par: Parallelism, *, kv_dtype: str = "auto",
                 enforce_eager: bool = False, constants: StepConstants = CONSTANTS, async_scheduling: bool = True,
                 all2all_backend: str = ALL2ALL_DEFAULT, expert_imbalance: float = EXPERT_IMBALANCE,
                 enable_dbo: bool = False, network_bytes_per_s: float | None = None):
        if all2all_backend not in ALL2ALL_BACKENDS:
            raise UsageError(f"expected one of {', '.join(ALL2ALL_BACKENDS)}, got {all2all_backend!r}",
                             field="--all2all-backend")
        if not 1.0 <= expert_imbalance <= 8.0:
            raise UsageError(f"expected a factor from 1 (balanced) to 8, got {expert_imbalance}",
                             field="--expert-imbalance")
        self.spec, self.par, self.gpu = spec, par, gpu
        self.backend, self.imbalance, self.dbo = all2all_backend, expert_imbalance, enable_dbo
        self.network = network_bytes_per_s or gpu.network_bytes_per_s or NETWORK_DEFAULT
        tp = par.tp
        full = step_model(spec, build_layout(spec, kv_dtype, tp), weights, gpu, tp, enforce_eager=enforce_eager,
                          constants=constants, async_scheduling=async_scheduling)
        self.full = full
        self.experts, self.top_k = moe_shape(spec)
        cfg = ConfigReader(spec.raw, spec.source)  # group-limited routing (DeepSeek-V2/V3): (n_group, topk_group)
        self.routing_groups = (cfg.int("n_group", default=0, positive=False),
                               cfg.int("topk_group", default=0, positive=False))
        moe = moe_layer_indices(spec)
        _, self.expert_size = moe_layers(spec)
        # the routed experts leave the per-stage model when they are split over T x D ranks
        self.split_experts = bool(self.experts and full.num_experts) and (par.expert_parallel or par.dp > 1)
        embed = weights.part_bytes("embeddings")
        lm_head = -(-(embed // (1 if spec.tie_embeddings else 2)) // tp)
        self.expert_bytes_whole = weights.part_bytes("experts")  # every expert of every MoE layer, unsplit
        self.expert_flops_per_pair = full.expert_flops_per_token * tp / self.top_k if self.experts else 0.0
        layers = len(spec.layers)
        self.stages: list[tuple[int, int, StepModel, KVLayout, float]] = []
        for s, (start, end) in enumerate(stage_bounds(layers, par.pp)):
            f = (end - start) / layers
            f_moe = sum(1 for i in moe if start <= i < end) / len(moe) if moe else 0.0
            layout = build_layout(stage_spec(spec, start, end), kv_dtype, tp)
            last = s == par.pp - 1
            model = replace(
                full,
                dense_bytes=round((full.dense_bytes - lm_head) * f) + (lm_head if last else 0),
                dense_flops_per_token=full.dense_flops_per_token * f,
                lm_head_flops_per_request=full.lm_head_flops_per_request if last else 0.0,
                kv_bytes_per_token=layout.bytes_per_token,
                attention_flops_per_pair=full.attention_flops_per_pair * f,
                window_flops_per_token=full.window_flops_per_token * f,
                num_layers=end - start,
                moe_layers=round(full.moe_layers * f_moe),
                expert_bytes=round(full.expert_bytes * f_moe),
                expert_flops_per_token=full.expert_flops_per_token * f_moe,
            )
            if self.split_experts:
                model = replace(model, num_experts=0)
            self.stages.append((start, end, model, layout, f_moe))

    # -- the terms parallelism adds, in seconds, for one stage ----------------------------------------------

    def _stream(self, touched: float, per_expert: float, width: int) -> float:
        """The experts' weight stream on one rank against the full HBM rate (step_time.fused_moe_stream_factor):
        `touched` experts of `width` columns there, `per_expert` tokens each."""
        full = self.full
        return fused_moe_stream_factor(full.constants, full.compute_units, touched, per_expert, width,
                                       self.spec.hidden_size)

    def experts_s(self, tokens: int, f_moe: float, group_tokens: int | None = None) -> float:
        """The routed experts of a stage's MoE layers on the busiest rank, for `tokens` per DP rank
        (`group_tokens`: the tokens of all DP ranks together where they differ, else tokens x D)."""
        if not self.split_experts or tokens <= 0 or f_moe == 0:
            return 0.0
        par, full, e, k = self.par, self.full, self.experts, self.top_k
        group = group_tokens or tokens * par.dp  # the tokens of every DP rank meet in the MoE layers
        ranks = par.moe_ranks
        touched = 1.0 - (1.0 - k / e) ** group if k < e else 1.0
        per_expert = self.expert_bytes_whole * f_moe / e
        efficiency = full.gemm_efficiency(group * k / e)
        matmul = full.matmul_flops or full.peak_flops
        bw = full.read_bandwidth()
        if par.expert_parallel:
            local = -(-e // ranks)
            memory = local * touched * per_expert / bw * self._stream(local * touched, group * k / e, self.expert_size)
            pairs = group * k / ranks * self.imbalance
        else:
            memory = (e * touched * per_expert / ranks / bw
                      * self._stream(e * touched, group * k / e, -(-self.expert_size // ranks)))
            pairs = group * k / ranks
        compute = pairs * self.expert_flops_per_pair * f_moe / (matmul * efficiency)
        return max(memory, compute)

    def _transfer_s(self, nvlink_bytes: float, network_bytes: float) -> float:
        c = self.full.constants
        return c.allreduce_latency_s + max(nvlink_bytes / (self.full.link_bytes_per_s * c.link_efficiency),
                                           network_bytes / (self.network * NETWORK_EFFICIENCY))

    def all_to_all_s(self, tokens: int, moe_layers: int) -> float:
        """Dispatch and combine of a stage's MoE layers (D > 1), for `tokens` per DP rank."""
        par = self.par
        if not self.split_experts or par.dp == 1 or tokens <= 0 or moe_layers == 0:
            return 0.0
        ranks, hidden = par.moe_ranks, self.spec.hidden_size
        own = tokens / par.tp  # sequence-parallel MoE: a TP group's tokens split over its ranks
        off_node = max(ranks - NODE_GPUS, 0) / ranks
        on_node = (min(ranks, NODE_GPUS) - 1) / ranks
        total = 0.0
        for element in ELEMENT_BYTES[self.backend]:
            if self.backend == "allgather_reducescatter":  # every rank gathers all tokens, on a ring
                data = (ranks - 1) * own * hidden * element
                total += self._transfer_s(0.0, data) if off_node else self._transfer_s(data, 0.0)
            elif self.backend == "deepep_high_throughput":  # once per other node, then NVLink inside it
                data = own * self.top_k * hidden * element
                total += self._transfer_s(data * on_node, own * self.remote_nodes() * hidden * element)
            else:
                data = own * self.top_k * hidden * element
                total += self._transfer_s(data * on_node, data * off_node)
        return total * moe_layers

    def remote_nodes(self) -> float:
        """Expected other nodes one token's top_k experts lie on, the experts spread evenly over the
        nodes of the R MoE ranks (module docstring, deepep_high_throughput)."""
        nodes = -(-self.par.moe_ranks // NODE_GPUS)
        e, k = self.experts, self.top_k
        if nodes <= 1 or not e:
            return 0.0
        untouched = 1.0  # C(E - E/N, k) / C(E, k)
        for i in range(k):
            untouched *= max(e - e / nodes - i, 0.0) / (e - i)
        touched = nodes * (1.0 - untouched)
        groups, chosen = self.routing_groups
        if 0 < chosen < groups:
            touched = min(touched, nodes, chosen * max(1.0, nodes / groups))
        return touched * (nodes - 1) / nodes

    def pipeline_send_s(self, tokens: int, stage: int) -> float:
        """A stage's send of its hidden states and residual to the next (0 for the last stage)."""
        par = self.par
        if par.pp == 1 or stage == par.pp - 1 or tokens <= 0:
            return 0.0
        data = PP_SEND_TENSORS * tokens * self.spec.hidden_size * 2
        one_node = par.tp * par.pp <= NODE_GPUS
        return self._transfer_s(data, 0.0) if one_node else self._transfer_s(0.0, data)

    def stage_breakdown(self, stage: int, *, tokens: int, requests: int, kv_read: int, pairs: int,
                        group_tokens: int | None = None) -> dict:
        """One stage's step by term on one DP rank of `tokens`: step_time's terms, then the ones
        parallelism adds (`group_tokens`: all DP ranks' tokens together, where they are not tokens x D)."""
        _, _, model, _, f_moe = self.stages[stage]
        out = model.breakdown(tokens=tokens, requests=requests, kv_read=kv_read, pairs=pairs)
        experts = self.experts_s(tokens, f_moe, group_tokens)
        a2a = self.all_to_all_s(tokens, model.moe_layers)
        send = self.pipeline_send_s(tokens, stage)
        if self.dbo and a2a > 0 and tokens >= 2:  # two micro-batches: each reads the weights again
            half = tokens // 2
            micro = model.breakdown(tokens=half, requests=max(requests // 2, 1), kv_read=kv_read // 2,
                                    pairs=pairs // 4 if requests == 1 else pairs // 2)
            compute = 2 * (_gpu_s(micro) + self.experts_s(half, f_moe, group_tokens and group_tokens // 2))
            a2a = 2 * self.all_to_all_s(half, model.moe_layers)
            gpu = compute + a2a - DBO_HIDDEN_SHARE * min(compute, a2a) + send
        else:
            gpu = _gpu_s(out) + experts + a2a + send
        out.update({"moe_experts": experts, "all_to_all": a2a, "pipeline_send": send})
        out["total"] = max(gpu, out["host"]) if model.async_scheduling else gpu + out["host"]
        return out

    def report(self, *, batch: int, context: int, chunk: int) -> dict:
        """Decode (batch requests per DP rank at `context`) and a prefill chunk, per stage, and the
        pipeline's and the whole deployment's throughput."""
        decode, prefill = [], []
        for s, (_, _, _, layout, _) in enumerate(self.stages):
            decode.append(self.stage_breakdown(s, tokens=batch, requests=batch,
                                               kv_read=batch * _read_tokens(layout, context), pairs=0))
            prefill.append(self.stage_breakdown(s, tokens=chunk, requests=1, kv_read=0,
                                                pairs=prefill_pairs(chunk, 0)))
        d_slow = max(range(len(decode)), key=lambda i: (decode[i]["total"], -i))
        p_slow = max(range(len(prefill)), key=lambda i: (prefill[i]["total"], -i))
        par = self.par
        d_rate = batch / decode[d_slow]["total"]
        p_rate = chunk / prefill[p_slow]["total"]
        return {
            "decode": decode[d_slow], "prefill": prefill[p_slow],
            "decode_tokens_per_s": d_rate, "prefill_tokens_per_s": p_rate,
            "decode_itl_s": par.pp * decode[d_slow]["total"],
            "parallel": {
                **par.to_dict(),
                "all2all_backend": self.backend if self.split_experts and par.dp > 1 else None,
                "expert_imbalance": self.imbalance if self.split_experts and par.expert_parallel else None,
                "enable_dbo": self.dbo,
                "network_bytes_per_s": self.network,
                "experts_split": self.split_experts,
                "stages": [{"layers": [a, b], "decode_s": d["total"], "prefill_s": p["total"]}
                           for (a, b, *_), d, p in zip(self.stages, decode, prefill)],
                "decode_slowest_stage": d_slow, "prefill_slowest_stage": p_slow,
                "decode_tokens_per_s_total": d_rate * par.dp,
                "decode_tokens_per_s_per_gpu": d_rate * par.dp / par.gpus,
                "prefill_tokens_per_s_total": p_rate * par.dp,
                "prefill_tokens_per_s_per_gpu": p_rate * par.dp / par.gpus,
                "decode_pipeline_latency_s": sum(d["total"] for d in decode),
            },
        }
