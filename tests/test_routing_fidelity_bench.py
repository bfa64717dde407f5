"""bench/routing_fidelity.py's sources: the traces it writes for each published report have the
report's shape (counts derived by hand from each report's workload profile), and every transcribed
table belongs to a stage and a scheduler of its source. No simulation runs here."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import bench_module

bench = bench_module("routing_fidelity")


# (source, shared system blocks, own question blocks, prompt tokens, distinct prompts), by hand:
# X-70R-6kSys: 6,000 // 64 = 93 shared blocks; (6,000 + 1,200) // 64 = 112, so 19 of the question's;
#   150 groups x 5 = 750 prompts.
# L1: 3,500 // 64 = 54; (3,500 + 512) // 64 = 62, so 8; 100 x 2 = 200 prompts.
# 8,000 // 64 = 125; 9,000 // 64 = 140, so 15; 83 x 3 = 249 prompts.
@pytest.mark.parametrize("source, shared, own, tokens, prompts", [
    ("X-70R-6kSys", 93, 19, 7200, 750), ("L1", 54, 8, 4012, 200), ("X-37", 125, 15, 9000, 249),
    ("X-37-repeat", 125, 15, 9000, 249)])
def test_trace_has_the_reports_shape(source, shared, own, tokens, prompts):
    src = bench.SOURCES[source]
    requests, stages = bench.trace(src, seed=1)
    assert {r["in"] for r in requests} == {tokens}
    assert {len(r["hash_ids"]) for r in requests} == {shared + own}
    assert len({tuple(r["hash_ids"]) for r in requests}) == prompts  # every prompt of the set appears
    systems = {tuple(r["hash_ids"][:shared]) for r in requests}
    assert len(systems) == src["groups"]  # one shared system prompt per group
    # a question's blocks belong to one prompt: no two prompts share any of them
    owners = {}
    for r in requests:
        for h in r["hash_ids"][shared:]:
            assert owners.setdefault(h, tuple(r["hash_ids"])) == tuple(r["hash_ids"])
    # each stage holds at most rate x duration requests, all inside the stage's own window
    stages, t = np.asarray(stages), np.array([r["t"] for r in requests])
    start = 0.0
    for k, (rate, duration) in enumerate(src["stages"]):
        mine = t[stages == k]
        assert 0 < len(mine) <= rate * duration
        assert mine.min() >= start and mine.max() < start + duration
        start += duration + bench.DRAIN_S


def test_every_table_is_a_stage_and_a_scheduler_of_its_source():
    for name, src in bench.SOURCES.items():
        rates = {rate for rate, _ in src["stages"][1:]}  # the warm-up has no table
        assert set(src["measured"]) == set(src["routers"])
        extra = {key: src.get(key, {}) for key in ("mean", "itl_mean", "itl_p90")}
        for key, tables in extra.items():
            assert set(tables) <= set(src["routers"]), (name, key)  # each a scheduler of the report
        for table in (*src["measured"].values(), *(t for tables in extra.values() for t in tables.values())):
            assert set(table) <= rates, name
    assert set(bench.TARGETED) <= set(bench.SOURCES)


def test_quantized_share_counts_values_near_the_grid():
    # by hand, to the ms: 400 and 600 are on the 100 ms grid, 498 and 502 2 ms off it, 503 and 250
    # farther; 3.4 s is left out (over 3 s)
    assert bench.quantized_share([0.4, 0.6, 0.498, 0.502, 0.503, 0.25, 3.4]) == (4, 6)
    assert bench.quantized_share([]) == (0, 0)
    # the docstring's counts, from the transcribed tables
    assert bench.quantized_share(bench.SOURCES["X-70R-6kSys"]["measured"]["precise"].values()) == (11, 16)
    assert bench.quantized_share(bench.SOURCES["X-37"]["measured"]["default"].values()) == (5, 8)
    assert bench.quantized_share(v for t in bench.SOURCES["X-37-repeat"]["measured"].values()
                                 for v in t.values()) == (10, 11)
