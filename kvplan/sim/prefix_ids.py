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

Memory stays bounded on a stream of any length: a node that no open request's prompt names, that
the engine caches no copy of, and that lies on no path to such a node can never be told apart from
a node made new, so the engine holding the trie drops those now and then (`compact`, once the trie
has grown COMPACT_GROWTH-fold since) and renumbers the rest in their old order; nothing it computes
depends on a node's number, only on which are equal, and the results are the same to the byte.
The engines also drop the identities of finished requests, and are fed long chunks in pieces
(inputs.id_pieces), so what is open stays a few hundred thousand identities.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import compress

import numpy as np

from kvplan.errors import WorkloadError
from kvplan.workload.prefixes import blocks_per_hash
from kvplan.workload.chunks import RequestChunk

COMPACT_FLOOR = 1 << 16  # nodes (and identity entries) an engine keeps before it first compacts
COMPACT_GROWTH = 4  # and it compacts again once they are this many times what it kept last
COMPACT_DROP = 0.5  # and renumbers only when at least this share of the nodes can go
_SHIFT = 40  # a node's key: its hash id above this many bits, its parent + 1 below


def worth_dropping(live: int, total: int) -> bool:
    """Whether compacting `total` items of which `live` stay frees enough to pay for the copy:
    at least COMPACT_DROP of them."""
    return total > 0 and total - live >= COMPACT_DROP * total


def compaction_due(count: int, kept: int) -> bool:
    """Whether `count` items (nodes, identity entries), `kept` at the last compaction, are enough
    to compact again: COMPACT_GROWTH x kept, COMPACT_FLOOR at least (O(1) work per item made)."""
    return count >= max(COMPACT_FLOOR, COMPACT_GROWTH * kept)


@dataclass(frozen=True, slots=True)
class ChunkIds:
    """The identities of one chunk's requests: trie nodes, concatenated in request order, and
    how many each request has (its identity blocks are counts x per simulated blocks)."""

    nodes: np.ndarray  # int64
    counts: np.ndarray  # int64, one per request
    per: int  # simulated blocks per hash block (H / B)
    trie: PrefixTrie  # the trie that numbered them
    epoch: int  # its compactions before they were numbered (a later one renumbers them)


class PrefixTrie:
    """Hash-id chains to trie nodes, kept across the chunks of one run.

    A node's key is one int, hash id << 40 | (parent + 1) (parent -1: the root; fewer than 2^40
    nodes): one to one, like the pair (parent, hash id), in less than half a pair's memory."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.children: dict[int, int] = {}  # key(parent node, hash id) -> node
        self.parents: list[int] = []  # per node, its parent (-1: the root)
        self.hash_block_size: int | None = None
        self.epoch = 0  # compactions so far
        self.kept = 0  # nodes the last compaction kept

    @property
    def num_nodes(self) -> int:
        return len(self.children)

    def child(self, parent: int, hash_id: int) -> int | None:
        """The node of hash id `hash_id` below node `parent` (-1: the root), if there is one."""
        return self.children.get(int(hash_id) << _SHIFT | (parent + 1))

    def crowded(self) -> bool:
        """Whether the trie has grown enough since its last compaction to compact again."""
        return compaction_due(len(self.children), self.kept)

    def compact(self, live: np.ndarray) -> np.ndarray | None:
        """Keep the nodes `live` marks (bool, one per node) and every ancestor of one, numbered
        0, 1, ... in their old order; drop the rest. Returns the old number -> the new (-1:
        dropped), for the engine to renumber what it holds; None, leaving every number as it
        is, when fewer than COMPACT_DROP of the nodes are not live (the work would buy little)."""
        n = len(self.parents)
        alive = int(np.count_nonzero(live))
        if not worth_dropping(alive, n):
            self.kept = alive
            return None
        parent = np.array(self.parents, dtype=np.int64)
        keep = np.asarray(live, dtype=bool).copy()
        front = np.flatnonzero(keep)
        while len(front):  # up the paths, one level a pass, until every ancestor is kept
            up = parent[front]
            up = up[up >= 0]
            front = np.unique(up[~keep[up]])
            keep[front] = True
        kept = np.flatnonzero(keep)
        remap = np.full(n, -1, dtype=np.int64)
        remap[kept] = np.arange(len(kept), dtype=np.int64)
        up = parent[kept]
        self.parents = np.where(up >= 0, remap[np.maximum(up, 0)], -1).tolist()
        keys = compress(self.children, keep.tolist())  # the dict's order is the nodes' order
        self.children = dict(zip([(k >> _SHIFT << _SHIFT) | (p + 1) for k, p in zip(keys, self.parents)],
                                 range(len(kept))))
        self.kept, self.epoch = len(kept), self.epoch + 1
        return remap

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
        children, parents, nodes = self.children, self.parents, []
        counts = np.zeros(len(prompt), dtype=np.int64)
        for i, (ids, p) in enumerate(zip(chunk.hash_ids, prompt.tolist())):
            parent = -1
            kept = min(len(ids), p // size) if ids else 0
            if kept and type(ids[0]) is not int:  # numpy integers would overflow the shift
                ids = tuple(map(int, ids))
            for h in ids[:kept]:
                key = h << _SHIFT | (parent + 1)
                node = children.get(key)
                if node is None:
                    node = children[key] = len(parents)
                    parents.append(parent)
                nodes.append(node)
                parent = node
            counts[i] = kept
        return ChunkIds(np.asarray(nodes, dtype=np.int64), counts, size // self.block_size, self, self.epoch)
