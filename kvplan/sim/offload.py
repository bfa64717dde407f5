"""A CPU tier of KV blocks behind the GPU prefix cache: vLLM's native KV offloading.

`vllm serve --kv-offloading-size 8 --kv-offloading-backend native` (older releases:
`--kv-transfer-config '{"kv_connector": "OffloadingConnector", ...}'` with `num_cpu_blocks` or
`cpu_bytes_to_use`) puts an OffloadingConnector beside the scheduler. The rules both engines follow
(the reference, kvplan/sim/reference.py, on kvplan/memory/cpu_tier.py's CpuTier; the fast kernel,
kvplan/sim/kernel.py, on flat arrays), each from vLLM's source:

- Size (vllm/v1/kv_offload/cpu/spec.py, CPUOffloadingSpec.__init__): num_blocks = bytes //
  (page bytes x layers x world size): `kv_offloading_size` is for the whole TP group, and one CPU
  block holds the B tokens of one GPU block on every GPU of the group.
- Store on computation, not on eviction (OffloadingConnectorScheduler._get_reqs_to_store, run by
  build_connector_meta at the end of every schedule()): after the scheduling pass, for each
  scheduled request (the newly admitted first, then the running, as yield_req_data orders them),
  the full blocks its scheduled tokens complete, from the last one it stored on, are one store
  batch. CPUOffloadingManager.prepare_store skips blocks already in the tier; when the rest do not
  fit, it evicts least recently used blocks, never one being loaded (ref count > 0) nor one of the
  batch; when too few can be evicted nothing of the batch is stored (and kvplan does not offer it
  again, where vLLM retries it at the request's next step). After a store that added
  blocks, the request's whole prefix is touched (moved to the most recent end, its first block
  last: LRUCachePolicy.touch walks the keys in reverse). Only blocks with an identity (a prompt's
  hash blocks) exist for kvplan, so output tokens are never stored. A store is taken as done
  when the step ends (its D2H copy runs on its own stream, overlapping the step).
- Load (get_num_new_matched_tokens, called for a waiting request with no computed tokens once a
  seat and token budget are free): the request's blocks in the tier are touched, then the
  consecutive blocks after its GPU prefix hit that the tier holds are its CPU hits, up to its last
  full identity block (the whole prompt when it is block aligned: the scheduler's
  _update_waiting_for_remote_kv then recomputes the last token). With hits, the scheduler
  allocates GPU blocks for them (allocate_slots with num_external_computed_tokens, no new tokens)
  and parks the request in WAITING_FOR_REMOTE_KVS: it takes no seat and no token budget, and
  admission goes on behind it. Its blocks are pinned in the tier while they load.
- Load time: its CPU-hit blocks x B tokens x each GPU's KV bytes per token / `gb_per_s`. Loads
  share one host-to-device link per replica, one at a time in the order they start
  (CpuGpuOffloadingHandlers: one CUDA stream per direction), so a load starts at
  max(now, the end of the previous one).
- The request is schedulable at the first step that starts at or after its load ends (the worker
  reports finished_recving after a step; the next schedule() sees it). Then its pins go, its
  loaded blocks are cached in the GPU prefix cache, and it is scheduled like a waiting request
  holding them, ahead of the waiting queue (vLLM keeps it at the head of `waiting`); if it does
  not fit, admission stops there (FCFS).
- A waiting request whose CPU hits include a block being loaded for another request waits (the
  scheduler's _blocks_being_loaded check). So does admission while max_num_seqs loads are in
  flight (get_num_new_matched_tokens's max_concurrent_loads). vLLM skips such a request and
  admits the ones behind it; kvplan stops admission there (its waiting queue is FCFS), a
  difference only while loads are in flight.
- When nothing can be scheduled while loads are in flight, the engine waits for the first to end
  or the next arrival (vLLM's empty steps take no GPU time); if nothing could ever change (the
  pool held by requests waiting behind a load that cannot start), the run is refused.

Metrics (`OffloadStats`, the serve JSON's "offload"): vLLM's external prefix cache counters
(connector_prefix_cache_stats: queries = prompt tokens the GPU cache did not hold, hits = tokens
found in the tier) at each request's first admission, and per load: loads, tokens and bytes
loaded (per GPU: what crosses each GPU's link), the transfer time; blocks stored and evicted.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.errors import WorkloadError
from kvplan.memory.prefix_cache import PrefixCacheStats
from kvplan.sim.timing import MAX_ARRIVAL_TICKS, TICKS_PER_SECOND
from kvplan.workload.records import OffloadConfig


@dataclass(frozen=True, slots=True)
class OffloadSetup:
    """One engine's CPU tier: its blocks of B tokens and the ticks a block takes to load."""

    cpu_bytes: int
    gb_per_s: float
    num_blocks: int  # CPU blocks of B tokens (on every GPU of the TP group)
    block_bytes: int  # KV bytes of one block on one GPU: what one GPU's link carries per block
    load_ticks: int  # ticks one block takes over one GPU's link


def offload_setup(config: OffloadConfig, block_size: int, max_model_len: int) -> OffloadSetup:
    """The tier `config` gives pools of `block_size`-token blocks; refused (naming `offload`) when
    it holds no block, or when one request's load would leave the simulated clock."""
    block_bytes = config.gpu_bytes_per_token * block_size
    num_blocks = config.cpu_bytes // (block_bytes * config.world_size)
    if num_blocks < 1:
        raise WorkloadError(f"{config.cpu_bytes:,} bytes hold no CPU block of {block_size} tokens "
                            f"({block_bytes * config.world_size:,} bytes across the TP group)",
                            field="offload.kv_offloading_size")
    load_ticks = round(block_bytes * TICKS_PER_SECOND / (config.gb_per_s * 1e9))
    if load_ticks * (-(-max_model_len // block_size)) * 1024 > MAX_ARRIVAL_TICKS:
        raise WorkloadError(f"a load of one request over {config.gb_per_s:g} GB/s could pass the simulated "
                            "clock's range; expected a faster link", field="offload.gb_per_s")
    return OffloadSetup(config.cpu_bytes, config.gb_per_s, num_blocks, block_bytes, load_ticks)


def stalled() -> WorkloadError:
    """The run neither engine can go on with: requests loaded from the tier hold the pool while the
    request ahead of them waits for blocks (the module docstring's last rule)."""
    return WorkloadError("requests loaded from the CPU tier hold the pool while the request ahead of them "
                         "waits for blocks: the pool is too small for the loads in flight", field="offload")


@dataclass(frozen=True, slots=True)
class OffloadStats:
    """The tier's counters (defined in the module docstring), integers only."""

    query_tokens: int = 0  # first admissions: prompt tokens not in the GPU prefix cache
    hit_tokens: int = 0  # of those, the tokens found in the tier
    loads: int = 0
    blocks_loaded: int = 0
    load_ticks: int = 0  # transfer ticks, summed over the loads (not their waits for the link)
    blocks_stored: int = 0
    blocks_evicted: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0


def offload_dict(stats: OffloadStats, setup: OffloadSetup, block_size: int, prefix: PrefixCacheStats) -> dict:
    """The serve JSON's "offload": the tier, its hit rate, and GPU and tier hits together over the
    prompt tokens (`combined_hit_rate`, against the GPU-only `prefix_hit_rate`)."""
    tokens = stats.blocks_loaded * block_size
    both = prefix.hit_tokens + stats.hit_tokens
    return {
        "kv_offloading_size": setup.cpu_bytes, "gb_per_s": setup.gb_per_s, "cpu_blocks": setup.num_blocks,
        "hit_rate": stats.hit_rate, "query_tokens": stats.query_tokens, "hit_tokens": stats.hit_tokens,
        "combined_hit_rate": both / prefix.query_tokens if prefix.query_tokens else 0.0,
        "loads": stats.loads, "tokens_loaded": tokens, "bytes_loaded": stats.blocks_loaded * setup.block_bytes,
        "load_time_s": stats.load_ticks / TICKS_PER_SECOND,
        "blocks_stored": stats.blocks_stored, "blocks_evicted": stats.blocks_evicted,
    }  # fmt: skip
