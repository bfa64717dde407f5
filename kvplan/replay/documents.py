"""The `prefix` and `sharing` experiments of a workload: run its sections and document them.

experiment: prefix replays the request stream (a trace with block hashes, or synthetic requests
given shared prefixes by the `prefix:` section) through a prefix cache of each paged allocator's
blocks (pool slots // B less vLLM's null block, as every engine counts them; or each of
`cache_blocks`). experiment: sharing runs the workload's
prompt and output lengths as parallel-sampling or beam-search groups (the `sampling:` section).
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from kvplan.errors import KvplanError, TraceError, WorkloadError
from kvplan.replay.prefix import LARGE_CACHE, hit_rate_sweep, stats_dict
from kvplan.workload.pool_rules import usable_blocks
from kvplan.workload.prefixes import prefix_options, request_stream
from kvplan.replay.sharing import MODES, sharing_savings
from kvplan.workload.records import Workload

def _paged_sizes(workload: Workload) -> list[int]:
    sizes = [a.block_size for a in workload.allocators if a.kind == "paged"]
    if not sizes:
        raise WorkloadError(f"the {workload.experiment} experiment needs a paged allocator",
                            file=workload.path, field="allocators")
    return sizes


def prefix_document(workload: Workload, cache_blocks: Sequence[int] | None = None, *, progress=None) -> dict:
    """Hit rates (vLLM's definitions) per paged block size, and per cache size when swept;
    `progress(requests read, requests every replay reads)` as the stream is read."""
    spec, replay = prefix_options(workload)
    blocks = _paged_sizes(workload)
    sizes_of = {b: (list(cache_blocks) if cache_blocks
                    else [usable_blocks(workload.pool.slots // b, workload.scheduler.null_block)]) for b in blocks}
    # every replay reads the stream once, and a sweep past LARGE_CACHE once more to size its cache
    passes = sum(len(s) + (max(s) > LARGE_CACHE) for s in sizes_of.values())
    read = [0]

    def make_chunks():
        for chunk in request_stream(workload):
            read[0] += len(chunk)
            if progress is not None:
                progress(read[0], passes * workload.num_requests)
            yield chunk

    results = []
    for block_size in blocks:
        sizes = sizes_of[block_size]
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
    stats = stats_dict(run.stats)
    return {"allocator": "paged", "label": f"paged-B{run.block_size}", "block_size": run.block_size,
            "cache_blocks": run.num_blocks, "cache_tokens": run.cache_tokens, "requests": run.requests,
            "skipped": run.skipped, "queries": stats["queries"], "hits": stats["hits"],
            "hit_rate": run.hit_rate, "prefill_tokens_saved": stats["prefill_tokens_saved"],
            "blocks_evicted": stats["blocks_evicted"]}


def sharing_document(workload: Workload, *, progress=None) -> dict:
    """Blocks saved by fork and copy-on-write for each mode, width and paged block size;
    `progress(groups done, groups in all)` as they run."""
    sampling = workload.sampling
    if sampling is None:
        raise WorkloadError("the sharing experiment needs a sampling section, e.g. "
                            "{mode: beam, widths: [2, 4, 6]}", file=workload.path, field="sampling")
    mode, widths, parent = sampling.mode, sampling.widths, sampling.parent
    prompts, outputs = _lengths(workload.make_requests())
    modes = MODES if mode == "both" else (mode,)
    rows = []
    blocks = _paged_sizes(workload)
    runs, total = 0, len(blocks) * len(modes) * len(widths) * len(prompts)
    for block_size in blocks:
        for m in modes:
            for w in widths:
                rng = np.random.default_rng([workload.seed, w, block_size])
                done = runs * len(prompts)
                hook = None if progress is None else (lambda g, done=done: progress(done + g, total))
                r = sharing_savings(m, w, prompts, outputs, block_size, rng, parent=parent, progress=hook)
                runs += 1
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
