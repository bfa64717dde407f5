"""Model ids and check files (issue 29): a pasted blob as a model id is refused before anything is
looked up, the suggestion ranks a bounded name, a control character names the model field, and a
check file reads token counts as the command line does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvplan.errors import KvplanError
from kvplan.model import resolve as R

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cli(run_cli, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("KVPLAN_DEBUG", raising=False)
    return run_cli


def test_a_two_million_character_id_is_refused_before_any_lookup(monkeypatch):
    """It ran for minutes: the suggestion compared it with every catalog name."""
    def boom(*args, **kwargs):
        raise AssertionError("looked up")

    monkeypatch.setattr(R, "catalog_ids", boom)
    monkeypatch.setattr(R, "expand", boom)
    with pytest.raises(KvplanError, match="at most 4,096 characters, got 2,000,000") as info:
        R.resolve("x" * 2_000_000)
    assert info.value.field == "model"


def test_the_suggestion_ranks_a_bounded_name(monkeypatch):
    """difflib's ratio is quadratic in the length: it sees at most the name's first 96 characters."""
    seen = []
    real = R.difflib.SequenceMatcher
    monkeypatch.setattr(R.difflib, "SequenceMatcher", lambda junk, a, b: seen.append(len(a)) or real(junk, a, b))
    with pytest.raises(KvplanError) as info:
        R.resolve("meta-llama/Llama-3.1-8B-Instruct" + "q" * 4000)
    assert seen and max(seen) <= R.SUGGEST_CHARS
    assert "closest catalog names" in info.value.message or "kvplan models" in info.value.message


def test_an_id_of_the_limit_is_looked_up_as_usual():
    with pytest.raises(KvplanError) as info:
        R.resolve("y" * R.MAX_MODEL_ARG)
    assert "neither a file, a directory, nor a model id" in info.value.message


@pytest.mark.parametrize("char", ["\x00", "\x01", "\x1b", "\x7f", "\n"])
def test_a_control_character_names_the_model_field_not_a_file(char):
    with pytest.raises(KvplanError) as info:
        R.resolve(f"meta-llama{char}/Llama-3.1-8B")
    assert f"control character {char!r} at character 11" in info.value.message
    assert info.value.field == "model" and info.value.file is None


def test_a_folder_with_a_control_character_in_its_name_still_resolves(tmp_path):
    folder = tmp_path / "odd\x1bname"
    folder.mkdir()
    (folder / "config.json").write_text((ROOT / "models" / "meta-llama" / "Llama-3.1-8B-Instruct" /
                                         "config.json").read_text())
    assert R.resolve(str(folder)).path == folder / "config.json"


@pytest.mark.parametrize(("written", "tokens"), [("8k", 8000), ("8K", 8192), ("1.5k", 1500), ("4096", 4096)])
def test_check_files_read_token_counts_as_the_command_line(tmp_path, cli, written, tokens):
    """`tokens: 8k` was refused in a check file though `--tokens 8k` works."""
    check = tmp_path / "c.yaml"
    check.write_text("checks:\n  - name: a\n    size: {model: meta-llama/Meta-Llama-3-8B, tokens: %s, "
                     "max_num_batched_tokens: %s}\n    expect: [tokens == %d]\n" % (written, written, tokens))
    code, out, err = cli("check", str(check))
    assert code == 0, out + err  # the expectation tokens == N held
    code, out, err = cli("size", "meta-llama/Meta-Llama-3-8B", "--tokens", written, "--json")
    assert code == 0, err
    assert json.loads(out)["tokens"] == tokens


def test_parse_count_refuses_a_long_number_without_parsing_it():
    from kvplan.units import parse_count

    with pytest.raises(KvplanError, match="such as 8192"):
        parse_count("9" * 5000 + "k", field="tokens")
    assert parse_count("32K", field="tokens") == 32768
