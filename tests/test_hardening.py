"""Hostile files, numbers at the edges, and outputs that never destroy anything (issue 16).

The bad-input corpus (tests/bad_inputs/) checks the one-line errors; these tests check what the
corpus cannot: that inputs survive a run that names them as outputs, file modes, signals, late
failures, streamed traces equal to the in-memory reading, bounded memory, and a property test
of valid workloads at the edges of every bound.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import tempfile
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.errors import KvplanError, WorkloadError

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "bad_inputs"
SERVE = """experiment: serve
pool: {slots: 100000}
requests:
  count: 50
  prompt: {dist: fixed, value: 10}
  output: {dist: fixed, value: 5}
  arrival: {process: poisson, rate: 2.0}
"""
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


@pytest.fixture
def cli(run_cli, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("KVPLAN_DEBUG", raising=False)
    return run_cli


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def azure_rows(n: int, prompt: int = 10, output: int = 10) -> str:
    assert n <= 200_000  # ten rows a second from 18:00 to 23:33
    rows = [f"2023-11-16 {18 + i // 36_000:02d}:{i // 600 % 60:02d}:{i // 10 % 60:02d}.{i % 10}000000,"
            f"{prompt + i % 7},{output}\n" for i in range(n)]
    return AZURE_HEADER + "".join(rows)


# ---- outputs that never destroy anything --------------------------------------------------------


def test_an_output_naming_the_workload_is_refused_and_the_workload_kept(tmp_path, cli):
    workload = write(tmp_path / "w.yaml", SERVE)
    code, out, err = cli("simulate", str(workload), "--csv", str(workload))
    assert code == 2 and "is an input of this run" in err and "--csv" in err
    assert workload.read_text(encoding="utf-8") == SERVE


def test_an_output_naming_a_trace_the_workload_reads_is_refused(tmp_path, cli):
    trace = write(tmp_path / "t.csv", azure_rows(20))
    workload = write(tmp_path / "w.yaml", f"experiment: serve\npool: {{slots: 100000}}\n"
                                          f"requests:\n  trace: {{format: azure, path: {trace}}}\n")
    code, _, err = cli("simulate", str(workload), "--csv", str(trace))
    assert code == 2 and "is an input of this run" in err
    assert trace.read_text(encoding="utf-8") == azure_rows(20)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv", "w.yaml"]  # no temporary left


@pytest.mark.parametrize("option", ["--markdown", "--update-baseline"])
def test_check_outputs_never_replace_the_check_file_or_its_workloads(tmp_path, cli, option):
    workload = write(tmp_path / "w.yaml", (CORPUS / "checks" / "ok-workload.yaml").read_text(encoding="utf-8"))
    checks = write(tmp_path / "c.yaml", (CORPUS / "checks" / "ok.yaml").read_text(encoding="utf-8")
                   .replace("ok-workload.yaml", "w.yaml"))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    for target in (checks, workload):
        args = ["--markdown", str(target)] if option == "--markdown" else ["--baseline", str(target), option]
        code, _, err = cli("check", str(checks), *args)
        assert code == 2 and "is an input of this run" in err, err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_fifo_stays_a_fifo(tmp_path, cli):
    fifo = tmp_path / "rows.csv"
    os.mkfifo(fifo)
    code, _, err = cli("simulate", str(write(tmp_path / "w.yaml", SERVE)), "--csv", str(fifo))
    assert code == 2 and "not a regular file" in err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_new_outputs_follow_the_umask(tmp_path, cli, umask, mode):
    old = os.umask(umask)
    try:
        code, _, err = cli("simulate", str(write(tmp_path / "w.yaml", SERVE)), "--csv", str(tmp_path / "r.csv"))
    finally:
        os.umask(old)
    assert code == 0, err
    assert stat.S_IMODE(os.stat(tmp_path / "r.csv").st_mode) == mode


def test_a_replaced_output_keeps_its_mode(tmp_path, cli):
    rows = write(tmp_path / "r.csv", "old\n")
    os.chmod(rows, 0o640)
    code, _, err = cli("simulate", str(write(tmp_path / "w.yaml", SERVE)), "--csv", str(rows))
    assert code == 0, err
    assert stat.S_IMODE(os.stat(rows).st_mode) == 0o640 and rows.read_text().startswith("allocator,")


def test_a_run_that_fails_late_writes_no_output_at_all(tmp_path, cli, monkeypatch):
    """--csv is written, then --plot fails: neither file (nor a temporary) is left."""
    import kvplan.cli.serve

    def broken_plot(results, path, workload=""):
        raise KvplanError("the chart could not be drawn", field="--plot")

    monkeypatch.setattr(kvplan.cli.serve, "plot_serve", broken_plot)
    workload = write(tmp_path / "w.yaml", SERVE)
    code, _, err = cli("simulate", str(workload), "--csv", str(tmp_path / "r.csv"), "--plot", str(tmp_path / "p.png"))
    assert code == 2 and "could not be drawn" in err
    assert [p.name for p in tmp_path.iterdir()] == ["w.yaml"]


def test_sigterm_while_writing_leaves_no_temporary_file(tmp_path, cli, monkeypatch):
    import kvplan.cli.serve

    real = kvplan.cli.serve.write_requests_csv

    def interrupted(results, path):
        real(results, path)  # the temporary file now holds the rows
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(kvplan.cli.serve, "write_requests_csv", interrupted)
    code, _, err = cli("simulate", str(write(tmp_path / "w.yaml", SERVE)), "--csv", str(tmp_path / "r.csv"))
    assert code == 128 + signal.SIGTERM and "stopped by SIGTERM" in err
    assert [p.name for p in tmp_path.iterdir()] == ["w.yaml"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is put back


def test_plot_without_matplotlib_is_refused_before_any_work(tmp_path, cli, monkeypatch):
    import importlib.util

    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else find(name, *a))
    code, _, err = cli("simulate", str(write(tmp_path / "w.yaml", SERVE)), "--csv", str(tmp_path / "r.csv"),
                       "--plot", str(tmp_path / "p.png"))
    assert code == 2 and "needs matplotlib" in err
    assert [p.name for p in tmp_path.iterdir()] == ["w.yaml"]


def test_json_into_a_full_disk_is_one_line():
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "kvplan", "size", "facebook/opt-13b", "--json"],
                              stdout=full, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr == "kvplan: error: cannot write the output: No space left on device\n"


def test_error_lines_are_cut_and_printable():
    from kvplan.errors import MAX_MESSAGE

    message = str(WorkloadError("bad value " + "x\x00\x1b" * 100_000, file="w.yaml", field="a"))
    assert len(message) < MAX_MESSAGE + 200 and message.isprintable()
    assert message.startswith("w.yaml: a: bad value") and "characters cut" in message


# ---- files read one way ---------------------------------------------------------------------------


def test_gzip_and_byte_order_mark_traces_read_like_plain_ones(tmp_path):
    import gzip

    from kvplan.workload.traces import read_trace

    text = azure_rows(300)
    plain = write(tmp_path / "t.csv", text)
    bom = write(tmp_path / "bom.csv", "\ufeff" + text)
    packed = tmp_path / "t.csv.gz"
    packed.write_bytes(gzip.compress(text.encode()))

    def columns(path):
        chunks = list(read_trace("azure", path))
        return [np.concatenate([getattr(c, k) for c in chunks]).tolist() for k in ("arrival", "prompt_len", "output_len")]

    assert columns(bom) == columns(plain) == columns(packed)


def test_streamed_csv_equals_the_in_memory_reading(tmp_path, monkeypatch):
    """Above KEEP_ROWS a CSV trace is read again per chunk; the requests are the same."""
    from kvplan.workload import traces

    path = write(tmp_path / "t.csv", azure_rows(2_500, prompt=3_000, output=6_000))
    options = dict(repeat=3, limit=6_000, time_scale=0.5, max_model_len=8_192, too_long="clip", chunk_size=512)

    def read():
        trace = traces.open_trace("azure", path, **options)
        chunks = list(trace.chunks())
        cols = [np.concatenate([getattr(c, k) for c in chunks]) for k in ("arrival", "prompt_len", "output_len")]
        cut = np.concatenate([c.cut for c in chunks])
        return trace.num_requests, [c.tolist() for c in cols], cut.tolist()

    kept = read()
    monkeypatch.setattr(traces, "KEEP_ROWS", 100)
    assert read() == kept and kept[0] == 6_000 and any(kept[2])


def test_limit_stops_reading_the_trace(tmp_path):
    """Rows after `limit` are never read: a bad row there is no error."""
    from kvplan.workload.traces import open_trace

    path = write(tmp_path / "t.csv", azure_rows(5) + "not,a,row\n")
    assert open_trace("azure", path, limit=5).num_requests == 5
    with pytest.raises(KvplanError, match="expected a date-time"):
        open_trace("azure", path)


def test_streaming_a_long_csv_keeps_memory_bounded(tmp_path, monkeypatch):
    """The peak memory of reading a trace does not grow with its length once it is streamed."""
    from kvplan.workload import traces

    monkeypatch.setattr(traces, "KEEP_ROWS", 1_000)

    def peak(rows: int) -> int:
        path = write(tmp_path / f"t{rows}.csv", azure_rows(rows))
        tracemalloc.start()
        for chunk in traces.open_trace("azure", path, chunk_size=4_096).chunks():
            assert len(chunk) <= 4_096
        top = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return top

    small, large = peak(20_000), peak(200_000)
    assert large < 1.5 * small + (1 << 20), (small, large)


def test_reader_cut_requests_are_counted_as_clipped(tmp_path):
    """A trace row whose output the reader cuts at max_model_len counts once in `clipped`."""
    from kvplan.experiments import load
    from kvplan.sim.engine import simulate

    trace = write(tmp_path / "t.csv", AZURE_HEADER + "2023-11-16 18:15:46.6805900,100,10000\n"
                  "2023-11-16 18:15:47.6805900,10000,10\n2023-11-16 18:15:48.6805900,10,10\n")
    workload = write(tmp_path / "w.yaml", f"experiment: serve\npool: {{slots: 100000}}\nscheduler: {{max_model_len: 2048}}\n"
                                          f"requests:\n  trace: {{format: azure, path: {trace}, too_long: clip}}\n")
    wl = load(workload)
    assert simulate(wl, wl.allocators[0]).clipped == 2


# ---- numbers at the edges -------------------------------------------------------------------------


def test_negative_zero_reads_as_zero(tmp_path, cli):
    code, out, err = cli("simulate", str(write(tmp_path / "w.yaml", SERVE.replace(
        "{dist: fixed, value: 10}", "{dist: lognormal, median: 50, sigma: -0.0, max: 100}"))), "--json")
    assert code == 0, err
    assert '"completed": 50' in out


def test_prefix_numbers_follow_the_yaml_rules(tmp_path, cli):
    base = ("experiment: prefix\npool: {slots: 100000}\nrequests: {count: 40, prompt: {dist: fixed, value: 100}, "
            "output: {dist: fixed, value: 10}}\nallocators: [{kind: paged, block_size: 16}]\n")
    plain = cli("simulate", str(write(tmp_path / "a.yaml", base + "prefix: {system_prompts: 2, system_prompt_len: 64}\n")), "--json")
    spelled = cli("simulate", str(write(tmp_path / "a.yaml", base + "prefix: {system_prompts: 2e0, system_prompt_len: 64.0}\n")), "--json")
    assert plain[0] == spelled[0] == 0 and plain[1] == spelled[1]


def test_a_cache_larger_than_the_stream_equals_one_that_never_evicts(tmp_path, cli):
    base = ("experiment: prefix\npool: {slots: 100000}\nrequests: {count: 200, prompt: {dist: uniform, low: 50, high: 500}, "
            "output: {dist: fixed, value: 10}}\nallocators: [{kind: paged, block_size: 16}]\n"
            "prefix: {system_prompts: 3, system_prompt_len: 64, turns: 3}\n")
    path = write(tmp_path / "p.yaml", base)
    code, huge, err = cli("simulate", str(path), "--cache-blocks", str(2**40), "--json")
    assert code == 0, err
    code, big, _ = cli("simulate", str(path), "--cache-blocks", "1000000", "--json")
    strip = lambda text: [{k: v for k, v in r.items() if k not in ("cache_blocks", "cache_tokens")}  # noqa: E731
                          for r in yaml.safe_load(text)["results"]]
    assert strip(huge) == strip(big) and yaml.safe_load(huge)["results"][0]["cache_blocks"] == 2**40


def test_a_step_longer_than_the_clock_is_an_error():
    from dataclasses import replace

    from kvplan.sim.engine import MAX_EVENT_TICKS, longest_step
    from kvplan.sim.inputs import make_setup
    from kvplan.workload.records import PoolSpec, SchedulerConfig, TimingConfig, Workload
    from kvplan.workload.spec import AllocatorSpec

    timing = TimingConfig(gpu_name="L4", hbm_bytes_per_s=3e11, peak_flops=1.2e14, weight_bytes=10**17,
                          flops_per_token=1e9, kv_bytes_per_token=1, bandwidth_efficiency=0.01)
    wl = Workload("w", "w.yaml", 0, "serve", 1, PoolSpec(100_000, 1), (AllocatorSpec("paged", block_size=16),),
                  SchedulerConfig(), timing, lambda: iter(()))
    setup = make_setup(wl, wl.allocators[0])
    with pytest.raises(WorkloadError, match="more than the simulator's clock holds"):
        longest_step(setup)
    fine = make_setup(replace(wl, timing=replace(timing, weight_bytes=10**9)), wl.allocators[0])
    assert 0 < longest_step(fine) <= MAX_EVENT_TICKS


def test_an_impossible_result_is_an_error_not_output():
    from kvplan.sim.metrics import RawRun, check_possible

    ticks = lambda *v: np.asarray(v, dtype=np.int64)  # noqa: E731
    raw = RawRun(arrival=ticks(0, 5), admitted=ticks(0, 5), first_token=ticks(3, 9), finish=ticks(4, 8),
                 prompt=ticks(1, 1), output=ticks(2, 2), preemptions=ticks(0, 0), clipped=0, steps=3,
                 preemptions_total=0, swap_outs=0, recomputed_tokens=0, peak_running=1, t_origin=0,
                 t_end=9, integrals={}, timeline=np.zeros((0, 8), np.int64), timeline_delta=1)
    with pytest.raises(WorkloadError, match="impossible result for request 1"):
        check_possible(raw)
    raw.first_token[1] = 7
    check_possible(raw)


# ---- a property test at the edges of every bound ---------------------------------------------------

EDGE = {
    "slots": [1, 16, 100_000, 2**40],
    "count": [1, 2, 60],
    "length": [1, 2, 4_095, 4_096],
    "max_model_len": [2, 4_096],
    "max_num_seqs": [1, 3, 2**20],
    "max_num_batched_tokens": [4_096, 2**31],
    "block_size": [1, 16, 2**20],
    "rate": [1e-6, 1.0, 1e9],
    "cv": [1e-3, 1.0, 1e3],
    "efficiency": [0.01, 1.0],
    "overhead_ms": [0, 0.001, 1e6],
}


@st.composite
def extreme_workloads(draw) -> str:
    """A valid serve or capacity workload whose every number sits at (or next to) a bound."""
    pick = lambda key: draw(st.sampled_from(EDGE[key]))  # noqa: E731
    mml = pick("max_model_len")
    doc: dict = {"experiment": draw(st.sampled_from(["serve", "serve", "capacity"])), "seed": draw(st.integers(0, 2**32))}
    if draw(st.booleans()):
        doc.update(model="facebook/opt-13b", gpu=draw(st.sampled_from(["L4", "H100-80GB", "B200"])),
                   pool={"kv_memory": draw(st.sampled_from(["1MiB", "12GiB", "1TiB"]))})
        doc["timing"] = {"bandwidth_efficiency": pick("efficiency"), "flops_efficiency": pick("efficiency"),
                         "step_overhead_ms": pick("overhead_ms")}
        mml = min(mml, 2048)
    else:
        doc["pool"] = {"slots": pick("slots")}
    length = lambda: min(pick("length"), max(1, mml - 1))  # noqa: E731
    arrival = draw(st.sampled_from([{"process": "all_at_once"}, {"process": "poisson", "rate": pick("rate")},
                                    {"process": "gamma", "rate": pick("rate"), "cv": pick("cv")}]))
    doc["requests"] = {"count": pick("count"), "prompt": {"dist": "fixed", "value": length()},
                       "output": {"dist": "fixed", "value": length()}, "arrival": arrival}
    doc["allocators"] = draw(st.sampled_from([[{"kind": "paged", "block_size": pick("block_size")}],
                                              [{"kind": "contiguous", "policy": draw(st.sampled_from(["max", "pow2", "oracle"]))}]]))
    doc["scheduler"] = {"max_model_len": mml, "max_num_seqs": pick("max_num_seqs"),
                        "max_num_batched_tokens": max(pick("max_num_batched_tokens"), mml),
                        "chunked_prefill": draw(st.booleans()), "preemption": draw(st.sampled_from(["recompute", "swap"]))}
    if doc["scheduler"]["preemption"] == "swap":
        doc["scheduler"]["swap_space"] = draw(st.sampled_from(["1MiB", "4GiB"])) if "model" in doc else None
        if doc["scheduler"]["swap_space"] is None:
            doc["scheduler"]["preemption"] = "recompute"
            del doc["scheduler"]["swap_space"]
    return yaml.safe_dump(doc, sort_keys=False)


@given(text=extreme_workloads())
@settings(max_examples=120, derandomize=True)
def test_workloads_at_the_edges_give_a_result_or_one_error(text):
    """A result whose times are possible (E2E >= TTFT >= 0, all finite) or a KvplanError; never
    another exception (the engine's events are bounded, so never a hang)."""
    from kvplan.experiments import document, load

    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        path = write(Path(folder) / "w.yaml", text)
        try:
            doc = document(load(path))
        except KvplanError as exc:
            assert str(exc) and "\n" not in str(exc)
            return
    for result in doc["results"]:
        if doc["experiment"] != "serve":
            assert result["admitted"] >= 0
            continue
        ttft, e2e = result["ttft_s"], result["e2e_s"]
        assert all(np.isfinite(v) for v in (*ttft.values(), *e2e.values())), result
        assert 0 <= ttft["mean"] <= e2e["mean"] + 1e-9 and ttft["p99"] <= e2e["p99"] + 1e-9, result


SIZE_EDGES = {
    "tokens": [1, 2, 8_192, 2**31],
    "tp": [1, 3, 8, 4_096],
    "block_size": [1, 16, 2**20],
    "kv_memory": ["1", "1MiB", "12GiB", "1PiB"],
    "kv_dtype": ["auto", "fp8", "int4", "fp32"],
    "batch": [1, 2**20],
}


@st.composite
def extreme_checks(draw) -> dict:
    """A valid size check whose options sit at their bounds, on a model of every family."""
    spec = {"model": draw(st.sampled_from(["facebook/opt-13b", "deepseek-ai/DeepSeek-V3", "google/gemma-3-27b-it",
                                           "Qwen/Qwen3-Next-80B-A3B-Instruct", "ai21labs/Jamba-v0.1"]))}
    for key, values in SIZE_EDGES.items():
        if draw(st.booleans()):
            spec[key] = draw(st.sampled_from(values))
    if "kv_memory" not in spec and draw(st.booleans()):
        spec["gpu"] = draw(st.sampled_from(["L4", "H200", "MI300X"]))
    return {"name": "edge", "size": spec, "expect": ["bytes_per_token >= 0"]}


@given(check=extreme_checks())
@settings(max_examples=80, derandomize=True)
def test_check_files_at_the_edges_give_a_report_or_one_error(check):
    from kvplan.check.run import load_checks, run_checks

    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        path = write(Path(folder) / "c.yaml", yaml.safe_dump({"checks": [check]}, sort_keys=False))
        try:
            report = run_checks(load_checks(path))
        except KvplanError as exc:
            assert str(exc) and "\n" not in str(exc)
            return
    assert report.to_dict()["num_assertions"] == 1
