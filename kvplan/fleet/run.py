"""Fleet simulation: replicas of the serve engine behind a router (`experiment: fleet`).

A fleet file is a serve workload with `replicas:` (groups of identical replicas, each group's
`model`, `gpu`, `tp`, `kv_dtype`, `pool`, `scheduler`, `allocators`, `timing` defaulting to the
file's top level, and its `count`) and `router:` (kvplan/fleet/routers.py). Every replica is the serve
engine of kvplan/sim/engine.py with its own KV pool, prefix cache, scheduler and API server; the
router sends each request, at its arrival, to one of them.

How the replicas run together:
- round_robin and random do not look at the replicas: every request is routed as it is read, and
  each replica runs its own stream exactly as `serve` runs one (a fleet of one replica is the
  serve run, byte for byte; round robin over N identical replicas is N serve runs of the split
  streams).
- least_outstanding, least_kv and prefix_aware look at them. The router's view is refreshed every
  `sync_interval_s` of arrival time (a metrics scrape, or KV events): at each refresh every
  replica is simulated up to that instant (the kernel's HORIZON) and reports its outstanding
  requests and KV blocks in use; between refreshes the router adds what it sent itself, as
  routers that count in-flight requests do. prefix_aware keeps its own index of the prompt blocks
  it sent to each replica (an LRU of each replica's cache size in blocks, the way llm-d's
  approximate prefix scorer does) and weighs the prefill a replica would save against the KV it
  holds (kvplan/fleet/routers.py).

Per replica and for the fleet: throughput, TTFT/TPOT/E2E percentiles, prefix hit rate, busy time
(its span less the time it had nothing to run) and the load imbalance max / mean busy time.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from kvplan.errors import KvplanError, WorkloadError
from kvplan.sim import kernel as K
from kvplan.sim.engine import KernelState
from kvplan.sim.inputs import ChunkPreparer, SimSetup, make_setup
from kvplan.sim.metrics import ServeResult, Stats, build_result, latency_arrays
from kvplan.fleet.routers import ROUTERS, RouterSpec, make_router
from kvplan.workload.records import RequestChunk, Workload

GROUP_KEYS = ("name", "count", "model", "gpu", "tp", "kv_dtype", "pool", "scheduler", "allocators", "timing")
INHERITED = ("model", "gpu", "tp", "kv_dtype", "pool", "scheduler", "allocators", "timing")
MAX_REPLICAS = 256  # each replica keeps its own pool tables (a few MB with prefix caching): memory stays bounded


@dataclass(frozen=True)
class Group:
    """Identical replicas: the serve workload of one of them (its requests are the router's)."""

    name: str
    count: int
    workload: Workload


def read_groups(workload: Workload) -> list[Group]:
    """The `replicas:` section, each group a serve workload read by the serve reader (so a group's
    keys mean what they mean at the top level of a serve file)."""
    from kvplan.model.facts import model_facts
    from kvplan.workload.schema import load_workload
    from kvplan.workload.yaml_nodes import as_map, load_yaml

    nodes = workload.extras.get("yaml_nodes", {})
    if "replicas" not in nodes:
        raise WorkloadError("a fleet needs `replicas:`, a list of replica groups", file=workload.path,
                            field="replicas")
    items = list(nodes["replicas"])
    if not items:
        raise nodes["replicas"].error("expected at least one replica group")
    top = load_yaml(workload.path).to_python()
    groups, total = [], 0
    for i, item in enumerate(items):
        node = as_map(item)
        node.expect_keys(*GROUP_KEYS)
        count = node.get_int("count", 1, ge=1, le=MAX_REPLICAS)
        name = node.get_str("name", f"group{i}")
        total += count
        if total > MAX_REPLICAS:
            raise node.error(f"more than {MAX_REPLICAS:,} replicas in all")
        own = {k: v for k, v in node.to_python().items() if k in INHERITED}
        if not own:
            wl = replace(workload, experiment="serve", extras={})
        else:
            doc = {k: top[k] for k in INHERITED if k in top}
            doc.update(own)
            doc.update(name=f"{workload.name}:{name}", experiment="serve",
                       requests={"count": 1, "prompt": {"dist": "fixed", "value": 1},
                                 "output": {"dist": "fixed", "value": 1}, "arrival": {"process": "all_at_once"}})
            wl = _load_group(doc, node, load_workload, model_facts)
            wl = replace(wl, make_requests=workload.make_requests, num_requests=workload.num_requests,
                         seed=workload.seed, extras={})
        if wl.timing.gpu_name is None:
            raise node.error("a fleet's replicas need a gpu (their latencies come from its step times)")
        groups.append(Group(name, count, wl))
    return groups


def _load_group(doc: dict, node, load_workload, model_facts) -> Workload:
    import yaml

    with tempfile.TemporaryDirectory(prefix="kvplan-fleet-") as tmp:
        path = Path(tmp) / "group.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        try:
            return load_workload(path, resolve_model=model_facts)
        except KvplanError as exc:  # name the group, not the temporary file
            raise WorkloadError(exc.message, file=node.file, field=f"{node.path}.{exc.field}" if exc.field
                                else node.path, line=node.line) from None


class Replica:
    """One serve engine of the fleet, fed the requests its router sends it."""

    def __init__(self, index: int, group: Group, setup: SimSetup):
        self.index, self.group, self.setup = index, group, setup
        self.state = KernelState(setup)
        self.preparer = ChunkPreparer(setup)
        self.routed = 0

    def send(self, chunk: RequestChunk, idx: np.ndarray, converted) -> None:
        """The requests at `idx` of `chunk`, whose group converted it already (ChunkPreparer)."""
        ticks, p, o, changed = (x[idx] for x in converted)
        sub = chunk.take(idx) if self.preparer.trie is not None and chunk.hash_ids is not None else chunk
        self.state.load(self.preparer.prepare_parts(sub, ticks, p, o, changed))
        self.routed += len(idx)

    def advance(self, horizon: int, final: bool = False) -> None:
        """Simulate up to `horizon` ticks (it has nothing arriving before then), or to the end."""
        if self.state.loaded:
            self.state.st[K.HORIZON] = 0 if final else horizon
            self.state.run(final=final)

    @property
    def outstanding(self) -> int:
        return self.state.loaded - int(self.state.st[K.DONE])

    @property
    def blocks_used(self) -> int:
        return self.setup.num_blocks - int(self.state.st[K.FREE_BLOCKS]) if self.setup.paged else 0

    def busy_ticks(self) -> int:
        st = self.state.st
        return int(st[K.NOW] - st[K.ORIGIN] - st[K.IDLE]) if self.state.loaded else 0


def _split(chunk: RequestChunk, choice: np.ndarray, replicas: list[Replica]) -> None:
    """Send each replica the requests of `chunk` routed to it (`choice`), in arrival order."""
    order = np.argsort(choice, kind="stable")  # stable: each replica's share stays in arrival order
    bounds = np.searchsorted(choice[order], np.arange(len(replicas) + 1))
    converted: dict[int, tuple] = {}  # per group, converted once
    for r, (a, b) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist())):
        if b > a:
            replica = replicas[r]
            key = id(replica.group)
            if key not in converted:
                converted[key] = replica.preparer.convert(chunk)
            replica.send(chunk, order[a:b], converted[key])


@dataclass(frozen=True)
class FleetResult:
    router: RouterSpec
    groups: list[tuple[str, int]]
    replicas: list[ServeResult]
    replica_groups: list[str]
    busy_s: list[float]
    routed: list[int]
    completed: int
    makespan: float
    throughput_rps: float
    throughput_tps: float
    ttft: Stats
    tpot: Stats
    e2e: Stats
    prefix_hit_rate: float | None
    imbalance: float  # max / mean busy time

    def to_dict(self) -> dict:
        per = [{"replica": i, "group": g, "routed": n, "busy_s": busy, **r.to_dict()}
               for i, (r, g, busy, n) in enumerate(zip(self.replicas, self.replica_groups, self.busy_s, self.routed))]
        return {
            "router": {"policy": self.router.policy, "sync_interval_s": self.router.sync_interval_s,
                       "overlap_weight": self.router.overlap_weight},
            "groups": [{"name": n, "count": c} for n, c in self.groups],
            "fleet": {"replicas": len(self.replicas), "completed": self.completed, "makespan": self.makespan,
                      "throughput_rps": self.throughput_rps, "throughput_tps": self.throughput_tps,
                      "ttft_s": self.ttft.to_dict(), "tpot_s": self.tpot.to_dict(), "e2e_s": self.e2e.to_dict(),
                      "prefix_hit_rate": self.prefix_hit_rate, "imbalance": self.imbalance},
            "replicas": per,
        }


def simulate_fleet(workload: Workload, *, progress=None) -> FleetResult:
    """Route the workload's requests over its replicas and serve them (see the module docstring)."""
    from kvplan.workload.prefixes import request_stream

    return run_fleet(read_groups(workload), RouterSpec.read(workload), request_stream(workload), workload.seed,
                     total=workload.num_requests, progress=progress)


def run_fleet(groups: list[Group], spec: RouterSpec, chunks, seed: int = 0, *, total: int = 0,
              progress=None) -> FleetResult:
    """The requests of `chunks` (RequestChunks in arrival order, prefixes applied) over the
    replicas of `groups` behind the router `spec`."""
    replicas: list[Replica] = []
    for g in groups:
        setup = make_setup(g.workload, g.workload.allocators[0])
        replicas += [Replica(len(replicas), g, setup) for _ in range(g.count)]
    router = make_router(spec, replicas, seed)
    per_unit = replicas[0].setup.clock.ticks_per_unit
    done = 0
    for chunk in chunks:
        if not len(chunk):
            continue
        if not router.looks:
            _split(chunk, router.assign(chunk), replicas)
            for r in replicas:
                r.advance(0)
        else:
            for window in router.windows(chunk):
                horizon = int(round(float(window.arrival[0]) * per_unit))
                for r in replicas:
                    r.advance(horizon)
                router.sync()
                _split(window, router.assign(window), replicas)
        done += len(chunk)
        if progress is not None:
            progress(done, total)
    for r in replicas:
        r.advance(0, final=True)
    return _result(spec, groups, replicas)


def _result(spec: RouterSpec, groups: list[Group], replicas: list[Replica]) -> FleetResult:
    results, arrays, hits, queries = [], [], 0, 0
    for r in replicas:  # a replica the router never chose has an empty result
        raw = r.state.raw()
        results.append(build_result(raw, r.setup))
        arrays.append(latency_arrays(raw, r.setup.clock.ticks_per_unit, r.setup.clock.frontend))
        if raw.prefix is not None:
            hits, queries = hits + raw.prefix.hits, queries + raw.prefix.queries
    per_unit = replicas[0].setup.clock.ticks_per_unit
    used = [r for r in replicas if r.state.loaded]
    start = min(int(r.state.st[K.ORIGIN]) for r in used)
    end = max(int(r.state.st[K.NOW]) for r in used)
    span = (end - start) / per_unit
    out = sum(int(x.throughput_tps * x.makespan + 0.5) for x in results)  # output tokens
    busy = [r.busy_ticks() / per_unit for r in replicas]
    mean_busy = sum(busy) / len(busy)
    cat = {k: np.concatenate([a[k] for a in arrays]) for k in arrays[0]}
    completed = sum(x.completed for x in results)
    return FleetResult(
        router=spec, groups=[(g.name, g.count) for g in groups], replicas=results,
        replica_groups=[r.group.name for r in replicas], busy_s=busy, routed=[r.routed for r in replicas],
        completed=completed, makespan=span, throughput_rps=completed / span if span else 0.0,
        throughput_tps=out / span if span else 0.0,
        ttft=Stats.of(cat["ttft"]), tpot=Stats.of(cat["tpot"]), e2e=Stats.of(cat["e2e"]),
        prefix_hit_rate=hits / queries if queries else None,
        imbalance=max(busy) / mean_busy if mean_busy else 1.0,
    )  # fmt: skip


def fleet_document(workload: Workload, *, progress=None) -> dict:
    result = simulate_fleet(workload, progress=progress)
    return {"workload": workload.name, "experiment": "fleet", "num_requests": workload.num_requests,
            "time_unit": "s", **result.to_dict()}


__all__ = ["FleetResult", "Group", "ROUTERS", "fleet_document", "run_fleet", "simulate_fleet"]
