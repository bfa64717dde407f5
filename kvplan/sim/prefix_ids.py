"""Block identities for prefix caching in the serve engines: chained hash ids as dense trie nodes.

vLLM names a full block by a hash chained over every block before it, so two requests share a
block only behind an identical prefix. A trace (or the synthetic `prefix:` section) gives one
hash id per H prompt tokens; here each distinct chain of ids becomes one node of a trie, numbered
0, 1, 2, ... in order of first appearance: node(parent, id), with the root's children for a
prompt's first block. Equal nodes mean equal prefixes, and there are no collisions to worry
about (the key is compared, not hashed). A simulated block of B tokens (B divides H) is then
identified by (node, sub-block): `node * (H / B) + sub`, the "block node" the engines cache.

Only full hash blocks inside the (clipped) prompt count, as in the prefix replay
(kvplan/replay/prefix.py): a partial last block and every output token are unique to their
request and never cached.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvplan.errors import WorkloadError
from kvplan.workload.prefixes import blocks_per_hash
from kvplan.workload.chunks import RequestChunk


@dataclass(frozen=True, slots=True)
class ChunkIds:
    """The identities of one chunk's requests: trie nodes, concatenated in request order, and
    how many each request has (its identity blocks are counts x per simulated blocks)."""

    nodes: np.ndarray  # int64
    counts: np.ndarray  # int64, one per request
    per: int  # simulated blocks per hash block (H / B)


class PrefixTrie:
    """Hash-id chains to trie nodes, kept across the chunks of one run."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.children: dict[tuple[int, int], int] = {}  # (parent node, hash id) -> node; root -1
        self.hash_block_size: int | None = None

    @property
    def num_nodes(self) -> int:
        return len(self.children)

    def encode(self, chunk: RequestChunk, prompt: np.ndarray) -> ChunkIds | None:
        """The chunk's identities for prompts clipped to `prompt`; None without hash ids."""
        if chunk.hash_ids is None:
            return None
        size = chunk.hash_block_size
        if self.hash_block_size is None:
            try:
                blocks_per_hash(size, self.block_size)
            except Exception as exc:  # a KvplanError naming both sizes
                raise WorkloadError(str(exc), field="allocators.block_size") from None
            self.hash_block_size = size
        elif size != self.hash_block_size:
            raise WorkloadError(f"hash blocks of {size} tokens after {self.hash_block_size} earlier in "
                                "the same stream", field="requests")
        children, nodes = self.children, []
        counts = np.zeros(len(prompt), dtype=np.int64)
        for i, (ids, p) in enumerate(zip(chunk.hash_ids, prompt.tolist())):
            parent = -1
            kept = min(len(ids), p // size) if ids else 0
            for h in ids[:kept]:
                key = (parent, h)
                node = children.get(key)
                if node is None:
                    node = children[key] = len(children)
                nodes.append(node)
                parent = node
            counts[i] = kept
        return ChunkIds(np.asarray(nodes, dtype=np.int64), counts, size // self.block_size)
