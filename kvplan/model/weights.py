"""Estimate a model's weight bytes and forward FLOPs from its config (dense, MoE, MLA, hybrids).

Counts the matrices (embeddings, attention, MLP or experts, Mamba/DeltaNet projections) and leaves
out norms and biases, which are well under 0.1% of any model here. Quantized checkpoints are sized
by their `quantization_config`: fp8 linear layers at 1 byte, MXFP4 experts at 4.25 bits (4-bit
values plus one 8-bit scale per 32), GPTQ/AWQ at their stated bits. Every value is read through
the config reader, so a bad one is a ConfigError naming the file and the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvplan.errors import ConfigError
from kvplan.model.config_reader import ConfigReader
from kvplan.model.dtypes import DTYPE_BITS
from kvplan.model.families.mamba import mamba2_shape
from kvplan.model.mxfp4 import MXFP4_BITS, expert_bytes_per_rank, mxfp4_backend as backend_for
from kvplan.model.quant import scheme_of
from kvplan.model.spec import LayerSpec, ModelSpec

if TYPE_CHECKING:
    from kvplan.model.gpus import GPU

DENSE_KEYS = ("intermediate_size_mlp", "ffn_dim", "ffn_hidden_size", "n_inner", "intermediate_size")
NON_GATED = {"gpt2", "opt", "falcon", "RefinedWebModel", "RefinedWeb", "mpt", "gpt_bigcode", "starcoder2", "nemotron_h", "gpt_neox", "bloom"}


@dataclass(frozen=True, slots=True)
class WeightEstimate:
    """Parameters and bytes of the whole model, and the parameters one token passes through.

    `bytes` is the whole checkpoint as loaded, per kind of module in `components`. Tensor
    parallelism splits every linear layer but the MoE router, which each rank holds whole, and
    copies a K/V projection when tp exceeds the KV heads (`bytes_per_gpu`).
    """

    params: int
    active_params: int
    bytes: int
    scheme: str = "none"
    components: tuple[tuple[str, int, int], ...] = ()  # (module kind, params, bytes)
    kv_proj_bytes: int = 0  # the K and V projections of every layer
    kv_heads: int = 1
    mxfp4_experts: tuple[int, int, int] | None = None  # MXFP4 MoE: (experts x layers, hidden, intermediate)

    @property
    def flops_per_token(self) -> float:
        """Forward FLOPs per token: two per active parameter (multiply and add)."""
        return 2.0 * self.active_params

    def bytes_per_gpu(self, tp: int = 1, gpu: GPU | None = None, mxfp4_backend: str = "auto") -> int:
        """What one of `tp` ranks loads (on `gpu`, whose kernels, or those `mxfp4_backend` forces,
        decide how MXFP4 experts are padded: kvplan/model/mxfp4.py), the vision tower included."""
        loaded = self.split_bytes_per_gpu(tp) + -(-self.part_bytes("vision") // tp)
        if self.mxfp4_experts is None:
            return loaded
        return loaded - -(-self.part_bytes("experts") // tp) + self.expert_bytes_per_gpu(tp, gpu, mxfp4_backend)

    def part_bytes(self, kind: str) -> int:
        """The bytes of one kind of module (a `components` kind; 0 if the model has none)."""
        return sum(b for k, _, b in self.components if k == kind)

    def split_bytes_per_gpu(self, tp: int = 1) -> int:
        """The language model as loaded split over `tp` ranks, every linear layer but the router
        evenly, without the per-rank padding of MXFP4 experts or a multimodal checkpoint's vision
        tower, which no text token passes (what the step-time model streams: its constants were
        fitted on it, kvplan/model/step_time.py)."""
        router = self.part_bytes("router")
        copies = -(-tp // self.kv_heads) if tp > self.kv_heads else 1  # each KV head on tp/kv ranks
        extra = self.kv_proj_bytes * (copies - 1)
        return -(-(self.bytes - router - self.part_bytes("vision") + extra) // tp) + router

    def expert_bytes_per_gpu(self, tp: int = 1, gpu: GPU | None = None, mxfp4_backend: str = "auto") -> int:
        """The routed experts one of `tp` ranks holds (on `gpu`)."""
        if self.mxfp4_experts is None:
            return -(-sum(b for kind, _, b in self.components if kind == "experts") // tp)
        return expert_bytes_per_rank(*self.mxfp4_experts, tp, backend_for(gpu, mxfp4_backend))


def estimate_weights(spec: ModelSpec, quantization: str | None = None) -> WeightEstimate:
    """Weights as vLLM loads them: the config's `quantization_config`, or vLLM's online
    `--quantization` (kvplan/model/quant.py) applied to each kind of linear layer; embeddings,
    lm_head and routers stay in the model dtype."""
    cfg = ConfigReader(spec.raw, spec.source)
    hidden = spec.hidden_size
    bits = DTYPE_BITS[spec.dtype]
    scheme = scheme_of(spec.raw, spec.source, quantization)
    embed = spec.vocab_size * hidden * (1 if spec.tie_embeddings else 2)
    attn = state = 0
    for i, layer in enumerate(spec.layers):
        for mixer in layer.mixers:  # Falcon-H1: attention and Mamba2 in one layer, counted apart
            n = _attention_params(spec, cfg, mixer, i)
            if mixer.kind == "state":
                state += n
            else:
                attn += n
    dense, router, experts, active_experts = _mlp_params(spec, cfg)
    vision = _vision_params(spec, cfg)
    mxfp4 = _mxfp4_experts(spec, cfg, experts) \
        if scheme.name == "mxfp4" and experts and scheme.bits_for("experts", bits) == MXFP4_BITS else None
    parts = {"embeddings": (embed, bits), "attention": (attn, scheme.bits_for("attention", bits)),
             "state": (state, scheme.bits_for("state", bits)), "mlp": (dense, scheme.bits_for("mlp", bits)),
             "router": (router, bits), "experts": (experts, scheme.bits_for("experts", bits)),
             "vision": (vision, bits)}
    components = tuple((k, int(n), expert_bytes_per_rank(*mxfp4, 1, backend_for(None))
                        if k == "experts" and mxfp4 else int(n * b // 8)) for k, (n, b) in parts.items() if n)
    params = embed + attn + state + dense + router + experts + vision
    active = params - experts + active_experts - vision
    kv = [mixer for layer in spec.layers for mixer in layer.mixers if mixer.kind in ("full", "sliding")]
    kv_params = sum(2 * hidden * layer.num_kv_heads * layer.head_dim for layer in kv)
    return WeightEstimate(params=int(params), active_params=int(active),
                          bytes=sum(b for _, _, b in components), scheme=scheme.name,
                          components=components,
                          kv_proj_bytes=int(kv_params * scheme.bits_for("attention", bits) // 8),
                          kv_heads=min((layer.num_kv_heads for layer in kv), default=1), mxfp4_experts=mxfp4)


def _attention_params(spec: ModelSpec, cfg: ConfigReader, layer: LayerSpec, index: int) -> int:
    hidden, heads = spec.hidden_size, spec.num_heads
    if layer.kind in ("full", "sliding"):
        return hidden * layer.head_dim * (2 * heads + 2 * layer.num_kv_heads)
    if layer.kind == "mla":
        nope, rope, v = cfg.int("qk_nope_head_dim"), cfg.int("qk_rope_head_dim"), cfg.int("v_head_dim")
        rank = cfg.int("kv_lora_rank")
        q_rank = cfg.opt_int("q_lora_rank")
        q = hidden * q_rank + q_rank * heads * (nope + rope) if q_rank else hidden * heads * (nope + rope)
        return q + hidden * (rank + rope) + rank * heads * (nope + v) + heads * v * hidden
    if layer.kind == "state":
        return _state_params(spec, cfg)
    blocks = spec.raw.get("block_configs")
    if blocks and blocks[index]["attention"].get("replace_with_linear"):
        return hidden * hidden
    return 0


def _vision_params(spec: ModelSpec, cfg: ConfigReader) -> int:
    """A multimodal checkpoint's vision tower, which vLLM loads beside the language model (and splits
    over the TP ranks with parallel linear layers): a ViT of `num_hidden_layers` (`depth`) blocks of
    width `hidden_size` (`embed_dim` where hidden_size names the language model's, as Qwen2-VL's
    does), each full multi-head attention (q, k, v, o: 4 x width^2) and an MLP (fc1 and fc2, or
    gate, up and down where the activation is SiLU: Pixtral's, Qwen2.5-VL's); the patch embedding
    (channels x patch^2 x width, times temporal_patch_size for video), learned positions where an
    image_size is stated ((image_size / patch)^2 x width), and the projection of the merged patches
    (width x spatial_merge_size^2) into the language model's hidden size (Gemma 3's
    mm_input_projection; the first layer of a larger projector). 0 without a `vision_config`."""
    if not isinstance(spec.raw.get("vision_config"), dict):
        return 0
    vc = cfg.sub("vision_config")
    layers = vc.int("num_hidden_layers", "depth")
    width = vc.int("embed_dim", "hidden_size")
    mlp = vc.int("intermediate_size", default=int(vc.number("mlp_ratio", 4.0) * width))
    gated = vc.raw.get("hidden_act") == "silu"
    patch = vc.int("patch_size")
    patch_embed = vc.int("num_channels", "in_chans", "in_channels", default=3) * patch * patch * width \
        * vc.int("temporal_patch_size", default=1)
    positions = (vc.int("image_size") // patch) ** 2 * width if vc.has("image_size") else 0
    merge = vc.int("spatial_merge_size", default=1)
    out = vc.int("out_hidden_size", default=spec.hidden_size)
    return layers * (4 * width * width + (3 if gated else 2) * width * mlp) + patch_embed + positions \
        + width * merge * merge * out


def _state_params(spec: ModelSpec, cfg: ConfigReader) -> int:
    hidden = spec.hidden_size
    if spec.model_type.startswith("minimax"):  # lightning attention: qkv (3x), output gate, out_proj
        # vLLM MiniMaxText01LinearAttention: hidden -> 3 x inner, hidden -> inner, inner -> hidden,
        # inner = heads x head_dim
        inner = spec.num_heads * cfg.int("head_dim", default=hidden // spec.num_heads)
        return 5 * hidden * inner
    if cfg.has("linear_num_value_heads"):  # gated DeltaNet
        v_heads = cfg.int("linear_num_value_heads")
        key_dim = cfg.int("linear_num_key_heads") * cfg.int("linear_key_head_dim")
        value_dim = v_heads * cfg.int("linear_value_head_dim")
        return hidden * (2 * key_dim + 2 * value_dim + 2 * v_heads) + value_dim * hidden
    if cfg.has("mamba_num_heads") or spec.model_type in ("falcon_h1", "granitemoehybrid"):  # Mamba2: in_proj, out_proj
        shape = mamba2_shape(cfg, spec.model_type, hidden)
        return hidden * shape.in_proj_width + shape.d_inner * hidden
    d_inner = cfg.int("mamba_expand", default=2) * hidden  # Mamba1
    d_state = cfg.int("mamba_d_state", default=16)
    dt_rank = cfg.int("mamba_dt_rank", default=-(-hidden // 16)) if cfg.raw.get("mamba_dt_rank") != "auto" else -(-hidden // 16)
    return hidden * 2 * d_inner + d_inner * (dt_rank + 2 * d_state) + dt_rank * d_inner + d_inner * hidden


def _mlp_params(spec: ModelSpec, cfg: ConfigReader) -> tuple[int, int, int, int]:
    """(dense MLP and shared-expert params, router params, all expert params, active expert
    params) summed over layers."""
    hidden, n = spec.hidden_size, len(spec.layers)
    experts = cfg.int("n_routed_experts", "num_local_experts", "num_experts", default=0, positive=False)
    top_k = cfg.int("num_experts_per_tok", "experts_per_token", default=1, positive=False)  # 0 in dense Granite 4.0
    mult = 2 if spec.model_type in NON_GATED else 3
    if "block_configs" in spec.raw:
        return sum(_nas_ffn(cfg, hidden, i) for i in range(n)), 0, 0, 0
    if spec.model_type == "nemotron_h":
        pattern = spec.raw.get("hybrid_override_pattern")
        return str(pattern).count("-") * mult * hidden * _dense_intermediate(spec, cfg), 0, 0, 0
    if not experts:
        return n * mult * hidden * _dense_intermediate(spec, cfg), 0, 0, 0
    moe_layers = [i for i in range(n) if _is_moe_layer(cfg, i)]
    expert_size = cfg.int("moe_intermediate_size", "intermediate_size")
    shared = _shared_expert_size(cfg, expert_size)
    per_expert = 3 * hidden * expert_size
    dense_layers = n - len(moe_layers)
    dense = dense_layers * mult * hidden * _dense_intermediate(spec, cfg) if dense_layers else 0
    dense += len(moe_layers) * 3 * hidden * shared
    router = len(moe_layers) * hidden * experts
    return dense, router, len(moe_layers) * experts * per_expert, len(moe_layers) * top_k * per_expert


def _dense_intermediate(spec: ModelSpec, cfg: ConfigReader) -> int:
    if spec.model_type == "granitemoehybrid":  # the "shared" MLP is the whole MLP of a dense Granite 4.0
        return cfg.int("shared_intermediate_size", default=1024)
    if any(cfg.has(k) for k in DENSE_KEYS):
        return cfg.int(*DENSE_KEYS)
    if spec.model_type == "mpt":
        return int(cfg.number("expansion_ratio", 4.0) * spec.hidden_size)
    return 4 * spec.hidden_size


def _is_moe_layer(cfg: ConfigReader, i: int) -> bool:
    if cfg.has("first_k_dense_replace"):
        first = cfg.int("first_k_dense_replace", positive=False)
        return i >= first and i % cfg.int("moe_layer_freq", default=1) == 0
    if cfg.has("interleave_moe_layer_step"):
        return (i + 1) % cfg.int("interleave_moe_layer_step") == 0
    if cfg.has("expert_layer_period"):
        return i % cfg.int("expert_layer_period") == cfg.int("expert_layer_offset", default=0, positive=False)
    only_dense = cfg.raw.get("mlp_only_layers") or []
    if not isinstance(only_dense, list):
        raise ConfigError("expected a list of layer indices", file=cfg.source, field="mlp_only_layers")
    if i in only_dense:
        return False
    return (i + 1) % cfg.int("decoder_sparse_step", default=1) == 0


def _shared_expert_size(cfg: ConfigReader, expert_size: int) -> int:
    if cfg.has("n_shared_experts"):
        return cfg.int("n_shared_experts", positive=False) * expert_size
    if cfg.has("shared_expert_intermediate_size"):
        return cfg.int("shared_expert_intermediate_size", positive=False)
    if cfg.has("shared_intermediate_size") or cfg.raw.get("model_type") == "granitemoehybrid":
        # GraniteMoeShared / GraniteMoeHybrid: one gated shared MLP beside the experts (default 1024)
        return cfg.int("shared_intermediate_size", default=1024, positive=False)
    if cfg.raw.get("model_type") == "llama4_text":
        return cfg.int("intermediate_size")
    return 0


def _nas_ffn(cfg: ConfigReader, hidden: int, i: int) -> int:
    """Nemotron-NAS: a gated MLP of ffn_mult x hidden x 2/3, rounded up to a multiple of 256."""
    ffn = cfg.raw["block_configs"][i].get("ffn") or {}
    if not isinstance(ffn, dict):
        raise ConfigError("expected an object", file=cfg.source, field=f"block_configs[{i}].ffn")
    if ffn.get("no_op"):
        return 0
    if ffn.get("replace_with_linear"):
        return hidden * hidden
    mult = ConfigReader(ffn, cfg.source, f"block_configs[{i}].ffn.").number("ffn_mult")
    size = -(-int(2 * mult * hidden / 3) // 256) * 256
    return 3 * hidden * size


def moe_shape(spec: ModelSpec) -> tuple[int, int]:
    """(routed experts, experts each token chooses) of an MoE model; (0, 0) for a dense one."""
    cfg = ConfigReader(spec.raw, spec.source)
    experts = cfg.int("n_routed_experts", "num_local_experts", "num_experts", default=0, positive=False)
    if not experts:
        return 0, 0
    return experts, min(cfg.int("num_experts_per_tok", "experts_per_token", default=1), experts)


def moe_layer_indices(spec: ModelSpec) -> tuple[int, ...]:
    """The indices of the decoder layers with routed experts (empty for a dense model), by the
    same rule the weights are counted with (first_k_dense_replace, decoder_sparse_step ...)."""
    cfg = ConfigReader(spec.raw, spec.source)
    experts = cfg.int("n_routed_experts", "num_local_experts", "num_experts", default=0, positive=False)
    if not experts or "block_configs" in spec.raw or spec.model_type == "nemotron_h":
        return ()
    return tuple(i for i in range(len(spec.layers)) if _is_moe_layer(cfg, i))


def moe_layers(spec: ModelSpec) -> tuple[int, int]:
    """(MoE layers, one routed expert's intermediate size) of an MoE model; (0, 0) for a dense one."""
    cfg = ConfigReader(spec.raw, spec.source)
    experts = cfg.int("n_routed_experts", "num_local_experts", "num_experts", default=0, positive=False)
    if not experts or "block_configs" in spec.raw or spec.model_type == "nemotron_h":
        return 0, 0
    count = sum(1 for i in range(len(spec.layers)) if _is_moe_layer(cfg, i))
    return count, cfg.int("moe_intermediate_size", "intermediate_size")


def engine_shape(spec: ModelSpec) -> dict:
    """The sizes vLLM's profiling run depends on (kvplan/model/vllm_memory.py): the hidden size,
    the widest MLP one token passes (dense intermediate, or top_k experts plus shared ones),
    the vocabulary, the layers, the activation bytes, and the model type (gpt-oss captures CUDA
    graphs of its own sizes)."""
    cfg = ConfigReader(spec.raw, spec.source)
    experts = cfg.int("n_routed_experts", "num_local_experts", "num_experts", default=0, positive=False)
    width = 0
    if experts:
        expert = cfg.int("moe_intermediate_size", "intermediate_size")
        width = cfg.int("num_experts_per_tok", "experts_per_token", default=1) * expert
        width += _shared_expert_size(cfg, expert)
    if not experts or any(cfg.has(k) for k in DENSE_KEYS):
        width = max(width, _dense_intermediate(spec, cfg))
    return dict(hidden=spec.hidden_size, mlp_width=width, vocab=spec.vocab_size, layers=len(spec.layers),
                act_bytes=max(DTYPE_BITS[spec.dtype] // 8, 2), model_type=spec.model_type)


def _mxfp4_experts(spec: ModelSpec, cfg: ConfigReader, experts: int) -> tuple[int, int, int]:
    """(experts x MoE layers, hidden width, expert intermediate width) of an MXFP4 MoE checkpoint,
    which vLLM pads per rank as its kernel backend needs (kvplan/model/mxfp4.py)."""
    hidden, size = spec.hidden_size, cfg.int("moe_intermediate_size", "intermediate_size")
    return experts // (3 * hidden * size), hidden, size
