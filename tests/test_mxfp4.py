"""How vLLM lays out MXFP4 experts per GPU (kvplan/model/mxfp4.py): the backend each GPU gets
(vLLM's get_mxfp4_backend) and the padded tensors it allocates, counted here by hand."""

from __future__ import annotations

import pytest

from kvplan.model.gpus import get_gpu
from kvplan.model.mxfp4 import FLASHINFER, MARLIN, TRITON, expert_bytes_per_rank, mxfp4_backend
from kvplan.model.resolve import load_spec
from kvplan.model.weights import estimate_weights


@pytest.mark.parametrize("gpu, backend", [
    ("A100-80GB", "Marlin"), ("L4", "Marlin"), ("A10G", "Marlin"), ("RTX-4090", "Marlin"),
    ("H100-80GB", "Triton"), ("H200", "Triton"), ("RTX-5090", "Triton"), ("B200", "FlashInfer"),
    ("MI300X", "Triton (ROCm)"), (None, "Triton"),
])  # fmt: skip
def test_each_gpu_gets_vllms_backend(gpu, backend):
    assert mxfp4_backend(get_gpu(gpu) if gpu else None).name == backend


def test_rocm_pads_both_widths_to_its_targets_alignment():
    assert (mxfp4_backend(get_gpu("MI300X")).intermediate_align, mxfp4_backend(get_gpu("MI300X")).hidden_align) == (128, 128)
    assert (mxfp4_backend(get_gpu("MI355X")).intermediate_align, mxfp4_backend(get_gpu("MI355X")).hidden_align) == (256, 256)


def test_one_gpt_oss_expert_by_hand():
    """hidden 2,880, intermediate 2,880. Marlin at TP4: 2,880 / 4 = 720 -> 768, hidden -> 3,072:
    3 x 3,072 x 768 values at 4.25 bits = 3,760,128 B, biases (2 x 768 + 3,072) x 2 B = 9,216 B.
    Triton at TP1: 2,880 stays (a multiple of 64), hidden 3,072: 3 x 3,072 x 2,880 x 4.25 / 8
    = 14,100,480 B, biases (5,760 + 3,072) x 4 B = 35,328 B. FlashInfer at TP1 pads both to 3,072."""
    assert expert_bytes_per_rank(1, 2880, 2880, 4, MARLIN) == 3_760_128 + 9_216
    assert expert_bytes_per_rank(1, 2880, 2880, 1, TRITON) == 14_100_480 + 35_328
    assert expert_bytes_per_rank(1, 2880, 2880, 1, FLASHINFER) == 3 * 3072 * 3072 * 17 // 32 + (6144 + 3072) * 4
    assert expert_bytes_per_rank(10, 2880, 2880, 1, MARLIN) == 10 * expert_bytes_per_rank(1, 2880, 2880, 1, MARLIN)


def test_weights_per_gpu_follow_the_gpus_backend():
    """gpt-oss-120b (36 layers of 128 experts) at TP2: each rank's 1,440-wide experts pad to
    1,472 on an H100 (Triton, a multiple of 64) and to 1,536 on an A100 (Marlin, 128), the hidden
    width to 3,072 on both; Marlin keeps the biases in bf16, Triton makes them float32."""
    w = estimate_weights(load_spec("openai/gpt-oss-120b"))
    count, hidden, size = w.mxfp4_experts
    assert (hidden, size) == (2880, 2880) and count == 36 * 128
    a100, h100 = get_gpu("A100-80GB"), get_gpu("H100-80GB")
    marlin, triton = w.expert_bytes_per_gpu(2, a100), w.expert_bytes_per_gpu(2, h100)
    values = 3 * 3072 * 17 // 32 * count
    assert marlin == values * 1536 + count * (2 * 1536 + 3072) * 2
    assert triton == values * 1472 + count * (2 * 1472 + 3072) * 4
    assert w.bytes_per_gpu(2, a100) - w.bytes_per_gpu(2, h100) == marlin - triton
    assert w.bytes_per_gpu(1) == w.bytes  # no GPU named: the Triton layout, the checkpoint's total


def test_a_forced_backend_takes_its_padding_on_any_gpu_that_runs_it():
    """VLLM_MXFP4_USE_MARLIN=1 on an H100 lays the experts out as an A100 does (both Marlin)."""
    w = estimate_weights(load_spec("openai/gpt-oss-120b"))
    h100, a100, b200 = get_gpu("H100-80GB"), get_gpu("A100-80GB"), get_gpu("B200")
    for tp in (1, 2, 4):
        assert w.bytes_per_gpu(tp, h100, "marlin") == w.bytes_per_gpu(tp, a100)
        assert w.bytes_per_gpu(tp, b200, "triton") == w.bytes_per_gpu(tp, h100)
    assert mxfp4_backend(h100, "flashinfer") is FLASHINFER and mxfp4_backend(None, "marlin") is MARLIN
    assert mxfp4_backend(get_gpu("MI355X"), "triton") == mxfp4_backend(get_gpu("MI355X"))


@pytest.mark.parametrize("args, says", [
    (["openai/gpt-oss-120b", "--gpu", "MI300X", "--mxfp4-backend", "marlin"], "expected auto or triton on an AMD GPU"),
    (["openai/gpt-oss-120b", "--gpu", "A100-80GB", "--mxfp4-backend", "flashinfer"], "needs compute capability 9"),
    (["openai/gpt-oss-120b", "--gpu", "H100-80GB", "--mxfp4-backend", "cutlass"], "expected one of auto, marlin"),
    (["meta-llama/Meta-Llama-3-8B", "--mxfp4-backend", "marlin"], "applies to MXFP4 experts"),
])  # fmt: skip
def test_a_backend_the_gpu_or_model_cannot_take_is_one_line(run_cli, args, says):
    code, out, err = run_cli("size", *args)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "--mxfp4-backend" in err and says in err


def test_size_says_which_kernels_the_experts_are_laid_out_for(run_cli):
    code, out, _ = run_cli("size", "openai/gpt-oss-120b", "--gpu", "A100-80GB", "--tp", "4", "--json")
    assert code == 0
    import json

    notes = json.loads(out)["notes"]
    assert any("Marlin kernels (vLLM's pick on A100-80GB)" in n and "multiple of 128" in n for n in notes)
