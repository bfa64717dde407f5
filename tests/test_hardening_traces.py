"""One's own trace (issue 29): the generic `csv` format reads any header through a column mapping,
with timestamps in seconds, milliseconds, microseconds or as date-times; the refusals (and the
hints for `prompt: 1000` or epoch seconds in the Azure format) are in
tests/bad_inputs/cases-traces.yaml."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import numpy as np
import pytest

from kvplan.workload import json_schema
from kvplan.workload import traces as T
from kvplan.workload.schema import read_spec
from kvplan.workload.spec_yaml import spec_yaml
from kvplan.workload.traces.columns import TraceColumns

EPOCH = 1_717_200_000  # 2024-06-01 00:00:00 UTC
# (seconds after EPOCH, prompt, output): gaps of 0.5, 0.75 and 2.125 s, exact in binary
ROWS = [(0.0, 120, 30), (0.5, 300, 40), (1.25, 80, 10), (3.375, 2000, 1)]
GAPS = [0.0, 0.5, 1.25, 3.375]


def write_csv(path: Path, header: str, stamp, extra: bool = True) -> Path:
    lines = [header]
    for i, (t, p, o) in enumerate(ROWS):
        lines.append(f"{i},{stamp(t)},{p},{o},gpt" if extra else f"{stamp(t)},{p},{o}")
    path.write_text("\n".join(lines) + "\n")
    return path


def arrivals(path: Path, columns: TraceColumns | None, **options) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    chunks = list(T.open_trace("csv", path, columns=columns, **options).chunks())
    return tuple(np.concatenate([getattr(c, k) for c in chunks]) for k in ("arrival", "prompt_len", "output_len"))


UNITS = {
    "s": lambda t: f"{EPOCH + t:.3f}",
    "ms": lambda t: f"{int((EPOCH + t) * 1000)}",
    "us": lambda t: f"{int((EPOCH + t) * 1_000_000)}",
    "datetime": lambda t: datetime.datetime.fromtimestamp(EPOCH + t, datetime.timezone.utc)
    .strftime("%Y-%m-%d %H:%M:%S.%f"),
}


@pytest.mark.parametrize("unit", sorted(UNITS))
def test_every_unit_gives_the_same_arrivals(tmp_path, unit):
    path = write_csv(tmp_path / "log.csv", "id,ts,input_len,output_len,model", UNITS[unit])
    cols = TraceColumns(timestamp="ts", prompt_tokens="input_len", output_tokens="output_len", unit=unit)
    t, p, o = arrivals(path, cols)
    assert t.tolist() == pytest.approx(GAPS, abs=1e-6)
    assert p.tolist() == [r[1] for r in ROWS] and o.tolist() == [r[2] for r in ROWS]


def test_the_default_columns_need_no_mapping(tmp_path):
    path = write_csv(tmp_path / "t.csv", "timestamp,prompt_tokens,output_tokens", lambda t: f"{t}", extra=False)
    t, p, _ = arrivals(path, None)
    assert t.tolist() == GAPS and p.tolist() == [r[1] for r in ROWS]


def test_columns_may_come_in_any_order_and_carry_spaces(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(" out , when ,in\n" + "".join(f"{o},{t},{p}\n" for t, p, o in ROWS))
    t, p, o = arrivals(path, TraceColumns(" when", "in ", "out"))
    assert t.tolist() == GAPS and p.tolist() == [r[1] for r in ROWS] and o.tolist() == [r[2] for r in ROWS]


def test_time_scale_limit_repeat_and_max_model_len_apply(tmp_path):
    path = write_csv(tmp_path / "t.csv", "timestamp,prompt_tokens,output_tokens", lambda t: f"{t}", extra=False)
    t, _, _ = arrivals(path, None, time_scale=2.0)
    assert t.tolist() == [2 * g for g in GAPS]
    t, _, _ = arrivals(path, None, limit=2)
    assert t.tolist() == GAPS[:2]
    t, _, _ = arrivals(path, None, repeat=2)
    shift = 3.375 + 3.375 / 3  # the span plus one mean gap, as every timed format tiles
    assert t.tolist() == pytest.approx(GAPS + [g + shift for g in GAPS])
    _, p, o = arrivals(path, None, max_model_len=1000, too_long="clip")
    assert p.tolist() == [120, 300, 80, 1000] and o.tolist() == [30, 40, 10, 0]


def test_a_long_trace_is_streamed_with_the_same_rows(tmp_path, monkeypatch):
    path = write_csv(tmp_path / "t.csv", "timestamp,prompt_tokens,output_tokens", lambda t: f"{t}", extra=False)
    kept = arrivals(path, None, repeat=3)
    monkeypatch.setattr(T, "KEEP_ROWS", 1)  # read again chunk by chunk
    trace = T.open_trace("csv", path, repeat=3, chunk_size=3)
    streamed = list(trace.chunks())
    assert trace.num_requests == 12 and sum(len(c) for c in streamed) == 12
    assert np.concatenate([c.arrival for c in streamed]).tolist() == pytest.approx(kept[0].tolist())


def test_a_workload_reads_a_csv_trace_and_writes_it_back(tmp_path):
    write_csv(tmp_path / "log.csv", "id,ts,input_len,output_len,model", UNITS["ms"])
    workload = tmp_path / "w.yaml"
    workload.write_text("experiment: capacity\npool: {slots: 100000}\nrequests:\n  trace: {format: csv, path: log.csv, "
                        "columns: {timestamp: ts, prompt_tokens: input_len, output_tokens: output_len}, "
                        "timestamp_unit: ms}\n")
    spec = read_spec(workload)
    assert spec.requests.columns == TraceColumns("ts", "input_len", "output_len", "ms")
    again = tmp_path / "again.yaml"
    again.write_text(spec_yaml(spec))
    assert read_spec(again).requests == spec.requests


def test_the_json_schema_knows_the_csv_keys_and_only_for_csv():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json_schema.workload_schema()
    base = {"experiment": "capacity", "pool": {"slots": 1000}, "allocators": [{"kind": "paged", "block_size": 16}]}

    def valid(trace: dict) -> bool:
        doc = {**base, "requests": {"trace": trace}}
        return jsonschema.Draft202012Validator(schema).is_valid(json.loads(json.dumps(doc)))

    columns = {"timestamp": "ts", "prompt_tokens": "in", "output_tokens": "out"}
    assert valid({"format": "csv", "path": "x.csv", "columns": columns, "timestamp_unit": "ms"})
    assert valid({"format": "csv", "path": "x.csv"})
    assert not valid({"format": "csv", "path": "x.csv", "timestamp_unit": "hours"})
    assert not valid({"format": "csv", "path": "x.csv", "columns": {**columns, "model": "m"}})
    assert not valid({"format": "azure", "path": "x.csv", "columns": columns})
    assert not valid({"format": "csv", "path": "x.csv", "history": True})
    assert valid({"format": "sharegpt", "path": "x.json", "history": True})
    assert not valid({"format": "mooncake", "path": "x.jsonl", "history": True})
    assert valid({"format": "mooncake", "path": "x.jsonl", "time_scale": 0.5})


def test_epoch_milliseconds_keep_sub_millisecond_gaps_exact(tmp_path):
    """float64 holds epoch microseconds (1.7e15) exactly: the gaps come back to the microsecond."""
    path = tmp_path / "t.csv"
    stamps = [EPOCH * 1_000_000 + k for k in (0, 1, 3, 1_000_007)]
    path.write_text("t,p,o\n" + "".join(f"{s},10,1\n" for s in stamps))
    t, _, _ = arrivals(path, TraceColumns("t", "p", "o", "us"))
    assert t.tolist() == pytest.approx([0, 1e-6, 3e-6, 1.000007], abs=1e-9)
