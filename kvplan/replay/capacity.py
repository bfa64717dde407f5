"""The capacity experiment on a workload: every request at its final length, admitted greedily.

This is the lesson's experiment (and its portfolio project's block-size sweep) run on the
workload's own request stream and pool, through the closed forms of `kvplan.memory.capacity`.
"""

from __future__ import annotations

from dataclasses import dataclass
import numpy as np

from kvplan.memory.capacity import CapacityResult, contiguous_capacity, paged_capacity_sweep
from kvplan.workload.records import AllocatorSpec, Workload


@dataclass(frozen=True, slots=True)
class CapacityRun:
    """One allocator's result in the capacity experiment, with the spec that produced it."""

    spec: AllocatorSpec
    result: CapacityResult

    def to_dict(self, pool_slots: int, baseline_admitted: int | None) -> dict:
        r, b = self.result, self.result.breakdown
        out = {
            "allocator": self.spec.kind,
            "label": self.spec.label,
            "policy": self.spec.policy,
            "block_size": self.spec.block_size,
            "admitted": r.admitted,
            "allocated_slots": r.allocated_slots,
            "tokens_stored": r.tokens_stored,
            "wasted_slots": r.wasted_slots,
            "utilization": r.utilization,
            "memory_breakdown": {
                "token_states": b.token_states / pool_slots,
                "reserved": b.reserved / pool_slots,
                "internal": b.internal_fragmentation / pool_slots,
                "external": b.external_fragmentation / pool_slots,
                "free": b.free / pool_slots,
            },
        }
        out["admitted_vs_first_contiguous"] = r.admitted / baseline_admitted if baseline_admitted else None
        return out


def final_lengths(workload: Workload) -> np.ndarray:
    """prompt + output of every request, in arrival order."""
    parts = [chunk.prompt_len + chunk.output_len for chunk in workload.make_requests()]
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


def run_capacity(workload: Workload) -> list[CapacityRun]:
    """Each allocator of the workload on the same stream of final lengths."""
    lengths = final_lengths(workload)
    slots = workload.pool.slots
    specs = list(workload.allocators)
    paged_sizes = [s.block_size for s in specs if s.kind == "paged"]
    paged = dict(zip(paged_sizes, paged_capacity_sweep(lengths, slots, paged_sizes)))
    runs = []
    for spec in specs:
        if spec.kind == "contiguous":
            limit = spec.max_len or workload.contiguous_max_len
            result = contiguous_capacity(lengths, slots, spec.policy, limit)
        else:
            result = paged[spec.block_size]
        runs.append(CapacityRun(spec, result))
    return runs


def capacity_document(workload: Workload) -> dict:
    """The JSON document of `kvplan simulate` for a capacity experiment (stable keys)."""
    runs = run_capacity(workload)
    first = next((r.result.admitted for r in runs if r.spec.kind == "contiguous"), None)
    slots = workload.pool.slots
    return {"workload": workload.name, "experiment": "capacity", "pool_slots": slots,
            "num_requests": workload.num_requests, "results": [r.to_dict(slots, first) for r in runs]}
