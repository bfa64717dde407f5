"""How many processes a parallel run may start: never more than the CPUs this process may use
nor than the tasks it has. A forked pool starts all its processes at once, each a copy of the
engine, so `plan --workers 1024` for two configurations would otherwise start 1,024 of them to run
two tasks on the cores there are. The cap changes where jobs run, never what they return."""

from __future__ import annotations

import os


def cpus_available() -> int:
    """The CPUs this process may run on: its affinity mask where the platform has one (what a
    container, cgroup cpuset or taskset leaves it), else every core of the machine."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity mask on this platform (macOS, Windows)
        return max(1, os.cpu_count() or 1)


def pool_size(requested: int, tasks: int) -> int:
    """The processes worth starting for `tasks` tasks when `requested` were asked for: no more
    than the CPUs available (more only take turns on them) nor than the tasks (a process without
    a task only costs its start and its memory); at least one."""
    return max(1, min(requested, cpus_available(), tasks))
