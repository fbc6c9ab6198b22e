"""Measuring compiled kernels: the timing protocol, result records and the local runner.

Every kernel library exports the kernel ABI:

    void fj_kernel(void* const* bufs);               // one call of the kernel
    double fj_time(void* const* bufs, long number);  // `number` calls, returns total seconds
    void fj_set_threads(int n);                      // omp_set_num_threads

`bufs` = the inputs in order (read-only, each of its array's dtype), then the output (of
`RunRequest.out_dtype`), then a byte workspace (possibly of size 0: it still gets a valid 64-byte
aligned pointer). Appending `TIMING_HARNESS_C` (codegen.renderers.harness) to a source that defines
`fj_kernel` provides the other two. Optionally a library may also export

    void fj_prepare(void* const* bufs);              // once per request, before any fj_kernel

which the runner calls once, untimed, after the inputs are in place: the place to pack constant
weights into the workspace (as at inference, where weights are constants).

Measurements on one device never overlap, across processes too: `LocalRunner` holds a machine-wide
`MeasureLock` (an `fcntl.flock` on `felixjax-measure-<uid>-<device>.lock` in the temp directory or
`$FELIXJAX_LOCK_DIR`) for the duration of each request. Foreign load is detected as well: over the
timed repeats the child compares its process CPU time with the wall time; a measurement whose wall
time exceeds `max_wall_cpu_ratio` (1.5) x its CPU time was descheduled for a third of the time, and
so was one in which a thread of the kernel waited a third of the time for a CPU (Linux's per-thread
run-queue delay: a multi-threaded kernel waits for its slowest thread at every barrier, while its
other threads keep the CPU time high); such a measurement
is timed again (up to `remeasure` = 2 more times); if it stays disturbed its status is `noisy`
(not ok: kept with its latencies, never stored as a clean `ok`). A timer that returns NaN, inf
or a negative time gives a `runtime_error`, never a crash.

`LocalRunner` measures in ONE long-lived child process started with `spawn`: whatever a kernel
does (segfault, hang, out-of-bounds write, wrong answer) is recorded as a status and the child is
replaced; the parent never runs kernel code. For each request the child allocates guarded,
64-byte aligned buffers, runs the kernel once, checks the output against the reference, times it
per the `TimingProtocol` (the loop runs in C, so ctypes overhead is not timed), then checks the
output, the guard zones and the inputs again.

Example:
    >>> import numpy as np
    >>> from codegen.build import build
    >>> from codegen.measure import LocalRunner, RunRequest, TIMING_HARNESS_C
    >>> src = '''void fj_kernel(void* const* b) {
    ...   const float* x = b[0]; float* y = b[1];
    ...   for (int i = 0; i < 8; ++i) y[i] = 2 * x[i];
    ... }''' + TIMING_HARNESS_C
    >>> x = np.arange(8, dtype=np.float32)
    >>> with LocalRunner() as runner:
    ...     res = runner.run(RunRequest(None, [x], (8,), 0, 2 * x), build=build(src))
    >>> res.status, res.latency_s > 0
    ('ok', True)
"""

from __future__ import annotations

import collections
import dataclasses
import math
import multiprocessing
import os
import signal
import sys
import threading
import time
import types
from typing import Any, Sequence

import numpy as np

from codegen.build import BuildResult
from codegen.measure_child import _child_main, load_kernel_library  # noqa: F401  (load_kernel_library: re-exported)
from codegen.measure_records import (  # noqa: F401  (the records are re-exported: codegen.measure is their public home)
    _LOCK_TIMEOUT_S, _MAX_WALL_CPU_RATIO, _READY_TIMEOUT_S, _REMEASURE, _STEP_FACTOR, _STEP_FLOOR_S,
    MAX_SPREAD, STATUSES, MeasureResult, RunRequest, TimingProtocol, check_output, disturbed, invalid_latencies,
    spread_out,
)
from codegen.renderers.harness import TIMING_HARNESS_C
from codegen.measure_lock import MeasureLock, lock_path  # noqa: F401


#: how a result whose kernel killed the measuring process (a signal) begins its error
CRASHED = "kernel crashed the measuring process"

__all__ = [
    "CRASHED",
    "STATUSES",
    "TIMING_HARNESS_C",
    "LocalRunner",
    "MeasureLock",
    "MeasureResult",
    "RunRequest",
    "TimingProtocol",
    "check_output",
]


class LocalRunner:
    """Measures kernels one at a time in a long-lived `spawn`ed child process.

    Thread-safe: requests are serialized by a lock (one measurement at a time on this device), and
    across processes by a `MeasureLock` on the device (``lock=False`` or the environment variable
    ``FELIXJAX_MEASURE_LOCK=0`` turns that off).
    Kernel failures become statuses; after a crash, hang, wrong result or touched canary the
    child is replaced. Use as a context manager, or call `close()`.

    The child does not re-import the parent's `__main__` (unlike a plain `spawn`), so scripts
    need no `if __name__ == "__main__":` guard and a JAX-heavy main does not slow child starts.

    Args:
        protocol: default timing protocol.
        timeout_s: default limit for loading a library and the first kernel call. Every later
            timed step is announced by the child with its expected duration d and must end
            within `_STEP_FLOOR_S + _STEP_FACTOR * d` (generous: a loaded machine is no hang).
        lib_cache: number of loaded libraries the child keeps open.
        device: the device measured on (names the machine-wide lock).
        lock: hold the machine-wide measuring lock of `device` during each request.
        lock_timeout_s: how long to wait for the lock; past it the kernel is measured anyway and a
            correct result is recorded as `noisy` (the other process's kernel may have run alongside).
        max_wall_cpu_ratio: a timing attempt whose wall time exceeds this multiple of the child's CPU
            time is disturbed (None: never); default `$FELIXJAX_MAX_WALL_CPU_RATIO` (a number, or
            ``off``), else 1.5. `remeasure`: attempts after a disturbed one before the
            result is `noisy`.

    Attributes:
        lock_history: (acquired, released) `time.monotonic()` pairs of the latest requests.

    Example:
        >>> with LocalRunner(protocol=TimingProtocol.quick()) as runner:
        ...     runner.pid > 0
        True
    """

    def __init__(
        self,
        *,
        protocol: TimingProtocol = TimingProtocol(),
        timeout_s: float = 10.0,
        lib_cache: int = 16,
        device: str = "cpu",
        lock: bool = True,
        lock_timeout_s: float = _LOCK_TIMEOUT_S,
        max_wall_cpu_ratio: float | None | str = "env",
        remeasure: int = _REMEASURE,
    ) -> None:
        self.protocol = protocol
        self.timeout_s = timeout_s
        self.lib_cache = lib_cache
        if os.environ.get("FELIXJAX_MEASURE_LOCK", "1").strip().lower() in ("0", "false", "no", "off"):
            lock = False
        self.measure_lock = MeasureLock(device, timeout_s=lock_timeout_s) if lock else None
        self.lock_history: collections.deque[tuple[float, float]] = collections.deque(maxlen=4096)
        self.max_wall_cpu_ratio = _wall_cpu_ratio() if max_wall_cpu_ratio == "env" else max_wall_cpu_ratio
        self.remeasure = max(0, int(remeasure))
        self.restarts = 0  # children replaced after a failure (for logs and tests)
        self._ctx = multiprocessing.get_context("spawn")  # never fork: parent may run JAX/OpenMP
        self._lock = threading.Lock()
        self._proc = None
        self._conn = None
        self._ready = False

    def __enter__(self) -> LocalRunner:
        with self._lock:
            self._ensure_child()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def pid(self) -> int:
        """Process id of the current measuring child (starting one if needed)."""
        with self._lock:
            self._ensure_child()
            return self._proc.pid

    def close(self) -> None:
        """Stops the child process."""
        with self._lock:
            self._stop_child(graceful=True)

    def run(self, request: RunRequest, *, build: BuildResult | None = None) -> MeasureResult:
        """Measures one kernel.

        Args:
            request: what to run; its `lib_path` may be None when `build` is given.
            build: the kernel's build: a failed build is returned as compile_error (or
                timeout) without running; its seconds go into `build_s`.

        Returns:
            A `MeasureResult`; kernel failures are statuses, never exceptions.

        Raises:
            ValueError: the request itself is inconsistent (shapes, missing lib_path).
            RuntimeError: the measuring process cannot be started.
        """
        build_s = build.seconds if build is not None else 0.0
        if build is not None:
            if build.status != "ok":
                status = "timeout" if build.status == "timeout" else "compile_error"
                return MeasureResult(status, error=build.error, build_s=build_s)
            request = dataclasses.replace(request, lib_path=build.lib_path)
        payload = _payload(request, request.protocol or self.protocol)
        payload["max_wall_cpu_ratio"] = self.max_wall_cpu_ratio
        payload["remeasure"] = self.remeasure
        timeout_s = request.timeout_s if request.timeout_s is not None else self.timeout_s
        with self._lock:
            start = time.perf_counter()
            self._ensure_child()  # a child's start-up (imports) is not measuring: outside the lock
            wait_start = time.perf_counter()
            locked = self.measure_lock.acquire() if self.measure_lock is not None else True
            acquired, waited_s = time.monotonic(), time.perf_counter() - wait_start
            try:
                out = self._exchange(payload, timeout_s)
            except BaseException:
                # Interrupted mid-request (e.g. Ctrl-C): the child's late replies would answer
                # the next request, so it must go.
                self._stop_child(graceful=False)
                raise
            finally:
                # The interval closes before the lock is released: a waiter woken by the release
                # stamps its start after this, so recorded intervals of two processes never overlap.
                self.lock_history.append((acquired, time.monotonic()))
                if self.measure_lock is not None and locked:
                    self.measure_lock.release()
            run_s = time.perf_counter() - start - waited_s  # waiting for another process's turn is not ours
        status, latencies, error = _interpret(out, self.max_wall_cpu_ratio)
        if not locked and status == "ok":
            status, error = "noisy", (f"measured without the measuring lock: {self.measure_lock.describe_holder()} "
                                      f"held it for more than {self.measure_lock.timeout_s:g} s")
        return MeasureResult(status, latencies, error, build_s, run_s)

    def run_many(
        self, requests: Sequence[RunRequest], builds: Sequence[BuildResult] | None = None
    ) -> list[MeasureResult]:
        """Measures requests one after another (optionally paired with their builds)."""
        builds = builds if builds is not None else [None] * len(requests)
        return [self.run(r, build=b) for r, b in zip(requests, builds, strict=True)]

    # -- child management (callers hold self._lock) --

    def _start_child(self) -> None:
        """Starts a child if there is none, without waiting for it to be ready."""
        if self._proc is not None and not self._proc.is_alive():
            self._stop_child(graceful=False)
        if self._proc is not None:
            return
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(
            target=_child_main,
            args=(child_conn, self.lib_cache, os.getpid()),  # (it ends when this process is gone)
            name="felixjax-measure",
            daemon=True,
        )
        _start_without_main(proc)
        child_conn.close()  # so the parent sees EOF when the child dies
        self._proc, self._conn, self._ready = proc, parent_conn, False

    def _ensure_child(self) -> None:
        """Starts a child if needed and waits until it is ready to serve requests."""
        self._start_child()
        if self._ready:
            return
        try:
            msg = self._conn.recv() if self._conn.poll(_READY_TIMEOUT_S) else ("silent",)
        except (EOFError, OSError):
            msg = ("died",)
        if msg[0] != "ready":
            code = self._proc.exitcode
            self._stop_child(graceful=False)
            raise RuntimeError(f"measuring process failed to start ({msg[0]}, exit code {code})")
        self._ready = True

    def _stop_child(self, *, graceful: bool) -> None:
        proc, conn = self._proc, self._conn
        self._proc, self._conn, self._ready = None, None, False
        if proc is None:
            return
        if graceful and proc.is_alive():
            try:
                conn.send(("stop",))
                proc.join(2.0)
            except (OSError, ValueError):
                pass
        if proc.is_alive():
            proc.kill()  # this runner's own child, by its handle
        proc.join(5.0)
        conn.close()
        if proc.exitcode is not None:
            proc.close()

    def _restart(self) -> None:
        """Replaces the child now, so the new one boots while the caller does other work."""
        self.restarts += 1
        self._stop_child(graceful=False)
        self._start_child()

    def _exchange(self, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Sends one request to the child and waits for its result, watching for crashes/hangs."""
        self._ensure_child()
        try:
            self._conn.send(("run", payload))
        except (OSError, ValueError):
            # The child died while idle (e.g. killed from outside): one fresh attempt.
            self._restart()
            self._ensure_child()
            self._conn.send(("run", payload))
        deadline = time.monotonic() + timeout_s
        phase = f"no reply within {timeout_s:g} s of loading and the first call"
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._restart()
                return {"status": "timeout", "error": f"kernel hung: {phase}"}
            try:
                if not self._conn.poll(min(remaining, 1.0)):
                    if not self._proc.is_alive():
                        return self._died()
                    continue
                msg = self._conn.recv()
            except (EOFError, OSError):
                return self._died()
            if msg[0] == "progress":  # the child starts a step expected to take msg[1] s
                expected_s = msg[1] if math.isfinite(msg[1]) and msg[1] >= 0 else 0.0  # a broken timer
                allowed = _STEP_FLOOR_S + _STEP_FACTOR * expected_s
                deadline = time.monotonic() + allowed
                phase = f"a step expected to take {expected_s:.3g} s ran past {allowed:.3g} s"
            elif msg[0] == "result":
                result = msg[1]
                if result.pop("restart", False):
                    self._restart()
                return result

    def _died(self) -> dict[str, Any]:
        """Records a child that died mid-request and replaces it."""
        self._proc.join(5.0)
        code = self._proc.exitcode
        if code is not None and code < 0:
            try:
                how = f"killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"killed by signal {-code}"
            if code == -signal.SIGKILL:
                how += " (out of memory?)"
        else:
            how = f"exited with code {code}"
        self._restart()
        return {"status": "runtime_error", "error": f"{CRASHED}: {how}"}


def _wall_cpu_ratio() -> float | None:
    raw = os.environ.get("FELIXJAX_MAX_WALL_CPU_RATIO", "").strip().lower()
    if not raw:
        return _MAX_WALL_CPU_RATIO
    if raw in ("off", "none", "inf", "0"):
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"FELIXJAX_MAX_WALL_CPU_RATIO={raw!r}: expected a number > 1 or 'off'") from None
    if not value > 1:
        raise ValueError(f"FELIXJAX_MAX_WALL_CPU_RATIO={raw!r}: expected a number > 1 or 'off'")
    return value


def _interpret(out: dict[str, Any], max_ratio: float | None) -> tuple[str, tuple, str]:
    """The child's reply as (status, latencies, error): invalid timer readings are a runtime_error,
    a measurement disturbed in every attempt is `noisy`."""
    status, latencies, error = out["status"], tuple(out.get("latencies", ())), out.get("error", "")
    if status != "ok":
        return status, (), error
    bad = invalid_latencies(latencies)
    if bad is not None:
        return "runtime_error", (), bad
    # (wall, CPU, longest run-queue wait of a thread or None) per timing attempt (older children: no wait)
    attempts = [(a[0], a[1], a[2] if len(a) > 2 else None) for a in out.get("attempts") or []]
    if attempts and all(disturbed(w, c, max_ratio, q) for w, c, q in attempts):
        shown = ", ".join(f"{w * 1e3:.3g} ms wall / {c * 1e3:.3g} ms CPU"
                          + (f" / a thread waited {q * 1e3:.3g} ms for a CPU" if q is not None else "")
                          for w, c, q in attempts)
        try:
            load = " (load average %.2f %.2f %.2f)" % os.getloadavg()
        except OSError:
            load = ""
        return "noisy", latencies, (f"disturbed measurement: in all {len(attempts)} attempts the timed repeats "
                                    f"took more than {max_ratio:g}x their CPU time or a thread waited more than "
                                    f"{1 - 1 / max_ratio:.0%} of the time for a CPU ({shown}); another process "
                                    f"was using this CPU{load}")
    if max_ratio is not None and spread_out(latencies):
        return "noisy", latencies, (f"disturbed measurement: its repeats spread {max(latencies) / min(latencies):.0f}x "
                                    f"({min(latencies) * 1e3:.3g}-{max(latencies) * 1e3:.3g} ms), more than "
                                    f"{MAX_SPREAD:g}x, and no attempt was undisturbed: time the CPU did not give the "
                                    f"kernel (e.g. a virtual machine's stolen time) that neither CPU-time sign sees")
    return status, latencies, error


def _start_without_main(proc: multiprocessing.process.BaseProcess) -> None:
    """Starts a `spawn` process that does not re-run the parent's `__main__` module.

    `spawn` records the main module's file or name and the child re-imports it: that re-runs
    unguarded scripts (recursively starting runners), fails for `python - < script`, and imports
    JAX into every measuring child. The child needs only this module, so `__main__` is hidden
    for the moment `start()` reads it (the preparation data is taken synchronously in start).
    """
    with _MAIN_SWAP:  # two runners starting in two threads: the second restored the first's stand-in for good
        main = sys.modules["__main__"]
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            proc.start()
        finally:
            sys.modules["__main__"] = main


#: one `_start_without_main` at a time in this process (it swaps a process-wide module)
_MAIN_SWAP = threading.Lock()


def _payload(request: RunRequest, protocol: TimingProtocol) -> dict[str, Any]:
    """Validates a request and turns it into what the child receives."""
    if not request.lib_path:
        raise ValueError("RunRequest.lib_path is empty (pass build= or set lib_path)")
    out_shape = tuple(int(d) for d in request.out_shape)
    expected = np.asarray(request.expected)
    if expected.shape != out_shape:
        raise ValueError(f"expected has shape {expected.shape}, out_shape is {out_shape}")
    if not np.issubdtype(expected.dtype, np.floating) or not np.isfinite(expected).all():
        raise ValueError("expected must be a finite floating-point array")
    inputs = [np.ascontiguousarray(x) for x in request.inputs]
    if any(x.dtype == np.float64 for x in inputs):
        raise ValueError("float64 input: the kernel ABI reads float32 (use astype(np.float32))")
    if request.workspace_bytes < 0 or request.threads < 1:
        raise ValueError("workspace_bytes must be >= 0 and threads >= 1")
    out_dtype = np.dtype(request.out_dtype)
    return {
        "lib_path": os.fspath(request.lib_path),
        "inputs": inputs,
        "out_shape": out_shape,
        "workspace_bytes": int(request.workspace_bytes),
        "out_dtype": out_dtype.str,
        "expected": expected,
        "rtol": float(request.rtol),
        "atol": float(request.atol),
        "K": int(request.reduction_size),
        "threads": int(request.threads),
        "protocol": protocol,
    }
