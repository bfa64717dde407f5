"""Length distributions and arrival processes for synthetic workloads, and the request generator.

Lengths (`dist:`): fixed {value}; uniform {low, high} (integers, both inclusive, drawn exactly as
``rng.integers(low, high + 1, n)``); normal {mean, std}; lognormal {sigma and one of mean, median}
(mean or median of the lognormal itself: mu = ln(median) = ln(mean) - sigma^2/2); exponential
{mean}; zipf {a > 1, scale = 1, max}: value = scale * k with P(k) proportional to k^-a, truncated
to scale * k <= max when max is given (renormalized, not clipped); histogram {edges, weights}:
a bin [edges[i], edges[i+1]) picked by weight, then an integer uniform within it; csv {path,
column}: the column's values resampled with replacement. Every length mapping may also carry
`min` and `max`. Draws are rounded to the nearest integer (half to even) and clipped.

Arrivals (`process:`): all_at_once (every request at t = 0); poisson {rate}; gamma {rate, cv}
(gaps with mean 1/rate and coefficient of variation cv; cv = 1 draws the same numbers as poisson).
The first request arrives at t = 0 and each later one a gap after the previous.

Determinism: one ``numpy.random.default_rng(seed)`` per workload; requests are generated in
chunks of CHUNK_SIZE and, within each chunk, drawn in this order: prompt lengths, output lengths,
inter-arrival gaps. A workload of at most CHUNK_SIZE requests therefore draws its prompts first,
exactly as ``default_rng(seed)`` would; larger ones interleave the three per chunk (same numbers
for the same seed and CHUNK_SIZE, not for another chunk size).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Union

import numpy as np

from kvplan.errors import TraceError
from kvplan.fileio import text_lines
from kvplan.workload.chunks import CHUNK_SIZE, MAX_TOKENS, RequestChunk
from kvplan.workload.yaml_nodes import YamlMap, YamlNode, YamlScalar, as_float, as_int

MAX_LENGTH = MAX_TOKENS  # no request is longer than two billion tokens
MAX_COLUMN_VALUES = 10_000_000  # values of a `csv` length column (80 MB as float64)
# Arrival bounds: a rate below one request in 11.6 days or a cv outside [0.001, 1000] describes no
# serving workload, and at the extremes the gamma shape 1/cv^2 (or the gaps) stop being numbers.
MIN_RATE, MAX_RATE = 1e-6, 1e9
MIN_CV, MAX_CV = 1e-3, 1e3

LENGTH_DISTS = (
    "fixed", "uniform", "normal", "lognormal", "exponential", "zipf", "histogram", "csv",
)  # fmt: skip
ARRIVAL_PROCESSES = ("all_at_once", "poisson", "gamma")
_ZIPF_TABLE_MAX = 1 << 20  # truncated zipf by inverse CDF up to this many values, else rejection


@dataclass(frozen=True, slots=True)
class Fixed:
    value: int

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.value, dtype=np.int64)

    @property
    def mean(self) -> float:
        return float(self.value)


@dataclass(frozen=True, slots=True)
class Uniform:
    low: int
    high: int  # inclusive

    def draw(self, rng, n):
        return rng.integers(self.low, self.high + 1, n)

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2


@dataclass(frozen=True, slots=True)
class Normal:
    mu: float
    std: float

    def draw(self, rng, n):
        return rng.normal(self.mu, self.std, n)

    @property
    def mean(self) -> float:
        return self.mu


@dataclass(frozen=True, slots=True)
class LogNormal:
    mu: float  # of the underlying normal: ln(median)
    sigma: float

    def draw(self, rng, n):
        return rng.lognormal(self.mu, self.sigma, n)

    @property
    def mean(self) -> float:
        return float(np.exp(self.mu + self.sigma**2 / 2))


@dataclass(frozen=True, slots=True)
class Exponential:
    mu: float

    def draw(self, rng, n):
        return rng.exponential(self.mu, n)

    @property
    def mean(self) -> float:
        return self.mu


def _power_sum(s: float, k_max: float) -> float:
    """sum_{k=1..k_max} k^-s, exact to 10^5 terms plus an Euler-Maclaurin tail (inf: zeta(s))."""
    head = min(k_max, 100_000)
    total = float(np.sum(np.arange(1, int(head) + 1, dtype=np.float64) ** -s))
    if k_max <= head:
        return total
    if s <= 1:
        return float("inf")
    m = float(head)
    tail = m ** (1 - s) / (s - 1) - m**-s / 2 - s * m ** (-s - 1) / 12  # sum over k > m
    if np.isfinite(k_max):
        k = float(k_max)
        tail -= k ** (1 - s) / (s - 1) - k**-s / 2 - s * k ** (-s - 1) / 12
    return total + tail


@dataclass(frozen=True, slots=True)
class Zipf:
    a: float
    scale: float = 1.0
    k_max: int | None = None  # truncation: k <= k_max

    def draw(self, rng, n):
        if self.k_max is None:
            return rng.zipf(self.a, n) * self.scale
        if self.k_max <= _ZIPF_TABLE_MAX:
            cdf = np.cumsum(np.arange(1, self.k_max + 1, dtype=np.float64) ** -self.a)
            k = np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right") + 1
            return np.minimum(k, self.k_max) * self.scale
        out = rng.zipf(self.a, n)  # rejection: redraw the (rare) values above k_max
        while (bad := np.flatnonzero(out > self.k_max)).size:
            out[bad] = rng.zipf(self.a, bad.size)
        return out * self.scale

    @property
    def mean(self) -> float:
        k_max = float("inf") if self.k_max is None else self.k_max
        return self.scale * _power_sum(self.a - 1, k_max) / _power_sum(self.a, k_max)


@dataclass(frozen=True, slots=True)
class Histogram:
    edges: tuple[int, ...]
    weights: tuple[float, ...]

    def draw(self, rng, n):
        cdf = np.cumsum(self.weights)
        bins = np.minimum(np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right"),
                          len(self.weights) - 1)  # fmt: skip
        edges = np.asarray(self.edges, dtype=np.int64)
        return rng.integers(edges[bins], edges[bins + 1])

    @property
    def mean(self) -> float:
        w = np.asarray(self.weights) / sum(self.weights)
        e = np.asarray(self.edges, dtype=np.float64)
        return float(np.sum(w * (e[:-1] + e[1:] - 1) / 2))


@dataclass(frozen=True, slots=True, eq=False)
class Empirical:
    values: np.ndarray  # float64 samples from a CSV column
    source: str = ""

    def draw(self, rng, n):
        return self.values[rng.integers(0, len(self.values), n)]

    @property
    def mean(self) -> float:
        return float(self.values.mean())


LengthDist = Union[Fixed, Uniform, Normal, LogNormal, Exponential, Zipf, Histogram, Empirical]


@dataclass(frozen=True, slots=True)
class Lengths:
    """A length distribution with the bounds its draws are clipped to."""

    dist: LengthDist
    min: int
    max: int | None = None


def round_clip(values: np.ndarray, lo, hi) -> np.ndarray:
    """Round half to even and clip to [lo, hi] (scalars or arrays); int64."""
    if values.dtype.kind == "f":
        values = np.rint(values)
    return np.clip(values, lo, hi).astype(np.int64)


# ---- arrival processes ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AllAtOnce:
    def times(self, rng, n: int, start: float) -> tuple[np.ndarray, float]:
        return np.full(n, start, dtype=np.float64), start


@dataclass(frozen=True, slots=True)
class Gamma:
    """Renewal arrivals with gap mean 1/rate and gap coefficient of variation cv (1: Poisson)."""

    rate: float
    cv: float = 1.0

    def gaps(self, rng, n: int) -> np.ndarray:
        shape = 1.0 / self.cv**2  # numpy's gamma with shape 1 is its exponential: the same draws
        return rng.gamma(shape, 1.0 / (self.rate * shape), n)

    def times(self, rng, n: int, start: float) -> tuple[np.ndarray, float]:
        """n arrival times, the first at `start`; returns them and where the next chunk starts."""
        if n == 0:
            return np.empty(0), start
        cs = np.cumsum(self.gaps(rng, n))
        times = np.empty(n)
        times[0] = 0.0
        times[1:] = cs[:-1]
        return times + start, start + float(cs[-1])


def Poisson(rate: float) -> Gamma:  # noqa: N802 - reads as a process name in the schema
    return Gamma(rate, 1.0)


ArrivalProcess = Union[AllAtOnce, Gamma]


def synthetic_requests(
    num_requests: int, seed: int, prompt: Lengths, output: Lengths, arrival: ArrivalProcess,
    *, max_model_len: int, chunk_size: int = CHUNK_SIZE,
) -> Iterator[RequestChunk]:  # fmt: skip
    """Draw requests chunk by chunk (see the module docstring for the draw order).

    Prompts are clipped to [prompt.min, min(prompt.max, max_model_len - output.min)], outputs to
    [output.min, min(output.max, max_model_len - prompt)]: a prompt keeps its drawn length and the
    output is cut where the sequence would pass max_model_len, as vLLM stops generating there.
    """
    rng = np.random.default_rng(seed)
    p_hi = max_model_len - output.min
    p_hi = p_hi if prompt.max is None else min(prompt.max, p_hi)
    o_hi = max_model_len if output.max is None else min(output.max, max_model_len)
    start = 0.0
    for begin in range(0, num_requests, chunk_size):
        n = min(chunk_size, num_requests - begin)
        p = round_clip(prompt.dist.draw(rng, n), prompt.min, p_hi)
        o = round_clip(output.dist.draw(rng, n), output.min, np.minimum(o_hi, max_model_len - p))
        t, start = arrival.times(rng, n, start)
        yield RequestChunk(arrival=t, prompt_len=p, output_len=o)


# ---- reading from a workload file ------------------------------------------------------------


def _load_column(node: YamlMap, base_dir: Path) -> Empirical:
    path = node.get_input_path("path", base_dir)
    column = node.get_str("column")
    values: list[float] = []
    reader = csv.reader(text_lines(path, TraceError))
    try:
        header = next(reader, None)
        if header is None or column not in header:
            found = ", ".join(header or [])
            raise TraceError(f"no column {column!r} (columns: {found})", file=path, line=1)
        index = header.index(column)
        for row in reader:
            if not row:
                continue
            try:
                v = float(row[index])
            except (ValueError, IndexError):
                cell = row[index][:40] if index < len(row) else "nothing"
                raise TraceError(f"expected a number, got {cell!r}", file=path,
                                 line=reader.line_num, field=column) from None  # fmt: skip
            if not (v >= 0 and np.isfinite(v)):
                raise TraceError(f"expected a finite number >= 0, got {row[index][:40]}",
                                 file=path, line=reader.line_num, field=column)  # fmt: skip
            values.append(v)
            if len(values) > MAX_COLUMN_VALUES:
                raise TraceError(f"more than {MAX_COLUMN_VALUES:,} values; sample the column first",
                                 file=path, line=reader.line_num, field=column)
    except csv.Error as exc:
        raise TraceError(f"not valid CSV: {exc}", file=path, line=reader.line_num) from None
    if not values:
        raise TraceError(f"column {column!r} has no values", file=path, field=column)
    return Empirical(np.asarray(values, dtype=np.float64), str(path))


def _parse_dist(node: YamlMap, kind: str, base_dir: Path) -> LengthDist:
    if kind == "fixed":
        return Fixed(node.get_int("value", ge=0))
    if kind == "uniform":
        low = node.get_int("low", ge=0)
        return Uniform(low, node.get_int("high", ge=low))
    if kind == "normal":
        return Normal(node.get_float("mean", gt=0), node.get_float("std", ge=0))
    if kind == "lognormal":
        which = node.exactly_one("mean", "median")
        sigma = node.get_float("sigma", ge=0, le=10)
        center = float(np.log(node.get_float(which, gt=0)))
        return LogNormal(center - sigma**2 / 2 if which == "mean" else center, sigma)
    if kind == "exponential":
        return Exponential(node.get_float("mean", gt=0))
    if kind == "zipf":
        a, scale = node.get_float("a", gt=1), node.get_float("scale", 1.0, gt=0)
        top = node.get_int("max", None, ge=1)
        k_max = None if top is None else int(top // scale)
        if k_max is not None and k_max < 1:
            raise node.node("max").error(f"must be at least scale ({scale:g})")
        return Zipf(a, scale, k_max)
    if kind == "histogram":
        return _parse_histogram(node)
    return _load_column(node, base_dir)


def _parse_histogram(node: YamlMap) -> Histogram:
    edges_node, weights_node = node.get_list("edges"), node.get_list("weights")
    edges = [as_int(e, ge=0, le=MAX_LENGTH) for e in edges_node]
    for prev, e in zip(edges_node.items, edges_node.items[1:]):
        if as_int(e) <= as_int(prev):
            raise e.error("edges must be strictly increasing")
    weights = [as_float(w, ge=0) for w in weights_node]
    if len(edges) < 2 or len(weights) != len(edges) - 1:
        raise weights_node.error(
            f"needs one weight per bin: {len(edges)} edges make {max(len(edges) - 1, 0)} bins, "
            f"got {len(weights)} weights (and at least 2 edges)"
        )
    if sum(weights) <= 0:
        raise weights_node.error("weights must not all be 0")
    return Histogram(tuple(edges), tuple(weights))


_DIST_KEYS = {
    "fixed": ("value",), "uniform": ("low", "high"), "normal": ("mean", "std"),
    "lognormal": ("mean", "median", "sigma"), "exponential": ("mean",),
    "zipf": ("a", "scale"), "histogram": ("edges", "weights"), "csv": ("path", "column"),
}  # fmt: skip


def _as_mapping(node: YamlNode, key: str, kinds: tuple[str, ...], keys: dict) -> YamlMap:
    """`node` as a mapping; a bare number or kind name is refused with the mapping it meant."""
    if isinstance(node, YamlMap):
        return node
    value = node.value if isinstance(node, YamlScalar) else None
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    if numeric and (key == "process" or float(value).is_integer()):
        example = ("{dist: fixed, value: %s}" % node.text if key == "dist" else
                   "{process: poisson, rate: %s}" % node.text)
    elif isinstance(value, str) and value.strip() in kinds:
        kind = value.strip()
        example = "{" + ", ".join([f"{key}: {kind}", *(f"{k}: ..." for k in keys[kind])]) + "}"
    else:
        example = ("{dist: fixed, value: 1000}" if key == "dist" else "{process: poisson, rate: 5}")
    raise node.error(f"expected a mapping such as {example}, got {node.describe()}")


def parse_lengths(node: YamlNode, base_dir: Path, *, default_min: int) -> Lengths:
    """A `{dist: ..., <params>, min, max}` mapping; min defaults to `default_min`."""
    node = _as_mapping(node, "dist", LENGTH_DISTS, _DIST_KEYS)
    kind = node.get_choice("dist", LENGTH_DISTS)
    node.expect_keys("dist", "min", "max", *_DIST_KEYS[kind])
    lo = node.get_int("min", default_min, ge=default_min)
    hi = node.get_int("max", None, ge=lo)
    dist = _parse_dist(node, kind, base_dir)
    if isinstance(dist, Fixed) and (dist.value < lo or (hi is not None and dist.value > hi)):
        top = "no limit" if hi is None else hi
        raise node.node("value").error(f"{dist.value} lies outside the bounds [{lo}, {top}]")
    return Lengths(dist, lo, hi)


_ARRIVAL_KEYS = {"all_at_once": (), "poisson": ("rate",), "gamma": ("rate", "cv")}


def parse_arrival(node: YamlNode) -> ArrivalProcess:
    """A `{process: all_at_once | poisson {rate} | gamma {rate, cv}}` mapping."""
    node = _as_mapping(node, "process", ARRIVAL_PROCESSES, _ARRIVAL_KEYS)
    kind = node.get_choice("process", ARRIVAL_PROCESSES)
    node.expect_keys("process", *_ARRIVAL_KEYS[kind])
    if kind == "all_at_once":
        return AllAtOnce()
    rate = node.get_float("rate", ge=MIN_RATE, le=MAX_RATE)
    return Gamma(rate, node.get_float("cv", ge=MIN_CV, le=MAX_CV) if kind == "gamma" else 1.0)
