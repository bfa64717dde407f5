"""Length distributions, arrival processes and the chunked synthetic request generator.

Mean checks use N = 200,000 draws and allow 5 standard errors (from the distribution's own
variance plus 1/12 for rounding to integers) plus 0.05 tokens for the rounding bias, which for
these smooth distributions is far smaller. The seeds are fixed, so the tests are deterministic;
the tolerance says how far a correct sampler could land, not a flaky threshold.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvplan.errors import WorkloadError
from kvplan.workload import distributions as d
from kvplan.workload.yaml_nodes import load_yaml_text

N = 200_000


def draw(dist, seed=1, n=N, lo=0, hi=10**9):
    return d.round_clip(dist.draw(np.random.default_rng(seed), n), lo, hi)


def assert_mean(values, mean, var):
    se = math.sqrt((var + 1 / 12) / len(values))
    assert abs(values.mean() - mean) <= 5 * se + 0.05, (values.mean(), mean, se)


def test_uniform_is_inclusive_and_drawn_like_numpy_integers():
    """The lesson's prompts: uniform 100..2000 must equal rng.integers(100, 2001, n) bit for bit."""
    got = d.Uniform(100, 2000).draw(np.random.default_rng(0), 500)
    assert np.array_equal(got, np.random.default_rng(0).integers(100, 2001, 500))
    small = draw(d.Uniform(3, 5), n=10_000)
    assert set(small.tolist()) == {3, 4, 5}


@pytest.mark.parametrize(
    ("dist", "var"),
    [
        (d.Fixed(700), 0.0),
        (d.Uniform(100, 2000), ((2000 - 100 + 1) ** 2 - 1) / 12),
        (d.Normal(1000.0, 200.0), 200.0**2),
        (d.Exponential(300.0), 300.0**2),
        (d.LogNormal(math.log(500), 0.5), (math.exp(0.25) - 1) * math.exp(2 * math.log(500) + 0.25)),
    ],
)
def test_sample_mean_matches_stated_mean(dist, var):
    """A sampler with the wrong parameterization (e.g. scale vs rate) lands many SEs off."""
    assert_mean(draw(dist), dist.mean, var)


def test_lognormal_mean_and_median_parameterizations():
    """`mean:` is the mean of the lognormal itself and `median:` its median."""
    doc = load_yaml_text("a: {dist: lognormal, mean: 800, sigma: 0.6}\n"
                         "b: {dist: lognormal, median: 800, sigma: 0.6}\n")  # fmt: skip
    by_mean = d.parse_lengths(doc.get_map("a"), None, default_min=1)
    by_median = d.parse_lengths(doc.get_map("b"), None, default_min=1)
    assert by_mean.dist.mean == pytest.approx(800)
    assert np.median(draw(by_median.dist)) == pytest.approx(800, rel=0.01)


def test_truncated_zipf_matches_its_exact_pmf():
    """Truncation renormalizes (not clips): no pile-up at max, and the mean is the exact one."""
    a, scale, k_max = 1.5, 10.0, 200
    k = np.arange(1, k_max + 1, dtype=float)
    p = k**-a / np.sum(k**-a)
    mean, var = scale * np.sum(p * k), scale**2 * (np.sum(p * k * k) - np.sum(p * k) ** 2)
    dist = d.Zipf(a, scale, k_max)
    assert dist.mean == pytest.approx(mean, rel=1e-9)
    values = draw(dist)
    assert values.max() <= scale * k_max and values.min() == scale
    assert_mean(values, mean, var)
    assert (values == scale * k_max).mean() < 3 * p[-1]


def test_zipf_means_and_large_truncation():
    """The closed-form mean equals zeta(a-1)/zeta(a); huge k_max uses rejection within bounds."""
    zeta2, zeta3 = math.pi**2 / 6, 1.2020569031595942
    assert d.Zipf(3.0).mean == pytest.approx(zeta2 / zeta3, rel=1e-6)
    assert math.isinf(d.Zipf(1.5).mean)
    big = d.Zipf(1.1, 1.0, 3_000_000)
    assert draw(big, n=20_000).max() <= 3_000_000


def test_histogram_mean_and_bins():
    """Bins are half-open [lo, hi) picked by weight; an off-by-one in the edges moves the mean."""
    dist = d.Histogram((0, 100, 1000), (1.0, 3.0))
    values = draw(dist)
    p = np.array([0.25, 0.75])
    lo, hi = np.array([0, 100]), np.array([100, 1000])
    mean = np.sum(p * (lo + hi - 1) / 2)
    second = np.sum(p * ((hi - lo) ** 2 - 1) / 12 + p * ((lo + hi - 1) / 2) ** 2)
    assert dist.mean == pytest.approx(mean)
    assert_mean(values, mean, second - mean**2)
    assert values.max() == 999 and values.min() == 0


def test_csv_column_resampled(tmp_path):
    """A csv distribution resamples exactly the column's values, path relative to the workload."""
    (tmp_path / "lens.csv").write_text("id,tokens\n1,10\n2,20\n3,60\n")
    doc = load_yaml_text("p: {dist: csv, path: lens.csv, column: tokens}\n")
    lengths = d.parse_lengths(doc.get_map("p"), tmp_path, default_min=1)
    values = draw(lengths.dist)
    assert set(values.tolist()) == {10, 20, 60}
    assert_mean(values, 30.0, np.var([10, 20, 60]))


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("p: {dist: uniform, low: 10, high: 5}", 1, "expected an integer >= 10, got 5"),
        ("p: {dist: zipf, a: 1}", 1, "expected a number > 1, got 1"),
        ("p:\n  dist: lognormal\n  mean: 5\n  median: 5\n  sigma: 1", 4, "give only one of"),
        ("p: {dist: histogram, edges: [0, 10], weights: [1, 2]}", 1, "one weight per bin"),
        ("p: {dist: histogram, edges: [0, 10, 5], weights: [1, 2]}", 1, "strictly increasing"),
        ("p: {dist: exponential, mean: .inf}", 1, "not a finite number"),
        ("p: {dist: poisson}", 1, "expected one of fixed, uniform"),
        ("p:\n  dist: fixed\n  value: 0", 3, "outside the bounds [1, no limit]"),
    ],
)
def test_bad_length_specs(text, line, message):
    """Each impossible parameter is refused with its own line and a readable reason."""
    doc = load_yaml_text(text + "\n", file="w.yaml")
    with pytest.raises(WorkloadError) as err:
        d.parse_lengths(doc.get_map("p"), None, default_min=1)
    assert err.value.line == line and message in str(err.value), str(err.value)


def test_generator_clips_to_max_model_len():
    """prompt <= max_model_len - output min, and output is cut at max_model_len - prompt."""
    chunks = list(d.synthetic_requests(
        20_000, 3, d.Lengths(d.Exponential(3000.0), 1), d.Lengths(d.Uniform(1, 4000), 1),
        d.AllAtOnce(), max_model_len=4096, chunk_size=7_000))  # fmt: skip
    p = np.concatenate([c.prompt_len for c in chunks])
    o = np.concatenate([c.output_len for c in chunks])
    assert p.dtype == np.int64 and o.dtype == np.int64
    assert p.min() >= 1 and p.max() <= 4095 and o.min() >= 1 and (p + o).max() <= 4096
    assert [len(c) for c in chunks] == [7_000, 7_000, 6_000]


def test_generator_draw_order_per_chunk():
    """Within each chunk: prompts, then outputs, then gaps, from one default_rng(seed)."""
    prompt, output = d.Lengths(d.Uniform(1, 100), 1), d.Lengths(d.Uniform(0, 50), 0)
    arrival = d.Poisson(2.0)
    got = list(d.synthetic_requests(25, 9, prompt, output, arrival, max_model_len=1000, chunk_size=10))
    rng, start = np.random.default_rng(9), 0.0
    for chunk in got:
        n = len(chunk)
        assert np.array_equal(chunk.prompt_len, rng.integers(1, 101, n))
        assert np.array_equal(chunk.output_len, rng.integers(0, 51, n))
        gaps = rng.exponential(0.5, n)
        assert np.allclose(chunk.arrival, start + np.concatenate([[0.0], np.cumsum(gaps)[:-1]]))
        start += gaps.sum()
    again = list(d.synthetic_requests(25, 9, prompt, output, arrival, max_model_len=1000, chunk_size=10))
    for a, b in zip(got, again):
        assert np.array_equal(a.arrival, b.arrival) and np.array_equal(a.prompt_len, b.prompt_len)


def test_arrivals_all_at_once_and_poisson():
    """all_at_once puts every request at 0; Poisson gaps have mean 1/rate and cv 1."""
    t, _ = d.AllAtOnce().times(np.random.default_rng(0), 5, 0.0)
    assert not t.any()
    times, end = d.Poisson(4.0).times(np.random.default_rng(0), N, 0.0)
    gaps = np.diff(np.append(times, end))
    assert times[0] == 0.0 and (np.diff(times) >= 0).all()
    se = 0.25 / math.sqrt(N)  # an exponential gap's sd equals its mean
    assert abs(gaps.mean() - 0.25) < 5 * se
    rel_se_cv = math.sqrt((2 + 6) / N) / 2  # sd estimate, gamma shape 1 (kurtosis excess 6)
    assert abs(gaps.std() / gaps.mean() - 1) < 5 * rel_se_cv + 5 * se / 0.25


def test_gamma_cv1_is_poisson_and_cv2_is_burstier():
    """gamma with cv=1 draws the very numbers poisson draws; cv=2 keeps the rate, doubles the cv."""
    a, _ = d.Gamma(3.0, 1.0).times(np.random.default_rng(5), 1000, 0.0)
    b, _ = d.Poisson(3.0).times(np.random.default_rng(5), 1000, 0.0)
    assert np.array_equal(a, b)
    gaps = d.Gamma(3.0, 2.0).gaps(np.random.default_rng(5), N)
    shape = 0.25
    assert abs(gaps.mean() - 1 / 3) < 5 * (2 / 3) / math.sqrt(N)
    rel_se_sd = math.sqrt((2 + 6 / shape) / N) / 2
    assert abs(gaps.std() / gaps.mean() - 2) < 2 * (5 * rel_se_sd + 5 * 2 / math.sqrt(N))
