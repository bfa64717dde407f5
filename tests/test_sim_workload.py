"""The workload file reader: the lesson file, the schema's rules, and located errors."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from kvplan.errors import KvplanError, TraceError, WorkloadError
from kvplan.model.layout import KVLayout, LayerGroup
from kvplan.model.facts import ModelFacts
from kvplan.workload.schema import load_workload
from kvplan.workload.yaml_nodes import MAX_FILE_BYTES, as_size, load_yaml, load_yaml_text

ROOT = Path(__file__).resolve().parents[1]
LESSON = ROOT / "workloads" / "lesson.yaml"
SYNTH = """\
pool: {slots: 131072}
requests:
  count: 50
  prompt: {dist: uniform, low: 10, high: 200}
  output: {dist: fixed, value: 5}
"""


def write(tmp_path, text: str, name: str = "w.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def requests_of(workload):
    chunks = list(workload.make_requests())
    return tuple(np.concatenate([getattr(c, k) for c in chunks]) for k in ("arrival", "prompt_len", "output_len"))


def llama_layout(max_context: int = 8192) -> KVLayout:
    group = LayerGroup("full", 32, num_kv_heads=8, head_dim=128, v_head_dim=128)
    return KVLayout("meta-llama/Meta-Llama-3-8B", "bf16", 1, (group,), max_context)


def fake_resolver(calls=None, **extra):
    """A resolve_model callback with a Llama-3-8B-shaped layout (128 KiB per token)."""

    def resolve(model, kv_dtype, tp, gpu):
        if calls is not None:
            calls.append((model, kv_dtype, tp, gpu))
        gpu_obj = SimpleNamespace(name=gpu, memory_bytes=80 * 2**30, hbm_bytes_per_s=3.35e12,
                                  peak_bf16_flops=989e12) if gpu else None  # fmt: skip
        return ModelFacts(**{"layout": llama_layout(), "weight_bytes": 16 * 10**9, "gpu": gpu_obj,
                             "flops_per_token": 1.6e10, **extra})  # fmt: skip

    return resolve


def test_lesson_file_draws_the_lessons_prompts():
    """lesson.yaml must reproduce show_numbers.py's stream: default_rng(0).integers(100, 2001, 500)."""
    w = load_workload(LESSON)
    arrival, prompt, output = requests_of(w)
    assert np.array_equal(prompt, np.random.default_rng(0).integers(100, 2001, 500))
    assert not output.any() and not arrival.any()
    assert (w.experiment, w.num_requests, w.pool.slots, w.seed) == ("capacity", 500, 131072, 0)
    assert [a.label for a in w.allocators] == ["contiguous-max", "paged-B16"]
    assert w.contiguous_max_len == 8192 and w.allocators[0].max_len == 8192


def test_lesson_capacity_figures():
    """The lesson's literals through the shipped file: 16 vs 122 requests, 913 wasted, 12.9% used."""
    capacity = pytest.importorskip("kvplan.memory.capacity")
    w = load_workload(LESSON)
    _, prompt, output = requests_of(w)
    results = {r.allocator: r for r in capacity.capacity_sweep(
        prompt + output, w.pool.slots, limit=w.contiguous_max_len, block_sizes=(16,))}  # fmt: skip
    assert results["contiguous-max"].admitted == 16
    assert round(results["contiguous-max"].utilization, 3) == 0.129
    assert results["paged-B16"].admitted == 122 and results["paged-B16"].wasted_slots == 913


def test_same_seed_same_requests_and_seed_matters(tmp_path):
    """Reading a file twice (or iterating twice) gives identical requests; another seed differs."""
    text = SYNTH + "  arrival: {process: gamma, rate: 5, cv: 3}\n"
    a = requests_of(load_workload(write(tmp_path, "seed: 7\n" + text)))
    b = load_workload(write(tmp_path, "seed: 7\n" + text, "x.yaml"))
    for x, y, z in zip(a, requests_of(b), requests_of(b)):
        assert np.array_equal(x, y) and np.array_equal(y, z)
    c = requests_of(load_workload(write(tmp_path, "seed: 8\n" + text, "y.yaml")))
    assert not np.array_equal(a[1], c[1])


@pytest.mark.parametrize(
    ("text", "line", "field", "message"),
    [
        ("pool: {slots: 100}\nfoo: 1\n", 2, "foo", "unknown key 'foo'"),
        (SYNTH.replace("low: 10", "lw: 10"), 4, "requests.prompt.lw", "did you mean 'low'?"),
        (SYNTH.replace("{dist: uniform, low: 10, high: 200}", "\n    dist: normal\n    mean: -3\n    std: 1"),
         6, "requests.prompt.mean", "expected a number > 0, got -3"),
        (SYNTH.replace("count: 50", "count: true"), 3, "requests.count", "got true (a boolean)"),
        (SYNTH.replace("count: 50", "count: 2.5"), 3, "requests.count", "expected an integer"),
        (SYNTH.replace("count: 50", "count: '50'"), 3, "requests.count", "(a string)"),
        (SYNTH + "seed: .nan\n", 6, "seed", "expected an integer"),
        (SYNTH + "seed: 1\nseed: 2\n", 7, "seed", "duplicate key 'seed' (first at line 6)"),
        (SYNTH + "experiment: batch\n", 6, "experiment", "expected one of capacity, serve"),
        (SYNTH.replace("slots: 131072", "slots: 131072, kv_memory: 1GiB"), 1, "pool.kv_memory",
         "give only one of"),
        (SYNTH.replace("131072", "1099511627777"), 1, "pool.slots", "<= 1099511627776"),
        (SYNTH.replace("count: 50", "count: 50_000_001"), 3, "requests.count", "limit of 50,000,000"),
        (SYNTH.replace("high: 200", "high: 9000"), 4, "requests.prompt", "exceed max_model_len"),
        (SYNTH + "scheduler: {max_num_batched_tokens: 4096, chunked_prefill: false}\n", 6,
         "scheduler.max_num_batched_tokens", "below max_model_len 8192"),
        (SYNTH + "allocators:\n  - {kind: paged, block_size: [16, 0]}\n", 7,
         "allocators[0].block_size[1]", ">= 1"),
        (SYNTH + "allocators: [{kind: buddy}]\n", 6, "allocators[0].kind", "expected one of"),
        (SYNTH + "model: llama\n", 6, "model", "no model resolver"),
        (SYNTH + "gpu: H100\n", 6, "gpu", "needs a model"),
        (SYNTH.replace("pool: {slots: 131072}", "pool: {kv_memory: 16GiB}"), 1, "pool.kv_memory",
         "needs a model"),
        (SYNTH + "scheduler: {preemption: swap}\n", 6, "scheduler.preemption", "swap_slots"),
        ("pool: {slots: 10}\n", 1, "requests", "required key missing"),
        (SYNTH + "prefix: 3\n", 6, "prefix", "expected a mapping"),
        ("pool: &p {slots: 10}\nold: *p\n", 2, "old", "unknown key"),
        ("pool:\n  <<: {slots: 10}\n", 2, "pool", "merge keys"),
        ("pool: !!python/object/apply:os.system [echo hi]\n", 1, "pool", "unsupported YAML tag"),
        ("pool: {slots: 10}\n  bad: [\n", 2, None, "invalid YAML"),
        ("- a\n- b\n", 1, None, "top level"),
    ],
)  # fmt: skip
def test_errors_name_key_and_line(tmp_path, text, line, field, message):
    """Every rule of the schema fails with the key's dotted path and its line in the file."""
    path = write(tmp_path, text)
    with pytest.raises(WorkloadError) as err:
        load_workload(path)
    e = err.value
    assert (e.line, e.field, e.file) == (line, field, str(path)) and message in e.message, str(e)


def test_empty_and_oversized_files(tmp_path):
    """An empty file and one above the size cap are refused before parsing."""
    with pytest.raises(WorkloadError, match="empty"):
        load_workload(write(tmp_path, "# nothing\n"))
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (MAX_FILE_BYTES + 1))
    with pytest.raises(WorkloadError, match="MiB limit"):
        load_yaml(big)


def test_yaml_bomb_is_refused_before_expansion(tmp_path, monkeypatch):
    """A 'billion laughs' file (9^9 strings after expansion) is refused after a bounded number of
    values built, never expanded (a count, not a clock)."""
    from kvplan.workload import yaml_nodes

    built = []
    build = yaml_nodes._Builder.build

    def counting(self, node, path, depth):
        built.append(1)
        return build(self, node, path, depth)

    monkeypatch.setattr(yaml_nodes._Builder, "build", counting)
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    path = write(tmp_path, "\n".join(lines) + "\n")
    with pytest.raises(WorkloadError, match="alias"):
        load_workload(path)
    assert 0 < len(built) <= 2 * yaml_nodes.MAX_ALIAS_USES  # 9^9 if expanded
    with pytest.raises(WorkloadError, match="recursive"):
        load_yaml_text("a: &a [1, *a]\n")


def test_generic_getters():
    """The typed getters a check-file reader reuses: sizes, numbers, booleans, choices."""
    doc = load_yaml_text("a: 12GiB\nb: 4 GB\nc: 1e3\nd: '1e3'\ne: yes\nf: 3\ng: 16G\nh: 0\n", file="c.yaml")
    assert doc.get_size("a") == 12 * 2**30 and doc.get_size("b") == 4 * 10**9
    assert doc.get_size("g") == 16 * 2**30
    assert doc.get_float("c") == 1000.0 and doc.get_int("c") == 1000
    with pytest.raises(WorkloadError, match="a string"):
        doc.get_float("d")
    assert doc.get_bool("e") is True
    with pytest.raises(WorkloadError, match="true or false"):
        doc.get_bool("f")
    with pytest.raises(WorkloadError, match="size"):
        as_size(load_yaml_text("x: 12 parsecs\n").node("x"))
    with pytest.raises(WorkloadError) as err:
        doc.finish()  # h was never asked for
    assert (err.value.field, err.value.line, err.value.file) == ("h", 8, "c.yaml")


def test_model_callback_pool_and_timing(tmp_path):
    """With a model: kv_memory / bytes per token gives slots; gpu_memory_utilization subtracts weights."""
    calls = []
    text = SYNTH.replace("pool: {slots: 131072}", "pool: {kv_memory: 16GiB}")
    text += "model: meta-llama/Meta-Llama-3-8B\nkv_dtype: bf16\ntp: 2\ngpu: H100-80GB\n"
    w = load_workload(write(tmp_path, text), resolve_model=fake_resolver(calls))
    assert calls == [("meta-llama/Meta-Llama-3-8B", "bf16", 2, "H100-80GB")]
    assert w.pool.slots == 131072 and w.pool.bytes_per_slot == 131072
    assert w.scheduler.max_model_len == 8192  # the layout's max_context
    assert w.timing.gpu_name == "H100-80GB" and w.timing.kv_bytes_per_token == 131072
    assert w.timing.peak_flops == 989e12 and w.timing.weight_bytes == 16 * 10**9
    util = text.replace("kv_memory: 16GiB", "gpu_memory_utilization: 0.9, engine: none")
    w = load_workload(write(tmp_path, util), resolve_model=fake_resolver())
    assert w.pool.kv_bytes == int(0.9 * 80 * 2**30) - 16 * 10**9  # the bare bound, asked for
    with pytest.raises(WorkloadError, match="engine: none"):  # vLLM's pool needs the model's config
        load_workload(write(tmp_path, util.replace(", engine: none", "")), resolve_model=fake_resolver())
    too_small = text.replace("kv_memory: 16GiB", "gpu_memory_utilization: 0.1, engine: none")
    with pytest.raises(WorkloadError, match="do not fit"):
        load_workload(write(tmp_path, too_small), resolve_model=fake_resolver())
    too_long = text + "scheduler: {max_model_len: 9000}\n"
    with pytest.raises(WorkloadError, match="context of 8192"):
        load_workload(write(tmp_path, too_long), resolve_model=fake_resolver())


def test_resolver_errors_are_located(tmp_path):
    """A resolver failure (unknown model) points at the `model:` line of the workload."""

    def resolve(*args):
        raise KvplanError("no such model 'lama'")

    path = write(tmp_path, SYNTH + "model: lama\n")
    with pytest.raises(KvplanError) as err:
        load_workload(path, resolve_model=resolve)
    assert (err.value.line, err.value.field, err.value.file) == (6, "model", str(path))


def test_defaults_allocators_swap_and_sections(tmp_path):
    """Defaults: serve, paged B16, stem as name; block_size lists expand; reserved keys stored raw."""
    w = load_workload(write(tmp_path, SYNTH, "named.yaml"))
    assert (w.name, w.experiment, [a.label for a in w.allocators]) == ("named", "serve", ["paged-B16"])
    text = SYNTH + (
        "allocators:\n  - {kind: contiguous, policy: pow2}\n  - {kind: paged, block_size: [8, 32]}\n"
        "scheduler: {preemption: swap, swap_slots: 1000, chunked_prefill: true, max_model_len: 4096}\n"
        "prefix: {turns: 3, sessions: 2}\nsampling: {mode: beam, widths: [2, 8]}\n"
    )
    w = load_workload(write(tmp_path, text), resolve_model=None)
    assert [a.label for a in w.allocators] == ["contiguous-pow2", "paged-B8", "paged-B32"]
    assert w.allocators[0].max_len == 4096 and w.scheduler.swap_slots == 1000
    assert w.scheduler.max_num_batched_tokens == 8192 and w.scheduler.chunked_prefill
    shared = w.prefix.shared  # typed sections, a conversation no longer than max_model_len
    assert (shared.turns, shared.sessions, shared.max_prompt_len) == (3, 2, 4096)
    assert (w.sampling.mode, w.sampling.widths, w.sampling.parent) == ("beam", (2, 8), "random")
    with pytest.raises(WorkloadError) as err:  # a key no experiment reads is refused where it stands
        load_workload(write(tmp_path, text.replace("turns: 3", "enabled: true"), "bad.yaml"))
    assert (err.value.field, err.value.line) == ("prefix.enabled", 10)
    w = load_workload(write(tmp_path, SYNTH + "scheduler: {preemption: swap}\nmodel: m\n"),
                      resolve_model=fake_resolver())  # fmt: skip
    assert w.scheduler.swap_slots == 4 * 2**30 // 131072


def _shared_trace(rel: str) -> Path:
    root = os.environ.get("KVPLAN_SHARED")
    base = Path(root) if root else Path(__file__).resolve().parents[2] / "shared"
    path = base / "traces" / rel
    if not path.exists():
        pytest.skip(f"{path} not present")
    return path


def test_trace_workload_relative_path_and_options(tmp_path):
    """A trace path is relative to the workload file; limit, repeat and max_model_len apply."""
    trace = _shared_trace("azure-llm-2023/AzureLLMInferenceTrace_conv.csv")
    rel = os.path.relpath(trace, tmp_path)
    text = ("pool: {slots: 100000}\nscheduler: {max_model_len: 16384}\n"
            f"requests:\n  trace: {{format: azure, path: {rel}, repeat: 2, limit: 10000}}\n")  # fmt: skip
    w = load_workload(write(tmp_path, text))
    arrival, prompt, _ = requests_of(w)
    assert w.num_requests == len(prompt) == 10000 and (np.diff(arrival) >= 0).all()
    with pytest.raises(WorkloadError, match="own timestamps") as err:
        load_workload(write(tmp_path, text + "  arrival: {process: poisson, rate: 1}\n"))
    assert err.value.line == 5
    with pytest.raises(TraceError, match="max_model_len 8192"):
        load_workload(write(tmp_path, text.replace("16384", "8192")))
    missing = text.replace(rel, "nowhere.csv")
    with pytest.raises(WorkloadError, match="no such file") as err:
        load_workload(write(tmp_path, missing))
    assert err.value.line == 4 and err.value.field == "requests.trace.path"


def test_sharegpt_and_agentic_take_the_arrival_process(tmp_path):
    """Untimed sharegpt requests get Poisson arrivals from the seed; agentic sessions start on it."""
    (tmp_path / "s.json").write_text(
        '[{"conversations": [{"from": "human", "tokens": 5}, {"from": "gpt", "tokens": 6}]}]')
    text = ("seed: 3\npool: {slots: 1000}\nrequests:\n  trace: {format: sharegpt, path: s.json, repeat: 4}\n"
            "  arrival: {process: poisson, rate: 2}\n")  # fmt: skip
    arrival, prompt, _ = requests_of(load_workload(write(tmp_path, text)))
    times, _ = __import__("kvplan.workload.distributions", fromlist=["Poisson"]).Poisson(2).times(
        np.random.default_rng(3), 4, 0.0)
    assert np.allclose(arrival, times) and prompt.tolist() == [5] * 4
    folder = _shared_trace("kv-cache-tester-agentic")
    text = (f"seed: 1\npool: {{slots: 10}}\nscheduler: {{max_model_len: 200000}}\nrequests:\n"
            f"  trace: {{format: agentic, path: {folder}}}\n  arrival: {{process: poisson, rate: 0.01}}\n")
    w = load_workload(write(tmp_path, text))
    arrival, _, _ = requests_of(w)
    assert w.num_requests == 420 and (np.diff(arrival) >= 0).all() and arrival[0] == 0
