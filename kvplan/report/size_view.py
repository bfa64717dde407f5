"""Human output of `kvplan size` and `kvplan models`."""

from __future__ import annotations

from kvplan.model.fit import SizeReport
from kvplan.model.layout import KVLayout
from kvplan.report.output import console, print_table
from kvplan.report.size_hints import print_batch_hints
from kvplan.text import count, terminal
from kvplan.units import format_bytes


def _b(n: int | None) -> str:
    return "-" if n is None else f"{n:,} B ({format_bytes(n)})" if n >= 1024 else f"{n:,} B"


def render_size(report: SizeReport, layout: KVLayout, notes: list[str], concurrency_at: dict | None = None,
                would_fit: dict | None = None) -> None:
    from rich.table import Table

    out = console()
    table = Table(title=f"KV cache of {terminal(report.model)}", show_header=False, title_justify="left")
    table.add_column("quantity", style="bold")
    table.add_column("value", justify="right")
    table.add_row("KV dtype / TP", f"{terminal(report.kv_dtype)} / tp={report.tp}")
    for g in layout.groups:
        table.add_row(f"  {g.kind} layers x{g.num_layers}", _group_text(g))
    table.add_row("bytes per token (per GPU)", _b(report.bytes_per_token))
    if report.state_bytes:
        table.add_row("state per request", _b(report.state_bytes))
    table.add_row(f"one request of {count(report.tokens, 'token')}", _b(report.kv_bytes))
    if report.batch > 1:
        table.add_row(f"batch of {report.batch} requests", _b(report.batch_kv_bytes))
    table.add_row("weights (per GPU, estimated)", f"{_b(report.weight_bytes)}, {report.params / 1e9:.2f}B params")
    if report.kv_pool_bytes is not None:
        _add_fit_rows(table, report)
    print_table(out, table)  # the values kept whole (a number and its unit), the labels wrap
    if report.kv_pool_bytes is not None:
        _print_fit_lines(out, report)
    if concurrency_at and any(concurrency_at.values()):
        cells = ", ".join(f"{k // 1024}K: {v:.2f}x" for k, v in sorted(concurrency_at.items()))
        out.print(f"[dim]vLLM's concurrency at other context lengths: {cells}[/dim]")
    if would_fit is not None:
        options = [f"--tp {would_fit['tp']}" if would_fit.get("tp") else "",
                   f"--gpu {terminal(would_fit['gpu'])}" if would_fit.get("gpu") else ""]
        options = [o for o in options if o]
        out.print("It would fit with " + " or ".join(options) + "." if options
                  else "No TP degree up to 8 on this GPU, and no catalog GPU at this TP, would fit.")
        print_batch_hints(out, would_fit, report.gpu)
    for note in notes:
        out.print(f"[dim]note: {terminal(note)}[/dim]")


def _group_text(g) -> str:
    if g.kind == "mla":
        return f"latent {g.latent_dim}, {g.bytes_per_token_per_layer:,} B/token/layer"
    if g.kind == "state":
        return f"state {g.state_elems:,} elems/layer, {format_bytes(g.state_bytes)} per request"
    window = f", window {g.window:,}" if g.window else ""
    return f"{g.num_kv_heads} KV heads x {g.head_dim}{window}, {g.bytes_per_token_per_layer:,} B/token/layer"


def _add_fit_rows(table, r: SizeReport) -> None:
    if r.gpu:
        util = f" x {r.gpu_memory_utilization}" if r.gpu_memory_utilization else ""
        table.add_row("GPU" + (" (as CUDA reports it)" if r.memory_breakdown else ""),
                      f"{terminal(r.gpu)}, {_b(r.gpu_memory_bytes)}{util}")
    m = r.memory_breakdown
    if m:
        table.add_row("  vLLM may use (total x utilization)", _b(m["requested"]))
        table.add_row("  - weights", _b(m["weights"]))
        table.add_row(f"  - activation peak ({m['max_num_batched_tokens']:,} tokens, {m['max_num_seqs']:,} seqs)",
                      _b(m["activation"]))
        table.add_row("  - non-torch (workspaces, NCCL)", _b(m["non_torch"]))
        if m["cuda_graphs_in_pool"]:
            table.add_row(f"  - CUDA graphs (profiled, vLLM {m['release']})", _b(m["cuda_graphs"]))
        else:
            table.add_row(f"  CUDA graphs (outside the pool, vLLM {m['release']})", _b(m["cuda_graphs"]))
    table.add_row("KV pool" + (" (vLLM's Available KV cache memory)" if m else ""), _b(r.kv_pool_bytes))
    if m and m["kv"] > 0:
        table.add_row("  free after it and the graphs", _b(m["free_after_sizing"]))
        table.add_row("  the sampler warm-up then needs", _b(m["warmup"]))
    if r.vllm_num_blocks is not None:
        table.add_row(f"vLLM's blocks of {r.vllm_block_size} in its layer groups (1 kept as null block)",
                      f"{r.vllm_num_blocks:,}")
    else:
        table.add_row(f"blocks of {r.block_size} (1 kept as null block)", f"{r.num_blocks:,}")
    table.add_row("tokens that fit", f"{r.max_tokens:,}")
    table.add_row(f"requests of {count(r.tokens, 'token')} at once", f"{r.max_concurrency:,}")


def _print_fit_lines(out, r: SizeReport) -> None:
    if r.reason:
        out.print(f"[bold red]vLLM would not start:[/] {terminal(r.reason)}")
        return
    if r.kv_pool_bytes <= 0:
        given = int((r.gpu_memory_bytes or 0) * (r.gpu_memory_utilization or 1))
        out.print(f"[bold red]Nothing fits:[/] the weights need {_b(r.weight_bytes)} per GPU; the GPU gives "
                  f"{_b(given)} ({r.gpu_memory_utilization} of its memory).")
        return
    out.print(f"vLLM would log: GPU KV cache size: {r.vllm_kv_cache_tokens:,} tokens")
    out.print(f"vLLM would log: Maximum concurrency for {r.tokens:,} tokens per request: {r.vllm_concurrency:.2f}x")
    if r.vllm_block_size is not None:
        out.print(f"[dim](vLLM's hybrid KV cache groups, attention block size {r.vllm_block_size} tokens: "
                  "num_blocks / the blocks one request needs in every group)[/dim]")
    else:
        out.print("[dim](vLLM's formula: num_blocks / ceil(tokens / block_size), tokens = int(concurrency x tokens))[/dim]")
    if not r.fits:
        out.print(
            f"[bold red]Does not fit:[/] {count(r.batch, 'request')} of {r.tokens:,} tokens need more than the pool; "
            f"the longest single request that fits is {r.longest_context:,} tokens."
        )


def render_models(rows: list[dict]) -> None:
    from rich.table import Table

    table = Table(title="Bundled model catalog", title_justify="left")
    for col, justify in (("model", "left"), ("type", "left"), ("layers", "right"), ("KV/token", "right"),
                         ("context", "right"), ("dtype", "left")):
        table.add_column(col, justify=justify, no_wrap=col == "model")
    for row in rows:
        table.add_row(terminal(row["model"]), terminal(row["model_type"]), str(row["num_layers"]),
                      format_bytes(row["bytes_per_token"]), f"{row['max_context']:,}" if row["max_context"] else "none stated",
                      terminal(row["dtype"]))
    print_table(console(), table)  # folded at 80 columns, never a number cut


def _why(reason: str | None) -> str:
    if not reason:
        return "no"
    for prefix, short in (("CUDA out of memory occurred when warming up", "warm-up"), ("CUDA out of memory", "weights"), ("No available memory", "no KV"),
                          ("To serve at least one request", "context"), ("tp:", "TP split")):
        if reason.startswith(prefix):
            return f"no, {short}"
    return "no"


def render_grid(model: str, rows: list[dict]) -> None:
    """`kvplan size --gpu A,B --tp 1,2`: one line per GPU and TP degree, readable at 80 columns
    (short verdicts in the table, vLLM's whole messages below it)."""
    from rich.table import Table

    table = Table(title=f"{terminal(model)}: each GPU and TP degree", title_justify="left")
    for col, justify in (("GPU", "left"), ("TP", "right"), ("weights", "right"), ("KV pool", "right"),
                         ("conc.", "right"), ("longest", "right"), ("fits", "left")):
        table.add_column(col, justify=justify)
    tokens = next((r["tokens"] for r in rows if "tokens" in r), None)
    reasons: dict[str, list[str]] = {}
    for r in rows:
        if r.get("reason"):
            reasons.setdefault(r["reason"], []).append(f"{r['gpu']} tp={r['tp']}")
        gpu = terminal(r["gpu"])
        if "weight_bytes" not in r:
            table.add_row(gpu, str(r["tp"]), "-", "-", "-", "-", _why(r["reason"]))
            continue
        table.add_row(gpu, str(r["tp"]), format_bytes(r["weight_bytes"]), format_bytes(r["kv_pool_bytes"] or 0),
                      f"{r['vllm_concurrency']:.2f}x", f"{r['longest_context']:,}",
                      "yes" if r["fits"] else _why(r["reason"]))
    out = console()
    print_table(out, table)
    if tokens:
        out.print(f"[dim]per GPU; conc.: vLLM's Maximum concurrency for {tokens:,}-token requests; longest: "
                  "the longest single request that fits[/dim]")
    for reason, where in reasons.items():
        out.print(f"[dim]{terminal(', '.join(where))}: {terminal(reason)}[/dim]")


def render_sglang(run) -> None:
    """`kvplan size --engine sglang`: SGLang's start-up on one GPU (kvplan/model/sglang_memory.py)."""
    from rich.table import Table

    m = run.memory
    out = console()
    table = Table(title=f"SGLang {terminal(m.release)} start-up of {terminal(run.model)}", show_header=False,
                  title_justify="left")
    table.add_column("quantity", style="bold")
    table.add_column("value", justify="right")
    table.add_row("GPU / TP / KV dtype", f"{terminal(run.gpu)} / tp={run.tp} / {terminal(run.kv_dtype)}")
    table.add_row("GPU memory (as CUDA reports it)", _b(m.gpu_memory))
    table.add_row("mem_fraction_static", f"{m.mem_fraction_static}")
    table.add_row("free before the weights load", _b(m.pre_load))
    table.add_row("weights (per GPU, estimated)", f"{_b(m.weights)}, {run.params / 1e9:.2f}B params")
    table.add_row("KV pool (free x fraction - weights)", _b(m.kv_pool))
    table.add_row("KV bytes per token (per GPU)", _b(m.cell_size))
    table.add_row("max_total_num_tokens", f"{m.max_total_num_tokens:,}")
    if m.hybrid:
        table.add_row(f"sliding layers' tokens (ratio {m.swa_full_tokens_ratio:g})", f"{m.swa_tokens:,}")
    table.add_row("max_running_requests", f"{m.max_running_requests:,}")
    table.add_row("chunked_prefill_size", f"{m.chunked_prefill_size:,}")
    table.add_row("context_len", f"{m.context_len:,}")
    print_table(out, table)
    sp = run.speculative
    if sp is not None:
        from kvplan.model.sglang_memory import SPECULATIVE_MAX_RUNNING

        k = sp["num_speculative_tokens"]
        out.print(f"Speculative decoding: {terminal(sp['method'])}, {k} draft step{'s' if k != 1 else ''} (topk 1, "
                  f"{sp['speculative_num_draft_tokens']} draft tokens): the pool holds SGLang's headroom for the drafts, "
                  f"max_running_requests defaults to {SPECULATIVE_MAX_RUNNING}; the draft's own KV pool {_b(sp['draft_kv_pool_bytes'])} and "
                  f"weights {_b(sp['draft_weight_bytes'])} come out of the memory the fraction leaves")
    out.print(f"[dim]mem_fraction_static {m.mem_fraction_static}: {terminal(m.mem_fraction_reason)}[/dim]")
    if m.hybrid:
        out.print(f"[dim]hybrid sliding-window pool: the full layers keep {m.max_total_num_tokens:,} tokens, the sliding "
                  f"layers {m.swa_tokens:,}; a running request holds each token in both, so {m.serving_tokens:,} "
                  "tokens bound the requests at once[/dim]")
    if m.reason:
        out.print(f"[bold red]SGLang would not start:[/] {terminal(m.reason)}")
    else:
        if m.hybrid:
            out.print(f"SGLang would log: Use sliding window memory pool. full_layer_tokens={m.max_total_num_tokens}, "
                      f"swa_layer_tokens={m.swa_tokens}")
        out.print(f"SGLang would log: max_total_num_tokens={m.max_total_num_tokens}, chunked_prefill_size="
                  f"{m.chunked_prefill_size}, max_running_requests={m.max_running_requests}, context_len={m.context_len}")
    for note in run.notes:
        out.print(f"[dim]note: {terminal(note)}[/dim]")
