"""Typed workload records: validated on construction, read from YAML (located by line), written
back by spec_yaml, built into the same Workload whichever way they were made; one router
registry; fleet/ and plan/ use the engine's API, never the kernel."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest

from kvplan.errors import KvplanError, UsageError, WorkloadError
from kvplan.workload.distributions import AllAtOnce, Fixed, Lengths, Poisson, Uniform
from kvplan.workload.spec import AllocatorSpec
from kvplan.workload.routing import ROUTER_NAMES, ROUTERS, RouterSpec
from kvplan.workload.schema import load_workload, read_spec
from kvplan.workload.spec import (
    FleetSpec, GroupSpec, PoolRequest, SchedulerSpec, SyntheticRequests, TimingSpec, TraceRequests, Transfer,
    WorkloadSpec,
)  # fmt: skip
from kvplan.workload.spec_yaml import spec_yaml

REPO = Path(__file__).resolve().parents[1]
ONE = SyntheticRequests(10, Lengths(Fixed(100), 1), Lengths(Fixed(10), 0))


def refused(make, field: str, words: str) -> None:
    with pytest.raises(WorkloadError) as err:
        make()
    assert err.value.field == field and words in err.value.message, (err.value.field, err.value.message)


@pytest.mark.parametrize("make, field, words", [
    (lambda: PoolRequest(), None, "exactly one of"),
    (lambda: PoolRequest(slots=10, kv_memory=10), "kv_memory", "give only one of"),
    (lambda: PoolRequest(slots=0), "slots", ">= 1"),
    (lambda: PoolRequest(gpu_memory_utilization=1.5), "gpu_memory_utilization", "<= 1"),
    (lambda: PoolRequest(slots=True), "slots", "an integer"),
    (lambda: SchedulerSpec(max_num_seqs=0), "max_num_seqs", ">= 1"),
    (lambda: SchedulerSpec(preemption="drop"), "preemption", "recompute, swap"),
    (lambda: SchedulerSpec(swap_space=1, swap_slots=1), "swap_slots", "only one of"),
    (lambda: SchedulerSpec(chunked_prefill="yes"), "chunked_prefill", "true or false"),
    (lambda: TimingSpec(bandwidth_efficiency=0.001), "bandwidth_efficiency", ">= 0.01"),
    (lambda: TimingSpec(step_overhead_ms=float("nan")), "step_overhead_ms", "a number"),
    (lambda: TimingSpec(model="roofline", profile=Path("p.yaml")), "profile", "model: physical"),
    (lambda: SyntheticRequests(0, ONE.prompt, ONE.output), "count", ">= 1"),
    (lambda: SyntheticRequests(60_000_000, ONE.prompt, ONE.output), "count", "above the limit"),
    (lambda: TraceRequests("azure", Path("x.csv"), arrival=AllAtOnce()), "arrival", "own timestamps"),
    (lambda: TraceRequests("sharegpt", Path("x.json"), time_scale=2.0), "trace.time_scale", "no timestamps"),
    (lambda: TraceRequests("csv-of-mine", Path("x.csv")), "trace.format", "expected one of"),
    (lambda: AllocatorSpec("paged", block_size=0), "block_size", ">= 1"),
    (lambda: AllocatorSpec("contiguous", policy="best"), "policy", "max, pow2, oracle"),
    (lambda: AllocatorSpec("slab"), "kind", "contiguous, paged"),
    (lambda: RouterSpec("fastest"), "policy", "round_robin"),
    (lambda: RouterSpec(sync_interval_s=0), "sync_interval_s", "> 0"),
    (lambda: Transfer(-1.0), "gb_per_s", ">= 0"),
    (lambda: GroupSpec("g", count=0), "count", ">= 1"),
    (lambda: GroupSpec("g", role="cache"), "role", "both, prefill, decode"),
    (lambda: FleetSpec(()), "replicas", "at least one replica group"),
    (lambda: FleetSpec((GroupSpec("a", 200), GroupSpec("b", 100))), "replicas[1]", "more than 256"),
    (lambda: FleetSpec((GroupSpec("p", role="prefill"), GroupSpec("d", role="decode"))), "replicas", "transfer"),
    (lambda: FleetSpec((GroupSpec("p", role="prefill"), GroupSpec("b"))), "replicas", "prefill and decode"),
    (lambda: WorkloadSpec("w", PoolRequest(slots=10), ONE, gpu="H100-80GB"), "gpu", "needs a model"),
    (lambda: WorkloadSpec("w", PoolRequest(slots=10), ONE, tp=0), "tp", ">= 1"),
    (lambda: WorkloadSpec("w", PoolRequest(slots=10), ONE, kv_dtype="fp7"), "kv_dtype", "expected one of"),
    (lambda: WorkloadSpec("w", PoolRequest(slots=10), ONE, experiment="fleet"), "replicas", "needs `replicas:`"),
    (lambda: WorkloadSpec("w", PoolRequest(slots=10), ONE, allocators=()), "allocators", "at least one"),
])  # fmt: skip
def test_records_refuse_bad_values_naming_the_field(make, field, words):
    refused(make, field, words)


def write(tmp_path: Path, text: str, name: str = "w.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


SERVE = """\
name: s
seed: 3
pool: {slots: 4096}
requests:
  count: 50
  prompt: {dist: uniform, low: 10, high: 100}
  output: {dist: fixed, value: 20}
  arrival: {process: poisson, rate: 4.0}
allocators:
  - {kind: contiguous, policy: pow2}
  - {kind: paged, block_size: [8, 16]}
scheduler: {max_num_seqs: 8, max_num_batched_tokens: 512, max_model_len: 2048, preemption: swap, swap_slots: 64}
"""


def test_the_yaml_reader_and_code_make_the_same_records(tmp_path):
    made = WorkloadSpec(
        "s", PoolRequest(slots=4096),
        SyntheticRequests(50, Lengths(Uniform(10, 100), 1), Lengths(Fixed(20), 0), Poisson(4.0)), seed=3,
        allocators=(AllocatorSpec("contiguous", policy="pow2"),
                    AllocatorSpec("paged", block_size=8), AllocatorSpec("paged", block_size=16)),
        scheduler=SchedulerSpec(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=2048, preemption="swap",
                                swap_slots=64))
    path = write(tmp_path, SERVE)
    read = read_spec(path)
    assert read == replace(made, path=str(path))
    a, b = load_workload(path), load_workload(path)
    assert a.scheduler == b.scheduler and a.allocators[0].max_len == 2048  # contiguous max_len: max_model_len
    # what spec_yaml writes reads back to the same records
    again = read_spec(write(tmp_path, spec_yaml(read), "again.yaml"))
    assert again == replace(read, path=str(tmp_path / "again.yaml"))


def test_refusals_of_the_records_are_located_at_their_line(tmp_path):
    text = SERVE.replace("scheduler: {max_num_seqs: 8, max_num_batched_tokens: 512, max_model_len: 2048, "
                         "preemption: swap, swap_slots: 64}", "scheduler:\n  swap_space: 1GiB\n  swap_slots: 4")
    with pytest.raises(WorkloadError) as err:
        load_workload(write(tmp_path, text))
    assert (err.value.field, err.value.line) == ("scheduler.swap_slots", 14), str(err.value)
    # a refusal of the builder (it needs the model) lands on the key's line too
    text = SERVE.replace("pool: {slots: 4096}", "pool:\n  kv_memory: 1GiB")
    with pytest.raises(WorkloadError) as err:
        load_workload(write(tmp_path, text))
    assert (err.value.field, err.value.line) == ("pool.kv_memory", 4) and "needs a model" in err.value.message


def test_a_group_of_a_fleet_is_the_fleet_spec_with_its_own_keys(tmp_path):
    from kvplan.experiments import load
    from kvplan.fleet.run import read_groups

    text = """\
experiment: fleet
model: meta-llama/Llama-3.1-8B-Instruct
gpu: H100-80GB
pool: {gpu_memory_utilization: 0.9}
requests: {count: 20, prompt: {dist: fixed, value: 100}, output: {dist: fixed, value: 10}}
scheduler: {max_num_seqs: 64}
replicas:
  - {name: a, count: 2}
  - {name: b, gpu: L40S, scheduler: {max_num_seqs: 16}}
router: {policy: least_kv, sync_interval_s: 0.5}
"""
    wl = load(write(tmp_path, text))
    assert wl.spec.fleet.router == RouterSpec("least_kv", 0.5) and [g.count for g in wl.spec.fleet.groups] == [2, 1]
    a, b = read_groups(wl)
    assert a.workload.scheduler.max_num_seqs == 64 and a.workload.timing.gpu_name == "H100-80GB"
    assert b.workload.scheduler.max_num_seqs == 16 and b.workload.timing.gpu_name == "L40S"
    assert b.workload.pool.slots < a.workload.pool.slots  # 0.9 of an L40S's 48 GB, not of an H100's 80
    bad = text.replace("gpu: L40S,", "gpu: L40S, tp: 3,")
    with pytest.raises(KvplanError) as err:
        read_groups(load(write(tmp_path, bad, "bad.yaml")))
    assert err.value.field.startswith("replicas[1].") and err.value.line == 9, str(err.value)


def test_flag_runs_are_specs_and_name_their_flags():
    from kvplan.experiments import build_flags, flag_workload

    spec = flag_workload("meta-llama/Llama-3.1-8B-Instruct", "L40S", 1, 2.0, "500", "50", 100)
    assert spec.requests == SyntheticRequests(100, Lengths(Fixed(500), 1), Lengths(Fixed(50), 0), Poisson(2.0))
    assert spec.scheduler.max_model_len == 550 and spec.pool.kv_memory > 0
    wl = build_flags(spec)
    assert wl.num_requests == 100 and wl.scheduler.max_model_len == 550 and wl.path == "(the flags)"
    with pytest.raises(UsageError) as err:
        build_flags(replace(spec, scheduler=replace(spec.scheduler, max_model_len=10**6)))
    assert err.value.field == "--prompt" and "above the model's context" in err.value.message
    with pytest.raises(UsageError) as err:
        flag_workload("meta-llama/Llama-3.1-8B-Instruct", "L40S", 1, 2.0, "500", "50", 100, max_num_seqs=-4)
    assert err.value.field == "--max-num-seqs"


def test_one_router_registry(run_cli, monkeypatch):
    from kvplan.fleet.routers import IMPLEMENTATIONS
    from kvplan.workload.json_schema import workload_schema

    assert tuple(IMPLEMENTATIONS) == ROUTER_NAMES == tuple(ROUTERS)
    names = workload_schema()["properties"]["router"]["anyOf"][0]["enum"]
    assert tuple(names) == ROUTER_NAMES
    schema_md = (REPO / "workloads" / "SCHEMA.md").read_text(encoding="utf-8")
    row = next(line for line in schema_md.splitlines() if line.startswith("| `router` / `router.policy`"))
    assert [n for n in ROUTER_NAMES if f"`{n}`" in row] == list(ROUTER_NAMES)
    table = [line for line in schema_md.splitlines() if line.startswith("| `") and line.split("`")[1] in ROUTERS
             and line.count("|") == 3]
    assert table == [f"| `{name}` | {words} |" for name, words in ROUTERS.items()]
    monkeypatch.setenv("COLUMNS", "400")
    _, out, _ = run_cli("plan", "--help")
    assert ", ".join(ROUTER_NAMES) in " ".join(out.replace("│", " ").split())


def test_schema_md_states_the_timing_defaults_the_code_has():
    import re

    from kvplan.model.step_time import StepConstants

    c = StepConstants()
    text = (REPO / "workloads" / "SCHEMA.md").read_text(encoding="utf-8")
    fitted = {key: float(re.search(rf"\| `{key}` \|[^|]*fitted \(([\d.]+)\)", text).group(1))
              for key in ("bandwidth_efficiency", "flops_efficiency", "step_overhead_ms")}
    assert fitted == {"bandwidth_efficiency": c.bandwidth_efficiency, "flops_efficiency": c.gemm_efficiency,
                      "step_overhead_ms": round(c.step_overhead_s * 1000, 6)}
    intake = float(re.search(r"one at a time \(([\d.]+) ms each", text).group(1))
    assert intake == round(c.frontend_request_s * 1000, 6)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


@pytest.mark.parametrize("room", ["fleet", "plan"])
def test_fleet_and_plan_use_the_engine_api_not_the_kernel(room):
    for path in sorted((REPO / "kvplan" / room).glob("*.py")):
        assert "kvplan.sim.kernel" not in _imports(path), f"{path.name} imports the kernel"


def test_only_the_yaml_reader_reads_workload_files():
    """Nothing writes a workload as YAML text to read it back: the records are made in code, and a
    workload file is read in one place (kvplan.experiments.load, through the YAML reader)."""
    readers = set()
    for path in sorted((REPO / "kvplan").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert "load_text(" not in text, path
        if "load_workload(" in text:
            readers.add(path.relative_to(REPO).as_posix())
    assert readers == {"kvplan/workload/schema.py", "kvplan/experiments.py"}


def test_the_workload_a_flag_run_shows_runs_the_same(run_cli, tmp_path):
    """--show-workload prints the workload the flags made; run as a file, it gives the same results."""
    import json

    code, out, err = run_cli("simulate", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "L40S", "--rate",
                             "6", "--prompt", "800", "--output", "64", "--count", "200", "--json", "--show-workload")
    assert code == 0
    path = write(tmp_path, err)
    code, again, _ = run_cli("simulate", str(path), "--json")
    assert code == 0 and json.loads(again)["results"] == json.loads(out)["results"]


@pytest.mark.parametrize("model, tp, seqs", [("meta-llama/Llama-3.1-8B-Instruct", 1, 128),
                                             ("google/gemma-3-12b-it", 1, None),
                                             ("Qwen/Qwen3-32B", 2, 64)])
def test_a_files_gpu_memory_utilization_is_vllms_start_up_pool(tmp_path, model, tp, seqs):
    """`pool: {gpu_memory_utilization: u}` means what it means to vLLM: the pool it allocates at
    start-up with the file's scheduler (kvplan size's usable blocks at the same settings); with
    `engine: none` the bare bound u x memory - weights."""
    from kvplan.experiments import load
    from kvplan.model.size import size
    from kvplan.sim.inputs import make_setup

    sched = f"scheduler: {{max_model_len: 4096{f', max_num_seqs: {seqs}' if seqs else ''}}}\n"
    text = (f"model: {model}\ngpu: H100-80GB\ntp: {tp}\npool: {{gpu_memory_utilization: 0.9}}\n" + sched
            + "requests: {count: 10, prompt: {dist: fixed, value: 100}, output: {dist: fixed, value: 10}}\n")
    wl = load(write(tmp_path, text))
    report = size(model, gpu="H100-80GB", tp=tp, tokens=4096, gpu_memory_utilization=0.9, max_num_seqs=seqs,
                  explore=False).report
    setup = make_setup(wl, wl.allocators[0])
    assert wl.pool.kv_bytes // wl.pool.bytes_per_slot == report.kv_pool_bytes // wl.pool.bytes_per_slot
    assert setup.num_blocks == (report.usable_blocks if report.vllm_num_blocks is None else report.vllm_num_blocks - 1)
    bare = load(write(tmp_path, text.replace("0.9}", "0.9, engine: none}"), "bare.yaml"))
    from kvplan.model.gpus import get_gpu

    assert bare.pool.kv_bytes == int(0.9 * get_gpu("H100-80GB").memory_bytes) - report.weight_bytes
    assert bare.pool.kv_bytes > wl.pool.kv_bytes  # the activation peak, non-torch memory, CUDA graphs


def test_a_spec_read_from_a_file_pickles_and_writes_back(tmp_path):
    """Specs travel to worker processes; spec_yaml keeps what changes the workload (the pool's
    engine) and quotes a name YAML would misread."""
    import pickle

    text = SERVE.replace("name: s", 'name: "a: b #c"').replace("pool: {slots: 4096}",
                                                              "pool: {gpu_memory_utilization: 0.9, engine: none}")
    spec = read_spec(write(tmp_path, text))
    again = pickle.loads(pickle.dumps(spec))
    assert again == spec and again.locate("scheduler.max_num_seqs") == spec.locate("scheduler.max_num_seqs") == 12
    back = read_spec(write(tmp_path, spec_yaml(spec), "back.yaml"))
    assert back == replace(spec, path=str(tmp_path / "back.yaml")) and back.pool.engine == "none"
