"""Option types that several commands share, so each is spelled and explained once."""

from __future__ import annotations

from typing import Annotated

import typer

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]
KvDtypeOpt = Annotated[str, typer.Option("--kv-dtype", help="auto, fp32, bf16, fp16, fp8, int8 or int4 (auto = the config's dtype).")]
TpOpt = Annotated[int, typer.Option("--tp", help="Tensor-parallel degree: KV heads split across GPUs.")]
