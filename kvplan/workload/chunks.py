"""Requests in chunks: a run of consecutive requests as numpy arrays.

Requests travel in chunks so that a million-request workload never becomes a million Python
objects at once; readers (distributions, traces) yield chunks lazily.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

CHUNK_SIZE = 65_536
MAX_TOKENS = 2**31  # tokens of one prompt or output: far above any context, far below int64 sums


@dataclass(frozen=True, slots=True)
class RequestChunk:
    """A run of consecutive requests in arrival order.

    arrival: float64 seconds (or steps when the workload has no GPU), nondecreasing across chunks.
    prompt_len, output_len: int64 token counts (prompt >= 1, output >= 0).
    hash_ids: optional per-request tuples of prefix-block hash ids (traces that carry them),
    each block covering `hash_block_size` tokens.
    cut: which of these requests the reader cut at max_model_len (counted as clipped).
    """

    arrival: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    hash_ids: list[tuple[int, ...]] | None = None
    hash_block_size: int = 0
    cut: np.ndarray | None = None  # per request: True where a trace reader cut it short
    preload: np.ndarray | None = None  # per request: prompt tokens whose KV arrives computed (a
    # disaggregated fleet's decode replicas; kvplan/fleet/run.py), at most prompt - 1

    def __len__(self) -> int:
        return len(self.prompt_len)

    def take(self, idx) -> "RequestChunk":
        """The requests at `idx` (a slice, or an array of positions in order)."""
        hashes = self.hash_ids
        if hashes is not None:
            hashes = hashes[idx] if isinstance(idx, slice) else [hashes[i] for i in np.asarray(idx).tolist()]
        return replace(self, arrival=self.arrival[idx], prompt_len=self.prompt_len[idx],
                       output_len=self.output_len[idx], hash_ids=hashes,
                       cut=None if self.cut is None else self.cut[idx],
                       preload=None if self.preload is None else self.preload[idx])
