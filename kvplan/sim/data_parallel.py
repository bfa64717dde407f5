"""Data-parallel serving of a MoE model: D engines, each with its own scheduler and KV pool,
stepping in lockstep, as vLLM runs them (the lockstep reference; slow and plain, like reference.py).

What vLLM does (vllm-project/vllm: vllm/v1/engine/core.py read at commit ac3cb2e2,
vllm/v1/engine/core_client.py at 364631ab; the same rules since the V1 engine's DP support, 0.9):

- Each DP rank of a MoE model is a DPEngineCoreProc (DPMoEEngineCoreActor under Ray: "Used for
  MoE model data parallel cases"), with its own Scheduler and KV cache. A model without experts
  runs each rank as a plain EngineCoreProc with data_parallel_size set to 1 (EngineCoreActor:
  "Used for non-MoE and/or non-DP cases"): independent engines, which kvplan models as a fleet of
  replicas (experiment: fleet); kvplan/workload/build.py refuses `parallel:` on such a model.
- DPEngineCoreProc.run_busy_loop: every rank steps; a rank with nothing of its own to run while
  the others run executes a dummy batch (execute_dummy_batch, a forward pass of one token) so the
  MoE layers' collectives, which span every rank, can complete. Once no rank has unfinished
  requests (_has_global_unfinished_reqs, an all-reduce every 32 steps) the wave ends and the
  ranks idle until a request arrives.
- The API server picks a rank for each request (DPLBAsyncMPClient.get_core_engine_for_request):
  the rank of least waiting x 4 + running, scanning from rank 0 (eng_start_index, one API
  server), first on a tie, over the counts the DP coordinator publishes (every 100 ms), each pick
  adding one to its rank's waiting count until the next publication (vllm/v1/engine/coordinator.py:
  the counts as the ranks' schedulers give them, get_request_counts, published every
  stats_update_interval_ms = 100 while they change).

The lockstep here: at each global step every rank schedules its own batch (reference.py's
scheduler, one ReferenceSim per rank, its state not copied); the step takes, for all of them,

    step = max over ranks r of clock.step_ticks(rank r's step, extra_gpu = MoE)
    MoE  = experts(N) + all_to_all,   N = the tokens of every rank together

where clock is one rank's step model without the routed experts (the workload's, built from
kvplan/model/parallel_step.py's stage model) and the MoE terms are ParallelStep.experts_s at
group_tokens N (the busiest rank's experts over everyone's tokens) and ParallelStep.all_to_all_s
(allgather_reducescatter: every rank gathers all N tokens, priced at N / D each; DeepEP: the
busiest sender's tokens). Every layer's attention waits for the slowest rank before its dispatch,
and the terms scale alike in every layer, so the per-layer maximum sums to the maximum of the
ranks' whole steps. A rank running a dummy batch counts one token and one request. Without a GPU
(steps as the time unit) every global step is one tick.

Speculative decoding (`speculative:`): each rank schedules its decoding requests 1 + k tokens and
accepts drafts as reference.py does, and its step is its own speculative step (ReferenceSim.step_cost:
the drafts verified, the drafter's passes) with the shared MoE terms over every rank's tokens, drafts
included. A rank's step model holds no routed experts, so an MTP draft pass prices its layer's
attention and dense part there, and the MTP layers' routed experts and all-to-all join the shared
MoE terms, pass by pass, over every rank's draft tokens (parallel_clock.draft_moe_ticks; a rank
with nothing to draft in a pass runs a dummy token, as vLLM's drafter runs a dummy pass beside the
ranks that draft).

Not modelled: the up-to-31 dummy steps after the last request finishes before the every-32-steps
all-reduce ends the wave (they delay only a request that arrives during them); the 100 ms stats
staleness is approximated at step boundaries (the snapshot is refreshed at the first step start
100 ms or more after the last; without a GPU, at every step).
"""

from __future__ import annotations

import heapq
from dataclasses import replace

import numpy as np

from kvplan.memory.prefix_cache import PrefixCacheStats
from kvplan.model.speculative import mtp_layers
from kvplan.sim.metrics import RawRun, ServeResult, build_result
from kvplan.sim.parallel_clock import draft_moe_ticks, mean_field_clock, shared_moe_ticks
from kvplan.sim.reference import Req, ReferenceSim, reference_sim
from kvplan.sim.sampling import TIMELINE_POINTS, TimelineSampler
from kvplan.sim.timing import TICKS_PER_SECOND
from kvplan.workload.records import Workload
from kvplan.workload.spec import AllocatorSpec

LB_INTERVAL_S = 0.1  # the DP coordinator publishes the ranks' request counts every 100 ms
WAITING_WEIGHT = 4  # get_core_engine_for_request's score: waiting x 4 + running


class Balancer:
    """vLLM's DP load balancer over (waiting, running) counts that are refreshed now and then: the
    rank of least waiting x WAITING_WEIGHT + running, the first on a tie, each pick adding one
    waiting request to its rank. Kept as a heap of (score, rank), whose order is exactly that rule
    (the lowest score, then the lowest rank), so a pick costs log(ranks), not a scan."""

    def __init__(self, ranks: int, interval: int):
        self.interval, self.last = interval, None
        self.publish([(0, 0)] * ranks)

    def refresh(self, t: int, sims: list[ReferenceSim]) -> None:
        """Take the ranks' counts when `interval` ticks have passed since the last time."""
        if self.last is None or t - self.last >= self.interval:
            self.publish([(len(s.waiting) + len(s.swapped) + len(s.loading), len(s.running)) for s in sims])
            self.last = t

    def publish(self, counts) -> None:
        """The (waiting, running) counts of every rank, as the DP coordinator publishes them."""
        self.heap = [(int(w) * WAITING_WEIGHT + int(r), rank) for rank, (w, r) in enumerate(counts)]
        heapq.heapify(self.heap)

    def choose(self) -> int:
        score, rank = self.heap[0]
        heapq.heapreplace(self.heap, (score + WAITING_WEIGHT, rank))
        return rank


class LockstepSim:
    """D ranks of reference.py's engine, one global clock (see the module docstring)."""

    def __init__(self, workload: Workload, allocator: AllocatorSpec, timeline_points: int = TIMELINE_POINTS):
        whole, self.clipped, self.delayed = reference_sim(workload, allocator, timeline_points)
        self.s, self.reqs = whole.s, whole.reqs
        self.run_par = workload.parallel
        self.dp = self.run_par.par.dp
        self.origin = self.t = whole.origin
        self.ranks = []
        for _ in range(self.dp):
            sim = ReferenceSim(self.s, [], timeline_points)
            sim.t = sim.origin = self.origin
            sim.sampler = TimelineSampler(self.origin, self.s.clock, timeline_points)
            self.ranks.append(sim)
        clock = self.s.clock
        self.balancer = Balancer(self.dp, int(LB_INTERVAL_S * TICKS_PER_SECOND) if clock.timed else 1)
        self.rank_of: list[int] = []  # per request, the DP rank it was sent to
        self.next_arrival = self.steps = self.peak = self.dummy_steps = 0
        self.moe_ticks = 0
        # an MTP drafter's MoE layers (num_nextn_predict_layers), whose routed experts the ranks share
        run, step = workload.speculative, self.run_par.step
        self.draft_layers = (mtp_layers(step.spec) if run is not None and run.setting.method == "mtp"
                             and step is not None else 0)

    def run(self) -> None:
        reqs, ranks = self.reqs, self.ranks
        while True:
            self.balancer.refresh(self.t, ranks)
            while self.next_arrival < len(reqs) and reqs[self.next_arrival].arrival <= self.t:
                req = reqs[self.next_arrival]
                rank = self.balancer.choose()
                ranks[rank].reqs.append(req)
                self.rank_of.append(rank)
                self.next_arrival += 1
            for sim in ranks:
                sim.arrive()
            if any(sim.busy() for sim in ranks):
                works = [sim.schedule() for sim in ranks]  # no CPU tier: never None
                self.dummy_steps += sum(1 for work in works if not work)
                self.peak = max(self.peak, sum(len(sim.running) for sim in ranks))
                dt = self.step_ticks(works)
                for sim, work in zip(ranks, works):
                    sim.run_step(work, dt)
                self.t += dt
                self.steps += 1
            elif self.next_arrival < len(reqs):
                until = reqs[self.next_arrival].arrival
                for sim in ranks:
                    sim.idle_until(until)
                self.t = until
            else:
                return

    def step_ticks(self, works: list[dict[int, int]]) -> int:
        """The global step: the slowest rank's own step with the shared MoE terms on its GPU."""
        clock = self.s.clock
        if not clock.timed:
            return 1
        # a rank with nothing to run runs a dummy batch of one token (execute_dummy_batch)
        tokens = [sum(work.values()) if work else 1 for work in works]
        moe = shared_moe_ticks(self.run_par.step, tokens) + self.draft_moe(works)
        self.moe_ticks += moe
        return max(sim.step_cost(work, extra_gpu=moe) if work else clock.step_ticks(0, 1, 1, 0, extra_gpu=moe)
                   for sim, work in zip(self.ranks, works))

    def draft_moe(self, works: list[dict[int, int]]) -> int:
        """The MTP drafter's routed experts in this step (parallel_clock.draft_moe_ticks): its first
        pass over every token a rank with decoding requests scheduled, then k - 1 passes of one
        token per decoding request; a rank with none in a pass runs a dummy token, and a step
        without any decoding request drafts nothing. 0 unless the drafter is MTP layers."""
        sp = self.s.speculative
        layers = self.draft_layers
        if sp is None or not layers or not self.s.clock.timed:
            return 0
        decoders = []
        for sim, work in zip(self.ranks, works):
            by_id = {r.rid: r for r in sim.running}
            decoders.append(sum(1 for rid in work if not by_id[rid].prefilling) if work else 0)
        if not any(decoders):
            return 0
        first = [sum(work.values()) if d else 1 for work, d in zip(works, decoders)]
        rest = [max(d, 1) for d in decoders]
        return draft_moe_ticks(self.run_par.step, [first] + [rest] * (sp.k - 1), layers)

    def raw(self) -> RawRun:
        reqs, ranks = self.reqs, self.ranks

        def col(name):
            return np.array([getattr(r, name) for r in reqs], dtype=np.int64)

        first = ranks[0]
        timelines = [sim.sampler.array() for sim in ranks]
        assert all(t.shape == timelines[0].shape and (t[:, 0] == timelines[0][:, 0]).all() for t in timelines)
        timeline = timelines[0].copy()
        timeline[:, 1:] = sum(t[:, 1:] for t in timelines)
        integrals = {key: (first.integrals[key] if key == "time" else sum(sim.integrals[key] for sim in ranks))
                     for key in first.integrals}
        prefix = None
        if first.blocks is not None:
            stats = [sim.blocks.stats() for sim in ranks]
            prefix = PrefixCacheStats(*(sum(getattr(st, f) for st in stats) for f in
                                        ("lookups", "query_tokens", "hit_tokens", "prefill_tokens_saved",
                                         "blocks_evicted", "blocks_reused")))
        raw = RawRun(
            arrival=col("arrival"), admitted=col("admitted"), first_token=col("first_token"),
            finish=col("finish"), prompt=col("prompt"), output=col("output"),
            preemptions=col("preemptions"), clipped=self.clipped, steps=self.steps,
            preemptions_total=sum(sim.preemptions for sim in ranks),
            swap_outs=sum(sim.swap_outs for sim in ranks),
            recomputed_tokens=sum(sim.recomputed for sim in ranks), peak_running=self.peak,
            t_origin=self.origin, t_end=self.t, integrals=integrals,
            timeline=timeline, timeline_delta=first.sampler.delta,
            prefix=prefix, hit_tokens=None if prefix is None else col("hit_tokens"),
        )  # fmt: skip
        if self.delayed:
            raw = replace(raw, sent=col("sent"))
        return raw

    def setup_all(self):
        """The setup the result is read against: the pools of every rank together."""
        return replace(self.s, slots=self.s.slots * self.dp, num_blocks=self.s.num_blocks * self.dp)

    def summary(self) -> dict:
        """The `data_parallel` section of a result: requests and steps per rank, the MoE share."""
        per_rank = [0] * self.dp
        for rank in self.rank_of:
            per_rank[rank] += 1
        clock = self.s.clock
        return {"requests_per_rank": per_rank, "dummy_rank_steps": self.dummy_steps,
                "moe_shared_time": self.moe_ticks / clock.ticks_per_unit if clock.timed else None}


def mean_field(workload: Workload, allocator: AllocatorSpec):
    """`workload` (with `parallel:`) as one rank's fast-engine run, for bench/dp_mean_field.py: the
    workload without its ranks, 1 / D of the traffic (arrival times D times as far apart; Poisson
    arrivals thinned at random by the balancer are Poisson at 1 / D of the rate), and the setup
    engine.simulate takes with it, its clock the mean-field one (kvplan/sim/parallel_clock.py)."""
    from kvplan.sim.inputs import make_setup

    run = workload.parallel
    dp, base = run.par.dp, workload.make_requests
    make = lambda: (replace(c, arrival=c.arrival * dp) for c in base())  # noqa: E731
    one = replace(workload, parallel=None, make_requests=make)
    setup = make_setup(one, allocator)
    return one, replace(setup, clock=mean_field_clock(setup.clock, run.step, dp))


def simulate_data_parallel(workload: Workload, allocator: AllocatorSpec, *, progress=None,
                           record_requests: bool = False, timeline_points: int = TIMELINE_POINTS,
                           slo=None) -> ServeResult:
    """The lockstep run of `workload.parallel`'s DP ranks: engine.simulate's result, the pool the
    ranks' pools together, with a `data_parallel` section."""
    sim = LockstepSim(workload, allocator, timeline_points)
    sim.run()
    if progress is not None:
        progress(len(sim.reqs), len(sim.reqs))
    result = build_result(sim.raw(), sim.setup_all(), record_requests=record_requests, slo=slo)
    return replace(result, data_parallel=sim.summary())


__all__ = ["Balancer", "LockstepSim", "Req", "mean_field", "simulate_data_parallel"]
