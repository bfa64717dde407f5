"""A user's own `vllm bench serve --save-result` files as calibration cases.

Each run (a whole-file JSON object, or one line of `--append-result` output) is restated as the
benchmark ran it: the model on the GPU at the server's TP, vLLM's start-up KV pool (kvplan size's
prediction) and `vllm serve`'s scheduler defaults unless the server's settings are given; the
requests' own token counts where the file lists them (`--save-detailed`), else every request at
the run's mean lengths (total tokens over completed requests); arrivals from the run's
`request_rate` (Poisson; "inf": all at once) or a closed loop of `max_concurrency` clients
(kvplan/calibrate/runs.py). What is compared is what the file states: output tokens/s, mean
TTFT, mean TPOT (else ITL) and mean E2E.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from kvplan.errors import TraceError, UsageError
from kvplan.workload.spec import WorkloadSpec


@dataclass(frozen=True, slots=True)
class Server:
    """The server the runs were measured on, as `vllm serve` was started."""

    model: str
    gpu: str
    tp: int = 1
    kv_dtype: str = "auto"
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    async_scheduling: bool = True  # vLLM 0.14 and later (kvplan/model/step_time.SCHEDULER_ASYNC_FROM)


@dataclass(frozen=True, slots=True)
class Run:
    """One measured run of a result file."""

    path: str
    line: int | None
    detailed: bool  # per-request token counts in the file
    mean_prompt: float
    mean_output: float
    count: int
    rate: float | None  # requests/s; None: all at once
    clients: int  # closed-loop clients (max_concurrency), 0 for none
    measured: dict  # {throughput, ttft_ms, itl_ms, e2e_s, stat}

    @property
    def name(self) -> str:
        return Path(self.path).name + (f":{self.line}" if self.line else "")


def _number(run: dict, key: str, path, line, *, required: bool = False, positive: bool = True):
    v = run.get(key)
    if v is None and not required:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (positive and v <= 0):
        raise TraceError(f"expected a {'positive ' if positive else ''}number, got {json.dumps(v)[:40]}",
                         file=path, line=line, field=key)
    return float(v)


def read_runs(path: str | Path) -> list[Run]:
    """Every run of a `vllm bench serve --save-result` file (SGLang's bench_serving JSONL too)."""
    from kvplan.workload.traces.bench_results import benchmark_runs

    path = Path(path)
    out = []
    runs = benchmark_runs(path)
    for line, run in runs:
        completed = _number(run, "completed", path, line, required=True)
        total_in = _number(run, "total_input_tokens", path, line, required=True)
        total_out = _number(run, "total_output_tokens", path, line, required=True)
        rate = run.get("request_rate")
        if rate in ("inf", None) or (isinstance(rate, float) and math.isinf(rate)):
            rate = None
        else:
            rate = _number(run, "request_rate", path, line)
        clients = run.get("max_concurrency")
        clients = int(_number(run, "max_concurrency", path, line)) if clients is not None else 0
        ms = lambda k: _number(run, k, path, line)  # noqa: E731
        e2e = ms("mean_e2el_ms") or ms("mean_e2e_latency_ms")
        measured = {"throughput": ms("output_throughput"), "ttft_ms": ms("mean_ttft_ms"),
                    "itl_ms": ms("mean_tpot_ms") or ms("mean_itl_ms"), "e2e_s": e2e / 1e3 if e2e else None,
                    "stat": "mean"}
        if not any(v for k, v in measured.items() if k != "stat"):
            raise TraceError("states none of output_throughput, mean_ttft_ms, mean_tpot_ms, mean_e2el_ms: "
                             "save it with vllm bench serve --save-result", file=path, line=line)
        # a trace replay reads every run of a file: per-request lengths only from a file of one run
        detailed = isinstance(run.get("input_lens"), list) and len(runs) == 1
        out.append(Run(str(path.resolve()), line, detailed,
                       total_in / completed, total_out / completed, int(completed), rate, clients, measured))
    return out


def run_spec(server: Server, run: Run) -> WorkloadSpec:
    """The workload of one run (the pool is vLLM's at start-up, from kvplan size)."""
    from kvplan.experiments import flag_spec
    from kvplan.model.size import size
    from kvplan.workload.distributions import AllAtOnce, Fixed, Lengths, Poisson
    from kvplan.workload.spec import AllocatorSpec
    from kvplan.workload.spec import PoolRequest, SchedulerSpec, SyntheticRequests, TraceRequests

    longest = int(math.ceil(run.mean_prompt + run.mean_output)) + 1
    report = size(server.model, gpu=server.gpu, tp=server.tp, tokens=max(longest, 4096), kv_dtype=server.kv_dtype,
                  max_num_seqs=server.max_num_seqs or None, max_num_batched_tokens=server.max_num_batched_tokens or None,
                  explore=False).report
    if not report.fits:
        raise UsageError(f"vLLM would not serve it: {report.reason or 'one request does not fit'}", field="--model")
    arrival = Poisson(float(run.rate)) if run.rate and not run.clients else AllAtOnce()
    if run.detailed:
        from kvplan.fileio import input_path

        requests = TraceRequests("vllm-bench", Path(input_path(Path(run.path), UsageError)), arrival=arrival)
    else:
        requests = SyntheticRequests(run.count, Lengths(Fixed(max(1, round(run.mean_prompt))), 1),
                                     Lengths(Fixed(max(1, round(run.mean_output))), 0), arrival)
    return flag_spec(lambda: WorkloadSpec(
        name="calibrate", experiment="serve", seed=0, model=server.model, gpu=server.gpu, tp=server.tp,
        kv_dtype=server.kv_dtype, pool=PoolRequest(kv_memory=report.kv_pool_bytes), requests=requests,
        allocators=(AllocatorSpec("paged", block_size=16),),
        scheduler=SchedulerSpec(max_model_len=max(longest, 4096), max_num_seqs=server.max_num_seqs or None,
                                max_num_batched_tokens=server.max_num_batched_tokens or None),
        path="(the flags)"))


@lru_cache(maxsize=64)
def _loaded(spec: WorkloadSpec):
    from kvplan.experiments import build_flags

    wl = build_flags(spec)
    chunks = list(wl.make_requests())
    cat = lambda name: np.concatenate([getattr(c, name) for c in chunks])  # noqa: E731
    return wl, cat("arrival"), cat("prompt_len"), cat("output_len")


def predict_run(arg, values: dict) -> dict:
    """{metric: (predicted, measured)} of one run at the constants `values` (a calibration case)."""
    from kvplan.calibrate.runs import measured_vs_predicted, run_benchmark
    from kvplan.model.step_time import StepConstants
    from kvplan.workload.chunks import RequestChunk

    spec, run, async_scheduling = arg
    wl, arrival, prompt, output = _loaded(spec)
    names = set(StepConstants.__dataclass_fields__)
    step = wl.timing.step
    step = replace(step.with_constants(replace(step.constants, **{k: v for k, v in values.items() if k in names})),
                   async_scheduling=async_scheduling)
    timing = replace(wl.timing, step=step)

    def workload(times, max_num_seqs=None):
        s = wl.scheduler if max_num_seqs is None else replace(
            wl.scheduler, max_num_seqs=min(max_num_seqs, wl.scheduler.max_num_seqs))
        return replace(wl, timing=timing, scheduler=s,
                       make_requests=lambda: iter([RequestChunk(times, prompt, output)]))

    r = run_benchmark(workload, arrival, wl.allocators[0], run.clients)
    return measured_vs_predicted(r, run.measured)
