"""Why kvplan's "requests at once" and vLLM's "Maximum concurrency" differ for a model with
sliding-window layers, in one note of `kvplan size` (shown only where the two differ).

Both divide the same pool. kvplan counts what one request of max_model_len holds once it runs:
a sliding-window layer keeps at most its window (kvplan/model/fit.py, `pool_fit`). vLLM's start-up
line charges a sliding-window layer min(window - 1 + max_num_batched_tokens, max_model_len) tokens
and a block more (kvplan/model/vllm_kv_groups.py, `blocks_per_request`): the window plus one
prefill chunk, what the layer may hold while a long prompt is prefilled in chunks. With vLLM's
default batch of 8,192 (2,048 on smaller GPUs) that is often all of max_model_len, so its line
counts the sliding layers as if they were full-attention ones.
"""

from __future__ import annotations

from kvplan.model.fit import SizeReport
from kvplan.model.layout import KVLayout


def concurrency_note(report: SizeReport, layout: KVLayout, batched_tokens: int,
                     batch_assumed: bool = False) -> str | None:
    """The note, or None where the two counts agree (or there is no sliding-window layer)."""
    if report.vllm_concurrency is None or report.max_concurrency is None or report.reason:
        return None
    sliding = [g for g in layout.groups if g.kind == "sliding" and g.num_layers]
    if not sliding or int(report.vllm_concurrency) == report.max_concurrency:
        return None
    window = sliding[0].window
    tokens = report.tokens
    charged = min(window - 1 + batched_tokens, tokens)
    how = ("all of max_model_len, as if they were full-attention layers" if charged == tokens
           else f"{charged:,} tokens")
    return (f"{report.max_concurrency:,} requests at once against vLLM's {report.vllm_concurrency:.2f}x: "
            f"kvplan counts what a request of {tokens:,} tokens holds, {window:,} tokens (the window) in "
            f"each of the {sum(g.num_layers for g in sliding)} sliding-window layers; vLLM's Maximum "
            f"concurrency line charges those layers the window plus a prefill chunk of "
            f"max_num_batched_tokens {batched_tokens:,}, here {how}."
            + (f" Without a GPU the chunk is taken as {batched_tokens:,}, vLLM's default on GPUs of 70 GiB or "
               "more but the A100 (2,048 on others): --gpu or --max-num-batched-tokens sets it."
               if batch_assumed else ""))
