"""The KV cache groups vLLM's hybrid KV cache manager builds for a layout, and what it logs.

vLLM V1 gives every layer a KV cache spec (vllm/v1/kv_cache_interface.py) and, for a model
with more than one kind of layer, splits the layers into groups of equal size that share one
pool of equal pages (vllm/v1/core/kv_cache_utils.py, `_get_kv_cache_groups_uniform_page_size`;
the block-size alignment for Mamba-style state is `_align_hybrid_block_size` in
vllm/platforms/interface.py). The rules, as this module applies them:

- Page sizes must be equal. With recurrent-state layers (Mamba, gated DeltaNet) the attention
  block grows to the fewest tokens, a multiple of the kernel alignment (16: the block size and
  FlashAttention's MultipleOf(16)), whose page holds one layer's state:
  block = 16 x ceil(state_page / (16 x attention bytes per token)); the state page is padded up
  to the attention page. Attention layers of a smaller page get a proportionally larger block.
- Layers of one kind (one spec: kind and window) form groups of `group_size` layers: the fewest
  layers of any kind, or the most when that is under 1.5x the fewest (so 12 + 13 pads to 13 + 13
  rather than 12 + 24). One block holds a page of every layer of a group, so
  num_blocks = pool // (page x group_size).
- One request of max_model_len L needs, per group: ceil(L / block) blocks for full attention
  (MLA alike); ceil(min(window - 1 + max_num_batched_tokens, L) / block) + 1 for a sliding
  window; for recurrent state 1 page, or 2 when prefix caching keeps a checkpoint of the state
  (vLLM's mamba_cache_mode "align", its default when prefix caching is on).
- "Maximum concurrency" = num_blocks / the blocks one request needs. "GPU KV cache size" is
  int(concurrency x L), the group-aware capacity, in recent releases (a vLLM 0.24 log of a
  gated-DeltaNet hybrid prints 567,978 tokens at 4.33x of 131,072) and num_blocks // groups x
  the smallest block in older ones (a 0.13 log of gemma-3-1b-it: 950,864 tokens at 461.21x of
  2,048); vllm_memory.ReleaseRules says which.
- A request of max_model_len fits when group_size x page x its blocks <= the pool; otherwise
  vLLM refuses to start and names the longest length that would fit (found by bisection).

A layout of one kind of layer is one group of every layer, and these rules then give exactly
the plain paged arithmetic of kvplan/model/fit.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.model.layout import KVLayout

KERNEL_ALIGNMENT = 16  # FlashAttention's supported kernel block sizes: MultipleOf(16)
GROUP_PAD_RATIO = 1.5  # use the largest kind as group size when it is under 1.5x the smallest


@dataclass(frozen=True, slots=True)
class KindGroup:
    """The KV cache groups of one kind of layer."""

    kind: str  # "full", "sliding", "mla" or "state"
    window: int | None
    num_groups: int
    block_size: int  # tokens per block (0 for state)


@dataclass(frozen=True, slots=True)
class KVGroups:
    page: int  # bytes of one block of one layer, equal for every group
    group_size: int  # layers per group
    kinds: tuple[KindGroup, ...]
    attention_block_size: int  # the block size vLLM sets for attention (the user's, or larger)
    state_pages: int  # pages one request keeps per state group (1, or 2 with prefix caching)

    @property
    def num_groups(self) -> int:
        return sum(k.num_groups for k in self.kinds)

    def num_blocks(self, pool: int) -> int:
        return max(pool, 0) // (self.page * self.group_size)

    def blocks_per_request(self, max_model_len: int, batched_tokens: int) -> int:
        total = 0
        for k in self.kinds:
            if k.kind == "state":
                need = self.state_pages
            elif k.kind == "sliding":
                need = -(-min(k.window - 1 + batched_tokens, max_model_len) // k.block_size) + 1
            else:
                need = -(-max_model_len // k.block_size)
            total += k.num_groups * need
        return total

    def request_bytes(self, max_model_len: int, batched_tokens: int) -> int:
        """What vLLM's start-up check charges one request of max_model_len."""
        return self.group_size * self.page * self.blocks_per_request(max_model_len, batched_tokens)

    def concurrency(self, pool: int, max_model_len: int, batched_tokens: int) -> float:
        return self.num_blocks(pool) / self.blocks_per_request(max_model_len, batched_tokens)

    def kv_cache_tokens(self, pool: int, max_model_len: int, batched_tokens: int, group_aware: bool = True) -> int:
        if group_aware:
            return int(self.concurrency(pool, max_model_len, batched_tokens) * max_model_len)
        smallest = min((k.block_size for k in self.kinds if k.block_size), default=self.attention_block_size)
        return self.num_blocks(pool) // self.num_groups * smallest

    def longest_context(self, pool: int, batched_tokens: int, limit: int) -> int:
        """The longest max_model_len, up to `limit`, whose request fits in `pool` (0 if none)."""
        return longest_fitting(lambda n: self.request_bytes(n, batched_tokens), pool, limit)


def longest_fitting(cost, budget: int, limit: int) -> int:
    """The largest n in 1..limit with cost(n) <= budget, for a cost that grows with n (0 if none):
    vLLM's bisection for the longest max_model_len that fits."""
    if cost(1) > budget:
        return 0
    if cost(limit) <= budget:
        return limit
    lo, hi = 1, limit
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        if cost(mid) <= budget:
            lo = mid
        else:
            hi = mid
    return lo


def kv_groups(layout: KVLayout, block_size: int, state_pages: int = 1) -> KVGroups | None:
    """vLLM's KV cache groups for `layout` with --block-size `block_size`, a request keeping
    `state_pages` pages per recurrent-state group; None when the layout keeps nothing or its page
    sizes cannot be unified (vLLM refuses such a model)."""
    kinds: dict[tuple[str, int | None], list[int]] = {}  # (kind, window) -> [layers, bytes/token or state]
    for g in layout.groups:
        if not g.num_layers:
            continue
        key = (g.kind, g.window if g.kind == "sliding" else None)
        per_layer = g.state_bytes // g.num_layers if g.kind == "state" else g.bytes_per_token_per_layer
        entry = kinds.setdefault(key, [0, per_layer])
        if entry[1] != per_layer:
            return None  # one kind of layer with two shapes: not a layout vLLM groups this way
        entry[0] += g.num_layers
    attention = {k: v for k, v in kinds.items() if k[0] != "state"}
    states = [v[1] for k, v in kinds.items() if k[0] == "state"]
    if not kinds or any(per <= 0 for _, per in kinds.values()):
        return None
    block = block_size
    if attention:
        per_token = max(per for _, per in attention.values())
        if states:
            state_page = max(states)
            align = max(KERNEL_ALIGNMENT, block_size)
            block = max(block, align * -(-state_page // (align * per_token)))
        page = block * per_token
        for _, per in attention.values():
            if page % (per * block):
                return None  # pages that no whole block size unifies
    else:
        page = max(states)
    counts = [n for n, _ in kinds.values()]
    fewest, most = min(counts), max(counts)
    group_size = most if most < fewest * GROUP_PAD_RATIO else fewest
    groups = tuple(
        KindGroup(kind, window, -(-n // group_size), 0 if kind == "state" else page // per)
        for (kind, window), (n, per) in kinds.items()
    )
    return KVGroups(page=page, group_size=group_size, kinds=groups, attention_block_size=block,
                    state_pages=state_pages)


def is_hybrid(layout: KVLayout) -> bool:
    """Layers of more than one kind, recurrent state, or sliding-window layers (alone too: vLLM's
    sliding-window manager holds a request's window plus a batch of blocks, not its whole length;
    Phi-3-mini's log, 35,648 tokens and 8.67x at 4,096, is that rule): vLLM's grouping applies.
    (Full-attention layers at several shapes share one group with a page per layer, the plain
    arithmetic.)"""
    kinds = {(g.kind, g.window) for g in layout.groups if g.num_layers}
    return len(kinds) > 1 or any(kind in ("state", "sliding") for kind, _ in kinds)
