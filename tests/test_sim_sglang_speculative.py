"""Speculative decoding on SGLang's scheduler (`engine: sglang` with `speculative:`): the compiled
kernel against the reference on random workloads, token and step counts derived by hand from the
rules in kvplan/sim/sglang.py's docstring, the start-up pool's headroom (kvplan/model/
sglang_memory.py, rule 4), and a workload file end to end."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvplan.model.speculative import Draft, make_speculative
from kvplan.sim.engine import simulate
from kvplan.sim.sglang_reference import sglang_reference, simulate_sglang_reference
from kvplan.workload.records import SglangConfig, SpeculativeRun
from tests.test_sim_engine import as_json, random_step_model
from tests.test_sim_sglang import SPEC, hand_workload, random_sglang_workload, records


def with_speculation(seed: int, big: bool = False):
    """A random SGLang workload of tests/test_sim_sglang.py with a random EAGLE-style setting and draft."""
    wl, points = random_sglang_workload(seed, big)
    rng = np.random.default_rng([seed, 41])
    method = str(rng.choice(["eagle", "eagle3", "mtp"]))
    k = int(rng.integers(1, 6))
    rates = np.sort(rng.random(k))[::-1] if rng.random() < 0.7 else None
    setting = make_speculative(method, k, None if rates is None else [float(r) for r in rates])
    draft = None
    if wl.timing.step is not None:
        draft = Draft(random_step_model(rng), float(rng.integers(0, 3000)) * 1e-12, 0, 0)
    # the drafts' headroom SGLang's start-up adds (rule 4 of kvplan/model/sglang_memory.py), else a
    # request alone in a pool it fills could never find its 2k + 1 tokens
    pool = replace(wl.pool, slots=wl.pool.slots + wl.sglang.max_running_requests * (2 * k + 1))
    return replace(wl, pool=pool, speculative=SpeculativeRun(setting, draft)), points


@pytest.mark.parametrize("seed", range(150))
def test_kernel_equals_reference_with_speculation(seed):
    """Breaks if the kernel's decode buffer, retraction order and headroom, draws or draft ticks
    differ from the reference's."""
    wl, points = with_speculation(seed)
    fast = simulate(wl, SPEC, record_requests=True, timeline_points=points)
    slow = simulate_sglang_reference(wl, SPEC, record_requests=True, timeline_points=points)
    assert as_json(fast) == as_json(slow)


@pytest.mark.parametrize("seed", range(15))
def test_kernel_equals_reference_with_speculation_larger(seed):
    wl, points = with_speculation(seed, big=True)
    fast = simulate(wl, SPEC, record_requests=True, timeline_points=points)
    slow = simulate_sglang_reference(wl, SPEC, record_requests=True, timeline_points=points)
    assert as_json(fast) == as_json(slow)


def test_random_speculative_runs_retract_and_keep_the_tree_whole():
    """The random cases retract under the drafts' buffer (else the equality above would prove
    little), and at the end every token is free or in the tree, nothing locked."""
    retracted = 0
    for seed in range(60):
        wl, _ = with_speculation(seed, big=seed % 2 == 1)
        sim, _, _ = sglang_reference(wl, SPEC)
        sim.run()
        retracted += sim.preemptions > 0
        cached = [n for n, c in enumerate(sim.cached) if c]
        assert sim.free + len(cached) * sim.H == sim.s.slots
        assert sum(sim.lock) == 0
        assert all(r.done and r.generated == r.output for r in sim.reqs)
    assert retracted >= 5


# -- by hand -----------------------------------------------------------------------------------------

G = SglangConfig(schedule_policy="fcfs", schedule_conservativeness=1.0, chunked_prefill_size=0,
                 max_prefill_tokens=16384, max_running_requests=8, radix_cache=False)
RUNNERS = {"kernel": simulate, "reference": simulate_sglang_reference}


def speculative_hand(requests, slots, k: int, acceptance, g: SglangConfig = G):
    wl = hand_workload(requests, slots, g)
    return replace(wl, speculative=SpeculativeRun(make_speculative("eagle", k, acceptance), None))


@pytest.mark.parametrize("run", RUNNERS)
@pytest.mark.parametrize("output, acceptance, steps", [
    # prompt 8, k = 3. The prefill step emits token 1. Every draft accepted: a decode step emits
    # 1 + 3 = 4 tokens, so 9 tokens take 1 + 2 steps (1 -> 5 -> 9).
    (9, (1.0, 1.0, 1.0), 3),
    # 7 tokens: 1 -> 5, then the drafts are cut to what the output has left (7 - 5 - 1 = 1): 5 -> 7.
    (7, (1.0, 1.0, 1.0), 3),
    # Nothing accepted: one token a decode step, 1 + 8 steps.
    (9, (0.0, 0.0, 0.0), 9),
    # Only the first draft: 2 tokens a step, 1 -> 3 -> 5 -> 7 -> 9: 1 + 4 steps.
    (9, (1.0, 0.0, 0.0), 5),
])
def test_steps_by_hand(run, output, acceptance, steps):
    result = RUNNERS[run](speculative_hand([(0, 8, output, ())], 200, 3, acceptance), SPEC, record_requests=True)
    r = result.to_dict()
    assert r["steps"] == steps
    assert r["completed"] == 1


@pytest.mark.parametrize("run", RUNNERS)
def test_the_drafts_buffer_retracts_where_a_plain_decode_fits(run):
    """Breaks if check_decode_mem does not want 2k + 1 free tokens a request, or retraction takes
    another request or keeps less headroom. Pool 81, radix cache off, fcfs. A (prompt 12, output
    30) and B (prompt 8, output 30) arrive at 0: A's total 12 + 30 = 42 < 81, B's 38 < 81 - 42 =
    39, both prefilled in step 0 (free 61, one token each). Without speculation they end holding
    41 + 37 = 78 <= 81 tokens: nothing is ever retracted. With k = 3, every draft accepted, each
    decode step adds 4 tokens a request: free 61 -> 53 -> 45 -> 37 -> 29 -> 21 -> 13 after steps
    1-6 (25 tokens generated each, A holding 36, B 32). Step 7 wants 2 x 7 = 14 > 13: retract.
    With speculation the last of the batch goes, B (its 32 tokens recomputed later; free 45 >= 27
    = 20 + 7 for the one left), where the plain rule would take A (the longest prompt of equal
    outputs); the ratio becomes min(1, (25 + 20) / 30) = 1, and A decodes 4 more (gen 29, holding
    40, free 41). Step 8: B, target 8 + 25 = 33, total 33 + 5 = 38 < rem_total 41 - 1 x 1 = 40:
    prefilled (free 8, its 26th token). Step 9 wants 14 > 8: B, the last again, is retracted (33
    more recomputed: 65); A's drafts are cut to 30 - 29 - 1 = 0 and it finishes (t = 10). Step 10
    prefills B's 34 tokens (27th token), and step 11 accepts 30 - 27 - 1 = 2 drafts: B finishes
    at t = 12. Twelve steps: 0, 1-7, 8, 9, 10, 11."""
    wl = hand_workload([(0, 12, 30, ()), (0, 8, 30, ())], 81, G)
    plain = records(RUNNERS[run](wl, SPEC, record_requests=True))
    assert plain["preemptions"] == [0, 0]
    r = RUNNERS[run](speculative_hand([(0, 12, 30, ()), (0, 8, 30, ())], 81, 3, (1.0, 1.0, 1.0)), SPEC,
                     record_requests=True)
    rec = records(r)
    assert rec["preemptions"] == [0, 2] and r.recomputed_tokens == 32 + 33
    assert rec["first_token"] == [1.0, 1.0] and rec["finish"] == [10.0, 12.0]
    assert r.steps == 12


def test_retraction_keeps_the_batch_order_under_speculation():
    """Without speculation retract_decode takes the request with the fewest outputs first; with
    it, the last of the batch (schedule_batch.retract_decode: "For spec decoding, filter_batch
    API can only filter requests from the back"). Checked on the reference's own record: with
    speculation a retracted request is always the last of the running batch it left."""
    seen = 0
    for seed in range(40):
        wl, _ = with_speculation(seed, big=True)
        sim, _, _ = sglang_reference(wl, SPEC)
        original = sim.retract

        def spy(sim=sim, original=original):
            nonlocal seen
            before = list(sim.running)
            original()
            kept = sim.running
            assert before[:len(kept)] == kept  # the survivors are the batch's first ones, in order
            seen += len(kept) < len(before)

        sim.retract = spy
        sim.run()
    assert seen >= 3


# -- a workload file and the step report ------------------------------------------------------------

SERVE = """name: sglang-eagle3
experiment: serve
model: meta-llama/Llama-3.1-8B-Instruct
gpu: H100-80GB
engine: sglang
pool: {mem_fraction_static: default}
requests:
  count: 60
  prompt: {dist: fixed, value: 500}
  output: {dist: fixed, value: 120}
  arrival: {process: poisson, rate: 2.0}
timing: {model: physical}
"""


def test_a_speculative_sglang_run_starts_and_serves_as_sglang_would(tmp_path):
    """The pool is SGLang's start-up pool with the drafts' headroom, at most 48 requests run
    (SGLang's default with speculation), runs repeat to the byte, and at light load the drafts
    cut the time per output token (EAGLE-3's default acceptance: 1 + 1.71 tokens a step at k = 3)."""
    from kvplan.experiments import load
    from kvplan.model.sglang_memory import SPECULATIVE_MAX_RUNNING

    plain_path, spec_path = tmp_path / "plain.yaml", tmp_path / "spec.yaml"
    plain_path.write_text(SERVE, encoding="utf-8")
    spec_path.write_text(SERVE + "speculative: {method: eagle3, num_speculative_tokens: 3}\n", encoding="utf-8")
    plain_wl, spec_wl = load(str(plain_path)), load(str(spec_path))
    assert spec_wl.sglang.max_running_requests == SPECULATIVE_MAX_RUNNING == 48
    # the overlap scheduler is off while SGLang speculates, on without speculation
    assert plain_wl.timing.step.async_scheduling and not spec_wl.timing.step.async_scheduling
    # the pool SGLang profiles at the fraction a draft leaves (0.810 on an H100 at tp=1, by hand in
    # tests/test_sglang_memory.py), plus max_num_reqs x (2k + 1) + 100 = 2,048 x 7 + 100 tokens
    at_0810 = load(str(_write(tmp_path, "at0810.yaml", SERVE.replace("default", "0.81"))))
    assert spec_wl.pool.slots == at_0810.pool.slots + 2048 * 7 + 100
    assert plain_wl.pool.slots > at_0810.pool.slots
    first = simulate(spec_wl, SPEC, record_requests=True)
    again = simulate(load(str(spec_path)), SPEC, record_requests=True)
    assert as_json(first) == as_json(again)
    plain = simulate(plain_wl, SPEC)
    assert first.to_dict()["tpot_s"]["mean"] < 0.6 * plain.to_dict()["tpot_s"]["mean"]


def _write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_step_reports_sglangs_chain_beside_vllms():
    """`kvplan step --engine sglang --speculative` prices the same passes as vLLM's chain (one over
    the verified tokens, k - 1 of one token) on SGLang's host constants, its host time added (no
    overlap scheduler while speculating), and reports SGLang's decode buffer (2k + 1 = 7 at k = 3)
    where vLLM allocates k lookahead slots."""
    from kvplan.model.step import step_of

    args = dict(gpu="H100-80GB", batch=8, context=1000, speculative="eagle3", num_speculative_tokens=3)
    sglang = step_of("meta-llama/Llama-3.1-8B-Instruct", engine="sglang", **args)["speculative"]
    vllm = step_of("meta-llama/Llama-3.1-8B-Instruct", **args)["speculative"]
    assert (sglang["lookahead_slots"], sglang["decode_buffer_tokens"]) == (0, 7)
    assert vllm["lookahead_slots"] == 3 and "decode_buffer_tokens" not in vllm
    assert sglang["step"]["tokens_verified"] == vllm["step"]["tokens_verified"] == 8 * 4
    # SGLang speculates with its overlap scheduler off: the host time adds to the GPU's; vLLM's
    # overlaps it (its step is the longer of the two)
    st = sglang["step"]
    assert st["step_s"] == pytest.approx(st["verify_s"] + st["draft_s"] + st["serial_host_s"], rel=1e-12)
    assert st["serial_host_s"] > 0 and "serial_host_s" not in vllm["step"]
    assert vllm["step"]["step_s"] == pytest.approx(vllm["step"]["verify_s"] + vllm["step"]["draft_s"], rel=1e-12)
    assert st["speedup"] > 1.5
