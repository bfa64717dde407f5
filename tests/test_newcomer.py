"""What a new user trips on first: units, lists, versions, help, and what to do when nothing fits."""

from __future__ import annotations

import json

import pytest

from kvplan.errors import UsageError
from kvplan.units import parse_count, parse_size


@pytest.mark.parametrize("text, tokens", [("8192", 8192), ("32k", 32_000), ("32K", 32_768), ("128K", 131_072),
                                          ("25.6k", 25_600), ("1m", 1_000_000), (" 4k ", 4000)])
def test_token_counts_read_as_vllm_reads_them(text, tokens):
    """vLLM's human_readable_int: lower case decimal, upper case binary."""
    assert parse_count(text, field="--tokens") == tokens


@pytest.mark.parametrize("text", ["2.5K", "x", "", "32kk", "1.5", "-4", "0"])
def test_bad_token_counts_are_one_usage_error(text):
    with pytest.raises(UsageError, match="--tokens"):
        parse_count(text, field="--tokens")


def test_a_size_without_a_unit_says_which_unit_to_add():
    with pytest.raises(UsageError, match="has no unit; write 20GiB"):
        parse_size("20", field="--kv-memory", require_unit=True)
    assert parse_size("20GiB", field="--kv-memory", require_unit=True) == 20 * 2**30
    assert parse_size("20B", field="--kv-memory", require_unit=True) == 20
    assert parse_size(20, field="kv_memory") == 20  # a YAML integer stays bytes


def test_kvplan_size_takes_32k_and_refuses_a_bare_size(run_cli):
    code, out, _ = run_cli("size", "meta-llama/Llama-3.1-8B-Instruct", "--tokens", "32k", "--json")
    assert code == 0 and json.loads(out)["tokens"] == 32_000
    code, out, err = run_cli("size", "meta-llama/Llama-3.1-8B-Instruct", "--kv-memory", "20")
    assert code == 2 and out == "" and "20GiB" in err and err.count("\n") == 1


def test_a_block_size_range_must_run_over_powers_of_two(run_cli):
    code, _, err = run_cli("simulate", "workloads/lesson.yaml", "--block-sizes", "3-40")
    assert code == 2 and "powers of two" in err and "3,8,40" in err


def test_version_and_whole_command_descriptions(run_cli, monkeypatch):
    from kvplan import __version__

    code, out, _ = run_cli("--version")
    assert code == 0 and out.startswith(f"kvplan {__version__}") and "0.29" in out
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run_cli("--help")
    commands = out.split("Commands:")[1]
    assert code == 0 and "..." not in commands
    assert "Replay a workload through contiguous and paged allocators and compare them." in " ".join(out.split())


@pytest.mark.parametrize("command", ["size", "simulate", "plan", "step"])
def test_option_defaults_read_plainly_in_help(run_cli, monkeypatch, command):
    """Every option's default shows as "[default: ...]", never with typer's markup escape "\\["."""
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run_cli(command, "--help")
    assert code == 0 and "[default:" in out and "\\[" not in out


def test_gpus_and_tp_degrees_compare_in_one_table(run_cli):
    code, out, _ = run_cli("size", "meta-llama/Meta-Llama-3.1-70B", "--gpu", "H100-80GB,H200", "--tp", "1,2,4",
                           "--tokens", "8192", "--json")
    rows = json.loads(out)["grid"]
    assert code == 0 and [(r["gpu"], r["tp"]) for r in rows] == [
        ("H100-80GB", 1), ("H100-80GB", 2), ("H100-80GB", 4), ("H200", 1), ("H200", 2), ("H200", 4)]
    by = {(r["gpu"], r["tp"]): r for r in rows}
    assert not by[("H100-80GB", 1)]["fits"] and by[("H100-80GB", 4)]["fits"]
    # more GPUs in the group leave more KV on each
    assert by[("H200", 4)]["kv_pool_bytes"] > by[("H200", 2)]["kv_pool_bytes"]


def test_a_grid_row_that_cannot_split_says_why_and_the_rest_run(run_cli):
    code, out, _ = run_cli("size", "meta-llama/Meta-Llama-3.1-70B", "--gpu", "H200", "--tp", "2,3", "--json")
    rows = json.loads(out)["grid"]
    assert code == 0 and rows[1]["fits"] is False and "cannot be split" in rows[1]["reason"]


def test_when_nothing_fits_kvplan_names_what_would(run_cli):
    code, out, _ = run_cli("size", "meta-llama/Meta-Llama-3.1-70B", "--gpu", "H100-80GB", "--tokens", "8192", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["fits"] is False
    tp = doc["would_fit"]["tp"]
    code, out, _ = run_cli("size", "meta-llama/Meta-Llama-3.1-70B", "--gpu", "H100-80GB", "--tokens", "8192",
                           "--tp", str(tp), "--json")
    assert json.loads(out)["fits"] is True
    if tp > 2:
        _, out, _ = run_cli("size", "meta-llama/Meta-Llama-3.1-70B", "--gpu", "H100-80GB", "--tokens", "8192",
                            "--tp", str(tp // 2), "--json")
        assert json.loads(out)["fits"] is False  # the smallest degree that fits


def test_concurrency_is_shown_at_common_context_lengths(run_cli):
    code, out, _ = run_cli("size", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-80GB", "--tokens", "16384",
                           "--json")
    at = json.loads(out)["concurrency_at"]
    assert code == 0 and set(at) == {"4096", "8192", "32768", "131072"}
    assert at["4096"] > at["8192"] > at["32768"] > at["131072"] > 0


def test_examples_are_listed_and_run_by_name(run_cli):
    code, out, _ = run_cli("examples", "--json")
    names = {e["name"]: e for e in json.loads(out)["examples"]}
    assert code == 0 and {"lesson", "kwon-sharegpt", "azure-conv"} <= set(names) and "checks" not in names
    assert names["azure-conv"]["needs_trace"] and not names["lesson"]["needs_trace"]
    code, by_name, _ = run_cli("simulate", "lesson", "--json")
    code2, by_path, _ = run_cli("simulate", "workloads/lesson.yaml", "--json")
    assert code == code2 == 0 and json.loads(by_name)["results"] == json.loads(by_path)["results"]


def test_the_schema_accepts_every_bundled_workload_and_refuses_unknown_keys(run_cli):
    jsonschema = pytest.importorskip("jsonschema")
    import yaml

    from kvplan.workload.examples import list_examples

    code, out, _ = run_cli("schema")
    schema = json.loads(out)
    assert code == 0 and schema["$schema"].endswith("2020-12/schema")
    validator = jsonschema.Draft202012Validator(schema)
    for example in list_examples():
        doc = yaml.safe_load(example.path.read_text(encoding="utf-8"))
        errors = list(validator.iter_errors(doc))
        assert not errors, (example.name, errors[:1])
    bad = yaml.safe_load((list_examples()[0].path).read_text(encoding="utf-8")) | {"schedular": {}}
    assert list(validator.iter_errors(bad))
    for section in ({"prefix": {"enabled": True}}, {"sampling": {"mode": "greedy"}}):  # the typed sections too
        assert list(validator.iter_errors(yaml.safe_load(list_examples()[0].path.read_text(encoding="utf-8"))
                                          | section)), section
    wrong = {"pool": {"slots": 100}, "requests": {"count": 1, "prompt": {"dist": "fixed", "value": 5},
                                                   "output": {"dist": "gaussian"}}}
    assert list(validator.iter_errors(wrong))


def test_a_serve_run_from_flags_alone(run_cli):
    code, out, err = run_cli("simulate", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "L40S", "--rate",
                             "10", "--prompt", "1000", "--output", "200", "--count", "300", "--json",
                             "--show-workload")
    doc = json.loads(out)
    assert code == 0 and doc["num_requests"] == 300 and doc["results"][0]["completed"] == 300
    assert "rate: 10.0" in err and "value: 1000" in err  # the YAML it ran, on stderr beside --json
    code, _, err = run_cli("simulate", "workloads/lesson.yaml", "--model", "x")
    assert code == 2 and "--model" in err
    code, _, err = run_cli("simulate")
    assert code == 2 and "kvplan examples" in err



def reads_at_80_columns(out: str) -> bool:
    """No cell cut with an ellipsis, and no line wider than 80 columns."""
    return "…" not in out and max(len(line) for line in out.splitlines()) <= 80

def test_serve_tables_never_cut_a_number_at_80_columns(run_cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run_cli("simulate", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-80GB",
                           "--count", "200")
    assert code == 0 and reads_at_80_columns(out)
    assert "TPOT ms" in out and "preempted" in out


def test_the_serve_plot_names_the_workload_and_shares_its_time_axis(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from kvplan.report import serve_view

    seen = {}
    real_savefig = plt.Figure.savefig

    def spy(fig, path, **kw):
        seen["title"] = fig._suptitle.get_text()
        axes = fig.get_axes()
        seen["shared"] = all(a.get_shared_x_axes().joined(axes[0], a) for a in axes)
        return real_savefig(fig, path, **kw)

    monkeypatch.setattr(plt.Figure, "savefig", spy)
    from kvplan.experiments import load
    from kvplan.sim.engine import simulate

    wl = load("workloads/kwon-sharegpt.yaml")
    from dataclasses import replace

    wl = replace(wl, num_requests=50)
    results = [simulate(wl, spec) for spec in wl.allocators[-2:]]
    serve_view.plot_serve(results, tmp_path / "p.png", wl.name)
    assert seen["title"].startswith("kwon-sharegpt:") and "paged-B16" in seen["title"] and seen["shared"]


def test_capacity_and_prefix_tables_fold_rather_than_cut_at_80_columns(run_cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run_cli("simulate", "lesson", "--block-sizes", "1-64")
    assert code == 0 and reads_at_80_columns(out)
    assert "utilization" in out and "129,887" in out


def test_flag_only_runs_use_vllms_start_up_pool_and_name_their_flags(run_cli):
    from kvplan.model.size import size

    code, out, err = run_cli("simulate", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "L40S",
                             "--count", "20", "--json", "--show-workload")
    pool = size("meta-llama/Llama-3.1-8B-Instruct", gpu="L40S", tokens=1200).report.kv_pool_bytes
    assert code == 0 and f"kv_memory: {pool}" in err
    for args, flag in ((["--prompt", "200k"], "--prompt"), (["--tp", "0"], "--tp"), (["--gpu", ""], "--gpu"),
                       (["--rate", "nan"], "--rate")):
        code, _, err = run_cli("simulate", "--model", "meta-llama/Llama-3.1-8B-Instruct", *args)
        assert code == 2 and err.startswith(f"kvplan: error: {flag}") and "/tmp" not in err, (args, err)
    code, _, err = run_cli("simulate", "lesson", "--count", "3")
    assert code == 2 and "--count" in err


@pytest.mark.parametrize("args, field", [
    (["--gpu", "H100-80GB,H200", "--engine", "bogus"], "--engine"),
    (["--gpu", "H100-80GB,H200", "--tokens", "abc"], "--tokens"),
    (["--gpu", "H100-80GB,H200", "--kv-dtype", "bogus"], "--kv-dtype"),
    (["--gpu", "H100-80GB,H200", "--vllm-version", "abc"], "--vllm-version"),
    (["--tp", "1,2"], "--tp"),
    (["--tp", "\u00b2"], "--tp"),
])
def test_a_comparison_refuses_bad_options_like_a_single_run(run_cli, args, field):
    code, out, err = run_cli("size", "meta-llama/Llama-3.1-8B-Instruct", *args)
    assert code == 2 and out == "" and field in err and err.count("\n") == 1


def test_a_rate_sweep_folds_at_80_columns(run_cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run_cli("simulate", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--count", "50",
                           "--rates", "1,2,4,8,16,32,64,128,256")
    assert code == 0 and reads_at_80_columns(out)
    assert "256/s" in out and "max rate under bound" in out
