"""`kvplan size`, `kvplan models` and `kvplan gpus` through the CLI, in human and JSON modes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def test_size_json_llama3(run_cli):
    """The mission's model gives the lesson's 128 KiB per token and 1 GiB at 8,192 tokens."""
    code, out, err = run_cli("size", "meta-llama/Meta-Llama-3-8B", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["bytes_per_token"] == 131_072 and data["kv_bytes"] == 2**30 and data["tokens"] == 8192


def test_size_human_with_gpu(run_cli):
    """The human table shows units and vLLM's two log lines."""
    code, out, err = run_cli("size", "meta-llama/Meta-Llama-3-8B", "--kv-memory", "11.12GiB")
    assert code == 0, err
    assert "131,072 B (128 KiB)" in out
    assert "GPU KV cache size: 91,088 tokens" in out  # int(5693 / 512 * 8192)
    assert "Maximum concurrency for 8,192 tokens per request: 11.12x" in out


def test_size_json_gpu_keys(run_cli):
    """With a GPU the JSON carries num_blocks, max_tokens and max_concurrency."""
    code, out, _ = run_cli("size", "meta-llama/Meta-Llama-3-8B", "--gpu", "h100-80gb", "--tokens", "4096", "--json")
    data = json.loads(out)
    assert code == 0 and data["gpu"] == "H100-80GB"
    assert data["num_blocks"] > 0 and data["max_tokens"] == (data["num_blocks"] - 1) * 16
    assert data["max_concurrency"] == data["max_tokens"] // 4096


def test_size_json_is_deterministic(run_cli):
    """Same arguments, byte-identical JSON."""
    a = run_cli("size", "deepseek-ai/DeepSeek-V3", "--tp", "8", "--gpu", "H200", "--json")[1]
    b = run_cli("size", "deepseek-ai/DeepSeek-V3", "--tp", "8", "--gpu", "H200", "--json")[1]
    assert a == b and json.loads(a)["bytes_per_token"] == 70_272


def test_nothing_fits_message(run_cli):
    """A model too large for the GPU says so instead of printing nonsense."""
    code, out, _ = run_cli("size", "meta-llama/Meta-Llama-3-70B", "--gpu", "L4", "--engine", "none")
    assert code == 0 and "Nothing fits" in out
    code, out, _ = run_cli("size", "meta-llama/Meta-Llama-3-70B", "--gpu", "L4")
    assert code == 0 and "vLLM would not start" in " ".join(out.split()) and "CUDA out of memory" in " ".join(out.split())


def test_models_lists_catalog(run_cli):
    """`kvplan models --json` lists at least 30 models, the mission's among them."""
    code, out, _ = run_cli("models", "--json")
    ids = [m["model"] for m in json.loads(out)["models"]]
    assert code == 0 and len(ids) >= 30 and "meta-llama/Meta-Llama-3-8B" in ids and "facebook/opt-13b" in ids


def test_gpus_lists_required(run_cli):
    """The GPU catalog has every GPU the issue names."""
    code, out, _ = run_cli("gpus", "--json")
    names = {g["name"] for g in json.loads(out)["gpus"]}
    assert code == 0
    assert {"A10G", "L4", "L40S", "A100-40GB", "A100-80GB", "H100-80GB", "H200", "B200", "MI300X"} <= names


@pytest.mark.parametrize("args, needle", [
    (["size", "nobody/no-such-model"], "HF_HUB_OFFLINE"),
    (["size", "meta-llama/Llama-3-13B"], "closest catalog names: meta-llama/"),
    (["size", "meta-llama/Meta-Llama-3-8B", "--tokens", "-5"], "tokens"),
    (["size", "meta-llama/Meta-Llama-3-8B", "--tokens", "0"], "tokens"),
    (["size", "meta-llama/Meta-Llama-3-8B", "--kv-dtype", "fp7"], "--kv-dtype"),
    (["size", "meta-llama/Meta-Llama-3-8B", "--gpu", "H1000"], "gpu"),
    (["size", "meta-llama/Meta-Llama-3-8B", "--kv-memory", "lots"], "--kv-memory"),
    (["size", "meta-llama/Meta-Llama-3-8B", "--kv-memory", "-3GiB"], "--kv-memory"),
    (["size", "meta-llama/Meta-Llama-3-8B", "--tp", "3"], "tp"),
    (["size", "meta-llama/Meta-Llama-3-8B", "--block-size", "0"], "block-size"),
    (["size", "meta-llama/Meta-Llama-3-8B", "--tokens", "many"], "--tokens"),
])
def test_bad_input_one_line_exit_2(run_cli, args, needle, monkeypatch):
    """Bad input: exit code 2, one line on stderr naming the field, nothing on stdout."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, out, err = run_cli(*args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("kvplan: error:") and needle in err


def test_malformed_and_incomplete_configs(run_cli, tmp_path):
    """A broken config.json names the file (and line or field)."""
    bad = tmp_path / "bad" / "config.json"
    bad.parent.mkdir()
    bad.write_text("{ not json")
    code, _, err = run_cli("size", str(bad))
    assert code == 2 and str(bad) in err and "JSON" in err
    partial = tmp_path / "partial" / "config.json"
    partial.parent.mkdir()
    partial.write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    code, _, err = run_cli("size", str(partial))
    assert code == 2 and "num_hidden_layers" in err and str(partial) in err


def _run(args, **env):
    return subprocess.run([sys.executable, "-m", "kvplan", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1", **env}, timeout=60)


def test_debug_env_shows_traceback():
    """KVPLAN_DEBUG=1 trades the one-line error for the traceback."""
    quiet = _run(["size", "nobody/none"])
    loud = _run(["size", "nobody/none"], KVPLAN_DEBUG="1")
    assert quiet.returncode == 2 and "Traceback" not in quiet.stderr
    assert "Traceback" in loud.stderr


@pytest.mark.parametrize("engine", [[], ["--engine", "sglang"]])
def test_size_cold_path_imports_nothing_heavy(engine):
    """`kvplan size` on a catalog model imports no torch, matplotlib, numpy or huggingface_hub."""
    args = ["size", "meta-llama/Meta-Llama-3-8B", "--gpu", "H100-80GB", "--json", *engine]
    code = ("import sys\nfrom kvplan.cli import main\n"
            f"try:\n    main({args!r})\n"
            "except SystemExit:\n    pass\n"
            "heavy = [m for m in ('torch', 'matplotlib', 'numpy', 'huggingface_hub') if m in sys.modules]\n"
            "print('HEAVY', heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60).stdout
    assert "HEAVY []" in out
