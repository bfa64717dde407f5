"""How vLLM cuts a workload's KV pool into blocks: one rule for the serve engine, the capacity
experiment, the prefix replay and `kvplan size`.

- `usable_blocks`: vLLM keeps block 0 out of use (its null block) when `scheduler.null_block`
  is on (a workload file's default): the engines, the capacity experiment and the prefix replay
  all get their blocks here, and kvplan/model/fit.py (`kvplan size`) applies the same rule
  (tests/test_pool_rules.py ties them).
- `hybrid_rule`: for a model of several kinds of layers (sliding windows, recurrent state) with
  vLLM's hybrid KV cache manager, the layer groups of kvplan/model/vllm_kv_groups.py as the
  engines count them per request (`HybridBlocks`), and the pool in group blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.errors import WorkloadError
from kvplan.workload.records import Workload


def usable_blocks(pool_blocks: int, null_block: bool) -> int:
    """Blocks requests can use out of `pool_blocks`: all but vLLM's null block when kept."""
    return max(pool_blocks - (1 if null_block else 0), 0)


def pool_bytes(workload: Workload) -> int:
    """The KV pool in bytes (slots x bytes per slot when the file gave slots)."""
    kv = workload.pool.kv_bytes
    return kv if kv is not None else workload.pool.slots * (workload.pool.bytes_per_slot or 0)


@dataclass(frozen=True, slots=True)
class HybridBlocks:
    """vLLM's hybrid KV cache manager for the served model: per request, a block per B tokens in
    each full-attention group, the same in each sliding-window group less the blocks that fell
    out of the window, and `state` blocks of recurrent state (kvplan/model/vllm_kv_groups.py)."""

    full: int  # full-attention (and MLA) groups
    sliding: int  # sliding-window groups
    window: int  # their window (0 without)
    state: int  # state blocks per request: state groups x pages each
    kv_full: int = 1  # KV bytes per token of the layers that read every token (full, MLA)
    kv_sliding: int = 0  # KV bytes per token of the sliding-window layers, which read the window


def hybrid_rule(workload: Workload, block_size: int, grouped: bool):
    """(vLLM's groups, the rule) when the model has layers of several kinds and the hybrid KV
    cache manager is on; else None (every layer keeps every token, one group)."""
    from kvplan.model.vllm_kv_groups import is_hybrid, kv_groups

    layout = workload.layout
    if layout is None or not is_hybrid(layout):
        return None
    if not grouped:
        if any(g.kind == "state" and g.num_layers for g in layout.groups):
            raise WorkloadError("vLLM serves recurrent-state layers only with its hybrid KV cache "
                                "manager; keep hybrid_kv_cache_manager on", field="scheduler.hybrid_kv_cache_manager")
        return None
    groups = kv_groups(layout, block_size, state_pages=1)
    if groups is None:
        raise WorkloadError("vLLM cannot unify this model's page sizes into one pool (it refuses "
                            "to start)", field="model")
    sliding = [k for k in groups.kinds if k.kind == "sliding"]
    blocks = {k.block_size for k in groups.kinds if k.kind != "state"}
    if len({k.window for k in sliding}) > 1 or len(blocks) > 1:
        raise WorkloadError("layer groups with several windows or block sizes are not modelled by "
                            "the serve engine yet; set scheduler.hybrid_kv_cache_manager: false to "
                            "serve every layer as full attention", field="model")
    kv_full, kv_sliding = read_bytes(layout)
    rule = HybridBlocks(
        full=sum(k.num_groups for k in groups.kinds if k.kind in ("full", "mla")),
        sliding=sum(k.num_groups for k in sliding), window=sliding[0].window if sliding else 0,
        state=sum(k.num_groups for k in groups.kinds if k.kind == "state") * groups.state_pages,
        kv_full=kv_full, kv_sliding=kv_sliding)
    return groups, rule


def read_bytes(layout) -> tuple[int, int]:
    """KV bytes per token of the layers that read every token (full, MLA) and of the sliding-window
    layers, which read at most their window."""
    return (sum(g.bytes_per_token for g in layout.groups if g.kind in ("full", "mla")),
            sum(g.bytes_per_token for g in layout.groups if g.kind == "sliding"))
