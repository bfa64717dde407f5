"""Running a measured benchmark through the serve engine: open loops as they are, closed loops of
N clients (`vllm bench serve --max-concurrency N`) from the answers of an engine capped at N."""

from __future__ import annotations

import bisect
from typing import Callable

import numpy as np

def closed_loop_sends(answered: np.ndarray, clients: int) -> np.ndarray:
    """When each request is sent by `clients` clients in a closed loop (vllm bench serve's
    --max-concurrency: a semaphore of that many slots, requests taken in order): the first
    `clients` at 0, request i once i - clients + 1 answers are back, i.e. at the (i - clients)-th
    smallest (from 0) of the answer times of requests 0 .. i-1."""
    n = len(answered)
    sends = np.zeros(n)
    done = sorted(answered[:clients - 1].tolist())
    for i in range(clients, n):
        bisect.insort(done, float(answered[i - 1]))
        sends[i] = done[i - clients]
    return sends


def run_benchmark(workload: Callable, arrival: np.ndarray, alloc, clients: int = 0):
    """The serve result of a benchmark: `workload(arrival, max_num_seqs=None)` builds the run.

    Open loop (clients 0): the arrivals as given. A closed loop of N clients: first a run whose
    engine holds N requests at most, all waiting from the start, so a request enters when one
    leaves; a client sends its next request when its answer is back, after the API server's
    share, so the sends are those answers (closed_loop_sends); then the run at those sends, with
    the engine's own max_num_seqs, is the benchmark. Iterating further does not settle (discrete
    steps make the rounds swing about the fixed point, and drift), and starting the N clients out
    of phase instead of together fitted the corpus worse (closed-loop throughput 13% -> 24%, TTFT
    29% -> 31%): one round it is."""
    from kvplan.sim.engine import simulate

    if not clients or clients >= len(arrival):
        return simulate(workload(arrival), alloc)
    r = simulate(workload(arrival, clients), alloc, record_requests=True)
    cols = r.requests.columns
    frontend = r.e2e.mean - float(np.mean(cols["finish"] - cols["arrival"]))  # what the client adds
    return simulate(workload(closed_loop_sends(cols["finish"] + frontend, clients)), alloc, record_requests=True)


def measured_vs_predicted(r, measured: dict) -> dict:
    """{metric: (predicted, measured)} for the metrics a run states: output tokens/s, TTFT and
    TPOT/ITL in ms, E2E in s; `measured` holds them with their statistic ("mean" or "median")."""
    def stat(dist, which):
        return dist.p50 if which == "median" else dist.mean

    out = {}
    if measured.get("throughput"):
        out["throughput"] = (r.throughput_tps, measured["throughput"])
    if measured.get("ttft_ms"):
        out["ttft"] = (stat(r.ttft, measured.get("stat")) * 1e3, measured["ttft_ms"])
    if measured.get("itl_ms"):
        out["itl"] = (stat(r.tpot, measured.get("stat")) * 1e3, measured["itl_ms"])
    if measured.get("e2e_s"):
        out["e2e"] = (stat(r.e2e, measured.get("stat")), measured["e2e_s"])
    return out
