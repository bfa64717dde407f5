"""Goodput: the requests within every latency limit of an `slo:` (kvplan/workload/spec.SloSpec),
all at once, as DistServe defines SLO attainment and vLLM's benchmark counts --goodput.

`within` takes per-request client latencies (TTFT, TPOT, E2E in seconds; TPOT NaN for a request
of one output token, which has none and meets any TPOT limit); `goodput` sums them up over the
run's span. The serve engine (kvplan/sim/engine.py), the fleet (kvplan/fleet/run.py) and `kvplan
plan`'s goodput target (kvplan/plan/rows.attainment) all count with `within`.
"""

from __future__ import annotations

import numpy as np


def within(limits, ttft: np.ndarray, tpot: np.ndarray, e2e: np.ndarray) -> np.ndarray:
    """Per request, whether each latency is within its limit (`limits`: ttft_s, tpot_s, e2e_s,
    each None for no limit)."""
    ok = np.ones(len(e2e), dtype=bool)
    if limits.ttft_s is not None:
        ok &= ttft <= limits.ttft_s
    if limits.e2e_s is not None:
        ok &= e2e <= limits.e2e_s
    if limits.tpot_s is not None:
        ok &= np.isnan(tpot) | (tpot <= limits.tpot_s)
    return ok


def goodput(limits, ok: np.ndarray, span_s: float) -> dict:
    """The limits, the share of requests within them all, how many, and their rate over the run's
    span (requests/s: DistServe's goodput)."""
    met = int(np.count_nonzero(ok))
    return {**limits.to_dict(), "share": met / len(ok) if len(ok) else 1.0, "requests": met,
            "rps": met / span_s if span_s else 0.0}


def per_request_tpot(first_token: np.ndarray, finish: np.ndarray, output: np.ndarray) -> np.ndarray:
    """Seconds per output token after the first (times in seconds), NaN where there is one token."""
    many = output > 1
    out = np.full(len(output), np.nan)
    out[many] = (finish[many] - first_token[many]) / (output[many] - 1)
    return out
