"""`kvplan validate` through the CLI (needs torch; skipped without it)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")


def test_validate_json(run_cli):
    """Predicted and allocated pool bytes agree to the byte for Llama-3-8B shapes on CPU."""
    code, out, err = run_cli("validate", "meta-llama/Meta-Llama-3-8B", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["ok"] is True
    assert doc["predicted_bytes"] == doc["allocated_bytes"] == 32 * 16 * 2 * 8 * 128 * 2 * 2


def test_validate_human(run_cli):
    """The human table prints the byte comparison and the verdict."""
    code, out, err = run_cli("validate", "Qwen/Qwen3-0.6B", "--layers", "1", "--block-size", "4")
    assert code == 0, err
    assert "PASS" in out and "kvplan predicted" in out


@pytest.mark.parametrize("args, field", [(["--device", "tpu"], "device"), (["--layers", "0"], "layers"),
                                         (["--kv-dtype", "fp7"], "kv-dtype")])
def test_validate_bad_options(run_cli, args, field):
    """Bad options: one line naming the option, exit 2."""
    code, out, err = run_cli("validate", "meta-llama/Meta-Llama-3-8B", *args)
    assert code == 2 and field in err and out == ""
