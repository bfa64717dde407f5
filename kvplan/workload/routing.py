"""The routers a fleet can put in front of its replicas: the one registry of their names.

`ROUTERS` names each policy and says in a line what it does; the workload reader, the JSON
Schema (kvplan/workload/json_schema.py), `kvplan plan --router`'s help and workloads/SCHEMA.md
(checked by a test) all read it, and kvplan/fleet/routers.py implements exactly these.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.workload.checks import check_choice, check_float, check_int, fail

ROUTERS = {
    "round_robin": "request i goes to replica i mod N (a Kubernetes Service, vLLM's production stack)",
    "random": "uniformly, from the workload's seed (a baseline)",
    "least_outstanding": "the replica with the fewest requests sent and not finished",
    "least_kv": "the replica with the smallest share of its KV blocks in use, counting the prompt blocks "
                "of what was sent since the last refresh",
    "prefix_aware": "NVIDIA Dynamo's KV-aware cost: overlap_weight x the prompt tokens a replica would "
                    "prefill + the KV tokens it holds; the cheapest wins",
    "llm_d": "llm-d's inference scheduler: prefix_weight x its prefix-cache score (an approximate index of "
             "what it sent, or the precise one of the replicas' KV events) + kv_cache_weight x (1 - KV in use) "
             "+ queue_weight x its queue score + active_request_weight x its active-request score; the highest wins",
    "sglang": "SGLang's cache-aware router: the least-loaded replica when the loads are imbalanced, else the "
              "longest prefix match when it covers more than cache_threshold of the prompt, else the least loaded",
    "vllm_dp": "vLLM's own data-parallel load balancer (vllm serve --data-parallel-size, a dense model's ranks): "
               "the replica of least waiting x 4 + running, the first on a tie",
}
ROUTER_NAMES = tuple(ROUTERS)
# the keys a router mapping takes: every router's, and each policy's own
COMMON_KEYS = ("policy", "sync_interval_s", "gateway_s")
POLICY_KEYS = {
    "prefix_aware": ("overlap_weight",),
    "llm_d": ("index", "prefix_weight", "kv_cache_weight", "queue_weight", "active_request_weight", "prefix_score",
              "max_prefix_tokens", "lru_capacity_blocks"),
    "sglang": ("cache_threshold", "balance_abs_threshold", "balance_rel_threshold"),
}
ROUTER_KEYS = COMMON_KEYS + tuple(k for keys in POLICY_KEYS.values() for k in keys)
LLM_D_INDEXES = ("approximate", "precise")
PREFIX_SCORES = ("ratio", "min_max")
MAX_PREFIX_BLOCKS = 256  # llm-d's approximate index matches at most this many blocks (maxPrefixBlocksToMatch)
# How often each router's view of the replicas is refreshed, by default: llm-d's endpoint picker
# scrapes every pod's metrics every 50 ms (its refreshMetricsInterval); the others every 0.1 s.
SYNC_DEFAULT_S = {"llm_d": 0.05}
# The gateway a router runs behind, as latency it adds to every request's TTFT and E2E (the client's
# request crosses it before the replica sees it; a constant shift of every arrival, so the replicas'
# dynamics are those without it). llm-d's scheduler is an endpoint picker (EPP) behind an Envoy
# gateway's ext_proc filter: Envoy streams the request body to the EPP, which waits for its end,
# parses it, schedules and answers with the pod. The EPP's own timings of that path, on a near-instant
# backend with 220 KB prompts (llm-d/llm-d-router#1109, its instrumented run, averages per request):
# header to first body chunk 8.19 ms, body parse 6.13 ms, director (scheduling) 10.94 ms: 25 ms, the
# body stream's 260 ms left out (queueing at 1,200 concurrent requests: the same stack serves at most
# ~130 requests/s, kubernetes-sigs/gateway-api-inference-extension#2928, where 20 concurrent requests
# already see 158 ms). The other policies run without a gateway unless the file says so.
GATEWAY_DEFAULT_S = {"llm_d": 0.025}


@dataclass(frozen=True, slots=True)
class RouterSpec:
    """`router:` of a fleet: a policy of ROUTERS, how stale its view of the replicas may be (None:
    the policy's default, SYNC_DEFAULT_S), the latency of the gateway it runs behind, added to every
    request's TTFT and E2E (None: the policy's default, GATEWAY_DEFAULT_S), and each policy's own
    settings:

    - prefix_aware: `overlap_weight`, the weight of tokens to prefill against KV held (Dynamo's 1).
    - llm_d (llm-d's inference scheduler, llm-d/llm-d-inference-scheduler; its default profile weighs
      queue-scorer 1, kv-cache-utilization-scorer 1, prefix-cache-scorer 2): `index` approximate
      (the scheduler's own LRU of the prompt blocks it sent each pod, as many as the pod's KV blocks,
      matching at most `max_prefix_tokens`; None: 256 blocks of the replicas' block size, as the
      gateway-api-inference-extension prefix plugin hashes the prompt's characters in blocks of 4 x
      the pod's reported block size, maxPrefixBlocksToMatch 256 of them, pkg/epp/scheduling/framework/
      plugins/multi/prefix/plugin.go at 6f84d17a, 2025-10-22) or precise (the pods' own caches,
      from vLLM's KV events); `lru_capacity_blocks`, the approximate index's lruCapacityPerServer: the
      blocks of the pod's block size it remembers per pod, the least recently sent forgotten first
      (None: as many as the pod's KV holds, which the plugin's default of 31,250 blocks matches or
      exceeds on the pods of the published runs; their configs also set 2,200, "per-Pod KVCache size
      (~141K) / block size (64)", on pods three times larger too: bench/routing_fidelity.py);
      `active_request_weight` (0 unless set), the weight of llm-d's active-request-scorer, which
      counts the requests the scheduler sent a pod and has not seen finish (1 for an idle pod, else
      (most - its count) / most);
      `prefix_score` ratio (matched / prompt blocks, llm-d since May 2026) or
      min_max (the precise scorer before: (hits - min) / (max - min) over the pods that hold the
      prompt's first block, 1 when they hold alike, the other pods 0).
    - sglang (SGLang's model gateway, its cache_aware policy and defaults): `cache_threshold` 0.3,
      `balance_abs_threshold` 64 and `balance_rel_threshold` 1.5 requests."""

    policy: str = "round_robin"
    sync_interval_s: float | None = None
    gateway_s: float | None = None
    overlap_weight: float = 1.0
    index: str = "approximate"
    prefix_weight: float = 2.0
    kv_cache_weight: float = 1.0
    queue_weight: float = 1.0
    active_request_weight: float = 0.0
    prefix_score: str = "ratio"
    max_prefix_tokens: int | None = None
    lru_capacity_blocks: int | None = None
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5

    def __post_init__(self) -> None:
        check_choice(self.policy, ROUTER_NAMES, "policy")
        check_float(self.sync_interval_s, "sync_interval_s", gt=0, le=3600, optional=True)
        check_float(self.gateway_s, "gateway_s", ge=0, le=60, optional=True)
        check_float(self.overlap_weight, "overlap_weight", ge=0, le=1000)
        check_choice(self.index, LLM_D_INDEXES, "index")
        for key in ("prefix_weight", "kv_cache_weight", "queue_weight", "active_request_weight"):
            check_float(getattr(self, key), key, ge=0, le=1000)
        check_choice(self.prefix_score, PREFIX_SCORES, "prefix_score")
        if self.max_prefix_tokens is not None:
            check_int(self.max_prefix_tokens, "max_prefix_tokens", ge=1, le=2**31)
        if self.lru_capacity_blocks is not None:
            check_int(self.lru_capacity_blocks, "lru_capacity_blocks", ge=1, le=2**31)
            if self.index != "approximate":
                raise fail("lru_capacity_blocks", "applies to the approximate index (the precise one reads the "
                                                  "replicas' caches); drop it or give index: approximate")
        check_float(self.cache_threshold, "cache_threshold", ge=0, le=1)
        check_int(self.balance_abs_threshold, "balance_abs_threshold", ge=0, le=2**31)
        check_float(self.balance_rel_threshold, "balance_rel_threshold", ge=1, le=1000)

    @property
    def interval_s(self) -> float:
        """The refresh interval this router runs with (its own, or the policy's default)."""
        return self.sync_interval_s if self.sync_interval_s is not None else SYNC_DEFAULT_S.get(self.policy, 0.1)

    @property
    def gateway_latency_s(self) -> float:
        """The gateway's latency this router's requests see (its own, or the policy's default)."""
        return self.gateway_s if self.gateway_s is not None else GATEWAY_DEFAULT_S.get(self.policy, 0.0)

    def to_dict(self) -> dict:
        """The policy, its refresh interval, its gateway's latency and its own settings (the other
        policies' left out)."""
        return {"policy": self.policy, "sync_interval_s": self.interval_s, "gateway_s": self.gateway_latency_s,
                **{k: getattr(self, k) for k in POLICY_KEYS.get(self.policy, ())}}
