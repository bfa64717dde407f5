"""`run_validation`: a small, real-shaped paged-KV experiment that checks kvplan's byte predictions.

For one model (its real KV heads, head dims, windows, latent or state sizes and KV dtype, cut to a
few layers) it builds real pools from the same KVLayout as `kvplan size`, runs requests through
kvplan's own BlockManager, and compares, per layer group:
  bytes: kvplan's prediction, the tensors' numel x element_size, and on CUDA the change in
         torch.cuda.memory_allocated() (the caching allocator's rounding reported on its own);
  data:  every request reads back exactly what it wrote, through its block table;
  math:  paged attention (plain gather + matmul, and gather + SDPA, and flex where available) vs
         dense float64 attention over one contiguous array, for a decode batch and a prefill.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from kvplan.backends.torch.attention import dense_attention, paged_attention_reference, paged_attention_sdpa
from kvplan.backends.torch.cache import PagedKVCache
from kvplan.backends.torch.flex import flex_available, paged_attention_flex
from kvplan.backends.torch.pool import GroupPool, predicted_pool_bytes
from kvplan.backends.torch.workload import FORK, PROJ_IN_MAX, Workload, blocks_needed, query_heads, \
    reduce_layers, run_requests
from kvplan.errors import UsageError
from kvplan.model.build import build_layout
from kvplan.model.resolve import load_spec

DEFAULT_LENGTHS = (39, 1, 16, 17, 100, 257)
REFERENCE_TOL = 1e-4  # fp32 math on exactly the stored values
FAST_TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}  # SDPA/flex in the compute dtype
FLEX_MAX_SCORES = {"cpu": 2**23, "cuda": 2**26}  # eager flex materializes batch x heads x queries x slots
CUDA_ROUNDING_PER_TENSOR = 2 * 2**20  # a large block is not split when < 1 MiB would remain
PATHS = ("reference", "sdpa", "flex")


@dataclass(frozen=True)
class GroupCheck:
    """One layer group's three byte counts and its attention errors (None: not run)."""

    kind: str
    num_layers: int
    window: int | None
    storage_dtype: str
    shapes: dict[str, tuple[int, ...]]  # storage shape of each per-layer tensor, by role
    bytes_per_token_per_layer: int
    state_bytes_per_seq: int
    predicted_bytes: int
    allocated_bytes: int
    cuda_measured_bytes: int | None
    cuda_rounding_bytes: int | None
    readback_exact: bool
    errors: dict[str, float | None]
    tolerances: dict[str, float]
    ok: bool

    def to_dict(self) -> dict:
        d = asdict(self)
        d["shapes"] = {k: list(v) for k, v in self.shapes.items()}
        return d


@dataclass(frozen=True)
class ValidationResult:
    """Predicted vs allocated vs CUDA-measured bytes per group, attention errors, pass/fail."""

    model: str
    kv_dtype: str
    storage_dtype: str
    compute_dtype: str
    device: str
    tp: int
    block_size: int
    num_blocks: int
    max_seqs: int
    request_lengths: tuple[int, ...]
    seed: int
    model_layers: int
    layer_kinds: tuple[str, ...]
    q_heads: int
    layout_bytes_per_token: int
    layout_state_bytes: int
    predicted_bytes: int
    allocated_bytes: int
    cuda_measured_bytes: int | None
    cuda_rounding_bytes: int | None
    cow_copies: int
    groups: tuple[GroupCheck, ...]
    notes: tuple[str, ...]
    ok: bool

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "groups"}
        d["request_lengths"] = list(self.request_lengths)
        d["layer_kinds"] = list(self.layer_kinds)
        d["notes"] = list(self.notes)
        d["groups"] = [g.to_dict() for g in self.groups]
        return d


def run_validation(
    model: str, *, layers: int = 2, block_size: int = 16, num_blocks: int | None = None,
    kv_dtype: str = "auto", tp: int = 1, device: str = "cpu",
    request_lengths: tuple[int, ...] = DEFAULT_LENGTHS, seed: int = 0,
) -> ValidationResult:
    """Run the experiment for `model` (catalog id, path or hub id); see the module docstring."""
    dev = _device(device)
    lengths = _lengths(request_lengths)
    if block_size < 1:
        raise UsageError(f"expected a positive integer, got {block_size}", field="block-size")
    spec = load_spec(model)
    reduced, notes = reduce_layers(spec, layers)
    layout = build_layout(reduced, kv_dtype, tp)
    q_heads = query_heads(spec, tp)
    num_blocks = _pool_blocks(lengths, block_size, num_blocks)
    max_seqs = len(lengths) + 1  # the fork is a sequence too
    cache = PagedKVCache(layout, num_blocks=num_blocks, block_size=block_size, max_seqs=max_seqs,
                         device=dev, state_dtype=spec.dtype)
    gen = torch.Generator().manual_seed(seed)
    work = run_requests(cache, lengths, q_heads=q_heads, d_in=min(spec.hidden_size, PROJ_IN_MAX), gen=gen)
    errors = _attention_errors(cache, work, notes)
    groups = tuple(_group_check(cache, p, work, errors.get(p.index)) for p in cache.pools)
    predicted = sum(g.predicted_bytes for g in groups)
    if predicted != predicted_pool_bytes(layout, num_blocks, block_size, max_seqs):
        raise AssertionError("per-group predictions do not add up to the layout's pool bytes")
    measured = None if dev.type != "cuda" else sum(g.cuda_measured_bytes for g in groups)
    allocated = sum(g.allocated_bytes for g in groups)
    codec = cache.kv_layers[0][0].codec if cache.kv_layers else None
    if codec is not None and codec.storage_only:
        notes.append(f"{codec.name} is storage only: values are dequantized to {_name(codec.compute)} to compute")
    if spec.dtype_note:
        notes.append(spec.dtype_note)
    return ValidationResult(
        model=spec.name, kv_dtype=layout.kv_dtype,
        storage_dtype=_name(codec.storage) if codec else "-", compute_dtype=_name(codec.compute) if codec else "-",
        device=str(dev), tp=tp, block_size=block_size, num_blocks=num_blocks, max_seqs=max_seqs,
        request_lengths=lengths, seed=seed, model_layers=len(spec.layers),
        layer_kinds=tuple(layer.kind for layer in reduced.layers), q_heads=q_heads,
        layout_bytes_per_token=layout.bytes_per_token, layout_state_bytes=layout.state_bytes,
        predicted_bytes=predicted, allocated_bytes=allocated, cuda_measured_bytes=measured,
        cuda_rounding_bytes=None if measured is None else measured - allocated,
        cow_copies=len(cache.copies), groups=groups, notes=tuple(notes), ok=all(g.ok for g in groups),
    )


def _device(device: str) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise UsageError(f"expected cpu or cuda, got {device!r}", field="device") from None
    if dev.type not in ("cpu", "cuda"):
        raise UsageError(f"expected cpu or cuda, got {device!r}", field="device")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"CUDA is not available to this torch ({torch.__version__})", field="device")
    return dev


def _pool_blocks(lengths: tuple[int, ...], block_size: int, num_blocks: int | None) -> int:
    """The pool's blocks: by default exactly what the requests take, else at least that."""
    needed = blocks_needed(lengths, block_size)
    if num_blocks is not None and num_blocks < needed:
        raise UsageError(f"{num_blocks} blocks are too few: the requests need {needed}", field="num-blocks")
    return needed if num_blocks is None else num_blocks


def _lengths(lengths) -> tuple[int, ...]:
    out = tuple(int(n) for n in lengths)
    if not out or any(n < 1 for n in out):
        raise UsageError(f"expected one or more lengths >= 1, got {list(lengths)}", field="request-lengths")
    return out


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _attention_errors(cache: PagedKVCache, work: Workload, notes: list[str]) -> dict[int, dict[str, float | None]]:
    """Max |path - dense| per group over its layers, for a decode batch and the longest prefill."""
    longest = max((r for r in work.rids if r != FORK), key=lambda r: cache.manager.lengths[r])
    cases = [(work.rids, -1), ([longest], None)]  # decode: each request's newest token; prefill: all
    out: dict[int, dict[str, float | None]] = {}
    skipped_flex = False
    for i, (pool, layer) in enumerate(cache.kv_layers):
        errs = out.setdefault(pool.index, dict.fromkeys(PATHS))
        for rids, last in cases:
            for path, err in _case_errors(cache, work, i, pool, layer, rids, last).items():
                if err is None:
                    skipped_flex = True
                    continue
                errs[path] = max(errs[path] or 0.0, err)
    if skipped_flex:
        notes.append("flex attention skipped where eager flex would materialize too many scores "
                     "(or where torch lacks it)")
    return out


def _case_errors(cache: PagedKVCache, work: Workload, i: int, pool: GroupPool, layer: int, rids: list[str],
                 last: int | None) -> dict[str, float | None]:
    codec, g = pool.codec, pool.group
    qs = [work.queries[r][i][last:] if last is not None else work.queries[r][i] for r in rids]
    q = torch.stack(qs).to(codec.compute)
    window = g.window if g.kind == "sliding" else None
    dense = dense_attention(q, [work.keys[r][i] for r in rids], [work.values[r][i] for r in rids], window=window)
    tables, lens = cache.block_tables(rids)
    k_pool, v_pool = pool.kv(layer)
    kw = dict(codec=codec, window=window, latent=g.kind == "mla")
    outs = {"reference": paged_attention_reference(q, k_pool, v_pool, tables, lens, **kw),
            "sdpa": paged_attention_sdpa(q, k_pool, v_pool, tables, lens, **kw)}
    scores = q.shape[0] * q.shape[1] * q.shape[2] * k_pool.shape[0] * k_pool.shape[1]
    outs["flex"] = paged_attention_flex(q, k_pool, v_pool, tables, lens, **kw) \
        if flex_available() and scores <= FLEX_MAX_SCORES[q.device.type] else None
    return {p: None if o is None else (o.double() - dense).abs().max().item() for p, o in outs.items()}


def _group_check(cache: PagedKVCache, pool: GroupPool, work: Workload,
                 errors: dict[str, float | None] | None) -> GroupCheck:
    g = pool.group
    rounding = None if pool.measured_bytes is None else pool.measured_bytes - pool.allocated_bytes
    fast_tol = FAST_TOL.get(pool.codec.compute, 5e-2)
    tolerances = {"reference": REFERENCE_TOL, "sdpa": fast_tol, "flex": fast_tol}
    errors = errors or dict.fromkeys(PATHS)
    readback = _readback_exact(cache, pool, work)
    ok = (pool.predicted_bytes == pool.allocated_bytes and readback
          and all(e is None or e <= tolerances[p] for p, e in errors.items())
          and (rounding is None or 0 <= rounding <= CUDA_ROUNDING_PER_TENSOR * pool.num_tensors))
    return GroupCheck(
        kind=g.kind, num_layers=g.num_layers, window=g.window, storage_dtype=_name(pool.codec.storage),
        shapes=dict(pool.shapes), bytes_per_token_per_layer=g.bytes_per_token_per_layer,
        state_bytes_per_seq=g.state_bytes, predicted_bytes=pool.predicted_bytes,
        allocated_bytes=pool.allocated_bytes, cuda_measured_bytes=pool.measured_bytes,
        cuda_rounding_bytes=rounding, readback_exact=readback, errors=errors, tolerances=tolerances, ok=ok,
    )


def _readback_exact(cache: PagedKVCache, pool: GroupPool, work: Workload) -> bool:
    """Every sequence reads back, through its table (or state slot), exactly what was written."""
    if not pool.per_token:
        indices = [i for i, (p, _) in enumerate(cache.state_layers) if p is pool]
        return all(torch.equal(cache.read_state(r, i), pool.codec.round_trip(work.states[r][i], torch.float32))
                   for r in work.rids for i in indices)
    for i, (p, layer) in enumerate(cache.kv_layers):
        if p is not pool:
            continue
        k_pool, v_pool = pool.kv(layer)
        latent = pool.group.kind == "mla"
        for r in work.rids:
            slots = cache.slots(r)
            for stored, want in ((k_pool, work.keys[r][i]), (v_pool, work.values[r][i])):
                got = pool.codec.decode(pool.codec.unraw(pool.codec.raw(stored).flatten(0, 1)[slots]), torch.float32)
                if not torch.equal(got.view(want.shape) if latent else got, want):
                    return False
    return True
