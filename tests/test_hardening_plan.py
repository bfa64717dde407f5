"""Hardening of plan and fleets (issue 29): the worker pool is never larger than the CPUs or the
tasks, the rows do not depend on it, and the JSON schema bounds a link as the loader does."""

from __future__ import annotations

import json

import pytest

from kvplan import cpus
from kvplan.plan import workers as W


def test_pool_size_is_capped_by_cpus_and_tasks(monkeypatch):
    monkeypatch.setattr(cpus, "cpus_available", lambda: 4)
    assert cpus.pool_size(1024, 2) == 2  # two configurations: two processes at most
    assert cpus.pool_size(1024, 100) == 4  # no more than the CPUs
    assert cpus.pool_size(3, 100) == 3  # what was asked, when it fits
    assert cpus.pool_size(8, 0) == 1  # at least one


def test_cpus_available_is_the_affinity_mask(monkeypatch):
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda pid: {0, 3}, raising=False)
    assert cpus.cpus_available() == 2

    def missing(pid):
        raise AttributeError

    monkeypatch.setattr(cpus.os, "sched_getaffinity", missing, raising=False)
    monkeypatch.setattr(cpus.os, "cpu_count", lambda: None)
    assert cpus.cpus_available() == 1


def test_workers_1024_for_two_jobs_start_two_processes(monkeypatch):
    """`plan --workers 1024` with 2 configurations used to fork 1,024 processes."""
    started = []

    class Recorder:
        def __init__(self, n, mp_context=None):
            started.append(n)

        def map(self, fn, jobs):
            return map(fn, jobs)

        def shutdown(self):
            pass

    monkeypatch.setattr(cpus, "cpus_available", lambda: 16)
    monkeypatch.setattr(W, "ProcessPoolExecutor", Recorder)
    assert list(W.run_jobs(abs, [-1, -2], workers=1024)) == [1, 2]
    assert started == [2]
    with W.Workers(1024, tasks=2) as pool:
        assert pool.workers == 2


def test_plan_rows_do_not_depend_on_the_workers(run_cli):
    args = ("plan", "meta-llama/Llama-3.1-8B-Instruct", "--rate", "2", "--count", "200", "--gpu", "L40S,H100-80GB",
            "--tp", "1", "--ttft-p99", "2", "--router", "none", "--json")
    code1, one, _ = run_cli(*args, "--workers", "1")
    code2, many, _ = run_cli(*args, "--workers", "1024")
    assert code1 == code2 == 0
    assert one == many  # byte-identical JSON


def test_the_schema_bounds_a_link_as_the_loader_does(run_cli, tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    from kvplan.errors import KvplanError
    from kvplan.workload.spec import Transfer

    code, out, _ = run_cli("schema")
    validator = jsonschema.Draft202012Validator(json.loads(out))
    base = {"name": "pd", "experiment": "fleet", "model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "H100-80GB", "pool": {"gpu_memory_utilization": 0.9},
            "requests": {"count": 1, "prompt": {"dist": "fixed", "value": 10}, "output": {"dist": "fixed", "value": 1}},
            "replicas": [{"role": "prefill", "count": 1}, {"role": "decode", "count": 1}]}
    for link in ({"gb_per_s": 25, "latency_s": 60.0}, {"gb_per_s": 25, "latency_s": 61.0},
                 {"gb_per_s": 1e6}, {"gb_per_s": 1.5e6}, {"gb_per_s": -1}, {"gb_per_s": 1, "latency_s": -0.1}):
        try:
            Transfer(**link)
            loads = True
        except KvplanError:
            loads = False
        valid = not list(validator.iter_errors(base | {"transfer": link}))
        assert valid == loads, link
