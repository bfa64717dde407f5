"""JSON traces with token counts (ShareGPT-like conversations, kv-cache-tester agentic sessions)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import numpy as np

from kvplan.errors import TraceError
from kvplan.fileio import load_json, read_limited, text_lines
from kvplan.workload.traces._rows import MAX_JSON_BYTES, _field_int, _Rows

_ASK = {"human", "user", "system"}
_REPLY = {"gpt", "assistant", "chatgpt", "bard", "bing", "model"}


def _load_json(path: Path):
    data = read_limited(path, MAX_JSON_BYTES, TraceError, what="a JSON trace (use the .jsonl form)")
    return load_json(data, path, TraceError)


def _conversation_pairs(conv, history: bool, fail) -> Iterator[tuple[int, int]]:
    turns = conv.get("conversations") if isinstance(conv, dict) else None
    if not isinstance(turns, list):
        raise fail("conversations", "expected a list of turns")
    before = pending = 0
    for j, turn in enumerate(turns):
        role = turn.get("from") if isinstance(turn, dict) else None
        tokens = _field_int(turn, "tokens", 0, lambda k, m: fail(f"conversations[{j}].{k}", m))
        if role in _ASK:
            pending += tokens
        elif role in _REPLY:
            if pending:
                yield (before + pending if history else pending), tokens
            before, pending = before + pending + tokens, 0
        else:
            raise fail(f"conversations[{j}].from", f"unknown role {json.dumps(role)}")


def _sharegpt_conversations(path: Path) -> Iterator[tuple[dict, str, object]]:
    """(location, field prefix, conversation) from a JSON list or, streamed, a JSONL file."""
    if path.suffix == ".jsonl":
        for line, text in enumerate(text_lines(path, TraceError), 1):
            if text.strip():
                conv = load_json(text, path, TraceError, line=line)
                yield {"file": path, "line": line}, "", conv
        return
    data = _load_json(path)
    if not isinstance(data, list):
        raise TraceError("expected a JSON list of conversations", file=path)
    for i, conv in enumerate(data):
        yield {"file": path, "field": f"[{i}]"}, f"[{i}].", conv


def _read_sharegpt(path: Path, history: bool) -> _Rows:
    prompt, output, places = [], [], []
    for loc, prefix, conv in _sharegpt_conversations(path):
        line = loc.get("line")

        def fail(field, message, prefix=prefix, line=line):
            return TraceError(message, file=path, line=line, field=prefix + field)

        for p, o in _conversation_pairs(conv, history, fail):
            prompt.append(p)
            output.append(o)
            places.append(loc)
    if not prompt:
        raise TraceError("no human turn followed by a reply", file=path)
    p = np.asarray(prompt, dtype=np.int64)  # >= 1: turns of 0 tokens make no request
    return _Rows(np.zeros(len(p)), p, np.asarray(output, dtype=np.int64), places.__getitem__)


def _agentic_requests(entries, base_t: float, field: str, block: int, fail, out, depth=0):
    if not isinstance(entries, list) or depth > 8:
        raise fail(field, "expected a list of requests")
    prev = -np.inf
    for i, e in enumerate(entries):
        here = f"{field}[{i}]"
        bad = lambda k, m, here=here: fail(f"{here}.{k}", m)  # noqa: E731
        t = e.get("t") if isinstance(e, dict) else None
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < np.inf:
            raise bad("t", f"expected seconds >= 0, got {json.dumps(t)}")
        if t < prev:
            raise bad("t", f"goes backwards ({t} after {prev})")
        prev = t
        if e.get("type") == "subagent":
            _agentic_requests(e.get("requests"), base_t + t, f"{here}.requests", block, fail, out,
                              depth + 1)  # fmt: skip
            continue
        n_in, n_out = _field_int(e, "in", 1, bad), _field_int(e, "out", 0, bad)
        ids = e.get("hash_ids")
        if not isinstance(ids, list) or len(ids) != n_in // block:
            got = len(ids) if isinstance(ids, list) else json.dumps(ids)
            raise bad("hash_ids", f"expected floor(in / {block}) = {n_in // block} ids, got {got}")
        if not all(type(h) is int and h >= 0 for h in ids):
            raise bad("hash_ids", "expected integers >= 0")
        out.append((base_t + t, n_in, n_out, tuple(ids), here))


def _read_agentic(path: Path, scale: float, session_starts) -> _Rows:
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    if not files:
        raise TraceError("no *.json files in the folder", file=path)
    starts = np.zeros(len(files)) if session_starts is None else session_starts(len(files))
    rows, block, id_base = [], None, 0
    for start, file in zip(starts, files):
        doc = _load_json(file)
        fail = lambda fld, m, file=file: TraceError(m, file=file, field=fld)  # noqa: E731
        size = _field_int(doc, "block_size", 1, fail)
        if block is not None and size != block:
            raise fail("block_size", f"{size} differs from {block} in {files[0].name}")
        block, mine = size, []
        _agentic_requests(doc.get("requests"), 0.0, "requests", size, fail, mine)
        top = max((max(r[3], default=-1) for r in mine), default=-1)
        rows += [(start + t * scale, i, o, tuple(h + id_base for h in ids), (file, fld))
                 for t, i, o, ids, fld in mine]  # fmt: skip
        id_base += top + 1
    if not rows:
        raise TraceError("the trace has no requests", file=path)
    arrival = np.asarray([r[0] for r in rows])
    order = np.argsort(arrival, kind="stable")
    pick = lambda k: [rows[j][k] for j in order]  # noqa: E731
    places = pick(4)
    return _Rows(arrival[order] - arrival[order[0]], np.asarray(pick(1), dtype=np.int64),
                 np.asarray(pick(2), dtype=np.int64), lambda i: {"file": places[i][0],
                 "field": places[i][1]}, pick(3), block, hash_partial=False)  # fmt: skip
