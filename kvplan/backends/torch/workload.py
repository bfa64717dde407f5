"""The validation experiment's inputs: a model cut to a few layers, random projections, requests.

Each request has a prompt of length - 1 tokens written at admission and one decode token appended
through the allocator; the first request is forked after its prompt (as for parallel sampling), so
its decode append meets a shared, partly filled block and must copy it first. K, V and Q come from
random projections of random hidden states (input width min(hidden, 256): only the output
shapes, which are the model's real KV heads and head dims, matter for the cache). Everything is
drawn on the CPU from one seeded generator, so a CPU and a CUDA run see the same numbers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from kvplan.backends.torch.cache import PagedKVCache
from kvplan.errors import UsageError
from kvplan.memory.paged import BlockManager
from kvplan.model.spec import ModelSpec

PROJ_IN_MAX = 256
FORK = "r0-fork"


def reduce_layers(spec: ModelSpec, layers: int) -> tuple[ModelSpec, list[str]]:
    """Keep `layers` of the model's KV-keeping layers, one of each kind first, in model order."""
    if layers < 1:
        raise UsageError(f"expected a positive integer, got {layers}", field="layers")
    kept = [i for i, layer in enumerate(spec.layers) if layer.kind != "none"]
    notes = []
    if layers > len(kept):
        notes.append(f"the model has {len(kept)} KV-keeping layers; using all of them")
        layers = len(kept)
    first_of_kind: dict = {}
    for i in kept:
        first_of_kind.setdefault(spec.layers[i], i)
    chosen = list(first_of_kind.values())[:layers]
    if len(first_of_kind) > layers:
        dropped = sorted({spec.layers[i].kind for i in list(first_of_kind.values())[layers:]})
        notes.append(f"{len(first_of_kind)} layer kinds do not fit in {layers} layers; left out: {', '.join(dropped)}")
    for i in kept:
        if len(chosen) >= layers:
            break
        if i not in chosen:
            chosen.append(i)
    picked = tuple(spec.layers[i] for i in sorted(chosen))
    return dataclasses.replace(spec, layers=picked), notes


def query_heads(spec: ModelSpec, tp: int) -> int:
    if spec.num_heads % tp:
        raise UsageError(f"{spec.num_heads} attention heads cannot be split evenly over {tp} GPUs", field="tp")
    return spec.num_heads // tp


def blocks_needed(lengths: tuple[int, ...], block_size: int) -> int:
    """Blocks the request schedule takes, counted by running it on a count-only BlockManager."""
    mgr = BlockManager(sum(lengths) + len(lengths) + 2, block_size)
    for i, n in enumerate(lengths):
        mgr.add_request(f"r{i}", n - 1)
    mgr.fork("r0", FORK)
    for rid in list(mgr.tables):
        mgr.append(rid)
    return mgr.num_used_blocks


@dataclass
class Workload:
    """What was written, kept contiguous per request for the dense reference."""

    rids: list[str]
    queries: dict[str, list[torch.Tensor]] = field(default_factory=dict)  # rid -> per kv layer (L, Hq, D)
    keys: dict[str, list[torch.Tensor]] = field(default_factory=dict)  # rid -> per kv layer, round-tripped
    values: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    states: dict[str, list[torch.Tensor]] = field(default_factory=dict)  # rid -> per state layer


class Projections:
    """Random Q and K/V (or MLA latent) projections, one set per per-token layer of the cache."""

    def __init__(self, cache: PagedKVCache, q_heads: int, d_in: int, gen: torch.Generator) -> None:
        self.q_heads, self.d_in = q_heads, d_in
        self.layers = []
        for pool, _ in cache.kv_layers:
            g = pool.group
            kv_width = g.latent_dim if g.kind == "mla" else g.num_kv_heads * g.head_dim
            v_width = 0 if g.kind == "mla" else g.num_kv_heads * g.v_head_dim
            q_dim = g.latent_dim if g.kind == "mla" else g.head_dim
            if g.kind != "mla" and q_heads % g.num_kv_heads:
                raise UsageError(f"{q_heads} query heads per GPU do not group over {g.num_kv_heads} KV heads",
                                 field="tp")
            w = [torch.randn(d_in, n, generator=gen) / d_in**0.5 for n in (q_heads * q_dim, kv_width, v_width)]
            self.layers.append((g, [t.to(cache.device) for t in w]))

    def apply(self, x: torch.Tensor, device: torch.device) -> list[tuple]:
        """(Q, K, V) per layer for hidden states x (n, d_in), on `device`; V is None for an MLA latent."""
        out = []
        x = x.to(device)
        n = x.shape[0]
        for g, (wq, wk, wv) in self.layers:
            q = (x @ wq).view(n, self.q_heads, wq.shape[1] // self.q_heads)
            if g.kind == "mla":
                out.append((q, x @ wk, None))
            else:
                k = (x @ wk).view(n, g.num_kv_heads, g.head_dim)
                out.append((q, k, (x @ wv).view(n, g.num_kv_heads, g.v_head_dim)))
        return out


def run_requests(cache: PagedKVCache, lengths: tuple[int, ...], *, q_heads: int, d_in: int,
                 gen: torch.Generator) -> Workload:
    """Admit every prompt, fork r0, append one decode token to each sequence; record what went in."""
    proj = Projections(cache, q_heads, d_in, gen)
    hidden = {f"r{i}": torch.randn(n, d_in, generator=gen) for i, n in enumerate(lengths)}
    hidden[FORK] = torch.cat([hidden["r0"][:-1], torch.randn(1, d_in, generator=gen)])
    work = Workload(rids=[*hidden])
    written: dict[str, list] = {}
    for rid, x in hidden.items():
        per_layer = proj.apply(x, cache.device)  # once per request: the writes slice these tensors
        written[rid] = [(k, v) for _, k, v in per_layer]
        work.queries[rid] = [q for q, _, _ in per_layer]
        work.keys[rid] = [_round_trip(cache, i, k) for i, (k, _) in enumerate(written[rid])]
        work.values[rid] = [_round_trip(cache, i, k if v is None else v) for i, (k, v) in enumerate(written[rid])]
    work.states = {rid: [torch.randn(p.group.state_elems, generator=gen).to(cache.device)
                         for p, _ in cache.state_layers] for rid in hidden if rid != FORK}
    for i, n in enumerate(lengths):
        rid = f"r{i}"
        cache.add_request(rid, _rows(written[rid], slice(0, n - 1)), work.states[rid])
    cache.fork("r0", FORK)
    work.states[FORK] = work.states["r0"]
    for rid, x in hidden.items():
        cache.append(rid, _rows(written[rid], slice(len(x) - 1, len(x))))
    return work


def _rows(kv: list, rows: slice) -> list:
    return [(k[rows], None if v is None else v[rows]) for k, v in kv]


def _round_trip(cache: PagedKVCache, layer: int, t: torch.Tensor) -> torch.Tensor:
    pool, _ = cache.kv_layers[layer]
    return pool.codec.round_trip(t, torch.float32)
