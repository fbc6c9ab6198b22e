"""Threads for a search's own work: its independent pieces (the descents of a round, each sketch's
candidates) run side by side on the cores that sit idle while nothing is being timed. Jitted JAX calls
and numpy's large operations release the GIL, so threads are enough. (The shared scorer's per-sketch
features were tried in threads too, session 66: the Python half of that work holds the GIL, and the genetic
search proposed 7-11% slower with them, so they stay in one thread.)"""
from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS reports one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def in_threads(jobs: list[Callable], workers: int) -> list:
    """Each job's result, in the jobs' order, the jobs run on up to ``workers`` threads (jitted JAX calls
    and numpy's large operations release the GIL, so a search's independent pieces of work, such as the
    descents of its sketches, run side by side on the cores that are idle between measurements); with one
    worker or one job, one after another in this thread.

    Example:
        >>> in_threads([lambda: 1, lambda: 2, lambda: 3], workers=2)
        [1, 2, 3]
    """
    if workers <= 1 or len(jobs) <= 1:
        return [job() for job in jobs]
    with ThreadPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
        return list(pool.map(lambda job: job(), jobs))
