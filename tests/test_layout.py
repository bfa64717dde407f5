"""The house: imports flow one way between the rooms of kvplan/, and no modules import in a loop.

Every import counts, the lazy ones inside functions too: a room may import only from rooms of a
lower rank (and from itself). Rooms of one rank are peers and import nothing of each other.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "kvplan"

RANK = {
    "text": 0,
    "errors": 1, "units": 2, "fileio": 2, "cpus": 2,
    "model": 3, "memory": 3,
    "workload": 4,
    "sim": 5, "replay": 5, "backends": 5,
    "fleet": 6,
    "experiments": 7,
    "plan": 8, "calibrate": 8,
    "report": 8,
    "check": 9,
    "cli": 10, "__main__": 11, "__init__": 11,
}  # fmt: skip


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def imports() -> dict[str, set[str]]:
    """kvplan module -> the kvplan modules it imports (anywhere in its body)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("kvplan"))
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kvplan"):
                found.add(node.module)
                # `from kvplan.sim import kernel` imports the module kvplan.sim.kernel
                found.update(f"{node.module}.{a.name}" for a in node.names
                             if (PACKAGE.parent / f"{node.module}.{a.name}".replace(".", "/")).with_suffix(".py").exists())
        graph[name] = found - {name}
    return graph


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_room_has_a_rank():
    assert {room(m) for m in imports()} <= set(RANK)


def test_imports_flow_down_the_ranks():
    wrong = []
    for module, targets in imports().items():
        for target in targets:
            a, b = room(module), room(target)
            if a != b and RANK[b] >= RANK[a]:
                wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_no_import_cycles():
    graph = imports()
    # a package's __init__ naming its own modules is not a cycle of the code
    edges = {m: {t for t in ts if t in graph and not t.startswith(m + ".")} for m, ts in graph.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt] if nxt in stack else [node, nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_the_engine_room_holds_only_the_engine():
    """kvplan/sim/ is time: no workload reading, no replays, nothing printed."""
    sim = {m for m in imports() if room(m) == "sim"}
    assert {m.rsplit(".", 1)[-1] for m in sim} <= {"sim", "engine", "kernel", "reference", "inputs", "timing",
                                                  "sampling", "metrics", "overload", "sweep", "prefix_ids", "slo", "offload",
                                                  "speculative", "sglang", "sglang_state", "sglang_reference", "data_parallel", "parallel_clock",
                                                  "state"}
    for module in sim:
        text = (PACKAGE.parent / module.replace(".", "/")).with_suffix(".py")
        if not text.exists():
            text = PACKAGE.parent / module.replace(".", "/") / "__init__.py"
        assert "print(" not in text.read_text(encoding="utf-8"), module
