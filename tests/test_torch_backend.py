"""The torch backend: real pools sized to the byte as kvplan predicts, paged attention equal to dense."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from tests.conftest import torch_one_thread  # noqa: E402

from kvplan.backends.torch import ValidationResult, run_validation  # noqa: E402
from kvplan.backends.torch.attention import (  # noqa: E402
    dense_attention,
    paged_attention_reference,
    paged_attention_sdpa,
)
from kvplan.backends.torch.cache import PagedKVCache  # noqa: E402
from kvplan.backends.torch.codec import codec_for  # noqa: E402
from kvplan.backends.torch.flex import flex_available, paged_attention_flex  # noqa: E402
from kvplan.errors import UsageError  # noqa: E402
from kvplan.model.dtypes import DTYPE_BITS  # noqa: E402
from kvplan.model.layout import KVLayout, LayerGroup  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    yield from torch_one_thread(torch)


def layout_of(*groups: LayerGroup, kv_dtype: str = "fp32") -> KVLayout:
    return KVLayout("test", kv_dtype, 1, tuple(groups), 4096)


def attn_group(kv_heads: int, *, dtype: str = "fp32", window: int | None = None, head_dim: int = 8) -> LayerGroup:
    return LayerGroup("sliding" if window else "full", 1, num_kv_heads=kv_heads, head_dim=head_dim,
                      v_head_dim=head_dim, window=window, dtype_bits=DTYPE_BITS[dtype])


def grow_in_turn(cache: PagedKVCache, lengths: dict[str, int], gen) -> dict[str, tuple]:
    """Grow requests one token at a time in turn (so small blocks interleave); keep what was written."""
    pool = cache.kv_layers[0][0]
    g = pool.group
    written = {rid: ([], []) for rid in lengths}
    for rid in lengths:
        cache.add_request(rid, [(torch.zeros(0, g.num_kv_heads, g.head_dim),) * 2])
    for step in range(max(lengths.values())):
        for rid, n in lengths.items():
            if step < n:
                k, v = torch.randn(2, 1, g.num_kv_heads, g.head_dim, generator=gen)
                cache.append(rid, [(k, v)])
                written[rid][0].append(pool.codec.round_trip(k, torch.float32))
                written[rid][1].append(pool.codec.round_trip(v, torch.float32))
    return {rid: (torch.cat(ks), torch.cat(vs)) for rid, (ks, vs) in written.items()}


def all_paths(q, cache: PagedKVCache, rids, window):
    pool = cache.kv_layers[0][0]
    tables, lens = cache.block_tables(rids)
    k_pool, v_pool = pool.kv(0)
    kw = dict(codec=pool.codec, window=window, latent=pool.group.kind == "mla")
    out = {"reference": paged_attention_reference(q, k_pool, v_pool, tables, lens, **kw),
           "sdpa": paged_attention_sdpa(q, k_pool, v_pool, tables, lens, **kw)}
    if flex_available():
        out["flex"] = paged_attention_flex(q, k_pool, v_pool, tables, lens, **kw)
    return out


# -- the lesson's "Proof it works", on real tensors ------------------------------------------------

@pytest.mark.parametrize("block_size", [1, 4, 16, 64])
@pytest.mark.parametrize("heads", [(8, 2), (8, 1)], ids=["gqa", "mqa"])
@pytest.mark.parametrize("window", [None, 5])
def test_reading_through_the_table_equals_reading_one_array(block_size, heads, window):
    """Fails if a position maps to the wrong block or slot, a partly filled last block is misread,
    a stale slot is read, GQA/MQA heads are grouped wrongly, or the window mask is off by one."""
    q_heads, kv_heads = heads
    gen = torch.Generator().manual_seed(block_size)
    cache = PagedKVCache(layout_of(attn_group(kv_heads, window=window)), num_blocks=64, block_size=block_size,
                         max_seqs=3)
    written = grow_in_turn(cache, {"x": 13, "y": 7, "z": 1}, gen)
    rids = list(written)
    q = torch.randn(len(rids), 1, q_heads, 8, generator=gen)
    dense = dense_attention(q, [written[r][0] for r in rids], [written[r][1] for r in rids], window=window)
    for path, out in all_paths(q, cache, rids, window).items():
        assert (out.double() - dense).abs().max() < 1e-5, path


@pytest.mark.parametrize("window", [None, 6])
def test_prefill_with_causal_mask_equals_dense(window):
    """A whole prompt's queries (causal) and a chunked-prefill batch of 8 queries per request."""
    gen = torch.Generator().manual_seed(7)
    cache = PagedKVCache(layout_of(attn_group(2, window=window)), num_blocks=32, block_size=4, max_seqs=3)
    written = grow_in_turn(cache, {"a": 37, "b": 8, "c": 20}, gen)
    for rids, n_q in ((["a"], 37), (["a", "b", "c"], 8)):
        q = torch.randn(len(rids), n_q, 4, 8, generator=gen)
        dense = dense_attention(q, [written[r][0] for r in rids], [written[r][1] for r in rids], window=window)
        for path, out in all_paths(q, cache, rids, window).items():
            assert (out.double() - dense).abs().max() < 1e-5, (path, n_q)


def test_a_wrong_slot_is_caught():
    """The comparison can fail: one corrupted token in a partly filled last block breaks it."""
    gen = torch.Generator().manual_seed(3)
    cache = PagedKVCache(layout_of(attn_group(2)), num_blocks=16, block_size=4, max_seqs=2)
    written = grow_in_turn(cache, {"x": 13, "y": 7}, gen)
    block, offset = cache.manager.slot_of("x", 12)
    cache.kv_layers[0][0].tensors["v"][0][block, offset] += 1.0
    q = torch.randn(2, 1, 4, 8, generator=gen)
    dense = dense_attention(q, [written[r][0] for r in "xy"], [written[r][1] for r in "xy"])
    for path, out in all_paths(q, cache, ["x", "y"], None).items():
        assert (out.double() - dense).abs().max() > 1e-3, path


def test_copy_on_write_copies_reported_by_the_allocator_are_made():
    """Fork a 6-token prompt (B=4): the parent's write copies block 1 into block 2 (the lesson's
    sharing table) and both sequences read back their own tokens; skipping the copy would not."""
    gen = torch.Generator().manual_seed(5)
    cache = PagedKVCache(layout_of(attn_group(2)), num_blocks=6, block_size=4, max_seqs=2)
    prompt = torch.randn(2, 6, 2, 8, generator=gen)
    cache.add_request("s1", [(prompt[0], prompt[1])])
    cache.fork("s1", "s2")
    own = {rid: torch.randn(2, 1, 2, 8, generator=gen) for rid in ("s1", "s2")}
    where = cache.append("s1", [(own["s1"][0], own["s1"][1])])
    cache.append("s2", [(own["s2"][0], own["s2"][1])])
    assert where.copy == (1, 2) and cache.copies == [(1, 2)]
    assert cache.manager.tables == {"s1": [0, 2], "s2": [0, 1]}
    k_pool = cache.kv_layers[0][0].tensors["k"][0].flatten(0, 1)
    for rid in ("s1", "s2"):
        assert torch.equal(k_pool[cache.slots(rid)], torch.cat([prompt[0], own[rid][0]]))


def test_chunked_append_honours_copy_on_write():
    """append_tokens onto a shared, partly filled block copies it first."""
    cache = PagedKVCache(layout_of(attn_group(1)), num_blocks=8, block_size=4, max_seqs=2)
    first = torch.randn(3, 1, 8)
    cache.add_request("p", [(first, first)])
    cache.fork("p", "c")
    more = torch.randn(5, 1, 8)
    assert cache.append_tokens("c", [(more, more)]) == (0, 1)
    k_pool = cache.kv_layers[0][0].tensors["k"][0].flatten(0, 1)
    assert torch.equal(k_pool[cache.slots("c")], torch.cat([first, more]))
    assert torch.equal(k_pool[cache.slots("p")], first)


# -- storage formats and byte accounting -----------------------------------------------------------

@pytest.mark.parametrize("kv_dtype", ["fp32", "bf16", "fp16", "fp8", "int8", "int4"])
def test_every_kv_dtype_allocates_exactly_the_predicted_bytes_and_reads_back(kv_dtype):
    """numel x element_size equals kvplan's bits-based bytes (int4 packs two per byte), and the pool
    returns exactly the stored values, which attend like dense attention."""
    group = attn_group(2, dtype=kv_dtype)
    cache = PagedKVCache(layout_of(group, kv_dtype=kv_dtype), num_blocks=10, block_size=4, max_seqs=2)
    pool = cache.pools[0]
    assert pool.allocated_bytes == pool.predicted_bytes == 10 * 4 * group.bytes_per_token
    assert group.bytes_per_token == 2 * 2 * 8 * DTYPE_BITS[kv_dtype] // 8
    written = grow_in_turn(cache, {"x": 9, "y": 4}, torch.Generator().manual_seed(1))
    for rid, (keys, _) in written.items():
        got = pool.codec.decode(pool.codec.unraw(pool.codec.raw(pool.tensors["k"][0]).flatten(0, 1)[cache.slots(rid)]),
                                torch.float32)
        assert torch.equal(got, keys)
    q = torch.randn(2, 1, 4, 8).to(pool.codec.compute)
    dense = dense_attention(q, [written[r][0] for r in "xy"], [written[r][1] for r in "xy"])
    tol = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 5e-2}[pool.codec.compute]
    for path, out in all_paths(q, cache, ["x", "y"], None).items():
        assert (out.double() - dense).abs().max() < (1e-5 if path == "reference" else tol), path


def test_int4_packs_two_values_per_byte_low_nibble_first():
    codec = codec_for("int4")
    packed = codec.encode(torch.tensor([[-4.0, 3.5, 0.0, -0.5]]))
    assert packed.dtype == torch.uint8 and packed.tolist() == [[0 | 15 << 4, 8 | 7 << 4]]
    assert codec.decode(packed, torch.float32).tolist() == [[-4.0, 3.5, 0.0, -0.5]]


def test_mla_latent_and_state_pools():
    """An MLA latent is one tensor per layer attended as one shared head; recurrent state has a slot
    per sequence, copied on fork and released on free."""
    mla = LayerGroup("mla", 2, latent_dim=16, dtype_bits=16)
    state = LayerGroup("state", 1, state_elems=10, dtype_bits=16, state_dtype_bits=16)
    cache = PagedKVCache(layout_of(mla, state, kv_dtype="bf16"), num_blocks=4, block_size=4, max_seqs=2)
    assert [p.shapes for p in cache.pools] == [{"latent": (4, 4, 16)}, {"state": (2, 10)}]
    assert [p.allocated_bytes for p in cache.pools] == [4 * 4 * 16 * 2 * 2, 2 * 10 * 2]
    latent = torch.randn(2, 5, 16)
    s0 = torch.randn(10)
    cache.add_request("a", [(latent[0], None), (latent[1], None)], [s0])
    cache.fork("a", "b")
    assert torch.equal(cache.read_state("b", 0), s0.to(torch.bfloat16).float())
    with pytest.raises(ValueError, match="no free state slot"):
        cache.fork("a", "c")
    cache.free("b")
    cache.fork("a", "c")
    q = torch.randn(1, 1, 4, 16).to(torch.bfloat16)
    stored = latent[0].to(torch.bfloat16).float()
    dense = dense_attention(q, [stored], [stored])
    for path, out in all_paths(q, cache, ["a"], None).items():
        assert (out.double() - dense).abs().max() < (1e-5 if path == "reference" else 5e-2), path


# -- run_validation ----------------------------------------------------------------------------------

def test_llama3_8b_validation_agrees_to_the_byte(capsys):
    """Two real-shaped Llama-3-8B layers (8 KV heads x 128, bf16): 32 blocks x 16 x 8,192 B."""
    from kvplan.report.validate_view import render_validation

    result = run_validation("meta-llama/Meta-Llama-3-8B")
    assert isinstance(result, ValidationResult) and result.ok
    assert (result.num_blocks, result.layout_bytes_per_token) == (32, 2 * 4096)
    assert result.predicted_bytes == result.allocated_bytes == 32 * 16 * 8192 == 4_194_304
    assert result.cuda_measured_bytes is None and result.cow_copies == 1
    assert result.groups[0].shapes == {"k": (32, 16, 8, 128), "v": (32, 16, 8, 128)}
    d = result.to_dict()
    assert list(d) == ["model", "kv_dtype", "storage_dtype", "compute_dtype", "device", "tp", "block_size",
                       "num_blocks", "max_seqs", "request_lengths", "seed", "model_layers", "layer_kinds",
                       "q_heads", "layout_bytes_per_token", "layout_state_bytes", "predicted_bytes",
                       "allocated_bytes", "cuda_measured_bytes", "cuda_rounding_bytes", "cow_copies", "notes",
                       "ok", "groups"]
    assert set(d["groups"][0]["errors"]) == {"reference", "sdpa", "flex"}
    render_validation(result)
    out = capsys.readouterr().out
    assert "4,194,304" in out and "PASS" in out


@pytest.mark.parametrize("model, kinds", [
    ("openai/gpt-oss-20b", ("sliding", "full")),  # window 128 < the 257-token request
    ("ai21labs/Jamba-v0.1", ("state", "full")),
    ("deepseek-ai/DeepSeek-V2-Lite", ("mla", "mla")),
])
def test_hybrid_window_and_latent_models_validate(model, kinds):
    """The layer-kind mix is kept in 2 layers, and every kind's pool agrees to the byte (fp32 KV,
    so the attention check is tight)."""
    result = run_validation(model, request_lengths=(20, 3, 140), block_size=8, kv_dtype="fp32")
    assert result.layer_kinds == kinds and result.ok, result.to_dict()
    assert all(g.predicted_bytes == g.allocated_bytes for g in result.groups)


def test_tp_and_quantized_kv_validate():
    """TP=2 halves the KV heads a GPU holds; int4 halves the bytes again, stored packed."""
    result = run_validation("meta-llama/Meta-Llama-3-8B", tp=2, kv_dtype="int4", request_lengths=(5, 9))
    assert result.ok and result.q_heads == 16 and result.storage_dtype == "uint8"
    assert result.groups[0].shapes["k"][2:] == (4, 64)  # 4 KV heads, 128 values in 64 bytes
    assert result.layout_bytes_per_token == 2 * 2 * 4 * 128 // 2


@pytest.mark.parametrize("kwargs, field", [
    (dict(device="tpu"), "device"),
    (dict(num_blocks=3), "num-blocks"),
    (dict(request_lengths=(4, 0)), "request-lengths"),
    (dict(layers=0), "layers"),
    (dict(kv_dtype="fp6"), "kv-dtype"),
])
def test_bad_arguments_are_usage_errors(kwargs, field):
    with pytest.raises(UsageError) as info:
        run_validation("meta-llama/Meta-Llama-3-8B", **kwargs)
    assert info.value.field == field


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without CUDA")
def test_cuda_without_a_gpu_is_a_usage_error():
    with pytest.raises(UsageError, match="CUDA is not available"):
        run_validation("meta-llama/Meta-Llama-3-8B", device="cuda")


def test_importing_the_backend_without_torch_is_a_one_line_kvplan_error():
    """With torch unimportable, the package raises a KvplanError the CLI prints, not ImportError."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "from kvplan.errors import KvplanError\n"
            "try:\n    import kvplan.backends.torch\nexcept KvplanError as e:\n    print(type(e).__name__, '|', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out == "TorchNotInstalled | torch is not installed; pip install 'kvplan[torch]'\n"


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("kv_dtype", ["auto", "fp8"])
def test_cuda_memory_allocated_matches_the_prediction(kv_dtype):
    """On a GPU, memory_allocated grows by the predicted bytes plus reported allocator rounding."""
    result = run_validation("meta-llama/Meta-Llama-3-8B", device="cuda", kv_dtype=kv_dtype, num_blocks=2048)
    assert result.ok, result.to_dict()
    assert result.predicted_bytes == result.allocated_bytes == 2048 * 16 * result.layout_bytes_per_token
    assert 0 <= result.cuda_rounding_bytes == result.cuda_measured_bytes - result.allocated_bytes
