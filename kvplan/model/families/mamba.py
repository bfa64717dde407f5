"""Mamba mixers and the hybrid families built on them: which layers keep a per-sequence state.

- Mamba2Shape / mamba2_shape: the sizes of one Mamba2 mixer (Dao & Gu 2024, "Transformers are
  SSMs") under each family's key names, and the state vLLM's MambaMixer2 allocates for it
  (vllm/model_executor/layers/mamba/mamba_mixer2.py, mamba_utils.mamba2_state_shape); also read
  by kvplan/model/weights.py for the mixer's parameters.
- Nemotron-H: `hybrid_override_pattern`, one code per layer (M Mamba2, * attention, - MLP, E MoE).
- Falcon-H1: attention and a Mamba2 mixer side by side in every layer (transformers'
  FalconH1Config and FalconH1DecoderLayer, vLLM's FalconH1ParallelHybrid).
- Granite 4.0 (granitemoehybrid): attention or Mamba2 per layer, as `layer_types` lists it
  (transformers' GraniteMoeHybridConfig, vLLM's GraniteMoeHybridMambaDecoderLayer).
- Jamba: attention every `attn_layer_period` layers, Mamba1 elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvplan.errors import ConfigError
from kvplan.model.config_reader import ConfigReader
from kvplan.model.spec import LayerSpec


def nemotron_h_layers(cfg: ConfigReader, full: LayerSpec, num_layers: int) -> list[LayerSpec]:
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


def falcon_h1_layers(cfg: ConfigReader, full: LayerSpec, hidden: int, num_layers: int) -> list[LayerSpec]:
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


def granite_hybrid_layers(cfg: ConfigReader, full: LayerSpec, hidden: int, num_layers: int) -> list[LayerSpec]:
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


def jamba_layers(cfg: ConfigReader, full: LayerSpec, hidden: int, num_layers: int) -> list[LayerSpec]:
    """Jamba: attention every `attn_layer_period` layers at `attn_layer_offset`, Mamba1 elsewhere."""
    period = cfg.int("attn_layer_period")
    offset = cfg.int("attn_layer_offset", default=0, positive=False)
    d_inner = cfg.int("mamba_expand", default=2) * hidden
    conv = (cfg.int("mamba_d_conv", default=4) - 1) * d_inner
    mamba = LayerSpec("state", state_elems=conv + d_inner * cfg.int("mamba_d_state", default=16), state_heads=d_inner)
    return [full if i % period == offset else mamba for i in range(num_layers)]
