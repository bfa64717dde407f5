"""Read a Hugging Face config.json (any family) into a ModelSpec: per-layer facts about the KV cache.

Only data is read: no code from the config is ever imported or executed (no trust_remote_code).
Families name the same fact differently; the alias tables below map every spelling we know of to
one meaning, and per-family rules decide which layers keep per-token KV, a window of it, a latent
(MLA) or a constant recurrent state (Mamba, gated DeltaNet).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvplan.errors import ConfigError
from kvplan.fileio import load_json, read_limited
from kvplan.model.dtypes import CONFIG_DTYPE_NAMES

LAYERS_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model")
HEADS_KEYS = ("num_attention_heads", "n_head", "n_heads", "num_heads")
CONTEXT_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
    "n_ctx",
)
MAX_VALUE = 2**40  # no config field of a real model comes near this
MAX_LAYERS = 10_000  # the deepest models have a few hundred layers
MAX_CONFIG_BYTES = 16 * 2**20
# transformers' own class defaults, used when a config leaves the context out.
DEFAULT_CONTEXT = {"RefinedWebModel": 2048, "RefinedWeb": 2048, "falcon": 2048, "gpt2": 1024}


@dataclass(frozen=True, slots=True)
class LayerSpec:
    """What one layer keeps for a sequence (kind "none" keeps nothing). Head counts are totals."""

    kind: str
    num_kv_heads: int = 0
    head_dim: int = 0
    v_head_dim: int = 0
    latent_dim: int = 0
    window: int | None = None
    state_elems: int = 0
    state_heads: int = 0  # heads the state splits into under tensor parallelism
    # A second token mixer that runs beside this one in the same decoder layer and keeps its own
    # cache (Falcon-H1: attention and a Mamba2 mixer side by side in every layer). None for the
    # usual one mixer per layer.
    parallel: LayerSpec | None = None

    @property
    def mixers(self) -> tuple[LayerSpec, ...]:
        """The token mixers of this decoder layer, each keeping its own cache: this one, then the
        one in parallel with it. A layout has a group per mixer kind (vLLM gives each mixer of a
        parallel hybrid its own KV cache spec, so a 44-layer Falcon-H1 has 44 attention and 44
        Mamba cache layers)."""
        if self.parallel is None:
            return (self,)
        return (replace(self, parallel=None), *self.parallel.mixers)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """The facts of a model that kvplan uses, read from its config."""

    name: str
    source: str
    model_type: str
    dtype: str
    dtype_note: str
    max_context: int | None  # None: the config states none (BLOOM's ALiBi)
    hidden_size: int
    num_heads: int
    vocab_size: int
    tie_embeddings: bool
    layers: tuple[LayerSpec, ...]
    raw: dict[str, Any] = field(repr=False, compare=False, hash=False)


class ConfigReader:
    """Typed access to one config dict that names the file and field in every error."""

    def __init__(self, raw: dict[str, Any], source: str, prefix: str = "") -> None:
        self.raw, self.source, self.prefix = raw, source, prefix

    def has(self, key: str) -> bool:
        return self.raw.get(key) is not None

    def _fail(self, key: str, expected: str) -> ConfigError:
        return ConfigError(expected, file=self.source, field=self.prefix + key)

    def int(self, *keys: str, default: int | None = None, positive: bool = True, maximum: int = MAX_VALUE) -> int:
        """The first present key as an integer in [1 (0 if not positive), maximum]."""
        for key in keys:
            value = self.raw.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise self._fail(key, f"expected an integer, got {value!r}")
            if isinstance(value, float) and not value.is_integer():
                raise self._fail(key, f"expected an integer, got {value!r}")
            if positive and value <= 0:
                raise self._fail(key, f"expected a positive integer, got {value!r}")
            if value < 0 or value > maximum:
                raise self._fail(key, f"expected an integer between {int(positive)} and {maximum:,}, got {value!r}")
            return int(value)
        if default is not None:
            return default
        raise self._fail(keys[0], "missing; kvplan needs this field to size the model")

    def number(self, key: str, default: float | None = None) -> float:
        """A finite positive number (int or float)."""
        value = self.raw.get(key)
        if value is None:
            if default is None:
                raise self._fail(key, "missing; this field is needed to size the model")
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_VALUE:
            raise self._fail(key, f"expected a positive number, got {value!r}")
        return float(value)

    def opt_int(self, *keys: str) -> int | None:
        if not any(self.has(k) for k in keys):
            return None
        return self.int(*keys)

    def bool(self, key: str, default: bool = False) -> bool:
        value = self.raw.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._fail(key, f"expected true or false, got {value!r}")
        return value

    def sub(self, key: str) -> "ConfigReader":
        value = self.raw.get(key)
        if not isinstance(value, dict):
            raise self._fail(key, "expected an object")
        return ConfigReader(value, self.source, f"{self.prefix}{key}.")


def load_config(path: Path) -> dict[str, Any]:
    """Parse a config.json file into a dict, with one-line errors (see kvplan/fileio.py)."""
    data = read_limited(path, MAX_CONFIG_BYTES, ConfigError, what="a model config")
    raw = load_json(data, path, ConfigError)
    if not isinstance(raw, dict):
        raise ConfigError("expected a JSON object at the top level", file=path)
    return raw


def read_model(raw: dict[str, Any], name: str, source: str) -> ModelSpec:
    """Turn a config dict into a ModelSpec; nested `text_config` (multimodal) is followed."""
    top = ConfigReader(raw, source)
    cfg = top.sub("text_config") if isinstance(raw.get("text_config"), dict) else top
    model_type = str(cfg.raw.get("model_type") or raw.get("model_type") or "unknown")
    dtype, note = _dtype(cfg, top)
    num_layers = cfg.int(*LAYERS_KEYS, maximum=MAX_LAYERS)
    hidden = cfg.int(*HIDDEN_KEYS)
    heads = cfg.int(*HEADS_KEYS)
    # Read whichever context field exists; a config with none (BLOOM: ALiBi has no position limit)
    # is fine as long as the caller says how many tokens (`kvplan size --tokens`).
    context = cfg.int(*CONTEXT_KEYS, default=DEFAULT_CONTEXT.get(model_type, 0)) or None
    layers = _layers(cfg, model_type, num_layers, hidden, heads, context or MAX_VALUE)
    vocab = cfg.int("vocab_size", "padded_vocab_size")
    tie = cfg.bool("tie_word_embeddings", default=_ties_by_default(model_type))
    spec_raw = cfg.raw
    if cfg is not top and "quantization_config" in raw and "quantization_config" not in spec_raw:
        spec_raw = {**spec_raw, "quantization_config": raw["quantization_config"]}  # where the hub puts it
    return ModelSpec(
        name=name,
        source=source,
        model_type=model_type,
        dtype=dtype,
        dtype_note=note,
        max_context=context,
        hidden_size=hidden,
        num_heads=heads,
        vocab_size=vocab,
        tie_embeddings=tie,
        layers=tuple(layers),
        raw=spec_raw,
    )


def _ties_by_default(model_type: str) -> bool:
    # transformers' PretrainedConfig defaults tie_word_embeddings to True; these families untie
    # their own defaults in their config classes (GraniteConfig, GraniteMoe*Config and
    # FalconH1Config default it to False; the Granite checkpoints set it to true).
    return model_type not in {"llama", "mistral", "mixtral", "qwen3_next", "deepseek_v3", "granite", "granitemoe",
                              "granitemoeshared", "granitemoehybrid", "falcon_h1"}


def _dtype(cfg: ConfigReader, top: ConfigReader) -> tuple[str, str]:
    value = cfg.raw.get("torch_dtype") or cfg.raw.get("dtype")
    value = value or top.raw.get("torch_dtype") or top.raw.get("dtype")
    if value is None:
        return "fp16", "no torch_dtype in config; fp16 assumed"
    name = CONFIG_DTYPE_NAMES.get(str(value).removeprefix("torch."))
    if name is None:
        raise ConfigError(f"unknown dtype {value!r}", file=cfg.source, field="torch_dtype")
    if name == "fp32":
        return "fp16", "config is float32; served as fp16, as vLLM does"
    return name, ""


def _attention_config(cfg: ConfigReader) -> ConfigReader:
    return cfg.sub("attn_config") if isinstance(cfg.raw.get("attn_config"), dict) else cfg


def _num_kv_heads(cfg: ConfigReader, model_type: str, heads: int) -> int:
    """KV heads: GQA counts under their many names, MQA flags, else MHA."""
    if model_type == "mpt":
        attn = _attention_config(cfg)
        return attn.int("kv_n_heads", default=heads)
    if model_type in ("RefinedWebModel", "RefinedWeb", "falcon"):
        if cfg.bool("new_decoder_architecture"):
            return cfg.int("num_kv_heads", "n_head_kv", "num_key_value_heads")
        return 1 if cfg.bool("multi_query") else heads
    if model_type == "gpt_bigcode":
        return 1 if cfg.bool("multi_query", default=True) else heads
    if model_type == "chatglm":
        if cfg.bool("multi_query_attention"):
            return cfg.int("multi_query_group_num")
        return heads
    if cfg.has("num_key_value_heads"):
        return cfg.int("num_key_value_heads")
    if cfg.has("num_kv_heads") or cfg.has("n_head_kv"):
        return cfg.int("num_kv_heads", "n_head_kv")
    if cfg.bool("multi_query"):
        return 1
    return heads


def _head_dim(cfg: ConfigReader, model_type: str, hidden: int, heads: int) -> int:
    # Cohere2Config sets head_dim = hidden / heads whatever the file says, and vLLM's
    # CohereAttention computes it the same way.
    explicit = None if model_type == "cohere2" else cfg.opt_int("head_dim", "kv_channels", "attention_head_dim")
    if explicit is not None:
        return explicit
    if hidden % heads:
        raise ConfigError(
            f"hidden size {hidden} is not divisible by {heads} heads; set head_dim",
            file=cfg.source,
            field="head_dim",
        )
    return hidden // heads


def _layers(
    cfg: ConfigReader, model_type: str, num_layers: int, hidden: int, heads: int, context: int
) -> list[LayerSpec]:
    if cfg.has("kv_lora_rank"):
        return _mla_layers(cfg, num_layers)
    kv_heads = _num_kv_heads(cfg, model_type, heads)
    head_dim = _head_dim(cfg, model_type, hidden, heads)
    full = LayerSpec("full", kv_heads, head_dim, head_dim)
    if model_type == "nemotron-nas" or cfg.has("block_configs"):
        return _block_config_layers(cfg, heads, head_dim, num_layers)
    if cfg.has("hybrid_override_pattern") or model_type == "nemotron_h":
        return _nemotron_h_layers(cfg, full, num_layers)
    if cfg.has("attn_layer_period") or model_type == "jamba":
        return _jamba_layers(cfg, full, hidden, num_layers)
    if model_type == "falcon_h1":
        return _falcon_h1_layers(cfg, full, hidden, num_layers)
    if model_type == "granitemoehybrid":
        return _granite_hybrid_layers(cfg, full, hidden, num_layers)
    if cfg.has("attn_type_list"):  # MiniMax-Text-01 / M1 / M2 (remote code): 0 = lightning, 1 = softmax
        return _minimax_layers(cfg, full, heads, head_dim, num_layers)
    types = _layer_types(cfg, model_type, num_layers)
    windows = _windows(cfg, model_type, context)
    layers = []
    for i, kind in enumerate(types):
        if kind == "full_attention":
            layers.append(full)
        elif kind in ("sliding_attention", "chunked_attention"):
            window = windows.get(kind)
            layers.append(full if window is None else LayerSpec("sliding", kv_heads, head_dim, head_dim, window=window))
        elif kind == "linear_attention":
            layers.append(_lightning_state(heads, head_dim) if model_type.startswith("minimax")
                          else _gated_deltanet_state(cfg))
        else:
            raise ConfigError(
                f"unknown layer type {kind!r} at layer {i}", file=cfg.source, field="layer_types"
            )
    return layers


def _layer_types(cfg: ConfigReader, model_type: str, num_layers: int) -> list[str]:
    """The attention type of each layer, from layer_types or the family's pattern keys."""
    explicit = cfg.raw.get("layer_types")
    if explicit is not None:
        if not isinstance(explicit, list) or len(explicit) != num_layers:
            raise ConfigError(
                f"expected a list of {num_layers} layer types", file=cfg.source, field="layer_types"
            )
        return [str(t) for t in explicit]
    if cfg.has("full_attention_interval"):  # Qwen3-Next: every Nth layer is full attention
        every = cfg.int("full_attention_interval")
        return ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(num_layers)]
    if cfg.has("sliding_window_pattern"):  # Gemma 3: every Nth layer is global
        every = cfg.int("sliding_window_pattern")
        return ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(num_layers)]
    if model_type == "cohere2":  # Cohere2Config: sliding_window_pattern (default 4), every Nth layer global
        every = cfg.int("sliding_window_pattern", "_sliding_window_pattern", default=4)
        return ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(num_layers)]
    if model_type == "gemma2":  # Gemma 2 alternates, sliding first
        return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)]
    if cfg.has("attention_chunk_size"):  # Llama 4: RoPE layers attend within chunks
        no_rope = cfg.raw.get("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(num_layers)]
        if not isinstance(no_rope, list) or len(no_rope) != num_layers:
            raise ConfigError(f"expected a list of {num_layers} flags", file=cfg.source, field="no_rope_layers")
        return ["chunked_attention" if use_rope else "full_attention" for use_rope in no_rope]
    if cfg.has("sliding_window") and cfg.bool("use_sliding_window", default=_window_on_by_default(model_type)):
        first = cfg.int("max_window_layers", default=0, positive=False) if model_type.startswith("qwen") else 0
        return ["full_attention" if i < first else "sliding_attention" for i in range(num_layers)]
    return ["full_attention"] * num_layers


def _window_on_by_default(model_type: str) -> bool:
    """transformers' Qwen2/Qwen3 configs default use_sliding_window to false; other families have no switch."""
    return not model_type.startswith("qwen")


def _windows(cfg: ConfigReader, model_type: str, context: int) -> dict[str, int | None]:
    """Window per layer type; a window that is off or at least the context is no window."""
    sliding = None
    if cfg.has("sliding_window") and cfg.bool("use_sliding_window", default=_window_on_by_default(model_type)):
        sliding = cfg.int("sliding_window")
    elif model_type == "cohere2" and "sliding_window" not in cfg.raw:
        sliding = 4096  # Cohere2Config's default window
    chunk = cfg.opt_int("attention_chunk_size")
    out: dict[str, int | None] = {}
    for kind, window in (("sliding_attention", sliding), ("chunked_attention", chunk)):
        out[kind] = window if window is not None and window < context else None
    return out


def _mla_layers(cfg: ConfigReader, num_layers: int) -> list[LayerSpec]:
    latent = cfg.int("kv_lora_rank") + cfg.int("qk_rope_head_dim")
    return [LayerSpec("mla", latent_dim=latent)] * num_layers


def _block_config_layers(cfg: ConfigReader, heads: int, head_dim: int, num_layers: int) -> list[LayerSpec]:
    """Nemotron-NAS (DeciLM): per-layer attention; no_op or linear-replaced layers keep nothing."""
    blocks = cfg.raw.get("block_configs")
    if not isinstance(blocks, list) or len(blocks) != num_layers:
        raise ConfigError(f"expected a list of {num_layers} blocks", file=cfg.source, field="block_configs")
    layers = []
    for i, block in enumerate(blocks):
        attn = block.get("attention") if isinstance(block, dict) else None
        if not isinstance(attn, dict):
            raise ConfigError("expected an attention object", file=cfg.source, field=f"block_configs[{i}].attention")
        if attn.get("no_op") or attn.get("replace_with_linear"):
            layers.append(LayerSpec("none"))
            continue
        group = ConfigReader(attn, cfg.source, f"block_configs[{i}].attention.").int("n_heads_in_group")
        if heads % group:
            raise ConfigError(f"expected a divisor of the {heads} attention heads, got {group}",
                              file=cfg.source, field=f"block_configs[{i}].attention.n_heads_in_group")
        layers.append(LayerSpec("full", heads // group, head_dim, head_dim))
    return layers


def _nemotron_h_layers(cfg: ConfigReader, full: LayerSpec, num_layers: int) -> list[LayerSpec]:
    """Nemotron-H: M = Mamba2, * = attention, - = MLP, E = MoE (no KV)."""
    if not isinstance(cfg.raw.get("hybrid_override_pattern"), str):
        raise ConfigError("missing; expected a string of layer codes (M, *, -, E)", file=cfg.source,
                          field="hybrid_override_pattern")
    pattern = cfg.raw["hybrid_override_pattern"]
    if len(pattern) != num_layers:
        raise ConfigError(
            f"expected {num_layers} characters, got {len(pattern)}", file=cfg.source, field="hybrid_override_pattern"
        )
    mamba = mamba2_shape(cfg, "nemotron_h", 0).layer()
    kinds = {"M": mamba, "*": full, "-": LayerSpec("none"), "E": LayerSpec("none")}
    try:
        return [kinds[ch] for ch in pattern]
    except KeyError as exc:
        raise ConfigError(f"unknown layer code {exc.args[0]!r}", file=cfg.source, field="hybrid_override_pattern") from None


@dataclass(frozen=True, slots=True)
class Mamba2Shape:
    """The sizes of one Mamba2 mixer (Dao & Gu 2024, "Transformers are SSMs"), whatever the family
    calls them. Per sequence it keeps what vLLM's MambaMixer2 allocates
    (vllm/model_executor/layers/mamba/mamba_mixer2.py, mamba_utils.mamba2_state_shape): a
    convolution window of `conv_kernel - 1` steps over the x, B and C channels and one
    d_head x d_state SSM state per head."""

    n_heads: int
    d_head: int
    d_state: int
    n_groups: int
    conv_kernel: int

    @property
    def d_inner(self) -> int:
        return self.n_heads * self.d_head

    @property
    def conv_channels(self) -> int:
        """x, B and C: d_inner + 2 x n_groups x d_state (the depthwise conv1d's channels)."""
        return self.d_inner + 2 * self.n_groups * self.d_state

    @property
    def state_elems(self) -> int:
        return (self.conv_kernel - 1) * self.conv_channels + self.n_heads * self.d_head * self.d_state

    @property
    def in_proj_width(self) -> int:
        """Outputs of in_proj: z (d_inner), x, B, C (conv_channels) and dt (one per head)."""
        return self.d_inner + self.conv_channels + self.n_heads

    def layer(self) -> LayerSpec:
        return LayerSpec("state", state_elems=self.state_elems, state_heads=self.n_heads)


def mamba2_shape(cfg: ConfigReader, model_type: str, hidden: int) -> Mamba2Shape:
    """The Mamba2 mixer of a Nemotron-H, Falcon-H1 or Granite 4.0 config, under the family's key names."""
    if model_type == "falcon_h1":
        return _falcon_h1_mamba(cfg, hidden)
    if model_type == "granitemoehybrid":
        return _granite_mamba(cfg, hidden)
    return Mamba2Shape(n_heads=cfg.int("mamba_num_heads"), d_head=cfg.int("mamba_head_dim"),
                       d_state=cfg.int("ssm_state_size"), n_groups=cfg.int("n_groups", default=1),
                       conv_kernel=cfg.int("conv_kernel", default=4))


def _falcon_h1_mamba(cfg: ConfigReader, hidden: int) -> Mamba2Shape:
    """Falcon-H1's Mamba2 mixer, with the defaults of transformers' FalconH1Config
    (models/falcon_h1/configuration_falcon_h1.py): its width is `mamba_d_ssm` (1024 when the key is
    absent; `mamba_expand` x hidden, expand 2, when it is null, as FalconH1Mixer and vLLM's
    FalconH1SSMDecoderLayer read it), split into `mamba_n_heads` heads (128) of `mamba_d_head`
    ("auto": width / heads), with `mamba_n_groups` (1) groups of `mamba_d_state` (256) and a
    `mamba_d_conv` (4) wide convolution. The config class requires heads x d_head = width."""
    if "mamba_d_ssm" not in cfg.raw:
        width = 1024
    elif cfg.raw["mamba_d_ssm"] is None:
        width = cfg.int("mamba_expand", default=2) * hidden
    else:
        width = cfg.int("mamba_d_ssm")
    return _mamba2_of_width(cfg, width, "")


def _mamba2_of_width(cfg: ConfigReader, width: int, how: str) -> Mamba2Shape:
    """A Mamba2 mixer of `width` read with the `mamba_*` keys Falcon-H1 and Granite 4.0 share:
    `mamba_n_heads` (128) heads of `mamba_d_head` ("auto": width / heads), `mamba_n_groups` (1)
    groups of `mamba_d_state` (256), a `mamba_d_conv` (4) wide convolution; heads x d_head must
    make the width (`how`: where the width came from, for the error)."""
    n_heads = cfg.int("mamba_n_heads", default=128)
    d_head_raw = cfg.raw.get("mamba_d_head", "auto")
    d_head = width // n_heads if d_head_raw in ("auto", None) else cfg.int("mamba_d_head")
    if n_heads * d_head != width:
        raise ConfigError(f"{n_heads} heads x {d_head} do not make the Mamba width {width}{how}",
                          file=cfg.source, field="mamba_d_head")
    return Mamba2Shape(n_heads=n_heads, d_head=d_head, d_state=cfg.int("mamba_d_state", default=256),
                       n_groups=cfg.int("mamba_n_groups", default=1), conv_kernel=cfg.int("mamba_d_conv", default=4))


def _falcon_h1_layers(cfg: ConfigReader, full: LayerSpec, hidden: int, num_layers: int) -> list[LayerSpec]:
    """Falcon-H1: every decoder layer runs attention and a Mamba2 mixer side by side on the same
    input and sums their outputs (FalconH1DecoderLayer in transformers, whose layers_block_type is
    "hybrid" for every layer; vLLM's FalconH1ParallelHybrid), so each layer keeps per-token K/V
    and a per-sequence Mamba2 state. The legacy `attn_layer_indices` key is not read by either."""
    return [replace(full, parallel=_falcon_h1_mamba(cfg, hidden).layer())] * num_layers


def _granite_mamba(cfg: ConfigReader, hidden: int) -> Mamba2Shape:
    """Granite 4.0's Mamba2 mixer, with the defaults of transformers' GraniteMoeHybridConfig
    (models/granitemoehybrid/configuration_granitemoehybrid.py) as GraniteMoeHybridMambaLayer and
    vLLM's GraniteMoeHybridMambaDecoderLayer read them: width `mamba_expand` (2) x hidden, split into
    `mamba_n_heads` (128) heads of `mamba_d_head` ("auto": width / heads), `mamba_n_groups` (1)
    groups of `mamba_d_state` (256), a `mamba_d_conv` (4) wide convolution. The config class
    requires heads x d_head = width."""
    return _mamba2_of_width(cfg, cfg.int("mamba_expand", default=2) * hidden, " (mamba_expand x hidden)")


GRANITE_ATTENTION = ("attention", "full_attention")
GRANITE_MAMBA = ("mamba", "linear_attention")


def _granite_hybrid_layers(cfg: ConfigReader, full: LayerSpec, hidden: int, num_layers: int) -> list[LayerSpec]:
    """Granite 4.0 (granitemoehybrid): each layer's token mixer is attention or Mamba2, as
    `layer_types` (alias `layers_block_type`) lists it: "attention" / "mamba" in the hub files,
    "full_attention" / "linear_attention" as transformers 5 writes them back; absent, every layer
    is Mamba2 (GraniteMoeHybridConfig's default). The MLP or MoE after the mixer keeps nothing.
    A list of attention layers only is Granite-4.0-Micro, a plain transformer."""
    types = cfg.raw.get("layer_types", cfg.raw.get("layers_block_type"))
    if types is None:
        types = ["mamba"] * num_layers
    if not isinstance(types, list) or len(types) != num_layers:
        raise ConfigError(f"expected a list of {num_layers} layer types", file=cfg.source, field="layer_types")
    mamba = None
    layers = []
    for i, kind in enumerate(types):
        if kind in GRANITE_ATTENTION:
            layers.append(full)
        elif kind in GRANITE_MAMBA:
            mamba = mamba or _granite_mamba(cfg, hidden).layer()
            layers.append(mamba)
        else:
            raise ConfigError(f"unknown layer type {kind!r} at layer {i}; expected attention or mamba",
                              file=cfg.source, field="layer_types")
    return layers


def _jamba_layers(cfg: ConfigReader, full: LayerSpec, hidden: int, num_layers: int) -> list[LayerSpec]:
    """Jamba: attention every `attn_layer_period` layers at `attn_layer_offset`, Mamba1 elsewhere."""
    period = cfg.int("attn_layer_period")
    offset = cfg.int("attn_layer_offset", default=0, positive=False)
    d_inner = cfg.int("mamba_expand", default=2) * hidden
    conv = (cfg.int("mamba_d_conv", default=4) - 1) * d_inner
    mamba = LayerSpec("state", state_elems=conv + d_inner * cfg.int("mamba_d_state", default=16), state_heads=d_inner)
    return [full if i % period == offset else mamba for i in range(num_layers)]


def _minimax_layers(cfg: ConfigReader, full: LayerSpec, heads: int, head_dim: int, num_layers: int) -> list[LayerSpec]:
    """MiniMax's remote-code configs list each layer's attention in `attn_type_list`: 1 is softmax
    attention (per-token K/V), 0 is lightning attention, a linear attention with a constant state
    (vLLM's MiniMaxText01DecoderLayer reads `attention_type` per layer the same way; transformers'
    own MiniMax config spells it as `layer_types` with "linear_attention", read in _layers)."""
    kinds = cfg.raw.get("attn_type_list")
    if not isinstance(kinds, list) or len(kinds) != num_layers or any(k not in (0, 1) or isinstance(k, bool)
                                                                      for k in kinds):
        raise ConfigError(f"expected a list of {num_layers} attention types, each 0 (lightning) or 1 (softmax)",
                          file=cfg.source, field="attn_type_list")
    lightning = _lightning_state(heads, head_dim)
    return [full if kind == 1 else lightning for kind in kinds]


def _lightning_state(heads: int, head_dim: int) -> LayerSpec:
    """MiniMax lightning attention keeps one head_dim x head_dim key-value state per attention head,
    in the model dtype (vLLM mamba_utils: linear_attention_state_shape is (heads / tp, head_dim,
    head_dim), linear_attention_state_dtype the model's)."""
    return LayerSpec("state", state_elems=heads * head_dim * head_dim, state_heads=heads)


def _gated_deltanet_state(cfg: ConfigReader) -> LayerSpec:
    """Qwen3-Next linear attention: a conv state plus one key x value matrix per value head."""
    k_heads, v_heads = cfg.int("linear_num_key_heads"), cfg.int("linear_num_value_heads")
    k_dim, v_dim = cfg.int("linear_key_head_dim"), cfg.int("linear_value_head_dim")
    kernel = cfg.int("linear_conv_kernel_dim", default=4)
    conv = (kernel - 1) * (2 * k_heads * k_dim + v_heads * v_dim)
    return LayerSpec("state", state_elems=conv + v_heads * k_dim * v_dim, state_heads=v_heads)

