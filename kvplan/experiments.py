"""Load a workload file with models resolved by kvplan.model, and run its experiment into a document.

The one entry point that `kvplan simulate` and `kvplan check` share: capacity, prefix and sharing
experiments go to kvplan/replay/, serve experiments to the engine in kvplan/sim/.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Sequence

from kvplan.errors import KvplanError
from kvplan.model.facts import model_facts
from kvplan.workload.records import AllocatorSpec, Workload
from kvplan.workload.schema import load_workload


def load(path: str | Path) -> Workload:
    return load_workload(path, resolve_model=model_facts)


def with_block_sizes(workload: Workload, block_sizes: Sequence[int] | None) -> Workload:
    """The workload with its paged allocators replaced by one per block size (contiguous kept)."""
    if not block_sizes:
        return workload
    kept = [s for s in workload.allocators if s.kind == "contiguous"]
    swept = [AllocatorSpec("paged", block_size=b) for b in block_sizes]
    return replace(workload, allocators=tuple(kept + swept))


def document(workload: Workload, *, block_sizes: Sequence[int] | None = None,
             cache_blocks: Sequence[int] | None = None) -> dict:
    """What `kvplan simulate --json` prints for this workload, whatever its experiment.

    Errors raised while running (settings that can never serve a request) are located in the
    workload file.
    """
    workload = with_block_sizes(workload, block_sizes)
    try:
        if workload.experiment == "capacity":
            from kvplan.replay.capacity import capacity_document

            return capacity_document(workload)
        if workload.experiment == "prefix":
            from kvplan.replay.documents import prefix_document

            return prefix_document(workload, cache_blocks)
        if workload.experiment == "sharing":
            from kvplan.replay.documents import sharing_document

            return sharing_document(workload)
        from kvplan.sim.engine import serve_document

        return serve_document(workload)
    except KvplanError as exc:
        raise exc.located(file=workload.path) from None
