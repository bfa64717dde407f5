"""Time: the discrete-event serving engine. Returns results; prints nothing.

engine: runs one allocator's simulation of a workload (the fast path) and builds its document.
kernel: the engine's compiled core, numba: vLLM's scheduler step and closed-form jumps, and
  SGLang's scheduler (sg_*).
sglang, sglang_state, sglang_reference: SGLang's rules, its state in the kernel (fed chunk by
  chunk like engine.KernelState, new_state picks one), and the reference that defines them.
state: what both engines' states share (EngineState).
reference: the plain step-by-step engine whose docstring defines every rule; the tests require
  the fast engine to equal it to the byte.
inputs: the setup both engines share (requests, reservations, the step clock).
timing: the step-time model in integer ticks.
sampling: the memory timeline, sampled at fixed times.
metrics: latencies, throughput and the memory breakdown from a finished run.
sweep: the request-rate sweep.
"""
