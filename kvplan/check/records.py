"""The records of `kvplan check`: a validated check, its assertions, and what running it found.

Plain frozen records shared by the reader (kvplan.check.file), the baseline file
(kvplan.check.baseline) and the runner (kvplan.check.run); this module imports none of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kvplan.errors import KvplanError, WorkloadError

BASELINE_FORMAT = 1


@dataclass(frozen=True, slots=True)
class Expect:
    """A threshold, `metric op bound`, as written at `line`."""

    metric: str
    op: str
    bound: Any  # int | float | bool | str
    text: str
    key_path: str  # where in the check file, e.g. checks[0].expect[1]
    line: int


@dataclass(frozen=True, slots=True)
class Tracked:
    """A metric compared with the baseline: allowed = max(abs_tol, rel_tol x |baseline|)."""

    metric: str
    rel_tol: float
    abs_tol: float
    fail_on: str  # change | drop | rise
    key_path: str
    line: int


@dataclass(frozen=True, slots=True, eq=False)
class Check:
    """One validated check: what to run (`options` of size or simulate) and what to assert."""

    name: str
    kind: str  # size | simulate
    options: dict
    select: dict | None
    expects: tuple[Expect, ...]
    tracked: tuple[Tracked, ...]
    file: str
    key_path: str  # checks[i]
    line: int
    option_lines: dict  # line of each key of the size/simulate mapping, and of select

    def error(self, message: str, key_path: str | None = None, line: int | None = None) -> KvplanError:
        """An error in this check, at `key_path` and `line` (default: the check's own)."""
        return WorkloadError(message, file=self.file, field=key_path or self.key_path, line=line or self.line)


@dataclass(frozen=True, slots=True)
class Outcome:
    """One assertion's result: a threshold (`kind` expect) or a baseline comparison."""

    kind: str
    metric: str
    op: str
    bound: Any  # the threshold, or the baseline value
    value: Any
    passed: bool
    text: str
    detail: str = ""
    tolerance: float | None = None  # baseline comparisons: the allowed difference

    def to_dict(self) -> dict:
        out = {"kind": self.kind, "metric": self.metric, "op": self.op, "bound": self.bound,
               "value": self.value, "passed": self.passed, "text": self.text, "detail": self.detail}
        if self.kind == "baseline":
            out["tolerance"] = self.tolerance
        return out


@dataclass(frozen=True, slots=True, eq=False)
class CheckResult:
    name: str
    kind: str
    outcomes: tuple[Outcome, ...]
    tracked: dict  # baseline metric -> this run's value

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outcomes)


@dataclass(frozen=True, slots=True)
class CheckReport:
    file: str
    baseline: str | None  # the baseline compared with, if any
    results: tuple[CheckResult, ...]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def outcomes(self) -> list[tuple[str, Outcome]]:
        return [(r.name, o) for r in self.results for o in r.outcomes]

    def to_dict(self) -> dict:
        failed = [o for _, o in self.outcomes if not o.passed]
        return {"file": self.file, "baseline": self.baseline, "passed": self.passed,
                "num_checks": len(self.results), "num_assertions": len(self.outcomes),
                "num_failed": len(failed),
                "checks": [{"name": r.name, "kind": r.kind, "passed": r.passed,
                            "assertions": [o.to_dict() for o in r.outcomes]} for r in self.results]}

    def baseline_document(self) -> dict:
        """What `--update-baseline` writes: each tracked metric's value in this run."""
        return {"kvplan_check_baseline": BASELINE_FORMAT,
                "checks": {r.name: dict(r.tracked) for r in self.results if r.tracked}}


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def kind_of(value: Any) -> str:
    """How an error names a JSON value: null, a boolean (true), a string ("x"), a mapping, a list, a number."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({json.dumps(value)})"
    if isinstance(value, str):
        return f"a string ({json.dumps(value)})"
    return {dict: "a mapping", list: "a list"}.get(type(value), "a number")
