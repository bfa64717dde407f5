"""The example workloads that ship with kvplan: found by name, listed with what they show.

In the wheel they are installed as kvplan/_workloads (pyproject's force-include); in a source
checkout they are the workloads/ folder. `kvplan simulate lesson` runs workloads/lesson.yaml.
Examples that replay a trace need the trace file beside them (the traces are not shipped).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

NOT_EXAMPLES = {"checks"}  # kvplan's own CI checks, not a workload


def examples_dir() -> Path:
    here = Path(__file__).resolve().parent.parent
    shipped = here / "_workloads"
    return shipped if shipped.is_dir() else here.parent / "workloads"


@dataclass(frozen=True, slots=True)
class Example:
    name: str
    path: Path
    experiment: str
    about: str  # the file's first comment sentence
    needs_trace: bool

    def to_dict(self) -> dict:
        return {"name": self.name, "path": str(self.path), "experiment": self.experiment, "about": self.about,
                "needs_trace": self.needs_trace}


def list_examples() -> list[Example]:
    out = []
    for path in sorted(examples_dir().glob("*.yaml")):
        if path.stem in NOT_EXAMPLES:
            continue
        text = path.read_text(encoding="utf-8")
        comments = " ".join(line.lstrip("# ").strip() for line in text.splitlines() if line.startswith("#"))
        about = re.split(r"(?<!\bal)(?<!e\.g)\.\s", comments, maxsplit=1)[0].rstrip(".") + "." if comments else ""
        experiment = re.search(r"^experiment:\s*(\w+)", text, re.M)
        out.append(Example(path.stem, path, experiment.group(1) if experiment else "serve", about,
                           bool(re.search(r"^\s*trace:", text, re.M) or "trace: {" in text)))
    return out


def example_path(name: str) -> Path | None:
    """The bundled example called `name` (with or without .yaml), or None."""
    stem = name[:-5] if name.endswith(".yaml") else name
    if "/" in stem or "\\" in stem or stem in NOT_EXAMPLES:
        return None
    path = examples_dir() / f"{stem}.yaml"
    return path if path.is_file() else None
