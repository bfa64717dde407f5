"""Speculative decoding: the acceptance draws, the serve engine against the reference with drafts,
token counts derived by hand, the step model's verify-and-draft step, and the workload section."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from kvplan.errors import KvplanError
from kvplan.model.speculative import Draft, default_acceptance, make_speculative
from kvplan.sim import kernel as K
from kvplan.sim.engine import simulate
from kvplan.sim.reference import simulate_reference
from kvplan.sim.speculative import draw
from kvplan.workload.records import (AllocatorSpec, PoolSpec, RequestChunk, SchedulerConfig, SpeculativeRun,
                                     TimingConfig, Workload)
from tests.test_sim_engine import as_json, random_step_model, random_workload


def with_speculation(seed: int, big: bool = False):
    """A random workload of tests/test_sim_engine.py with a random speculative setting and draft."""
    wl, spec, points = random_workload(seed, big)
    rng = np.random.default_rng([seed, 7])
    method = str(rng.choice(["eagle", "eagle3", "mtp", "ngram"]))
    k = int(rng.integers(1, 6))
    rates = np.sort(rng.random(k))[::-1] if rng.random() < 0.7 else None
    setting = make_speculative(method, k, None if rates is None else [float(r) for r in rates])
    draft = None
    if wl.timing.step is not None:
        model = None if method == "ngram" else random_step_model(rng)
        host = float(np.random.default_rng([seed, 8]).integers(0, 3000)) * 1e-9  # the proposer's floor
        draft = Draft(model, float(rng.integers(0, 3000)) * 1e-12, 0, 0, host)
    return replace(wl, speculative=SpeculativeRun(setting, draft)), spec, points


@pytest.mark.parametrize("seed", range(120))
def test_engine_equals_reference_with_speculation(seed):
    """Breaks if the kernel's drafts, lookahead blocks, draws or draft ticks differ from the reference's."""
    wl, spec, points = with_speculation(seed)
    fast = simulate(wl, spec, record_requests=True, timeline_points=points)
    slow = simulate_reference(wl, spec, record_requests=True, timeline_points=points)
    assert as_json(fast) == as_json(slow)


@pytest.mark.parametrize("seed", range(8))
def test_engine_equals_reference_with_speculation_larger(seed):
    wl, spec, points = with_speculation(seed, big=True)
    fast = simulate(wl, spec, record_requests=True, timeline_points=points)
    slow = simulate_reference(wl, spec, record_requests=True, timeline_points=points)
    assert as_json(fast) == as_json(slow)


def test_kernel_draw_is_the_reference_draw():
    rng = np.random.default_rng(3)
    for seed, rid, gen in zip(rng.integers(0, 2**31, 500), rng.integers(0, 2**40, 500), rng.integers(0, 2**20, 500)):
        assert int(K.spec_draw(np.int64(seed), np.int64(rid), np.int64(gen))) == draw(int(seed), int(rid), int(gen))


def test_draws_give_the_per_position_rates():
    """P(at least i + 1 drafts accepted) is acceptance[i] (vLLM's per-position metric), within
    4 standard errors over 40,000 draws."""
    from kvplan.sim.speculative import spec_setup

    setting = make_speculative("eagle3", 3, [0.8, 0.5, 0.2])
    sp = spec_setup(SpeculativeRun(setting), _step_units_clock(), seed=11, token_budget=16)
    n = 40_000
    counts = np.bincount([sp.accepted(rid, 5, 3) for rid in range(n)], minlength=4)
    at_least = counts[::-1].cumsum()[::-1][1:] / n
    for got, want in zip(at_least, (0.8, 0.5, 0.2)):
        assert abs(got - want) < 4 * (want * (1 - want) / n) ** 0.5


def _step_units_clock():
    from kvplan.sim.timing import StepClock

    return StepClock(timed=False)


def one_request(output: int, acceptance, k: int, budget: int = 64):
    sched = SchedulerConfig(4, budget, 128, True, "recompute", 0, False)

    def make():
        yield RequestChunk(np.array([0.0]), np.array([10]), np.array([output]))

    wl = Workload("one", "", 0, "serve", 1, PoolSpec(4096), (AllocatorSpec("paged", block_size=16),), sched,
                  TimingConfig(), make)
    setting = make_speculative("eagle3", k, acceptance)
    return replace(wl, speculative=SpeculativeRun(setting)), wl.allocators[0]


@pytest.mark.parametrize("output", [1, 2, 5, 13, 40])
def test_steps_by_hand(output):
    """One request, steps as time units: the prefill step samples token 1; then every decode step
    emits 1 + k tokens when every draft is accepted (k = 3: ceil((O - 1) / 4) steps), 1 token when
    none is; the last step stops at the output length."""
    for rates, per_step in (([1.0, 1.0, 1.0], 4), ([0.0, 0.0, 0.0], 1)):
        wl, alloc = one_request(output, rates, 3)
        for run in (simulate, simulate_reference):
            result = run(wl, alloc, record_requests=True)
            assert result.to_dict()["steps"] == 1 + -(-(output - 1) // per_step)


def test_budget_cuts_the_drafts():
    """A token budget of 2 leaves one draft a step: all accepted, each step emits 2 tokens."""
    wl, alloc = one_request(21, [1.0, 1.0, 1.0], 3, budget=2)
    wl = replace(wl, scheduler=replace(wl.scheduler, max_num_batched_tokens=2, max_model_len=128))
    # the prompt of 10 takes 5 chunked steps of 2, the last of which samples token 1
    steps = simulate_reference(wl, alloc).to_dict()["steps"]
    assert steps == 5 + 10  # 20 more tokens, 2 a step
    assert simulate(wl, alloc).to_dict()["steps"] == steps


def test_default_acceptance_is_geometric_and_cited_rates():
    """EAGLE-3's default is geometric: 0.745, 0.745^2 = 0.555025, 0.745^3 = 0.413494."""
    assert default_acceptance("eagle3", 3) == (0.745, 0.555025, 0.413494)
    assert make_speculative("eagle3", None, "0.8,0.6,0.4").k == 3


def test_mtp_defaults_to_the_measured_rates_of_a_rerun_layer():
    """vLLM reruns a model's one MTP layer for every draft position, which accepts far less past the
    first: SpecDecode-Bench's GLM-4.5-Air (vLLM v0.10.1, k = 3) 0.92, 0.68, 0.38, the default as
    they are, not 0.875^(i+1) (0.875, 0.766, 0.670); a fourth position keeps the last ratio,
    0.38 x 0.38 / 0.68 = 0.212353, a fifth 0.212353 x 0.38 / 0.68 = 0.118668. At k = 3 a step
    accepts 1.98 drafts, against 1.69 that sglang#10281 measures for DeepSeek-R1 (accept length 2.69)
    and 2.31 of the geometric rate."""
    assert default_acceptance("mtp", 1) == (0.92,)
    assert default_acceptance("mtp", 3) == (0.92, 0.68, 0.38)
    assert default_acceptance("mtp", 5)[3:] == (0.212353, 0.118668)
    assert make_speculative("mtp", 3).mean_accepted == pytest.approx(1.98)


@pytest.mark.parametrize("args,field", [
    (("medusa", 3, None), "--speculative"),
    (("eagle3", 0, None), "--num-speculative-tokens"),
    (("eagle3", 3, [0.5, 0.6, 0.1]), "--acceptance"),
    (("eagle3", 2, [0.5, 0.4, 0.1]), "--acceptance"),
    (("eagle3", 3, [1.5, 0.4, 0.1]), "--acceptance"),
    (("eagle3", 3, "a,b"), "--acceptance"),
])
def test_bad_settings_name_their_flag(args, field):
    with pytest.raises(KvplanError) as e:
        make_speculative(*args)
    assert e.value.field == field


# -- the step model ----------------------------------------------------------------------------------


def spec_step(model: str, gpu: str, method: str, k: int, batch: int, tp: int = 1, context: int = 300,
              acceptance=None) -> dict:
    from kvplan.model.step import step_of

    return step_of(model, gpu=gpu, tp=tp, batch=batch, context=context, speculative=method,
                   num_speculative_tokens=k, acceptance=acceptance)["speculative"]


def test_eagle3_head_of_llama_8b_by_hand():
    """Llama-3.1-8B (hidden 4096, 8 KV heads of 128, intermediate 14336): the EAGLE-3 head keeps one
    layer's KV, 8 x 128 x 2 (K, V) x 2 B = 4,096 B a token; its weights are one decoder layer
    (q, o 4096^2 each, k, v 4096 x 1024 each, MLP 3 x 4096 x 14336: 218,103,808 parameters), the fc
    of 3 x 4096^2 (50,331,648) and a lm_head of 32,000 x 4096 (131,072,000): 399,507,456 x 2 B."""
    sp = spec_step("meta-llama/Llama-3.1-8B-Instruct", "H100-80GB", "eagle3", 3, 1)
    assert sp["draft_kv_bytes_per_token"] == 4096
    assert sp["draft_weight_bytes_per_gpu"] == 799_014_912
    assert sp["lookahead_slots"] == 3


def test_mtp_of_deepseek_v3_keeps_one_mla_layer():
    """DeepSeek-V3's MTP module is one more MLA layer: kv_lora_rank 512 + qk_rope_head_dim 64 = 576
    elements a token at 2 B = 1,152 B. Its weights load only with MTP on (kvplan's 671B count the 61
    main layers): its 256 routed experts of 3 x 7168 x 2048 fp8 weights are 11.27 GB, 1,409,286,144 B
    a GPU at tp 8, plus its attention, shared expert and eh_proj (a few % more); the lm_head is the
    target's."""
    sp = spec_step("deepseek-ai/DeepSeek-V3", "H200", "mtp", 1, 1, tp=8)
    assert sp["draft_kv_bytes_per_token"] == 1152
    routed = 256 * 3 * 7168 * 2048 // 8
    assert routed < sp["draft_weight_bytes_per_gpu"] < 1.1 * routed


def test_speedup_shrinks_as_the_verify_forward_turns_compute_bound():
    """A dense 8B model on an H100: 4 tokens a request verified at batch 256 is 1,024 tokens, well
    past the GEMMs' ridge (~350 tokens: MAMF / (HBM x efficiency)), so the verify step costs far more
    than the plain one and the speedup falls; at batch 1 it is memory-bound: 1 + 1.713 tokens
    (0.745 + 0.745^2 + 0.745^3) a step of the plain ~6.9 ms plus three passes of the EAGLE-3 head
    (~0.36 ms each on the GPU; DRAFT_PASS_HOST_S is 0 by default) and the verify's three more
    lm_head rows, ~8.1 ms: 2.713 x 6.9 / 8.1 ~ 2.3 > 1.8; with the 0.9-0.10 proposer loop's 0.88 ms
    a pass (LOOP_PASS_HOST_S) ~1.97, still > 1.8."""
    curve = {row["batch"]: row["speedup"] for row in
             spec_step("meta-llama/Llama-3.1-8B-Instruct", "H100-80GB", "eagle3", 3, 1)["by_batch"]}
    assert curve[256] < curve[64] < curve[1]
    assert curve[1] > 1.8 and curve[256] < 1.6


def test_nothing_accepted_is_slower_than_no_speculation():
    """n-gram drafts that are never accepted: the step verifies 1 + k tokens and emits 1."""
    sp = spec_step("meta-llama/Llama-3.1-8B-Instruct", "H100-80GB", "ngram", 3, 8, acceptance="0,0,0")
    assert sp["step"]["tokens_per_request_step"] == 1.0
    assert sp["step"]["speedup"] < 1.0


def test_the_pool_holds_fewer_tokens_beside_the_draft(tmp_path):
    """Sized from memory, a pool of 32-layer Llama-3.1-8B with an EAGLE-3 head keeps 4,096 B more a
    token (33 layers' KV for 32) and the head's weights: at most 32/33 of the slots, and more than
    0.95 of them (the head's 0.8 GB against a pool of ~60 GB)."""
    from kvplan.experiments import load as load_workload_file

    base = ("model: meta-llama/Llama-3.1-8B-Instruct\ngpu: H100-80GB\npool: {gpu_memory_utilization: 0.9}\n"
            "requests: {count: 10, prompt: {dist: fixed, value: 100}, output: {dist: fixed, value: 50},"
            " arrival: {process: poisson, rate: 1}}\nscheduler: {max_model_len: 4096}\n")
    (tmp_path / "a.yaml").write_text(base)
    (tmp_path / "b.yaml").write_text(base + "speculative: {method: eagle3}\n")
    plain = load_workload_file(tmp_path / "a.yaml").pool.slots
    spec = load_workload_file(tmp_path / "b.yaml").pool.slots
    assert 0.95 * plain < spec <= plain * 32 / 33


def test_a_pool_given_in_bytes_keeps_its_bytes_beside_an_eagle_head(tmp_path):
    """kv_memory is vLLM's --kv-cache-memory-bytes: the KV cache's size whatever the weights take, so
    the head's weights come out of the GPU's rest, not of it: 4 GiB / (131,072 + 4,096 B a token)
    = 31,775 slots."""
    from kvplan.experiments import load as load_workload_file

    (tmp_path / "a.yaml").write_text(
        "model: meta-llama/Llama-3.1-8B-Instruct\ngpu: H100-80GB\npool: {kv_memory: 4GiB}\n"
        "requests: {count: 10, prompt: {dist: fixed, value: 100}, output: {dist: fixed, value: 50},"
        " arrival: {process: poisson, rate: 1}}\nscheduler: {max_model_len: 4096}\n"
        "speculative: {method: eagle3}\n")
    assert load_workload_file(tmp_path / "a.yaml").pool.slots == 4 * 2**30 // (131072 + 4096) == 31775


def test_ngram_defaults_to_its_sources_rates_per_position():
    """vllm#24344 prints n-gram's acceptance per position, vLLM's metric (steps accepting at least
    i + 1 drafts): 0.81 0.74 0.70 0.68 0.66, the default as they are (3.59 accepted at k = 5);
    a sixth position keeps the last ratio, 0.66 x 0.66 / 0.68 = 0.640588."""
    from kvplan.model.speculative import default_acceptance

    assert default_acceptance("ngram", 5) == (0.81, 0.74, 0.70, 0.68, 0.66)
    assert default_acceptance("ngram", 6)[-1] == 0.640588
    assert default_acceptance("ngram", 2) == (0.81, 0.74)


def test_a_speculative_serve_run_is_deterministic_and_faster(tmp_path):
    """Same file, same JSON; and at a light load the TPOT falls (drafts accepted at the default rates)."""
    from kvplan.experiments import load as load_workload_file
    from kvplan.sim.engine import serve_document

    base = ("model: meta-llama/Llama-3.1-8B-Instruct\ngpu: H100-80GB\npool: {gpu_memory_utilization: 0.9}\n"
            "requests: {count: 60, prompt: {dist: fixed, value: 200}, output: {dist: fixed, value: 100},"
            " arrival: {process: poisson, rate: 2}}\nscheduler: {max_model_len: 4096}\n")
    (tmp_path / "a.yaml").write_text(base)
    (tmp_path / "b.yaml").write_text(base + "speculative: {method: eagle3, num_speculative_tokens: 3}\n")
    docs = [json.dumps(serve_document(load_workload_file(tmp_path / "b.yaml"))) for _ in range(2)]
    assert docs[0] == docs[1]
    plain = serve_document(load_workload_file(tmp_path / "a.yaml"))["results"][0]["tpot_s"]["mean"]
    spec = json.loads(docs[0])["results"][0]["tpot_s"]["mean"]
    assert spec < plain / 1.5


def test_the_section_round_trips_through_yaml_and_the_json_schema(tmp_path):
    """`speculative:` read, written back by spec_yaml and read again gives the same spec; the JSON
    schema knows the section and its keys."""
    from kvplan.workload.json_schema import workload_schema
    from kvplan.workload.schema import SPECULATIVE_KEYS, read_spec
    from kvplan.workload.spec_yaml import spec_yaml

    path = tmp_path / "w.yaml"
    path.write_text("pool: {slots: 10000}\nrequests: {count: 5, prompt: {dist: fixed, value: 10}, output: {dist: "
                    "fixed, value: 5}, arrival: {process: poisson, rate: 1}}\n"
                    "speculative: {method: mtp, num_speculative_tokens: 2, acceptance: [0.9, 0.7]}\n")
    spec = read_spec(path)
    again = tmp_path / "again.yaml"
    again.write_text(spec_yaml(spec))
    assert read_spec(again).speculative == spec.speculative
    props = workload_schema()["properties"]["speculative"]["properties"]
    assert tuple(props) == SPECULATIVE_KEYS


def test_corpus_rows_are_cited_and_held_out_vllm_rows_are_predicted_within_the_target():
    """tests/data/speculative_measurements.yaml: every row names its source and setting; a third of
    the sources is held out (by source, never the one LOOP_PASS_HOST_S is read off) and kvplan's
    step model predicts the held-out vLLM rows (the engine it models), the vLLM rows outside every
    fit and all vLLM rows with a median error within the issue's 15% (bench/speculative_fidelity.py
    prints every row, per source and regime)."""
    import statistics

    import kvplan.model.speculative as speculative
    from bench.speculative_fidelity import FIT_SOURCES, held_out_sources, load_rows, predict_with

    rows = load_rows()  # every row checked (check_row): a malformed one fails here
    sources = {r["source"] for r in rows}
    held = held_out_sources(rows)
    assert held < sources and len(held) == (len(sources) + 2) // 3 and not held & FIT_SOURCES
    vllm = [r for r in rows if r["engine"] == "vllm"]
    errors = [abs(p / r["speedup"] - 1) for r, p in zip(vllm, predict_with(vllm, speculative.DRAFT_PASS_HOST_S))]
    held_errors = [e for e, r in zip(errors, vllm) if r["source"] in held]
    unfitted = [e for e, r in zip(errors, vllm) if r["source"] not in FIT_SOURCES]
    assert held_errors and statistics.median(held_errors) <= 0.15
    assert len(unfitted) >= 10 and statistics.median(unfitted) <= 0.15
    assert statistics.median(errors) <= 0.15
    mtp = [r for r in rows if r["method"] == "mtp"]
    assert len(mtp) >= 4 and {r["engine"] for r in mtp} == {"vllm", "sglang"}


GOOD_ROW = {"source": "https://example.org/run", "engine": "vllm", "model": "deepseek-ai/DeepSeek-V3",
            "gpu": "H200", "tp": 8, "method": "mtp", "k": 2, "batch": 4, "context": 1000, "speedup": 1.5}


@pytest.mark.parametrize("change,field", [
    ({"speedup": None}, "speedup"),
    ({"source": "github.com/x/y/pull/1"}, "source"),
    ({"engine": "trtllm"}, "engine"),
    ({"method": "medusa"}, "method"),
    ({"k": 0}, "k"),
    ({"k": 2.0}, "k"),
    ({"batch": True}, "batch"),
    ({"tp": -8}, "tp"),
    ({"context": "1k"}, "context"),
    ({"speedup": 0}, "speedup"),
    ({"al": 3.5}, "al"),
    ({"al": 0.9}, "al"),
    ({"ratio_to_batch": 4}, "ratio_to_batch"),
    ({"acceptance": [0.9, 0.7]}, "acceptance"),
    ({"model": "someone/not-in-the-catalog-70B"}, "model"),
    ({"gpu": "H900"}, "gpu"),
    ({"model": "meta-llama/Llama-3.1-8B-Instruct", "tp": 1}, "method"),
])
def test_a_malformed_corpus_row_names_its_field(change, field):
    """bench/speculative_fidelity.py's check_row: each malformed row fails naming the field (a
    missing key, a bad value, an extra key, a model kvplan cannot resolve offline, MTP on a model
    without MTP layers); the good row passes."""
    from bench.speculative_fidelity import check_row

    check_row(dict(GOOD_ROW))
    row = {**GOOD_ROW, **change}
    if change == {"speedup": None}:
        del row["speedup"]
    with pytest.raises(ValueError, match=rf"row 7: {field}: expected"):
        check_row(row, "row 7")


def test_a_corpus_with_a_setting_twice_is_refused(tmp_path):
    import yaml

    from bench.speculative_fidelity import load_rows

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"rows": [GOOD_ROW, {**GOOD_ROW, "speedup": 1.4}]}))
    with pytest.raises(ValueError, match="row 2: source: expected one row a setting"):
        load_rows(path)
    path.write_text(yaml.safe_dump({"rows": [GOOD_ROW, {**GOOD_ROW, "batch": 8}]}))
    assert len(load_rows(path)) == 2


def test_the_proposer_time_per_pass_is_read_off_vllm_20780():
    """LOOP_PASS_HOST_S is the mean of the least-squares slopes of the step time (TPOT x acceptance
    length) over K in vllm-project/vllm#20780 (Llama-3.1-8B, batch 1, K = 2..7): EAGLE-1 0.740 ms
    and EAGLE-3 1.016 ms a draft, 0.878 ms; the constant keeps two digits."""
    from kvplan.model.speculative import LOOP_PASS_HOST_S

    ks = [2, 3, 4, 5, 6, 7]
    runs = {"eagle": ([4.37, 4.29, 4.48, 4.71, 4.94, 5.2], [2.1, 2.29, 2.39, 2.43, 2.45, 2.47]),
            "eagle3": ([4.32, 4.09, 4.05, 4.13, 4.2, 4.29], [2.36, 2.79, 3.08, 3.32, 3.46, 3.54])}
    slopes = []
    for tpot, al in runs.values():
        step = [t * a for t, a in zip(tpot, al)]
        mk, ms = sum(ks) / 6, sum(step) / 6
        slopes.append(sum((k - mk) * (s - ms) for k, s in zip(ks, step)) / sum((k - mk) ** 2 for k in ks))
    assert abs(slopes[0] - 0.740) < 1e-3 and abs(slopes[1] - 1.016) < 1e-3
    assert abs(LOOP_PASS_HOST_S * 1e3 - sum(slopes) / 2) < 0.005


def test_a_draft_pass_takes_the_longer_of_its_gpu_work_and_the_proposer():
    """pass = max(fixed + linear, host) + per request + KV + attention (Draft.pass_s): with the host
    time far above the GPU's the pass is the host time plus the per-request, KV and attention terms;
    with none it is the GPU's sum."""
    rng = np.random.default_rng(5)
    m = random_step_model(rng)
    gpu = Draft(m, 0.0, 0, 0, 0.0)
    slow = Draft(m, 0.0, 0, 0, 1.0)
    rest = m.gpu_per_request_s * 3 + m.kv_read_s_per_token * 700 + m.attention_s_per_pair * 11
    assert gpu.pass_s(4, 3, 700, 11) == pytest.approx(m.gpu_overhead_s + m.per_token_s(4) + rest)
    assert slow.pass_s(4, 3, 700, 11) == pytest.approx(1.0 + rest)
    assert slow.pass_s(0, 3, 700, 11) == 0.0


def _speculate(wl, seed: int):
    rng = np.random.default_rng([seed, 11])
    method = str(rng.choice(["eagle3", "mtp", "ngram"]))
    k = int(rng.integers(1, 5))
    setting = make_speculative(method, k, [float(r) for r in np.sort(rng.random(k))[::-1]])
    draft = None
    if wl.timing.step is not None:
        draft = Draft(None if method == "ngram" else random_step_model(rng), 1e-9, 0, 0)
    return replace(wl, speculative=SpeculativeRun(setting, draft))


@pytest.mark.parametrize("seed", range(80))
def test_engine_equals_reference_with_prefix_caching_and_speculation(seed):
    """Prefix hits with an EAGLE-style drafter give up their last block, in both engines alike."""
    from tests.test_sim_prefix_serve import random_prefix_workload

    wl, spec, points = random_prefix_workload(seed, big=seed % 4 == 0)
    wl = _speculate(wl, seed)
    fast = simulate(wl, spec, record_requests=True, timeline_points=points)
    slow = simulate_reference(wl, spec, record_requests=True, timeline_points=points)
    assert as_json(fast) == as_json(slow)


@pytest.mark.parametrize("seed", range(40))
def test_engine_equals_reference_with_offload_and_speculation(seed):
    from tests.test_sim_offload import assert_agree, random_offload_workload

    wl, spec, points = random_offload_workload(seed, big=seed % 4 == 0)
    assert_agree(_speculate(wl, seed), spec, points)


def test_eagle_gives_up_the_last_hit_block():
    """Two requests of one 64-token prompt (4 blocks of 16), the second after the first is done:
    it hits 3 blocks (63 tokens computable at most: floor(63 / 16) = 3), and with an EAGLE-style
    drafter one fewer (2 blocks, 32 tokens); n-gram keeps all 3."""
    sched = SchedulerConfig(4, 256, 256, True, "recompute", 0, False, True)
    ids = [[1, 2, 3, 4], [1, 2, 3, 4]]  # each prompt's hash blocks of 16 tokens

    def make():
        yield RequestChunk(np.array([0.0, 100.0]), np.array([64, 64]), np.array([3, 3]), ids, 16)

    base = Workload("hit", "", 0, "serve", 2, PoolSpec(4096), (AllocatorSpec("paged", block_size=16),), sched,
                    TimingConfig(), make)
    for method, hit in (("eagle3", 32), ("ngram", 48)):
        wl = replace(base, speculative=SpeculativeRun(make_speculative(method, 2, [0.5, 0.2])))
        for run in (simulate, simulate_reference):
            result = run(wl, wl.allocators[0], record_requests=True).to_dict()
            assert result["prefix_cache"]["hit_tokens"] == hit, (method, run)
