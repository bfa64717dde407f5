"""SGLang's start-up pool in a workload file (`pool: {mem_fraction_static: F | default}`, engine:
sglang; kvplan/workload/build.py _sglang_startup): the pool, max_running_requests and
chunked_prefill_size are `kvplan size --engine sglang`'s, the flags of `sglang:` enter the
start-up as SGLang's do, the spec reads back from --show-workload's YAML, and the schema knows it."""

from __future__ import annotations

import json

import pytest

from kvplan.experiments import load
from kvplan.model.sglang_size import sglang_size

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _file(tmp_path, pool: str, gpu: str = "H100-80GB", extra: str = "") -> str:
    path = tmp_path / "w.yaml"
    path.write_text(f"name: w\nmodel: {MODEL}\ngpu: {gpu}\nengine: sglang\npool: {pool}\n"
                    "requests: {count: 20, prompt: {dist: fixed, value: 500}, output: {dist: fixed, value: 20}}\n"
                    + extra)
    return str(path)


@pytest.mark.parametrize("gpu", ["H100-80GB", "L40S"])
def test_the_default_fraction_gives_the_pool_kvplan_size_prints(tmp_path, gpu):
    """Breaks if the workload's pool, max_running_requests or chunked_prefill_size differ from what
    `kvplan size MODEL --gpu GPU --engine sglang` prints (max_total_num_tokens and the two limits)."""
    wl = load(_file(tmp_path, "{mem_fraction_static: default}", gpu))
    m = sglang_size(MODEL, gpu=gpu).memory
    assert wl.pool.slots == m.max_total_num_tokens
    assert wl.pool.bytes_per_slot == m.cell_size  # 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 131,072
    assert wl.pool.bytes_per_slot == 32 * 8 * 128 * 2 * 2
    assert (wl.sglang.max_running_requests, wl.sglang.chunked_prefill_size) == (m.max_running_requests,
                                                                               m.chunked_prefill_size)
    # SGLang's chunk by the GPU's memory (0.5.3 rule, sglang_memory.batch_defaults): an H100's 81,559 MiB
    # is in [60, 160) GiB -> 8192; an L40S's 46,068 MiB in [35, 60) GiB -> 4096. vLLM's fixed 8192 is gone.
    assert wl.sglang.chunked_prefill_size == {"H100-80GB": 8192, "L40S": 4096}[gpu]


def test_a_given_fraction_and_flags_enter_the_startup(tmp_path):
    """Breaks if a fraction, a chunked_prefill_size (which moves SGLang's default fraction) or a
    max_running_requests (capped at the request pool's rows, as SGLang caps it) is not taken as
    `kvplan size --engine sglang --mem-fraction-static/--chunked-prefill-size/--max-running-requests` takes it."""
    wl = load(_file(tmp_path, "{mem_fraction_static: 0.8}", "L40S"))
    m = sglang_size(MODEL, gpu="L40S", mem_fraction_static=0.8).memory
    assert (wl.pool.slots, wl.sglang.max_running_requests) == (m.max_total_num_tokens, m.max_running_requests)
    wl = load(_file(tmp_path, "{mem_fraction_static: default}", "H100-80GB",
                    "sglang: {chunked_prefill_size: 16384, max_running_requests: 100000}\n"))
    m = sglang_size(MODEL, gpu="H100-80GB", chunked_prefill_size=16384, max_running_requests=100000).memory
    plain = sglang_size(MODEL, gpu="H100-80GB").memory
    assert wl.pool.slots == m.max_total_num_tokens < plain.max_total_num_tokens  # a larger chunk reserves more
    assert wl.sglang.chunked_prefill_size == 16384
    # given 100,000 running requests, SGLang runs at most its request pool's rows: min(max(int(tokens /
    # 131,072 x 512), 2048), 4096), 2048 for this pool of under 524,288 tokens
    assert m.max_total_num_tokens < 524_288 and wl.sglang.max_running_requests == 2048


def test_a_pool_of_slots_keeps_its_defaults(tmp_path):
    """Breaks if a pool given in slots (no start-up known) stops taking 8192 and the scheduler's
    max_num_seqs as before."""
    wl = load(_file(tmp_path, "{slots: 300000}", "L40S"))
    assert (wl.pool.slots, wl.sglang.chunked_prefill_size) == (300000, 8192)
    assert wl.sglang.max_running_requests == wl.scheduler.max_num_seqs


@pytest.mark.parametrize("fraction", ["default", 0.85])
def test_show_workload_round_trip(tmp_path, fraction):
    """Breaks if --show-workload's YAML of a spec with mem_fraction_static does not read back to it."""
    from kvplan.workload.schema import read_spec
    from kvplan.workload.spec_yaml import spec_yaml

    spec = read_spec(_file(tmp_path, f"{{mem_fraction_static: {fraction}}}"))
    path = tmp_path / "back.yaml"
    path.write_text(spec_yaml(spec))
    back = read_spec(path)
    assert back.pool == spec.pool and back.pool.mem_fraction_static == fraction


def test_the_json_schema_knows_the_key():
    """Breaks if the editor's schema refuses mem_fraction_static: default / a number, or takes another word."""
    jsonschema = pytest.importorskip("jsonschema")
    from kvplan.workload.json_schema import workload_schema

    validator = jsonschema.Draft202012Validator(json.loads(json.dumps(workload_schema())))
    base = {"model": MODEL, "gpu": "H100-80GB", "engine": "sglang",
            "requests": {"count": 1, "prompt": {"dist": "fixed", "value": 1}, "output": {"dist": "fixed", "value": 1}}}
    for pool, ok in (({"mem_fraction_static": "default"}, True), ({"mem_fraction_static": 0.9}, True),
                     ({"mem_fraction_static": "auto"}, False), ({"mem_fraction_static": 1.5}, False)):
        assert validator.is_valid({**base, "pool": pool}) is ok, pool
