"""The GPU catalog: memory size, memory bandwidth and dense bf16 peak of common serving accelerators.

What ``memory_bytes`` means
---------------------------
``memory_bytes`` is the total memory the device reports to software, not a marketing figure: the
``memory.total`` that ``nvidia-smi`` prints (in MiB, here times 2**20), and for AMD the VRAM total that
``rocm-smi`` prints in bytes.

The data-sheet "GB" of HBM parts is binary: an "80 GB" H100 carries 80 GiB of DRAM (five 16 GiB stacks)
and an "A100 40GB" carries 40 GiB. What the device reports is that capacity or a little less:

* A100-40GB reports 40,960 MiB, exactly 40 GiB; A100-80GB reports 81,920 MiB, exactly 80 GiB.
* H100 80GB reports 81,559 MiB (about 79.6 GiB); the rest is held back by the GPU itself.
* H200 ("141 GB") reports 143,771 MiB (about 140.4 GiB); B200 ("180 GB" usable of 192 GiB) reports
  183,359 MiB (about 179.1 GiB); MI300X ("192 GB") reports 205,822,885,888 bytes (about 191.7 GiB).
* GDDR boards with ECC switched on (A10G, L4, L40S, as the clouds ship them) lose about 1/16 to ECC:
  an L4 "24 GB" reports 23,034 MiB. The RTX 4090 has no ECC and reports 24,564 MiB of its 24 GiB.

So a "40 GB" A100 is treated as 40 GiB, and "80 GB" is never read as 80 * 10**9 bytes. PyTorch's
``torch.cuda.get_device_properties(0).total_memory`` (``cudaMemGetInfo``) is usually a few hundred MiB
lower again, because the CUDA context is already resident; that belongs to the memory planner's
overhead terms, not to this table.

The number this reproduces is Kwon et al.'s vLLM set-up (SOSP 2023, Figure 1): OPT-13B in fp16 weighs
about 25.7 GB (23.9 GiB); on one A100-40GB with 90% of its 40 GiB given to vLLM, 36 - 23.9 leaves about
12 GiB for the KV cache.

Bandwidth and compute
---------------------
``hbm_bytes_per_s`` is the data-sheet peak memory bandwidth in bytes per second (decimal: 3.35 TB/s is
3.35e12). ``peak_bf16_flops`` is the data-sheet dense bf16 tensor-core peak, without the 2:4 sparsity
doubling that data sheets often print first. The V100 has no bf16 units; its entry carries the fp16
tensor-core peak and says so in ``source``.

This module imports nothing of kvplan's except ``kvplan.errors``.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from kvplan.errors import UsageError

MiB = 1024**2
GiB = 1024**3


@dataclass(frozen=True)
class GPU:
    """One accelerator model: sizes as the device reports them, speeds as the data sheet states them."""

    name: str
    memory_bytes: int
    hbm_bytes_per_s: float
    peak_bf16_flops: float
    vendor: str
    source: str

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GiB


_CATALOG: tuple[tuple[GPU, tuple[str, ...]], ...] = (
    (
        GPU(
            name="A10G",
            memory_bytes=23_028 * MiB,
            hbm_bytes_per_s=600e9,
            peak_bf16_flops=70e12,
            vendor="NVIDIA",
            source=(
                "AWS EC2 G5 instance specifications (NVIDIA publishes no A10G data sheet): 24 GB GDDR6, "
                "600 GB/s; about 70 TFLOPS dense bf16, the A10G figure in the AWS/NVIDIA comparison "
                "tables (the A10 data sheet's 125 TFLOPS does not apply); 23,028 MiB reported with ECC on"
            ),
        ),
        ("NVIDIA A10G", "A10G-24GB"),
    ),
    (
        GPU(
            name="L4",
            memory_bytes=23_034 * MiB,
            hbm_bytes_per_s=300e9,
            peak_bf16_flops=121e12,
            vendor="NVIDIA",
            source=(
                "NVIDIA L4 Tensor Core GPU data sheet: 24 GB GDDR6, 300 GB/s, bf16 242 TFLOPS with "
                "sparsity (121 dense); 23,034 MiB reported with ECC on"
            ),
        ),
        ("NVIDIA L4", "L4-24GB"),
    ),
    (
        GPU(
            name="L40S",
            memory_bytes=46_068 * MiB,
            hbm_bytes_per_s=864e9,
            peak_bf16_flops=362.05e12,
            vendor="NVIDIA",
            source=(
                "NVIDIA L40S data sheet: 48 GB GDDR6 with ECC, 864 GB/s, bf16 362.05 TFLOPS dense "
                "(733 with sparsity); 46,068 MiB reported with ECC on"
            ),
        ),
        ("NVIDIA L40S", "L40S-48GB"),
    ),
    (
        GPU(
            name="A100-40GB",
            memory_bytes=40_960 * MiB,
            hbm_bytes_per_s=1_555e9,
            peak_bf16_flops=312e12,
            vendor="NVIDIA",
            source=(
                "NVIDIA A100 Tensor Core GPU data sheet (40GB): 40 GB HBM2, 1,555 GB/s, bf16 312 TFLOPS "
                "dense (624 with sparsity); reports 40,960 MiB"
            ),
        ),
        ("A100-SXM4-40GB", "A100 40GB", "A100-40G", "A100-PCIE-40GB", "NVIDIA A100-SXM4-40GB"),
    ),
    (
        GPU(
            name="A100-80GB",
            memory_bytes=81_920 * MiB,
            hbm_bytes_per_s=2_039e9,
            peak_bf16_flops=312e12,
            vendor="NVIDIA",
            source=(
                "NVIDIA A100 Tensor Core GPU data sheet (80GB SXM): 80 GB HBM2e, 2,039 GB/s, bf16 312 "
                "TFLOPS dense (624 with sparsity); reports 81,920 MiB"
            ),
        ),
        ("A100-SXM4-80GB", "A100 80GB", "A100-80G", "NVIDIA A100-SXM4-80GB"),
    ),
    (
        GPU(
            name="H100-80GB",
            memory_bytes=81_559 * MiB,
            hbm_bytes_per_s=3.35e12,
            peak_bf16_flops=989e12,
            vendor="NVIDIA",
            source=(
                "NVIDIA H100 Tensor Core GPU data sheet (H100 SXM): 80 GB HBM3, 3.35 TB/s, bf16 1,979 "
                "TFLOPS with sparsity (989 dense); reports 81,559 MiB"
            ),
        ),
        ("H100", "H100-SXM", "H100-SXM5-80GB", "H100-SXM-80GB", "H100 80GB HBM3", "NVIDIA H100 80GB HBM3"),
    ),
    (
        GPU(
            name="H100-PCIe",
            memory_bytes=81_559 * MiB,
            hbm_bytes_per_s=2.0e12,
            peak_bf16_flops=756e12,
            vendor="NVIDIA",
            source=(
                "NVIDIA H100 Tensor Core GPU data sheet (H100 PCIe): 80 GB HBM2e, 2 TB/s, bf16 1,513 "
                "TFLOPS with sparsity (756 dense); reports 81,559 MiB"
            ),
        ),
        ("H100 PCIe", "H100-PCIe-80GB", "NVIDIA H100 PCIe"),
    ),
    (
        GPU(
            name="H200",
            memory_bytes=143_771 * MiB,
            hbm_bytes_per_s=4.8e12,
            peak_bf16_flops=989e12,
            vendor="NVIDIA",
            source=(
                "NVIDIA H200 Tensor Core GPU data sheet (H200 SXM): 141 GB HBM3e, 4.8 TB/s, bf16 1,979 "
                "TFLOPS with sparsity (989 dense); reports 143,771 MiB"
            ),
        ),
        ("H200-SXM", "H200-141GB", "NVIDIA H200"),
    ),
    (
        GPU(
            name="B200",
            memory_bytes=183_359 * MiB,
            hbm_bytes_per_s=8e12,
            peak_bf16_flops=2.25e15,
            vendor="NVIDIA",
            source=(
                "NVIDIA HGX B200 specifications: 1.4 TB HBM3e and 64 TB/s per 8-GPU board (180 GB, "
                "8 TB/s per GPU), fp16/bf16 36 PFLOPS per board with sparsity, so 2.25 PFLOPS dense per "
                "GPU; reports 183,359 MiB"
            ),
        ),
        ("B200-180GB", "B200-SXM", "HGX B200", "NVIDIA B200"),
    ),
    (
        GPU(
            name="MI300X",
            memory_bytes=205_822_885_888,
            hbm_bytes_per_s=5.3e12,
            peak_bf16_flops=1307.4e12,
            vendor="AMD",
            source=(
                "AMD Instinct MI300X data sheet: 192 GB HBM3, 5.3 TB/s, bf16 1,307.4 TFLOPS dense "
                "(2,614.9 with sparsity); rocm-smi reports 205,822,885,888 bytes of VRAM"
            ),
        ),
        ("Instinct MI300X", "AMD Instinct MI300X", "MI300X-192GB"),
    ),
    (
        GPU(
            name="V100-32GB",
            memory_bytes=32_510 * MiB,
            hbm_bytes_per_s=900e9,
            peak_bf16_flops=125e12,
            vendor="NVIDIA",
            source=(
                "NVIDIA Tesla V100 data sheet (SXM2 32GB): 32 GB HBM2, 900 GB/s; V100 has no bf16 tensor "
                "cores, so this is the 125 TFLOPS fp16 tensor peak; reports 32,510 MiB"
            ),
        ),
        ("V100-SXM2-32GB", "Tesla V100-SXM2-32GB", "V100 32GB"),
    ),
    (
        GPU(
            name="RTX-4090",
            memory_bytes=24_564 * MiB,
            hbm_bytes_per_s=1_008e9,
            peak_bf16_flops=165.2e12,
            vendor="NVIDIA",
            source=(
                "NVIDIA Ada Lovelace architecture whitepaper (GeForce RTX 4090): 24 GB GDDR6X, 1,008 GB/s, "
                "bf16 with fp32 accumulate 165.2 TFLOPS dense (330.3 with sparsity); reports 24,564 MiB"
            ),
        ),
        ("RTX 4090", "RTX4090", "4090", "GeForce RTX 4090", "NVIDIA GeForce RTX 4090"),
    ),
)

GPUS: dict[str, GPU] = {gpu.name: gpu for gpu, _ in _CATALOG}
ALIASES: dict[str, str] = {alias: gpu.name for gpu, aliases in _CATALOG for alias in aliases}

# Words that device names start with but that say nothing about the model ("NVIDIA GeForce RTX 4090",
# "Tesla V100-SXM2-32GB", "AMD Instinct MI300X").
_PREFIXES = ("nvidia", "amd", "tesla", "geforce", "instinct")


def _key(name: str) -> str:
    """Lookup key: lower case, letters and digits only, vendor and brand words dropped from the front."""
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    stripped = True
    while stripped:
        stripped = False
        for prefix in _PREFIXES:
            if key.startswith(prefix) and len(key) > len(prefix):
                key = key[len(prefix) :]
                stripped = True
    return key


def _build_index() -> dict[str, str]:
    index: dict[str, str] = {}
    for spelling, canonical in [*((n, n) for n in GPUS), *ALIASES.items()]:
        key = _key(spelling)
        if index.setdefault(key, canonical) != canonical:
            raise AssertionError(f"GPU spelling {spelling!r} is claimed by {index[key]} and {canonical}")
    return index


_INDEX = _build_index()


def gpu_names() -> list[str]:
    """Canonical names of every catalog GPU, in catalog order (smallest to largest, roughly)."""
    return list(GPUS)


def close_gpu_names(name: str, n: int = 4) -> list[str]:
    """Canonical names that look like ``name`` (difflib over names and aliases), best first."""
    key = _key(name)
    # Spellings that extend what was typed ("a100" -> "a10040gb", "a10080gb") rank first.
    extending = [k for k in _INDEX if key and k.startswith(key)]
    matches = extending + difflib.get_close_matches(key, list(_INDEX), n=3 * n, cutoff=0.5)
    out: list[str] = []
    for match in matches:
        canonical = _INDEX[match]
        if canonical not in out:
            out.append(canonical)
    return out[:n]


def get_gpu(name: str) -> GPU:
    """The catalog GPU for a name or alias, case- and punctuation-insensitive ("h100 sxm" works).

    An unknown name raises UsageError(field="gpu") that lists close matches and the known names.
    """
    if isinstance(name, GPU):
        return name
    canonical = _INDEX.get(_key(str(name))) if str(name).strip() else None
    if canonical is not None:
        return GPUS[canonical]
    close = close_gpu_names(str(name))
    hint = f" Did you mean {' or '.join(close)}?" if close else ""
    raise UsageError(
        f"unknown GPU {str(name)!r}.{hint} Known GPUs: {', '.join(gpu_names())}.",
        field="gpu",
    )
