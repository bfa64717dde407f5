"""Speculative decoding: the acceptance draws, the serve engine against the reference with drafts,
token counts derived by hand, the step model's verify-and-draft step, and the workload section."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from kvplan.errors import KvplanError
from kvplan.model.speculative import Draft, default_acceptance, make_speculative
from kvplan.sim import kernel as K
from kvplan.sim.engine import simulate
from kvplan.sim.reference import simulate_reference
from kvplan.sim.speculative import draw
from kvplan.workload.records import (AllocatorSpec, PoolSpec, RequestChunk, SchedulerConfig, SpeculativeRun,
                                     TimingConfig, Workload)
from tests.test_sim_engine import as_json, random_step_model, random_workload


def with_speculation(seed: int, big: bool = False):
    """A random workload of tests/test_sim_engine.py with a random speculative setting and draft."""
    wl, spec, points = random_workload(seed, big)
    rng = np.random.default_rng([seed, 7])
    method = str(rng.choice(["eagle", "eagle3", "mtp", "ngram"]))
    k = int(rng.integers(1, 6))
    rates = np.sort(rng.random(k))[::-1] if rng.random() < 0.7 else None
    setting = make_speculative(method, k, None if rates is None else [float(r) for r in rates])
    draft = None
    if wl.timing.step is not None:
        model = None if method == "ngram" else random_step_model(rng)
        draft = Draft(model, float(rng.integers(0, 3000)) * 1e-12, 0, 0)
    return replace(wl, speculative=SpeculativeRun(setting, draft)), spec, points


@pytest.mark.parametrize("seed", range(120))
def test_engine_equals_reference_with_speculation(seed):
    """Breaks if the kernel's drafts, lookahead blocks, draws or draft ticks differ from the reference's."""
    wl, spec, points = with_speculation(seed)
    fast = simulate(wl, spec, record_requests=True, timeline_points=points)
    slow = simulate_reference(wl, spec, record_requests=True, timeline_points=points)
    assert as_json(fast) == as_json(slow)


@pytest.mark.parametrize("seed", range(8))
def test_engine_equals_reference_with_speculation_larger(seed):
    wl, spec, points = with_speculation(seed, big=True)
    fast = simulate(wl, spec, record_requests=True, timeline_points=points)
    slow = simulate_reference(wl, spec, record_requests=True, timeline_points=points)
    assert as_json(fast) == as_json(slow)


def test_kernel_draw_is_the_reference_draw():
    rng = np.random.default_rng(3)
    for seed, rid, gen in zip(rng.integers(0, 2**31, 500), rng.integers(0, 2**40, 500), rng.integers(0, 2**20, 500)):
        assert int(K.spec_draw(np.int64(seed), np.int64(rid), np.int64(gen))) == draw(int(seed), int(rid), int(gen))


def test_draws_give_the_per_position_rates():
    """P(at least i + 1 drafts accepted) is acceptance[i] (vLLM's per-position metric), within
    4 standard errors over 40,000 draws."""
    from kvplan.sim.speculative import spec_setup

    setting = make_speculative("eagle3", 3, [0.8, 0.5, 0.2])
    sp = spec_setup(SpeculativeRun(setting), TimingConfig_clock(), seed=11, token_budget=16)
    n = 40_000
    counts = np.bincount([sp.accepted(rid, 5, 3) for rid in range(n)], minlength=4)
    at_least = counts[::-1].cumsum()[::-1][1:] / n
    for got, want in zip(at_least, (0.8, 0.5, 0.2)):
        assert abs(got - want) < 4 * (want * (1 - want) / n) ** 0.5


def TimingConfig_clock():
    from kvplan.sim.timing import StepClock

    return StepClock(timed=False)


def one_request(output: int, acceptance, k: int, budget: int = 64):
    sched = SchedulerConfig(4, budget, 128, True, "recompute", 0, False)

    def make():
        yield RequestChunk(np.array([0.0]), np.array([10]), np.array([output]))

    wl = Workload("one", "", 0, "serve", 1, PoolSpec(4096), (AllocatorSpec("paged", block_size=16),), sched,
                  TimingConfig(), make)
    setting = make_speculative("eagle3", k, acceptance)
    return replace(wl, speculative=SpeculativeRun(setting)), wl.allocators[0]


@pytest.mark.parametrize("output", [1, 2, 5, 13, 40])
def test_steps_by_hand(output):
    """One request, steps as time units: the prefill step samples token 1; then every decode step
    emits 1 + k tokens when every draft is accepted (k = 3: ceil((O - 1) / 4) steps), 1 token when
    none is; the last step stops at the output length."""
    for rates, per_step in (([1.0, 1.0, 1.0], 4), ([0.0, 0.0, 0.0], 1)):
        wl, alloc = one_request(output, rates, 3)
        for run in (simulate, simulate_reference):
            result = run(wl, alloc, record_requests=True)
            assert result.to_dict()["steps"] == 1 + -(-(output - 1) // per_step)


def test_budget_cuts_the_drafts():
    """A token budget of 2 leaves one draft a step: all accepted, each step emits 2 tokens."""
    wl, alloc = one_request(21, [1.0, 1.0, 1.0], 3, budget=2)
    wl = replace(wl, scheduler=replace(wl.scheduler, max_num_batched_tokens=2, max_model_len=128))
    # the prompt of 10 takes 5 chunked steps, the first of them... the last one samples token 1
    steps = simulate_reference(wl, alloc).to_dict()["steps"]
    assert steps == 5 + 10  # 20 more tokens, 2 a step
    assert simulate(wl, alloc).to_dict()["steps"] == steps


def test_default_acceptance_is_geometric_and_cited_rates():
    assert default_acceptance("mtp", 2) == (0.875, 0.765625)
    assert make_speculative("eagle3", None, "0.8,0.6,0.4").k == 3


@pytest.mark.parametrize("args,field", [
    (("medusa", 3, None), "--speculative"),
    (("eagle3", 0, None), "--num-speculative-tokens"),
    (("eagle3", 3, [0.5, 0.6, 0.1]), "--acceptance"),
    (("eagle3", 2, [0.5, 0.4, 0.1]), "--acceptance"),
    (("eagle3", 3, [1.5, 0.4, 0.1]), "--acceptance"),
    (("eagle3", 3, "a,b"), "--acceptance"),
])
def test_bad_settings_name_their_flag(args, field):
    with pytest.raises(KvplanError) as e:
        make_speculative(*args)
    assert e.value.field == field
