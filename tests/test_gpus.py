"""The GPU catalog: lookup by name and alias, error messages, and plausible values."""

from __future__ import annotations

import ast
import dataclasses
import json
import statistics
from pathlib import Path

import pytest

from kvplan.errors import KvplanError, UsageError
from kvplan.model import gpus
from kvplan.model.gpus import ALIASES, GPU, GPUS, get_gpu, gpu_names

GiB = 1024**3
MiB = 1024**2
REPO = Path(__file__).resolve().parents[1]

REQUIRED = [
    "A10G", "L4", "L40S", "A100-40GB", "A100-80GB", "H100-80GB", "H100-PCIe",
    "H200", "B200", "MI300X", "V100-32GB", "RTX-4090",
]
# Parts people rent now, added with the ambiguity rules (each figure sourced in gpus.json).
ADDED = ["L40", "A6000", "RTX-6000-Ada", "H100-NVL", "H20", "GH200", "MI325X", "MI355X", "RTX-5090"]


def test_required_gpus_present():
    names = gpu_names()
    for name in REQUIRED + ADDED:
        assert name in names
    assert names == list(GPUS)
    assert len(set(names)) == len(names)


def test_lookup_by_canonical_name_returns_catalog_entry():
    for name in gpu_names():
        gpu = get_gpu(name)
        assert isinstance(gpu, GPU)
        assert gpu is GPUS[name]
        assert gpu.name == name


@pytest.mark.parametrize(
    "spelling, expected",
    [
        ("H100 SXM", "H100-80GB"),
        ("h100_80gb", "H100-80GB"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("H100 PCIe", "H100-PCIe"),
        ("a100-40gb", "A100-40GB"),
        ("A100 40GB", "A100-40GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("A100-SXM4-80GB", "A100-80GB"),
        ("nvidia h200", "H200"),
        ("HGX B200", "B200"),
        ("AMD Instinct MI300X", "MI300X"),
        ("mi300x", "MI300X"),
        ("Tesla V100-SXM2-32GB", "V100-32GB"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("rtx4090", "RTX-4090"),
        ("  L40S  ", "L40S"),
        ("nvidia a10g", "A10G"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40", "L40"),
        ("l40", "L40"),
        ("NVIDIA H20", "H20"),
        ("h20", "H20"),
        ("NVIDIA H100 NVL", "H100-NVL"),
        ("h100-nvl", "H100-NVL"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("AMD Instinct MI325X", "MI325X"),
        ("mi355x", "MI355X"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX-6000-Ada"),
        ("RTX 6000 Ada", "RTX-6000-Ada"),
        ("NVIDIA RTX A6000", "A6000"),
        ("a6000", "A6000"),
        ("NVIDIA GeForce RTX 5090", "RTX-5090"),
        ("5090", "RTX-5090"),
    ],
)
def test_aliases_and_case_insensitivity(spelling, expected):
    assert get_gpu(spelling).name == expected


def test_every_alias_resolves_to_its_target():
    for alias, canonical in ALIASES.items():
        assert canonical in GPUS
        assert get_gpu(alias) is GPUS[canonical]
        assert get_gpu(alias.upper()) is GPUS[canonical]
        assert get_gpu(alias.lower()) is GPUS[canonical]


def test_lookup_keys_do_not_collide():
    # _build_index raises on a collision; rebuilding must give one key per spelling.
    index = gpus._build_index()
    assert set(index.values()) == set(GPUS)


def test_unknown_name_raises_usage_error_with_suggestions():
    with pytest.raises(UsageError) as info:
        get_gpu("A100-96GB")  # no such part; the A100s are the closest
    err = info.value
    assert isinstance(err, KvplanError)
    assert err.field == "gpu"
    text = str(err)
    assert text.startswith("gpu: ")
    assert "'A100-96GB'" in text
    assert "Did you mean A100-" in text
    assert "Known GPUs:" in text


@pytest.mark.parametrize("family, choices", [
    ("A100", ["A100-40GB", "A100-80GB"]),
    ("a100", ["A100-40GB", "A100-80GB"]),
    ("NVIDIA A100-SXM4", ["A100-40GB", "A100-80GB"]),
    ("H100", ["H100-80GB", "H100-PCIe", "H100-NVL"]),
    ("nvidia h100", ["H100-80GB", "H100-PCIe", "H100-NVL"]),
    ("RTX", ["A6000", "RTX-6000-Ada", "RTX-4090", "RTX-5090"]),
])  # fmt: skip
def test_a_bare_family_name_lists_its_choices_in_one_line(family, choices):
    """A name that begins several catalog GPUs and is listed for none of them is refused with the choices."""
    with pytest.raises(UsageError) as info:
        get_gpu(family)
    err = info.value
    assert err.field == "gpu"
    text = str(err)
    assert "\n" not in text and len(text) < 200
    assert text == f"gpu: {family!r} matches several GPUs: {', '.join(choices)}; give one."


@pytest.mark.parametrize("spelling, expected", [
    ("L40", "L40"), ("L40S", "L40S"), ("H20", "H20"), ("H200", "H200"), ("B200", "B200"),
    ("H100 SXM", "H100-80GB"), ("H100 PCIe", "H100-PCIe"), ("H100 NVL", "H100-NVL"), ("A100 80GB", "A100-80GB"),
])  # fmt: skip
def test_a_name_listed_for_one_gpu_is_never_ambiguous(spelling, expected):
    """L40 is its own part, not a prefix of L40S; a listed alias beats any family it begins."""
    assert get_gpu(spelling).name == expected


def test_families_and_spellings_do_not_overlap():
    for key, names in gpus._FAMILIES.items():
        assert key not in gpus._INDEX
        assert len(names) >= 2 and set(names) <= set(GPUS)


@pytest.mark.parametrize("typo, suggested", [("H1000", "H100-80GB"), ("B2000", "B200"), ("mi300", "MI300X"),
                                             ("L40SX", "L40S"), ("V100", "V100-32GB"), ("H2O", "H20"),
                                             ("MI325", "MI325X")])
def test_typos_get_close_matches(typo, suggested):
    with pytest.raises(UsageError) as info:
        get_gpu(typo)
    message = info.value.message
    did_you_mean = message.split("Did you mean", 1)[1].split("?", 1)[0]
    assert suggested in did_you_mean


@pytest.mark.parametrize("nonsense", ["", "   ", "tpu-v5e", "zzzz"])
def test_names_without_close_match_list_the_catalog(nonsense):
    with pytest.raises(UsageError) as info:
        get_gpu(nonsense)
    message = info.value.message
    assert "Known GPUs:" in message
    for name in REQUIRED + ADDED:
        assert name in message


def test_gpu_is_frozen():
    gpu = get_gpu("H100-80GB")
    with pytest.raises(dataclasses.FrozenInstanceError):
        gpu.memory_bytes = 1  # type: ignore[misc]
    assert [f.name for f in dataclasses.fields(GPU)] == [
        "name", "memory_bytes", "hbm_bytes_per_s", "peak_bf16_flops", "vendor", "sources", "cuda_memory_bytes",
        "peak_fp8_flops", "link_bytes_per_s", "mamf_bf16_flops", "mamf_fp8_flops", "compute_capability", "gfx_target",
        "network_bytes_per_s", "compute_units", "hbm_achievable_bytes_per_s",
    ]


def test_values_positive_and_plausible():
    for gpu in GPUS.values():
        assert isinstance(gpu.memory_bytes, int)
        assert 16 * GiB <= gpu.memory_bytes <= 288 * GiB, gpu.name
        assert 200e9 <= gpu.hbm_bytes_per_s <= 10e12, gpu.name
        assert 50e12 <= gpu.peak_bf16_flops <= 3e15, gpu.name
        assert gpu.vendor in {"NVIDIA", "AMD"}
        # link_bytes_per_s is left out where no source confirmed it (MI355X); step_time then assumes PCIe
        assert {"memory_bytes", "hbm_bytes_per_s", "peak_bf16_flops", "cuda_memory_bytes"} \
            <= set(gpu.sources) <= {"memory_bytes", "hbm_bytes_per_s", "peak_bf16_flops", "cuda_memory_bytes",
                                    "link_bytes_per_s", "peak_fp8_flops", "mamf_bf16_flops",
                                    "mamf_fp8_flops", "compute_capability", "gfx_target",
                                    "network_bytes_per_s", "compute_units", "hbm_achievable_bytes_per_s"}, gpu.name
        # a scale-out NIC per GPU: HDR InfiniBand (25 GB/s) to 800 Gb/s XDR (100 GB/s), below the NVLink
        assert gpu.network_bytes_per_s == 0 or 12.5e9 <= gpu.network_bytes_per_s <= min(100e9, gpu.link_bytes_per_s)
        assert gpu.link_bytes_per_s == 0 or 10e9 <= gpu.link_bytes_per_s <= 2e12, gpu.name
        assert gpu.link_bytes_per_s or gpu.name == "MI355X", gpu.name
        assert gpu.peak_fp8_flops == 0 or gpu.peak_bf16_flops < gpu.peak_fp8_flops <= 2.5 * gpu.peak_bf16_flops
        # CUDA reports a little less than the device's own total (the driver's reserve): 0-9%;
        # on the MI300X HIP's total (191.98 GiB) sits 0.15% above rocm-smi's VRAM figure
        assert 0.91 * gpu.memory_bytes <= gpu.cuda_memory_bytes <= 1.002 * gpu.memory_bytes, gpu.name
        for figure, source in gpu.sources.items():
            assert isinstance(source, str) and len(source) > 20, (gpu.name, figure)
        cited = " ".join(gpu.sources.values())
        assert "data sheet" in cited or "specifications" in cited or "whitepaper" in cited
        # Flops per byte of bandwidth: every serving GPU sits between ~100 and ~700, except the H20, whose
        # compute was cut for export (148 TFLOPS on 4 TB/s: 37).
        low = 30 if gpu.name == "H20" else 100
        assert low <= gpu.peak_bf16_flops / gpu.hbm_bytes_per_s <= 700, gpu.name


def test_reported_memory_never_exceeds_the_binary_capacity():
    # "80 GB" of HBM is 80 GiB of DRAM; what the device reports is that or a little less.
    nominal_gib = {
        "A10G": 24, "L4": 24, "L40S": 48, "A100-40GB": 40, "A100-80GB": 80, "H100-80GB": 80,
        "H100-PCIe": 80, "H200": 141, "B200": 192, "MI300X": 192, "V100-32GB": 32, "RTX-4090": 24,
        "L40": 48, "A6000": 48, "RTX-6000-Ada": 48, "H100-NVL": 94, "H20": 96, "GH200": 96, "MI325X": 256,
        "MI355X": 288, "RTX-5090": 32,
    }
    assert set(nominal_gib) == set(GPUS)
    for name, gib in nominal_gib.items():
        reported = GPUS[name].memory_bytes
        assert reported <= gib * GiB, name
        assert reported >= 0.92 * gib * GiB, name


def test_memory_figures_from_the_issue():
    assert get_gpu("A100-40GB").memory_bytes == 40_960 * MiB == 40 * GiB
    assert get_gpu("H100-80GB").memory_bytes == 81_559 * MiB
    assert get_gpu("H100-80GB").memory_gib == pytest.approx(79.65, abs=0.01)


def test_data_sheet_speeds():
    assert get_gpu("A100-40GB").hbm_bytes_per_s == 1_555e9
    assert get_gpu("A100-80GB").hbm_bytes_per_s == 2_039e9
    assert get_gpu("A100-40GB").peak_bf16_flops == 312e12
    assert get_gpu("H100-80GB").hbm_bytes_per_s == 3.35e12
    assert get_gpu("H100-80GB").peak_bf16_flops == 989e12
    assert get_gpu("H200").hbm_bytes_per_s == 4.8e12
    assert get_gpu("H200").peak_bf16_flops == get_gpu("H100-80GB").peak_bf16_flops
    assert get_gpu("B200").peak_bf16_flops == 2.25e15
    assert get_gpu("MI300X").hbm_bytes_per_s == 5.3e12
    assert get_gpu("MI300X").peak_bf16_flops == pytest.approx(1307.4e12)


# (figure, expected) per added GPU: the numbers the task names, each sourced in gpus.json.
ADDED_FIGURES = {
    "L40": dict(memory_bytes=46_068 * MiB, hbm_bytes_per_s=864e9, peak_bf16_flops=181.05e12, peak_fp8_flops=362e12,
                link_bytes_per_s=32e9),
    "A6000": dict(memory_bytes=49_140 * MiB, hbm_bytes_per_s=768e9, peak_bf16_flops=154.8e12, peak_fp8_flops=0.0,
                  link_bytes_per_s=32e9),
    "RTX-6000-Ada": dict(memory_bytes=49_140 * MiB, hbm_bytes_per_s=960e9, peak_bf16_flops=364.25e12,
                         peak_fp8_flops=728.5e12, link_bytes_per_s=32e9),
    "H100-NVL": dict(memory_bytes=95_830 * MiB, hbm_bytes_per_s=3.9e12, peak_bf16_flops=835.5e12,
                     peak_fp8_flops=1670.5e12, link_bytes_per_s=300e9),
    "H20": dict(memory_bytes=97_871 * MiB, hbm_bytes_per_s=4.0e12, peak_bf16_flops=148e12, peak_fp8_flops=296e12,
                link_bytes_per_s=450e9),
    "GH200": dict(memory_bytes=97_871 * MiB, hbm_bytes_per_s=4.0e12, peak_bf16_flops=989e12, peak_fp8_flops=1979e12,
                  link_bytes_per_s=450e9),
    "MI325X": dict(memory_bytes=256 * GiB, hbm_bytes_per_s=6.0e12, peak_bf16_flops=1307.4e12,
                   peak_fp8_flops=2614.9e12, link_bytes_per_s=448e9),
    "MI355X": dict(memory_bytes=288 * GiB, hbm_bytes_per_s=8.0e12, peak_bf16_flops=2516.58e12,
                   peak_fp8_flops=5033.16e12, link_bytes_per_s=0.0),
    "RTX-5090": dict(memory_bytes=32_607 * MiB, hbm_bytes_per_s=1792e9, peak_bf16_flops=209.6e12,
                     peak_fp8_flops=419.2e12, link_bytes_per_s=64e9),
}


@pytest.mark.parametrize("name", ADDED)
def test_added_gpus_load_with_their_figures(name):
    gpu = get_gpu(name)
    for figure, expected in ADDED_FIGURES[name].items():
        assert getattr(gpu, figure) == pytest.approx(expected, rel=1e-5), (name, figure)
    # CUDA/HIP reports the device total less the driver's reserve: at most 1.5% below, never above
    assert 0.985 * gpu.memory_bytes <= gpu.cuda_memory_bytes <= gpu.memory_bytes, name
    assert gpu.vendor == ("AMD" if name.startswith("MI") else "NVIDIA")
    for figure, source in gpu.sources.items():
        assert len(source) > 40, (name, figure)


def test_hopper_variants_share_hopper_peaks():
    h100 = get_gpu("H100-80GB")
    assert get_gpu("GH200").peak_bf16_flops == h100.peak_bf16_flops
    assert get_gpu("GH200").peak_fp8_flops == h100.peak_fp8_flops
    assert get_gpu("H20").peak_bf16_flops < h100.peak_bf16_flops / 6  # the export-limited Hopper
    assert get_gpu("H20").hbm_bytes_per_s > h100.hbm_bytes_per_s
    assert get_gpu("MI325X").peak_bf16_flops == get_gpu("MI300X").peak_bf16_flops


def test_gpus_json_lists_at_least_20(run_cli):
    code, out, _ = run_cli("gpus", "--json")
    rows = json.loads(out)["gpus"]
    assert code == 0 and len(rows) >= 20
    assert {"L40", "L40S", "H20", "H100-NVL", "GH200", "MI325X", "MI355X", "RTX-5090"} <= {r["name"] for r in rows}


def _opt13b_weight_bytes() -> int:
    """fp16 weight bytes of OPT-13B from the bundled catalog config (learned positions carry 2 extra rows)."""
    cfg = json.loads((REPO / "models" / "facebook" / "opt-13b" / "config.json").read_text())
    h, ffn, layers = cfg["hidden_size"], cfg["ffn_dim"], cfg["num_hidden_layers"]
    per_layer = 4 * h * h + 4 * h + 2 * h * ffn + ffn + h + 2 * 2 * h
    params = cfg["vocab_size"] * h + (cfg["max_position_embeddings"] + 2) * h + layers * per_layer + 2 * h
    assert 12.8e9 < params < 12.9e9
    return 2 * params


def test_kwon_et_al_opt13b_on_a100_40gb_leaves_about_12_gib_for_kv():
    # vLLM paper, Figure 1: OPT-13B on one A100-40GB, about 12 GiB of KV cache at 90% memory use.
    kv = 0.9 * get_gpu("A100-40GB").memory_bytes - _opt13b_weight_bytes()
    assert kv / GiB == pytest.approx(12.0, abs=0.25)


def test_model_package_imports_nothing_of_ours_but_errors():
    tree = ast.parse(Path(gpus.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    ours = {name for name in imported if name.split(".")[0] == "kvplan"}
    assert ours == {"kvplan.errors", "kvplan.fileio"}  # fileio imports nothing of ours but errors
    assert "numpy" not in imported


# ---- the catalog file ----------------------------------------------------------------------------


def _catalog_copy(tmp_path: Path, mutate) -> Path:
    doc = json.loads(gpus.CATALOG_FILE.read_text(encoding="utf-8"))
    mutate(doc)
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def test_catalog_file_round_trips_to_the_loaded_catalog():
    """What the module holds is exactly what the shipped file says, in the file's order."""
    doc = json.loads(gpus.CATALOG_FILE.read_text(encoding="utf-8"))
    assert [row["name"] for row in doc["gpus"]] == gpu_names()
    for row in doc["gpus"]:
        gpu = GPUS[row["name"]]
        for figure in gpus.FIGURES:
            assert getattr(gpu, figure) == row[figure]["value"]
            assert gpu.sources[figure] == row[figure]["source"]
        assert all(ALIASES[a] == gpu.name for a in row["aliases"])


@pytest.mark.parametrize("mutate, field, says", [
    (lambda d: d["gpus"][3]["memory_bytes"].update(value=-1), "gpus[3].memory_bytes.value", "positive whole number"),
    (lambda d: d["gpus"][3]["memory_bytes"].update(value=4.5e10), "gpus[3].memory_bytes.value", "whole number"),
    (lambda d: d["gpus"][0]["hbm_bytes_per_s"].update(value="fast"), "gpus[0].hbm_bytes_per_s.value", "positive number"),
    (lambda d: d["gpus"][0]["hbm_bytes_per_s"].update(value=True), "gpus[0].hbm_bytes_per_s.value", "positive number"),
    (lambda d: d["gpus"][1]["peak_bf16_flops"].pop("source"), "gpus[1].peak_bf16_flops", "source"),
    (lambda d: d["gpus"][1]["peak_bf16_flops"].update(source="x"), "gpus[1].peak_bf16_flops.source", "where the figure"),
    (lambda d: d["gpus"][2].update(vendor="Acme"), "gpus[2].vendor", "NVIDIA"),
    (lambda d: d["gpus"][2].update(name="H100 80GB"), "gpus[2].name", "letters, digits and dashes"),
    (lambda d: d["gpus"][2].update(extra=1), "gpus[2]", "the keys"),
    (lambda d: d["gpus"][3].update(peak_fp8_flops={"value": -1, "source": "a sentence long enough"}),
     "gpus[3].peak_fp8_flops.value", "positive"),
    (lambda d: d["gpus"][4].update(aliases="H100"), "gpus[4].aliases", "list of names"),
    (lambda d: d.update(gpus={}), None, '"gpus"'),
    (lambda d: d.pop("mamf_default_share"), None, '"mamf_default_share"'),
    (lambda d: d["mamf_default_share"]["bf16"].update(value=1.5), "mamf_default_share.bf16.value", "share"),
    (lambda d: d["mamf_default_share"]["fp8"].update(source=""), "mamf_default_share.fp8.source", "where the figure"),
    (lambda d: d["gpus"][8].update(mamf_bf16_flops={"value": 0, "source": "a sentence long enough"}),
     "gpus[8].mamf_bf16_flops.value", "positive"),
    (lambda d: d["gpus"][0].update(gfx_target={"value": 942, "source": "a sentence long enough"}),
     "gpus[0].gfx_target", "no gfx_target on an NVIDIA GPU"),
    (lambda d: d["gpus"][15]["gfx_target"].update(value=9.42), "gpus[15].gfx_target.value", "positive whole number"),
    (lambda d: d["gpus"][9]["compute_units"].update(value=132.5), "gpus[9].compute_units.value", "positive whole number"),
    (lambda d: d.pop("hbm_default_share"), None, '"hbm_default_share"'),
    (lambda d: d["hbm_default_share"].update(value=0), "hbm_default_share.value", "share"),
    (lambda d: d["hbm_default_share"].update(source="median"), "hbm_default_share.source", "where the figure"),
    (lambda d: d["gpus"][15]["hbm_achievable_bytes_per_s"].update(value=5.4e12),
     "gpus[15].hbm_achievable_bytes_per_s.value", "at most the data sheet"),
    (lambda d: d["gpus"][15]["hbm_achievable_bytes_per_s"].update(value=-1),
     "gpus[15].hbm_achievable_bytes_per_s.value", "positive number"),
])  # fmt: skip
def test_a_wrong_catalog_file_names_the_file_and_field(tmp_path, mutate, field, says):
    path = _catalog_copy(tmp_path, mutate)
    with pytest.raises(KvplanError) as err:
        gpus.load_catalog(path)
    message = str(err.value)
    assert "gpus.json" in message and says in message
    if field is not None:
        assert field in message


def test_a_catalog_file_that_is_not_json(tmp_path):
    path = tmp_path / "gpus.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(KvplanError, match="gpus.json:1: not valid JSON"):
        gpus.load_catalog(path)


# The measured maximum achievable matmul FLOP/s of Stas Bekman's ML Engineering book (the table
# "Maximum Achievable Matmul FLOPS comparison table"), as the catalog holds them, in TFLOP/s.
MAMF_TFLOPS = {
    "bf16": {"A100-80GB": 271.2, "A100-40GB": 271.2, "GH200": 828.6, "H100-80GB": 794.5, "H200": 794.5,
             "B200": 1745.0, "MI300X": 668.4, "MI325X": 784.9, "MI355X": 1565.0},
    "fp8": {"GH200": 1535.0, "H100-80GB": 1402.6, "H200": 1453.4, "B200": 3432.5},
}


# NVIDIA's compute capability table (developer.nvidia.com/cuda-gpus) and AMD's LLVM targets
# (ROCm's GPU hardware specifications), for every GPU of the catalog.
ARCH = {"A10G": 8.6, "L4": 8.9, "L40": 8.9, "L40S": 8.9, "A6000": 8.6, "RTX-6000-Ada": 8.9, "A100-40GB": 8.0,
        "A100-80GB": 8.0, "H100-80GB": 9.0, "H100-PCIe": 9.0, "H100-NVL": 9.0, "H20": 9.0, "GH200": 9.0, "H200": 9.0,
        "B200": 10.0, "V100-32GB": 7.0, "RTX-4090": 8.9, "RTX-5090": 12.0, "MI300X": 942, "MI325X": 942, "MI355X": 950}


def test_every_gpu_states_its_architecture():
    assert set(ARCH) == set(GPUS)
    for gpu in GPUS.values():
        key = "compute_capability" if gpu.vendor == "NVIDIA" else "gfx_target"
        assert getattr(gpu, key) == ARCH[gpu.name] and gpu.sources[key], gpu.name


def test_measured_matmul_flops_are_the_cited_table():
    for gpu in GPUS.values():
        for dtype, peak in (("bf16", gpu.peak_bf16_flops), ("fp8", gpu.peak_fp8_flops)):
            measured = getattr(gpu, f"mamf_{dtype}_flops")
            assert measured == MAMF_TFLOPS[dtype].get(gpu.name, 0.0) * 1e12, (gpu.name, dtype)
            if measured:
                assert 0.5 * peak < measured < peak, (gpu.name, dtype)  # a data-sheet peak is never reached
                assert "stas00/ml-engineering" in gpu.sources[f"mamf_{dtype}_flops"]
    assert gpus.MAMF_DEFAULT_SHARE == {"bf16": 0.803, "fp8": 0.740}


# Measured copy / STREAM-like bandwidths as their sources print them (GB/s): the best copy-like
# kernel (copy, scale, add, triad: bytes read and written) over large arrays.
ACHIEVABLE_GBPS = {
    "A100-40GB": 1381,  # te42kyfo/gpu-benches gpu-stream/a100_40.txt: scale at 100% occupancy
    "H100-PCIe": 1832,  # te42kyfo/gpu-benches README, H100-PCIe: triad at 100% occupancy
    "L40": 816,  # te42kyfo/gpu-benches gpu-stream/l40.txt: scale at its best
    "B200": 6721,  # NVIDIA/cccl#7391: cub::DeviceTransform babelstream add, F16, 2^28 elements
    "RTX-5090": 1573,  # NVIDIA/cccl#9881: babelstream triad, I128, 2^28 elements
    "MI300X": 3910.62, "MI325X": 4287.31, "MI355X": 5690.42,  # rocprofiler-compute memcopy roofline
}


def test_achievable_bandwidth_is_the_cited_measurement_or_the_median_share():
    """A measured GPU reads at its cited copy figure; any other at the median measured share of its
    data sheet: the eight shares (0.711 0.715 0.738 0.840 | 0.878 0.888 0.916 0.944) have the median
    (0.840 + 0.878) / 2 = 0.859."""
    shares = []
    for gpu in GPUS.values():
        measured = ACHIEVABLE_GBPS.get(gpu.name, 0) * 1e9
        assert gpu.hbm_achievable_bytes_per_s == pytest.approx(measured, rel=1e-12), gpu.name
        if measured:
            assert gpu.sources["hbm_achievable_bytes_per_s"], gpu.name
            shares.append(measured / gpu.hbm_bytes_per_s)
            assert gpus.achievable_hbm_bytes_per_s(gpu) == gpu.hbm_achievable_bytes_per_s
        else:
            assert gpus.achievable_hbm_bytes_per_s(gpu) == pytest.approx(0.859 * gpu.hbm_bytes_per_s)
    assert 0.7 < min(shares) and max(shares) < 0.95  # a copy never reaches the data sheet
    assert gpus.HBM_DEFAULT_SHARE == round(statistics.median(shares), 3) == 0.859
    # the H100's 3.35 TB/s data sheet: 0.859 x 3.35 = 2.878 TB/s; the MI300X's 5.3 measure 3.91
    assert gpus.achievable_hbm_bytes_per_s(get_gpu("H100-80GB")) == pytest.approx(2.878e12, rel=1e-3)
    assert gpus.achievable_hbm_bytes_per_s(get_gpu("MI300X")) / 5.3e12 == pytest.approx(0.738, abs=5e-4)


# SMs (NVIDIA: the architecture whitepapers and data sheets, CUDA cores / 128 per Ampere GA10x, Ada
# and Blackwell SM) and CUs (AMD: ROCm's GPU hardware specifications), for every GPU of the catalog.
COMPUTE_UNITS = {"A10G": 80, "L4": 58, "L40": 142, "L40S": 142, "A6000": 84, "RTX-6000-Ada": 142, "A100-40GB": 108,
                 "A100-80GB": 108, "H100-80GB": 132, "H100-PCIe": 114, "H100-NVL": 132, "H20": 78, "GH200": 132,
                 "H200": 132, "B200": 148, "V100-32GB": 80, "RTX-4090": 128, "RTX-5090": 170, "MI300X": 304,
                 "MI325X": 304, "MI355X": 256}


def test_every_gpu_states_its_compute_units():
    assert set(COMPUTE_UNITS) == set(GPUS)
    for gpu in GPUS.values():
        assert gpu.compute_units == COMPUTE_UNITS[gpu.name] and gpu.sources["compute_units"], gpu.name
