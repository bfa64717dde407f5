"""SGLang's start-up memory (kvplan/model/sglang_memory.py): its defaults, pool and verdicts.

Pinned numbers are derived by hand in a comment from SGLang's source formulas (the module
docstring), or copied from a cited start-up log (tests/data/sglang_startup_logs.yaml).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kvplan.errors import UsageError
from kvplan.model.build import build_layout
from kvplan.model.gpus import get_gpu
from kvplan.model.resolve import load_spec
from kvplan.model.sglang_memory import (batch_defaults, default_mem_fraction, release_at, release_rules,
                                        startup_memory)
from tests.conftest import bench_module

GiB = 2**30
MiB = 2**20
LOGS = {e["id"]: e for e in yaml.safe_load(
    (Path(__file__).resolve().parent / "data" / "sglang_startup_logs.yaml").read_text(encoding="utf-8"))["logs"]}


def test_the_corpus_is_cited():
    assert len(LOGS) >= 4
    for entry in LOGS.values():
        assert entry["source"].startswith("https://") and entry["quote"], entry["id"]


def test_the_corpus_holds_the_issue_target():
    """At least 90% of the corpus's checks within tolerance (bench/sglang_memory_fidelity.py)."""
    bench = bench_module("sglang_memory_fidelity")

    rows = bench.evaluate(bench.load_logs())
    held, total = bench.shares(rows)["all"]
    assert total >= 8 and held / total >= 0.9


def test_mem_fraction_before_0_4_7_follows_tp():
    """0.85 at tp=4, as the 4 x L4 log's ServerArgs prints it."""
    assert LOGS["qwq-32b-4xl4-tp4"]["logged"]["server_args_mem_fraction_static"] == 0.85
    assert default_mem_fraction(22579, 4, "0.4", 2048, 80)[0] == 0.85
    assert [default_mem_fraction(81000, tp, "0.4", 8192, 160)[0] for tp in (1, 2, 8, 16)] == [0.88, 0.87, 0.81, 0.79]


def test_mem_fraction_0_5_3_on_an_h100():
    """SGLang reads the GPU's size from nvidia-smi's memory.total (get_nvgpu_memory_capacity), on an
    H100 80GB 81,559 MiB; tp=1: chunked prefill 8192 and CUDA graphs up to 256; reserve 512 + 1.5 x
    8192 + 2 x 256 + 1024 x 1/8 = 13,440 MiB (above the 10 GiB floor); (81,559 - 13,440) / 81,559 =
    0.8352 -> 0.835."""
    mib = get_gpu("H100-80GB").memory_bytes / MiB
    assert mib == 81_559
    assert batch_defaults(mib, 1, "0.5.3") == (8192, 256)
    assert default_mem_fraction(mib, 1, "0.5.3", 8192, 256)[0] == 0.835


def test_mem_fraction_0_5_3_on_an_l4_and_at_tp8():
    """L4, nvidia-smi 23,034 MiB, tp=1: 2048 and 24; reserve 512 + 3072 + 48 + 128 = 3,760 MiB (below
    60 GiB, no floor); (23,034 - 3,760) / 23,034 = 0.8368 -> 0.837. H100 at tp=8: 8192 and 512;
    512 + 12,288 + 1,024 + 1,024 = 14,848 MiB; (81,559 - 14,848) / 81,559 = 0.8179 -> 0.818."""
    mib = get_gpu("L4").memory_bytes / MiB
    assert batch_defaults(mib, 1, "0.5.3") == (2048, 24)
    assert default_mem_fraction(mib, 1, "0.5.3", 2048, 24)[0] == 0.837
    h100 = get_gpu("H100-80GB").memory_bytes / MiB
    assert batch_defaults(h100, 8, "0.5.3") == (8192, 512)
    assert default_mem_fraction(h100, 8, "0.5.3", 8192, 512)[0] == 0.818


def test_mem_fraction_0_4_7_tiers():
    """H100 (81,559 MiB), tp=1: reserve (9.5 + 1/2) GiB = 10,240 MiB -> 0.8744 -> 0.874, as the docs
    CI log of 2025-06-15 prints it."""
    mib = get_gpu("H100-80GB").memory_bytes / MiB
    assert default_mem_fraction(mib, 1, "0.4.7", 8192, 160)[0] == 0.874
    assert LOGS["qwen25-05b-h100-docs-2025-06-15"]["logged"]["server_args_mem_fraction_static"] == 0.874


def test_the_fraction_follows_nvidia_smi_not_cuda():
    """An L40S: nvidia-smi 46,068 MiB, CUDA 45,588 MiB. The 0.5.3 rule, tp=1: 4096 and 32 below 60
    GiB; reserve 512 + 6,144 + 64 + 128 = 6,848 MiB; (46,068 - 6,848) / 46,068 = 0.8513 -> 0.851, as
    sglang#13023's ServerArgs prints it; from CUDA's total it would be (45,588 - 6,848) / 45,588 =
    0.8498 -> 0.850."""
    gpu = get_gpu("L40S")
    common = dict(layout=_llama(), weights=0, gpu_memory=gpu.cuda_memory_bytes, tp=1, context_len=131072,
                  release="0.5.3")
    assert startup_memory(smi_memory=gpu.memory_bytes, **common).mem_fraction_static == 0.851
    assert startup_memory(**common).mem_fraction_static == 0.850
    assert LOGS["llama31-8b-l40s-pr13023"]["logged"]["server_args_mem_fraction_static"] == 0.851
    from kvplan.model.sglang_size import sglang_size

    assert sglang_size("meta-llama/Llama-3.1-8B-Instruct", gpu="L40S").memory.mem_fraction_static == 0.851


def test_releases_and_dates():
    assert release_rules("0.4.3.post2").era == "0.4" and release_rules("0.4.3.post2").req_pool_extra == 1
    assert release_rules("v0.4.7").era == "0.4.7" and release_rules("0.5.2").era == "0.4.7"
    assert release_rules("0.5.3").era == "0.5.3" and release_rules("0.5.3").req_pool_extra == 0
    assert release_at("2025-03-08") == "0.4.0" and release_at("2025-07-22") == "0.4.7"
    assert release_at("2025-10-16") == "0.5.3"
    with pytest.raises(UsageError):
        release_rules("latest")
    with pytest.raises(UsageError, match="predates"):  # 0.2's rules are not modelled (sgl-project/sglang#1191)
        release_rules("0.2.13")
    assert release_rules("0.3.0").era == "0.4"


def _llama(kv_dtype: str = "auto", tp: int = 1):
    return build_layout(load_spec("meta-llama/Llama-3.1-8B-Instruct"), kv_dtype, tp)


def test_pool_tokens_by_hand_from_a_logged_load():
    """PR #4760's log: free before loading 63.48 + 15.11 = 78.59 GB, weights 15.11 GB, the default
    fraction of its time 0.88: rest = 63.48 - 78.59 x 0.12 = 54.0492 GB; Llama-3.1-8B keeps 32
    layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 131,072 B a token; 54.0492 x 2^30 / 131,072 =
    442,771 tokens. SGLang logged 442,750 (its GB figures are rounded to 0.01)."""
    m = startup_memory(layout=_llama(), weights=int(15.11 * GiB), gpu_memory=int(78.59 * GiB), tp=1,
                       context_len=131072, release="0.4.4", pre_load=int(78.59 * GiB))
    assert m.cell_size == 131_072 and m.mem_fraction_static == 0.88
    assert m.max_total_num_tokens == pytest.approx(442_771, abs=1)
    assert m.max_total_num_tokens == pytest.approx(LOGS["llama31-8b-pr4760-fa3"]["logged"]["kv_tokens"], rel=1e-4)


def test_fp8_kv_halves_the_cell_and_mla_is_not_split():
    """fp8 KV: 65,536 B a token. DeepSeek-V3's latent (512 + 64) x 61 layers x 2 B = 70,272 B on
    every rank, as the GB200 log prints its cell_size."""
    assert startup_memory(layout=_llama("fp8"), weights=0, gpu_memory=80 * GiB, tp=1,
                          context_len=131072).cell_size == 65_536
    ds = load_spec("deepseek-ai/DeepSeek-V3")
    m = startup_memory(layout=build_layout(ds, "auto", 8), weights=0, gpu_memory=80 * GiB, tp=8, context_len=163840)
    assert m.cell_size == 70_272 == LOGS["deepseek-gb200-zdszero"]["logged"]["cell_size"]


def test_max_running_requests():
    """The 4 x L4 log: 46,611 tokens, context 131,072: int(46,611 / 131,072 x 512) = 182, clamped to
    2,048, a pool of 2,049 rows before 0.4.7 -> min(46,611 // 2, 2,049) = 2,049, as logged; 2,048
    from 0.4.7. A pool of 3,000 tokens runs at most 3,000 // 2 = 1,500; a given 64 caps it."""
    layout = build_layout(load_spec("Qwen/QwQ-32B"), "auto", 4)
    common = dict(layout=layout, weights=int(15.54 * GiB), gpu_memory=int(22.05 * GiB), tp=4,
                  context_len=131072, pre_load=int(21.63 * GiB))
    old = startup_memory(release="0.4.3", **common)
    assert old.max_total_num_tokens == pytest.approx(46_611, rel=0.001)
    assert old.max_running_requests == 2049 == LOGS["qwq-32b-4xl4-tp4"]["logged"]["max_running_requests"]
    assert startup_memory(release="0.5.3", mem_fraction_static=0.85, **common).max_running_requests == 2048
    # a pool just over 3,000 tokens: 0.85 x pre_load - weights = 3,000 x 131,072 B
    small = startup_memory(layout=_llama(), weights=int(0.85 * 40 * GiB) - 3001 * 131072, gpu_memory=40 * GiB, tp=1,
                           context_len=8192, pre_load=40 * GiB, mem_fraction_static=0.85)
    assert 2999 <= small.max_total_num_tokens <= 3001 and small.max_running_requests == small.max_total_num_tokens // 2
    assert startup_memory(layout=_llama(), weights=0, gpu_memory=80 * GiB, tp=1, context_len=8192,
                          max_running_requests=64).max_running_requests == 64


def test_page_size_rounds_the_pool_down():
    m = startup_memory(layout=_llama(), weights=0, gpu_memory=80 * GiB, tp=1, context_len=8192, page_size=64)
    assert m.max_total_num_tokens % 64 == 0


def test_weights_past_the_fraction_do_not_start():
    """Weights above pre_load x fraction leave rest < 0: SGLang's "Not enough memory" error."""
    m = startup_memory(layout=_llama(), weights=70 * GiB, gpu_memory=80 * GiB, tp=1, context_len=8192)
    assert not m.starts and m.max_total_num_tokens == 0 and "increase --mem-fraction-static" in m.reason


def test_bad_fraction_and_unmodelled_layouts():
    with pytest.raises(UsageError, match="fraction"):
        startup_memory(layout=_llama(), weights=0, gpu_memory=80 * GiB, tp=1, context_len=8192, mem_fraction_static=1.2)
    with pytest.raises(UsageError, match="recurrent state"):
        startup_memory(layout=build_layout(load_spec("Qwen/Qwen3-Next-80B-A3B-Instruct"), "auto", 4), weights=0,
                       gpu_memory=80 * GiB, tp=4, context_len=8192)


def test_cli_json_keys(run_cli):
    code, out, err = run_cli("size", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-80GB", "--engine", "sglang",
                             "--json")
    assert code == 0, err
    data = json.loads(out)
    for key in ("weight_bytes", "max_total_num_tokens", "max_running_requests", "chunked_prefill_size",
                "mem_fraction_static", "mem_fraction_reason", "fits", "reason", "bytes_per_token", "kv_pool_bytes"):
        assert key in data
    assert data["engine"] == "sglang" and data["fits"] and data["mem_fraction_static"] == 0.835  # 0.5.3 rule, 81,559 MiB
    assert out == run_cli("size", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-80GB", "--engine", "sglang",
                          "--json")[1]


def test_cli_human_and_override(run_cli):
    code, out, err = run_cli("size", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "L4", "--engine", "sglang",
                             "--mem-fraction-static", "0.9")
    flat = " ".join(out.split())
    assert code == 0, err
    assert "max_total_num_tokens" in flat and "as --mem-fraction-static gives it" in flat


def test_speculative_decoding_pads_the_pool_and_caps_the_running_requests():
    """Rule 4 on PR #4760's load (442,771 profiled tokens at 0.88, context 131,072): max_num_reqs =
    min(max(int(442,771 / 131,072 x 512), 2,048), 4,096) = 2,048 (int(1,729.6) = 1,729 < 2,048);
    EAGLE with 3 steps, topk 1 and 4 draft tokens adds 2,048 x (1 x 3 + 4) + 100 = 14,436 tokens;
    max_running_requests becomes 48 (not given), 64 when given. The draft's pool holds the same
    tokens at its own cell size (an EAGLE head of Llama-3.1-8B: one layer, 4,096 B a token)."""
    common = dict(layout=_llama(), weights=int(15.11 * GiB), gpu_memory=int(78.59 * GiB), tp=1,
                  context_len=131072, release="0.4.4", pre_load=int(78.59 * GiB))
    plain = startup_memory(**common)
    spec = startup_memory(speculative_steps=3, draft_cell_size=4096, **common)
    assert plain.max_num_reqs == spec.max_num_reqs == 2048
    assert spec.max_total_num_tokens - plain.max_total_num_tokens == 2048 * 7 + 100 == 14_436
    assert spec.max_running_requests == 48
    assert spec.draft_kv_pool == spec.max_total_num_tokens * 4096
    assert startup_memory(speculative_steps=3, max_running_requests=64, **common).max_running_requests == 64
    assert "draft_kv_pool" not in plain.to_dict() and spec.to_dict()["speculative_steps"] == 3


def test_speculative_decoding_keeps_2_gib_more_from_0_5_3():
    """An H100 at tp=1 (the test above on an H100): reserve 13,440 MiB, 15,488 with a draft:
    (81,559 - 15,488) / 81,559 = 0.8101 -> 0.810, where 0.835 without."""
    mib = get_gpu("H100-80GB").memory_bytes / MiB
    assert default_mem_fraction(mib, 1, "0.5.3", 8192, 256, speculative=True)[0] == 0.810
    assert default_mem_fraction(mib, 1, "0.4.7", 8192, 256, speculative=True)[0] == \
        default_mem_fraction(mib, 1, "0.4.7", 8192, 256)[0]


def test_cli_sizes_a_speculative_server(run_cli):
    """`kvplan size --engine sglang --speculative mtp --num-speculative-tokens 1` on 8 H200s:
    SGLang's 0.5.3 reserve there is 14,848 MiB (the 10 GiB floor is passed: 512 + 1.5 x 8,192 +
    2 x 512 + 1,024 = 14,848), 16,896 with the draft's 2 GiB: round((143,770 - 16,896) / 143,770, 3)
    = 0.882 (0.897 without). The pool is the one profiled at 0.882 plus max_num_reqs x (1 + 2) + 100,
    max_num_reqs = min(max(int(T / 163,840 x 512), 2,048), 4,096) of that profiled T; 48 requests
    run (not given); the MTP layer's own KV pool holds the same tokens at one layer's 576 x 2 B."""
    common = ["size", "deepseek-ai/DeepSeek-V3", "--engine", "sglang", "--gpu", "H200", "--tp", "8", "--json"]
    code, out, _ = run_cli(*common, "--speculative", "mtp", "--num-speculative-tokens", "1")
    assert code == 0
    spec = json.loads(out)
    code, out, _ = run_cli(*common, "--mem-fraction-static", "0.882")
    at = json.loads(out)
    code, out, _ = run_cli(*common)
    plain = json.loads(out)
    assert spec["mem_fraction_static"] == 0.882 and plain["mem_fraction_static"] == 0.897
    rows = min(max(int(at["max_total_num_tokens"] / 163_840 * 512), 2048), 4096)
    assert spec["max_total_num_tokens"] == at["max_total_num_tokens"] + rows * 3 + 100
    assert spec["max_running_requests"] == 48 and "speculative" not in plain
    s = spec["speculative"]
    assert (s["speculative_eagle_topk"], s["speculative_num_draft_tokens"]) == (1, 2)
    assert s["draft_kv_bytes_per_token"] == 576 * 2
    assert s["draft_kv_pool_bytes"] == spec["max_total_num_tokens"] * 576 * 2
