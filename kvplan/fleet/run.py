"""Fleet simulation: replicas of the serve engine behind a router (`experiment: fleet`).

A fleet file is a serve workload with `replicas:` (groups of identical replicas, each group's
`model`, `gpu`, `tp`, `kv_dtype`, `pool`, `scheduler`, `allocators`, `timing` defaulting to the
file's top level, and its `count`) and `router:` (kvplan/fleet/routers.py): a `FleetSpec` of
kvplan/workload/spec.py, read with the rest of the file. Every replica is the serve
engine of kvplan/sim/engine.py with its own KV pool, prefix cache, scheduler and API server (vLLM's
scheduler, or SGLang's with `engine: sglang`: engine.new_state); the router sends each request, at
its arrival, to one of them.

How the replicas run together:
- round_robin and random do not look at the replicas: every request is routed as it is read, and
  each replica runs its own stream exactly as `serve` runs one (a fleet of one replica is the
  serve run, byte for byte; round robin over N identical replicas is N serve runs of the split
  streams).
- least_outstanding, least_kv and prefix_aware look at them. The router's view is refreshed every
  `sync_interval_s` of arrival time (a metrics scrape, or KV events): at each refresh every
  replica is simulated up to that instant (its state's `advance`) and reports its outstanding
  requests and KV blocks in use; between refreshes the router adds what it sent itself, as
  routers that count in-flight requests do. prefix_aware keeps its own index of the prompt blocks
  it sent to each replica (an LRU of each replica's cache size in blocks, the way llm-d's
  approximate prefix scorer does) and weighs the prefill a replica would save against the KV it
  holds (kvplan/fleet/routers.py).

- with `role: prefill` and `role: decode` groups the fleet is disaggregated: prompts run on the
  prefill pool, the proxy hands each to the decode pool, its KV crosses the prefill and the decode
  replica's links (`transfer:`, each link one transfer at a time), outputs come from the decode
  pool (`_disaggregated`).

Per replica and for the fleet: throughput, TTFT/TPOT/E2E percentiles, prefix hit rate, busy time
(its span less the time it had nothing to run), the load imbalance max / mean busy time, and the
KV transfer times of a disaggregated fleet.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from kvplan.errors import KvplanError, WorkloadError
from kvplan.fleet.routers import make_router
from kvplan.sim.engine import new_state
from kvplan.sim.inputs import ChunkPreparer, SimSetup, id_pieces, make_setup
from kvplan.sim.timing import MAX_ARRIVAL_TICKS
from kvplan.sim.metrics import ServeResult, Stats, build_result, client_frontend, latency_arrays
from kvplan.sim.overload import Overload, overload_of
from kvplan.sim.slo import client_latencies, goodput, goodput_of, within
from kvplan.workload.distributions import Fixed, Lengths
from kvplan.workload.records import Workload
from kvplan.workload.chunks import RequestChunk
from kvplan.workload.routing import RouterSpec
from kvplan.workload.spec import SGLANG_DISAGGREGATED, SyntheticRequests, Transfer

@dataclass(frozen=True)
class Group:
    """Identical replicas: the serve workload of one of them (its requests are the router's)."""

    name: str
    count: int
    workload: Workload
    role: str = "both"  # "prefill" / "decode": a pool of a disaggregated fleet


def transfer_ticks(transfer: Transfer, kv_bytes: np.ndarray, per_unit: int) -> tuple[np.ndarray, int]:
    """Ticks each request's KV holds the link (bytes / gb_per_s; 0 with gb_per_s 0, no bandwidth
    limit), and the link's latency in ticks. A link so slow that a transfer leaves the clock's
    range (about 53 days) is refused naming `transfer.gb_per_s`: the decode arrivals it would make
    are not the file's arrivals."""
    seconds = np.zeros(len(kv_bytes))
    if transfer.gb_per_s:
        with np.errstate(all="ignore"):  # an overflow to inf is refused just below
            seconds = kv_bytes / (transfer.gb_per_s * 1e9)
    ticks = (seconds + transfer.latency_s) * per_unit
    if ticks.size and not (np.isfinite(ticks).all() and ticks.max() < MAX_ARRIVAL_TICKS // 2):
        worst = float(kv_bytes.max())
        raise WorkloadError(f"a request's KV ({worst / 2**30:.3g} GiB) would take {seconds.max():.3g} s over "
                            f"{transfer.gb_per_s:g} GB/s, beyond the simulated clock's 53 days; expected a link "
                            f"of at least {2 * worst / 1e9 / (MAX_ARRIVAL_TICKS / per_unit):.2g} GB/s (0: no limit)",
                            field="transfer.gb_per_s")
    return np.rint(seconds * per_unit).astype(np.int64), int(round(transfer.latency_s * per_unit))


# The requests of a group's own workload while it is built: the fleet's stream replaces them.
_NO_REQUESTS = SyntheticRequests(1, Lengths(Fixed(1), 1), Lengths(Fixed(1), 0))


class TransferLinks:
    """Every replica's link of a disaggregated fleet, each carrying one KV transfer at a time: a
    request's KV leaves its prefill replica and enters its decode replica at once, so its
    transfer starts when it is ready and both links are free, in the order the proxy asks
    (first come, first served: a later transfer never overtakes an earlier one on either link),
    holds both for its `busy` ticks, and the KV lands `latency` ticks after it ends."""

    def __init__(self, replicas: int, latency: int) -> None:
        self.free = [0] * replicas  # tick each replica's link is free from
        self.latency = latency

    def carry(self, ready: np.ndarray, busy: np.ndarray, source: np.ndarray, sink: np.ndarray) -> np.ndarray:
        """When each transfer's KV lands (ready, in the order asked; `source`, `sink`: replicas)."""
        free, out = self.free, np.empty(len(ready), dtype=np.int64)
        for i, (t, b, s, k) in enumerate(zip(ready.tolist(), busy.tolist(), source.tolist(), sink.tolist())):
            end = max(t, free[s], free[k]) + b
            free[s] = free[k] = end
            out[i] = end + self.latency
        return out


def read_groups(workload: Workload) -> list[Group]:
    """The fleet's replica groups, each a serve workload: the fleet file's spec with the group's
    own keys in place of the top level's (so a group's keys mean what they mean there)."""
    from kvplan.model.facts import model_facts
    from kvplan.workload.build import build_workload

    spec = workload.spec
    fleet = spec.fleet if spec is not None else None
    if spec is None or fleet is None:
        raise WorkloadError("a fleet needs `replicas:`, a list of replica groups", file=workload.path,
                            field="replicas")
    groups = []
    for i, g in enumerate(fleet.groups):
        where = f"replicas[{i}]"
        line = spec.locate(where) if spec.locate is not None else None
        own = g.overrides()
        if not own:
            wl = replace(workload, experiment="serve", prefix=None, sampling=None)
        else:
            try:
                wl = build_workload(replace(spec, name=f"{workload.name}:{g.name}", experiment="serve",
                                            requests=_NO_REQUESTS, fleet=None, prefix=None, sampling=None, **own),
                                           model_facts)
            except KvplanError as exc:  # name the group
                raise WorkloadError(exc.message, file=workload.path, field=f"{where}.{exc.field}" if exc.field
                                    else where, line=line) from None
            wl = replace(wl, make_requests=workload.make_requests, num_requests=workload.num_requests,
                         seed=workload.seed, prefix=None, sampling=None)
        if wl.timing.gpu_name is None:
            raise WorkloadError("a fleet's replicas need a gpu (their latencies come from its step times)",
                                file=workload.path, field=where, line=line)
        if g.role == "decode" and (wl.allocators[0].kind != "paged" or wl.scheduler.prefix_caching):
            raise WorkloadError("a decode pool receives its prompts' KV: it needs a paged allocator and "
                                "scheduler.prefix_caching: false", file=workload.path, field=where, line=line)
        groups.append(Group(g.name, g.count, wl, g.role))
    if fleet.disaggregated:
        _same_kv(groups, workload.path, spec)
    return groups


def _same_kv(groups: list[Group], path: str, spec) -> None:
    """A decode replica reads the KV a prefill replica wrote, layer by layer in the writer's
    layout: both pools must serve the same model with the same KV dtype (their TP may differ, as
    vLLM's NixlConnector reshards heads between TP degrees), or the first that differs is refused."""
    first = next(g for g in groups if g.role == "prefill")
    want = first.workload.layout
    for i, g in enumerate(groups):
        have = g.workload.layout
        if have is None or want is None or g is first:
            continue
        for key, what in (("model", "the same model"), ("kv_dtype", "the same KV dtype")):
            if getattr(have, key) != getattr(want, key):
                where = f"replicas[{i}]"
                raise WorkloadError(f"{g.role} group {g.name!r} has {key} {getattr(have, key)}, {first.role} group "
                                    f"{first.name!r} {getattr(want, key)}: prefill and decode pools need {what} "
                                    "(the decode side reads the KV the prefill side wrote)", file=path,
                                    field=f"{where}.{key}",
                                    line=spec.locate(where) if spec.locate is not None else None)


class Replica:
    """One serve engine of the fleet, fed the requests its router sends it."""

    def __init__(self, index: int, group: Group, setup: SimSetup):
        self.index, self.group, self.setup = index, group, setup
        self.state = new_state(setup)  # vLLM's scheduler, or SGLang's for a group with engine: sglang
        self.preparer = ChunkPreparer(setup)
        self.routed = 0
        self.gids: list[np.ndarray] = []  # the fleet's numbers of the requests it was sent, in order

    def send(self, chunk: RequestChunk, idx: np.ndarray, parts: tuple, gids: np.ndarray) -> None:
        """The requests at `idx` of `chunk`: `parts`, their arrival ticks, prompt and output lengths
        and clipped flags as their group converted them (ChunkPreparer.convert), and `gids`, their
        numbers in the fleet."""
        own = (self.preparer.trie is not None and chunk.hash_ids is not None) or chunk.preload is not None
        self.state.load(self.preparer.prepare_parts(chunk.take(idx) if own else chunk, *parts))
        self.routed += len(idx)
        self.gids.append(gids)

    def advance(self, horizon: int, final: bool = False) -> None:
        """Simulate up to `horizon` ticks (it has nothing arriving before then), or to the end."""
        self.state.advance(None if final else horizon)

    @property
    def outstanding(self) -> int:
        return self.state.outstanding

    @property
    def blocks_used(self) -> int:
        return self.state.blocks_in_use

    @property
    def waiting(self) -> int:
        """Requests sent to it and neither running nor finished (vLLM's num_requests_waiting)."""
        return self.state.waiting

    def cached_hash_blocks(self, ids) -> int:
        """How many leading hash blocks of a prompt (its hash ids) this replica's prefix cache holds
        now, every simulated block of each (what vLLM's KV events tell a precise index)."""
        trie = self.preparer.trie
        if trie is None or not trie.hash_block_size:
            return 0
        per = trie.hash_block_size // self.setup.block_size
        holds, parent, held = self.state.holds_node, -1, 0
        for h in ids:
            node = trie.child(parent, h)
            if node is None or not holds(node, per):
                break
            held, parent = held + 1, node
        return held


def _split(chunk: RequestChunk, gids: np.ndarray, choice: np.ndarray, replicas: list[Replica]) -> None:
    """Send each replica the requests of `chunk` (the fleet's numbers `gids`) routed to it
    (`choice`), in arrival order."""
    order = np.argsort(choice, kind="stable")  # stable: each replica's share stays in arrival order
    bounds = np.searchsorted(choice[order], np.arange(len(replicas) + 1))
    gids = gids[order]
    converted: dict[int, tuple] = {}  # per group, converted once, in `order` (each share a slice of it)
    for r, (a, b) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist())):
        if b > a:
            replica = replicas[r]
            key = id(replica.group)
            if key not in converted:
                converted[key] = tuple(x[order] for x in replica.preparer.convert(chunk))
            replica.send(chunk, order[a:b], tuple(x[a:b] for x in converted[key]), gids[a:b])


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
    transfer: Stats | None = None  # disaggregated: each request's KV transfer time (its wait for the link included)
    transfer_wait: Stats | None = None  # disaggregated: each request's wait for its links
    proxy_s: float | None = None  # disaggregated: the proxy's share of each request's TTFT and E2E
    goodput: dict | None = None  # with an `slo:`, the fleet's requests within it (kvplan/sim/slo.goodput)
    requests: dict | None = field(default=None, compare=False, repr=False)  # with record: REQUEST_COLUMNS
    roles: list[str] | None = None  # disaggregated: each replica's pool
    overload: Overload | None = None  # the fleet's requests arriving faster than it admits them
    offload: dict | None = None  # with a CPU tier per replica: the tiers together (_offload_summary)

    def to_dict(self) -> dict:
        roles = self.roles or ["both"] * len(self.replicas)
        per = [{"replica": i, "group": g, "role": role, "routed": n, "busy_s": busy, **r.to_dict()}
               for i, (r, g, role, busy, n) in enumerate(zip(self.replicas, self.replica_groups, roles, self.busy_s,
                                                             self.routed))]
        return {
            "router": self.router.to_dict(),
            "groups": [{"name": n, "count": c} for n, c in self.groups],
            "fleet": {"replicas": len(self.replicas), "completed": self.completed, "makespan": self.makespan,
                      "throughput_rps": self.throughput_rps, "throughput_tps": self.throughput_tps,
                      "ttft_s": self.ttft.to_dict(), "tpot_s": self.tpot.to_dict(), "e2e_s": self.e2e.to_dict(),
                      "prefix_hit_rate": self.prefix_hit_rate, "imbalance": self.imbalance,
                      "transfer_s": None if self.transfer is None else self.transfer.to_dict(),
                      "transfer_wait_s": None if self.transfer_wait is None else self.transfer_wait.to_dict(),
                      "proxy_s": self.proxy_s,
                      "overload": None if self.overload is None else self.overload.to_dict(),
                      **({} if self.goodput is None else {"goodput": self.goodput}),
                      **({} if self.offload is None else {"offload": self.offload})},
            "replicas": per,
        }


def simulate_fleet(workload: Workload, *, progress=None, record: bool = False) -> FleetResult:
    """Route the workload's requests over its replicas and serve them (see the module docstring).
    `record`: keep one row per request (FleetResult.requests, for `--csv`)."""
    from kvplan.workload.prefixes import request_stream

    fleet = workload.spec.fleet
    return run_fleet(read_groups(workload), fleet.router, request_stream(workload), workload.seed,
                     total=workload.num_requests, progress=progress, transfer=fleet.transfer,
                     slo=workload.spec.slo, record=record)


def run_fleet(groups: list[Group], spec: RouterSpec, chunks, seed: int = 0, *, total: int = 0,
              progress=None, transfer: Transfer | None = None, slo=None, record: bool = False) -> FleetResult:
    """The requests of `chunks` (RequestChunks in arrival order, prefixes applied) over the
    replicas of `groups` behind the router `spec`; with prefill and decode groups, disaggregated
    (`_disaggregated`). `slo`: the limits its goodput counts against (a SloSpec); `record`: one
    row per request in the result."""
    replicas: list[Replica] = []
    for g in groups:
        if g.workload.sglang is not None and g.role != "both":
            raise WorkloadError(f"group {g.name!r}: {SGLANG_DISAGGREGATED}, expected engine: vllm there", field="engine")
        setup = make_setup(g.workload, g.workload.allocators[0])
        replicas += [Replica(len(replicas) + k, g, setup) for k in range(g.count)]
    if any(g.role != "both" for g in groups):
        return _disaggregated(groups, spec, chunks, seed, replicas, transfer or Transfer(0.0, 0.0), total, progress,
                              slo, record)
    _serve(replicas, make_router(spec, replicas, seed), chunks, total, progress)
    result = _result(spec, groups, replicas, slo)
    per_unit = replicas[0].setup.clock.ticks_per_unit
    gateway = _gateway(spec, per_unit)
    if record or (slo is not None and gateway):
        cols = _by_gid(replicas, sum(r.routed for r in replicas))
        lat = client_latencies(cols["sent"], cols["first_token"], cols["finish"], cols["output"],
                               cols["frontend"] + gateway, per_unit)
    if slo is not None:  # each replica counts its own; behind a gateway, the fleet counts with it
        met = (int(within(slo, **lat).sum()) if gateway else sum(r.goodput["requests"] for r in result.replicas))
        result = replace(result, goodput=goodput_of(slo, met, result.completed, result.makespan))
    if record:
        result = replace(result, requests=_rows(cols, cols, lat, cols["sent"], cols["admitted"] - cols["sent"],
                                                per_unit, slo))
    return result


REQUEST_COLUMNS = ("replica", "prefill_replica", "transfer_s", "transfer_wait_s", "sent_s", "prompt", "output",
                   "cached_tokens", "preemptions", "queue_s", "ttft_s", "tpot_s", "e2e_s", "within_slo")


def _rows(served: dict, first: dict, lat: dict, sent: np.ndarray, queued: np.ndarray, per_unit: int, slo,
          moved: tuple | None = None) -> dict[str, np.ndarray]:
    """One row per request of the fleet (by its number), columns of REQUEST_COLUMNS, times in
    seconds: `served`, the columns (`_by_gid`) of the replicas that streamed the answer; `first`,
    of the replicas that took it in (the prefill pool, or `served` again); `lat`, the client's
    latencies (client_latencies); `queued`, ticks it waited for admission; `moved`, a
    disaggregated fleet's (transfer, wait for the link) ticks."""
    rows = {"replica": served["replica"], "sent_s": sent / per_unit, "prompt": first["prompt"],
            "output": served["output"], "cached_tokens": first["cached"], "preemptions": served["preemptions"],
            "queue_s": queued / per_unit, "ttft_s": lat["ttft"], "tpot_s": lat["tpot"], "e2e_s": lat["e2e"]}
    if moved is not None:
        rows.update(prefill_replica=first["replica"], transfer_s=moved[0] / per_unit, transfer_wait_s=moved[1] / per_unit)
    if slo is not None:
        rows["within_slo"] = within(slo, **lat).astype(np.int64)
    return {k: rows[k] for k in REQUEST_COLUMNS if k in rows}


def _serve(replicas: list[Replica], router, chunks, total: int = 0, progress=None, arrive=None) -> None:
    """Route every request of `chunks` as it arrives and serve them all to the end. `arrive(window,
    gids, choice)`, when given, is the window as its replicas receive it once routed (a
    disaggregated decode pool: the request is routed when the proxy asks, and reaches the engine
    when its KV has)."""
    per_unit = replicas[0].setup.clock.ticks_per_unit
    done = 0
    for chunk in chunks:
        n = len(chunk)
        if not n:
            continue
        gids = np.arange(done, done + n)
        if not router.looks:
            choice = router.assign(chunk)
            routed = chunk if arrive is None else arrive(chunk, gids, choice)
            # with prefix identities, in pieces each served as far as it goes before the next is
            # sent (the replicas hold the identities of what they were sent and did not finish)
            parts = id_pieces(routed) if routed.hash_ids is not None else [slice(0, n)]
            for part in parts:
                _split(routed if len(parts) == 1 else routed.take(part), gids[part], choice[part], replicas)
                for r in replicas:
                    r.advance(0)
        else:
            for a, b, window in router.windows(chunk):
                horizon = int(round(float(window.arrival[0]) * per_unit))
                for r in replicas:
                    r.advance(horizon)
                router.sync()
                choice = router.assign(window)
                _split(window if arrive is None else arrive(window, gids[a:b], choice), gids[a:b], choice, replicas)
        done += n
        if progress is not None:
            progress(done, total)
    for r in replicas:
        r.advance(0, final=True)


def _by_gid(replicas: list[Replica], n: int) -> dict[str, np.ndarray]:
    """Per request of the fleet (by its number): the columns of the raw run that served it."""
    keys = ("sent", "arrival", "admitted", "first_token", "finish", "prompt", "output", "frontend", "replica",
            "preemptions", "cached")
    out = {k: np.full(n, -1, dtype=np.int64) for k in keys}
    for r in replicas:
        if not r.gids:
            continue
        raw, gids = r.state.raw(), np.concatenate(r.gids)
        out["replica"][gids] = r.index
        out["cached"][gids] = 0 if raw.hit_tokens is None else raw.hit_tokens
        for k in ("arrival", "admitted", "first_token", "finish", "prompt", "output", "preemptions"):
            out[k][gids] = getattr(raw, k)
        out["sent"][gids] = raw.arrival if raw.sent is None else raw.sent
        out["frontend"][gids] = client_frontend(raw, r.setup.clock)  # its API server's share
    return out


def _disaggregated(groups, spec, chunks, seed, replicas, transfer: Transfer, total, progress, slo=None,
                   record: bool = False) -> FleetResult:
    """Prefill and decode pools, as vLLM's disaggregated serving (NixlConnector behind its proxy)
    runs them. The proxy posts each request to a prefill replica (the router's choice) with
    max_tokens 1: its API server takes it in and the engine runs the prompt with one output token;
    the prefill server answers the proxy (its API server's pass, `client_frontend`), and the proxy
    then posts the request to a decode replica, whose engine reads the prompt's KV (per GPU of the
    prefill group's layout) over the prefill replica's link and its own: the proxy picks the
    decode replica (routed by the same policy) when the prefill server answers, and the KV
    crosses both links at once. Each link carries one request's KV at a time, in the order the
    proxy asks, each for bytes / gb_per_s, then latency_s (`TransferLinks`): a transfer waits
    until both its links are free. The request reaches the decode engine when its KV has: it
    is admitted holding all but its last prompt token's KV (the engine's preload),
    computes that token and samples every output token, which its API server streams. So the
    client's TTFT = the prefill server's pass (intake, engine to its one token, answer) + the
    proxy's (`transfer.proxy_s`, counted once between the two calls) + the KV's wait and transfer
    + the decode server's pass to its first token. Each request's transfer time and its wait for
    the links are reported. (The decode side does not push back on prefill: a prefill replica frees
    a request's blocks when it finishes, and the decode engine takes none for a request before its
    KV has come, where vLLM's allocates them when the proxy asks.)"""
    prefill = [r for r in replicas if r.group.role == "prefill"]
    decode = [r for r in replicas if r.group.role == "decode"]
    outputs: list[np.ndarray] = []

    def prefill_only():
        for c in chunks:
            outputs.append(np.asarray(c.output_len, dtype=np.int64))
            yield replace(c, output_len=np.ones(len(c), dtype=np.int64))

    _serve(prefill, make_router(spec, prefill, seed), prefill_only(), total, progress)
    n = sum(len(o) for o in outputs)
    p = _by_gid(prefill, n)
    per_unit = replicas[0].setup.clock.ticks_per_unit
    kv_bytes = np.zeros(n, dtype=np.float64)
    for r in prefill:
        if r.gids:
            gids = np.concatenate(r.gids)
            kv_bytes[gids] = p["prompt"][gids] * float(r.group.workload.layout.bytes_per_token)
    busy, latency = transfer_ticks(transfer, kv_bytes, per_unit)
    asked = p["finish"] + p["frontend"] + int(round(transfer.proxy_s * per_unit))  # the decode server asked
    order = np.argsort(asked, kind="stable")  # decode's request k is the fleet's request order[k]
    output = np.concatenate(outputs) if outputs else np.zeros(0, dtype=np.int64)
    links = TransferLinks(len(replicas), latency)
    ready = np.zeros(n, dtype=np.int64)

    def decode_stream(size: int = 65_536):
        for a in range(0, n, size):
            idx = order[a:a + size]
            yield RequestChunk(asked[idx] / per_unit, p["prompt"][idx], output[idx],
                               preload=np.maximum(p["prompt"][idx] - 1, 0))

    def arrive(window: RequestChunk, ks: np.ndarray, choice: np.ndarray) -> RequestChunk:
        """The routed window as its decode replicas receive it: when each request's KV has come."""
        gids = order[ks]
        ready[gids] = links.carry(asked[gids], busy[gids], p["replica"][gids],
                                  np.array([decode[c].index for c in choice.tolist()], dtype=np.int64))
        return replace(window, arrival=ready[gids] / per_unit)

    _serve(decode, make_router(spec, decode, seed + 1), decode_stream(), arrive=arrive)
    d = _by_gid(decode, n)
    d = {k: _undo(v, order) for k, v in d.items()}
    result = _result(spec, groups, replicas)
    sent = p["sent"]  # the decode replica's API server streams the answer (its frontend)
    lat = client_latencies(sent, d["first_token"], d["finish"], d["output"], d["frontend"] + _gateway(spec, per_unit),
                           per_unit)
    span = (int(d["finish"].max()) - int(sent.min())) / per_unit if n else 0.0
    # the fleet's queueing: a request's wait for a prefill replica, then for a decode replica
    waited = p["admitted"] + (d["admitted"] - d["arrival"])
    moved, wait = ready - asked, ready - asked - busy - latency
    rows = _rows(d, p, lat, sent, waited, per_unit, slo, (moved, wait)) if record or slo is not None else None
    met = None if slo is None else goodput(slo, rows["within_slo"].astype(bool), span)
    return replace(result, completed=n, makespan=span, throughput_rps=n / span if span else 0.0,
                   overload=overload_of(p["arrival"], waited, per_unit),
                   throughput_tps=int(d["output"].sum()) / span if span else 0.0,
                   ttft=Stats.of(lat["ttft"]), tpot=Stats.of(lat["tpot"][d["output"] > 1]),
                   e2e=Stats.of(lat["e2e"]),
                   transfer=Stats.of(moved / per_unit), transfer_wait=Stats.of(wait / per_unit),
                   proxy_s=transfer.proxy_s, roles=[r.group.role for r in replicas], goodput=met,
                   requests=rows if record else None)


def _undo(values: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Values numbered by decode arrival (the decode pool saw the fleet's request order[k] as its
    k-th) back to the fleet's numbering."""
    out = np.empty_like(values)
    out[order] = values
    return out


def _gateway(spec: RouterSpec, per_unit: int) -> int:
    """Ticks the gateway in front of the router adds to every request's TTFT and E2E (the router's
    gateway_s, kvplan/workload/routing.GATEWAY_DEFAULT_S): the request crosses it before any replica
    sees it, a constant shift of every arrival, so it adds to the client's latencies alone."""
    return int(round(spec.gateway_latency_s * per_unit))


def _result(spec: RouterSpec, groups: list[Group], replicas: list[Replica], slo=None) -> FleetResult:
    """The fleet's result from its replicas' runs (each replica's goodput with `slo`)."""
    results, arrays, hits, queries, out = [], [], 0, 0, 0
    n = sum(r.routed for r in replicas)
    arrival, admitted = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)  # by the fleet's number
    for r in replicas:  # a replica the router never chose has an empty result
        raw = r.state.raw()
        if r.gids:
            gids = np.concatenate(r.gids)
            arrival[gids], admitted[gids] = raw.arrival, raw.admitted
        out += int(raw.output.sum())
        results.append(build_result(raw, r.setup, slo=slo))
        arrays.append(latency_arrays(raw, r.setup.clock.ticks_per_unit,
                                     client_frontend(raw, r.setup.clock) + _gateway(spec, r.setup.clock.ticks_per_unit)))
        if raw.prefix is not None:
            hits, queries = hits + raw.prefix.hit_tokens, queries + raw.prefix.query_tokens
    per_unit = replicas[0].setup.clock.ticks_per_unit
    used = [r for r in replicas if r.state.loaded]
    start = min(r.state.origin for r in used)
    end = max(r.state.now for r in used)
    span = (end - start) / per_unit
    busy = [r.state.busy_ticks() / per_unit for r in replicas]
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
        # a disaggregated fleet numbers its decode requests apart: _disaggregated sets its own
        overload=overload_of(arrival, admitted, per_unit) if all(r.group.role == "both" for r in replicas) else None,
        offload=_offload_summary(results),
    )  # fmt: skip


def _offload_summary(results: list[ServeResult]) -> dict | None:
    """The replicas' CPU tiers together: the tier hit rate over the prompt tokens the GPU caches
    missed, GPU and tier hits over all prompt tokens, bytes loaded (per GPU link) and load time."""
    tiers = [r for r in results if r.offload is not None]
    if not tiers:
        return None
    queries = sum(r.offload["query_tokens"] for r in tiers)
    hits = sum(r.offload["hit_tokens"] for r in tiers)
    prompts = sum(r.prefix.query_tokens for r in tiers)
    both = hits + sum(r.prefix.hit_tokens for r in tiers)
    return {"hit_rate": hits / queries if queries else 0.0, "combined_hit_rate": both / prompts if prompts else 0.0,
            "bytes_loaded": sum(r.offload["bytes_loaded"] for r in tiers),
            "load_time_s": sum(r.offload["load_time_s"] for r in tiers)}


def fleet_document(workload: Workload, *, progress=None, result: FleetResult | None = None) -> dict:
    """What `kvplan simulate --json` prints for a fleet (`result`: the run made already)."""
    result = simulate_fleet(workload, progress=progress) if result is None else result
    return {"workload": workload.name, "experiment": "fleet", "num_requests": workload.num_requests,
            "time_unit": "s", **result.to_dict()}


__all__ = ["FleetResult", "Group", "REQUEST_COLUMNS", "fleet_document", "TransferLinks", "run_fleet",
           "simulate_fleet"]
