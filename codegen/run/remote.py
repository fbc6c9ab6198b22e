"""What runs on a cluster worker: builds, and measurements on a worker's device (numpy only; no Dask import).

:class:`felixjax.dask_runner.DaskRunner` submits these functions to Dask workers. They live in
``codegen`` so that a worker imports only ``codegen`` (numpy), never felixjax or jax.

* :func:`build_job` compiles one source (pinned to ``cpus`` if given) and returns the
  :class:`~codegen.build.BuildResult` with the library's bytes, so a measuring worker on another
  machine can load it.
* :func:`measure_job` measures one request on this worker's device with a long-lived runner of this
  process (one per runner factory, default a :class:`~codegen.run.subproc.SubprocessRunner`: a
  ``subprocess`` child, since worker processes are daemonic). It takes a shipped build, or builds
  the source itself first (on the measuring host, between measurements: the measuring lock is not
  held while compiling). Kernel failures are statuses; any other error becomes a ``runtime_error``
  result, so only the worker's death makes the task fail. With ``announce`` it first logs a Dask event
  (``{"key", "id"}``: this task, this worker) so that the driver can tell, when a worker dies, which of
  the tasks queued on it was running (:func:`started`).
* A compiler that cannot be run at all (``cannot run gcc: [Errno 2] ...``: a worker's environment, not
  the config) is reported with the worker named (its Dask address, host and pid): :func:`where`.

Dask is imported lazily, inside a worker only (:func:`_dask_worker`).
"""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import pickle
import socket
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..build import BuildResult, CacheWriteError, build, default_cache_dir
from ..measure import MeasureResult, RunRequest

_runners: dict[bytes, Any] = {}
_runners_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class Shipped:
    """A build made elsewhere: its result and, when ok, the library's bytes."""

    result: BuildResult
    library: bytes | None = None


@contextlib.contextmanager
def pinned(cpus: Iterable[int] | None) -> Iterator[None]:
    """Pin the calling thread (and the processes and threads it starts) to ``cpus`` for a while."""
    if cpus is None or not hasattr(os, "sched_getaffinity"):
        yield
        return
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(cpus))
    try:
        yield
    finally:
        os.sched_setaffinity(0, old)


def _dask_worker() -> Any:
    """The Dask worker running this task, or None (not in a worker, or no distributed)."""
    try:
        from distributed import get_worker

        return get_worker()
    except Exception:  # noqa: BLE001 - ValueError outside a worker, ImportError without distributed
        return None


def where() -> str:
    """This measuring or building process, for messages: its Dask worker's address, host and pid."""
    w, here = _dask_worker(), f"host {socket.gethostname()}, pid {os.getpid()}"
    return f"the Dask worker {w.address} ({here})" if w is not None else here


def _named(res: Any) -> Any:
    """``res`` (a BuildResult or a MeasureResult) with this worker named when its compiler could not be
    run at all (an environment failure: every build of this worker fails alike, the driver's says which)."""
    error = getattr(res, "error", None) or ""
    if getattr(res, "status", None) == "compile_error" and error.startswith("cannot run "):
        return dataclasses.replace(res, error=f"on {where()}: {error}")
    return res


def started(topic: str) -> None:
    """Log a Dask event on ``topic``: this task (``key``) started on this worker (``id``; the scheduler adds
    its address as ``worker``). Best effort: a worker killed at once may never send it."""
    w = _dask_worker()
    if w is None:
        return
    with contextlib.suppress(Exception):
        w.log_event(topic, {"key": w.get_current_task(), "id": w.id})


def build_job(source: str, flags: tuple[str, ...], timeout_s: float = 60.0,
              cpus: Iterable[int] | None = None) -> Shipped:
    """Compile ``source`` here (through this host's build cache); ship the library's bytes."""
    with pinned(cpus):
        res = _named(build(source, flags=flags, timeout_s=timeout_s))
    if res.status != "ok" or res.lib_path is None:
        return Shipped(res)
    with open(res.lib_path, "rb") as f:
        return Shipped(res, f.read())


def materialize(shipped: Shipped) -> BuildResult:
    """A shipped build as a library file on this host: the builder's own file when it is here with the
    same bytes (same host), else written once into this host's cache (``dask-libs/<key>.so``)."""
    res, data = shipped.result, shipped.library
    if res.status != "ok" or data is None:
        return res
    path = res.lib_path
    try:
        if path and os.path.getsize(path) == len(data):
            with open(path, "rb") as f:
                if f.read() == data:
                    return res
    except OSError:
        pass
    folder = os.path.join(default_cache_dir(), "dask-libs")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{res.key or 'lib'}.so")
    try:
        reuse = os.path.getsize(path) == len(data)
        if reuse:
            os.utime(path)  # used now: `felixjax cache --prune` keeps what was used in its last minutes
    except OSError:
        reuse = False
    if not reuse:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".tmp-{os.getpid()}-", suffix=".so")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    return dataclasses.replace(res, lib_path=path)


def worker_runner(factory: Callable[[], Any]) -> Any:
    """This process's long-lived runner made by ``factory`` (one per distinct factory)."""
    key = pickle.dumps(factory)
    with _runners_lock:
        if key not in _runners:
            _runners[key] = factory()
        return _runners[key]


def close_runners() -> None:
    """Stop this process's runners (their measuring children)."""
    with _runners_lock:
        runners = list(_runners.values())
        _runners.clear()
    for r in runners:
        with contextlib.suppress(Exception):
            r.close()


atexit.register(close_runners)


def measure_job(factory: Callable[[], Any], request: RunRequest, inputs: list | None = None, expected: Any = None,
                source: str | None = None, shipped: Shipped | None = None,
                build_cpus: Iterable[int] | None = None, announce: str | None = None) -> MeasureResult:
    """Measure ``request`` on this worker's device: against ``shipped`` (a build made elsewhere), or
    after building ``source`` here with the runner's own ``build`` (pinned to ``build_cpus``).
    ``inputs`` / ``expected`` replace the request's arrays when given (sent apart, once per batch).
    ``announce``: a Dask event topic to log this task's start on (:func:`started`)."""
    if announce:
        started(announce)
    try:
        if inputs is not None:
            request = dataclasses.replace(request, inputs=list(inputs), expected=expected)
        runner = worker_runner(factory)
        if shipped is not None:
            b = materialize(shipped)
        else:
            with pinned(build_cpus):
                [b] = runner.build([source])
        return _named(runner.run(request, build=b))
    except CacheWriteError:  # the worker's disk: never stored as the candidate's failure (the run stops)
        raise
    except Exception:
        return MeasureResult("runtime_error", error="measuring worker failed: " + traceback.format_exc(limit=4))


class HashLatency:
    """A picklable stand-in timer for tests: a latency drawn from the source's hash (deterministic
    across processes); every ``fail_every``-th hash bucket a ``wrong_result``, every ``die_every``-th
    one kills the process measuring it (a worker dying mid-measurement); ``sleep_s`` of simulated work."""

    def __init__(self, fail_every: int = 0, sleep_s: float = 0.0, die_every: int = 0):
        self.fail_every, self.sleep_s, self.die_every = int(fail_every), float(sleep_s), int(die_every)

    def bucket(self, source: str) -> int:
        import hashlib

        return int.from_bytes(hashlib.sha256(source.encode()).digest()[:8], "little")

    def __call__(self, source: str) -> float | MeasureResult:
        import time

        if self.sleep_s:
            time.sleep(self.sleep_s)
        h = self.bucket(source)
        if self.die_every and (h >> 20) % self.die_every == 0:
            os._exit(3)  # this (worker) process dies mid-measurement
        if self.fail_every and h % self.fail_every == 0:
            return MeasureResult("wrong_result", error="replay: planted failure")
        return 1e-4 * (1.0 + (h % 10_000) / 1000.0)


def replay_runner(fail_every: int = 0, sleep_s: float = 0.0, die_every: int = 0) -> Any:
    """A source-level :class:`~codegen.run.replay.ReplayRunner` of :class:`HashLatency` (tests, benchmarks)."""
    from .replay import ReplayRunner

    return ReplayRunner(HashLatency(fail_every, sleep_s, die_every))
