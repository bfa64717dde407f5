"""`kvplan plan`: the search against brute force, monotonic sanity, determinism, the command."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from kvplan.plan.prices import Offer, PriceBook
from kvplan.plan.search import Config, Rules, Targets, Traffic, evaluate, pareto, rank, search

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TRAFFIC = Traffic(rate=10.0, prompt=800, output=100, count=300)  # no replica count near an edge
TARGETS = Targets(ttft_p99=1.0, tpot_p99=0.05)
SPACE = [Config("H100-80GB", 1), Config("H100-80GB", 2), Config("L40S", 1), Config("A100-80GB", 1)]
PRICES = {"H100-80GB": 2.5, "L40S": 1.0, "A100-80GB": 1.8}
EXACT = Rules(headroom=0.0, seeds=(), frontier_span=1e9)  # the search alone: no margin, no fresh seeds, no span


def book_of(prices: dict, shapes=None) -> PriceBook:
    """Offers of these $/GPU-hour that rent any number of GPUs (or instances of `shapes`)."""
    return PriceBook(tuple(Offer(g, usd, "on-demand", shapes, {"gpu": g}) for g, usd in prices.items()))


BOOK = book_of(PRICES)


@pytest.fixture(scope="module")
def planned():
    return search(MODEL, TRAFFIC, TARGETS, SPACE, BOOK, EXACT)


def brute_force_rate(config: Config, targets: Targets) -> float:
    """The rate on a fine grid (2% steps) below the first one that misses the targets, simulating
    each in turn (p99s of a few hundred requests are not exactly monotonic in the rate; plan's
    bisection, like this scan, reports the edge it meets first), and never above the rate the
    replica drains all the requests at, sent at once (a higher one grows its queue)."""
    from dataclasses import replace

    from kvplan.experiments import build_flags, flag_workload
    from kvplan.sim.engine import simulate

    wl = build_flags(flag_workload(MODEL, config.gpu, config.tp, 1.0, str(TRAFFIC.prompt), str(TRAFFIC.output),
                                 TRAFFIC.count))
    base, spec = wl.make_requests, wl.allocators[0]
    drain = simulate(replace(wl, make_requests=lambda: (replace(c, arrival=c.arrival * 0) for c in base())),
                     spec).throughput_rps
    best = 0.0
    for rate in np.geomspace(0.5, 200, 300):  # ratio 1.02 between points
        if rate > drain:
            break
        make = lambda r=rate: (replace(c, arrival=c.arrival / r) for c in base())  # noqa: E731
        if not targets.met_by(simulate(replace(wl, make_requests=make), spec)):
            break
        best = float(rate)
    return best


def test_the_choice_equals_brute_force(planned):
    """Each configuration's capacity is within the bisection's precision of the fine grid's, and
    the cheapest configuration by brute force is the one plan picks."""
    costs = {}
    for e in planned:
        grid = brute_force_rate(e.config, TARGETS)
        assert grid > 0
        assert e.capacity == pytest.approx(grid, rel=0.05)
        costs[e.config] = math.ceil(TRAFFIC.rate / grid) * e.config.tp * PRICES[e.config.gpu]
    cheapest = min(costs.values())
    assert planned[0].cost_per_hour == pytest.approx(cheapest)


def test_frontier_is_the_set_no_one_dominates(planned):
    front = pareto(planned)
    feasible = [e for e in planned if e.feasible]
    for e in feasible:
        dominated = any(o.cost_per_hour <= e.cost_per_hour and o.ttft_p99 < e.ttft_p99
                        or o.cost_per_hour < e.cost_per_hour and o.ttft_p99 <= e.ttft_p99 for o in feasible)
        assert (e in front) == (not dominated)


def test_a_looser_target_never_costs_more(planned):
    loose = search(MODEL, TRAFFIC, Targets(ttft_p99=4.0, tpot_p99=0.1), SPACE, BOOK, EXACT)
    assert loose[0].cost_per_hour <= planned[0].cost_per_hour
    by = {e.config: e for e in planned}
    for e in loose:
        assert e.capacity >= by[e.config].capacity * 0.999


def test_a_higher_rate_never_needs_fewer_replicas(planned):
    more = search(MODEL, Traffic(30.0, TRAFFIC.prompt, TRAFFIC.output, TRAFFIC.count), TARGETS, SPACE, BOOK, EXACT)
    by = {e.config: e for e in planned}
    for e in more:
        assert e.replicas >= by[e.config].replicas


def test_a_cheaper_gpu_never_makes_the_plan_dearer(planned):
    cheaper = dict(PRICES, **{"A100-80GB": 0.5})
    again = search(MODEL, TRAFFIC, TARGETS, SPACE, book_of(cheaper), EXACT)
    assert again[0].cost_per_hour <= planned[0].cost_per_hour


def test_one_worker_and_two_give_the_same_rows(planned):
    two = search(MODEL, TRAFFIC, TARGETS, SPACE, BOOK, EXACT, workers=2)
    assert [e.to_dict() for e in two] == [e.to_dict() for e in planned]


def test_memory_prunes_first():
    e = evaluate("meta-llama/Llama-3.1-70B-Instruct", TRAFFIC, TARGETS, Config("L4", 1), book_of({"L4": 0.7}))
    assert not e.fits and not e.feasible and "would not serve" in e.reason and e.evaluations == 0
    assert e.left_out == "memory"


def test_rank_puts_infeasible_last():
    from kvplan.plan.search import Evaluation

    rows = rank([Evaluation(Config("L4"), False, reason="no"),
                 Evaluation(Config("L40S"), True, capacity=1.0, replicas=2, gpus=2, cost_per_hour=2.0, ttft_p99=0.5)])
    assert [r.config.gpu for r in rows] == ["L40S", "L4"]


def test_the_command_prints_the_answer_and_json(tmp_path, run_cli):
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"prices": [{"gpu": "H100-80GB", "usd_per_gpu_hour": 2.5}]}))
    args = ["plan", MODEL, "--rate", "12", "--prompt", "800", "--output", "100", "--count", "300",
            "--ttft-p99", "1", "--tpot-p99", "0.05", "--prices", str(prices), "--tp", "1", "--workers", "1"]
    code, out, err = run_cli(*args)
    assert code == 0, err
    assert out.startswith("Rent ")
    code, out, err = run_cli(*args, "--json", "--csv", str(tmp_path / "plan.csv"))
    doc = json.loads(out)
    assert doc["answer"]["cost_per_hour"] > 0 and doc["answer"]["usd_per_million_tokens"] > 0
    assert (tmp_path / "plan.csv").read_text().splitlines()[0].startswith("rank,config,gpu")


@pytest.mark.parametrize("extra,field", [(["--price", "H100-80GB"], "--price"), (["--price", "H100-80GB=-1"], "--price"),
                                         (["--tp", "1,x"], "--tp"), (["--gpu", "NoSuchGPU"], "--gpu"),
                                         (["--count", "3"], "--count"), (["--rate", "0"], "--rate")])
def test_bad_options_are_one_line(extra, field, run_cli):
    code, out, err = run_cli("plan", MODEL, "--rate", "1", "--ttft-p99", "1", *extra)
    assert code == 2 and field in err and len(err.strip().splitlines()) == 1 and out == ""


def test_the_html_report_opens_in_headless_chromium(tmp_path, run_cli):
    """The report's title, answer and chart are there when a browser renders it, with no console
    errors (skipped where Debian's chromium is not installed)."""
    import shutil
    import subprocess

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"prices": [{"gpu": "H100-80GB", "usd_per_gpu_hour": 2.5, "provider": "test",
                                              "date": "2026-12-01", "source": "https://example.org/"}]}))
    report = tmp_path / "report.html"
    code, _, err = run_cli("plan", MODEL, "--rate", "12", "--prompt", "800", "--output", "100", "--count", "300",
                           "--ttft-p99", "1", "--prices", str(prices), "--tp", "1,2", "--workers", "1",
                           "--html", str(report), "--plot", str(tmp_path / "frontier.svg"))
    assert code == 0, err
    text = report.read_text()
    assert "<script" not in text and "<link" not in text and 'src="' not in text  # nothing fetched
    if browser is None:
        pytest.skip("chromium is not installed")
    run = subprocess.run([browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                          "--v=0", "--dump-dom", report.as_uri()], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    dom = run.stdout
    assert f"<title>kvplan plan: {MODEL}</title>" in dom
    assert 'id="frontier-chart"' in dom and "<svg" in dom and 'id="answer">Rent ' in dom
    assert "CONSOLE" not in run.stderr and "Uncaught" not in run.stderr


def test_ray_gives_the_rows_of_the_local_run(planned):
    """On a local Ray instance of 2 CPUs (loopback only), the same rows in the same order, for
    the search and for the fleet checks of --router."""
    import signal

    ray = pytest.importorskip("ray")
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}  # ray.init sets its own
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    try:
        on_ray = search(MODEL, TRAFFIC, TARGETS, SPACE, BOOK, EXACT, workers=2, ray=True)
        from kvplan.plan.fleet_check import checked

        fleets_on_ray = checked(MODEL, TRAFFIC, TARGETS, planned, ["round_robin", "least_kv"], 2, book=BOOK,
                                workers=2, ray=True)
    finally:
        ray.shutdown()
        for sig, handler in handlers.items():  # the tests after this one see the process's own
            signal.signal(sig, handler)
    assert [e.to_dict() for e in on_ray] == [e.to_dict() for e in planned]
    local = checked(MODEL, TRAFFIC, TARGETS, planned, ["round_robin", "least_kv"], 2, book=BOOK, workers=1)
    assert [e.to_dict() for e in fleets_on_ray] == [e.to_dict() for e in local]  # the fleet checks too


@pytest.mark.parametrize("content,needle", [("{not json", "not valid JSON"), ('{"prices": 3}', '"prices" list'),
                                            ('{"prices": [{"gpu": "H100-80GB", "usd_per_gpu_hour": "cheap"}]}', "price"),
                                            ('{"prices": [{"gpu": "Nope", "usd_per_gpu_hour": 1}]}', "Nope")])
def test_a_bad_price_file_is_one_line_naming_it(tmp_path, run_cli, content, needle):
    prices = tmp_path / "prices.json"
    prices.write_text(content)
    code, out, err = run_cli("plan", MODEL, "--rate", "1", "--ttft-p99", "1", "--prices", str(prices))
    assert code == 2 and str(prices) in err and needle in err and len(err.strip().splitlines()) == 1


def test_the_shipped_prices_cite_a_source_date_tier_and_shape_per_row():
    from kvplan.model.gpus import get_gpu
    from kvplan.plan.prices import SHIPPED, TIERS, read_price_file

    offers = read_price_file(SHIPPED)
    assert len({o.gpu for o in offers}) >= 8
    for o in offers:
        assert get_gpu(o.gpu).name == o.gpu and o.tier in TIERS and o.instance_gpus
        row = o.row
        assert row["source"].startswith("https://") and len(row["date"]) == 10 and row["provider"]
    on_demand = {o.gpu for o in offers if o.tier == "on-demand"}
    assert on_demand == {o.gpu for o in offers}  # every GPU has a data-centre price


@pytest.mark.parametrize("targets", [TARGETS, Targets(ttft_p99=0.3, e2e_p99=6.0), Targets(tpot_p99=0.02),
                                     Targets(ttft_p99=0.3, tpot_p99=0.03, goodput=0.9)],
                         ids=["ttft-tpot", "ttft-e2e", "tpot", "goodput"])
def test_stopping_doomed_runs_early_changes_no_row(targets, monkeypatch):
    """The early stop is only a shortcut: without it every row is the same."""
    import kvplan.plan.evaluate as E
    from kvplan.sim import engine

    stopped, simulate = [], engine.simulate
    monkeypatch.setattr(engine, "simulate", lambda *a, **k: stopped.append(r := simulate(*a, **k)) or r)
    with_stop = search(MODEL, TRAFFIC, targets, SPACE, BOOK, EXACT)
    assert any(r is None for r in stopped)  # some runs did stop early
    monkeypatch.setattr(E, "doomed", lambda *args: None)
    without = search(MODEL, TRAFFIC, targets, SPACE, BOOK, EXACT)
    assert [e.to_dict() for e in with_stop] == [e.to_dict() for e in without]


LONG = Traffic(rate=10.0, prompt=800, output=100, count=2500)  # long enough to be scouted on a tenth


def _row(e) -> dict:
    d = e.to_dict()
    del d["evaluations"], d["reused"]  # how many runs it took, not what they found
    return d


def test_siblings_share_runs_and_change_no_row():
    """Configurations that differ only in max_num_seqs share their identical runs (a run whose
    batch never reached either cap, on the same pool): the rows equal each configuration evaluated
    alone. (max_num_seqs also sizes vLLM's start-up profile, its sampler rows and CUDA graphs, so
    siblings' pools differ and a run is shared only where they do not.)"""
    from kvplan.plan.search import _evaluate_group, bounds_of

    space = tuple(Config("H100-80GB", 1, "auto", s) for s in (16, 64, 256, 1024))
    pres = tuple(bounds_of(MODEL, LONG, TARGETS, c, BOOK, EXACT) for c in space)
    together = _evaluate_group((MODEL, LONG, TARGETS, pres, BOOK, EXACT, ()))
    alone = [evaluate(MODEL, LONG, TARGETS, c, BOOK, EXACT) for c in space]
    assert [_row(e) for e in together] == [_row(e) for e in alone]
    assert sum(e.reused for e in together) >= sum(e.reused for e in alone)
    assert len({e.capacity for e in together}) > 1  # and the caps mattered somewhere


def test_the_answer_is_an_edge_of_full_length_runs():
    """The rate reported meets the targets over all `count` requests, and the next rate of the
    grid (2.2% higher) misses them: checked here with the plain engine, no scouts, no stops."""
    from dataclasses import replace

    from kvplan.plan.edge import STEPS_PER_OCTAVE
    from kvplan.plan.space import config_workload
    from kvplan.sim.engine import simulate

    config = Config("L40S", 1)
    e = evaluate(MODEL, LONG, TARGETS, config, BOOK, EXACT)
    wl = config_workload(MODEL, LONG, config)
    base = wl.make_requests

    def at(rate):
        make = lambda: (replace(c, arrival=c.arrival / rate) for c in base())  # noqa: E731
        return simulate(replace(wl, make_requests=make), wl.allocators[0])

    assert e.feasible and 0 < e.capacity < e.saturated
    assert TARGETS.met_by(at(e.capacity))
    assert not TARGETS.met_by(at(e.capacity * 2 ** (1 / STEPS_PER_OCTAVE)))


def _file(tmp_path, text: str):
    path = tmp_path / "traffic.yaml"
    path.write_text("name: traffic\npool: {slots: 100000}\n" + text)
    return path


def test_a_workload_files_requests_are_the_traffic(tmp_path):
    """From a file: its first `count` requests, their means, the longest, and their own rate."""
    from kvplan.experiments import load
    from kvplan.plan.space import from_workload

    path = _file(tmp_path, "seed: 3\nrequests:\n  count: 400\n  prompt: {dist: uniform, low: 100, high: 900}\n"
                           "  output: {dist: uniform, low: 10, high: 200}\n  arrival: {process: poisson, rate: 4}\n")
    t = from_workload(path, None, 300)
    chunks = list(load(path).make_requests())
    arrival = np.concatenate([c.arrival for c in chunks])[:300]
    prompt = np.concatenate([c.prompt_len for c in chunks])[:300]
    output = np.concatenate([c.output_len for c in chunks])[:300]
    assert t.count == 300 and t.workload == str(path)
    assert t.prompt == pytest.approx(prompt.mean()) and t.output == pytest.approx(output.mean())
    assert t.max_model_len == int((prompt + output).max())
    assert t.base_rate == pytest.approx(299 / (arrival[-1] - arrival[0])) and t.rate == t.base_rate
    assert 3 < t.base_rate < 5  # Poisson at 4/s
    assert from_workload(path, 12.0, None).rate == 12.0 and from_workload(path, 12.0, None).count == 400


def test_plan_searches_prefix_caching_and_block_size_on_a_workload_file(tmp_path, run_cli):
    """A traffic whose prompts share two long system prompts: with caching on, a replica serves
    more than with it off (its prefills mostly hit), at each block size searched."""
    path = _file(tmp_path, "requests:\n  count: 600\n  prompt: {dist: fixed, value: 2200}\n"
                           "  output: {dist: fixed, value: 60}\n  arrival: {process: poisson, rate: 8}\n"
                           "prefix: {system_prompts: 2, system_prompt_len: 2048, hash_block_size: 32}\n")
    code, out, err = run_cli("plan", MODEL, "--workload", str(path), "--gpu", "L40S", "--tp", "1",
                             "--ttft-p99", "2", "--prefix-caching", "on,off", "--block-size", "16,32",
                             "--workers", "1", "--json")
    assert code == 0, err
    doc = json.loads(out)
    rows = {r["config"]["label"]: r for r in doc["results"]}
    assert set(rows) == {"L40S x1", "L40S x1 no-cache", "L40S x1 B32", "L40S x1 B32 no-cache"}
    for b in ("", " B32"):
        on, off = rows[f"L40S x1{b}"], rows[f"L40S x1{b} no-cache"]
        assert on["feasible"] and on["capacity"] > 1.5 * off["capacity"]
    assert doc["traffic"]["workload"] == str(path) and doc["traffic"]["rate"] == pytest.approx(8, rel=0.15)


@pytest.mark.parametrize("args,field", [([], "--rate"), (["--prefix-caching", "maybe"], "--prefix-caching"),
                                        (["--block-size", "0"], "--block-size")])
def test_plan_refuses_bad_traffic_options_in_one_line(args, field, run_cli):
    code, out, err = run_cli("plan", MODEL, "--ttft-p99", "1", *args, *(["--rate", "1"] if args else []))
    assert code == 2 and field in err and len(err.strip().splitlines()) == 1 and out == ""


def test_a_workload_arriving_all_at_once_is_refused_naming_it(tmp_path, run_cli):
    path = _file(tmp_path, "requests:\n  count: 50\n  prompt: {dist: fixed, value: 100}\n"
                           "  output: {dist: fixed, value: 10}\n  arrival: {process: all_at_once}\n")
    code, out, err = run_cli("plan", MODEL, "--workload", str(path), "--ttft-p99", "1")
    assert code == 2 and str(path) in err and "at once" in err and len(err.strip().splitlines()) == 1


def test_weight_quantization_is_searched_as_the_re_uploads(run_cli):
    """--quantization fp8 serves the model's FP8 re-upload: half the weight bytes, so on an L40S a
    replica serves more than the bf16 checkpoint (decode reads the weights every step)."""
    code, out, err = run_cli("plan", MODEL, "--rate", "10", "--prompt", "800", "--output", "100", "--count", "300",
                             "--gpu", "L40S", "--tp", "1", "--quantization", "none,fp8", "--ttft-p99", "1",
                             "--tpot-p99", "0.05", "--workers", "1", "--json")
    assert code == 0, err
    rows = {r["config"]["label"]: r for r in json.loads(out)["results"]}
    assert set(rows) == {"L40S x1", "L40S x1 w-fp8"}
    assert rows["L40S x1 w-fp8"]["capacity"] > rows["L40S x1"]["capacity"]
    from kvplan.plan.space import Config

    assert Config("L40S", quantization="fp8").model_id(MODEL) == MODEL + "-fp8"


@pytest.mark.parametrize("args,field", [(["--quantization", "int3"], "--quantization"),
                                        (["--tp", "16"], "--tp"), (["--gpus-per-node", "0"], "--gpus-per-node")])
def test_plan_refuses_a_bad_search_space_in_one_line(args, field, run_cli):
    code, out, err = run_cli("plan", MODEL, "--rate", "1", "--ttft-p99", "1", *args)
    assert code == 2 and field in err and len(err.strip().splitlines()) == 1 and out == ""


def test_goodput_counts_requests_within_every_limit_at_once():
    """Four requests by hand: TTFT 0.5, 1.5, 0.2, 0.4 s (+ 0.1 s of API server); TPOT 0.01, 0.01,
    0.06, 0.02 s; within TTFT 1 s and TPOT 0.05 s together: the first and the last."""
    from types import SimpleNamespace

    from kvplan.plan.search import attainment
    from kvplan.sim.metrics import RequestRecords

    arrival = np.array([0.0, 1.0, 2.0, 3.0])
    first = arrival + np.array([0.4, 1.4, 0.1, 0.3])
    out = np.array([11, 11, 2, 6])
    finish = first + np.array([0.1, 0.1, 0.06, 0.1])
    cols = {"arrival": arrival, "first_token": first, "finish": finish, "output": out}
    result = SimpleNamespace(requests=RequestRecords(cols))
    assert attainment(Targets(ttft_p99=1.0, tpot_p99=0.05, goodput=0.5), result, 0.1) == 0.5
    assert Targets(ttft_p99=1.0, tpot_p99=0.05, goodput=0.5).met_by(result, 0.1)
    assert not Targets(ttft_p99=1.0, tpot_p99=0.05, goodput=0.75).met_by(result, 0.1)
    assert attainment(Targets(ttft_p99=1.0, goodput=0.5), result, 0.1) == 0.75
    # a busy API server's share per request (the records' "frontend" column) wins over the plain
    # one: 0.7 s more on the last request puts its TTFT at 0.3 + 0.7 > 1 s
    late = SimpleNamespace(requests=RequestRecords({**cols, "frontend": np.array([0.1, 0.1, 0.1, 0.8])}))
    assert attainment(Targets(ttft_p99=1.0, goodput=0.5), late, 0.1) == 0.5


def test_a_lower_goodput_never_serves_less():
    strict = search(MODEL, TRAFFIC, Targets(ttft_p99=1.0, tpot_p99=0.05, goodput=0.99), SPACE, BOOK, EXACT)
    loose = {e.config: e for e in search(MODEL, TRAFFIC, Targets(ttft_p99=1.0, tpot_p99=0.05, goodput=0.8),
                                         SPACE, BOOK, EXACT)}
    for e in strict:
        assert loose[e.config].capacity >= e.capacity * 0.999
    assert any(loose[e.config].capacity > e.capacity for e in strict)


def test_the_replica_count_is_checked_on_a_fleet_behind_the_router(planned):
    """--router: the cheapest rows are simulated as fleets at the wanted rate; a row whose
    estimate is one replica short grows until the fleet meets the targets."""
    from dataclasses import replace

    from kvplan.plan.fleet_check import check_on_fleet, checked

    rows = checked(MODEL, TRAFFIC, TARGETS, planned, ["least_outstanding"], 2, book=BOOK)
    assert all(e.router == "least_outstanding" and e.replicas >= e.replicas_estimate for e in rows[:2])
    assert all(TARGETS.ttft_p99 >= e.ttft_p99 and TARGETS.tpot_p99 >= e.tpot_p99 for e in rows[:2])
    assert all(e.router is None for e in rows[2:])
    e = next(e for e in planned if e.feasible and e.replicas >= 2)
    short = check_on_fleet(MODEL, TRAFFIC, TARGETS, replace(e, replicas=1), "round_robin", book=BOOK)
    assert short.replicas_estimate == 1 and short.replicas >= 2  # one replica cannot take the whole rate
    assert short.cost_per_hour == pytest.approx(short.replicas * e.config.tp * PRICES[e.config.gpu])


def test_disaggregated_pools_can_serve_a_tight_tpot_with_fewer_gpus():
    """Long prompts and a 13 ms TPOT: colocated, prefill chunks slow every decode step, so it takes
    many replicas; a prefill pool and a decode pool of the same GPUs meet it with fewer (DistServe's
    finding). The colocated fleet of that smaller size is checked to miss."""
    from dataclasses import replace

    from kvplan.workload.routing import RouterSpec
    from kvplan.fleet.run import Group, Transfer, run_fleet
    from kvplan.plan.fleet_check import check_on_fleet
    from kvplan.plan.space import config_workload

    traffic = Traffic(rate=30.0, prompt=2000, output=200, count=300)
    targets = Targets(ttft_p99=3.0, tpot_p99=0.013)
    config = Config("H100-80GB", 1)
    e = evaluate(MODEL, traffic, targets, config, BOOK, EXACT)
    colocated = check_on_fleet(MODEL, traffic, targets, e, "round_robin", book=BOOK)
    pd = check_on_fleet(MODEL, traffic, targets, e, "round_robin", Transfer(25.0, 0.001), book=BOOK)
    assert colocated.feasible and colocated.prefill_replicas == 0
    assert pd.feasible and 0 < pd.prefill_replicas < pd.replicas < colocated.replicas
    assert pd.tpot_p99 <= 0.013 and pd.ttft_p99 <= 3.0
    wl = config_workload(MODEL, replace(traffic, count=traffic.count * e.replicas), config)

    def chunks():
        for c in wl.make_requests():
            yield replace(c, arrival=c.arrival / traffic.rate)

    alone = run_fleet([Group("c", pd.replicas, replace(wl, prefix=None, sampling=None))], RouterSpec("round_robin"), chunks(), 0)
    assert not targets.met_by(alone)


def test_a_goodput_target_is_checked_on_the_fleet():
    """With --goodput the fleet check counts the share of the fleet's requests within every limit
    at once (the fleet's own goodput), not p99s: the row it passes meets that share when the same
    fleet is simulated again with the limits as an slo."""
    from dataclasses import replace

    from kvplan.fleet.run import Group, run_fleet
    from kvplan.plan.fleet_check import FLEET_SEED, check_on_fleet
    from kvplan.plan.space import config_workload, first
    from kvplan.workload.prefixes import request_stream
    from kvplan.workload.routing import RouterSpec

    traffic = Traffic(rate=30.0, prompt=2000, output=200, count=300)
    targets = Targets(ttft_p99=1.0, tpot_p99=0.03, goodput=0.9)
    e = evaluate(MODEL, traffic, targets, Config("H100-80GB", 1), BOOK, EXACT)
    row = check_on_fleet(MODEL, traffic, targets, e, "round_robin", book=BOOK)
    assert row.feasible and row.router == "round_robin"
    total = traffic.count * e.replicas
    wl = config_workload(MODEL, replace(traffic, count=total), e.config, FLEET_SEED)
    factor = traffic.base_rate / e.served

    def chunks():
        for c in first(request_stream(wl), total):
            yield replace(c, arrival=c.arrival * factor)

    again = run_fleet([Group("plan", row.replicas, replace(wl, prefix=None, sampling=None))], RouterSpec("round_robin"),
                      chunks(), wl.seed, total=total, slo=targets.limits())
    assert again.goodput["share"] >= 0.9
    assert targets.met_by(again)
