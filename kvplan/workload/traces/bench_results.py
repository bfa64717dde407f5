"""Result files of serving benchmark clients that list every request's token counts.

- vLLM `benchmarks/benchmark_serving.py` / `vllm bench serve` with `--save-result --save-detailed`
  (vllm/benchmarks/serve.py): one JSON object with `input_lens` and `output_lens`, one entry per
  request in send order, and `errors` ("" for a request that succeeded). The output length of a
  failed request is written as 0. Newer vLLM also writes `start_times` (the client's
  time.perf_counter() when the request was sent) and `queue_times` (how long it waited for a
  `--max-concurrency` slot before that); `--append-result` appends one object per line.
- SGLang `python -m sglang.bench_serving --output-file f.jsonl --output-details`: the same keys,
  one run per line (appended).

Formats: `vllm-bench` takes the token counts only (arrivals come from the workload's arrival
process; every run in the file, in order); `vllm-bench-timed` also takes each request's arrival,
`start_times[i] - queue_times[i]` (queue_times 0 where absent), from a file of one run. Failed
requests (a non-empty `errors` entry) are left out: their output length is unknown. The file is
read whole, at most MAX_JSON_BYTES.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from kvplan.errors import TraceError
from kvplan.fileio import load_json, read_limited
from kvplan.workload.chunks import MAX_TOKENS
from kvplan.workload.traces._rows import MAX_JSON_BYTES, _int_or_none, _Rows

_DETAILED = "save the result with vLLM's --save-result --save-detailed (SGLang: --output-details)"


def _runs(path: Path) -> list[tuple[int | None, dict]]:
    """(line, run) for a whole-file JSON object, or for each non-blank line of appended runs."""
    data = read_limited(path, MAX_JSON_BYTES, TraceError, what="a benchmark result")
    try:
        docs = [(None, load_json(data, path, TraceError))]
    except TraceError as e:
        if not e.message.startswith("not valid JSON: Extra data"):
            raise
        text = data.decode("utf-8").removeprefix("\ufeff")  # load_json checked the encoding
        docs = [(n, load_json(s, path, TraceError, line=n))
                for n, s in enumerate(text.splitlines(), 1) if s.strip()]  # fmt: skip
    for line, doc in docs:
        if not isinstance(doc, dict):
            raise TraceError("expected a JSON object (a benchmark result)", file=path, line=line)
    return docs


def benchmark_runs(path: Path) -> list[tuple[int | None, dict]]:
    """(line, run) of every run a result file holds (line None for a whole-file object)."""
    return _runs(path)


def _list(run: dict, key: str, n: int | None, fail) -> list:
    v = run.get(key)
    if not isinstance(v, list):
        got = "nothing" if key not in run else json.dumps(v)[:40]
        raise fail(key, f"expected a list with one entry per request, got {got}; {_DETAILED}")
    if n is not None and len(v) != n:
        raise fail(key, f"has {len(v)} entries, input_lens has {n}")
    return v


def _count(v, where: str, lo: int, fail) -> int:
    n = _int_or_none(v) if isinstance(v, (int, float)) and abs(v) <= 2**62 else None
    if n is None or not lo <= n <= MAX_TOKENS:
        shown = json.dumps(v) if not isinstance(v, (int, float)) or abs(v) <= 2**62 else "a larger number"
        raise fail(where, f"expected an integer >= {lo} and at most {MAX_TOKENS:,}, got {shown[:40]}")
    return n


def _seconds(v, where: str, fail, lo: float = -np.inf) -> float:
    t = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) <= 1e300 else np.nan
    if not (np.isfinite(t) and t >= lo):
        at_least = " >= 0" if lo == 0 else ""
        raise fail(where, f"expected a number of seconds{at_least}, got {json.dumps(v)[:40]}")
    return t


def read_bench_result(path: Path, timed: bool) -> _Rows:
    runs = _runs(path)
    if timed and len(runs) > 1:
        raise TraceError(f"holds {len(runs)} runs (one per line); a timed replay takes one: keep "
                         "its line, or use format vllm-bench", file=path)  # fmt: skip
    arrival, prompt, output, places = [], [], [], []
    failed = 0
    for line, run in runs:
        fail = lambda k, m, line=line: TraceError(m, file=path, line=line, field=k)  # noqa: E731
        ins = _list(run, "input_lens", None, fail)
        outs = _list(run, "output_lens", len(ins), fail)
        errs = _list(run, "errors", len(ins), fail) if "errors" in run else None
        if timed:
            starts = _list(run, "start_times", len(ins), fail)
            queued = _list(run, "queue_times", len(ins), fail) if "queue_times" in run else None
        for i, (n_in, n_out) in enumerate(zip(ins, outs)):
            if errs is not None and errs[i] not in ("", None):
                if not isinstance(errs[i], str):
                    got = json.dumps(errs[i])[:40]
                    raise fail(f"errors[{i}]", f'expected a text ("" for success), got {got}')
                failed += 1
                continue
            prompt.append(_count(n_in, f"input_lens[{i}]", 1, fail))
            output.append(_count(n_out, f"output_lens[{i}]", 0, fail))
            places.append({"file": path, "line": line, "field": f"input_lens[{i}]"})
            if timed:
                t = _seconds(starts[i], f"start_times[{i}]", fail)
                wait = 0.0 if queued is None else _seconds(queued[i], f"queue_times[{i}]", fail, lo=0)
                arrival.append(t - wait)
    if not prompt:
        why = f"all {failed} requests failed" if failed else "no requests"
        raise TraceError(f"the benchmark result has {why}", file=path)
    if not timed:
        return _Rows(np.zeros(len(prompt)), np.asarray(prompt, dtype=np.int64),
                     np.asarray(output, dtype=np.int64), places.__getitem__)  # fmt: skip
    t = np.asarray(arrival)
    order = np.argsort(t, kind="stable")  # with --max-concurrency, sends are not in list order
    places = [places[j] for j in order.tolist()]
    return _Rows(t[order] - t[order[0]], np.asarray(prompt, dtype=np.int64)[order],
                 np.asarray(output, dtype=np.int64)[order], places.__getitem__)  # fmt: skip
