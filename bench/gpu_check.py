"""GPU check of the torch backend: pool bytes to the byte at a realistic size, paged vs dense decode.

On a CUDA machine:
 1. run_validation for meta-llama/Meta-Llama-3-8B with all 32 layers and 4,096 blocks of 16 tokens
    (an 8 GiB bf16 pool; 16 tokens x 128 KiB = 2 MiB a block), then the same with fp8 (4 GiB):
    kvplan's predicted bytes vs the tensors' bytes vs the change in torch.cuda.memory_allocated(),
    the caching allocator's rounding printed on its own, and paged vs dense attention errors.
 2. A decode step of B = 16 requests of 4,096 tokens in one Llama-3-8B attention layer (32 query
    heads, 8 KV heads of 128, bf16): dense SDPA over contiguous K/V against paged attention through
    kvplan's block tables (gather + SDPA, and compiled flex attention reading the pool in place),
    for prompt-ordered block tables and for round-robin (interleaved) ones. Prints the time of each
    and paged throughput / dense throughput; target: the best paged path >= 0.8x dense at B = 16.
Without CUDA it says so and runs both parts at a small size on the CPU (no speed target).

Exit status 1 when a correctness check fails (bytes, attention); the speed target prints ok/MISSED.
Run: python bench/gpu_check.py [--batch 16] [--context 4096] [--iters 50] [--no-flex]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from kvplan.backends.torch import run_validation
from kvplan.backends.torch.attention import paged_attention_sdpa, sdpa_folded
from kvplan.backends.torch.codec import codec_for
from kvplan.backends.torch.flex import flex_available, paged_attention_flex, paged_block_mask
from kvplan.memory.paged import BlockManager
from kvplan.units import format_bytes

MODEL = "meta-llama/Meta-Llama-3-8B"
Q_HEADS, KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 16
TARGET = 0.8


def validation_part(device: str, big: bool) -> bool:
    runs = [("auto", 32, 4096), ("fp8", 32, 4096)] if big else [("auto", 2, None), ("fp8", 2, None)]
    ok = True
    for kv_dtype, layers, blocks in runs:
        if device == "cuda":
            torch.cuda.empty_cache()  # the previous run's pool goes back to the driver first
        t0 = time.perf_counter()
        r = run_validation(MODEL, layers=layers, num_blocks=blocks, kv_dtype=kv_dtype, device=device)
        ok &= r.ok
        print(f"\n[validate] {MODEL}, {layers} layers, KV {r.kv_dtype} ({r.storage_dtype}), {r.num_blocks:,} blocks "
              f"of {r.block_size}, {r.device}: {'PASS' if r.ok else 'FAIL'} in {time.perf_counter() - t0:.1f} s")
        print(f"  kvplan predicted : {r.predicted_bytes:>15,} B  ({format_bytes(r.predicted_bytes)})"
              f"  = {r.num_blocks:,} x {r.block_size} x {r.layout_bytes_per_token:,} B/token")
        print(f"  tensors allocated: {r.allocated_bytes:>15,} B  (numel x element_size)")
        if r.cuda_measured_bytes is not None:
            print(f"  CUDA measured    : {r.cuda_measured_bytes:>15,} B  (memory_allocated delta; "
                  f"allocator rounding {r.cuda_rounding_bytes:,} B)")
        for g in r.groups:
            errs = ", ".join(f"{k} {v:.1e}" for k, v in g.errors.items() if v is not None)
            print(f"  {g.kind} x{g.num_layers}: {g.predicted_bytes:,} vs {g.allocated_bytes:,} B; read back "
                  f"{'exact' if g.readback_exact else 'DIFFERS'}; max abs error vs dense: {errs}")
        for note in r.notes:
            print(f"  note: {note}")
    return ok


def decode_setup(device: str, batch: int, context: int, interleave: bool, gen: torch.Generator):
    """A one-layer bf16 pool filled through kvplan's BlockManager; the same K/V made contiguous."""
    mgr = BlockManager(batch * -(-context // BLOCK), BLOCK)
    rids = list(range(batch))
    if interleave:  # round-robin growth, block by block: every request's blocks scattered
        for rid in rids:
            mgr.add_request(rid, 0)
        for start in range(0, context, BLOCK):
            for rid in rids:
                mgr.append_tokens(rid, min(BLOCK, context - start))
    else:  # whole prompts admitted one after another, as a prefill does
        for rid in rids:
            mgr.add_request(rid, context)
    shape = (mgr.num_blocks, BLOCK, KV_HEADS, HEAD_DIM)
    k_pool = torch.randn(shape, generator=gen).to(device, torch.bfloat16)
    v_pool = torch.randn(shape, generator=gen).to(device, torch.bfloat16)
    tables = torch.tensor([mgr.tables[r] for r in rids], device=device)
    lens = torch.full((batch,), context, device=device)
    pos = torch.arange(context, device=device)
    slots = tables[:, pos // BLOCK] * BLOCK + pos % BLOCK
    dense_k = k_pool.flatten(0, 1)[slots].transpose(1, 2).contiguous()  # (B, Hkv, L, D)
    dense_v = v_pool.flatten(0, 1)[slots].transpose(1, 2).contiguous()
    q = torch.randn(batch, 1, Q_HEADS, HEAD_DIM, generator=gen).to(device, torch.bfloat16)
    return q, k_pool, v_pool, tables, lens, dense_k, dense_v


def timed(fn, iters: int, device: str) -> float:
    """Median seconds per call after warm-up."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def decode_part(device: str, batch: int, context: int, iters: int, use_flex: bool, big: bool) -> bool:
    codec = codec_for("bf16", device)
    gen = torch.Generator().manual_seed(0)
    ok, best_ratio = True, 0.0
    for interleave in (False, True):
        q, k_pool, v_pool, tables, lens, dk, dv = decode_setup(device, batch, context, interleave, gen)
        q_sdpa = q.transpose(1, 2)
        paths = {
            "dense SDPA (enable_gqa)": lambda: torch.nn.functional.scaled_dot_product_attention(q_sdpa, dk, dv,
                                                                                               enable_gqa=True),
            "dense SDPA (heads folded)": lambda: sdpa_folded(q, dk, dv, None, None),
            "paged gather + SDPA": lambda: paged_attention_sdpa(q, k_pool, v_pool, tables, lens, codec=codec,
                                                                uniform_len=context),
        }
        if use_flex and flex_available():
            mask = paged_block_mask(tables, lens, num_blocks=k_pool.shape[0], block_size=BLOCK, n_q=1)
            paths["paged flex" + (" (compiled)" if big else " (eager)")] = lambda: paged_attention_flex(
                q, k_pool, v_pool, tables, lens, codec=codec, compiled=big, block_mask=mask)
        reference = sdpa_folded(q, dk, dv, None, None).float()
        kv_bytes = 2 * batch * context * KV_HEADS * HEAD_DIM * 2
        print(f"\n[decode] B={batch}, {context:,} tokens each, {Q_HEADS}/{KV_HEADS} heads x {HEAD_DIM}, bf16, "
              f"{'interleaved' if interleave else 'prompt-ordered'} block tables, {device}; "
              f"K/V read per step {format_bytes(kv_bytes)}")
        results = {}
        for name, fn in paths.items():
            try:
                err = (fn().float().reshape(reference.shape) - reference).abs().max().item()
                results[name] = timed(fn, iters, device)
            except Exception as exc:  # a path the installed torch cannot run is reported, not fatal
                print(f"  {name:<28} failed: {exc.__class__.__name__}: {str(exc).splitlines()[0][:120]}")
                continue
            ok &= err < 5e-2
            print(f"  {name:<28} {results[name] * 1e6:9.1f} us  {kv_bytes / results[name] / 1e9:7.1f} GB/s"
                  f"  max abs diff vs dense {err:.1e}")
        dense = min(t for n, t in results.items() if n.startswith("dense"))
        for name, t in results.items():
            if name.startswith("paged"):
                ratio = dense / t
                best_ratio = max(best_ratio, ratio)
                print(f"  {name:<28} throughput {ratio:.2f}x dense")
    if not big:
        print("  (CPU timings at this size are a smoke test, not a speed figure)")
    if big:
        print(f"\nbest paged / dense throughput at B={batch}: {best_ratio:.2f}x; target >= {TARGET}x: "
              f"{'ok' if best_ratio >= TARGET else 'MISSED'}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--no-flex", action="store_true")
    args = parser.parse_args()
    big = torch.cuda.is_available()
    device = "cuda" if big else "cpu"
    print(f"torch {torch.__version__}; " + (f"CUDA device {torch.cuda.get_device_name()}" if big else
          "CUDA is not available: running the CPU parts at a small size (no memory_allocated check, "
          "no speed target)"))
    ok = validation_part(device, big)
    batch, context, iters = (args.batch, args.context, args.iters) if big else (4, 256, 5)
    ok &= decode_part(device, batch, context, iters, not args.no_flex, big)
    print("\nall correctness checks passed" if ok else "\nA CORRECTNESS CHECK FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
