"""One truth about the pool: `kvplan size`, the serve engine, the capacity experiment and the
prefix replay cut the same KV pool into the same usable blocks (vLLM's null block kept back)."""

from __future__ import annotations

import numpy as np
import pytest

from kvplan.model.size import size
from kvplan.sim.inputs import make_setup
from kvplan.workload.records import PoolSpec, SchedulerConfig, TimingConfig, Workload
from kvplan.workload.spec import AllocatorSpec
from kvplan.workload.chunks import RequestChunk


def served(kv_bytes: int, bytes_per_token: int, null_block: bool = True, layout=None, block: int = 16,
           mml: int = 4096, hybrid: bool | None = None):
    def make():
        yield RequestChunk(np.zeros(1), np.array([100]), np.array([10]))

    sched = SchedulerConfig(256, 8192, mml, True, "recompute", 0, null_block, False)
    spec = AllocatorSpec("paged", block_size=block, hybrid=hybrid)
    pool = PoolSpec(kv_bytes // bytes_per_token, bytes_per_token, kv_bytes)
    return Workload("pool", "", 0, "serve", 1, pool, (spec,), sched, TimingConfig(), make, layout=layout), spec


@pytest.mark.parametrize("model,tp", [("meta-llama/Llama-3.1-8B-Instruct", 1), ("google/gemma-3-12b-it", 1),
                                      ("Qwen/Qwen3-Next-80B-A3B-Instruct", 4), ("openai/gpt-oss-20b", 1)])
def test_the_engine_uses_the_blocks_kvplan_size_reports(model, tp):
    """The start-up KV pool of `kvplan size`, given to the engine: the same usable blocks (and, for
    hybrid models, the same vLLM block size and layer groups)."""
    from kvplan.model.facts import model_facts

    report = size(model, gpu="H200", tp=tp, explore=False).report
    facts = model_facts(model, tp=tp, gpu_name="H200")
    layout = facts.layout
    wl, spec = served(report.kv_pool_bytes, layout.bytes_per_token, layout=layout,
                      mml=min(8192, layout.max_context or 8192))
    setup = make_setup(wl, spec)
    expected = report.usable_blocks if report.vllm_num_blocks is None else report.vllm_num_blocks - 1
    assert setup.num_blocks == expected
    assert setup.block_size == (report.vllm_block_size or 16)


def test_capacity_experiment_and_replay_keep_the_null_block():
    from kvplan.memory.capacity import paged_capacity

    lengths = np.full(100, 16)
    assert paged_capacity(lengths, 16 * 10, 16, null_block=True).admitted == 9
    assert paged_capacity(lengths, 16 * 10, 16, null_block=False).admitted == 10
