"""Shared prompt prefixes of a request stream: the `prefix:` section and trace hash blocks.

`PrefixSpec` holds the YAML `prefix:` section key for key (system prompts, their popularity,
multi-turn conversations); `with_prefixes(chunks, spec, rng)` rewrites a request stream lazily so
that prompts start with them, attaching hash ids; `synthetic_prefixes` does the same for plain
arrays; `request_stream(workload)` is a workload's requests with its section applied, as both the
prefix replay (kvplan/replay/) and the serve engine (kvplan/sim/) read them. `blocks_per_hash`
maps a trace's hash blocks onto simulated blocks.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable, Iterator

import numpy as np

from kvplan.errors import KvplanError, WorkloadError
from kvplan.workload.records import Workload
from kvplan.workload.chunks import MAX_TOKENS, RequestChunk
from kvplan.workload.yaml_nodes import YamlList, YamlMap, as_int

POPULARITY = ("uniform", "zipf")


def blocks_per_hash(hash_block_size: int, block_size: int) -> int:
    """H / B: simulated blocks per trace hash block; a KvplanError unless B divides H."""
    if hash_block_size < 1 or block_size < 1 or hash_block_size % block_size:
        raise KvplanError(f"block size {block_size} does not divide the trace's hash block size "
                          f"{hash_block_size}: each trace block must map onto whole simulated "
                          f"blocks (use a block size that divides {hash_block_size})")  # fmt: skip
    return hash_block_size // block_size



# ---- synthetic shared prefixes ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PrefixSpec:
    """Shared prompt starts for a synthetic workload (the YAML `prefix:` section, key for key).

    system_prompts: distinct system prompts (0: none). system_prompt_len: their length in tokens
    (one int for all, or one per prompt). popularity: uniform | zipf (prompt k is picked with
    probability proportional to (k + 1) ** -zipf_a). turns: requests per conversation; each
    turn's prompt is the previous turn's prompt and answer followed by the request's own new
    tokens. sessions: conversations open at once (each request continues one of them, picked
    uniformly). hash_block_size: tokens per generated hash id (use the simulated block size or
    a multiple of it). max_prompt_len: a conversation that would pass it starts afresh.
    """

    system_prompts: int = 8
    system_prompt_len: int | tuple[int, ...] = 1024
    popularity: str = "zipf"
    zipf_a: float = 1.2
    turns: int = 1
    sessions: int = 16
    hash_block_size: int = 16
    max_prompt_len: int | None = None

    def __post_init__(self) -> None:
        for name, lo in (("system_prompts", 0), ("turns", 1), ("sessions", 1),
                         ("hash_block_size", 1), ("max_prompt_len", 1)):  # fmt: skip
            value = getattr(self, name)
            if not (value is None and name == "max_prompt_len") and not _is_int(value, lo):
                raise _bad(name, value, f"an integer >= {lo}")
        lens = self.system_prompt_len
        lens = (lens,) * self.system_prompts if _is_int(lens, 1) else lens
        if (not isinstance(lens, (list, tuple)) or len(lens) != self.system_prompts
                or not all(_is_int(n, 1) for n in lens)):  # fmt: skip
            raise _bad("system_prompt_len", lens, f"{self.system_prompts} lengths >= 1, or one")
        object.__setattr__(self, "system_prompt_len", tuple(int(n) for n in lens))
        if self.popularity not in POPULARITY:
            raise _bad("popularity", self.popularity, " or ".join(POPULARITY))
        a = self.zipf_a
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 < a < float("inf"):
            raise _bad("zipf_a", a, "a number > 0")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["system_prompt_len"] = list(self.system_prompt_len)
        return d


def _is_int(value, lo: int) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= lo


def _bad(name: str, value, want: str) -> KvplanError:
    return KvplanError(f"got {value!r}; expected {want}", field=f"prefix.{name}")


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

PREFIX_KEYS = ("system_prompts", "system_prompt_len", "popularity", "zipf_a", "turns", "sessions",
               "hash_block_size", "max_prompt_len")
REPLAY_KEYS = ("max_running", "hold_output")


def prefix_options(workload: Workload) -> tuple[PrefixSpec | None, dict]:
    """The `prefix:` section read: (synthetic prefixes or None, replay options). The replay keys
    (max_running, hold_output) belong to experiment: prefix only."""
    node = workload.extras.get("yaml_nodes", {}).get("prefix")
    if node is None:
        return None, {}
    node.expect_keys(*PREFIX_KEYS, *(REPLAY_KEYS if workload.experiment == "prefix" else ()))
    replay = {"max_running": node.get_int("max_running", 1, ge=1, le=1_000_000),
              "hold_output": node.get_bool("hold_output", False)}
    synthetic = _synthetic_keys(node, workload.scheduler.max_model_len)
    if not synthetic:
        return None, replay
    try:
        return PrefixSpec(**synthetic), replay
    except KvplanError as exc:
        key = (exc.field or "").removeprefix("prefix.")
        where = node.node(key) if key in node else node
        raise WorkloadError(exc.message, file=workload.path, field=f"prefix.{key}" if key else "prefix",
                            line=where.line) from None


# prefix: key -> how the YAML number rules read it (as every other section does)
_INT_KEYS = {"system_prompts": 0, "turns": 1, "sessions": 1, "hash_block_size": 1, "max_prompt_len": 1}
MAX_PREFIX_COUNT = 1 << 20  # system prompts, sessions, turns: beyond a million nothing changes


def _synthetic_keys(node: YamlMap, max_model_len: int) -> dict:
    """The synthetic-prefix keys present, read with the YAML number rules (2e0 and 8.0 are 2
    and 8). A conversation stops growing at max_prompt_len, by default the context
    (max_model_len): vLLM could not serve a longer prompt, and the hash ids of every turn stay
    bounded."""
    out: dict = {}
    for key, lo in _INT_KEYS.items():
        if key in node:
            out[key] = node.get_int(key, ge=lo, le=max_model_len if key == "max_prompt_len" else MAX_PREFIX_COUNT)
    if "system_prompt_len" in node:
        lens = node.node("system_prompt_len")
        out["system_prompt_len"] = (tuple(as_int(n, ge=1, le=MAX_TOKENS) for n in node.get_list("system_prompt_len"))
                                    if isinstance(lens, YamlList) else node.get_int("system_prompt_len", ge=1, le=MAX_TOKENS))
    if "popularity" in node:
        out["popularity"] = node.get_choice("popularity", POPULARITY)
    if "zipf_a" in node:
        out["zipf_a"] = node.get_float("zipf_a", gt=0, le=100)
    if out:
        out.setdefault("max_prompt_len", max_model_len)
    return out


def request_stream(workload: Workload) -> Iterator[RequestChunk]:
    """The workload's requests, their prompts given the shared prefixes of its `prefix:`
    section when it has synthetic ones (with hash ids); else as they are."""
    spec, _ = prefix_options(workload)
    chunks = workload.make_requests()
    if spec is not None:
        chunks = with_prefixes(chunks, spec, np.random.default_rng([workload.seed, 0xCAC4E]))
    return chunks
