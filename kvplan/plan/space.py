"""What `kvplan plan` searches: the traffic (from flags or a workload file), the configurations,
and the serve workload of one configuration for that traffic."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from kvplan.errors import KvplanError, UsageError

if TYPE_CHECKING:
    from kvplan.workload.spec import SpeculativeSpec


@dataclass(frozen=True, slots=True)
class Traffic:
    """What arrives. From flags: fixed prompt and output lengths, `count` requests, Poisson at `rate`/s.
    From a workload file (`workload`, its path): its requests (distributions, arrivals or a trace,
    prefixes), the first `count` of them, their arrivals scaled from the file's own mean rate
    (`base_rate`) to each rate tried; `output` is then their mean output and `prompt` their mean
    prompt (for the report), `max_model_len` the longest prompt + output among them."""

    rate: float | None  # None: as much as the budget serves (--gpus or --budget without --rate)
    prompt: float
    output: float
    count: int = 10_000
    workload: str | None = None
    base_rate: float = 1.0
    max_model_len: int | None = None
    timing_profile: str | None = None  # a kvplan calibrate profile's path (absolute), else the shipped constants
    seed: int | None = None  # the sample the search decides on (None: seed 0, or the workload file's own)
    speculative: "SpeculativeSpec | None" = None  # speculative decoding on every replica (--speculative)
    network_gbps: float | None = None  # with DP/EP configurations: each GPU's network, Gb/s (None: the GPU's)
    all2all_backend: str | None = None  # with DP/EP configurations: vLLM's --all2all-backend (None: its default)


WEIGHT_QUANTIZATIONS = ("none", "fp8", "awq", "gptq-int4", "gptq-int8")  # kvplan/model/resolve.QUANT_SUFFIXES
PLAN_ENGINES = ("vllm", "sglang")  # the serving engines `plan --engine` compares


@dataclass(frozen=True, slots=True, order=True)
class Config:
    gpu: str
    tp: int = 1
    kv_dtype: str = "auto"
    max_num_seqs: int | None = None  # None: vllm serve's default for the GPU
    block_size: int = 16
    prefix_caching: bool = True  # vLLM V1's default
    quantization: str = "none"  # the weights: the checkpoint's, or a re-upload's (WEIGHT_QUANTIZATIONS)
    max_num_batched_tokens: int | None = None  # None: vllm serve's default for the GPU
    engine: str = "vllm"  # PLAN_ENGINES. "sglang": SGLang's scheduler on the pool SGLang starts with (its
    #   default mem_fraction_static for the GPU and TP); max_num_seqs and max_num_batched_tokens are then
    #   its max_running_requests and chunked_prefill_size (None: SGLang's own), prefix_caching its radix
    #   cache, block_size unused (pages of one token)
    dp: int = 1  # vLLM's --data-parallel-size: a replica is dp engines of tp GPUs each, in lockstep (MoE)
    expert_parallel: bool = False  # vLLM's --enable-expert-parallel: whole experts on each of tp x dp GPUs

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.dp

    @property
    def rent_unit(self) -> tuple[int, int]:
        """(GPUs that must share an instance, such units per replica): a replica of tp x dp GPUs in
        one instance up to a node (NODE_GPUS: its all-to-all then stays on NVLink, as
        kvplan/model/parallel_step.py prices it), else whole nodes (the all-to-all over the network)."""
        from kvplan.model.parallel import NODE_GPUS

        g = self.gpus_per_replica
        return (g, 1) if g <= NODE_GPUS or self.tp > NODE_GPUS else (NODE_GPUS, -(-g // NODE_GPUS))

    def rent(self, book, replicas: int):
        """The cheapest rental of `replicas` of this configuration (kvplan/plan/prices.py; None: none)."""
        unit, per = self.rent_unit
        return book.rent(self.gpu, unit, replicas * per)

    @property
    def label(self) -> str:
        """GPU x TP, then what differs from the engine's defaults: the weights, the KV dtype, the
        running cap and the prefill budget (vLLM's names: seqs, mbt, the block size; SGLang's:
        running, chunk), the prefix cache off."""
        sglang = self.engine == "sglang"
        weights = "" if self.quantization == "none" else f" w-{self.quantization}"
        kv = f" kv {self.kv_dtype}" if self.kv_dtype != "auto" else ""
        seqs = f" {'running' if sglang else 'seqs'} {self.max_num_seqs}" if self.max_num_seqs else ""
        batched = (f" {'chunk' if sglang else 'mbt'} {self.max_num_batched_tokens}"
                   if self.max_num_batched_tokens else "")
        block = f" B{self.block_size}" if self.block_size != 16 and not sglang else ""
        cache = "" if self.prefix_caching else " no-cache"
        par = (f" dp{self.dp}" if self.dp > 1 else "") + (" ep" if self.expert_parallel else "")
        return f"{self.gpu} x{self.tp}{par}{' sglang' if sglang else ''}{weights}{kv}{seqs}{batched}{block}{cache}"

    def model_id(self, model: str) -> str:
        """The model served: `model`, or its re-upload quantized as `quantization` ("-FP8", "-AWQ",
        "-GPTQ-Int4": the suffixes kvplan's resolver reads as such re-uploads' quantization)."""
        return model if self.quantization == "none" else f"{model}-{self.quantization}"

    @property
    def group(self) -> tuple:
        """Configurations of one group differ only in max_num_seqs (see _Runs)."""
        return (self.gpu, self.tp, self.kv_dtype, self.block_size, self.prefix_caching, self.quantization,
                self.max_num_batched_tokens or 0, self.engine, self.dp, self.expert_parallel)

    @property
    def parallel(self) -> bool:
        """Data or expert parallelism: each replica a lockstep run of its DP ranks (kvplan/sim/data_parallel.py)."""
        return self.dp > 1 or self.expert_parallel


def from_workload(path: Path, rate: float | None, count: int | None) -> Traffic:
    """The traffic of a workload file's requests: the first `count` of them (all by default), at
    `rate` (default: the file's own, requests over the span of their arrivals); their lengths (the
    mean prompt, the longest request: each configuration's max_model_len) with the shared prefixes
    of its `prefix:` section, as the engine serves them."""
    from kvplan.experiments import load
    from kvplan.workload.prefixes import request_stream

    try:
        wl = load(path)
    except KvplanError as exc:
        raise exc.located(file=str(path)) from None
    n = wl.num_requests if count is None else min(count, wl.num_requests)
    prompt = output = longest = 0
    start = end = None
    seen = 0
    for c in first(request_stream(wl), n):  # the prompts as served: with the prefix section's shared starts
        if len(c) == 0:
            continue
        seen += len(c)
        prompt += int(c.prompt_len.sum())
        output += int(c.output_len.sum())
        longest = max(longest, int((c.prompt_len + c.output_len).max()))
        start = float(c.arrival[0]) if start is None else start
        end = float(c.arrival[-1])
    if seen < 10:
        raise UsageError(f"{path}: expected at least 10 requests, got {seen}", field="--workload")
    span = (end or 0.0) - (start or 0.0)
    if not span > 0:
        raise UsageError(f"{path}: its requests all arrive at once; plan needs arrivals spread in time "
                         "(a rate, or a trace's timestamps) to scale", field="--workload")
    base = (seen - 1) / span
    return Traffic(rate if rate is not None else base, prompt / seen, output / seen, seen, str(path), base,
                   longest)


@lru_cache(maxsize=8)
def _traffic_workload(path: str, seed: int | None):
    from kvplan.experiments import load

    return load(path, seed)


def config_workload(model: str, traffic: Traffic, config: Config, seed: int | None = None):
    """The serve workload of one configuration at rate 1 (arrivals are scaled per run); `seed`: a
    fresh sample of the traffic (default: the traffic's own, `Traffic.seed`)."""
    seed = traffic.seed if seed is None else seed
    from kvplan.experiments import build_flags, flag_workload

    spec = flag_workload(config.model_id(model), config.gpu, config.tp, 1.0, str(max(1, round(traffic.prompt))),
                         str(max(1, round(traffic.output))), traffic.count, kv_dtype=config.kv_dtype,
                         max_num_seqs=config.max_num_seqs, block_size=config.block_size,
                         prefix_caching=config.prefix_caching, max_model_len=traffic.max_model_len,
                         timing_profile=traffic.timing_profile, seed=seed or 0,
                         max_num_batched_tokens=config.max_num_batched_tokens, engine=config.engine)
    if traffic.speculative is not None:
        spec = replace(spec, speculative=traffic.speculative)
    if config.parallel:
        from kvplan.workload.spec import ParallelSpec

        asked = {"all2all_backend": traffic.all2all_backend} if traffic.all2all_backend else {}
        spec = replace(spec, parallel=ParallelSpec(dp=config.dp, enable_expert_parallel=config.expert_parallel,
                                                   network_gbps=traffic.network_gbps, **asked))
    wl = build_flags(spec)
    if traffic.workload is None:
        return wl
    source = _traffic_workload(traffic.workload, seed)
    count = traffic.count
    make = lambda: first(source.make_requests(), count)  # noqa: E731
    return replace(wl, make_requests=make, num_requests=min(count, source.num_requests), seed=source.seed,
                   prefix=source.prefix, sampling=source.sampling)


def first(chunks, n: int):
    """The first `n` requests of a stream of chunks."""
    left = n
    for c in chunks:
        if left <= 0:
            return
        yield c if len(c) <= left else c.take(slice(0, left))
        left -= len(c)


