"""The GPU catalog: memory, bandwidth, data-sheet peaks and measured matmul FLOP/s of serving accelerators.

What ``memory_bytes`` means
---------------------------
``memory_bytes`` is the total memory the device reports to software, not a marketing figure: the
``memory.total`` that ``nvidia-smi`` prints (in MiB, here times 2**20), and for AMD the VRAM total that
``rocminfo`` prints as the GPU agent's global segment (what HIP reports as its total, a few MiB above
what torch sees).

The data-sheet "GB" of HBM parts is binary: an "80 GB" H100 carries 80 GiB of DRAM (five 16 GiB stacks)
and an "A100 40GB" carries 40 GiB. What the device reports is that capacity or a little less:

* A100-40GB reports 40,960 MiB, exactly 40 GiB; A100-80GB reports 81,920 MiB, exactly 80 GiB.
* H100 80GB reports 81,559 MiB (about 79.6 GiB); the rest is held back by the GPU itself.
* H200 ("141 GB") reports 143,771 MiB (about 140.4 GiB); B200 ("180 GB" usable of 192 GiB) reports
  183,359 MiB (about 179.1 GiB); MI300X ("192 GB", eight 24 GiB stacks) reports 201,310,208 KiB (about 191.98 GiB).
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

Names
-----
``get_gpu`` takes a canonical name or any listed alias, ignoring case, punctuation and vendor words
("nvidia h100 nvl"). A bare family name that begins several catalog GPUs and is listed for none of them
is ambiguous and is refused with the choices: "A100" (A100-40GB, A100-80GB), "H100" (H100-80GB,
H100-PCIe, H100-NVL), "RTX". A name listed for exactly one GPU is never ambiguous: "L40" is the L40 and
"L40S" the L40S; "H100 SXM" is the H100-80GB.

Where no public log gives a GPU's CUDA total, ``cuda_memory_bytes`` follows the relation recorded in
``tests/data/cuda_totals.yaml`` (CUDA total = nvidia-smi total - Reserved) with a sibling board's
Reserved, or a sibling's total where the device total is the same; its ``source`` says which.

Achievable matmul FLOP/s
------------------------
``mamf_bf16_flops`` and ``mamf_fp8_flops`` are measured, not data-sheet, figures: the maximum
achievable matmul FLOP/s (MAMF), the best torch.matmul throughput over a search of large shapes, as
Stas Bekman's ML Engineering book tabulates it (each entry cites the table). A data-sheet peak is
never reached (clocks fall under the power limit at full load). A GPU the table does not list has 0
there, and ``MAMF_DEFAULT_SHARE`` (the median measured / peak share of the table's NVIDIA rows, in the
file with its source) gives the share of its peak to take instead (kvplan/model/step_time.py).

Achievable memory bandwidth
---------------------------
``hbm_achievable_bytes_per_s`` is the memory analogue of MAMF: the best published bandwidth of a copy
or STREAM-like kernel (copy, scale, add or triad over arrays far larger than the caches, counting the
bytes read and written) on that GPU, each entry citing its measurement (BabelStream-style nvbench runs
of NVIDIA's CCCL, RRZE's gpu-stream, AMD's rocprofiler-compute roofline). A data-sheet bandwidth is
never reached even by a copy, and how close a GPU gets differs by part: the HBM3 / HBM3E MI300-series
parts measure 0.71-0.74 of their data sheets, NVIDIA's parts 0.84-0.94. A GPU without a measured
figure has 0 there, and ``HBM_DEFAULT_SHARE`` (the median measured / data-sheet share, in the file with
its source) gives the share of its data sheet to take instead (``achievable_hbm_bytes_per_s``). The
step-time model reads weights and KV at this bandwidth times its fitted bandwidth_efficiency
(kvplan/model/step_time.py).

Compute units
-------------
``compute_units`` is the number of streaming multiprocessors (NVIDIA) or compute units (AMD) that
run a kernel's thread blocks: from the architecture whitepapers and data sheets (CUDA cores / 128
per SM on Ampere GA10x, Ada and Blackwell) and ROCm's GPU hardware specifications. The step-time
model's opt-in fused-MoE tile model counts the MoE kernel's tiles against it
(kvplan/model/step_time.py, fused_moe_stream_factor).

The figures live in ``gpus.json`` beside this module (shipped in the wheel), each with its source;
``load_catalog`` reads it with kvplan/fileio.py and validates it. This module imports nothing of
kvplan's except ``kvplan.errors`` and ``kvplan.fileio``.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from kvplan.errors import ConfigError, UsageError
from kvplan.fileio import load_json, read_limited

MiB = 1024**2
GiB = 1024**3
CATALOG_FILE = Path(__file__).with_name("gpus.json")
FIGURES = ("memory_bytes", "hbm_bytes_per_s", "peak_bf16_flops", "cuda_memory_bytes")
# 0 when absent (no fp8 units; no figure; not measured)
OPTIONAL = ("peak_fp8_flops", "link_bytes_per_s", "mamf_bf16_flops", "mamf_fp8_flops", "compute_capability",
            "gfx_target", "network_bytes_per_s", "compute_units", "hbm_achievable_bytes_per_s")
# whole numbers (bytes; the gfx target; SMs / CUs)
WHOLE = ("memory_bytes", "cuda_memory_bytes", "gfx_target", "compute_units")
VENDORS = ("NVIDIA", "AMD")
SHARES = ("bf16", "fp8")  # the keys of mamf_default_share
MAX_CATALOG_BYTES = 4 * 2**20


@dataclass(frozen=True)
class GPU:
    """One accelerator model: sizes as the device reports them, speeds as the data sheet states them."""

    name: str
    memory_bytes: int
    hbm_bytes_per_s: float
    peak_bf16_flops: float
    vendor: str
    sources: dict[str, str] = field(hash=False, compare=False)  # figure -> where it comes from
    cuda_memory_bytes: int = 0  # the total CUDA reports to a process (torch.cuda.mem_get_info)
    peak_fp8_flops: float = 0.0  # dense fp8 tensor-core peak; 0: no fp8 tensor cores
    link_bytes_per_s: float = 0.0  # GPU-to-GPU bandwidth each way (NVLink, or PCIe without it)
    mamf_bf16_flops: float = 0.0  # measured maximum achievable bf16 matmul FLOP/s; 0: not measured
    mamf_fp8_flops: float = 0.0  # the same at fp8; 0: not measured (or no fp8 units)
    compute_capability: float = 0.0  # NVIDIA: the CUDA compute capability (8.0 A100, 9.0 H100); 0: not stated
    gfx_target: int = 0  # AMD: the LLVM gfx target (942 MI300X, 950 MI355X); 0: not stated
    network_bytes_per_s: float = 0.0  # the scale-out network per GPU, each way (InfiniBand / RoCE NIC of
    #   the platform's reference design); 0: not stated (kvplan/model/parallel_step.py takes its default)
    compute_units: int = 0  # streaming multiprocessors (NVIDIA) or compute units (AMD) that run a
    #   kernel's thread blocks (kvplan/model/step_time.py: the fused-MoE kernel's tiles); 0: not stated
    hbm_achievable_bytes_per_s: float = 0.0  # measured: the best published copy / STREAM-like kernel's
    #   bandwidth (bytes read and written per second); 0: not measured (HBM_DEFAULT_SHARE of the data sheet)

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GiB


@dataclass(frozen=True)
class Catalog:
    """What the catalog file holds: every GPU with its aliases, in catalog order, and the share of a
    data-sheet peak taken as the MAMF of a GPU without a measured one, by dtype, and the share of the
    data-sheet memory bandwidth taken as the achievable one of a GPU without a measured one."""

    gpus: tuple[tuple[GPU, tuple[str, ...]], ...]
    mamf_default_share: dict[str, float]
    hbm_default_share: float  # the share of the data-sheet bandwidth a GPU without a measured one reaches


def load_catalog(path: Path = CATALOG_FILE) -> Catalog:
    """Read and validate the GPU catalog file.

    A wrong file fails with one ConfigError naming the file and the field (`gpus[3].memory_bytes`).
    """
    doc = load_json(read_limited(path, MAX_CATALOG_BYTES, ConfigError, what="the GPU catalog"), path, ConfigError)
    if (not isinstance(doc, dict) or set(doc) != {"_about", "mamf_default_share", "hbm_default_share", "gpus"}
            or not isinstance(doc["gpus"], list)):
        raise ConfigError('expected an object with "_about", "mamf_default_share", "hbm_default_share" and a list '
                          '"gpus"', file=path)
    gpus = tuple(_entry(row, path, f"gpus[{i}]") for i, row in enumerate(doc["gpus"]))
    return Catalog(gpus, _shares(doc["mamf_default_share"], path),
                   _share(doc["hbm_default_share"], path, "hbm_default_share"))


def _shares(shares, path: Path) -> dict[str, float]:
    if not isinstance(shares, dict) or set(shares) != set(SHARES):
        raise ConfigError(f"expected an object with the keys {', '.join(SHARES)}", file=path,
                          field="mamf_default_share")
    return {key: _share(shares[key], path, f"mamf_default_share.{key}") for key in SHARES}


def _share(share, path: Path, where: str) -> float:
    if not isinstance(share, dict) or set(share) != {"value", "source"}:
        raise ConfigError('expected {"value": number, "source": "where it comes from"}', file=path, field=where)
    value, source = share["value"], share["source"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ConfigError("expected a share of the peak, above 0 and at most 1", file=path, field=f"{where}.value")
    if not isinstance(source, str) or len(source) < 20:
        raise ConfigError("expected a sentence naming where the figure comes from", file=path,
                          field=f"{where}.source")
    return float(value)


def _entry(row, path: Path, where: str) -> tuple[GPU, tuple[str, ...]]:
    def fail(message: str, key: str = "") -> ConfigError:
        return ConfigError(message, file=path, field=f"{where}.{key}" if key else where)

    keys = {"name", "vendor", "aliases", *FIGURES}
    if not isinstance(row, dict) or not keys <= set(row) <= keys | set(OPTIONAL):
        raise fail(f"expected an object with the keys {', '.join(sorted(keys))} (and optionally "
                   f"{', '.join(OPTIONAL)})")
    if not isinstance(row["name"], str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9-]*", row["name"]):
        raise fail("expected a name of letters, digits and dashes", "name")
    if row["vendor"] not in VENDORS:
        raise fail(f"expected one of {', '.join(VENDORS)}", "vendor")
    aliases = row["aliases"]
    if not isinstance(aliases, list) or not all(isinstance(a, str) and a.strip() for a in aliases):
        raise fail("expected a list of names", "aliases")
    values, sources = {}, {}
    for key in (*FIGURES, *(k for k in OPTIONAL if k in row)):
        figure = row[key]
        if not isinstance(figure, dict) or set(figure) != {"value", "source"}:
            raise fail('expected {"value": number, "source": "where it comes from"}', key)
        value, source = figure["value"], figure["source"]
        whole = key in WHOLE
        if (isinstance(value, bool) or not isinstance(value, int if whole else (int, float))
                or not math.isfinite(value) or value <= 0):
            what = ("whole number of bytes" if key.endswith("_bytes") else "whole number") if whole else "number"
            raise fail(f"expected a positive {what}", f"{key}.value")
        if not isinstance(source, str) or len(source) < 20:
            raise fail("expected a sentence naming where the figure comes from", f"{key}.source")
        values[key], sources[key] = (value if whole else float(value)), source
    if values.get("hbm_achievable_bytes_per_s", 0) > values["hbm_bytes_per_s"]:
        raise fail("expected a measured bandwidth at most the data sheet's hbm_bytes_per_s",
                   "hbm_achievable_bytes_per_s.value")
    foreign = "gfx_target" if row["vendor"] == "NVIDIA" else "compute_capability"
    if foreign in row:
        raise fail(f"expected no {foreign} on an {row['vendor']} GPU", foreign)
    return GPU(name=row["name"], vendor=row["vendor"], sources=sources, **values), tuple(aliases)


_CATALOG = load_catalog()
GPUS: dict[str, GPU] = {gpu.name: gpu for gpu, _ in _CATALOG.gpus}
ALIASES: dict[str, str] = {alias: gpu.name for gpu, aliases in _CATALOG.gpus for alias in aliases}
MAMF_DEFAULT_SHARE: dict[str, float] = _CATALOG.mamf_default_share  # "bf16" / "fp8" -> share of the peak
HBM_DEFAULT_SHARE: float = _CATALOG.hbm_default_share  # share of the data-sheet bandwidth (hbm_achievable_bytes_per_s)


def achievable_hbm_bytes_per_s(gpu: GPU) -> float:
    """The GPU's measured achievable memory bandwidth: its hbm_achievable_bytes_per_s, or for a GPU
    not measured its data-sheet hbm_bytes_per_s x HBM_DEFAULT_SHARE (both in gpus.json, with their sources)."""
    return gpu.hbm_achievable_bytes_per_s or gpu.hbm_bytes_per_s * HBM_DEFAULT_SHARE


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


def _build_families() -> dict[str, tuple[str, ...]]:
    """Family names: the leading words of names and aliases ("A100" of "A100-40GB", "H100" of "H100 NVL",
    "RTX" of "RTX 4090") that no name or alias spells out, with the catalog GPUs they begin.

    A family that begins several GPUs is ambiguous (get_gpu lists the choices); one that begins a single
    GPU is just an unknown name. A spelling listed for one GPU (a name or an alias) always wins, so "L40"
    is the L40 and "B200" the B200, whatever else they begin.
    """
    families: dict[str, list[str]] = {}
    for spelling, canonical in [*((n, n) for n in GPUS), *ALIASES.items()]:
        words = re.split(r"[-\s_]+", spelling.strip())
        for n in range(1, len(words)):
            key = _key(" ".join(words[:n]))
            if not key or key in _PREFIXES or key in _INDEX:
                continue
            members = families.setdefault(key, [])
            if canonical not in members:
                members.append(canonical)
    order = {name: i for i, name in enumerate(GPUS)}
    return {key: tuple(sorted(names, key=order.__getitem__)) for key, names in families.items() if len(names) > 1}


_FAMILIES = _build_families()


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

    A bare family name that begins several catalog GPUs ("A100", "H100") raises UsageError(field="gpu")
    naming them all; an unknown name raises one that lists close matches and the known names.
    """
    if isinstance(name, GPU):
        return name
    key = _key(str(name)) if str(name).strip() else ""
    canonical = _INDEX.get(key) if key else None
    if canonical is not None:
        return GPUS[canonical]
    if key in _FAMILIES:
        raise UsageError(
            f"{str(name).strip()!r} matches several GPUs: {', '.join(_FAMILIES[key])}; give one.",
            field="gpu",
        )
    close = close_gpu_names(str(name))
    hint = f" Did you mean {' or '.join(close)}?" if close else ""
    raise UsageError(
        f"unknown GPU {str(name)!r}.{hint} Known GPUs: {', '.join(gpu_names())}.",
        field="gpu",
    )
