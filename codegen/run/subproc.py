"""A local runner whose measuring process is started with :mod:`subprocess`, not :mod:`multiprocessing`.

:class:`~codegen.measure.LocalRunner` starts its measuring child with ``multiprocessing`` (``spawn``).
That is refused inside a *daemonic* process ("daemonic processes are not allowed to have children"),
and Dask's worker processes are daemonic. :class:`SubprocessRunner` keeps everything else of the
local runner (the machine-wide measuring lock, canaries, hang detection, restarts, the timing
protocol) and only changes how the child starts: ``python -m codegen.run.measure_child FD`` through
:class:`subprocess.Popen`, talking over an inherited socket pair wrapped in a
:class:`multiprocessing.connection.Connection` (the same messages as the spawned child). ``subprocess``
children are allowed in daemonic processes. The child is told which CPUs to run on (``cpus``), so a
measuring worker's kernels can be kept off the cores where builds run.

When the parent dies, the child reads EOF on its socket and exits (as the spawned child does).

Example:
    >>> import numpy as np
    >>> from codegen.measure import RunRequest, TIMING_HARNESS_C
    >>> src = '''void fj_kernel(void* const* b) {
    ...   const float* x = b[0]; float* y = b[1];
    ...   for (int i = 0; i < 8; ++i) y[i] = x[i] - 1;
    ... }''' + TIMING_HARNESS_C
    >>> x = np.arange(8, dtype=np.float32)
    >>> with SubprocessRunner() as runner:
    ...     [b] = runner.build([src])
    ...     res = runner.run(RunRequest(None, [x], (8,), 0, x - 1), build=b)
    >>> res.status
    'ok'
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterable
from multiprocessing.connection import Connection
from typing import Any

from .local import LocalProcessRunner
from .measure_child import PARENT_ENV

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # holds codegen/


class _PopenProcess:
    """The slice of :class:`multiprocessing.Process` that :class:`~codegen.measure.LocalRunner` uses."""

    def __init__(self, popen: subprocess.Popen):
        self._p = popen

    @property
    def pid(self) -> int:
        return self._p.pid

    @property
    def exitcode(self) -> int | None:
        return self._p.poll()  # negative: killed by that signal (as multiprocessing reports it)

    def is_alive(self) -> bool:
        return self._p.poll() is None

    def join(self, timeout: float | None = None) -> None:
        try:
            self._p.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        if self._p.poll() is None:
            self._p.kill()  # our own child, by its handle

    def close(self) -> None:
        pass


class SubprocessRunner(LocalProcessRunner):
    """:class:`~codegen.run.local.LocalProcessRunner` whose measuring child is a ``subprocess``
    (usable inside daemonic processes such as Dask workers).

    Args:
        cpus: CPUs the measuring child (and its OpenMP threads) may run on (``None``: not pinned).
        **kwargs: as for :class:`~codegen.run.local.LocalProcessRunner` (protocol, timeout_s,
            build_workers, flags, device, lock, ...).
    """

    def __init__(self, *, cpus: Iterable[int] | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.cpus = tuple(sorted(int(c) for c in cpus)) if cpus is not None else None

    def __enter__(self) -> SubprocessRunner:
        super().__enter__()
        return self

    def _start_child(self) -> None:
        if self._proc is not None and not self._proc.is_alive():
            self._stop_child(graceful=False)
        if self._proc is not None:
            return
        ours, theirs = socket.socketpair()
        # -P: not the working directory first on the import path (a codegen/ or numpy.py in the folder a worker
        # was started from would run in the child); the package comes from PYTHONPATH below
        cmd = [sys.executable, "-P", "-m", "codegen.run.measure_child", str(theirs.fileno()), str(self.lib_cache)]
        if self.cpus is not None:
            cmd.append(",".join(map(str, self.cpus)))
        env = dict(os.environ)
        env[PARENT_ENV] = str(os.getpid())  # the child ends when this process is gone (a SIGKILL left it spinning)
        # no empty entry (":/x" from an unset PYTHONPATH extended in a shell): it means the working folder again
        env["PYTHONPATH"] = os.pathsep.join([_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        try:
            popen = subprocess.Popen(cmd, pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL,
                                     close_fds=True)
        finally:
            theirs.close()  # the child holds its own copy: the parent sees EOF when the child dies
        self._proc, self._conn, self._ready = _PopenProcess(popen), Connection(ours.detach()), False
