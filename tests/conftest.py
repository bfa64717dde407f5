"""Shared fixtures: where ../shared lives, and a helper to run the CLI in-process."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parents[1]

# No property test may depend on the machine's speed: CI runs on a busy 2-core machine.
settings.register_profile("kvplan", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("kvplan")


def bench_module(name: str):
    """bench/NAME.py imported as the module NAME, once per session (the benches import one another by
    name, so bench/ is on sys.path while it loads)."""
    path = str(ROOT / "bench")
    sys.path.insert(0, path)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(path)


def shared_dir() -> Path:
    """../shared beside the checkout (or $KVPLAN_SHARED)."""
    return Path(os.environ.get("KVPLAN_SHARED") or ROOT.parent / "shared")


def hf_config(name: str) -> Path:
    """Path of a real config in ../shared/hf-configs; skips the test when the corpus is absent."""
    path = shared_dir() / "hf-configs" / name / "config.json"
    if not path.is_file():
        pytest.skip(f"{path} not present")
    return path


def torch_one_thread(torch):
    """Run a module's tests on one intra-op thread (tiny tensors; far faster on a busy 2-core box)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def run_cli(capsys):
    """Run `kvplan ARGS` in-process; returns (exit code, stdout, stderr)."""
    from kvplan.cli import main

    def run(*args: str) -> tuple[int, str, str]:
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run
