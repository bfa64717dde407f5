"""KV cache number formats and their sizes in bits (int4 is half a byte, so sizes are kept in bits)."""

from __future__ import annotations

from kvplan.errors import UsageError

DTYPE_BITS: dict[str, int] = {
    "fp32": 32,
    "bf16": 16,
    "fp16": 16,
    "fp8": 8,
    "int8": 8,
    "int4": 4,
}

# Spellings found in config.json files (torch_dtype / dtype) mapped to our names.
CONFIG_DTYPE_NAMES: dict[str, str] = {
    "float32": "fp32",
    "float": "fp32",
    "fp32": "fp32",
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "fp16": "fp16",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "fp8": "fp8",
    "int8": "int8",
}

# vLLM's --kv-cache-dtype spellings of the same formats (fp8_e4m3 is what `fp8` means on CUDA).
KV_DTYPE_ALIASES: dict[str, str] = {"fp8_e4m3": "fp8", "fp8_e5m2": "fp8"}
KV_DTYPE_CHOICES = ("auto", *DTYPE_BITS, *KV_DTYPE_ALIASES)


def kv_dtype_name(name: str) -> str:
    """Our name of a KV dtype as given (vLLM's spellings included)."""
    return KV_DTYPE_ALIASES.get(name, name)


def dtype_bits(name: str) -> int:
    """Bits per element of a KV dtype name; raises UsageError naming the choices."""
    try:
        return DTYPE_BITS[name]
    except KeyError:
        raise UsageError(
            f"unknown dtype {name!r}; expected one of {', '.join(KV_DTYPE_CHOICES)}",
            field="kv-dtype",
        ) from None
