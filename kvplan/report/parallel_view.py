"""Human output of `kvplan size --dp/--pp/--enable-expert-parallel`: each pipeline stage, and the
concurrency of one DP rank and of all of them (kvplan/model/parallel_size.py)."""

from __future__ import annotations

from kvplan.report.output import console, print_table
from kvplan.report.step_view import ms
from kvplan.units import format_bytes


def _size(n: int | None) -> str:
    return "-" if n is None else format_bytes(n)


def render_parallel(info: dict) -> None:
    from rich.table import Table

    out = console()
    ep = f", EP {info['ep']}" if info["enable_expert_parallel"] else ""
    table = Table(title=f"Parallelism: tp {info['tp']} x dp {info['dp']} x pp {info['pp']} = {info['gpus']} GPUs{ep}",
                  title_justify="left")
    for name in ("stage", "layers", "weights/GPU", "KV B/token/GPU", "pool/GPU", "blocks"):
        table.add_column(name, justify="right")
    for i, s in enumerate(info["stages"]):
        mark = " *" if i == info["bottleneck_stage"] and s["num_blocks"] is not None else ""
        table.add_row(f"{i}{mark}", f"{s['layers'][0]}-{s['layers'][1] - 1}", _size(s["weight_bytes"]),
                      f"{s['bytes_per_token']:,}", _size(s["kv_pool_bytes"]),
                      "-" if s["num_blocks"] is None else f"{s['num_blocks']:,}")
    print_table(out, table)
    if "vllm_concurrency_per_dp_rank" in info:
        out.print(f"per DP rank (one engine, its own scheduler and pool): {info['kv_tokens_per_dp_rank']:,} tokens, "
                  f"vLLM's concurrency {info['vllm_concurrency_per_dp_rank']:.2f}x; all {info['dp']} DP ranks: "
                  f"{info['vllm_concurrency_total']:.2f}x, {info['max_concurrency_total']:,} whole requests at once")
        if info["pp"] > 1:
            out.print("* the stage with the fewest blocks: vLLM gives every stage that many")


STEP_TERMS = (("moe_experts", "MoE experts, busiest rank"),
              ("all_to_all", "all-to-all (dispatch, combine)"),
              ("pipeline_send", "send to the next stage"),
              ("total", "step (this stage)"))


def render_parallel_step(r: dict) -> None:
    """The terms `kvplan step --dp/--pp/--enable-expert-parallel` adds to the table above (whose
    step row is the slowest stage's, with them), and the deployment's throughput."""
    from rich.table import Table

    p = r["parallel"]
    out = console()
    ep = f", EP {p['ep']}" if p["enable_expert_parallel"] else ""
    table = Table(title=f"Parallelism: tp {p['tp']} x dp {p['dp']} x pp {p['pp']} = {p['gpus']} GPUs{ep}",
                  title_justify="left")
    table.add_column("term")
    table.add_column(f"decode, stage {p['decode_slowest_stage']}", justify="right")
    table.add_column(f"prefill, stage {p['prefill_slowest_stage']}", justify="right")
    for key, label in STEP_TERMS:
        table.add_row(label, ms(r["decode_s"][key]), ms(r["prefill_s"][key]))
    print_table(out, table)
    out.print(f"decode: {p['decode_tokens_per_s_total']:,.0f} tokens/s over all {p['dp']} DP ranks, "
              f"{p['decode_tokens_per_s_per_gpu']:,.0f} per GPU; a request's token every "
              f"{r['decode_itl_s'] * 1e3:,.2f} ms; prefill: {p['prefill_tokens_per_s_total']:,.0f} tokens/s, "
              f"{p['prefill_tokens_per_s_per_gpu']:,.0f} per GPU")
    notes = ["--batch and --chunk are per DP rank"]
    if p["all2all_backend"]:
        notes.append(f"all-to-all {p['all2all_backend']}{', overlapped (DBO)' if p['enable_dbo'] else ''}, "
                     f"network {p['network_bytes_per_s'] * 8 / 1e9:,.0f} Gb/s per GPU")
    if p["expert_imbalance"]:
        notes.append(f"busiest EP rank {p['expert_imbalance']:.2f}x the mean")
    if p["pp"] > 1:
        notes.append(f"{p['pp']} micro-batches in flight, one per stage")
    out.print(f"[dim]{'; '.join(notes)}; model: kvplan/model/parallel_step.py[/dim]")
