"""Goodput: the requests within every latency limit of an `slo:` (kvplan/workload/spec.SloSpec),
all at once, as DistServe defines SLO attainment and vLLM's benchmark counts --goodput.

`client_latencies` gives each request's TTFT, TPOT and E2E as a client measures them (TPOT NaN
for a request of one output token, which has none and meets any TPOT limit); the serve engine's
percentiles (kvplan/sim/metrics.latency_arrays), the fleet's (kvplan/fleet/run.py) and its rows
all come from it. `within` tells which requests meet every limit; `goodput` sums them up over the
run's span. The serve engine, the fleet and `kvplan plan`'s goodput target
(kvplan/plan/rows.attainment) all count with `within`.
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
    return goodput_of(limits, int(np.count_nonzero(ok)), len(ok), span_s)


def goodput_of(limits, met: int, requests: int, span_s: float) -> dict:
    """`goodput` from counts: `met` of `requests` within the limits over `span_s` seconds."""
    return {**limits.to_dict(), "share": met / requests if requests else 1.0, "requests": met,
            "rps": met / span_s if span_s else 0.0}


def client_latencies(sent, first_token, finish, output, frontend=0, per_unit: int = 1) -> dict[str, np.ndarray]:
    """Per request, in the unit of the times divided by `per_unit` (ticks per second; 1 for times
    in seconds): TTFT and E2E from the client's send, each with the API server's `frontend` share
    (one number or one per request), and TPOT over the output tokens after the first (NaN for a
    request of one)."""
    many = output > 1
    tpot = np.full(len(output), np.nan)
    tpot[many] = ((finish - first_token)[many] / per_unit) / (output[many] - 1)
    return {"ttft": (first_token - sent + frontend) / per_unit, "tpot": tpot,
            "e2e": (finish - sent + frontend) / per_unit}
