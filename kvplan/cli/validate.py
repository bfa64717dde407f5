"""`kvplan validate MODEL`: real paged attention in torch against kvplan's byte accounting."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from kvplan.cli.options import JsonOpt, KvDtypeOpt, TpOpt


def validate(
    model: Annotated[str, typer.Argument(help="Model id or path to a config.json.")],
    layers: Annotated[int, typer.Option(help="Layers to build (the model's layer kinds are kept).")] = 2,
    block_size: Annotated[int, typer.Option(help="Paged KV block size in tokens.")] = 16,
    num_blocks: Annotated[Optional[int], typer.Option(help="Blocks in the pool (default: enough for the requests).")] = None,
    kv_dtype: KvDtypeOpt = "auto",
    tp: TpOpt = 1,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    json: JsonOpt = False,
) -> None:
    """Run real paged attention in torch and check kvplan's byte accounting against it.

    Needs the torch extra. Exit 1 when a check fails.
    Example: kvplan validate meta-llama/Meta-Llama-3-8B --layers 2 --device cpu
    """
    from kvplan.backends.torch import run_validation

    result = run_validation(model, layers=layers, block_size=block_size, num_blocks=num_blocks,
                            kv_dtype=kv_dtype, tp=tp, device=device)
    if json:
        from kvplan.report.output import emit_json

        emit_json(result.to_dict())
    else:
        from kvplan.report.validate_view import render_validation

        render_validation(result)
    if not result.ok:
        raise SystemExit(1)
