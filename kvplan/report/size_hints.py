"""The lines `kvplan size` adds under "It would fit with ...": why a GPU of about the same memory
fits (vLLM's smaller default batch there) and the batch flags that make the model fit on the GPU
asked for (checked by sizing with them: kvplan/model/batch_fit.py)."""

from __future__ import annotations


def batch_hint_lines(would_fit: dict, gpu: str | None) -> list[str]:
    lines = []
    defaults = would_fit.get("batch_defaults")
    other = would_fit.get("gpu")
    if defaults and other in defaults and gpu in defaults:
        there, here = defaults[other], defaults[gpu]
        lines.append(f"Why {other}: vLLM's default batch there is {there['max_num_batched_tokens']:,} batched "
                     f"tokens and {there['max_num_seqs']:,} sequences ({here['max_num_batched_tokens']:,} and "
                     f"{here['max_num_seqs']:,} on {gpu}); its start-up profiling and CUDA graphs then take "
                     "less memory, and the KV cache gets the rest.")
    batch = would_fit.get("batch")
    if batch:
        lines.append(f"On {gpu} it fits with --max-num-seqs {batch['max_num_seqs']} --max-num-batched-tokens "
                     f"{batch['max_num_batched_tokens']} (checked: sized with these; a smaller batch, less "
                     "throughput at high load).")
    return lines


def print_batch_hints(out, would_fit: dict | None, gpu: str | None) -> None:
    for line in batch_hint_lines(would_fit or {}, gpu):
        out.print(line, markup=False)
