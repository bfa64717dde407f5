"""Shared prompt prefixes of a request stream: the `prefix:` section and trace hash blocks.

`PrefixSpec` (kvplan/workload/spec.py) holds the `prefix:` section key for key (system prompts,
their popularity, multi-turn conversations); `with_prefixes(chunks, spec, rng)` rewrites a request stream lazily so
that prompts start with them, attaching hash ids; `synthetic_prefixes` does the same for plain
arrays; `request_stream(workload)` is a workload's requests with its section applied, as both the
prefix replay (kvplan/replay/) and the serve engine (kvplan/sim/) read them. `blocks_per_hash`
maps a trace's hash blocks onto simulated blocks.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np

from kvplan.errors import KvplanError
from kvplan.workload.chunks import RequestChunk
from kvplan.workload.records import Workload
from kvplan.workload.spec import PrefixSpec


def blocks_per_hash(hash_block_size: int, block_size: int) -> int:
    """H / B: simulated blocks per trace hash block; a KvplanError unless B divides H."""
    if hash_block_size < 1 or block_size < 1 or hash_block_size % block_size:
        raise KvplanError(f"block size {block_size} does not divide the trace's hash block size "
                          f"{hash_block_size}: each trace block must map onto whole simulated "
                          f"blocks (use a block size that divides {hash_block_size})")  # fmt: skip
    return hash_block_size // block_size



# ---- synthetic shared prefixes ---------------------------------------------------------------


class _Conversation:
    """One conversation's token history as hash ids of its full blocks plus a partial tail."""

    __slots__ = ("ids", "length", "turns")

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.length = self.turns = 0


class PrefixGenerator:
    """Rewrites requests' prompts to start with shared prefixes (see PrefixSpec).

    Hash ids: full blocks of a system prompt get ids fixed per (prompt, block); every other
    block (the one straddling the end of a system prompt, messages, answers) gets a fresh id,
    kept by its conversation for later turns. Equal ids therefore mean equal content behind
    equal prefixes, as in the traces.
    """

    def __init__(self, spec: PrefixSpec, rng: np.random.Generator) -> None:
        self.spec, self.rng = spec, rng
        h, lens = spec.hash_block_size, spec.system_prompt_len
        self._sys_base = np.concatenate(([0], np.cumsum([n // h for n in lens], dtype=np.int64))).astype(np.int64).tolist()
        self._next_id = self._sys_base[-1]
        weights = (np.arange(1, len(lens) + 1, dtype=float) ** -spec.zipf_a
                   if spec.popularity == "zipf" else np.ones(len(lens)))  # fmt: skip
        self._weights = weights / weights.sum() if len(lens) else weights
        self._open: list[_Conversation | None] = [None] * (spec.sessions if spec.turns > 1 else 1)

    def _fresh(self, n: int) -> list[int]:
        self._next_id += n
        return list(range(self._next_id - n, self._next_id))

    def _push(self, conv: _Conversation, tokens: int) -> None:
        """Append `tokens` unique tokens to the conversation."""
        h = self.spec.hash_block_size
        conv.ids += self._fresh((conv.length + tokens) // h - conv.length // h)
        conv.length += tokens

    def _start(self, k: int) -> _Conversation:
        """A new conversation opening with system prompt k (none without system prompts)."""
        conv = _Conversation()
        if self.spec.system_prompts:
            conv.ids = list(range(self._sys_base[k], self._sys_base[k + 1]))
            conv.length = self.spec.system_prompt_len[k]
        return conv

    def apply(self, chunk: RequestChunk) -> RequestChunk:
        """The chunk with prompts lengthened by their prefixes and hash ids attached."""
        spec, limit = self.spec, self.spec.max_prompt_len
        prompts, outputs = chunk.prompt_len.tolist(), chunk.output_len.tolist()
        n = len(prompts)
        slots = self.rng.integers(len(self._open), size=n).tolist()
        system = (self.rng.choice(spec.system_prompts, size=n, p=self._weights).tolist()
                  if spec.system_prompts else [0] * n)  # fmt: skip
        new_len, ids = [], []
        for own, answer, slot, k in zip(prompts, outputs, slots, system):
            conv = self._open[slot]
            if conv is None or (limit is not None and conv.length + own > limit):
                conv = self._open[slot] = self._start(k)
            self._push(conv, own)
            length = conv.length if limit is None else min(conv.length, limit)
            new_len.append(length)
            ids.append(tuple(conv.ids[: length // spec.hash_block_size]))
            self._push(conv, answer)
            conv.turns += 1
            if conv.turns == spec.turns:
                self._open[slot] = None
        return RequestChunk(chunk.arrival, np.asarray(new_len, dtype=np.int64), chunk.output_len,
                            ids, spec.hash_block_size, chunk.cut)  # fmt: skip


def with_prefixes(chunks: Iterable[RequestChunk], spec: PrefixSpec,
                  rng: np.random.Generator) -> Iterator[RequestChunk]:  # fmt: skip
    """Lazily apply one PrefixGenerator to a stream of chunks (state carries across chunks)."""
    gen = PrefixGenerator(spec, rng)
    return (gen.apply(chunk) for chunk in chunks)


def synthetic_prefixes(prompt_len: np.ndarray, output_len: np.ndarray, rng: np.random.Generator,
                       **spec) -> tuple[np.ndarray, list[tuple[int, ...]]]:  # fmt: skip
    """Prompt lengths and hash ids for requests whose own new tokens are `prompt_len` and whose
    answers are `output_len`, under PrefixSpec(**spec), e.g. system_prompts=8,
    system_prompt_len=1024, popularity="zipf", zipf_a=1.2, turns=4."""
    n = len(prompt_len)
    chunk = RequestChunk(np.zeros(n), np.asarray(prompt_len, dtype=np.int64),
                         np.asarray(output_len, dtype=np.int64))  # fmt: skip
    out = PrefixGenerator(PrefixSpec(**spec), rng).apply(chunk)
    return out.prompt_len, out.hash_ids


# ---- the workload's `prefix:` section ---------------------------------------------------------


def prefix_options(workload: Workload) -> tuple[PrefixSpec | None, dict]:
    """The `prefix:` section: (synthetic prefixes or None, the prefix replay's options)."""
    section = workload.prefix
    if section is None:
        return None, {}
    return section.shared, {"max_running": section.max_running, "hold_output": section.hold_output}


def request_stream(workload: Workload) -> Iterator[RequestChunk]:
    """The workload's requests, their prompts given the shared prefixes of its `prefix:`
    section when it has synthetic ones (with hash ids); else as they are."""
    spec, _ = prefix_options(workload)
    chunks = workload.make_requests()
    if spec is not None:
        chunks = with_prefixes(chunks, spec, np.random.default_rng([workload.seed, 0xCAC4E]))
    return chunks
