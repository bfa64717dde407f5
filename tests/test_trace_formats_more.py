"""Vidur's two trace-replay CSV layouts and serving-benchmark result files (vLLM, SGLang), read
from small fixtures in tests/data/traces written in the layouts those tools read and write."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from kvplan.errors import TraceError, WorkloadError
from kvplan.workload.schema import load_workload
from kvplan.workload.traces import open_trace, read_trace

DATA = Path(__file__).resolve().parent / "data" / "traces"


def collect(chunks):
    chunks = list(chunks)
    cat = lambda k: np.concatenate([getattr(c, k) for c in chunks])  # noqa: E731
    return cat("arrival"), cat("prompt_len"), cat("output_len")


def located(fmt, path, **options) -> TraceError:
    with pytest.raises(TraceError) as err:
        list(read_trace(fmt, path, **options))
    return err.value


# --- Vidur ---------------------------------------------------------------------------------


def test_vidur_splitwise_layout():
    """Vidur's data/processed_traces/splitwise_*.csv layout: arrived_at in seconds."""
    arrival, prompt, output = collect(read_trace("vidur", DATA / "vidur_splitwise.csv"))
    assert np.allclose(arrival, [0.0, 0.052, 0.165, 1.4])
    assert prompt.tolist() == [4808, 3180, 110, 7433] and output.tolist() == [10, 8, 27, 14]


def test_vidur_dated_layout_by_header():
    """The Date,Time,PromptTokenCount,CompletionTokenCount layout (vidur 0.0.26's trace_replay):
    Time in seconds, arrivals relative to the first row, extra columns ignored."""
    trace = open_trace("vidur", DATA / "vidur_dated.csv")
    arrival, prompt, output = collect(trace.chunks())
    assert trace.timed and trace.num_requests == 4
    assert arrival.tolist() == [0.0, 0.5, 0.5, 3.75]
    assert prompt.tolist() == [1200, 88, 2048, 310] and output.tolist() == [35, 412, 0, 96]
    scaled = collect(read_trace("vidur", DATA / "vidur_dated.csv", time_scale=0.04))[0]
    assert np.allclose(scaled, arrival * 0.04)


def test_vidur_dated_gzip_bom_limit_repeat(tmp_path):
    """gzip and a byte-order mark are read as for the other CSV formats; limit and repeat tile."""
    text = (DATA / "vidur_dated.csv").read_bytes()
    gz = tmp_path / "v.csv.gz"
    gz.write_bytes(gzip.compress(b"\xef\xbb\xbf" + text))
    base = collect(read_trace("vidur", DATA / "vidur_dated.csv"))
    same = collect(read_trace("vidur", gz))
    assert all(np.array_equal(a, b) for a, b in zip(base, same))
    arrival, prompt, _ = collect(read_trace("vidur", gz, limit=2))
    assert prompt.tolist() == [1200, 88]
    arrival, prompt, _ = collect(read_trace("vidur", gz, repeat=2, limit=6, chunk_size=3))
    shift = 3.75 + 3.75 / 3
    assert np.allclose(arrival, [0, 0.5, 0.5, 3.75, shift, shift + 0.5]) and prompt[4] == 1200


def test_vidur_streams_past_keep_rows(tmp_path, monkeypatch):
    """A dated trace longer than KEEP_ROWS is read again per chunk, with the Date check each time."""
    import kvplan.workload.traces as traces

    monkeypatch.setattr(traces, "KEEP_ROWS", 3)
    rows = "".join(f"2023-08-21,{i},{i + 1},2\n" for i in range(10))
    f = tmp_path / "v.csv"
    f.write_text("Date,Time,PromptTokenCount,CompletionTokenCount\n" + rows)
    trace = open_trace("vidur", f, chunk_size=4)
    arrival, prompt, _ = collect(trace.chunks())
    assert trace.num_requests == 10 and arrival.tolist() == list(range(10)) and prompt[-1] == 10


DATED = "Date,Time,PromptTokenCount,CompletionTokenCount\n2023-08-21,10,5,5\n"


@pytest.mark.parametrize(
    ("text", "line", "field", "message"),
    [
        (DATED + "2023-08-22,11,5,5\n", 3, "Date", "one date"),
        (DATED + "2023-08-21,soon,5,5\n", 3, "Time", "seconds >= 0"),
        (DATED + "2023-08-21,9,5,5\n", 3, "Time", "backwards"),
        (DATED + "2023-08-21,11,0,5\n", 3, "PromptTokenCount", ">= 1"),
        (DATED + "2023-08-21,11,5,-1\n", 3, "CompletionTokenCount", ">= 0"),
        (DATED + "2023-08-21,11,5\n", 3, None, "fields"),
        ("Date,Time,PromptTokenCount\n2023-08-21,1,1\n", 1, "CompletionTokenCount", "arrived_at,num_prefill"),
        ("arrived_at,num_prefill_tokens\n1,1\n", 1, "num_decode_tokens", "Date,Time,PromptTokenCount,Compl"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,1\n-2,1,1\n", 3, "arrived_at", "seconds >= 0"),
    ],
)  # fmt: skip
def test_vidur_bad_rows(tmp_path, text, line, field, message):
    """One TraceError naming the file, line and column (for the Date,Time layout too)."""
    path = tmp_path / "t.csv"
    path.write_text(text)
    e = located("vidur", path)
    assert (e.file, e.line, e.field) == (str(path), line, field) and message in e.message, str(e)


def test_vidur_date_checked_across_blocks(tmp_path):
    rows = "".join(f"2023-08-21,{i},1,1\n" for i in range(7)) + "2023-08-20,8,1,1\n"
    path = tmp_path / "t.csv"
    path.write_text("Date,Time,PromptTokenCount,CompletionTokenCount\n" + rows)
    e = located("vidur", path, chunk_size=3)
    assert (e.line, e.field) == (9, "Date")


# --- vLLM / SGLang benchmark results ------------------------------------------------------------


def test_vllm_bench_result_token_counts():
    """input_lens/output_lens per request; the failed request (errors[1]) is left out; untimed."""
    trace = open_trace("vllm-bench", DATA / "vllm_bench_result.json")
    arrival, prompt, output = collect(trace.chunks())
    assert not trace.timed and trace.num_requests == 4
    assert prompt.tolist() == [512, 700, 90, 33] and output.tolist() == [128, 256, 200, 8]
    assert (arrival == 0).all()
    old = collect(read_trace("vllm-bench", DATA / "vllm_bench_result_old.json"))  # indented JSON
    assert old[1].tolist() == [64, 2000, 17] and old[2].tolist() == [16, 300, 1]


def test_vllm_bench_timed_arrivals():
    """Arrival = start_times - queue_times (the --max-concurrency wait), sorted, from 0."""
    trace = open_trace("vllm-bench-timed", DATA / "vllm_bench_result.json")
    arrival, prompt, output = collect(trace.chunks())
    assert trace.timed
    assert np.allclose(arrival, [0.0, 0.6, 0.7, 1.1])
    assert prompt.tolist() == [512, 700, 33, 90] and output.tolist() == [128, 256, 8, 200]
    scaled = collect(read_trace("vllm-bench-timed", DATA / "vllm_bench_result.json", time_scale=0.5))[0]
    assert np.allclose(scaled, arrival * 0.5)


def test_vllm_bench_timed_without_queue_times(tmp_path):
    doc = json.loads((DATA / "vllm_bench_result.json").read_text())
    del doc["queue_times"]
    f = tmp_path / "r.json"
    f.write_text(json.dumps(doc))
    arrival, prompt, _ = collect(read_trace("vllm-bench-timed", f))
    assert np.allclose(arrival, [0.0, 0.7, 0.9, 1.6]) and prompt.tolist() == [512, 33, 700, 90]


def test_sglang_jsonl_runs_concatenated_gzip_limit_repeat(tmp_path):
    """SGLang bench_serving appends one run per line: every run's requests, in order."""
    path = DATA / "sglang_bench.jsonl"
    assert collect(read_trace("vllm-bench", path))[1].tolist() == [40, 41, 300]
    gz = tmp_path / "s.jsonl.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    _, prompt, output = collect(read_trace("vllm-bench", gz, limit=2))
    assert prompt.tolist() == [40, 41] and output.tolist() == [5, 6]
    trace = open_trace("vllm-bench", gz, repeat=3, chunk_size=2)
    assert trace.num_requests == 9 and collect(trace.chunks())[1].tolist() == [40, 41, 300] * 3
    e = located("vllm-bench-timed", path)
    assert "2 runs" in e.message


def _doc(**changes):
    doc = json.loads((DATA / "vllm_bench_result.json").read_text())
    doc.update(changes)
    return doc


@pytest.mark.parametrize(
    ("fmt", "doc", "field", "message"),
    [
        ("vllm-bench", _doc(input_lens=[512, 130, "7", 90, 33]), "input_lens[2]", "integer"),
        ("vllm-bench", _doc(input_lens=[512, 130, 0, 90, 33]), "input_lens[2]", ">= 1"),
        ("vllm-bench", _doc(output_lens=[128, 0, 256, -1, 8]), "output_lens[3]", ">= 0"),
        ("vllm-bench", _doc(output_lens=[128, 0, 256]), "output_lens", "has 3 entries"),
        ("vllm-bench", {k: v for k, v in _doc().items() if k != "input_lens"}, "input_lens", "--save-detailed"),
        ("vllm-bench", _doc(output_lens=0), "output_lens", "expected a list"),
        ("vllm-bench", _doc(errors=["", 7, "", "", ""]), "errors[1]", "text"),
        ("vllm-bench-timed", {k: v for k, v in _doc().items() if k != "start_times"}, "start_times", "--save-detailed"),
        ("vllm-bench-timed", _doc(start_times=[1, 2, None, 4, 5]), "start_times[2]", "seconds"),
        ("vllm-bench-timed", _doc(queue_times=[0, 0, 0, -1, 0]), "queue_times[3]", ">= 0"),
        ("vllm-bench-timed", _doc(start_times=[1, 2, 3, 10**400, 5]), "start_times[3]", "seconds"),
        ("vllm-bench", _doc(input_lens=[512, 130, 700, 10**400, 33]), "input_lens[3]", "integer"),
    ],
)  # fmt: skip
def test_bench_result_bad_entries(tmp_path, fmt, doc, field, message):
    """A bad entry is named by its JSON path (the list and the request's index)."""
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    e = located(fmt, path)
    assert (e.file, e.field) == (str(path), field) and message in e.message, str(e)


def test_bench_result_jsonl_errors_name_the_line(tmp_path):
    path = tmp_path / "r.jsonl"
    good = json.dumps({"input_lens": [3], "output_lens": [4]})
    path.write_text(good + "\n\n" + json.dumps({"input_lens": [3, "x"], "output_lens": [4, 4]}) + "\n")
    e = located("vllm-bench", path)
    assert (e.line, e.field) == (3, "input_lens[1]")
    path.write_text(good + "\n{broken\n")
    e = located("vllm-bench", path)
    assert e.line == 2 and "not valid JSON" in e.message
    path.write_text("[1, 2]")
    assert "JSON object" in located("vllm-bench", path).message
    path.write_text(json.dumps({"input_lens": [3], "output_lens": [0], "errors": ["timeout"]}))
    assert "all 1 requests failed" in located("vllm-bench", path).message


def test_bench_result_size_limit(tmp_path, monkeypatch):
    """A result file larger than the JSON limit is refused by its size, unparsed."""
    import kvplan.workload.traces.bench_results as bench

    monkeypatch.setattr(bench, "MAX_JSON_BYTES", 100)
    e = located("vllm-bench", DATA / "vllm_bench_result.json")
    assert "larger than" in e.message and e.file == str(DATA / "vllm_bench_result.json")


def test_bench_result_too_long(tmp_path):
    e = located("vllm-bench", DATA / "vllm_bench_result.json", max_model_len=600)
    assert e.field == "input_lens[2]" and "max_model_len" in e.message
    _, prompt, output = collect(read_trace("vllm-bench", DATA / "vllm_bench_result.json",
                                           max_model_len=600, too_long="clip"))  # fmt: skip
    assert prompt.tolist() == [512, 600, 90, 33] and (prompt + output).max() <= 600


def test_workload_file_takes_bench_results(tmp_path):
    """In a workload: vllm-bench takes the arrival process (no time_scale); the timed format has
    its own timestamps (no arrival)."""
    src = DATA / "vllm_bench_result.json"
    head = "seed: 1\npool: {slots: 100000}\nrequests:\n"
    w = tmp_path / "w.yaml"
    w.write_text(head + f"  trace: {{format: vllm-bench, path: {src}}}\n  arrival: {{process: poisson, rate: 2}}\n")
    chunks = list(load_workload(w).make_requests())
    arrival = np.concatenate([c.arrival for c in chunks])
    assert len(arrival) == 4 and arrival[-1] > 0 and (np.diff(arrival) >= 0).all()
    w.write_text(head + f"  trace: {{format: vllm-bench, path: {src}, time_scale: 0.5}}\n")
    with pytest.raises(WorkloadError, match="no timestamps"):
        load_workload(w)
    w.write_text(head + f"  trace: {{format: vllm-bench-timed, path: {src}}}\n  arrival: {{process: poisson, rate: 2}}\n")
    with pytest.raises(WorkloadError, match="own timestamps"):
        load_workload(w)
    w.write_text(head + f"  trace: {{format: vllm-bench-timed, path: {src}}}\n")
    assert load_workload(w).num_requests == 4
