"""Load a workload file with models resolved by kvplan.model (the CLI's and `check`'s entry point)."""

from __future__ import annotations

from pathlib import Path

from kvplan.model.facts import model_facts
from kvplan.sim.types import Workload
from kvplan.sim.workload import load_workload


def load(path: str | Path) -> Workload:
    return load_workload(path, resolve_model=model_facts)
