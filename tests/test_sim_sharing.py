"""Parallel sampling and beam search by fork and copy-on-write: worked groups, the savings table."""

from __future__ import annotations

import numpy as np
import pytest

from kvplan.errors import KvplanError
from kvplan.replay.sharing import (
    GroupUsage, alpaca_like_lengths, beam_group_usage, parallel_group_usage, sharing_savings,
    sharing_table,
)  # fmt: skip


def test_parallel_sampling_by_hand():
    """Fails if the samples do not share the prompt's full block, or copy its partial block more
    than once.

    B = 4, a 6-token prompt (blocks [0, 1], block 1 half full), two samples of 2 tokens. Step 1:
    sample 0 writes into shared block 1 and copies it (block 2); sample 1 then owns block 1 alone
    and writes in place: 3 blocks in use against 2 x ceil(7 / 4) = 4 unshared. Step 2 fills
    blocks 1 and 2: 3 against 2 x ceil(8 / 4) = 4.
    """
    assert parallel_group_usage(6, [2, 2], 4) == GroupUsage(6, 8, 3, 4, 1)


def test_parallel_samples_finish_at_their_own_lengths():
    """Fails if a finished sample keeps its blocks or still counts as unshared memory.

    B = 4, 4-token prompt (one full block), samples of 1 and 5 tokens. Step 1: each takes a new
    block (no copy: the shared block is full): 3 blocks, unshared 2 x 2 = 4; sample 0 finishes.
    Steps 2..4: blocks 0 and sample 1's, unshared 1 x 2; step 5: sample 1 has 9 tokens, 3 blocks.
    """
    assert parallel_group_usage(4, [1, 5], 4) == GroupUsage(3 + 2 + 2 + 2 + 3, 4 + 2 + 2 + 2 + 3,
                                                            3, 4, 0)  # fmt: skip


@pytest.mark.parametrize("seed", range(20))
def test_parallel_sampling_matches_its_closed_form(seed):
    """Fails if the fork/CoW replay differs from the count worked out on paper: at step t the group
    holds the prompt's P // B full blocks once, plus blocks_for(P + t) - P // B private blocks per
    live sample (each sample ends step 1 with its own copy of a partial last prompt block: n - 1
    copies, the last writer keeps the original)."""
    rng = np.random.default_rng(seed)
    b, p = int(rng.choice([1, 2, 4, 16])), int(rng.integers(1, 60))
    lens = rng.integers(0, 12, int(rng.integers(1, 7))).tolist()
    shared = unshared = peak_s = peak_u = 0
    for t in range(1, max(lens) + 1):
        live = sum(n >= t for n in lens)
        per_seq = -(-(p + t) // b)
        used = p // b + live * (per_seq - p // b)
        shared, unshared = shared + used, unshared + live * per_seq
        peak_s, peak_u = max(peak_s, used), max(peak_u, live * per_seq)
    samples = sum(n > 0 for n in lens)  # a sample with no output holds nothing of its own
    got = parallel_group_usage(p, lens, b)
    assert got == GroupUsage(shared, unshared, peak_s, peak_u, max(samples - 1, 0) * (p % b != 0))


def test_beam_search_by_hand():
    """Fails if beams do not fork from their parents, free the beams that were not extended, or
    copy-on-write when only one child extends a parent.

    B = 4, 4-token prompt, width 2, 3 steps. Step 1: both beams fork from the prompt and take a
    block each (3 in use, 4 unshared). Step 2, parents [0, 1]: each beam has one child, writing in
    place (3 vs 4). Step 3, parents [1, 1]: both children extend beam 1; beam 0's block is freed
    and the first child copies beam 1's last block (3 vs 2 x ceil(7 / 4) = 4; one copy).
    """
    assert beam_group_usage(4, 3, 2, 4, [[0, 1], [1, 1]]) == GroupUsage(9, 12, 3, 4, 1)


def test_a_group_of_one_saves_nothing():
    """Fails if a lone sequence (n = 1, width 1) is counted as sharing anything."""
    rng = np.random.default_rng(0)
    prompts, outputs = alpaca_like_lengths(50, rng)
    for mode in ("parallel", "beam"):
        r = sharing_savings(mode, 1, prompts, outputs, 16, rng)
        assert r.saving == 0 and r.peak_saving == 0 and r.usage.copies == 0


def test_alpaca_like_lengths_have_alpaca_means():
    """Fails if the synthetic lengths drift from the means they claim (19.31 and 58.45 tokens)."""
    prompts, outputs = alpaca_like_lengths(200_000, np.random.default_rng(1))
    assert prompts.mean() == pytest.approx(19.31, rel=0.03)
    assert outputs.mean() == pytest.approx(58.45, rel=0.03)
    assert prompts.min() >= 1 and outputs.min() >= 1


def test_savings_table_shape_and_order():
    """Fails if beam search does not save more than parallel sampling, or if wider groups save
    less; rows come as parallel 2, 4, 6 then beam 2, 4, 6."""
    rows = sharing_table(groups=150, seed=3)
    assert [(r.mode, r.width) for r in rows] == [("parallel", 2), ("parallel", 4), ("parallel", 6),
                                                 ("beam", 2), ("beam", 4), ("beam", 6)]  # fmt: skip
    par, beam = [r.saving for r in rows[:3]], [r.saving for r in rows[3:]]
    assert 0 < par[0] < par[1] < par[2] < beam[0] < beam[1] < beam[2] < 1
    d = rows[3].to_dict()
    assert d["parent"] == "random" and d["saving"] == rows[3].saving and d["usage"]["copies"] > 0


def test_bad_arguments():
    """Fails if an unknown mode, parent rule or width is accepted."""
    rng = np.random.default_rng(0)
    p, o = np.array([10]), np.array([5])
    for kwargs in ({"mode": "tree", "width": 2}, {"mode": "beam", "width": 0}):
        with pytest.raises(KvplanError):
            sharing_savings(kwargs["mode"], kwargs["width"], p, o, 16, rng)
    with pytest.raises(KvplanError):
        sharing_savings("beam", 2, p, o, 16, rng, parent="worst")
