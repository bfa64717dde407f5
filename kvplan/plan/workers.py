"""Where `kvplan plan`'s jobs run: in this process, in a pool of processes, or on Ray; in the
jobs' order whichever, so that the rows never depend on it. A pool never has more processes
than the CPUs this process may use or the tasks it is given (kvplan.cpus.pool_size)."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from typing import Callable

from kvplan.cpus import pool_size


class Workers:
    """Where jobs run: in this process, in one pool of `workers` processes kept for every call
    (forked where the platform allows: the children inherit the compiled engine), or on Ray.
    `tasks`: the most jobs one call will be given (the pool is no larger: `pool_size`)."""

    def __init__(self, workers: int = 1, ray: bool = False, *, tasks: int | None = None) -> None:
        self.workers = pool_size(workers, workers if tasks is None else tasks)
        self.ray = ray
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def map(self, fn: Callable, jobs: list):
        """fn(job) for every job, in the jobs' order, each yielded as soon as it and those before
        it are ready."""
        if self.ray:
            yield from _on_ray(fn, jobs, self.workers)
        elif self.workers <= 1 or len(jobs) <= 1:
            for job in jobs:
                yield fn(job)
        else:
            if self._pool is None:
                import multiprocessing

                fork = "fork" in multiprocessing.get_all_start_methods()
                self._pool = ProcessPoolExecutor(self.workers,
                                                 mp_context=multiprocessing.get_context("fork") if fork else None)
            yield from self._pool.map(fn, jobs)  # map keeps the order


def run_jobs(fn: Callable, jobs: list, workers: int = 1, ray: bool = False):
    """fn(job) for every job, in the jobs' order (in this process, in a pool of `workers`
    processes, never more than the jobs, or as Ray tasks: Workers)."""
    with Workers(workers, ray, tasks=len(jobs)) as pool:
        yield from pool.map(fn, jobs)


def _on_ray(fn: Callable, jobs: list, workers: int):
    try:
        import ray
    except ImportError:
        from kvplan.errors import UsageError

        raise UsageError("needs Ray: pip install 'kvplan[ray]'", field="--ray") from None
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    task = ray.remote(fn)
    pending = [task.remote(job) for job in jobs]
    for ref in pending:
        yield ray.get(ref)
