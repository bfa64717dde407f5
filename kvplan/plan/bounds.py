"""What one configuration can do at best, in closed form, before anything is simulated.

The serve engine times a step with the clock's formula (kvplan/sim/timing.py: StepClock.step_ticks),
which only grows with the tokens, the requests, the KV read and the attention pairs of the step.
So, whatever the load:
- a request's TPOT is at least one decode step of it alone (one token, one request, its prompt's
  KV read), and its TTFT at least the API server's latency plus its prompt prefilled alone (its
  chunks of at most max_num_batched_tokens; one token where a prefix cache could hit); its E2E at
  least both. A p99 over the requests is at least the value of the lower neighbour of its rank
  among these floors (numpy's interpolated p99 lies between two neighbouring order statistics, and
  a request's value is at least its floor), so a target below it is missed at every rate.
- the rate one replica sustains is at most N / (the least engine time N requests take): every
  request needs its prompt + output - 1 tokens processed at no less than the cheapest per-token
  linear cost any batch within the token budget reaches (min over t of linear(t) / t), its decode
  tokens' KV read (at least its prompt each), its prompt's attention pairs, at least `output`
  scheduled steps (the per-request costs), and the N x output request-steps take at least
  N x output / max_num_seqs steps (the per-step costs); a step lasts at least its GPU time and at
  least its host time (in series the sum, overlapped the larger: either way at least each).
  SGLang's scheduler (setup.sglang) has the same bounds with its own limits: prefill chunks of
  chunked_prefill_size, max_running_requests for max_num_seqs, and the cheapest token over steps
  as large as either (its decode steps are not held to the chunk).

These bounds are what `plan` orders and prunes its search by (kvplan/plan/search.py); the
infeasible ones give their reason in words without a run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvplan.model.step_time import prefill_pairs


@dataclass(frozen=True, slots=True)
class Bounds:
    ttft_s: float  # a floor under the p99 TTFT at any load (API server included)
    tpot_s: float  # under the p99 TPOT
    e2e_s: float  # under the p99 E2E
    rate: float  # requests/s: a ceiling over what one replica sustains
    lone_tpot_s: float  # the TPOT of the median request alone (for the words of a reason)


def _rank_low(n: int) -> int:
    """The index of the lower neighbour of numpy's p99 among n sorted values."""
    return int(math.floor(0.99 * (n - 1)))


def _lone_prefill_ticks(clock, prompt: int, budget: int) -> int:
    ticks, held = 0, 0
    while held < prompt:
        chunk = min(budget, prompt - held)
        ticks += clock.step_ticks(0, chunk, 1, prefill_pairs(chunk, held))
        held += chunk
    return ticks


def _cheapest_token_ticks(clock, budget: int) -> float:
    """min over 1 <= t <= budget of linear(t) / t."""
    if not clock.physical:
        return 0.0
    top = min(budget, len(clock.linear) - 1)
    table = np.asarray(clock.linear[1:top + 1], dtype=np.float64) / np.arange(1, top + 1)
    best = float(table.min()) if len(table) else math.inf
    if budget > top:  # beyond the table: linear(t) = linear(last) + (t - last) x slope
        last = len(clock.linear) - 1
        best = min(best, (clock.linear[last] + (budget - last) * clock.linear_slope) / budget)
    return best


def bounds(setup, prompts: np.ndarray, outputs: np.ndarray, prefix_hits: bool) -> Bounds:
    """The bounds of `setup`'s replica serving requests of these lengths. `prefix_hits`: a prefix
    cache could skip part of a prompt (prefix caching on, and requests that share prefixes)."""
    clock, sched = setup.clock, setup.sched
    per = clock.ticks_per_unit
    n = len(prompts)
    if not clock.timed or n == 0:
        return Bounds(0.0, 0.0, 0.0, math.inf, 0.0)
    budget, cap = max(1, sched.max_num_batched_tokens), max(1, sched.max_num_seqs)
    linear_budget = budget  # the most tokens of one step
    if setup.sglang is not None:  # SGLang: prefill chunks of chunked_prefill_size (0: a whole prompt) in steps
        g = setup.sglang  # of their own, decodes of up to max_running_requests tokens
        budget, cap = (g.chunked_prefill_size or 2**31), max(1, g.max_running_requests)
        linear_budget = max(g.chunked_prefill_size or max(g.max_prefill_tokens, int(prompts.max(initial=1))), cap)
    k = _rank_low(n)
    p_sorted, o_sorted = np.sort(prompts), np.sort(outputs)
    p_min, p_k = int(p_sorted[0]), int(p_sorted[k])

    def decode(p: int) -> int:
        return clock.step_ticks(p, 1, 1, 0)

    tpot = decode(p_k)  # requests with one output token have no TPOT: p_k bounds those that do too
    uncached = 1 if prefix_hits else p_k
    ttft = clock.frontend + _lone_prefill_ticks(clock, uncached, budget)
    e2e = max(ttft, clock.frontend + decode(p_min) * max(int(o_sorted[k]) - 1, 0))
    # the least engine time of all n requests
    p64, o64 = prompts.astype(np.float64), outputs.astype(np.float64)
    decodes = np.maximum(o64 - 1, 0)
    tokens = float((decodes + (1 if prefix_hits else p64)).sum())
    kv = float((decodes * p64).sum())
    pairs = 0.0 if prefix_hits else float((p64 * (p64 + 1) / 2).sum())
    request_steps = float(np.maximum(o64, 1).sum())
    emit = 1 + setup.speculative.k if getattr(setup, "speculative", None) is not None else 1
    if emit > 1:  # speculative decoding: a step emits at most 1 + k tokens of a request, and takes
        #   no less than the step of its one token (its drafts only add tokens and passes)
        tpot /= emit
        e2e = max(ttft, clock.frontend + decode(p_min) * max(int(o_sorted[k]) - 1, 0) / emit)
        kv /= emit
        request_steps /= emit
    steps = request_steps / cap
    if clock.physical:
        gpu = (clock.overhead * steps + clock.per_request * request_steps + _cheapest_token_ticks(clock, linear_budget) * tokens
               + clock.kv_per_token * kv + clock.attention_per_pair * pairs)
        host = clock.host * steps + clock.host_per_request * request_steps
        least = max(gpu, host)
    else:  # the roofline: every step reads the weights (at least the steps counted) and its KV
        least = max(clock.overhead * steps + clock.weights * steps + clock.kv_per_token * kv,
                    clock.compute_per_token * tokens)
    rate = n * per / least if least > 0 else math.inf
    median = int(p_sorted[n // 2])
    return Bounds(ttft / per, tpot / per, e2e / per, rate, decode(median) / per)


def miss_reason(b: Bounds, targets) -> str | None:
    """Why no rate meets the targets, in words, when a floor is above one (None: none is)."""
    if targets.goodput is not None:
        return None  # a share of the requests, not a p99: the floors above are p99s
    if targets.tpot_p99 is not None and b.tpot_s > targets.tpot_p99:
        return (f"one request alone already takes {1e3 * b.tpot_s:.1f} ms per output token, above the "
                f"{1e3 * targets.tpot_p99:g} ms TPOT target (a decode step reads the weights and the KV "
                f"at the GPU's bandwidth)")
    if targets.ttft_p99 is not None and b.ttft_s > targets.ttft_p99:
        return (f"one request alone already waits {b.ttft_s:.3g} s for its first token (its prompt "
                f"prefilled alone, and the API server), above the {targets.ttft_p99:g} s TTFT target")
    if targets.e2e_p99 is not None and b.e2e_s > targets.e2e_p99:
        return (f"one request alone already takes {b.e2e_s:.3g} s end to end, above the "
                f"{targets.e2e_p99:g} s E2E target")
    return None


__all__ = ["Bounds", "bounds", "miss_reason"]
