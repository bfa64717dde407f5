"""Sharing inside a request group: parallel sampling and beam search by fork and copy-on-write.

A group's sequences share the prompt's blocks through `BlockManager.fork`, diverge by
copy-on-write (a shared last block with room is copied before the first write into it) and give
blocks back by reference count, exactly as in the lesson's prefix-sharing run. Memory is counted
in block-steps: after every decode step, the blocks the group holds. "Unshared" is the same group
with every sequence in blocks of its own (each holds ceil(tokens / B) blocks); the saving is
1 - shared / unshared, the ratio Kwon et al. (SOSP'23, Fig. 15) report.

Models (simplified, stated):
- Parallel sampling (`n` outputs per prompt): sequence 0 holds the prompt; n - 1 children fork
  from it before the first step; sample i generates its own output length L_i, one token per
  step, and is freed after its last token.
- Beam search (`width` beams): at step 1 every beam forks from the prompt; at each later step
  every new beam is a child of a surviving beam (its parent: uniformly random with
  parent="random", or always beam 0 with parent="best", the most sharing possible). Children
  fork first, the old beams are freed, then each child appends its token, so a parent with one
  child writes in place and only siblings copy (vLLM's beam search reuses the parent sequence
  for its first child). All beams run the group's output length L and finish together.
"""

from __future__ import annotations

from dataclasses import asdict, astuple, dataclass
from typing import Callable, Sequence

import numpy as np

from kvplan.errors import KvplanError
from kvplan.memory.paged import BlockManager
from kvplan.workload.spec import BEAM_PARENTS, SAMPLING_MODES

MODES, PARENTS = SAMPLING_MODES, BEAM_PARENTS  # the sampling section's (kvplan/workload/spec.py)
# Kwon et al. (SOSP'23) Fig. 11b, Alpaca: input mean 19.31, output mean 58.45 tokens.
ALPACA_PROMPT_MEAN, ALPACA_OUTPUT_MEAN = 19.31, 58.45
PROGRESS_EVERY = 256  # groups between progress reports


@dataclass(frozen=True, slots=True)
class GroupUsage:
    """One group's memory: block-steps and peaks with and without sharing, and block copies."""

    shared_block_steps: int
    unshared_block_steps: int
    shared_peak: int
    unshared_peak: int
    copies: int

    def __add__(self, other: GroupUsage) -> GroupUsage:
        return GroupUsage(*(a + b for a, b in zip(astuple(self), astuple(other))))


@dataclass(frozen=True, slots=True)
class SharingResult:
    """Savings of one mode and width over many groups (sums of GroupUsage)."""

    mode: str
    width: int
    block_size: int
    groups: int
    parent: str | None
    usage: GroupUsage

    @property
    def saving(self) -> float:
        """1 - shared / unshared block-steps: the time-averaged fraction of blocks saved."""
        u = self.usage
        return 1 - u.shared_block_steps / u.unshared_block_steps if u.unshared_block_steps else 0.0

    @property
    def peak_saving(self) -> float:
        """The same over each group's peak, summed over groups."""
        u = self.usage
        return 1 - u.shared_peak / u.unshared_peak if u.unshared_peak else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(saving=self.saving, peak_saving=self.peak_saving)
        return d


def _manager(tokens: int, sequences: int, block_size: int) -> BlockManager:
    """A pool that cannot run out: every sequence in blocks of its own, plus one copy each."""
    return BlockManager(sequences * (-(-tokens // block_size) + 1), block_size)


def parallel_group_usage(prompt_len: int, output_lens: Sequence[int],
                         block_size: int) -> GroupUsage:  # fmt: skip
    """One prompt sampled len(output_lens) times, sample i generating output_lens[i] tokens."""
    lens = [int(n) for n in output_lens]
    if prompt_len < 1 or not lens or min(lens) < 0:
        raise KvplanError(f"need a prompt >= 1 token and outputs >= 0, got {prompt_len}, {lens}")
    lens = [n for n in lens if n]  # a sample with no output never holds a block of its own
    if not lens:
        return GroupUsage(0, 0, 0, 0, 0)
    mgr = _manager(prompt_len + max(lens), len(lens), block_size)
    mgr.add_request(0, prompt_len)
    for i in range(1, len(lens)):
        mgr.fork(0, i)
    shared = unshared = peak_s = peak_u = copies = 0
    for step in range(1, max(lens) + 1):
        live = [i for i, n in enumerate(lens) if n >= step]
        for i in live:
            copies += mgr.append(i).copy is not None
        used = mgr.num_used_blocks
        private = len(live) * mgr.blocks_for(prompt_len + step)
        shared, unshared = shared + used, unshared + private
        peak_s, peak_u = max(peak_s, used), max(peak_u, private)
        for i in live:
            if lens[i] == step:
                mgr.free(i)
    return GroupUsage(shared, unshared, peak_s, peak_u, copies)


def beam_group_usage(prompt_len: int, length: int, width: int, block_size: int,
                     parents: Sequence[Sequence[int]]) -> GroupUsage:  # fmt: skip
    """One beam search of `width` beams over `length` steps; parents[t][j] is the beam (index
    0..width-1) that new beam j extends at step t + 2 (step 1 forks everything from the prompt)."""
    if prompt_len < 1 or length < 0 or width < 1 or len(parents) < length - 1:
        raise KvplanError(f"bad beam group: prompt {prompt_len}, length {length}, width {width}, "
                          f"{len(parents)} parent rows")  # fmt: skip
    mgr = _manager(prompt_len + length, width + 1, block_size)
    mgr.add_request("prompt", prompt_len)
    beams, next_id = ["prompt"] * width, 0
    shared = unshared = peak_s = peak_u = copies = 0
    for step in range(1, length + 1):
        chosen = [beams[0]] * width if step == 1 else [beams[int(p)] for p in parents[step - 2]]
        children = list(range(next_id, next_id + width))
        next_id += width
        for parent, child in zip(chosen, children):
            mgr.fork(parent, child)
        for old in set(beams):
            mgr.free(old)
        for child in children:
            copies += mgr.append(child).copy is not None
        beams = children
        used, private = mgr.num_used_blocks, width * mgr.blocks_for(prompt_len + step)
        shared, unshared = shared + used, unshared + private
        peak_s, peak_u = max(peak_s, used), max(peak_u, private)
    return GroupUsage(shared, unshared, peak_s, peak_u, copies)


def alpaca_like_lengths(groups: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(prompt, output) lengths with Alpaca's means (Kwon et al. Fig. 11b: 19.31 and 58.45).

    The shapes are this module's choice, not Alpaca's: lognormal with sigma 0.5 (prompts) and
    0.8 (outputs), mu set so the unclipped means match, rounded and clipped to 1..2048.
    """
    def draw(mean: float, sigma: float) -> np.ndarray:
        x = rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, groups)
        return np.clip(np.rint(x), 1, 2048).astype(np.int64)

    return draw(ALPACA_PROMPT_MEAN, 0.5), draw(ALPACA_OUTPUT_MEAN, 0.8)


def sharing_savings(mode: str, width: int, prompt_lens: np.ndarray, output_lens: np.ndarray,
                    block_size: int, rng: np.random.Generator, *,
                    parent: str = "random", progress: Callable[[int], None] | None = None) -> SharingResult:  # fmt: skip
    """Block savings of one group per prompt. Parallel sampling draws each sample's output
    length from `output_lens` (its own one first, then others at random); beam search runs the
    group's own output length. `progress(groups done)` every PROGRESS_EVERY groups."""
    if mode not in MODES:
        raise KvplanError(f"unknown sharing mode {mode!r}; expected {' or '.join(MODES)}")
    if parent not in PARENTS:
        raise KvplanError(f"unknown beam parent rule {parent!r}; expected {' or '.join(PARENTS)}")
    if isinstance(width, bool) or width < 1:
        raise KvplanError(f"width must be an integer >= 1, got {width!r}")
    total = GroupUsage(0, 0, 0, 0, 0)
    prompts, outputs = np.asarray(prompt_lens).tolist(), np.asarray(output_lens)
    for g, prompt in enumerate(prompts):
        if progress is not None and g % PROGRESS_EVERY == 0:
            progress(g)
        length = int(outputs[g])
        if mode == "parallel":
            lens = [length, *rng.choice(outputs, width - 1).tolist()]
            total += parallel_group_usage(prompt, lens, block_size)
        else:
            rows = (np.zeros((length, width), dtype=np.int64) if parent == "best"
                    else rng.integers(width, size=(length, width)))  # fmt: skip
            total += beam_group_usage(prompt, length, width, block_size, rows)
    return SharingResult(mode, width, block_size, len(prompts), parent if mode == "beam" else None,
                         total)  # fmt: skip


def sharing_table(groups: int = 2000, widths: Sequence[int] = (2, 4, 6), block_size: int = 16,
                  seed: int = 0, parent: str = "random") -> tuple[SharingResult, ...]:  # fmt: skip
    """Parallel sampling and beam search savings on Alpaca-like lengths: a row per mode, width."""
    rng = np.random.default_rng(seed)
    prompts, outputs = alpaca_like_lengths(groups, rng)
    return tuple(sharing_savings(mode, w, prompts, outputs, block_size, rng, parent=parent)
                 for mode in MODES for w in widths)  # fmt: skip
