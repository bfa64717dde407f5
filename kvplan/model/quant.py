"""Bits per weight as vLLM loads a checkpoint: from its `quantization_config`, or an online scheme.

Every scheme is stated as the storage vLLM allocates for one weight of a linear layer, values
plus their scales and zero points, each term from the format's own layout (the sources are the
format specifications and vLLM's quantization methods, `vllm/model_executor/layers/quantization`):

| scheme | value bits | per group | effective bits |
|---|---|---|---|
| fp8 per tensor / channel (`fp8`, compressed-tensors float 8, ModelOpt FP8, online `--quantization fp8`) | 8 | a float32 scale per tensor or output row | 8 |
| fp8 block-wise (`weight_block_size: [128, 128]`, DeepSeek V3) | 8 | a float32 scale per 128 x 128 block | 8 + 32 / 16,384 |
| int4/int8 with groups (GPTQ, AWQ, compressed-tensors pack-quantized) | b | a 16-bit scale per `group_size`, and a b-bit zero point when asymmetric | b + (16 + zero) / group |
| bitsandbytes nf4/fp4 | 4 | a float32 absmax per 64 (with double quantization: 8 bits per 64, plus a float32 per 256 blocks) | 4.5 (4.127) |
| bitsandbytes 8-bit (LLM.int8) | 8 | a float32 scale per output row | 8 |
| MXFP4 (gpt-oss experts) | 4 | an 8-bit E8M0 scale per 32 | 4.25 |
| NVFP4 (ModelOpt FP4) | 4 | an 8-bit E4M3 scale per 16, a float32 per tensor | 4.5 |

A per-row or per-tensor scale is counted as zero bits: one float per 4,096 weights or more is
below 0.01 bit. What stays in the model dtype: embeddings and lm_head (unless a scheme's
targets include them, which no common checkpoint does), layers named in `ignore` (compressed-
tensors) or `modules_to_not_convert` (MXFP4, bitsandbytes, ModelOpt), and MoE routers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvplan.errors import ConfigError

MODULES = ("attention", "mlp", "experts", "state")  # linear weights a scheme may quantize
ONLINE = ("fp8",)  # vLLM's --quantization values that quantize a bf16 checkpoint when loading


@dataclass(frozen=True, slots=True)
class QuantScheme:
    """Effective bits per weight of each kind of linear layer (None: the model dtype)."""

    name: str
    bits: dict[str, float | None]

    def bits_for(self, module: str, dtype_bits: int) -> float:
        value = self.bits.get(module)
        return dtype_bits if value is None else value


NONE = QuantScheme("none", {})


def group_bits(bits: int, group: int | None, asymmetric: bool, scale_bits: int = 16) -> float:
    """Bits per weight of b-bit values with a scale (and zero point) per `group` weights."""
    if not group or group < 0:  # per channel or per tensor: the scales are negligible
        return float(bits)
    return bits + (scale_bits + (bits if asymmetric else 0)) / group


def scheme_of(raw: dict, source: str, online: str | None = None) -> QuantScheme:
    """The scheme of a config's `quantization_config`, or of vLLM's online `--quantization`."""
    if online is not None:
        if online not in ONLINE:
            raise ConfigError(f"unknown online quantization {online!r}; expected one of "
                              f"{', '.join(ONLINE)}", field="--quantization")
        if isinstance(raw.get("quantization_config"), dict):
            raise ConfigError("the checkpoint is already quantized; --quantization applies to a "
                              "bf16/fp16 checkpoint", file=source, field="--quantization")
        return QuantScheme("fp8 (online)", {m: 8.0 for m in MODULES})
    quant = raw.get("quantization_config")
    if quant is None:
        return NONE
    if not isinstance(quant, dict):
        raise ConfigError("expected an object", file=source, field="quantization_config")
    method = str(quant.get("quant_method", "")).lower()
    reader = _READERS.get(method)
    if reader is None:
        if quant.get("bits") is not None:  # an unnamed integer scheme: its bits, scales unknown
            return QuantScheme(method or "bits", {m: float(_int(quant, "bits", source, maximum=16)) for m in MODULES})
        raise ConfigError(f"unknown quant_method {method!r}", file=source, field="quantization_config.quant_method")
    return reader(quant, source)


def _int(quant: dict, key: str, source: str, default: int | None = None, maximum: int = 1 << 20) -> int:
    value = quant.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= maximum:
        if value is None and default is None:
            raise ConfigError("missing", file=source, field=f"quantization_config.{key}")
        raise ConfigError(f"expected a whole number, got {value!r}", file=source,
                          field=f"quantization_config.{key}")
    return value


def _excluded(quant: dict, source: str, *keys: str) -> set[str]:
    """Which module kinds the list of excluded module names (or `re:` patterns) under the first
    of `keys` that the config has leaves unquantized.

    Routers, embeddings and lm_head are never quantized here, so naming them changes nothing.
    """
    key = next((k for k in keys if quant.get(k) is not None), None)
    names = quant.get(key) if key else []
    if not isinstance(names, list):
        raise ConfigError(f"expected a list of module names, got {names!r}"[:200], file=source,
                          field=f"quantization_config.{key}")
    out: set[str] = set()
    for name in names:
        text = str(name).lower()
        if "shared_expert" in text or re.search(r"gate_proj|up_proj|down_proj|\bmlp\b(?!\.(gate|router))", text) \
                and "experts" not in text:
            out.add("mlp")
        elif "experts" in text:
            out.add("experts")
        elif re.search(r"attn|attention|q_proj|k_proj|v_proj|o_proj|qkv", text):
            out.add("attention")
        elif re.search(r"mamba|mixer|in_proj|out_proj", text):
            out.add("state")
    return out


def _uniform(name: str, bits: float, excluded: set[str]) -> QuantScheme:
    return QuantScheme(name, {m: (None if m in excluded else bits) for m in MODULES})


def _fp8(quant: dict, source: str) -> QuantScheme:
    block = quant.get("weight_block_size")
    bits = 8.0
    if isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block):
        bits += 32 / (block[0] * block[1])
    return _uniform("fp8" + (" block" if block else ""), bits,
                    _excluded(quant, source, "modules_to_not_convert", "ignored_layers"))


def _gptq_awq(quant: dict, source: str) -> QuantScheme:
    bits = _int(quant, "bits", source, quant.get("w_bit"), maximum=16)
    group = quant.get("group_size", quant.get("q_group_size", 128))
    if isinstance(group, bool) or not isinstance(group, int):
        raise ConfigError(f"expected a whole number, got {group!r}", file=source,
                          field="quantization_config.group_size")
    asymmetric = bool(quant.get("zero_point", not quant.get("sym", True)))
    if str(quant.get("quant_method")).lower() == "gptq":
        asymmetric = True  # GPTQ checkpoints store qzeros even when symmetric
    return _uniform(str(quant.get("quant_method")).lower(), group_bits(bits, group, asymmetric),
                    _excluded(quant, source, "modules_to_not_convert"))


def _bitsandbytes(quant: dict, source: str) -> QuantScheme:
    if quant.get("load_in_8bit"):
        bits = 8.0
    else:
        double = bool(quant.get("bnb_4bit_use_double_quant"))
        bits = 4 + (8 / 64 + 32 / (64 * 256) if double else 32 / 64)
    return _uniform("bitsandbytes", bits, _excluded(quant, source, "llm_int8_skip_modules"))


def _mxfp4(quant: dict, source: str) -> QuantScheme:
    excluded = _excluded(quant, source, "modules_to_not_convert") | {"attention", "mlp", "state"}
    return QuantScheme("mxfp4", {m: (None if m in excluded else 4.25) for m in MODULES})


def _modelopt(quant: dict, source: str) -> QuantScheme:
    nested = quant.get("quantization")
    algo = str(quant.get("quant_algo") or (nested.get("quant_algo", "") if isinstance(nested, dict) else "")).upper()
    bits = 4.5 + 32 / 2**20 if "FP4" in algo else 8.0
    return _uniform(f"modelopt {algo.lower() or 'fp8'}", bits,
                    _excluded(quant, source, "exclude_modules", "ignore"))


def _compressed_tensors(quant: dict, source: str) -> QuantScheme:
    groups = quant.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ConfigError("expected config_groups", file=source, field="quantization_config.config_groups")
    bits_seen = []
    for name, group in groups.items():
        where = f"quantization_config.config_groups.{name}.weights"
        weights = group.get("weights") if isinstance(group, dict) else None
        if not isinstance(weights, dict):
            raise ConfigError("expected an object", file=source, field=where)
        bits = weights.get("num_bits")
        if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 16:
            raise ConfigError(f"expected num_bits from 1 to 16, got {bits!r}", file=source, field=f"{where}.num_bits")
        strategy = str(weights.get("strategy", "tensor")).lower()
        kind = str(weights.get("type", "int")).lower()
        group_size = weights.get("group_size") if strategy in ("group", "tensor_group") else None
        if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, int)):
            raise ConfigError(f"expected a whole number, got {group_size!r}", file=source, field=f"{where}.group_size")
        scale_bits = 8 if kind == "float" and bits == 4 else 16  # NVFP4: fp8 scales per 16
        if strategy == "block":
            block = weights.get("block_structure")
            if not (isinstance(block, list) and len(block) == 2
                    and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
                block = [128, 128]  # vLLM's default block for fp8 block-wise weights
            bits_seen.append(bits + 32 / (block[0] * block[1]))
        else:
            bits_seen.append(group_bits(bits, group_size, not weights.get("symmetric", True), scale_bits))
    bits = max(bits_seen)  # groups of one checkpoint quantize every target alike in practice
    return _uniform("compressed-tensors", bits, _excluded(quant, source, "ignore"))


_READERS = {
    "fp8": _fp8, "gptq": _gptq_awq, "awq": _gptq_awq, "awq_marlin": _gptq_awq, "gptq_marlin": _gptq_awq,
    "bitsandbytes": _bitsandbytes, "mxfp4": _mxfp4, "modelopt": _modelopt, "modelopt_fp4": _modelopt,
    "compressed-tensors": _compressed_tensors, "compressed_tensors": _compressed_tensors,
}  # fmt: skip
