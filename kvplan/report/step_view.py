"""`kvplan step` as tables: one decode step and one prefill chunk, term by term."""

from __future__ import annotations

from kvplan.report.output import console, print_table
from kvplan.text import terminal

TERMS = (
    ("overhead", "GPU fixed cost (layers, MoE routing)"),
    ("linear", "linear layers"),
    ("linear_weights_read", "  weights read (memory bound)"),
    ("linear_flops", "  GEMM FLOPs (compute bound)"),
    ("lm_head", "lm_head (one token per request)"),
    ("kv_read", "KV read (decode attention)"),
    ("attention", "attention FLOPs (prefill)"),
    ("communication", "all-reduces (tp > 1)"),
    ("host", "engine host time (step, per request)"),
    ("total", "step"),
)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.3f} ms"


_ENGINE = {"vllm": "vLLM", "sglang": "SGLang"}


def _memory_lines(r: dict) -> list[str]:
    """Warnings when the decode batch cannot be held: a context beyond the model's, a server that
    would not start, or a batch whose KV cache is beyond vLLM's pool."""
    from kvplan.units import format_bytes

    m, lines = r.get("memory"), []
    if not m or m["fits"]:
        return lines
    if m["beyond_context"]:
        lines.append(f"{r['context']:,} tokens is beyond the model's context of {m['model_context']:,}")
    if m["reason"]:
        lines.append(f"no server holds this decode: {m['reason'].rstrip('.')}")
    elif m["max_concurrency"] < r["batch"]:
        lines.append(f"this decode does not fit: {r['batch']:,} requests of {r['context']:,} tokens hold "
                     f"{format_bytes(m['batch_kv_bytes'])} of KV cache per GPU, and {_ENGINE[r.get('engine', 'vllm')]}'s pool on {r['gpu']} "
                     f"(tp={r['tp']}) is {format_bytes(m['kv_pool_bytes'])}, at most {m['max_concurrency']:,} "
                     "such requests at once (kvplan size)")
    return [f"[yellow]warning:[/yellow] {terminal(line)}; the step is timed as asked" for line in lines]


def render_step(r: dict) -> None:
    from rich.table import Table

    out = console()
    engine = "" if r.get("engine", "vllm") == "vllm" else f", {_ENGINE[r['engine']]}"
    table = Table(title=f"Step time of {terminal(r['model'])} on {terminal(r['gpu'])} (tp={r['tp']}{engine})",
                  title_justify="left")
    table.add_column("term")
    table.add_column(f"decode: {r['batch']} x {r['context']:,} tokens", justify="right")
    table.add_column(f"prefill: {r['chunk']:,}-token chunk", justify="right")
    for key, label in TERMS:
        table.add_row(label, _ms(r["decode_s"][key]), _ms(r["prefill_s"][key]))
    table.add_row("tokens/s", f"{r['decode_tokens_per_s']:,.0f}", f"{r['prefill_tokens_per_s']:,.0f}")
    print_table(out, table)
    api = r["api_server_s"]
    out.print(f"API server (outside the steps): {_ms(api['per_request'])} of a request's TTFT and E2E, "
              f"{_ms(api['while_decode_streams'])} while this decode streams {r['decode_tokens_per_s']:,.0f} "
              f"tokens/s at {api['per_streamed_token'] * 1e6:,.0f} us a token; requests taken in one at a "
              f"time, {_ms(api['intake_one_at_a_time'])} each")
    for line in _memory_lines(r):
        out.print(line)
    host = ("async scheduling: the host time overlaps the GPU's, a step takes the longer of the two"
            if r["decode_s"]["host_overlapped"] else "synchronous scheduling: the host time adds to the GPU's")
    out.print(f"[dim]{host}; the larger of weights read and GEMM FLOPs counts for each GEMM; weights "
              f"{terminal(r['weights_scheme'])}{', fp8 compute' if r['fp8_compute'] else ''}, KV {terminal(r['kv_dtype'])}"
              f"{', eager' if r['enforce_eager'] else ', CUDA graphs'}; model: kvplan/model/step_time.py[/dim]")
