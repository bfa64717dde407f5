"""How vLLM lays out an MXFP4 MoE checkpoint's experts on a GPU (gpt-oss): the kernel backend it
picks for the GPU, and the padded expert tensors that backend allocates on each rank.

vLLM (vllm/model_executor/layers/quantization/mxfp4.py, `get_mxfp4_backend` and
`Mxfp4MoEMethod.create_weights`) picks the MoE kernels by the GPU's architecture:

- NVIDIA below compute capability 9 (A100, A10G, L4, L40S, RTX 4090): Marlin, weight-only FP4
  (the log warns "Your GPU does not have native support for FP4 computation ... leveraging the
  Marlin kernel"). Its kernel needs n % 256 == 0 and k % 128 == 0 in both GEMMs, so each rank's
  intermediate width is padded to a multiple of 128 and the hidden width to a multiple of 256.
  The expert biases stay in the model dtype (Marlin only permutes them).
- Hopper (9.x) and the newer GeForce parts (12.x): the Triton kernels ("Using Triton backend"),
  the intermediate width padded to a multiple of 64; their swizzled layout holds the hidden width
  at a multiple of 256 too (gpt-oss-120b loads 64.38 GiB on one H100, as a 3,072-wide hidden
  dimension gives and 2,880 does not: 61 GiB), and the biases are made float32.
- Blackwell (10.x), where vLLM's images ship FlashInfer: its MXFP4 x BF16 kernels, both widths
  padded to a multiple of 256, biases in float32.
- AMD (ROCm, Triton): both widths padded to 256 on gfx950 (MI355X), else to 128.
- No GPU named: the Triton rule (what the checkpoint takes on an H100).

An install can force another backend: VLLM_MXFP4_USE_MARLIN=1 takes Marlin on any NVIDIA GPU
from compute capability 8.0 (vLLM's own fallback where the triton_kernels package is missing, as
on a Hopper pip install of the early gpt-oss releases, whose log then warns of weight-only FP4),
and a Blackwell or Hopper install may run FlashInfer's. `kvplan size --mxfp4-backend` takes that
choice; "auto" is vLLM's pick by GPU.

Tensor parallelism splits each expert's intermediate width over the ranks before the padding, so
a rank of TP4 pads 2,880 / 4 = 720 to 768 on Marlin (+6.7%), where TP1 pads 2,880 to 2,944.
Each padded expert holds 3 x hidden x intermediate 4-bit values with one 8-bit scale per 32
(4.25 bits each) and its gate_up and down biases (2 x intermediate + hidden).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvplan.model.gpus import GPU

MXFP4_BITS = 4.25  # a 4-bit value and an 8-bit E8M0 scale per 32


@dataclass(frozen=True, slots=True)
class Backend:
    name: str
    intermediate_align: int  # each rank's expert intermediate width is padded to a multiple of this
    hidden_align: int  # the hidden width is padded to a multiple of this
    bias_bytes: int  # bytes per expert bias element after loading


MARLIN = Backend("Marlin", 128, 256, 2)
TRITON = Backend("Triton", 64, 256, 4)
FLASHINFER = Backend("FlashInfer", 256, 256, 4)


CHOICES = ("auto", "marlin", "triton", "flashinfer")
FIELD = "--mxfp4-backend"


def mxfp4_backend(gpu: GPU | None, choice: str = "auto") -> Backend:
    """The MoE backend vLLM runs MXFP4 experts with on `gpu`: its pick by architecture, or the
    one an install forces (`choice`), where the GPU can run it (the module docstring)."""
    if choice != "auto":
        return _forced(gpu, choice)
    if gpu is None:
        return TRITON
    if gpu.vendor == "AMD":
        align = 256 if gpu.gfx_target == 950 else 128
        return Backend("Triton (ROCm)", align, align, 4)
    cc = gpu.compute_capability
    if 0 < cc < 9:
        return MARLIN
    if 10 <= cc < 11:
        return FLASHINFER
    return TRITON


def _forced(gpu: GPU | None, choice: str) -> Backend:
    from kvplan.errors import UsageError

    if choice not in CHOICES:
        raise UsageError(f"expected one of {', '.join(CHOICES)}, got {choice!r}", field=FIELD)
    if choice == "triton":
        return mxfp4_backend(gpu) if gpu is not None and gpu.vendor == "AMD" else TRITON
    if gpu is not None and gpu.vendor == "AMD":
        raise UsageError(f"expected auto or triton on an AMD GPU ({gpu.name}): vLLM runs MXFP4 experts "
                         f"there with its ROCm kernels, not {choice}", field=FIELD)
    need = 8.0 if choice == "marlin" else 9.0
    if gpu is not None and 0 < gpu.compute_capability < need:
        raise UsageError(f"{choice} needs compute capability {need:g} or above; {gpu.name} has "
                         f"{gpu.compute_capability:g}", field=FIELD)
    return MARLIN if choice == "marlin" else FLASHINFER


def _round_up(n: int, align: int) -> int:
    return -(-n // align) * align


def expert_bytes_per_rank(count: int, hidden: int, intermediate: int, tp: int, backend: Backend) -> int:
    """What one of `tp` ranks holds of `count` experts (experts x MoE layers), each `hidden` wide
    with an `intermediate` width split over the ranks, as `backend` pads them."""
    h = _round_up(hidden, backend.hidden_align)
    i = _round_up(-(-intermediate // tp), backend.intermediate_align)
    values = 3 * h * i * MXFP4_BITS / 8
    return count * (int(values) + (2 * i + h) * backend.bias_bytes)


__all__ = ["Backend", "CHOICES", "MXFP4_BITS", "expert_bytes_per_rank", "mxfp4_backend"]
