"""`kvplan plan MODEL`: check every option, search the deployments, report the cheapest first."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from kvplan.cli.options import AcceptanceOpt, JsonOpt, NumSpeculativeTokensOpt, SpeculativeOpt, TimingProfileOpt
from kvplan.cpus import cpus_available
from kvplan.errors import UsageError
from kvplan.workload.routing import ROUTER_NAMES

DEFAULT_TPS = "1,2,4,8"


def plan(
    model: Annotated[str, typer.Argument(help="The model served (any kvplan size argument).")],
    rate: Annotated[Optional[float], typer.Option(help="Requests/s to serve in all (Poisson arrivals; with --workload, its arrivals scaled; default its own rate). Without it, --gpus or --budget: the most traffic within the limit.")] = None,
    prompt: Annotated[str, typer.Option(help="Prompt tokens of every request (1000; 2k).")] = "1000",
    output: Annotated[str, typer.Option(help="Output tokens of every request.")] = "200",
    count: Annotated[Optional[int], typer.Option(help="Requests simulated per run (default 10,000: a p99 over 100 requests' tail; with --workload, all of its requests).")] = None,
    workload: Annotated[Optional[Path], typer.Option(help="The traffic from a workload file: its requests (lengths, arrivals or a trace, prefixes); its model, GPU and pool are the search's.")] = None,
    ttft_p99: Annotated[Optional[float], typer.Option("--ttft-p99", help="Target p99 time to first token, s.")] = None,
    tpot_p99: Annotated[Optional[float], typer.Option("--tpot-p99", help="Target p99 time per output token, s.")] = None,
    e2e_p99: Annotated[Optional[float], typer.Option("--e2e-p99", help="Target p99 end-to-end latency, s.")] = None,
    goodput: Annotated[Optional[float], typer.Option(help="Instead of p99s: the share of requests (0.9) that must meet the TTFT, TPOT and E2E limits given, all at once.")] = None,
    gpu: Annotated[Optional[str], typer.Option(help="GPUs to consider: a list (H100-80GB,L40S); default every GPU with a price in the tiers searched.")] = None,
    tp: Annotated[str, typer.Option(help="Tensor-parallel degrees to consider.")] = DEFAULT_TPS,
    kv_dtype: Annotated[str, typer.Option("--kv-dtype", help="KV dtypes to consider: auto,fp8.")] = "auto",
    max_num_seqs: Annotated[Optional[str], typer.Option("--max-num-seqs", help="max_num_seqs values to consider (default vLLM's for the GPU); for SGLang its max_running_requests (default SGLang's).")] = None,
    max_num_batched_tokens: Annotated[Optional[str], typer.Option("--max-num-batched-tokens", help="max_num_batched_tokens values to consider: 2048,8192 (default vLLM's for the GPU); for SGLang its chunked_prefill_size (default SGLang's).")] = None,
    block_size: Annotated[str, typer.Option("--block-size", help="KV block sizes to consider: 16,32 (vLLM's; SGLang's pages hold one token).")] = "16",
    prefix_caching: Annotated[str, typer.Option("--prefix-caching", help="Automatic prefix caching (SGLang: its radix cache): on, off, or on,off to compare.")] = "on",
    engine: Annotated[str, typer.Option("--engine", help="Serving engines to consider: vllm, sglang, or vllm,sglang to compare (SGLang's scheduler on the pool SGLang starts with, its default mem_fraction_static).")] = "vllm",
    quantization: Annotated[str, typer.Option(help="Weights to consider: none (the checkpoint's), fp8, awq, gptq-int4, gptq-int8 (the re-uploads quantized so).")] = "none",
    dp: Annotated[str, typer.Option("--dp", help="Data-parallel sizes to consider (vLLM's --data-parallel-size, MoE models): 1,2,4,8. A replica is then dp engines of --tp GPUs each, stepping in lockstep, across nodes where tp x dp exceeds one (their all-to-all over --network-gbps).")] = "1",
    expert_parallel: Annotated[str, typer.Option("--expert-parallel", help="vLLM's --enable-expert-parallel (MoE models): on, off, or on,off to compare.")] = "off",
    network_gbps: Annotated[Optional[float], typer.Option("--network-gbps", help="With --dp or --expert-parallel: each GPU's network in Gb/s, for the all-to-all beyond a node (default: the GPU's).")] = None,
    all2all_backend: Annotated[Optional[str], typer.Option("--all2all-backend", help="With --dp or --expert-parallel: vLLM's all-to-all of the MoE layers: allgather_reducescatter (vLLM's default), deepep_high_throughput, deepep_low_latency.")] = None,
    gpus_per_node: Annotated[int, typer.Option("--gpus-per-node", help="GPUs in one node: no TP degree above it (one replica stays in a node).")] = 8,
    price: Annotated[Optional[list[str]], typer.Option(help="Override a price: GPU=USD per GPU-hour, any instance shape (repeatable).")] = None,
    prices: Annotated[Optional[Path], typer.Option(help="A price file replacing the shipped table (same JSON shape).")] = None,
    price_tier: Annotated[Optional[str], typer.Option("--price-tier", help="Price tiers to rent from: on-demand (default: data-centre clouds, no commitment), marketplace (third-party hosts, no SLA), reserved (a committed term), or any.")] = None,
    gpus_limit: Annotated[Optional[int], typer.Option("--gpus", help="At most this many GPUs: with --rate, the lowest p99 E2E within them; without, the most traffic.")] = None,
    budget: Annotated[Optional[float], typer.Option(help="At most this many $/hour: with --rate, the lowest p99 E2E within it; without, the most traffic.")] = None,
    headroom: Annotated[float, typer.Option(help="Share of each replica's capacity left unplanned (0.1: plan each replica at 90% of the highest rate it meets the targets at).")] = 0.10,
    frontier_span: Annotated[float, typer.Option("--frontier-span", help="Simulate for the frontier the configurations costing up to this many times the answer (2: what twice the money buys).")] = 2.0,
    check_seeds: Annotated[int, typer.Option("--check-seeds", help="Fresh samples of the traffic every answer is re-simulated on at its planned load (replicas are added until all meet the targets).")] = 2,
    router: Annotated[Optional[str], typer.Option(help=f"Check the replica count on a fleet behind this router, or the cheapest of a list ({', '.join(ROUTER_NAMES)}), or none (default round_robin; none with --dp or --expert-parallel).")] = None,
    disaggregate: Annotated[Optional[float], typer.Option(help="With --router: also try prefill/decode pools of the same GPUs, the KV sent over this many GB/s (1 ms latency); vLLM configurations only.")] = None,
    check_top: Annotated[int, typer.Option("--check-top", help="How many of the best configurations to check on the fleet.")] = 3,
    workers: Annotated[Optional[int], typer.Option(help="Evaluations in parallel (default: every core).")] = None,
    ray: Annotated[bool, typer.Option("--ray", help="Run the evaluations on Ray (the cluster at RAY_ADDRESS, else a local instance); needs kvplan[ray].")] = False,
    csv: Annotated[Optional[Path], typer.Option(help="Write the ranked table as CSV.")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="Write the cost/latency chart (.png or .svg).")] = None,
    html: Annotated[Optional[Path], typer.Option(help="Write a self-contained HTML report: the answer, the chart, the table, the assumptions.")] = None,
    timing_profile: TimingProfileOpt = None,
    speculative: SpeculativeOpt = None,
    num_speculative_tokens: NumSpeculativeTokensOpt = None,
    acceptance: AcceptanceOpt = None,
    json: JsonOpt = False,
) -> None:
    """Find the cheapest deployment that serves a traffic within latency targets.

    Example: kvplan plan meta-llama/Llama-3.1-8B-Instruct --rate 20 --prompt 1000 --output 200 --ttft-p99 2 --tpot-p99 0.05
    """
    from kvplan.cli.progress import StderrBar
    from kvplan.plan.prices import load_prices, parse_tiers
    from kvplan.plan.run import PlanRequest, plan_document
    from kvplan.report.files import check_writable, distinct_outputs

    if rate is None and workload is None and gpus_limit is None and budget is None:
        raise UsageError("expected the requests/s to serve (--rate), a --workload whose rate to take, or a limit "
                         "(--gpus, --budget) to serve the most within", field="--rate")
    rules = _rules(gpus_limit, budget, headroom, frontier_span, check_seeds)
    lengths = _lengths(rate, prompt, output, count)
    targets = _targets(ttft_p99, tpot_p99, e2e_p99, goodput)
    engines = _engines(engine, block_size)
    parallel = _parallel(model, dp, expert_parallel, network_gbps, engines, all2all_backend)
    routers, transfer = _fleet(_router(router, parallel != ([1], [False])), disaggregate, check_top)
    for name, target in (("--csv", csv), ("--plot", plot), ("--html", html)):
        if target is not None:
            check_writable(target, name)
    if plot is not None and plot.suffix.lower() not in (".png", ".svg"):
        raise UsageError(f"expected a .png or .svg file name, got {plot.name!r}", field="--plot")
    distinct_outputs({"--csv": csv, "--plot": plot, "--html": html})
    book = load_prices(prices, price, parse_tiers(price_tier))
    configs = _configs(model, _gpus(gpu, book), gpus_per_node, tp, quantization, kv_dtype, max_num_seqs,
                       max_num_batched_tokens, block_size, prefix_caching, engines, *parallel)
    n = workers if workers is not None else cpus_available()
    if not 1 <= n <= 1024:
        raise UsageError(f"expected 1 to 1,024 workers, got {n}", field="--workers")
    traffic = _traffic(rate, *lengths, count, workload, timing_profile)
    if network_gbps is not None or all2all_backend is not None:
        from dataclasses import replace

        traffic = replace(traffic, network_gbps=network_gbps, all2all_backend=all2all_backend)
    if speculative is not None or num_speculative_tokens is not None or acceptance is not None:
        from dataclasses import replace

        from kvplan.model.speculative import METHODS, SGLANG_METHODS, sglang_refusal

        method = str(speculative).lower()  # a method make_speculative knows that SGLang's engine does not take
        if "sglang" in engines and method in METHODS and method not in SGLANG_METHODS:
            raise UsageError(sglang_refusal("--engine sglang"), field="--speculative")
        traffic = replace(traffic, speculative=_speculative(model, speculative, num_speculative_tokens, acceptance,
                                                             routers))
    request = PlanRequest(model=model, traffic=traffic,
                          targets=targets, configs=configs, book=book, rules=rules, routers=routers,
                          check_top=check_top, transfer=transfer, workers=n,
                          ray=ray or bool(os.environ.get("RAY_ADDRESS")))
    with StderrBar("planning", len(configs), enabled=not json) as bar:
        doc = plan_document(request, progress=lambda done, total: bar.update(done))
    _write_files(doc, csv, plot, html)
    if json:
        from kvplan.report.output import emit_json

        emit_json(doc)
    else:
        from kvplan.report.plan_view import render_plan

        render_plan(doc)


def _finite(value: float, low: float, high: float, *, open_low: bool = False) -> bool:
    return math.isfinite(value) and (low < value if open_low else low <= value) and value <= high


def _rules(gpus_limit, budget, headroom, frontier_span, check_seeds):
    """The plan's rules: the limit (GPUs or $/hour), the headroom, the frontier, the fresh seeds."""
    from kvplan.plan.rows import Rules

    if gpus_limit is not None and not 1 <= gpus_limit <= 1_000_000:
        raise UsageError(f"expected 1 to 1,000,000 GPUs, got {gpus_limit}", field="--gpus")
    if budget is not None and not _finite(budget, 0, 1e9, open_low=True):
        raise UsageError(f"expected a budget above 0 and at most 1e9 $/hour, got {budget}", field="--budget")
    if not _finite(headroom, 0, 0.9):
        raise UsageError(f"expected a share of capacity from 0 to 0.9, got {headroom}", field="--headroom")
    if not _finite(frontier_span, 1, 1000):
        raise UsageError(f"expected 1 to 1,000 times the answer's cost, got {frontier_span}", field="--frontier-span")
    if not 0 <= check_seeds <= 16:
        raise UsageError(f"expected 0 to 16 fresh seeds, got {check_seeds}", field="--check-seeds")
    return Rules(headroom, tuple(range(1, check_seeds + 1)), gpus_limit, budget, frontier_span)


def _lengths(rate, prompt: str, output: str, count) -> tuple[int, int]:
    """The rate, prompt, output and count flags checked; the prompt and output lengths."""
    from kvplan.units import parse_count

    if rate is not None and not _finite(rate, 1e-3, 1e7):
        raise UsageError(f"expected a rate from 0.001 to 10,000,000 requests/s, got {rate}", field="--rate")
    p = parse_count(prompt, field="--prompt", high=2**31)
    o = parse_count(output, field="--output", high=2**31)
    if count is not None and not 10 <= count <= 1_000_000:
        raise UsageError(f"expected 10 to 1,000,000 requests per evaluation, got {count}", field="--count")
    return p, o


def _targets(ttft_p99, tpot_p99, e2e_p99, goodput):
    from kvplan.plan.rows import Targets

    for name, value in (("--ttft-p99", ttft_p99), ("--tpot-p99", tpot_p99), ("--e2e-p99", e2e_p99)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise UsageError(f"expected a positive number of seconds, got {value}", field=name)
    if ttft_p99 is None and tpot_p99 is None and e2e_p99 is None:
        raise UsageError("expected at least one latency target: --ttft-p99, --tpot-p99 or --e2e-p99 (without one "
                         "any latency would do, however long the queue)", field="--ttft-p99")
    if goodput is not None and not _finite(goodput, 0, 1, open_low=True):
        raise UsageError(f"expected a share of requests in (0, 1], got {goodput}", field="--goodput")
    return Targets(ttft_p99, tpot_p99, e2e_p99, goodput)


def _fleet(router: str, disaggregate, check_top: int):
    """The routers the best rows are checked behind (a goodput target on the fleet's share of
    requests within the limits, as p99s on its percentiles), and the link of the disaggregated
    pools tried."""
    from kvplan.workload.spec import Transfer

    checking = router.strip().lower() != "none"
    if disaggregate is not None and not checking:
        raise UsageError("needs a --router: disaggregated pools are checked on a fleet", field="--disaggregate")
    if disaggregate is not None and not _finite(disaggregate, 0, 1e6, open_low=True):
        raise UsageError(f"expected a link of 0 to 1,000,000 GB/s, got {disaggregate}", field="--disaggregate")
    if not checking:
        return (), None
    routers = [r.strip() for r in router.split(",") if r.strip()]
    for r in routers or [router]:
        if r not in ROUTER_NAMES:
            raise UsageError(f"expected some of {', '.join(ROUTER_NAMES)} or none, got {r!r}", field="--router")
    if not 1 <= check_top <= 100:
        raise UsageError(f"expected 1 to 100 configurations, got {check_top}", field="--check-top")
    return tuple(routers), Transfer(disaggregate, 0.001) if disaggregate is not None else None


def _engines(text: str, block_size: str) -> list[str]:
    """The engines compared (vllm, sglang); vLLM's --block-size refused where only SGLang runs."""
    from kvplan.plan.space import PLAN_ENGINES

    engines = list(dict.fromkeys(e.strip().lower() for e in text.split(",") if e.strip()))
    if not engines or any(e not in PLAN_ENGINES for e in engines):
        raise UsageError(f"expected some of {', '.join(PLAN_ENGINES)}, got {text!r}", field="--engine")
    if engines == ["sglang"] and block_size.strip() != "16":
        raise UsageError("is vLLM's; SGLang's pool has pages of one token", field="--block-size")
    return engines


def _router(router: str | None, parallel: bool = False) -> str:
    """The fleet check's routers: round_robin by default (an SGLang configuration's fleet runs
    SGLang's replicas), none by default with DP/EP configurations (the fleet's replicas are single
    engines), refused in one line when asked for with them."""
    if router is None:
        return "none" if parallel else "round_robin"
    if parallel and router.strip().lower() != "none":
        raise UsageError("checks the replicas on a fleet of single engines; a replica of DP ranks in lockstep is "
                         "not run there: with --dp or --expert-parallel give --router none", field="--router")
    return router


def _configs(model: str, gpus: list[str], gpus_per_node: int, tp: str, quantization: str, kv_dtype: str,
             max_num_seqs, max_num_batched_tokens, block_size: str, prefix_caching: str,
             engines: list[str] = ("vllm",), dps: list[int] = (1,), eps: list[bool] = (False,)) -> tuple:
    """Every configuration of the search space the flags span."""
    from kvplan.model.dtypes import KV_DTYPE_CHOICES
    from kvplan.plan.space import Config

    if not 1 <= gpus_per_node <= 64:
        raise UsageError(f"expected 1 to 64 GPUs per node, got {gpus_per_node}", field="--gpus-per-node")
    tps = [_int(t, "--tp", 1, 64) for t in tp.split(",")]
    if not any(t <= gpus_per_node for t in tps):
        raise UsageError(f"every TP degree of {tp!r} exceeds the {gpus_per_node} GPUs of a node", field="--tp")
    tps = [t for t in tps if t <= gpus_per_node]
    quants = _quantizations(quantization, model)
    dtypes = [d.strip() for d in kv_dtype.split(",") if d.strip()]
    for d in dtypes or [kv_dtype]:
        if d not in KV_DTYPE_CHOICES:
            raise UsageError(f"expected some of {', '.join(KV_DTYPE_CHOICES)}, got {d!r}", field="--kv-dtype")
    seqs = [_int(s, "--max-num-seqs", 1, 65_536) for s in max_num_seqs.split(",")] if max_num_seqs else [None]
    batched = ([_int(s, "--max-num-batched-tokens", 1, 2**24) for s in max_num_batched_tokens.split(",")]
               if max_num_batched_tokens else [None])
    blocks = [_int(b, "--block-size", 1, 4096) for b in block_size.split(",")]
    caching = [_switch(c) for c in prefix_caching.split(",")]
    return tuple(Config(g, t, d, s, b, c, q, m, e, n, x) for g in gpus for t in tps for n in dps for x in eps
                 if not (x and t * n == 1)  # EP over one GPU is no EP
                 for q in quants for d in dtypes for e in engines for b in (blocks if e == "vllm" else [16])
                 for c in caching for m in batched for s in seqs)


def _parallel(model: str, dp: str, expert_parallel: str, network_gbps, engines: list[str], backend=None):
    """The DP sizes and EP settings searched ([1], [False] without the flags), refused in one line
    where the lockstep run (kvplan/sim/data_parallel.py) does not apply."""
    from kvplan.model.parallel import MAX_DEGREE

    dps = list(dict.fromkeys(_int(d, "--dp", 1, MAX_DEGREE) for d in dp.split(",")))
    eps = list(dict.fromkeys(_switch(word, "--expert-parallel") for word in expert_parallel.split(",")))
    if network_gbps is not None and not _finite(network_gbps, 1, 10_000):
        raise UsageError(f"expected Gb/s per GPU from 1 to 10,000, got {network_gbps}", field="--network-gbps")
    from kvplan.model.parallel_step import ALL2ALL_BACKENDS

    if backend is not None and backend not in ALL2ALL_BACKENDS:
        raise UsageError(f"expected one of {', '.join(ALL2ALL_BACKENDS)}, got {backend!r}", field="--all2all-backend")
    if (dps, eps) == ([1], [False]):
        for flag, value in (("--network-gbps", network_gbps), ("--all2all-backend", backend)):
            if value is not None:
                raise UsageError("applies with --dp or --expert-parallel", field=flag)
        return dps, eps
    if "sglang" in engines:
        raise UsageError("is vLLM's parallelism; give --engine vllm with it",
                         field="--dp" if dps != [1] else "--expert-parallel")
    from kvplan.errors import KvplanError
    from kvplan.model.resolve import load_spec
    from kvplan.model.weights import moe_shape

    try:
        experts, _ = moe_shape(load_spec(model))
    except KvplanError:
        experts = 1  # a model kvplan cannot read is refused where it is resolved, as without these flags
    if not experts:
        raise UsageError(f"{model} has no routed experts: its DP ranks would be independent engines, which the "
                         "plan's replicas already are", field="--dp" if dps != [1] else "--expert-parallel")
    return dps, eps


def _traffic(rate, p: int, o: int, count, workload, timing_profile):
    """The traffic: fixed lengths at a Poisson rate, or a workload file's requests; the timing
    profile checked here, in one line, before anything runs."""
    from dataclasses import replace

    from kvplan.plan.space import Traffic

    if workload is not None:
        from kvplan.plan.space import from_workload

        traffic = from_workload(workload, rate, count)
    else:
        traffic = Traffic(rate, p, o, 10_000 if count is None else count)
    if timing_profile is not None:
        from kvplan.model.timing_profile import profile_option

        traffic = replace(traffic, timing_profile=str(profile_option(timing_profile)[0]))
    return traffic


def _speculative(model, method, k, acceptance, routers):
    """The --speculative setting, checked (kvplan/model/speculative.py), for every replica's workload."""
    from kvplan.model.speculative import make_speculative, mtp_layers
    from kvplan.workload.spec import SpeculativeSpec

    if method is None:
        raise UsageError("needs --speculative METHOD (eagle, eagle3, mtp, ngram)",
                         field="--num-speculative-tokens" if k is not None else "--acceptance")
    if routers:
        raise UsageError("the fleet check runs its replicas without speculative decoding; pass --router none "
                         "with --speculative", field="--router")
    sp = make_speculative(method, k, acceptance)
    if sp.method == "mtp":
        from kvplan.model.resolve import load_spec

        if not mtp_layers(load_spec(model)):
            raise UsageError(f"mtp needs a model with multi-token-prediction layers (num_nextn_predict_layers in its "
                             f"config); {model} has none: use eagle, eagle3 or ngram", field="--speculative")
    return SpeculativeSpec(sp.method, sp.k, sp.acceptance if sp.acceptance_given else None)


def _write_files(doc: dict, csv: Optional[Path], plot: Optional[Path], html: Optional[Path]) -> None:
    from kvplan.report.files import write_outputs

    files = []
    if csv is not None:
        from kvplan.report.plan_view import write_plan_csv

        files.append((csv, lambda tmp: write_plan_csv(doc, tmp), "--csv"))
    if plot is not None:
        from kvplan.report.plan_html import plot_frontier

        files.append((plot, lambda tmp: plot_frontier(doc, tmp, fmt=plot.suffix.lower()[1:]), "--plot"))
    if html is not None:
        from kvplan.report.plan_html import render_html

        files.append((html, lambda tmp: Path(tmp).write_text(render_html(doc), encoding="utf-8"), "--html"))
    write_outputs(files)


def _int(text: str, field: str, lo: int, hi: int) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise UsageError(f"expected whole numbers separated by commas, got {text!r}", field=field) from None
    if not lo <= value <= hi:
        raise UsageError(f"expected {lo} to {hi}, got {value}", field=field)
    return value


def _quantizations(text: str, model: str) -> list[str]:
    from kvplan.model.resolve import QUANT_SUFFIXES
    from kvplan.plan.space import WEIGHT_QUANTIZATIONS

    out = [q.strip().lower() for q in text.split(",") if q.strip()]
    for q in out:
        if q not in WEIGHT_QUANTIZATIONS:
            raise UsageError(f"expected some of {', '.join(WEIGHT_QUANTIZATIONS)}, got {q!r}", field="--quantization")
    if any(q != "none" for q in out) and any(model.lower().endswith(("-" + s, "_" + s)) for s in QUANT_SUFFIXES):
        raise UsageError(f"{model} is quantized already; give its unquantized id to compare weights",
                         field="--quantization")
    return out or ["none"]


def _switch(text: str, field: str = "--prefix-caching") -> bool:
    """One word of an on / off / on,off flag."""
    word = text.strip().lower()
    if word not in ("on", "off"):
        raise UsageError(f"expected on, off or on,off, got {text!r}", field=field)
    return word == "on"


def _gpus(text: Optional[str], book) -> list[str]:
    from kvplan.errors import KvplanError
    from kvplan.model.gpus import get_gpu

    if text is None:
        return book.gpus()
    out = []
    for name in (n.strip() for n in text.split(",") if n.strip()):
        try:
            out.append(get_gpu(name).name)
        except KvplanError as exc:
            raise UsageError(exc.message, field="--gpu") from None
    if not out:
        raise UsageError(f"expected GPUs of the catalog (kvplan gpus), e.g. H100-80GB,L40S, got {text!r}",
                         field="--gpu")
    return list(dict.fromkeys(out))
