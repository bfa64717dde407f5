"""Cross-check kvplan's bytes per token per layer against Hugging Face transformers' own KV cache.

A library no one here wrote builds a tiny random model from the same config (layers cut, and the
hidden, MLP, expert and vocab sizes shrunk, never the fields that set the cache: KV heads,
head_dim, layer kinds, window, linear-attention heads), runs a prefill and one decode step on the
CPU with its cache (DynamicCache, sliding-window and linear-attention layers included), and
measures the cache tensors of each layer. kvplan reads the very same config dict, and the
reduced layers are checked to cost what the full model's layers cost.

Known, reported difference: transformers keeps window - 1 tokens in a sliding layer between steps
(the next query brings the window's last token), kvplan counts `window` (the tokens one step reads).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import warnings
from dataclasses import asdict, dataclass

import torch

from kvplan.backends.torch.codec import codec_for
from kvplan.backends.torch.workload import reduce_layers
from kvplan.errors import KvplanError
from kvplan.model.build import build_layout
from kvplan.model.config import LAYERS_KEYS, read_model
from kvplan.model.layout import LayerGroup
from kvplan.model.resolve import load_spec
from kvplan.model.spec import ModelSpec

# Fields that size weights only; shrunk to these (never the KV heads, head_dim, window, layer kinds).
SHRINK = {"intermediate_size": 64, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
          "num_experts": 4, "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 512}
HIDDEN_SHRINK = 256
# Families whose transformers config takes an explicit head_dim, so hidden_size can shrink.
EXPLICIT_HEAD_DIM = {"llama", "mistral", "qwen2", "qwen3", "qwen3_next", "gemma", "gemma2", "gemma3_text"}
HF_MODEL_TYPE = {"RefinedWebModel": "falcon", "RefinedWeb": "falcon"}  # old names transformers dropped
HF_LAYER_TYPE = {"full": "full_attention", "sliding": "sliding_attention", "state": "linear_attention"}


class TransformersNotInstalled(KvplanError):
    """The cross-check needs transformers."""


@dataclass(frozen=True)
class LayerRow:
    """One layer: what transformers' cache holds vs what kvplan says it holds."""

    layer: int
    kind: str
    hf_layer_class: str
    hf_tensors: dict[str, tuple[int, ...]]
    hf_dtypes: dict[str, str]
    hf_tokens_held: int | None
    kvplan_tokens_held: int | None
    hf_bytes: int
    hf_bytes_per_token: int | None  # per-token layers: hf_bytes / hf_tokens_held (batch 1)
    kvplan_bytes_per_token: int | None
    hf_decode_growth: int  # bytes the layer gained over one decode step
    kvplan_state_bytes: int | None  # state layers: kvplan's per-sequence bytes
    hf_elems: int
    kvplan_elems: int | None  # per token (K/V layers) or per sequence (state layers)
    ok: bool
    note: str = ""

    def to_dict(self) -> dict:
        d = asdict(self)
        d["hf_tensors"] = {k: list(v) for k, v in self.hf_tensors.items()}
        return d


@dataclass(frozen=True)
class CrosscheckResult:
    model: str
    model_type: str
    transformers_version: str
    dtype: str
    tokens: int
    cache_class: str
    shrunk: dict[str, tuple[int, int]]
    rows: tuple[LayerRow, ...]
    ok: bool

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "rows"}
        d["shrunk"] = {k: list(v) for k, v in self.shrunk.items()}
        d["rows"] = [r.to_dict() for r in self.rows]
        return d


def transformers_module():
    try:
        return importlib.import_module("transformers")
    except ImportError:
        raise TransformersNotInstalled("transformers is not installed; pip install transformers") from None


def crosscheck(model: str, *, layers: int = 2, tokens: int = 9, seed: int = 0) -> CrosscheckResult:
    """Build `model` tiny in transformers, run it, and compare its cache with kvplan's layout."""
    transformers = transformers_module()
    spec = load_spec(model)
    raw, shrunk = small_config(spec, layers)
    small = read_model(raw, spec.name, spec.source)
    full_groups = {_kv_key(g): g for g in build_layout(spec).groups}
    layout_dtype = build_layout(small).kv_dtype
    dtype = codec_for(layout_dtype).storage
    groups = [_layer_groups(small, i, layout_dtype) for i in range(len(small.layers))]
    for g in (g for layer_groups in groups for g in layer_groups):  # the shrink must not change what a layer keeps
        if _kv_key(g) not in full_groups:
            raise AssertionError(f"reduced layer {g} keeps what no layer of the full model keeps")
    torch.manual_seed(seed)
    with _quiet(transformers):
        hf_model = transformers.AutoModelForCausalLM.from_config(_hf_config(transformers, raw, shrunk))
        hf_model = hf_model.to(dtype).eval()
        ids = torch.randint(0, raw["vocab_size"], (1, tokens + 1))
        with torch.no_grad():
            cache = hf_model(ids[:, :tokens], use_cache=True).past_key_values
            before = [_tensors(layer) for layer in _layers(cache)]
            hf_model(ids[:, tokens:], past_key_values=cache, use_cache=True)
            after = [_tensors(layer) for layer in _layers(cache)]
    if len(after) != len(groups):
        raise AssertionError(f"transformers built {len(after)} cache layers, kvplan reads {len(groups)}")
    rows = []
    for i, layer in enumerate(_layers(cache)):
        for g in groups[i]:  # one row per mixer: a Falcon-H1 layer holds K/V and a Mamba state
            part, part_after = _part(before[i], g), _part(after[i], g)
            rows.append(_row(i, g, layer, part, _bytes(part), _bytes(part_after) - _bytes(part), tokens))
    return CrosscheckResult(
        model=spec.name, model_type=small.model_type, transformers_version=transformers.__version__,
        dtype=layout_dtype, tokens=tokens, cache_class=type(cache).__name__, shrunk=shrunk, rows=tuple(rows),
        ok=len(rows) == sum(len(g) for g in groups) and all(r.ok for r in rows),
    )


def _hf_config(transformers, raw: dict, shrunk: dict):
    kwargs = {k: v for k, v in raw.items() if not k.startswith("_")}
    kwargs["model_type"] = HF_MODEL_TYPE.get(kwargs["model_type"], kwargs["model_type"])
    if kwargs["model_type"] == "falcon":  # RefinedWeb spellings that FalconConfig no longer maps
        for old, new in (("n_layer", "num_hidden_layers"), ("n_head", "num_attention_heads")):
            if old in kwargs:
                kwargs[new] = kwargs.pop(old)
    if "vocab_size" in shrunk:  # special token ids of the real vocab would point past the small one
        kwargs.update(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return transformers.AutoConfig.for_model(**kwargs)


@contextlib.contextmanager
def _quiet(transformers):
    """Silence transformers' advice (slow fallback kernels, deprecations) for the duration."""
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        transformers.logging.set_verbosity(level)


def small_config(spec: ModelSpec, layers: int) -> tuple[dict, dict[str, tuple[int, int]]]:
    """The model's config dict cut to `layers` layers (a mix of kinds kept) with weights shrunk."""
    raw = dict(spec.raw)
    shrunk: dict[str, tuple[int, int]] = {}
    reduced, _ = reduce_layers(spec, layers)
    key = next(k for k in LAYERS_KEYS if k in raw)
    raw[key] = len(reduced.layers)
    _set_layer_kinds(raw, [layer.kind for layer in reduced.layers])
    for field, small in SHRINK.items():
        if isinstance(raw.get(field), int) and raw[field] > small:
            shrunk[field] = (raw[field], small)
            raw[field] = small
    if spec.model_type in EXPLICIT_HEAD_DIM and spec.hidden_size > HIDDEN_SHRINK:
        head_dims = {layer.head_dim for layer in reduced.layers if layer.head_dim}
        if len(head_dims) == 1:
            raw["head_dim"] = head_dims.pop()
            shrunk["hidden_size"] = (spec.hidden_size, HIDDEN_SHRINK)
            raw["hidden_size"] = HIDDEN_SHRINK
    return raw, shrunk


def _set_layer_kinds(raw: dict, kinds: list[str]) -> None:
    """Spell the reduced layer kinds in the config's own terms, read alike by kvplan and transformers."""
    if len(set(kinds)) == 1 and raw.get("layer_types") is None:
        return  # the family's rule gives this kind for the first layers already
    if "attn_layer_period" in raw:  # Jamba: one attention layer every period, at offset
        if kinds.count("full") != 1:
            raise AssertionError(f"cannot express layer kinds {kinds} with attn_layer_period")
        raw["attn_layer_period"], raw["attn_layer_offset"] = len(kinds), kinds.index("full")
    elif "hybrid_override_pattern" in raw:  # Nemotron-H: M = Mamba2, * = attention
        raw["hybrid_override_pattern"] = "".join({"state": "M", "full": "*"}[k] for k in kinds)
    else:
        raw["layer_types"] = [HF_LAYER_TYPE[k] for k in kinds]


def _layer_groups(spec: ModelSpec, i: int, kv_dtype: str) -> tuple[LayerGroup, ...]:
    """kvplan's groups for layer i alone (a one-layer layout of that layer): one, or one per mixer
    of a parallel hybrid layer (attention, then Mamba)."""
    one = dataclasses.replace(spec, layers=(spec.layers[i],))
    return build_layout(one, kv_dtype).groups


STATE_TENSORS = ("conv_states", "recurrent_states")


def _part(tensors: dict[str, torch.Tensor], g: LayerGroup) -> dict[str, torch.Tensor]:
    """The tensors of a cache layer that belong to group `g`'s mixer: the recurrent state's for a
    state group, the keys and values otherwise (a hybrid layer's cache holds both)."""
    state = g.kind == "state"
    return {k: t for k, t in tensors.items() if (k.split("[")[0] in STATE_TENSORS) == state}


def _kv_key(g: LayerGroup) -> tuple:
    return (g.kind, g.num_kv_heads, g.head_dim, g.v_head_dim, g.latent_dim, g.window, g.state_elems)


def _layers(cache) -> list:
    if hasattr(cache, "layers"):
        return list(cache.layers)
    return [_Legacy(k, v) for k, v in zip(cache.key_cache, cache.value_cache)]  # transformers < 4.56


class _Legacy:
    def __init__(self, keys, values):
        self.keys, self.values = keys, values


def _tensors(layer) -> dict[str, torch.Tensor]:
    """Every tensor a cache layer holds: keys/values, and conv/recurrent states of linear layers."""
    out = {}
    for name in ("keys", "values", "conv_states", "recurrent_states"):
        value = getattr(layer, name, None)
        items = value.items() if isinstance(value, dict) else [(None, value)]
        for idx, t in items:
            if isinstance(t, torch.Tensor) and t.numel():
                out[name if idx is None else f"{name}[{idx}]"] = t
    return out


def _bytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _row(i: int, g: LayerGroup, layer, tensors: dict, hf_bytes: int, growth: int, tokens: int) -> LayerRow:
    shapes = {k: tuple(t.shape) for k, t in tensors.items()}
    elems = sum(t.numel() for t in tensors.values())
    common = dict(layer=i, kind=g.kind, hf_layer_class=type(layer).__name__, hf_tensors=shapes,
                  hf_dtypes={k: str(t.dtype).removeprefix("torch.") for k, t in tensors.items()},
                  hf_bytes=hf_bytes, hf_decode_growth=growth)
    if g.kind == "state":
        return _state_row(g, common, elems)
    held = tensors["keys"].shape[-2] if "keys" in tensors else 0
    per_token = hf_bytes // held if held else 0
    kv_held = g.tokens_held(tokens)
    held_ok, note = held == kv_held, ""
    if not held_ok and g.kind == "sliding" and held == g.window - 1 and tokens >= g.window:
        held_ok, note = True, f"window cap: transformers keeps {held} = window - 1 tokens, kvplan counts {kv_held}"
    capped = g.kind == "sliding" and tokens + 1 >= g.window
    growth_ok = growth == (0 if capped else g.bytes_per_token_per_layer)
    return LayerRow(**common, hf_elems=elems // held if held else elems, kvplan_elems=g.elems_per_token_per_layer,
                    hf_tokens_held=held, kvplan_tokens_held=kv_held, hf_bytes_per_token=per_token,
                    kvplan_bytes_per_token=g.bytes_per_token_per_layer, kvplan_state_bytes=None,
                    ok=per_token == g.bytes_per_token_per_layer and held_ok and growth_ok, note=note)


def _state_row(g: LayerGroup, common: dict, elems: int) -> LayerRow:
    """A recurrent-state layer: same element count and bytes, and no growth with tokens."""
    ok = elems == g.state_elems and common["hf_bytes"] == g.state_bytes and common["hf_decode_growth"] == 0
    note = ""
    if not ok:
        kinds = ", ".join(f"{k} {tuple(v)} {common['hf_dtypes'][k]}" for k, v in common["hf_tensors"].items())
        note = (f"transformers keeps {elems:,} state elements ({kinds}); kvplan counts {g.state_elems:,} "
                f"at {g.state_dtype_bits} bits")
    return LayerRow(**common, hf_elems=elems, kvplan_elems=g.state_elems, hf_tokens_held=None,
                    kvplan_tokens_held=None, hf_bytes_per_token=None, kvplan_bytes_per_token=None,
                    kvplan_state_bytes=g.state_bytes, ok=ok, note=note)
