"""Fuzzing the readers: generated configs and workload files give a result or a KvplanError, nothing else.

The strategies stay close to the real schemas (the keys kvplan reads, valid values mutated into
negatives, zero, huge integers, NaN, infinity, text, lists and nested mappings, keys dropped) so
that most examples get past the first check. Examples are derandomized for a stable CI; set
KVPLAN_FUZZ_RANDOM=1 to explore new ones.

KNOWN_CRASHES lists the crashes already filed as bugs (each with a strict-xfail case in
tests/bad_inputs/cases.yaml); they are tolerated here so that any *new* kind of crash fails this
test. Delete an entry when its bug is fixed.
"""

from __future__ import annotations

import os
import tempfile
import traceback
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvplan.errors import KvplanError

TRACES = Path(__file__).resolve().parent / "bad_inputs" / "traces"
FUZZ = settings(max_examples=300, deadline=None, derandomize=not os.environ.get("KVPLAN_FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip

# (exception type, function where it is raised): bug id in tests/bad_inputs/cases.yaml
KNOWN_CRASHES: dict[tuple[str, str], str] = {}


def _check_crash(exc: BaseException) -> None:
    """Re-raise unless `exc` is a filed bug (matched by type and the kvplan function raising it)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "kvplan" in f.filename]
    where = frames[-1] if frames else None
    keys = {(type(exc).__name__, where.name), ("*", Path(where.filename).name)} if where else set()
    if not keys & set(KNOWN_CRASHES):
        raise exc


# ---- values around the schema --------------------------------------------------------------

ODD_INTS = st.sampled_from([0, -1, -4096, 1, 2, 3, 7, 2**63, 10**20, 10**400])
ODD_FLOATS = st.sampled_from([float("nan"), float("inf"), float("-inf"), 0.5, -0.0, 1e308, 2.5])
SCALARS = st.one_of(st.integers(-10, 100_000), ODD_INTS, ODD_FLOATS, st.booleans(), st.none(),
                    st.text(max_size=8), st.sampled_from(["bfloat16", "float16", "float32", "torch.float8"]))  # fmt: skip
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                      max_leaves=6)  # fmt: skip

LLAMA = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 8,
         "num_key_value_heads": 2, "max_position_embeddings": 4096, "vocab_size": 1000,
         "intermediate_size": 1024, "torch_dtype": "bfloat16"}  # fmt: skip
CONFIG_KEYS = sorted(set(LLAMA) | {
    "n_layer", "n_head", "n_embd", "num_layers", "d_model", "n_positions", "head_dim", "kv_channels",
    "num_kv_heads", "n_head_kv", "multi_query", "new_decoder_architecture", "multi_query_attention",
    "multi_query_group_num", "sliding_window", "use_sliding_window", "max_window_layers", "layer_types",
    "sliding_window_pattern", "attention_chunk_size", "no_rope_layers", "full_attention_interval",
    "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "block_configs",
    "hybrid_override_pattern", "attn_layer_period", "attn_layer_offset", "mamba_d_state", "mamba_d_conv",
    "mamba_expand", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
    "linear_value_head_dim", "text_config", "attn_config", "tie_word_embeddings", "dtype",
})  # fmt: skip
MODEL_TYPES = st.sampled_from(["llama", "gemma2", "mpt", "falcon", "RefinedWeb", "gpt_bigcode", "chatglm",
                               "qwen2", "jamba", "nemotron-nas", "nemotron_h", "deepseek_v3", "gpt2"])  # fmt: skip


@st.composite
def configs(draw) -> dict:
    """A valid small config with some keys dropped and some set to odd values, or a random dict."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.dictionaries(st.sampled_from(CONFIG_KEYS), VALUES, max_size=12))
    raw = {k: v for k, v in LLAMA.items() if draw(st.integers(0, 7))}
    raw["model_type"] = draw(MODEL_TYPES) if draw(st.booleans()) else "llama"
    for key in draw(st.lists(st.sampled_from(CONFIG_KEYS), max_size=5)):
        raw[key] = draw(VALUES)
    if draw(st.integers(0, 4)) == 0:
        raw["text_config"] = dict(raw)
    return raw


@given(raw=configs(), kv_dtype=st.sampled_from(["auto", "fp8", "int4", "fp32"]), tp=st.sampled_from([1, 2, 3, 8]))
@FUZZ
def test_config_reader_and_layout_never_crash(raw, kv_dtype, tp):
    """read_model + build_layout + the weight estimate (what `kvplan size PATH` runs): a result or a
    KvplanError, never a crash."""
    from kvplan.model.build import build_layout
    from kvplan.model.config import read_model
    from kvplan.model.weights import estimate_weights

    try:
        spec = read_model(raw, "fuzz", "fuzz/config.json")
        layout = build_layout(spec, kv_dtype, tp)
        assert layout.bytes_per_token >= 0 and layout.kv_bytes(layout.max_context or 4096) >= 0
        assert estimate_weights(spec).bytes >= 0
    except KvplanError as exc:
        assert str(exc)
    except Exception as exc:  # noqa: BLE001 - the point of the test
        _check_crash(exc)


# ---- workload files ---------------------------------------------------------------------------

LENGTHS = st.one_of(
    st.fixed_dictionaries({"dist": st.just("fixed"), "value": SCALARS}),
    st.fixed_dictionaries({"dist": st.just("uniform"), "low": SCALARS, "high": SCALARS}),
    st.fixed_dictionaries({"dist": st.just("normal"), "mean": SCALARS, "std": SCALARS}),
    st.fixed_dictionaries({"dist": st.just("lognormal"), "median": SCALARS, "sigma": SCALARS}),
    st.fixed_dictionaries({"dist": st.just("exponential"), "mean": SCALARS}),
    st.fixed_dictionaries({"dist": st.just("zipf"), "a": SCALARS}, optional={"scale": SCALARS, "max": SCALARS}),
    st.fixed_dictionaries({"dist": st.just("histogram"), "edges": st.lists(SCALARS, max_size=4),
                           "weights": st.lists(SCALARS, max_size=4)}),
    st.fixed_dictionaries({"dist": st.sampled_from(["csv", "gaussian", 3])}, optional={"path": SCALARS}),
    VALUES,
)  # fmt: skip
SECTIONS = {
    "experiment": st.sampled_from(["capacity", "capacity", "serve", "bench", 1]),
    "seed": SCALARS,
    "model": st.sampled_from(["meta-llama/Meta-Llama-3-8B", "facebook/opt-13b", "deepseek-ai/DeepSeek-V3",
                              "../../etc/passwd", "no-such/model", ""]),
    "kv_dtype": st.sampled_from(["auto", "fp8", "fp7", 16]),
    "tp": SCALARS,
    "pool": st.one_of(st.fixed_dictionaries({"slots": st.one_of(st.integers(1, 10**6), SCALARS)}),
                      st.fixed_dictionaries({"kv_memory": st.sampled_from(["16GiB", "1 TB", "-1GiB", "x", 0])}),
                      VALUES),
    "requests": st.one_of(
        st.fixed_dictionaries({"count": st.one_of(st.integers(-2, 2000), ODD_INTS), "prompt": LENGTHS,
                               "output": LENGTHS},
                              optional={"arrival": st.one_of(
                                  st.fixed_dictionaries({"process": st.sampled_from(["poisson", "gamma", "all_at_once", "x"])},
                                                        optional={"rate": SCALARS, "cv": SCALARS}), VALUES)}),
        st.fixed_dictionaries({"trace": st.fixed_dictionaries(
            {"format": st.sampled_from(["azure", "vidur", "mooncake", "sharegpt", "agentic", "x"]),
             "path": st.sampled_from([str(TRACES / name) for name in (
                 "azure-good.csv", "azure-bad-row.csv", "mooncake-hash-ids.jsonl", "sharegpt-unknown-role.json",
                 "lengths.csv", "no-such.csv", ".")])},
            optional={"limit": SCALARS, "time_scale": SCALARS, "repeat": st.integers(-1, 3)})}),
        VALUES),
    "allocators": st.one_of(st.lists(st.one_of(
        st.fixed_dictionaries({"kind": st.just("paged"), "block_size": st.one_of(SCALARS, st.lists(SCALARS, max_size=3))}),
        st.fixed_dictionaries({"kind": st.just("contiguous")}, optional={"policy": st.sampled_from(["max", "pow2", "oracle", "x"]),
                                                                          "max_len": SCALARS}),
        VALUES), max_size=3), VALUES),
    "scheduler": st.one_of(st.dictionaries(st.sampled_from(["max_model_len", "max_num_seqs", "max_num_batched_tokens",
                                                             "chunked_prefill", "preemption", "swap_space"]),
                                           SCALARS, max_size=3), VALUES),
}  # fmt: skip


@st.composite
def workload_texts(draw) -> str:
    """A YAML workload near the schema (sections dropped or odd), sometimes cut short or garbled."""
    doc = {"experiment": "capacity", "pool": {"slots": 100000},
           "requests": {"count": 50, "prompt": {"dist": "uniform", "low": 10, "high": 100},
                        "output": {"dist": "fixed", "value": 10}}}  # fmt: skip
    for key in draw(st.lists(st.sampled_from(sorted(SECTIONS)), max_size=4, unique=True)):
        if draw(st.integers(0, 5)) == 0:
            doc.pop(key, None)
        else:
            doc[key] = draw(SECTIONS[key])
    text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    mangle = draw(st.integers(0, 9))
    if mangle == 0:
        cut = draw(st.integers(0, len(text)))
        text = text[:cut] + draw(st.text(max_size=10)) + text[cut:]
    elif mangle == 1:
        text = text[: draw(st.integers(0, len(text)))]
    return text


@given(text=workload_texts())
@FUZZ
def test_workload_reader_never_crashes(text):
    """load_workload (models resolved from the catalog) and, for small ones, the capacity experiment:
    a result or a KvplanError, never another exception."""
    from kvplan.experiments import load
    from kvplan.replay.capacity import capacity_document

    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        path = Path(folder) / "w.yaml"
        path.write_text(text, encoding="utf-8")
        try:
            workload = load(path)
            if workload.experiment == "capacity" and workload.num_requests <= 5000:
                doc = capacity_document(workload)
                assert doc["num_requests"] == workload.num_requests
        except KvplanError as exc:
            assert str(exc)
        except Exception as exc:  # noqa: BLE001 - the point of the test
            _check_crash(exc)


GROUP = st.fixed_dictionaries({}, optional={
    "count": st.one_of(st.integers(-1, 4), ODD_INTS), "role": st.sampled_from(["both", "prefill", "decode", "x", 3]),
    "gpu": st.sampled_from(["H100-80GB", "L40S", "NoSuchGPU", ""]), "tp": SCALARS, "name": VALUES,
    "scheduler": st.one_of(st.fixed_dictionaries({"prefix_caching": st.booleans()}), VALUES),
    "pool": st.one_of(st.fixed_dictionaries({"gpu_memory_utilization": SCALARS}), VALUES), "colour": VALUES})
FLEET_SECTIONS = {
    "replicas": st.one_of(st.lists(st.one_of(GROUP, VALUES), max_size=3), VALUES),
    "router": st.one_of(st.sampled_from(["round_robin", "random", "least_outstanding", "least_kv", "prefix_aware", "x"]),
                        st.fixed_dictionaries({}, optional={"policy": st.sampled_from(["least_kv", "prefix_aware", 1]),
                                                            "sync_interval_s": SCALARS, "overlap_weight": SCALARS}),
                        VALUES),
    "transfer": st.one_of(st.fixed_dictionaries({}, optional={"gb_per_s": SCALARS, "latency_s": SCALARS}), VALUES),
    "prefix": st.one_of(st.fixed_dictionaries({"system_prompts": st.integers(0, 4)},
                                              optional={"system_prompt_len": st.integers(1, 64)}), VALUES),
}  # fmt: skip


@st.composite
def fleet_texts(draw) -> str:
    doc = {"experiment": "fleet", "model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "L40S",
           "pool": {"gpu_memory_utilization": 0.9}, "scheduler": {"prefix_caching": False},
           "requests": {"count": 40, "prompt": {"dist": "uniform", "low": 10, "high": 300},
                        "output": {"dist": "fixed", "value": 8}, "arrival": {"process": "poisson", "rate": 20}},
           "replicas": [{"count": 2}]}  # fmt: skip
    for key in draw(st.lists(st.sampled_from(sorted(FLEET_SECTIONS)), max_size=4, unique=True)):
        doc[key] = draw(FLEET_SECTIONS[key])
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


@given(text=fleet_texts())
@settings(max_examples=60, deadline=None, derandomize=not os.environ.get("KVPLAN_FUZZ_RANDOM"),
          suppress_health_check=[HealthCheck.too_slow])
def test_fleet_files_never_crash(text):
    """A fleet near the schema (groups, roles, routers, links odd or missing) gives a result in
    which every request is served once, or a KvplanError; never another exception."""
    from kvplan.experiments import load
    from kvplan.fleet.run import simulate_fleet

    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        path = Path(folder) / "f.yaml"
        path.write_text(text, encoding="utf-8")
        try:
            result = simulate_fleet(load(path))
            assert result.completed == 40
        except KvplanError as exc:
            assert str(exc)
        except Exception as exc:  # noqa: BLE001 - the point of the test
            _check_crash(exc)


# ---- check files ------------------------------------------------------------------------------

CHECK_WORKLOADS = [str(Path(__file__).resolve().parents[1] / "workloads" / "lesson.yaml"),
                   str(TRACES.parent / "checks" / "ok-workload.yaml"), "no-such.yaml", "."]  # fmt: skip
SIZE_METRICS = ["bytes_per_token", "max_concurrency", "token_slots", "kv_bytes", "fits", "kv_dtype", "gpu", "notes"]
SIM_METRICS = ["admitted", "utilization", "memory_breakdown.free", "memory_breakdown", "pool_slots", "label",
               "results[1].admitted", "results[9]"]  # fmt: skip
ODD_METRICS = ["nope", "a.b.c", "admitted[0]", "bytes_per_token.x"]
OPS = [">=", "<=", "==", "!=", ">", "<"]
RARE = st.sampled_from([False] * 19 + [True])  # True about one time in twenty (False is the simplest)
BOUNDS = ["0", "1", "122", "131072", "0.5", "1e3", "16GiB", "paged", "true", "'x'"]
ODD_BOUNDS = ["1e999", "nan", "", "== 3", "1,000", "\"y\"", "-0", "1_0", "1_", "1_.5", "0x10", "9" * 5000, "\x00"]


@st.composite
def expressions(draw, metrics: list[str]) -> str:
    """`metric op bound`, now and then with an odd metric, operator or bound, or plain junk."""
    rare = lambda: draw(RARE)  # noqa: E731
    if rare():
        return draw(st.text(max_size=12))
    metric = draw(st.sampled_from(ODD_METRICS if rare() else metrics))
    op = draw(st.sampled_from(["=>", "=", "~"] if rare() else OPS))
    bound = draw(st.sampled_from(ODD_BOUNDS)) if rare() else draw(st.one_of(st.sampled_from(BOUNDS),
                                                                            st.integers(-5, 10**6).map(str)))
    return f"{metric} {op} {bound}"


def _option(draw, rare, good, odd=SCALARS):
    return draw(odd) if rare() else draw(good)


@st.composite
def check_entries(draw) -> dict:
    """One check, valid in its shape most of the time, with odd options, metrics and bounds now and then."""
    rare = lambda: draw(RARE)  # noqa: E731
    entry: dict = {"name": _option(draw, rare, st.none())}  # None: the test numbers it
    kind = draw(st.sampled_from(["both", "neither"])) if rare() else draw(st.sampled_from(["size", "simulate"]))
    if kind in ("size", "both"):
        spec = {"model": _option(draw, rare, st.sampled_from(["facebook/opt-13b", "deepseek-ai/DeepSeek-V3"]),
                                 st.sampled_from(["./nope.json", "no/such", "", "../../etc/passwd"]))}
        if draw(st.booleans()):
            spec["kv_memory"] = _option(draw, rare, st.sampled_from(["12GiB", "1TB", "100MiB"]))
        elif draw(st.booleans()):
            spec["gpu"] = _option(draw, rare, st.sampled_from(["H100-80GB", "A100-40GB", "H900"]))
        for key, good in (("tokens", st.integers(1, 10**6)), ("tp", st.sampled_from([1, 2, 3])),
                          ("block_size", st.sampled_from([1, 16, 10**6]))):  # fmt: skip
            if draw(st.integers(0, 3)) == 0:
                spec[key] = _option(draw, rare, good)
        entry["size"] = spec
    if kind in ("simulate", "both"):
        spec = {"workload": _option(draw, rare, st.sampled_from(CHECK_WORKLOADS[:2]), st.sampled_from(CHECK_WORKLOADS))}
        if draw(st.integers(0, 3)) == 0:
            spec["block_sizes"] = _option(draw, rare, st.lists(st.integers(1, 64), min_size=1, max_size=3))
        entry["simulate"] = spec
        if draw(st.integers(0, 3)):
            entry["select"] = _option(draw, rare, st.fixed_dictionaries(
                {"allocator": st.just("paged")}, optional={"block_size": st.sampled_from([16, 32])}),
                st.dictionaries(st.sampled_from(["allocator", "block_size", "label", "nope"]),
                                st.sampled_from(["paged", "contiguous", 16, "paged-B16", None, True]), max_size=2))
    metrics = SIZE_METRICS if kind == "size" else SIM_METRICS
    entry["expect"] = draw(st.lists(expressions(metrics), min_size=1, max_size=3))
    if draw(st.booleans()):
        names = st.sampled_from(metrics + ODD_METRICS[:1])
        entry["baseline"] = {"metrics": draw(st.lists(names, min_size=1, max_size=2, unique=True))}
        if draw(st.booleans()):
            entry["baseline"]["rel_tol"] = _option(draw, rare, st.floats(0, 1))
        if draw(st.booleans()):
            entry["baseline"]["fail_on"] = _option(draw, rare, st.sampled_from(["change", "drop", "rise"]),
                                                   st.just("up"))
    return entry


STORED = st.none() | st.dictionaries(st.sampled_from(["check-0", "check-1"]), st.dictionaries(
    st.sampled_from(["admitted", "utilization", "token_slots", "bytes_per_token"]),
    st.one_of(st.none(), st.integers(-10, 10**6), st.floats(-1e9, 1e9)), max_size=3), max_size=2)  # fmt: skip


@given(checks=st.lists(check_entries(), min_size=1, max_size=3), stored=STORED, junk=st.integers(0, 19))
@settings(FUZZ, max_examples=150)
def test_check_files_never_crash(checks, stored, junk):
    """Generated check files (near the schema, or cut short): load_checks + run_checks give a report
    or a KvplanError."""
    from kvplan.check.run import load_checks, run_checks

    for i, check in enumerate(checks):
        check["name"] = f"check-{i}" if check["name"] is None else check["name"]
    text = yaml.safe_dump({"checks": checks}, sort_keys=False)
    text = text[: len(text) // 2] if junk == 0 else text
    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        path = Path(folder) / "checks.yaml"
        path.write_text(text, encoding="utf-8")
        try:
            report = run_checks(load_checks(path), stored)
            assert report.to_dict()["num_assertions"] == len(report.outcomes)
        except KvplanError as exc:
            assert str(exc)
        except Exception as exc:  # noqa: BLE001 - the point of the test
            _check_crash(exc)


def test_known_crashes_are_filed():
    """Every tolerated crash names a bug that has a strict-xfail reproducer in the corpus."""
    import re

    filed = (TRACES.parent / "cases.yaml").read_text(encoding="utf-8")
    filed += (Path(__file__).resolve().parent / "test_bad_inputs.py").read_text(encoding="utf-8")
    for note in KNOWN_CRASHES.values():
        for bug in re.findall(r"B\d+", note):
            assert f'"{bug} ' in filed, bug
