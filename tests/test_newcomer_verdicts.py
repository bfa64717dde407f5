"""A newcomer's second hour: verdicts that were missing, unexplained or wrong (issue 29).

Overload: a serve run or a fleet whose requests arrive faster than it admits them says so, in one
warning line of the report and an "overload" entry of the JSON (kvplan/sim/overload.py)."""

from __future__ import annotations

import json

import pytest

# 8 sequences at once, 1 prefill step and 10-30 decode steps a request: about 8 / 21 = 0.38
# requests a step is what this server sustains (time in steps: no GPU, exact and fast)
STEP_SERVE = """\
name: load
seed: {seed}
experiment: serve
pool: {{slots: 100000}}
requests:
  count: 200
  prompt: {{dist: uniform, low: 8, high: 24}}
  output: {{dist: uniform, low: 10, high: 30}}
  arrival: {{process: poisson, rate: {rate}}}
allocators:
  - {{kind: paged, block_size: 16}}
scheduler: {{max_num_seqs: 8, max_model_len: 64}}
"""
CAPACITY = 0.38

# two L40S replicas of 16 sequences each: about 20 requests/s between them
FLEET = """\
name: fleet
experiment: fleet
seed: {seed}
model: meta-llama/Llama-3.1-8B-Instruct
gpu: L40S
pool: {{gpu_memory_utilization: 0.9}}
scheduler: {{max_model_len: 4096, max_num_seqs: 16}}
requests:
  count: 300
  prompt: {{dist: fixed, value: 500}}
  output: {{dist: fixed, value: 50}}
  arrival: {{process: poisson, rate: {rate}}}
replicas:
  - {{count: 2}}
router: round_robin
"""
FLEET_CAPACITY = 20.0


def _run(run_cli, tmp_path, template: str, rate: float, seed: int, *flags: str):
    path = tmp_path / f"w-{seed}-{rate}.yaml"
    path.write_text(template.format(seed=seed, rate=rate))
    code, out, err = run_cli("simulate", str(path), *flags)
    assert code == 0, err
    return out


@pytest.mark.parametrize("seed", range(4))
def test_a_serve_run_at_30_percent_never_warns(run_cli, tmp_path, seed):
    doc = json.loads(_run(run_cli, tmp_path, STEP_SERVE, 0.3 * CAPACITY, seed, "--json"))
    overload = doc["results"][0]["overload"]
    assert overload["overloaded"] is False and overload["sustained_rate"] == pytest.approx(overload["offered_rate"], rel=0.05)
    assert "overloaded" not in _run(run_cli, tmp_path, STEP_SERVE, 0.3 * CAPACITY, seed)


@pytest.mark.parametrize("seed", range(4))
def test_a_serve_run_at_150_percent_always_warns(run_cli, tmp_path, seed, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # the warning is one paragraph: here on one line
    doc = json.loads(_run(run_cli, tmp_path, STEP_SERVE, 1.5 * CAPACITY, seed, "--json"))
    overload = doc["results"][0]["overload"]
    assert overload["overloaded"] is True
    assert overload["sustained_rate"] == pytest.approx(CAPACITY, rel=0.1)  # what the server does
    assert overload["queue_delay_end"] > overload["queue_delay_mid"]
    text = _run(run_cli, tmp_path, STEP_SERVE, 1.5 * CAPACITY, seed)
    lines = [line for line in text.splitlines() if "overloaded" in line]
    assert len(lines) == 1, text
    line = lines[0]
    assert line.startswith("warning: overloaded: requests arrive at ") and "/step" in line
    assert f"{overload['sustained_rate']:.3g}/step (paged-B16)" in line
    assert "--rate" in line and "replicas" in line and "kvplan plan" in line


def test_the_overload_entry_is_byte_deterministic(run_cli, tmp_path):
    first = _run(run_cli, tmp_path, STEP_SERVE, 1.5 * CAPACITY, 0, "--json")
    assert first == _run(run_cli, tmp_path, STEP_SERVE, 1.5 * CAPACITY, 0, "--json")
    assert '"overload": {' in first


def test_a_run_whose_requests_all_arrive_at_once_has_no_rate_to_judge(run_cli, tmp_path):
    path = tmp_path / "batch.yaml"
    path.write_text(STEP_SERVE.format(seed=0, rate=1).replace("{process: poisson, rate: 1}", "{process: all_at_once}"))
    code, out, err = run_cli("simulate", str(path), "--json")
    assert code == 0, err
    assert json.loads(out)["results"][0]["overload"] is None


@pytest.mark.parametrize("seed", range(3))
def test_a_fleet_at_30_percent_never_warns(run_cli, tmp_path, seed):
    doc = json.loads(_run(run_cli, tmp_path, FLEET, 0.3 * FLEET_CAPACITY, seed, "--json"))
    assert doc["fleet"]["overload"]["overloaded"] is False
    assert not any(r["overload"]["overloaded"] for r in doc["replicas"])
    assert "overloaded" not in _run(run_cli, tmp_path, FLEET, 0.3 * FLEET_CAPACITY, seed)


@pytest.mark.parametrize("seed", range(3))
def test_a_fleet_at_150_percent_always_warns(run_cli, tmp_path, seed, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # the warning is one paragraph: here on one line
    doc = json.loads(_run(run_cli, tmp_path, FLEET, 1.5 * FLEET_CAPACITY, seed, "--json"))
    overload = doc["fleet"]["overload"]
    assert overload["overloaded"] is True and overload["sustained_rate"] < 0.9 * overload["offered_rate"]
    text = _run(run_cli, tmp_path, FLEET, 1.5 * FLEET_CAPACITY, seed)
    lines = [line for line in text.splitlines() if "overloaded" in line]
    assert len(lines) == 1 and "(the fleet)" in lines[0], text


# "It would fit with --gpu A100-80GB" for a model that does not fit on an H100-80GB of the same memory
def test_a_same_memory_gpu_that_fits_says_why_and_the_batch_flags_that_fit_here(run_cli):
    code, out, err = run_cli("size", "Qwen/QwQ-32B", "--gpu", "H100-80GB", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["fits"] is False and doc["would_fit"]["gpu"] == "A100-80GB"
    assert doc["would_fit"]["batch_defaults"] == {
        "A100-80GB": {"max_num_batched_tokens": 2048, "max_num_seqs": 256},
        "H100-80GB": {"max_num_batched_tokens": 8192, "max_num_seqs": 1024}}
    batch = doc["would_fit"]["batch"]
    code, text, err = run_cli("size", "Qwen/QwQ-32B", "--gpu", "H100-80GB")
    flat = " ".join(text.split())
    assert "Why A100-80GB: vLLM's default batch there is 2,048 batched tokens and 256 sequences" in flat
    flags = ["--max-num-seqs", str(batch["max_num_seqs"]), "--max-num-batched-tokens", str(batch["max_num_batched_tokens"])]
    assert f"On H100-80GB it fits with {' '.join(flags)}" in flat
    # the suggestion is what the sizing says: with those flags it fits, and with the defaults it did not
    code, out, err = run_cli("size", "Qwen/QwQ-32B", "--gpu", "H100-80GB", *flags, "--json")
    fixed = json.loads(out)
    assert code == 0 and fixed["fits"] is True and fixed["reason"] is None and "would_fit" not in fixed
    # a milder cut than taking the A100's defaults
    assert batch["max_num_batched_tokens"] * batch["max_num_seqs"] > 2048 * 256


def test_a_batch_fix_is_offered_only_where_one_fits(run_cli):
    """Weights alone larger than the GPU: no batch flag helps, none is offered."""
    code, out, err = run_cli("size", "Qwen/Qwen2.5-72B-Instruct", "--gpu", "H100-80GB", "--json")
    assert code == 0, err
    assert not json.loads(out)["would_fit"].get("batch")


# "requests at once 57" beside vLLM's "15.50x" for a model with sliding-window layers
def test_a_sliding_window_model_says_why_its_two_concurrencies_differ(run_cli):
    code, out, err = run_cli("size", "google/gemma-3-12b-it", "--gpu", "H100-80GB", "--tokens", "8192", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["max_concurrency"] != int(doc["vllm_concurrency"])
    [note] = [n for n in doc["notes"] if "requests at once against vLLM's" in n]
    assert f"{doc['max_concurrency']:,} requests at once against vLLM's {doc['vllm_concurrency']:.2f}x" in note
    assert "1,024 tokens (the window)" in note and "max_num_batched_tokens 8,192" in note
    assert "as if they were full-attention layers" in note  # 1,023 + 8,192 passes the 8,192 asked for
    code, text, _ = run_cli("size", "google/gemma-3-12b-it", "--gpu", "H100-80GB", "--tokens", "8192")
    assert "requests at once against vLLM's" in " ".join(text.split())


def test_the_concurrency_note_shows_only_where_the_two_differ(run_cli):
    code, out, err = run_cli("size", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-80GB", "--tokens", "8192",
                             "--json")
    doc = json.loads(out)
    assert code == 0 and doc["max_concurrency"] == int(doc["vllm_concurrency"])
    assert not any("requests at once against" in n for n in doc["notes"])


# Prefix, sharing, fleet and rate-sweep runs report progress as serve runs do (a bar on a
# terminal's stderr after a second; never with --json, never on a pipe: kvplan/cli/progress.py)
PREFIX_RUN = """\
experiment: prefix
seed: 1
pool: {slots: 4096}
requests:
  count: 600
  prompt: {dist: uniform, low: 8, high: 64}
  output: {dist: fixed, value: 8}
  arrival: {process: all_at_once}
allocators: [{kind: paged, block_size: 8}, {kind: paged, block_size: 16}]
prefix: {system_prompts: 2, system_prompt_len: 160, popularity: uniform}
scheduler: {max_model_len: 1024}
"""
SHARING_RUN = """\
experiment: sharing
seed: 0
pool: {slots: 1000000}
requests:
  count: 600
  prompt: {dist: lognormal, mean: 19.31, sigma: 0.5, min: 1, max: 2048}
  output: {dist: lognormal, mean: 58.45, sigma: 0.8, min: 1, max: 512}
  arrival: {process: all_at_once}
allocators: [{kind: paged, block_size: 16}]
sampling: {mode: both, widths: [2, 4], parent: random}
scheduler: {max_model_len: 4096}
"""


@pytest.fixture
def bars(monkeypatch):
    """Every progress bar made, with each (completed, total) it was moved to; none drawn."""
    from kvplan.cli import progress

    made = []
    real_init = progress.StderrBar.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self.calls = []
        made.append(self)

    monkeypatch.setattr(progress.StderrBar, "__init__", init)
    monkeypatch.setattr(progress.StderrBar, "update", lambda self, completed: self.calls.append((completed, self.total)))
    return made


@pytest.mark.parametrize("body, work", [(PREFIX_RUN, 2 * 600), (SHARING_RUN, 2 * 2 * 600)])
def test_prefix_and_sharing_runs_move_a_progress_bar(run_cli, tmp_path, bars, body, work):
    path = tmp_path / "run.yaml"
    path.write_text(body)
    code, out, err = run_cli("simulate", str(path))
    assert code == 0 and err == "", err  # not a terminal: no bar drawn
    [bar] = bars
    assert bar.enabled is False  # stderr is not a terminal here
    done = [c for c, _ in bar.calls]
    assert len(done) >= 2 and done == sorted(done) and bar.calls[-1][1] == work and done[-1] <= work
    code, out, err = run_cli("simulate", str(path), "--json")
    assert code == 0 and err == "" and bars[-1].enabled is False  # --json: never a bar
    json.loads(out)


def test_a_rate_sweep_moves_the_bar_past_the_serve_runs(run_cli, tmp_path, bars):
    path = tmp_path / "serve.yaml"
    path.write_text(STEP_SERVE.format(seed=0, rate=0.1))
    code, out, err = run_cli("simulate", str(path), "--rates", "0.1,0.2,0.4")
    assert code == 0, err
    [bar] = bars
    done = [c for c, _ in bar.calls]
    assert bar.total == 200 * (1 + 3) and max(done) > 200  # the sweep's three runs follow the serve run
    assert done[-1] == 200 * 4


def test_a_bar_is_drawn_only_on_a_terminal(monkeypatch):
    import io

    from kvplan.cli.progress import StderrBar

    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert StderrBar("x", 10).enabled is False
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    assert StderrBar("x", 10).enabled is True and StderrBar("x", 10, enabled=False).enabled is False


def test_no_gpu_reports_more_to_cuda_than_it_has(run_cli):
    """The catalog's memory is the device's total as its driver reports it; what torch sees
    (cudaMemGetInfo / hipMemGetInfo) is that or less, so the two columns never disagree the
    wrong way round (the MI300X read 191.7 GiB in one and 192 in the other)."""
    from kvplan.model.gpus import get_gpu, gpu_names

    for name in gpu_names():
        gpu = get_gpu(name)
        if gpu.cuda_memory_bytes is not None:
            assert gpu.cuda_memory_bytes <= gpu.memory_bytes, name
    code, out, _ = run_cli("gpus", "--json")
    assert code == 0
    for row in json.loads(out)["gpus"]:
        if row.get("cuda_memory_bytes") is not None:
            assert row["cuda_memory_bytes"] <= row["memory_bytes"], row["name"]


def test_a_config_without_a_dtype_is_served_as_vllm_serves_it(run_cli):
    """gpt-oss names no torch_dtype: vLLM's dtype auto reads the checkpoint's weights (bf16 around
    the MXFP4 experts) or falls back to float32, served as bf16 on GPUs with bf16. It used to read
    'fp16 assumed'."""
    code, out, _ = run_cli("size", "openai/gpt-oss-20b", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["kv_dtype"] == "bf16"
    assert not any("assumed" in n for n in doc["notes"]) and any("dtype auto" in n for n in doc["notes"])


def test_the_warning_folds_at_80_columns_without_splitting_a_number(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    text = _run(run_cli, tmp_path, STEP_SERVE, 1.5 * CAPACITY, 0)
    start = text.index("warning: overloaded")
    assert max(len(line) for line in text.splitlines()) <= 80
    monkeypatch.setenv("COLUMNS", "400")
    wide = _run(run_cli, tmp_path, STEP_SERVE, 1.5 * CAPACITY, 0)
    [line] = [line for line in wide.splitlines() if "overloaded" in line]
    assert " ".join(text[start:].split())[:len(line)] == line  # the same words, folded at spaces


# ---- kvplan step: a batch no server can hold says so ---------------------------------------------


def test_a_step_whose_batch_cannot_be_held_says_so(run_cli, monkeypatch):
    """`kvplan step --batch 4096 --context 32768` timed a decode of 16 TiB of KV cache silently.
    Llama-3.1-8B holds 128 KiB a token (32 layers x 8 KV heads x 128 x 2 x 2 bytes): 4,096 x 32,768
    tokens are 16 TiB, where an H100's pool is tens of GiB."""
    monkeypatch.setenv("COLUMNS", "400")
    code, out, err = run_cli("step", "meta-llama/Llama-3.1-8B-Instruct", "--batch", "4096", "--context", "32768")
    assert code == 0, err
    warning = next(line for line in out.splitlines() if line.startswith("warning: this decode does not fit"))
    assert "hold 16 TiB of KV cache per GPU" in warning
    code, out, _ = run_cli("step", "meta-llama/Llama-3.1-8B-Instruct", "--batch", "4096", "--context", "32768",
                           "--json")
    memory = json.loads(out)["memory"]
    assert memory["batch_kv_bytes"] == 4096 * 32768 * 131072 and not memory["fits"]
    code, size_out, _ = run_cli("size", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-80GB", "--tokens",
                                "32768", "--max-num-batched-tokens", "8192", "--json")
    assert memory["max_concurrency"] == json.loads(size_out)["max_concurrency"]  # what kvplan size says
    assert f"at most {memory['max_concurrency']:,} such requests" in warning


def test_a_step_that_fits_has_no_warning(run_cli):
    code, out, _ = run_cli("step", "meta-llama/Llama-3.1-8B-Instruct")  # 64 x 4,096 tokens: 32 GiB
    assert code == 0 and "warning" not in out


def test_a_step_beyond_the_context_and_the_weights_say_so(run_cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    _, out, _ = run_cli("step", "meta-llama/Llama-3.1-8B-Instruct", "--batch", "1", "--context", "262144")
    assert "warning: 262,144 tokens is beyond the model's context of 131,072" in out
    _, out, _ = run_cli("step", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "L4")
    assert "warning: no server holds this decode: CUDA out of memory while loading the weights" in out
