"""Option types that several commands share, so each is spelled and explained once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]
KvDtypeOpt = Annotated[str, typer.Option("--kv-dtype", help="auto, fp32, bf16, fp16, fp8, int8 or int4 (auto = the config's dtype; vLLM's fp8_e4m3 and fp8_e5m2 are fp8).")]
TpOpt = Annotated[int, typer.Option("--tp", help="Tensor-parallel degree: KV heads split across GPUs.")]
TimingProfileOpt = Annotated[Optional[Path], typer.Option("--timing-profile", help="Step-time constants fitted on your own runs (a file written by kvplan calibrate) instead of the shipped ones.")]
SpeculativeOpt = Annotated[Optional[str], typer.Option(
    help="Speculative decoding, vLLM's speculative-config method: eagle, eagle3, mtp, ngram.")]
NumSpeculativeTokensOpt = Annotated[Optional[int], typer.Option(
    help="With --speculative: draft tokens per step (vLLM's num_speculative_tokens; default 3, or the --acceptance list's length).")]
AcceptanceOpt = Annotated[Optional[str], typer.Option(
    help="With --speculative: per-position acceptance rates, e.g. 0.8,0.6,0.4 (default: the method's published rate).")]
