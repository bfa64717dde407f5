"""Resolving a model argument: path, catalog, a real HF cache layout, and offline failures."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from kvplan.errors import ModelNotFoundError
from kvplan.model.resolve import catalog_ids, resolve

TINY = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 2048, "torch_dtype": "bfloat16", "vocab_size": 1000}


def make_hf_cache(cache: Path, repo_id: str, config: dict) -> Path:
    """Lay out a hub cache as huggingface_hub writes it: blobs by hash, snapshots linking to them, refs/main."""
    data = json.dumps(config).encode()
    blob_hash = hashlib.sha256(data).hexdigest()
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / blob_hash).write_bytes(data)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (snap / "config.json").symlink_to(Path("..") / ".." / "blobs" / blob_hash)
    return snap / "config.json"


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return home / "hub"


def test_hf_cache_layout_is_found(offline_cache):
    """A config in the HF cache under HF_HOME is found offline, and huggingface_hub agrees the layout is real."""
    make_hf_cache(offline_cache, "acme/tiny-llama", TINY)
    import huggingface_hub

    scanned = huggingface_hub.scan_cache_dir(offline_cache)
    assert [r.repo_id for r in scanned.repos] == ["acme/tiny-llama"]
    found = resolve("acme/tiny-llama")
    assert found.origin == "hf-cache"
    assert json.loads(found.path.read_text()) == TINY


def test_offline_miss_suggests_catalog_names(offline_cache):
    """An unknown id offline is one line that says so and offers the closest catalog names."""
    with pytest.raises(ModelNotFoundError) as err:
        resolve("meta-llama/Meta-Llama-3-8B-Instructt")
    text = str(err.value)
    assert "HF_HUB_OFFLINE" in text and "closest catalog names" in text and "Meta-Llama-3" in text


def test_local_path_and_directory(tmp_path):
    """A config.json path or a directory holding one resolves to that file first."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(TINY))
    assert resolve(str(tmp_path / "m")).origin == "path"
    assert resolve(str(tmp_path / "m" / "config.json")).origin == "path"
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError):
        resolve(str(tmp_path / "empty"))


def test_catalog_resolves_case_insensitively():
    """The bundled catalog answers before any cache or hub, whatever the case."""
    ids = catalog_ids()
    assert "meta-llama/Meta-Llama-3-8B" in ids
    found = resolve("META-LLAMA/meta-llama-3-8b")
    assert found.origin == "catalog" and found.name == "meta-llama/Meta-Llama-3-8B"


@pytest.mark.parametrize("bad", ["../../etc/passwd-nope", "a/b/c", "org/..", "", "x" * 300])
def test_path_traversal_and_malformed_ids(bad, offline_cache):
    """Ids that are not org/name never reach the cache or hub; they fail with one line."""
    with pytest.raises(ModelNotFoundError) as err:
        resolve(bad)
    assert "\n" not in str(err.value)


def test_catalog_is_not_a_hub_call(monkeypatch):
    """Resolving a catalog model does not import huggingface_hub (cold start)."""
    import sys

    monkeypatch.delitem(sys.modules, "huggingface_hub", raising=False)
    resolve("meta-llama/Meta-Llama-3-8B")
    assert "huggingface_hub" not in sys.modules


@pytest.mark.parametrize("arg, catalog", [
    ("meta-llama/Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B"),  # the hub's rename
    ("Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B"),  # a bare name
    ("CohereLabs/c4ai-command-r-v01", "CohereForAI/c4ai-command-r-v01"),  # a renamed org
    ("neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8", "meta-llama/Llama-3.1-8B-Instruct"),  # another org's re-upload
])
def test_usual_variants_resolve_offline_with_a_note(arg, catalog, offline_cache):
    from kvplan.model.resolve import load_spec

    found = resolve(arg)
    assert found.origin == "alias" and found.path.parent.name == catalog.split("/")[1]
    assert catalog in load_spec(arg).dtype_note


def test_a_quantized_reupload_gets_its_conventional_config(offline_cache):
    """Qwen's -GPTQ-Int4 uploads carry bits 4, groups of 128: the 72B's linear layers at
    4 + 16/128 bits, about 3.6x lighter than bf16."""
    from kvplan.model.resolve import load_spec
    from kvplan.model.weights import estimate_weights

    quant = estimate_weights(load_spec("Qwen/Qwen2.5-72B-Instruct-GPTQ-Int4"))
    plain = estimate_weights(load_spec("Qwen/Qwen2.5-72B-Instruct"))
    assert quant.scheme == "gptq" and 3.0 < plain.bytes / quant.bytes < 4.0
    assert "GPTQ 4-bit" in load_spec("Qwen/Qwen2.5-72B-Instruct-GPTQ-Int4").dtype_note


def test_a_cached_repo_wins_over_an_alias(offline_cache):
    """A user's own upload in the HF cache is read as it is, not as the catalog's look-alike."""
    make_hf_cache(offline_cache, "meta-llama/Llama-3.1-70B", TINY)
    assert resolve("meta-llama/Llama-3.1-70B").origin == "hf-cache"


def test_suggestions_rank_the_same_family_and_size_first(offline_cache):
    with pytest.raises(ModelNotFoundError) as err:
        resolve("meta-llama/Llama-3.1-13B-Instruct")
    first = str(err.value).split("closest catalog names: ")[1].split(",")[0]
    assert "13b" in first.lower() and "llama" in first.lower()
