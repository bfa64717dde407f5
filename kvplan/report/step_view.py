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


def ms(seconds: float) -> str:
    """A duration in milliseconds, three decimals (the step tables' cells)."""
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
        table.add_row(label, ms(r["decode_s"][key]), ms(r["prefill_s"][key]))
    table.add_row("tokens/s", f"{r['decode_tokens_per_s']:,.0f}", f"{r['prefill_tokens_per_s']:,.0f}")
    print_table(out, table)
    api = r["api_server_s"]
    out.print(f"API server (outside the steps): {ms(api['per_request'])} of a request's TTFT and E2E, "
              f"{ms(api['while_decode_streams'])} while this decode streams {r['decode_tokens_per_s']:,.0f} "
              f"tokens/s at {api['per_streamed_token'] * 1e6:,.0f} us a token; requests taken in one at a "
              f"time, {ms(api['intake_one_at_a_time'])} each")
    for line in _memory_lines(r):
        out.print(line)
    if r.get("speculative"):
        _render_speculative(out, r)
    host = ("async scheduling: the host time overlaps the GPU's, a step takes the longer of the two"
            if r["decode_s"]["host_overlapped"] else "synchronous scheduling: the host time adds to the GPU's")
    out.print(f"[dim]{host}; the larger of weights read and GEMM FLOPs counts for each GEMM; weights "
              f"{terminal(r['weights_scheme'])}{', fp8 compute' if r['fp8_compute'] else ''}, KV {terminal(r['kv_dtype'])}"
              f"{', eager' if r['enforce_eager'] else ', CUDA graphs'}; model: kvplan/model/step_time.py[/dim]")


def _render_speculative(out, r: dict) -> None:
    """The decode step with speculative decoding beside the plain one, and by batch size."""
    from rich.table import Table

    sp, st = r["speculative"], r["speculative"]["step"]
    rates = ", ".join(f"{x:.2f}" for x in sp["acceptance"])
    source = "given" if sp["acceptance_given"] else "the method's published default"
    out.print(f"Speculative decoding: {terminal(sp['method'])}, {sp['num_speculative_tokens']} draft tokens a step, "
              f"acceptance per position {rates} ({source}): {st['tokens_per_request_step']:.2f} tokens a request "
              f"a step; the draft's KV adds {sp['draft_kv_bytes_per_token']:,} bytes a token"
              f"{_draft_weights(sp)}")
    host = (f" + host {ms(st['serial_host_s'])} (no overlap scheduler while speculating)"
            if "serial_host_s" in st else "")
    out.print(f"  at batch {r['batch']}: verify {st['tokens_verified']:,} tokens {ms(st['verify_s'])} + draft "
              f"{ms(st['draft_s'])}{host} = step {ms(st['step_s'])}; TPOT {ms(st['tpot_s'])} against "
              f"{ms(st['tpot_plain_s'])} without ({st['speedup']:.2f}x), {st['output_tokens_per_s']:,.0f} output "
              f"tokens/s against {st['output_tokens_per_s_plain']:,.0f}")
    table = Table(title="Speedup as the batch grows", title_justify="left")
    for name in ("batch", "TPOT", "TPOT without", "speedup"):
        table.add_column(name, justify="right")
    for row in sp["by_batch"]:
        table.add_row(str(row["batch"]), ms(row["tpot_s"]), ms(row["tpot_plain_s"]), f"{row['speedup']:.2f}x")
    print_table(out, table)


def _draft_weights(sp: dict) -> str:
    size = sp["draft_weight_bytes_per_gpu"]
    return f", its weights {size / 2**30:.2f} GiB a GPU" if size else ""
