"""A `WorkloadSpec` written as the workload file that reads back to it (`kvplan simulate
--show-workload` prints the one a flag-only run made).

Written: the top-level keys, the pool, synthetic requests of fixed or uniform lengths with any
arrival process, or a trace, the allocators, and the scheduler and timing keys that differ from
their defaults. A spec with more (a fleet, other length distributions, prefix or sampling
sections) is refused with ValueError: those come from a file, which is their own writing.
"""

from __future__ import annotations

import json
from dataclasses import fields

from kvplan.workload.distributions import AllAtOnce, Fixed, Gamma, Lengths, Uniform
from kvplan.workload.spec import SchedulerSpec, SyntheticRequests, TimingSpec, WorkloadSpec
from kvplan.workload.traces.columns import COLUMN_KEYS


def _scalar(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _flow(pairs) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in pairs) + "}"


def _lengths(lengths: Lengths, default_min: int) -> str:
    d = lengths.dist
    if isinstance(d, Fixed):
        pairs = [("dist", "fixed"), ("value", d.value)]
    elif isinstance(d, Uniform):
        pairs = [("dist", "uniform"), ("low", d.low), ("high", d.high)]
    else:
        raise ValueError(f"a {type(d).__name__} length distribution is not written back")
    if lengths.min != default_min:
        pairs.append(("min", lengths.min))
    if lengths.max is not None:
        pairs.append(("max", lengths.max))
    return _flow(pairs)


def _arrival(arrival) -> str:
    if isinstance(arrival, AllAtOnce):
        return "{process: all_at_once}"
    if isinstance(arrival, Gamma) and arrival.cv == 1.0:
        return _flow([("process", "poisson"), ("rate", _scalar(float(arrival.rate)))])
    if isinstance(arrival, Gamma):
        return _flow([("process", "gamma"), ("rate", _scalar(float(arrival.rate))), ("cv", _scalar(float(arrival.cv)))])
    raise ValueError(f"an arrival process {arrival!r} is not written back")


def _changed(record, default) -> list[tuple[str, str]]:
    return [(f.name, _scalar(getattr(record, f.name))) for f in fields(record)
            if getattr(record, f.name) != getattr(default, f.name)]


def spec_yaml(spec: WorkloadSpec) -> str:
    """The YAML text of `spec` (see the module docstring for what can be written)."""
    if spec.fleet is not None or spec.prefix is not None or spec.sampling is not None:
        raise ValueError("a fleet or a prefix/sampling section is not written back")
    lines = [f"name: {_scalar(spec.name)}", f"experiment: {spec.experiment}", f"seed: {spec.seed}"]
    if spec.model is not None:
        lines.append(f"model: {_scalar(spec.model)}")
    if spec.gpu is not None:
        lines.append(f"gpu: {_scalar(spec.gpu)}")
    lines += [f"tp: {spec.tp}", f"kv_dtype: {spec.kv_dtype}"]
    key = spec.pool.key
    pool = [(key, _scalar(getattr(spec.pool, key)))] + ([("engine", spec.pool.engine)] if spec.pool.engine != "vllm" else [])
    lines.append(f"pool: {_flow(pool)}")
    r = spec.requests
    lines.append("requests:")
    if isinstance(r, SyntheticRequests):
        lines += [f"  count: {r.count}", f"  prompt: {_lengths(r.prompt, 1)}", f"  output: {_lengths(r.output, 0)}",
                  f"  arrival: {_arrival(r.arrival)}"]
    else:
        pairs = [("format", r.format), ("path", _scalar(str(r.path)))]
        pairs += [(k, _scalar(getattr(r, k))) for k in ("limit", "time_scale") if getattr(r, k) is not None]
        pairs += [(k, _scalar(getattr(r, k))) for k, default in (("repeat", 1), ("too_long", "error"),
                                                                 ("history", False)) if getattr(r, k) != default]
        if r.columns is not None:
            names = [(k, _scalar(v)) for k, v in zip(COLUMN_KEYS, r.columns.names())]
            pairs += [("columns", _flow(names)), ("timestamp_unit", r.columns.unit)]
        lines.append(f"  trace: {_flow(pairs)}")
        if r.arrival is not None:
            lines.append(f"  arrival: {_arrival(r.arrival)}")
    lines.append("allocators:")
    for a in spec.allocators:
        if a.kind == "paged":
            pairs = [("kind", "paged"), ("block_size", a.block_size)]
            if a.hybrid is not None:
                pairs.append(("hybrid", _scalar(a.hybrid)))
        else:
            pairs = [("kind", "contiguous"), ("policy", a.policy)]
            if a.max_len is not None:
                pairs.append(("max_len", a.max_len))
        lines.append(f"  - {_flow(pairs)}")
    changed = _changed(spec.scheduler, SchedulerSpec())
    if changed:
        lines.append(f"scheduler: {_flow(changed)}")
    changed = [(k, _scalar(str(v)) if k == "profile" else v) for k, v in
               ((f.name, getattr(spec.timing, f.name)) for f in fields(TimingSpec))
               if v != getattr(TimingSpec(), k)]
    if changed:
        lines.append(f"timing: {_flow((k, v if isinstance(v, str) else _scalar(v)) for k, v in changed)}")
    if spec.slo is not None:
        lines.append(f"slo: {_flow((k, _scalar(v)) for k, v in spec.slo.to_dict().items() if v is not None)}")
    if spec.engine != "vllm":
        lines.append(f"engine: {spec.engine}")
    if spec.sglang is not None:
        from kvplan.workload.spec import SglangSpec

        changed = _changed(spec.sglang, SglangSpec())
        if changed:
            lines.append(f"sglang: {_flow(changed)}")
    if spec.offload is not None:
        o = spec.offload
        lines.append(f"offload: {_flow([('kv_offloading_size', o.kv_offloading_size), ('gb_per_s', _scalar(o.gb_per_s))])}")
    if spec.speculative is not None:
        sp = spec.speculative
        pairs = [("method", sp.method)]
        if sp.num_speculative_tokens is not None:
            pairs.append(("num_speculative_tokens", sp.num_speculative_tokens))
        if sp.acceptance is not None:
            pairs.append(("acceptance", "[" + ", ".join(_scalar(float(x)) for x in sp.acceptance) + "]"))
        lines.append(f"speculative: {_flow(pairs)}")
    if spec.parallel is not None:
        from kvplan.workload.spec import ParallelSpec

        changed = _changed(spec.parallel, ParallelSpec())
        lines.append(f"parallel: {_flow(changed)}" if changed else "parallel: {}")
    return "\n".join(lines) + "\n"
