"""SGLang's sliding-window layers (kvplan/model/sglang_memory.py rule 5): the hybrid SWA pool of
Llama 4, the one pool of gpt-oss and Gemma, and the serving engine on them. Every number is derived
by hand in the docstrings from the rule as SGLang's source writes it."""

from __future__ import annotations

import json

import pytest

from kvplan.errors import UsageError
from kvplan.model.build import build_layout
from kvplan.model.resolve import load_spec
from kvplan.model.sglang_memory import hybrid_swa, model_identity, startup_memory
from kvplan.sim.inputs import window_reads

GiB = 2**30
SCOUT = "meta-llama/Llama-4-Scout-17B-16E-Instruct"


def _scout(tp: int = 8):
    spec = load_spec(SCOUT)
    return spec, build_layout(spec, "auto", tp)


def test_llama4_splits_the_profiled_tokens_between_two_pools():
    """Llama 4 Scout at tp=8: 8 KV heads / 8 = 1 head x (128 + 128) x 2 B = 512 B a layer, 48 layers:
    cell 24,576 B (12 full layers 6,144, 36 chunked 18,432). Free 70 GiB, weights 25 GiB, fraction
    0.8: rest = 70 - 25 - 70 x 0.2 = 31 GiB, T = 31 x 2^30 // 24,576 = 1,354,410 tokens (1,354,410.7).
    Split at r = 0.8: full = int(T x 48 / (0.8 x 36 + 12)) = int(65,011,680 / 40.8) = 1,593,423 and
    swa = int(1,593,423 x 0.8) = 1,274,738. The request rows come from T: int(1,354,410 / 10,485,760 x
    512) = 66, so 2,048 rows, and max_running_requests = min(1,593,423 // 2, 2,048) = 2,048. A running
    request holds every token in both pools: the serving engine's pool is the smaller, 1,274,738."""
    spec, layout = _scout()
    m = startup_memory(layout=layout, weights=25 * GiB, gpu_memory=80 * GiB, pre_load=70 * GiB, tp=8,
                       context_len=10_485_760, mem_fraction_static=0.8, **model_identity(spec))
    assert m.cell_size == 24_576 and m.hybrid and m.swa_full_tokens_ratio == 0.8
    assert (m.max_total_num_tokens, m.swa_tokens) == (1_593_423, 1_274_738)
    assert (m.max_num_reqs, m.max_running_requests, m.serving_tokens) == (2048, 2048, 1_274_738)


def test_the_ratio_moves_the_split_and_the_binding_pool():
    """r = 1: full = int(T x 48 / 48) = T = swa (T = 1,354,410 as above). r = 2: full = int(T x 48 /
    84) = int(773,948.57) = 773,948, swa = 1,547,896: the full pool is then the smaller one."""
    spec, layout = _scout()
    args = dict(layout=layout, weights=25 * GiB, gpu_memory=80 * GiB, pre_load=70 * GiB, tp=8,
                context_len=10_485_760, mem_fraction_static=0.8, **model_identity(spec))
    one = startup_memory(**args, swa_full_tokens_ratio=1.0)
    assert one.max_total_num_tokens == one.swa_tokens == 1_354_410
    two = startup_memory(**args, swa_full_tokens_ratio=2.0)
    assert (two.max_total_num_tokens, two.swa_tokens, two.serving_tokens) == (773_948, 1_547_896, 773_948)
    off = startup_memory(**args, disable_hybrid_swa_memory=True)  # --disable-hybrid-swa-memory: one pool of T
    assert not off.hybrid and off.max_total_num_tokens == off.serving_tokens == 1_354_410


def test_gpt_oss_and_gemma_keep_their_sliding_layers_in_one_pool():
    """gpt-oss-20b: 24 layers x 8 KV heads x (64 + 64) x 2 B = 49,152 B a token, sliding layers
    counted whole (SGLang's 0.5 releases turn the hybrid pool off for GptOssForCausalLM). Free 70 GiB,
    weights 13 GiB, fraction 0.85: rest = 57 - 10.5 = 46.5 GiB = 49,928,994,816 B, / 49,152 =
    1,015,808 tokens (one less where the float rest rounds down)."""
    spec = load_spec("openai/gpt-oss-20b")
    layout = build_layout(spec, "auto", 1)
    m = startup_memory(layout=layout, weights=13 * GiB, gpu_memory=80 * GiB, pre_load=70 * GiB, tp=1,
                       context_len=131_072, mem_fraction_static=0.85, **model_identity(spec))
    assert m.cell_size == 49_152 and not m.hybrid and m.swa_tokens == 0
    assert m.max_total_num_tokens == pytest.approx(1_015_808, abs=1) and m.serving_tokens == m.max_total_num_tokens
    assert "swa_tokens" not in m.to_dict()
    gemma = load_spec("google/gemma-3-27b-it")
    assert not hybrid_swa(**model_identity(gemma)) and not hybrid_swa(**model_identity(spec))


def test_which_models_run_on_the_hybrid_pool():
    assert hybrid_swa("llama4_text") and hybrid_swa("llama4")  # the published checkpoints' architecture
    assert hybrid_swa("llama4", ("Llama4ForConditionalGeneration",))
    assert not hybrid_swa("llama4_text", ("Llama4ForCausalLM",))  # a text-only checkpoint: one pool
    assert hybrid_swa("", ("MiMoV2FlashForCausalLM",)) and not hybrid_swa("gpt_oss", ("GptOssForCausalLM",))
    assert not hybrid_swa("gemma3_text") and not hybrid_swa("mistral")


def test_releases_before_0_4_7_ran_one_pool():
    spec, layout = _scout()
    m = startup_memory(layout=layout, weights=25 * GiB, gpu_memory=80 * GiB, pre_load=70 * GiB, tp=8,
                       context_len=10_485_760, mem_fraction_static=0.8, release="0.4.6", **model_identity(spec))
    assert not m.hybrid and m.max_total_num_tokens == 1_354_410


def test_refusals():
    spec, layout = _scout()
    args = dict(weights=25 * GiB, gpu_memory=80 * GiB, pre_load=70 * GiB, tp=8, context_len=10_485_760)
    with pytest.raises(UsageError, match="speculative"):
        startup_memory(layout=layout, speculative_steps=3, **args, **model_identity(spec))
    with pytest.raises(UsageError, match="ratio above 0"):
        startup_memory(layout=layout, swa_full_tokens_ratio=0.0, **args, **model_identity(spec))
    oss = load_spec("openai/gpt-oss-20b")
    with pytest.raises(UsageError, match="hybrid sliding-window pool"):
        startup_memory(layout=build_layout(oss, "auto", 8), swa_full_tokens_ratio=0.5, **args, **model_identity(oss))


def test_cli_reports_both_pools(run_cli):
    code, out, err = run_cli("size", SCOUT, "--gpu", "H100-80GB", "--tp", "8", "--engine", "sglang", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["full_layer_tokens"] == data["max_total_num_tokens"]
    assert data["swa_layer_tokens"] == int(data["full_layer_tokens"] * 0.8)
    flags = ("size", SCOUT, "--gpu", "H100-80GB", "--tp", "8", "--engine", "sglang", "--swa-full-tokens-ratio", "1")
    code, out, err = run_cli(*flags, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["full_layer_tokens"] == data["swa_layer_tokens"]  # r = 1: both pools hold the profiled tokens
    code, out, err = run_cli(*flags)
    flat = " ".join(out.split())
    assert code == 0, err
    assert (f"Use sliding window memory pool. full_layer_tokens={data['full_layer_tokens']}, "
            f"swa_layer_tokens={data['swa_layer_tokens']}") in flat
    code, out, err = run_cli("size", "openai/gpt-oss-20b", "--gpu", "H100-80GB", "--engine", "sglang", "--json")
    assert code == 0, err
    assert "swa_layer_tokens" not in json.loads(out)
    code, out, err = run_cli("size", "openai/gpt-oss-20b", "--gpu", "H100-80GB", "--swa-full-tokens-ratio", "0.5")
    assert code == 2 and "--swa-full-tokens-ratio" in err and "Traceback" not in err


def test_window_reads_of_a_layout():
    """gpt-oss-20b: 8 KV heads x (64 + 64) x 2 B = 2,048 B a layer, 12 full and 12 sliding layers of
    128 tokens: (24,576, 24,576, 128). Llama-3.1-8B has no sliding layer: None."""
    assert window_reads(build_layout(load_spec("openai/gpt-oss-20b"), "auto", 1)) == (24_576, 24_576, 128)
    assert window_reads(build_layout(load_spec("meta-llama/Llama-3.1-8B-Instruct"), "auto", 1)) is None


def _load(tmp_path, model: str, rate: float = 4, tp: int = 1, output: int = 64):
    from kvplan.experiments import load

    path = tmp_path / "w.yaml"
    path.write_text(f"""model: {model}
gpu: H100-80GB
tp: {tp}
engine: sglang
pool: {{mem_fraction_static: default}}
requests: {{count: 40, prompt: {{dist: fixed, value: 6000}}, output: {{dist: fixed, value: {output}}},
           arrival: {{process: poisson, rate: {rate}}}}}
""", encoding="utf-8")
    return load(path)


def test_sglang_serves_a_pool_smaller_than_the_context(tmp_path):
    """SGLang starts Gemma 3 12B on an H100 with fewer tokens than its 131,072 context and takes requests
    of up to min(context_len, max_total_num_tokens) - 1 tokens (Scheduler.max_req_len): the run's
    max_model_len is the pool less one, where vLLM's rule would refuse."""
    wl = _load(tmp_path, "google/gemma-3-12b-it")
    assert wl.pool.slots < 131_072 and wl.scheduler.max_model_len == wl.pool.slots - 1


def test_the_serving_pool_of_llama4_is_the_smaller_of_its_two(tmp_path):
    from kvplan.model.sglang_size import sglang_size

    wl = _load(tmp_path, SCOUT, tp=8)
    m = sglang_size(SCOUT, gpu="H100-80GB", tp=8).memory
    assert m.hybrid and wl.pool.slots == m.swa_tokens < m.max_total_num_tokens


def test_sliding_layers_read_their_window_only(tmp_path):
    """gpt-oss-20b on SGLang, 40 requests of 6,000 prompt and 400 output tokens at once: after ~30
    prefill steps, 400 decode steps of the 40 each read about 40 x 6,200 x 49,152 B = 12 GB of KV if
    every layer reads every token, and half that (the sliding layers read 128 tokens) if they read
    their window, beside at most 14.5 GB of weights (kvplan's estimate, MXFP4 experts): a step
    (12 + 14.5) / (6 + 14.5) = 1.3 times longer at most when every token is read. TPOT must come out
    at least 15% lower than for the same run whose layout keeps every layer full (same bytes a token,
    same pool); breaks if SGLang's steps read every token."""
    from dataclasses import replace

    from kvplan.model.layout import LayerGroup
    from kvplan.sim.engine import simulate_all

    wl = _load(tmp_path, "openai/gpt-oss-20b", rate=1000, output=400)
    full = replace(wl, layout=replace(wl.layout, groups=tuple(
        LayerGroup("full", g.num_layers, g.num_kv_heads, g.head_dim, g.v_head_dim, dtype_bits=g.dtype_bits)
        for g in wl.layout.groups)))
    assert wl.layout.bytes_per_token == full.layout.bytes_per_token
    windowed, every = (simulate_all(w)[0] for w in (wl, full))
    assert windowed.tpot.mean < 0.85 * every.tpot.mean
