"""KV number formats as torch storage: which dtype a pool holds, and how values go in and out.

bf16, fp16 and fp32 are stored as they are. fp8 is torch.float8_e4m3fn with scale 1.0 (vLLM's
default without calibration). int8 and int4 are storage formats only: values are quantized with a
fixed symmetric scale on write and dequantized to the compute dtype on read; there is no int8 or
int4 attention kernel here, the arithmetic runs in the compute dtype. int4 packs two values per
uint8 byte along the last dimension (low nibble first), so its pool tensors have half the last dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvplan.errors import UsageError

INT8_SCALE = 1 / 32  # range about +-4, for roughly unit-variance K and V
INT4_SCALE = 0.5  # levels -8..7, range -4..3.5

_FLOAT_STORAGE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Codec:
    """How one KV dtype is stored: `storage` elements, `pack` values per element on the last dim."""

    name: str
    storage: torch.dtype
    compute: torch.dtype
    pack: int = 1
    scale: float | None = None

    @property
    def storage_only(self) -> bool:
        """True for formats kept in memory but computed on after dequantizing (int8, int4)."""
        return self.scale is not None

    def storage_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if shape[-1] % self.pack:
            raise UsageError(f"{self.name} packs {self.pack} values per byte; last dim {shape[-1]} is odd",
                             field="kv-dtype")
        return (*shape[:-1], shape[-1] // self.pack)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Values (any float dtype) to storage elements."""
        if self.name == "int4":
            q = (torch.round(x.float() / self.scale).clamp(-8, 7) + 8).to(torch.uint8)
            return q[..., 0::2] | (q[..., 1::2] << 4)
        if self.name == "int8":
            return torch.round(x.float() / self.scale).clamp(-128, 127).to(torch.int8)
        return x.to(self.storage)

    def decode(self, stored: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Storage elements to values in `dtype` (default: the compute dtype)."""
        dtype = dtype or self.compute
        if self.name == "int4":
            lo, hi = stored & 0xF, stored >> 4
            q = torch.stack((lo, hi), dim=-1).flatten(-2)
            return ((q.to(torch.float32) - 8) * self.scale).to(dtype)
        if self.name == "int8":
            return (stored.to(torch.float32) * self.scale).to(dtype)
        return stored.to(dtype)

    def round_trip(self, x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """What reading back a written value gives: the dense reference's view of the data."""
        return self.decode(self.encode(x), dtype)

    def raw(self, t: torch.Tensor) -> torch.Tensor:
        """A view that indexing and copying support on every device (fp8 as bytes)."""
        return t.view(torch.uint8) if self.name == "fp8" else t

    def unraw(self, t: torch.Tensor) -> torch.Tensor:
        return t.view(self.storage) if self.name == "fp8" else t


def codec_for(name: str, device: torch.device | str = "cpu") -> Codec:
    """The codec of kvplan dtype `name`; quantized formats compute in bf16 on CUDA, fp32 on CPU."""
    quantized_compute = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    if name in _FLOAT_STORAGE:
        return Codec(name, _FLOAT_STORAGE[name], _FLOAT_STORAGE[name])
    if name == "fp8":
        fp8 = getattr(torch, "float8_e4m3fn", None)
        if fp8 is None:
            raise UsageError(f"fp8 needs torch >= 2.1 (torch.float8_e4m3fn); this is {torch.__version__}",
                             field="kv-dtype")
        return Codec("fp8", fp8, quantized_compute)
    if name == "int8":
        return Codec("int8", torch.int8, quantized_compute, scale=INT8_SCALE)
    if name == "int4":
        return Codec("int4", torch.uint8, quantized_compute, pack=2, scale=INT4_SCALE)
    raise UsageError(f"no torch storage for KV dtype {name!r}", field="kv-dtype")

