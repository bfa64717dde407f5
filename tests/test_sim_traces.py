"""Trace readers against the real files in ../shared/traces (checked with independent parsers),
plus hand-written snippets for the formats and bad rows the corpus does not hold."""

from __future__ import annotations

import csv
import json
import math
import os
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from kvplan.errors import TraceError
from kvplan.workload.traces import open_trace, read_trace


def traces_dir() -> Path:
    root = os.environ.get("KVPLAN_SHARED")
    base = Path(root) if root else Path(__file__).resolve().parents[2] / "shared"
    return base / "traces"


def trace_file(rel: str) -> Path:
    path = traces_dir() / rel
    if not path.exists():
        pytest.skip(f"{path} not present")
    return path


def collect(chunks):
    chunks = list(chunks)
    cat = lambda k: np.concatenate([getattr(c, k) for c in chunks])  # noqa: E731
    ids = [h for c in chunks for h in (c.hash_ids or [])]
    return cat("arrival"), cat("prompt_len"), cat("output_len"), ids, chunks


AZURE = ["azure-llm-2023/AzureLLMInferenceTrace_conv.csv", "azure-llm-2023/AzureLLMInferenceTrace_code.csv"]
MOONCAKE = ["mooncake-fast25/conversation_trace.jsonl", "mooncake-fast25/synthetic_trace.jsonl"]


@pytest.mark.parametrize("rel", AZURE)
def test_azure_matches_csv_module(rel):
    """Counts, token sums and arrival seconds equal a plain csv + datetime reading of the file."""
    path = trace_file(rel)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    stamp = lambda s: datetime.strptime(s[:26], "%Y-%m-%d %H:%M:%S.%f")  # noqa: E731
    arrival, prompt, output, ids, _ = collect(read_trace("azure", path, max_model_len=2**20))
    assert len(prompt) == len(rows)
    assert prompt.sum() == sum(int(r["ContextTokens"]) for r in rows)
    assert output.sum() == sum(int(r["GeneratedTokens"]) for r in rows)
    last = (stamp(rows[-1]["TIMESTAMP"]) - stamp(rows[0]["TIMESTAMP"])).total_seconds()
    assert arrival[0] == 0 and arrival[-1] == pytest.approx(last, abs=1e-6)
    assert (np.diff(arrival) >= 0).all() and ids == []


@pytest.mark.parametrize("rel", MOONCAKE)
def test_mooncake_matches_json_and_block_ids(rel):
    """One hash id per 512-token block, ceil(input/512) of them, timestamps in ms become seconds."""
    path = trace_file(rel)
    records = [json.loads(s) for s in path.read_text().splitlines() if s.strip()]
    trace = open_trace("mooncake", path, max_model_len=2**20)
    arrival, prompt, output, ids, chunks = collect(trace.chunks())
    assert trace.num_requests == len(records) == len(prompt)
    assert prompt.sum() == sum(r["input_length"] for r in records)
    assert output.sum() == sum(r["output_length"] for r in records)
    assert all(c.hash_block_size == 512 for c in chunks)
    assert [len(h) for h in ids] == [math.ceil(r["input_length"] / 512) for r in records]
    assert ids[-1] == tuple(records[-1]["hash_ids"])
    t0 = records[0]["timestamp"]
    assert arrival[-1] == pytest.approx((records[-1]["timestamp"] - t0) / 1000)


def _walk_agentic(entries, base=0.0):
    for e in entries:
        if e["type"] == "subagent":
            yield from _walk_agentic(e["requests"], base + e["t"])
        else:
            yield base + e["t"], e


def test_agentic_flattens_subagents():
    """Nested sub-agent requests are flattened with arrival = marker t + own t; totals match."""
    folder = trace_file("kv-cache-tester-agentic")
    files = sorted(folder.glob("*.json"))
    docs = [json.loads(f.read_text()) for f in files]
    trace = open_trace("agentic", folder)
    arrival, prompt, output, ids, chunks = collect(trace.chunks())
    assert trace.num_requests == len(prompt) == sum(1 for doc in docs for _ in _walk_agentic(doc["requests"]))
    assert len(prompt) == 420  # SOURCE.md: 370 entries, 6 of them markers holding 56 requests
    assert prompt.sum() == sum(doc["totals"]["combined_tokens"]["input"] for doc in docs)
    assert output.sum() == sum(doc["totals"]["combined_tokens"]["output"] for doc in docs)
    assert (np.diff(arrival) >= 0).all() and chunks[0].hash_block_size == 64
    assert all(len(h) == p // 64 for h, p in zip(ids, prompt.tolist()))
    one = collect(read_trace("agentic", folder / "trace_0277.json"))
    flat = sorted(_walk_agentic(docs[files.index(folder / "trace_0277.json")]["requests"]),
                  key=lambda x: x[0])  # fmt: skip
    assert np.allclose(one[0], [t for t, _ in flat])
    assert one[0][1] == pytest.approx(79.224)  # the first sub-agent request


def test_agentic_ids_kept_apart_across_files_and_session_starts(tmp_path):
    """Hash ids are local to a file: two files never share an id; sessions start where told."""
    folder = trace_file("kv-cache-tester-agentic")
    for name in ("trace_0012.json", "trace_0019.json"):
        (tmp_path / name).write_text((folder / name).read_text())
    per_file = [set().union(*collect(read_trace("agentic", tmp_path / n))[3])
                for n in ("trace_0012.json", "trace_0019.json")]  # fmt: skip
    both = collect(read_trace("agentic", tmp_path, session_starts=lambda k: np.array([0.0, 5.0])))
    all_ids = set().union(*both[3])
    assert len(all_ids) == len(per_file[0]) + len(per_file[1])
    assert len(both[1]) == 14 + 24


def test_tiling_repeat_limit_and_time_scale():
    """Copy k is shifted by k x (duration + mean gap); limit cuts the tiled stream; scale compresses."""
    path = trace_file(AZURE[1])
    base, p0, _, _, _ = collect(read_trace("azure", path))
    n, dur = len(base), base[-1]
    shift = dur + dur / (n - 1)
    arrival, prompt, _, _, _ = collect(read_trace("azure", path, repeat=3, limit=2 * n + 5, chunk_size=5000))
    assert len(arrival) == 2 * n + 5
    assert np.allclose(arrival[n:2 * n], base + shift) and np.array_equal(prompt[2 * n:], p0[:5])
    assert (np.diff(arrival) >= 0).all()
    scaled = collect(read_trace("azure", path, time_scale=0.05))[0]
    assert np.allclose(scaled, base * 0.05)


def test_mooncake_repeat_shifts_ids():
    """A repeated Mooncake copy gets ids shifted past the largest id, so copies share no prefix."""
    path = trace_file(MOONCAKE[1])
    trace = open_trace("mooncake", path, repeat=2, max_model_len=2**20, chunk_size=1000)
    _, prompt, _, ids, _ = collect(trace.chunks())
    n = trace.num_requests // 2
    span = 1 + max(max(h) for h in ids[:n])
    assert ids[n] == tuple(h + span for h in ids[0]) and len(prompt) == 2 * n


def test_one_million_tiled_azure_requests_stream():
    """The simulator benchmark's input: 1,000,000 requests tiled from the conv trace, streamed in
    chunks (its speed is bench/simulate.py's to measure)."""
    path = trace_file(AZURE[0])
    trace = open_trace("azure", path, repeat=52, limit=1_000_000, max_model_len=16384)
    count, last = 0, -1.0
    for chunk in trace.chunks():
        count += len(chunk)
        assert chunk.arrival[0] >= last
        last = chunk.arrival[-1]
    assert count == trace.num_requests == 1_000_000


def test_too_long_error_or_clip():
    """A prompt above max_model_len names its row; clip truncates it and its hash ids."""
    path = trace_file(MOONCAKE[0])
    with pytest.raises(TraceError) as err:
        list(read_trace("mooncake", path, max_model_len=8192))
    assert err.value.field == "input_length" and err.value.line is not None
    _, prompt, output, ids, _ = collect(read_trace("mooncake", path, max_model_len=8192, too_long="clip"))
    assert (prompt + output).max() <= 8192
    assert all(len(h) == math.ceil(p / 512) for h, p in zip(ids, prompt.tolist()))


def test_vidur_csv(tmp_path):
    """Vidur's columns by name (extra columns ignored), arrivals relative to the first row."""
    f = tmp_path / "v.csv"
    f.write_text("request_id,arrived_at,num_prefill_tokens,num_decode_tokens\n"
                 "0,1.5,100,20\n1,2.0,50.0,0\n2,4.5,7,3\n")  # fmt: skip
    arrival, prompt, output, _, _ = collect(read_trace("vidur", f))
    assert arrival.tolist() == [0.0, 0.5, 3.0]
    assert prompt.tolist() == [100, 50, 7] and output.tolist() == [20, 0, 3]


def test_sharegpt_pairs_and_history(tmp_path):
    """One request per human turn answered; history=True resends the conversation so far."""
    convs = [
        {"id": "a", "conversations": [{"from": "human", "tokens": 10}, {"from": "gpt", "tokens": 30},
                                      {"from": "human", "tokens": 5}, {"from": "gpt", "tokens": 7},
                                      {"from": "human", "tokens": 4}]},
        {"id": "b", "conversations": [{"from": "system", "tokens": 3}, {"from": "user", "tokens": 2},
                                      {"from": "assistant", "tokens": 9}]},
    ]  # fmt: skip
    f = tmp_path / "s.json"
    f.write_text(json.dumps(convs))
    _, prompt, output, _, _ = collect(read_trace("sharegpt", f))
    assert prompt.tolist() == [10, 5, 5] and output.tolist() == [30, 7, 9]
    assert collect(read_trace("sharegpt", f, history=True))[1].tolist() == [10, 45, 5]
    lines = tmp_path / "s.jsonl"
    lines.write_text("\n".join(json.dumps(c) for c in convs))
    assert collect(read_trace("sharegpt", lines))[1].tolist() == [10, 5, 5]
    trace = open_trace("sharegpt", f, repeat=2)
    assert not trace.timed and trace.num_requests == 6


HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
GOOD = "2023-11-16 18:17:03.9799600,4808,10\n"


@pytest.mark.parametrize(
    ("fmt", "text", "line", "field", "message"),
    [
        ("azure", HEADER + GOOD + "2023-11-16 18:17:04.1,abc,8\n", 3, "ContextTokens", "integer"),
        ("azure", HEADER + GOOD + "2023-11-16 18:17:04.1,12,-8\n", 3, "GeneratedTokens", ">= 0"),
        ("azure", HEADER + GOOD + "2023-11-16 18:17:02.1,12,8\n", 3, "TIMESTAMP", "backwards"),
        ("azure", HEADER + GOOD + "yesterday,12,8\n", 3, "TIMESTAMP", "date-time"),
        ("azure", HEADER + GOOD + "2023-11-16 18:17:04.1,12\n", 3, None, "fields"),
        ("azure", "TIMESTAMP,ContextTokens\n" + GOOD, 1, "GeneratedTokens", "missing column"),
        ("vidur", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,1\nnan,1,1\n", 3, "arrived_at", "seconds"),
        ("vidur", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,1\n1,0,1\n", 3, "num_prefill_tokens", ">= 1"),
        ("mooncake", '{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}\n'
                     '{"timestamp": 5, "input_length": 600, "output_length": 1, "hash_ids": [1]}\n',
         2, "hash_ids", "ceil"),
        ("mooncake", '{"timestamp": 9, "input_length": 6, "output_length": 1, "hash_ids": [1]}\n'
                     '{"timestamp": 5, "input_length": 6, "output_length": 1, "hash_ids": [1]}\n',
         2, "timestamp", "backwards"),
        ("mooncake", '{"timestamp": 0, "input_length": 6, "output_length": 1, "hash_ids": [1]}\n{oops\n',
         2, None, "not valid JSON"),
        ("mooncake", '{"timestamp": 0, "input_length": "6", "output_length": 1, "hash_ids": [1]}\n',
         1, "input_length", "integer"),
    ],
)  # fmt: skip
def test_bad_rows(tmp_path, fmt, text, line, field, message):
    """Each bad row is reported with the file, its line and its column."""
    path = tmp_path / ("t.jsonl" if fmt == "mooncake" else "t.csv")
    path.write_text(text)
    with pytest.raises(TraceError) as err:
        list(read_trace(fmt, path))
    e = err.value
    assert (e.line, e.field, e.file) == (line, field, str(path)) and message in e.message, str(e)


@pytest.mark.parametrize(
    ("fmt", "doc", "field", "message"),
    [
        ("agentic", {"block_size": 64, "requests": [{"t": 0, "type": "n", "in": 130, "out": 1, "hash_ids": [1]}]},
         "requests[0].hash_ids", "floor"),
        ("agentic", {"block_size": 64, "requests": [{"t": 5, "type": "n", "in": 1, "out": 1, "hash_ids": []},
                                                    {"t": 1, "type": "subagent", "requests": []}]},
         "requests[1].t", "backwards"),
        ("agentic", {"block_size": 64, "requests": [{"t": 0, "type": "subagent", "requests": [
            {"t": 0, "type": "n", "in": 1, "out": -1, "hash_ids": []}]}]},
         "requests[0].requests[0].out", ">= 0"),
        ("sharegpt", [{"conversations": [{"from": "human", "tokens": 3}, {"from": "robot", "tokens": 1}]}],
         "[0].conversations[1].from", "unknown role"),
        ("sharegpt", [{"conversations": [{"from": "human", "value": "hi"}]}],
         "[0].conversations[0].tokens", "integer"),
    ],
)  # fmt: skip
def test_bad_json_entries(tmp_path, fmt, doc, field, message):
    """JSON traces name the bad entry by its path in the document."""
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceError) as err:
        list(read_trace(fmt, path))
    assert err.value.field == field and message in err.value.message, str(err.value)


def test_sharegpt_jsonl_bad_line_and_zero_prompt(tmp_path):
    """A JSONL conversation is located by its line; a human turn of 0 tokens is refused."""
    f = tmp_path / "s.jsonl"
    f.write_text('{"conversations": [{"from": "human", "tokens": 1}, {"from": "gpt", "tokens": 1}]}\n'
                 "\n{broken\n")  # fmt: skip
    with pytest.raises(TraceError) as err:
        list(read_trace("sharegpt", f))
    assert err.value.line == 3 and "not valid JSON" in err.value.message
    f.write_text('{"conversations": [{"from": "human", "tokens": 0}, {"from": "gpt", "tokens": 1}]}\n')
    with pytest.raises(TraceError, match="no human turn"):
        list(read_trace("sharegpt", f))
