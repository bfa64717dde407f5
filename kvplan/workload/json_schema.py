"""A JSON Schema (draft 2020-12) of the workload file, for editors to complete and check it.

Built from the same key lists the reader checks (kvplan/workload/schema.py, distributions.py,
traces/), so a key the reader accepts is a key the schema knows; the reader remains the judge of
values (ranges, files, cross-field rules). `kvplan schema` prints it; workloads/SCHEMA.md is the
prose version.
"""

from __future__ import annotations

from kvplan.model.dtypes import KV_DTYPE_CHOICES
from kvplan.workload import distributions as D
from kvplan.workload import schema as S
from kvplan.workload.spec import MAX_LINK_GB_PER_S, MAX_LINK_LATENCY_S, MAX_SLO_S, MIN_OFFLOAD_GB_PER_S, SLO_KEYS
from kvplan.workload.routing import LLM_D_INDEXES, PREFIX_SCORES, ROUTER_KEYS, ROUTER_NAMES
from kvplan.workload.traces import TRACE_FORMATS
from kvplan.workload.traces.columns import COLUMN_KEYS, MAX_COLUMN_NAME, TIMESTAMP_UNITS

SIZE = {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "string", "pattern": r"^\s*[0-9.eE+-]+\s*[A-Za-z]*\s*$"}],
        "description": "bytes, or a size with its unit: 12GiB, 40GB"}
POSITIVE = {"type": "number", "exclusiveMinimum": 0}
COUNT = {"type": "integer", "minimum": 1}
WEIGHT = {"type": "number", "minimum": 0, "maximum": 1000}


def _closed(properties: dict, required: tuple = (), description: str = "") -> dict:
    out = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        out["required"] = list(required)
    if description:
        out["description"] = description
    return out


def _lengths() -> dict:
    params = {"value": {"type": "integer", "minimum": 0}, "low": {"type": "integer", "minimum": 0},
              "high": {"type": "integer", "minimum": 0}, "mean": POSITIVE, "std": POSITIVE,
              "median": POSITIVE, "sigma": POSITIVE, "a": {"type": "number", "exclusiveMinimum": 1}, "scale": POSITIVE,
              "edges": {"type": "array", "items": {"type": "integer", "minimum": 0}},
              "weights": {"type": "array", "items": {"type": "number", "minimum": 0}},
              "path": {"type": "string"}, "column": {"type": "string"}}
    variants = []
    for kind in D.LENGTH_DISTS:
        keys = D._DIST_KEYS[kind]
        props = {"dist": {"const": kind}, "min": {"type": "integer", "minimum": 0}, "max": COUNT,
                 **{k: params[k] for k in keys}}
        variants.append(_closed(props, ("dist",)))
    return {"oneOf": variants, "description": "a length distribution: {dist: ..., parameters, min, max}"}


def _arrival() -> dict:
    rate = {"type": "number", "minimum": 1e-6, "maximum": 1e9}
    params = {"rate": rate, "cv": {"type": "number", "minimum": 1e-3, "maximum": 1e3}}
    return {"oneOf": [_closed({"process": {"const": kind}, **{k: params[k] for k in D._ARRIVAL_KEYS[kind]}},
                              ("process", *D._ARRIVAL_KEYS[kind])) for kind in D.ARRIVAL_PROCESSES]}


def _requests() -> dict:
    synthetic = _closed({"count": COUNT, "prompt": _lengths(), "output": _lengths(), "arrival": _arrival()},
                        ("count", "prompt", "output"))
    common = {"path": {"type": "string"}, "limit": COUNT, "time_scale": POSITIVE, "repeat": COUNT,
              "too_long": {"enum": ["error", "clip"]}}
    only = {"history": {"type": "boolean"},  # the keys of some formats (schema.FORMAT_TRACE_KEYS)
            "columns": _closed({k: {"type": "string", "minLength": 1, "maxLength": MAX_COLUMN_NAME}
                                for k in COLUMN_KEYS}, ()),
            "timestamp_unit": {"enum": list(TIMESTAMP_UNITS)}}
    assert set(common) | set(only) | {"format"} == set(S.TRACE_KEYS) and set(only) == set(S.FORMAT_TRACE_KEYS)
    special = sorted({f for formats in S.FORMAT_TRACE_KEYS.values() for f in formats})
    variants = [_closed({"format": {"const": fmt}, **common,
                         **{k: only[k] for k, formats in S.FORMAT_TRACE_KEYS.items() if fmt in formats}},
                        ("format", "path")) for fmt in special]
    rest = [f for f in TRACE_FORMATS if f not in special]
    variants.append(_closed({"format": {"enum": rest}, **common}, ("format", "path")))
    trace = _closed({"trace": {"oneOf": variants}, "arrival": _arrival()}, ("trace",))
    return {"oneOf": [synthetic, trace]}


def _prefix() -> dict:
    count = {"type": "integer", "minimum": 0}
    props = {"system_prompts": count, "system_prompt_len": {"anyOf": [COUNT, {"type": "array", "items": COUNT}]},
             "popularity": {"enum": list(S.POPULARITY)}, "zipf_a": POSITIVE, "turns": COUNT, "sessions": COUNT,
             "hash_block_size": COUNT, "max_prompt_len": COUNT,
             "max_running": COUNT, "hold_output": {"type": "boolean"}}  # the last two: experiment prefix only
    assert set(props) == {*S.PREFIX_KEYS, *S.REPLAY_KEYS}
    return _closed(props, (), "shared prompt prefixes and, with experiment prefix, the replay's options")


def _sampling() -> dict:
    props = {"mode": {"enum": [*S.SAMPLING_MODES, "both"]},
             "widths": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 1, "maximum": 64}},
             "parent": {"enum": list(S.BEAM_PARENTS)}}
    assert set(props) == set(S.SAMPLING_KEYS)
    return _closed(props, (), "experiment sharing: parallel sampling and beam search groups")


def workload_schema() -> dict:
    """The schema as a plain dict (JSON-serialisable)."""
    pool = {"oneOf": [_closed({"slots": COUNT}, ("slots",)), _closed({"kv_memory": SIZE}, ("kv_memory",)),
                      _closed({"gpu_memory_utilization": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                               "engine": {"enum": ["vllm", "none"]}},
                              ("gpu_memory_utilization",)),
                      _closed({"mem_fraction_static": {"anyOf": [
                          {"type": "number", "exclusiveMinimum": 0, "maximum": 1}, {"const": "default"}],
                          "description": "engine: sglang: SGLang's start-up pool (default: SGLang's fraction "
                                         "for the GPU and TP)"}}, ("mem_fraction_static",))]}
    allocator = {"oneOf": [
        _closed({"kind": {"const": "contiguous"}, "policy": {"enum": ["max", "pow2", "oracle"]}, "max_len": COUNT},
                ("kind",)),
        _closed({"kind": {"const": "paged"},
                 "block_size": {"anyOf": [COUNT, {"type": "array", "items": COUNT, "minItems": 1}]},
                 "hybrid": {"type": "boolean"}}, ("kind",)),
    ]}
    scheduler_props = {"max_num_seqs": COUNT, "max_num_batched_tokens": COUNT, "max_model_len": COUNT,
                       "chunked_prefill": {"type": "boolean"}, "preemption": {"enum": ["recompute", "swap"]},
                       "swap_space": SIZE, "swap_slots": {"type": "integer", "minimum": 0},
                       "null_block": {"type": "boolean"},
                       "prefix_caching": {"type": "boolean"},
                       "hybrid_kv_cache_manager": {"type": "boolean"},
                       "allow_long_max_model_len": {"type": "boolean"}}
    timing_props = {"model": {"enum": ["physical", "roofline"]},
                    "bandwidth_efficiency": {"type": "number", "minimum": 0.01, "maximum": 1},
                    "flops_efficiency": {"type": "number", "minimum": 0.01, "maximum": 1},
                    "step_overhead_ms": {"type": "number", "minimum": 0, "maximum": 1e6},
                    "profile": {"type": "string", "description": "a timing profile file (kvplan calibrate)"}}
    assert set(scheduler_props) == set(S.SCHEDULER_KEYS) and set(timing_props) == set(S.TIMING_KEYS)
    top = {
        "name": {"type": "string"}, "seed": {"type": "integer", "minimum": 0},
        "experiment": {"enum": list(S.EXPERIMENTS)},
        "model": {"type": "string", "description": "any `kvplan size` model argument"},
        "kv_dtype": {"enum": list(KV_DTYPE_CHOICES)}, "tp": {"type": "integer", "minimum": 1, "maximum": 4096},
        "gpu": {"type": "string", "description": "a GPU of the catalog (kvplan gpus)"},
        "pool": pool, "requests": _requests(),
        "allocators": {"type": "array", "items": allocator, "minItems": 1},
        "scheduler": _closed(scheduler_props), "timing": _closed(timing_props),
        "prefix": _prefix(), "sampling": _sampling(),
        "replicas": {"type": "array", "minItems": 1, "description": "experiment fleet: replica groups",
                     "items": _closed({"name": {"type": "string"}, "count": {"type": "integer", "minimum": 1},
                                       "role": {"enum": list(S.ROLES)},
                                       "model": {"type": "string"}, "gpu": {"type": "string"},
                                       "tp": {"type": "integer", "minimum": 1}, "kv_dtype": {"enum": list(KV_DTYPE_CHOICES)},
                                       "pool": pool, "scheduler": _closed(scheduler_props),
                                       "allocators": {"type": "array", "items": allocator, "minItems": 1},
                                       "timing": _closed(timing_props)}, ())},
        "transfer": _closed({"gb_per_s": {"type": "number", "minimum": 0, "maximum": MAX_LINK_GB_PER_S},
                             "latency_s": {"type": "number", "minimum": 0, "maximum": MAX_LINK_LATENCY_S},
                             "proxy_s": {"type": "number", "minimum": 0, "maximum": MAX_LINK_LATENCY_S}},
                            ("gb_per_s",), "experiment fleet, disaggregated: the link the KV moves over"),
        "router": {"description": "experiment fleet: the router (kvplan/fleet/routers.py)", "anyOf": [
            {"enum": list(ROUTER_NAMES)},
            _closed({"policy": {"enum": list(ROUTER_NAMES)},
                     "sync_interval_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 3600},
                     "gateway_s": {"type": "number", "minimum": 0, "maximum": 60},
                     "overlap_weight": WEIGHT, "index": {"enum": list(LLM_D_INDEXES)},
                     "prefix_weight": WEIGHT, "kv_cache_weight": WEIGHT, "queue_weight": WEIGHT,
                     "active_request_weight": WEIGHT, "prefix_score": {"enum": list(PREFIX_SCORES)},
                     "max_prefix_tokens": {"type": "integer", "minimum": 1},
                     "lru_capacity_blocks": {"type": "integer", "minimum": 1, "maximum": 2**31},
                     "cache_threshold": {"type": "number", "minimum": 0, "maximum": 1},
                     "balance_abs_threshold": {"type": "integer", "minimum": 0},
                     "balance_rel_threshold": {"type": "number", "minimum": 1, "maximum": 1000}}, ())]},
        "slo": {**_closed({k: {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_SLO_S} for k in SLO_KEYS}, (),
                          "experiments serve and fleet: the per-request limits goodput counts against"),
                "minProperties": 1},
        "offload": _closed({"kv_offloading_size": SIZE,
                            "gb_per_s": {"type": "number", "minimum": MIN_OFFLOAD_GB_PER_S, "maximum": MAX_LINK_GB_PER_S}},
                           ("kv_offloading_size", "gb_per_s"),
                           "experiments serve and fleet: vLLM's CPU KV offload tier per replica (--kv-offloading-size) "
                           "and each GPU's host-to-device bandwidth"),
        "speculative": _closed({"method": {"enum": ["eagle", "eagle3", "mtp", "ngram"]},
                                "num_speculative_tokens": {"type": "integer", "minimum": 1, "maximum": 32},
                                "acceptance": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 1},
                                               "minItems": 1, "maxItems": 32}},
                               ("method",),
                               "experiment serve: speculative decoding as vLLM's --speculative-config runs it, "
                               "with the acceptance rate of each draft position"),
        "engine": {"enum": list(S.ENGINES), "description": "experiments serve and fleet: whose scheduler runs the "
                                                          "requests (kvplan/sim/sglang.py for sglang)"},
        "sglang": _closed({"schedule_policy": {"enum": list(S.SCHEDULE_POLICIES)},
                           "schedule_conservativeness": {"type": "number", "exclusiveMinimum": 0, "maximum": 100},
                           "chunked_prefill_size": {"type": "integer", "minimum": -1, "not": {"const": 0}},
                           "max_prefill_tokens": COUNT,
                           "max_running_requests": {"type": "integer", "minimum": 1, "maximum": 2**20},
                           "disable_radix_cache": {"type": "boolean"}}, (),
                          "engine: sglang: SGLang's scheduler flags (server_args.py names)"),
        "parallel": _closed({"dp": {"type": "integer", "minimum": 1, "maximum": 1024},
                             "pp": {"const": 1},
                             "enable_expert_parallel": {"type": "boolean"},
                             "all2all_backend": {"enum": ["allgather_reducescatter", "deepep_high_throughput",
                                                          "deepep_low_latency"]},
                             "expert_imbalance": {"type": "number", "minimum": 1, "maximum": 8},
                             "network_gbps": {"type": "number", "minimum": 1, "maximum": 10000}}, (),
                            "experiment serve: vLLM's data parallel ranks (and expert parallelism) of a MoE "
                            "model, stepping in lockstep (kvplan/sim/data_parallel.py)"),
    }
    assert set(top) == set(S.TOP_KEYS)
    assert set(top["sglang"]["properties"]) == set(S.SGLANG_KEYS)
    assert set(top["parallel"]["properties"]) == set(S.PARALLEL_KEYS)
    assert set(top["router"]["anyOf"][1]["properties"]) == set(ROUTER_KEYS)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://kvplan.dev/schema/workload.json", "title": "kvplan workload file",
            **_closed(top, ("pool", "requests"))}
