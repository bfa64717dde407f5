"""The capacity experiment on a workload: every request at its final length, admitted greedily.

This is the lesson's experiment (and its portfolio project's block-size sweep) run on the
workload's own request stream and pool, through the closed forms of `kvplan.memory.capacity`.
"""

from __future__ import annotations

from dataclasses import dataclass
import numpy as np

from kvplan.memory.capacity import (CapacityResult, contiguous_capacity, grouped_capacity,
                                    paged_capacity_sweep)
from kvplan.workload.pool_rules import hybrid_rule, pool_bytes, usable_blocks
from kvplan.workload.records import Workload
from kvplan.workload.spec import AllocatorSpec


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
            "memory_breakdown": {  # of the pool this allocator cuts (group blocks for hybrid models)
                "token_states": b.token_states / b.total,
                "reserved": b.reserved / b.total,
                "internal": b.internal_fragmentation / b.total,
                "external": b.external_fragmentation / b.total,
                "free": b.free / b.total,
            },
        }
        out["admitted_vs_first_contiguous"] = r.admitted / baseline_admitted if baseline_admitted else None
        return out


def final_lengths(workload: Workload) -> np.ndarray:
    """prompt + output of every request, in arrival order."""
    parts = [chunk.prompt_len + chunk.output_len for chunk in workload.make_requests()]
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


def run_capacity(workload: Workload) -> list[CapacityRun]:
    """Each allocator of the workload on the same stream of final lengths. Paged pools follow the
    serve engine's rules (kvplan/workload/pool_rules.py): vLLM's null block, and for a model of
    several kinds of layers its hybrid groups, each request counted at its final length."""
    lengths = final_lengths(workload)
    slots = workload.pool.slots
    sched = workload.scheduler
    specs = list(workload.allocators)
    paged_sizes = [s.block_size for s in specs if s.kind == "paged"]
    paged = dict(zip(paged_sizes, paged_capacity_sweep(lengths, slots, paged_sizes, null_block=sched.null_block)))
    runs = []
    for spec in specs:
        if spec.kind == "contiguous":
            limit = spec.max_len or workload.contiguous_max_len
            result = contiguous_capacity(lengths, slots, spec.policy, limit)
        else:
            grouped = sched.hybrid_kv_cache_manager if spec.hybrid is None else spec.hybrid
            hybrid = hybrid_rule(workload, spec.block_size, grouped)
            result = paged[spec.block_size] if hybrid is None else _hybrid_capacity(workload, lengths, *hybrid)
        runs.append(CapacityRun(spec, result))
    return runs


def _hybrid_capacity(workload: Workload, lengths: np.ndarray, groups, rule) -> CapacityResult:
    """Requests at final length L in vLLM's layer groups: a sliding group keeps the blocks from
    the one holding token L - window on (its blocks wholly before are released)."""
    b = groups.attention_block_size
    pool_blocks = groups.num_blocks(pool_bytes(workload))
    full = -(-lengths // b)
    skip = np.maximum(lengths - rule.window, 0) // b if rule.sliding else np.zeros_like(lengths)
    cost = rule.full * full + rule.sliding * (full - skip) + rule.state
    kept = rule.full * lengths + rule.sliding * (lengths - skip * b) + rule.state * b
    return grouped_capacity(cost, kept, usable_blocks(pool_blocks, workload.scheduler.null_block), b,
                            pool_blocks * b, f"paged-B{b}")


def capacity_document(workload: Workload) -> dict:
    """The JSON document of `kvplan simulate` for a capacity experiment (stable keys)."""
    runs = run_capacity(workload)
    first = next((r.result.admitted for r in runs if r.spec.kind == "contiguous"), None)
    slots = workload.pool.slots
    return {"workload": workload.name, "experiment": "capacity", "pool_slots": slots,
            "num_requests": workload.num_requests, "results": [r.to_dict(slots, first) for r in runs]}
