"""The routers a fleet can put in front of its replicas: the one registry of their names.

`ROUTERS` names each policy and says in a line what it does; the workload reader, the JSON
Schema (kvplan/workload/json_schema.py), `kvplan plan --router`'s help and workloads/SCHEMA.md
(checked by a test) all read it, and kvplan/fleet/routers.py implements exactly these.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.workload.checks import check_choice, check_float

ROUTERS = {
    "round_robin": "request i goes to replica i mod N (a Kubernetes Service, vLLM's production stack)",
    "random": "uniformly, from the workload's seed (a baseline)",
    "least_outstanding": "the replica with the fewest requests sent and not finished",
    "least_kv": "the replica with the smallest share of its KV blocks in use, counting the prompt blocks "
                "of what was sent since the last refresh",
    "prefix_aware": "NVIDIA Dynamo's KV-aware cost: overlap_weight x the prompt tokens a replica would "
                    "prefill + the KV tokens it holds; the cheapest wins",
}
ROUTER_NAMES = tuple(ROUTERS)
ROUTER_KEYS = ("policy", "sync_interval_s", "overlap_weight")


@dataclass(frozen=True, slots=True)
class RouterSpec:
    """`router:` of a fleet: a policy of ROUTERS, how stale its view of the replicas may be, and
    prefix_aware's weight of tokens to prefill against KV held (Dynamo's default 1)."""

    policy: str = "round_robin"
    sync_interval_s: float = 0.1
    overlap_weight: float = 1.0

    def __post_init__(self) -> None:
        check_choice(self.policy, ROUTER_NAMES, "policy")
        check_float(self.sync_interval_s, "sync_interval_s", gt=0, le=3600)
        check_float(self.overlap_weight, "overlap_weight", ge=0, le=1000)
