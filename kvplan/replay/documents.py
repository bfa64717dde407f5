"""The `prefix` and `sharing` experiments of a workload: parse their sections, run, and document.

experiment: prefix replays the request stream (a trace with block hashes, or synthetic requests
given shared prefixes by the `prefix:` section) through a prefix cache of each paged allocator's
blocks (pool slots // B, or each of `cache_blocks`). experiment: sharing runs the workload's
prompt and output lengths as parallel-sampling or beam-search groups (the `sampling:` section).
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from kvplan.errors import KvplanError, TraceError, WorkloadError
from kvplan.replay.prefix import POPULARITY, PrefixSpec, hit_rate_sweep, with_prefixes
from kvplan.replay.sharing import MODES, PARENTS, sharing_savings
from kvplan.workload.records import MAX_TOKENS, Workload
from kvplan.workload.yaml_nodes import YamlList, YamlMap, as_int

PREFIX_KEYS = ("system_prompts", "system_prompt_len", "popularity", "zipf_a", "turns", "sessions",
               "hash_block_size", "max_prompt_len")
REPLAY_KEYS = ("max_running", "hold_output")


def _section(workload: Workload, key: str) -> YamlMap | None:
    return workload.extras.get("yaml_nodes", {}).get(key)


def _paged_sizes(workload: Workload) -> list[int]:
    sizes = [a.block_size for a in workload.allocators if a.kind == "paged"]
    if not sizes:
        raise WorkloadError(f"the {workload.experiment} experiment needs a paged allocator",
                            file=workload.path, field="allocators")
    return sizes


def _prefix_options(workload: Workload) -> tuple[PrefixSpec | None, dict]:
    node = _section(workload, "prefix")
    if node is None:
        return None, {}
    node.expect_keys(*PREFIX_KEYS, *REPLAY_KEYS)
    replay = {"max_running": node.get_int("max_running", 1, ge=1, le=1_000_000),
              "hold_output": node.get_bool("hold_output", False)}
    synthetic = _synthetic_keys(node, workload.scheduler.max_model_len)
    if not synthetic:
        return None, replay
    try:
        return PrefixSpec(**synthetic), replay
    except KvplanError as exc:
        key = (exc.field or "").removeprefix("prefix.")
        where = node.node(key) if key in node else node
        raise WorkloadError(exc.message, file=workload.path, field=f"prefix.{key}" if key else "prefix",
                            line=where.line) from None


# prefix: key -> how the YAML number rules read it (as every other section does)
_INT_KEYS = {"system_prompts": 0, "turns": 1, "sessions": 1, "hash_block_size": 1, "max_prompt_len": 1}
MAX_PREFIX_COUNT = 1 << 20  # system prompts, sessions, turns: beyond a million nothing changes


def _synthetic_keys(node: YamlMap, max_model_len: int) -> dict:
    """The synthetic-prefix keys present, read with the YAML number rules (2e0 and 8.0 are 2
    and 8). A conversation stops growing at max_prompt_len, by default the context
    (max_model_len): vLLM could not serve a longer prompt, and the hash ids of every turn stay
    bounded."""
    out: dict = {}
    for key, lo in _INT_KEYS.items():
        if key in node:
            out[key] = node.get_int(key, ge=lo, le=max_model_len if key == "max_prompt_len" else MAX_PREFIX_COUNT)
    if "system_prompt_len" in node:
        lens = node.node("system_prompt_len")
        out["system_prompt_len"] = (tuple(as_int(n, ge=1, le=MAX_TOKENS) for n in node.get_list("system_prompt_len"))
                                    if isinstance(lens, YamlList) else node.get_int("system_prompt_len", ge=1, le=MAX_TOKENS))
    if "popularity" in node:
        out["popularity"] = node.get_choice("popularity", POPULARITY)
    if "zipf_a" in node:
        out["zipf_a"] = node.get_float("zipf_a", gt=0, le=100)
    if out:
        out.setdefault("max_prompt_len", max_model_len)
    return out


def prefix_document(workload: Workload, cache_blocks: Sequence[int] | None = None) -> dict:
    """Hit rates (vLLM's definitions) per paged block size, and per cache size when swept."""
    spec, replay = _prefix_options(workload)

    def make_chunks():
        chunks = workload.make_requests()
        if spec is not None:
            chunks = with_prefixes(chunks, spec, np.random.default_rng([workload.seed, 0xCAC4E]))
        return chunks

    results = []
    for block_size in _paged_sizes(workload):
        sizes = list(cache_blocks) if cache_blocks else [workload.pool.slots // block_size]
        try:
            runs = hit_rate_sweep(make_chunks, sizes, block_size, **replay)
        except TraceError:
            raise  # a bad row of the trace: it names the trace file, its line and its field
        except KvplanError as exc:  # a block size the trace's hash blocks do not divide
            raise exc.located(file=workload.path, field="allocators") from None
        results += [_prefix_row(r) for r in runs]
    return {"workload": workload.name, "experiment": "prefix", "num_requests": workload.num_requests,
            "pool_slots": workload.pool.slots, "replay": replay,
            "prefix": spec.to_dict() if spec else None, "results": results}


def _prefix_row(run) -> dict:
    stats = run.stats.to_dict()
    return {"allocator": "paged", "label": f"paged-B{run.block_size}", "block_size": run.block_size,
            "cache_blocks": run.num_blocks, "cache_tokens": run.cache_tokens, "requests": run.requests,
            "skipped": run.skipped, "queries": stats["queries"], "hits": stats["hits"],
            "hit_rate": run.hit_rate, "prefill_tokens_saved": stats["prefill_tokens_saved"],
            "blocks_evicted": stats["blocks_evicted"]}


def sharing_document(workload: Workload) -> dict:
    """Blocks saved by fork and copy-on-write for each mode, width and paged block size."""
    node = _section(workload, "sampling")
    if node is None:
        raise WorkloadError("the sharing experiment needs a sampling section, e.g. "
                            "{mode: beam, widths: [2, 4, 6]}", file=workload.path, field="sampling")
    node.expect_keys("mode", "widths", "parent")
    mode = node.get_choice("mode", (*MODES, "both"), "both")
    widths = [as_int(w, ge=1, le=64) for w in node.get_list("widths")] if "widths" in node else [2, 4, 6]
    parent = node.get_choice("parent", PARENTS, "random")
    prompts, outputs = _lengths(workload.make_requests())
    modes = MODES if mode == "both" else (mode,)
    rows = []
    for block_size in _paged_sizes(workload):
        for m in modes:
            for w in widths:
                rng = np.random.default_rng([workload.seed, w, block_size])
                r = sharing_savings(m, w, prompts, outputs, block_size, rng, parent=parent)
                rows.append({"allocator": "paged", "label": f"paged-B{block_size}", "block_size": block_size,
                             "mode": m, "width": w, "groups": r.groups, "parent": r.parent,
                             "saving": r.saving, "peak_saving": r.peak_saving})
    return {"workload": workload.name, "experiment": "sharing", "num_requests": workload.num_requests,
            "results": rows}


def _lengths(chunks: Iterable) -> tuple[np.ndarray, np.ndarray]:
    prompts, outputs = [], []
    for chunk in chunks:
        prompts.append(chunk.prompt_len)
        outputs.append(np.maximum(chunk.output_len, 1))
    return np.concatenate(prompts), np.concatenate(outputs)
