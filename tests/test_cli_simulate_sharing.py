"""`kvplan simulate` for the prefix-caching and sharing experiments, through the CLI."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT, shared_dir

PREFIX = """\
experiment: prefix
seed: 1
pool: {slots: 4096}
requests:
  count: 200
  prompt: {dist: uniform, low: 8, high: 64}
  output: {dist: fixed, value: 8}
  arrival: {process: all_at_once}
allocators: [{kind: paged, block_size: 16}]
prefix: {system_prompts: 2, system_prompt_len: 160, popularity: uniform, hash_block_size: 16}
scheduler: {max_model_len: 1024}
"""


def test_shared_system_prompts_hit(run_cli, tmp_path):
    """Two 160-token system prompts shared by 200 requests: every request after the first of its
    prompt finds all 10 prompt blocks, so hits = (200 - 2) x 160 tokens exactly."""
    path = tmp_path / "p.yaml"
    path.write_text(PREFIX)
    code, out, err = run_cli("simulate", str(path), "--json")
    assert code == 0, err
    (row,) = json.loads(out)["results"]
    assert row["requests"] == 200 and row["hits"] == 198 * 160
    assert row["hit_rate"] == pytest.approx(row["hits"] / row["queries"])


def test_prefix_field_errors_name_the_line(run_cli, tmp_path):
    """A bad prefix key is one line naming prefix.<key> and its line."""
    path = tmp_path / "p.yaml"
    path.write_text(PREFIX.replace("popularity: uniform", "popularity: viral"))
    code, _, err = run_cli("simulate", str(path))
    assert code == 2 and "prefix.popularity" in err and ":10:" in err


def test_cache_block_sweep_grows_hit_rate(run_cli):
    """On the Mooncake conversation trace the LRU hit rate never falls as the cache grows."""
    if not (shared_dir() / "traces" / "mooncake-fast25" / "conversation_trace.jsonl").is_file():
        pytest.skip("no Mooncake trace")
    code, out, err = run_cli("simulate", str(ROOT / "workloads" / "mooncake-prefix.yaml"),
                             "--cache-blocks", "500,5000,50000", "--json")
    assert code == 0, err
    rates = [r["hit_rate"] for r in json.loads(out)["results"]]
    assert rates == sorted(rates) and rates[-1] > rates[0]


def test_sharing_experiment(run_cli):
    """Beam search saves more than parallel sampling at every width (Kwon et al.'s ordering)."""
    code, out, err = run_cli("simulate", str(ROOT / "workloads" / "alpaca-sharing.yaml"), "--json")
    assert code == 0, err
    rows = json.loads(out)["results"]
    by = {(r["mode"], r["width"]): r["saving"] for r in rows}
    for w in (2, 4, 6):
        assert 0 < by[("parallel", w)] < by[("beam", w)] < 1
    assert by[("parallel", 2)] < by[("parallel", 6)]


def test_bad_cache_blocks(run_cli):
    """--cache-blocks must be whole positive numbers."""
    code, _, err = run_cli("simulate", str(ROOT / "workloads" / "alpaca-sharing.yaml"), "--cache-blocks", "1.5")
    assert code == 2 and "--cache-blocks" in err
