"""Entry point of a measuring process started with ``subprocess`` (:class:`codegen.run.subproc.SubprocessRunner`).

    python -m codegen.run.measure_child FD LIB_CACHE [CPUS]

``FD`` is an inherited socket to the parent, spoken to through a
:class:`multiprocessing.connection.Connection` with the messages of the spawned measuring child
(:func:`codegen.measure._child_main`); ``CPUS`` (``0`` or ``0,2``) pins this process, and so the
kernels' OpenMP threads, to those CPUs.
"""
from __future__ import annotations

import os
import sys
from multiprocessing.connection import Connection

PARENT_ENV = "FELIXJAX_MEASURE_PARENT"  # the pid of the process that started this one


def main(argv: list[str]) -> None:
    fd, lib_cache = int(argv[0]), int(argv[1])
    if len(argv) > 2 and argv[2] and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(c) for c in argv[2].split(",")})
    from codegen.measure import _child_main  # after pinning: numpy's threads start pinned too

    parent = os.environ.get(PARENT_ENV)
    _child_main(Connection(fd), lib_cache, int(parent) if parent and parent.isdigit() else None)


if __name__ == "__main__":
    main(sys.argv[1:])
