"""Timing profiles: the step-time constants fitted by `kvplan calibrate` on a user's own runs,
kept as a small YAML file that `simulate`, `plan`, `step` and fleets read instead of the shipped
constants (`timing: {profile: FILE}` in a workload, `--timing-profile FILE` on the command line).

    kvplan_timing_profile: 1
    description: fitted on 3 runs of vllm bench serve (...)
    async_scheduling: true          # how the server the runs came from scheduled (vLLM 0.14 on)
    constants:
      bandwidth_efficiency: {value: 0.87, range: [0.6, 0.92]}
      step_overhead_s: {value: 0.0012, range: [0.0001, 0.006]}
      ...
    leave_one_out: {throughput: 0.04, ttft: 0.11, ...}   # median |error| per metric, informative

A constant the file leaves out keeps the shipped value; a value outside the physical range
(kvplan/model/step_time.PHYSICAL_RANGES) or a key that is not a fitted constant is refused. The
host constants mean what they were fitted as: under `async_scheduling: false` (a server before
vLLM 0.14) they are time in series with the GPU's, and the runs that read the profile schedule so.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.model.step_time import CONSTANTS, PHYSICAL_RANGES, StepConstants

FORMAT = 1
TOP_KEYS = ("kvplan_timing_profile", "description", "async_scheduling", "constants", "leave_one_out", "fitted_on")


MAX_BYTES = 1 << 20


def _error(path: str, field: str, expected: str) -> KvplanError:
    return KvplanError(f"expected {expected}", file=path, field=field)


def load_profile(path: str | Path) -> StepConstants:
    """The constants of a timing profile file (see the module docstring)."""
    return load_profile_settings(path)[0]


def load_profile_settings(path: str | Path) -> tuple[StepConstants, bool]:
    """(the constants, async scheduling) of a timing profile file."""
    return _load(str(Path(path).resolve()))


@lru_cache(maxsize=16)
def _load(path: str) -> tuple[StepConstants, bool]:
    import yaml

    from kvplan.fileio import decode, input_path, read_limited

    data = read_limited(path, MAX_BYTES, KvplanError, what="timing profile")
    text = decode(data, input_path(path, KvplanError), KvplanError)
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise _error(path, "(file)", f"a YAML timing profile ({str(exc).splitlines()[0]})") from None
    if not isinstance(doc, dict) or doc.get("kvplan_timing_profile") != FORMAT:
        raise _error(path, "kvplan_timing_profile", f"{FORMAT} (a file written by kvplan calibrate)")
    unknown = sorted(set(map(str, doc)) - set(TOP_KEYS))
    if unknown:
        raise _error(path, unknown[0], "one of " + ", ".join(TOP_KEYS))
    constants = doc.get("constants")
    if not isinstance(constants, dict) or not constants:
        raise _error(path, "constants", "a mapping of constant: {value: ...}")
    scheduling = doc.get("async_scheduling", True)
    if not isinstance(scheduling, bool):
        raise _error(path, "async_scheduling", "true or false")
    values = {}
    for name, entry in constants.items():
        where = f"constants.{name}"
        if name not in PHYSICAL_RANGES:
            raise _error(path, where, "a fitted step-time constant (" + ", ".join(sorted(PHYSICAL_RANGES)) + ")")
        value = entry.get("value") if isinstance(entry, dict) else entry
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise _error(path, where + ".value", "a finite number")
        low, high = PHYSICAL_RANGES[name]
        if not low <= value <= high:
            raise _error(path, where + ".value", f"a value in [{low:g}, {high:g}], got {value!r}")
        values[name] = float(value)
    return replace(CONSTANTS, **values), scheduling


def profile_option(path: str | Path, flag: str = "--timing-profile") -> tuple[Path, StepConstants, bool]:
    """A profile named on the command line: its absolute path (~ expanded), constants and
    scheduling; errors name the file and the flag."""
    import os

    from kvplan.fileio import expand

    try:
        full = Path(os.path.realpath(expand(path, KvplanError, flag)))
        return (full, *load_profile_settings(full))
    except KvplanError as exc:
        raise exc.located(field=flag) from None


def profile_document(values: dict, description: str, leave_one_out: dict | None = None,
                     fitted_on: list | None = None, fitted: tuple[str, ...] = (),
                     async_scheduling: bool = True) -> dict:
    """The YAML document of a profile: each constant with its value, its physical range, and
    whether this fit moved it (`fitted`) or it kept the shipped value."""
    constants = {name: {"value": float(f"{values[name]:.6g}"),
                        "range": [float(f"{low:.6g}"), float(f"{high:.6g}")], "fitted": name in fitted}
                 for name, (low, high) in PHYSICAL_RANGES.items() if name in values}
    doc = {"kvplan_timing_profile": FORMAT, "description": description, "async_scheduling": async_scheduling,
           "constants": constants}
    if leave_one_out:
        doc["leave_one_out"] = leave_one_out
    if fitted_on:
        doc["fitted_on"] = fitted_on
    return doc
