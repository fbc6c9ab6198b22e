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
time exceeds `max_wall_cpu_ratio` (1.5) x its CPU time was descheduled for a third of the time and
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

import _ctypes
import collections
import ctypes
import ctypes.util
import dataclasses
import fcntl
import math
import multiprocessing
import os
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
import traceback
import types
from typing import Any, Sequence

import numpy as np

from codegen.build import BuildResult
from codegen.renderers.harness import TIMING_HARNESS_C

__all__ = [
    "STATUSES",
    "TIMING_HARNESS_C",
    "LocalRunner",
    "MeasureLock",
    "MeasureResult",
    "RunRequest",
    "TimingProtocol",
    "check_output",
]

STATUSES = ("ok", "compile_error", "runtime_error", "timeout", "wrong_result", "noisy")

# TIMING_HARNESS_C (the C timing harness) lives in codegen.renderers.harness; imported above.

_EPS32 = float(np.finfo(np.float32).eps)
_TINY32 = float(np.finfo(np.float32).tiny)
_ALIGN = 64
_GUARD_BYTES = 4096  # 1024 floats of canary on each side of every buffer
_CANARY_WORD = 0x7FA5A5A5  # a signalling-NaN bit pattern: no kernel computes it by chance
_STEP_FLOOR_S = 5.0  # hang detection after the first call: floor + factor x expected step
_STEP_FACTOR = 20.0  # (2-thread kernels on a loaded 2-core VM were seen running 80x slower)
_READY_TIMEOUT_S = 120.0  # child start-up: imports numpy (a loaded machine can be slow)
_MAX_WALL_CPU_RATIO = 1.5  # wall > 1.5 x process CPU over the timed repeats: descheduled, disturbed
_REMEASURE = 2  # timing attempts after a disturbed one
_MIN_LOST_S = 1e-3  # ... and more than 1 ms of wall time not spent on the CPU (clock noise of tiny loops)
_LOCK_TIMEOUT_S = 300.0  # waiting for another process's measurement (each is bounded by hang detection)
_dlclose = getattr(_ctypes, "dlclose", None)  # POSIX only; ctypes itself never unloads


@dataclasses.dataclass(frozen=True)
class TimingProtocol:
    """How one kernel is timed.

    After a correctness-checked first call: `warmup` untimed calls, then `number` (calls per
    repeat) is calibrated so that one repeat lasts at least `min_repeat_ms` (capped at
    `max_number`), then `repeats` repeats of `number` calls are timed in C. Each repeat yields the
    mean seconds per call; the median over repeats is reported. With the defaults a fast kernel
    costs about 0.15 s (5 x 20 ms + calibration + checks); a kernel slower than 20 ms per call
    costs about (repeats + 2) calls. See `estimate_s`.

    Attributes:
        warmup: untimed calls after the first (checked) call.
        min_repeat_ms: minimum duration of one repeat; 0 means number = 1.
        repeats: timed repeats (latencies has one entry per repeat).
        max_number: cap on calls per repeat.
        flush_cache: before each repeat, write a buffer of `flush_bytes` to evict caches. This
            only affects the first call of a repeat: for cold-cache timing use min_repeat_ms=0.
        flush_bytes: size of the flush buffer; 0 means twice the detected L2.
    """

    warmup: int = 1
    min_repeat_ms: float = 20.0
    repeats: int = 5
    max_number: int = 100_000
    flush_cache: bool = False
    flush_bytes: int = 0

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.repeats < 1 or self.max_number < 1 or self.min_repeat_ms < 0:
            raise ValueError(f"invalid timing protocol: {self}")

    @classmethod
    def quick(cls) -> TimingProtocol:
        """A cheap protocol for tests: 3 repeats of at least 1 ms each."""
        return cls(warmup=0, min_repeat_ms=1.0, repeats=3, max_number=1000)

    def estimate_s(self, call_s: float) -> float:
        """Rough wall time of measuring a kernel that takes `call_s` seconds per call.

        Counts kernel calls only (first call, warm-up, calibration, repeats), not start-up,
        transfers or checks (a few ms for small buffers).

        Example:
            >>> round(TimingProtocol().estimate_s(1e-4), 2)  # a 0.1 ms kernel
            0.14
        """
        min_s = self.min_repeat_ms / 1e3
        calibration = 2 * min_s if call_s < min_s else 0.0  # geometric growth to >= min_s
        return (1 + self.warmup) * call_s + calibration + self.repeats * max(min_s, call_s)

    def to_json(self) -> dict[str, Any]:
        """Returns a JSON-serializable dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TimingProtocol:
        """Inverse of `to_json`."""
        return cls(**d)


@dataclasses.dataclass(frozen=True)
class MeasureResult:
    """The outcome of measuring one candidate.

    Attributes:
        status: one of `STATUSES`. `noisy`: the kernel ran correctly but every timing attempt was
            disturbed (the machine was busy); not ok, its `latencies` are upper bounds.
        latencies: seconds per kernel call, one per repeat (empty unless ok or noisy).
        error: what went wrong ("" when ok).
        build_s: seconds spent building (0 when the build was not given to the runner).
        run_s: wall seconds of the measurement, as seen by the parent.
        timestamp: Unix time when the result was made.

    Example:
        >>> r = MeasureResult("ok", (2e-3, 1e-3, 3e-3))
        >>> r.latency_s
        0.002
        >>> MeasureResult.from_json(r.to_json()) == r
        True
    """

    status: str
    latencies: tuple[float, ...] = ()
    error: str = ""
    build_s: float = 0.0
    run_s: float = 0.0
    timestamp: float = dataclasses.field(default_factory=time.time)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}; expected one of {STATUSES}")
        object.__setattr__(self, "latencies", tuple(float(t) for t in self.latencies))

    @property
    def ok(self) -> bool:
        """True when the kernel ran correctly and was timed."""
        return self.status == "ok" and bool(self.latencies)

    @property
    def latency_s(self) -> float:
        """Median latency in seconds, or inf when not ok (a failed kernel is never fast)."""
        return statistics.median(self.latencies) if self.ok else math.inf

    def to_json(self) -> dict[str, Any]:
        """Returns a JSON-serializable dict."""
        d = dataclasses.asdict(self)
        d["latencies"] = list(self.latencies)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MeasureResult:
        """Inverse of `to_json`."""
        return cls(**{**d, "latencies": tuple(d.get("latencies", ()))})


@dataclasses.dataclass
class RunRequest:
    """One kernel to measure.

    Attributes:
        lib_path: the shared library (None when passing `build=` to `LocalRunner.run`).
        inputs: input arrays in ABI order (read-only to the kernel), each passed in its own dtype
            (float32, int8, fp16, ...: copied byte for byte); float64 is refused.
        out_shape: shape of the output.
        workspace_bytes: workspace size in bytes (0 still yields a valid aligned pointer).
        expected: numpy reference output (any float dtype), shape `out_shape`.
        rtol: relative tolerance (see `check_output`).
        reduction_size: K, the number of terms summed per output element (for the tolerance).
        threads: OpenMP threads (fj_set_threads).
        timeout_s: limit for loading and the first call; None = the runner's default.
        protocol: timing protocol; None = the runner's default.
        out_dtype: dtype of the output buffer (the task's dtype; float32 for every task today).
    """

    lib_path: str | None
    inputs: list[np.ndarray]
    out_shape: tuple[int, ...]
    workspace_bytes: int
    expected: np.ndarray
    rtol: float = 1e-4
    reduction_size: int = 1
    threads: int = 1
    timeout_s: float | None = None
    protocol: TimingProtocol | None = None
    out_dtype: str = "float32"


def check_output(
    y: np.ndarray, ref: np.ndarray, K: int, rtol: float = 1e-4, *, c: float = 4.0
) -> tuple[bool, str]:
    """Checks a kernel output against a reference.

    Passes when every element satisfies |y - ref| <= rtol*|ref| + c*sqrt(K)*max|ref|*eps32: the
    absolute term scales with the rounding error of a K-term float32 sum, so sums that cancel to
    near zero do not fail spuriously. Any NaN or inf in `y` fails.

    Args:
        y: kernel output.
        ref: reference (computed in float32 or float64).
        K: reduction size (terms per output element; 1 for elementwise kernels).
        rtol: relative tolerance.
        c: safety factor of the absolute term.

    Returns:
        (ok, message): the message gives the maximum error and where it is.

    Example:
        >>> ref = np.array([1.0, 0.0, -2.0])
        >>> check_output(np.float32(ref + 1e-7), ref, K=64)[0]
        True
        >>> check_output(np.float32(ref * 1.01), ref, K=64)[0]
        False
    """
    y = np.asarray(y)
    ref = np.asarray(ref, dtype=np.float64)
    if y.shape != ref.shape:
        return False, f"shape {y.shape} != expected {ref.shape}"
    if y.size == 0:
        return True, "empty output"
    finite = np.isfinite(y)
    if not finite.all():
        first = np.unravel_index(int(np.argmin(finite)), y.shape)
        return False, (
            f"{int(y.size - finite.sum())} of {y.size} outputs are NaN/inf "
            f"(first at {_fmt_index(first)}: {y[first]})"
        )
    y64 = y.astype(np.float64)
    err = np.abs(y64 - ref)
    eps = max(float(np.finfo(y.dtype).eps), _EPS32) if np.issubdtype(y.dtype, np.floating) else _EPS32
    tol = rtol * np.abs(ref) + (c * math.sqrt(max(K, 1)) * float(np.abs(ref).max()) * eps)
    tol += _TINY32  # an all-zero reference still tolerates denormal noise
    bad = err > tol
    worst = np.unravel_index(int(np.argmax(err - tol)), y.shape)
    summary = (
        f"max |err| {err.max():.3g} at {_fmt_index(worst)}: got {y64[worst]:.7g}, "
        f"expected {ref[worst]:.7g} (tol {tol[worst]:.3g})"
    )
    if bad.any():
        return False, f"{summary}; {int(bad.sum())} of {y.size} elements out of tolerance"
    return True, summary


def _fmt_index(idx: tuple) -> str:
    return "(" + ", ".join(str(int(i)) for i in idx) + ")"


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
                if self.measure_lock is not None and locked:
                    self.measure_lock.release()
                self.lock_history.append((acquired, time.monotonic()))
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
            args=(child_conn, self.lib_cache),
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
        return {"status": "runtime_error", "error": f"kernel crashed the measuring process: {how}"}


def invalid_latencies(latencies: Sequence[float]) -> str | None:
    """Why timer readings cannot be latencies (NaN, inf, zero or negative, none at all), or None.

    Example:
        >>> invalid_latencies([1e-3, 2e-3]) is None
        True
        >>> invalid_latencies([1e-3, float("nan")])
        'the timer returned invalid latencies [0.001, nan] (NaN, inf or not positive)'
    """
    lat = list(latencies)
    if not lat:
        return "the timer returned no latencies"
    try:
        good = all(math.isfinite(float(t)) and float(t) > 0 for t in lat)
    except (TypeError, ValueError):
        good = False
    return None if good else f"the timer returned invalid latencies {lat} (NaN, inf or not positive)"


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


def disturbed(wall_s: float, cpu_s: float, max_ratio: float | None = _MAX_WALL_CPU_RATIO) -> bool:
    """Whether a timed loop was disturbed: its wall time exceeds ``max_ratio`` times the measuring
    process's CPU time (all its threads) by more than clock noise, so for a good share of the time
    none of its threads ran. An undisturbed process has at least one thread running (working or
    spinning) at every moment of a timed loop, so its CPU time is at least about its wall time.

    Example:
        >>> disturbed(0.100, 0.098), disturbed(0.100, 0.050), disturbed(0.100, 0.050, None)
        (False, True, False)
    """
    if max_ratio is None:
        return False
    return wall_s > max_ratio * cpu_s and wall_s - cpu_s > _MIN_LOST_S


def _interpret(out: dict[str, Any], max_ratio: float | None) -> tuple[str, tuple, str]:
    """The child's reply as (status, latencies, error): invalid timer readings are a runtime_error,
    a measurement disturbed in every attempt is `noisy`."""
    status, latencies, error = out["status"], tuple(out.get("latencies", ())), out.get("error", "")
    if status != "ok":
        return status, (), error
    bad = invalid_latencies(latencies)
    if bad is not None:
        return "runtime_error", (), bad
    attempts = out.get("attempts") or []
    if attempts and all(disturbed(w, c, max_ratio) for w, c in attempts):
        shown = ", ".join(f"{w * 1e3:.3g} ms wall / {c * 1e3:.3g} ms CPU" for w, c in attempts)
        try:
            load = " (load average %.2f %.2f %.2f)" % os.getloadavg()
        except OSError:
            load = ""
        return "noisy", latencies, (f"disturbed measurement: the timed repeats took more than {max_ratio:g}x "
                                    f"their CPU time in all {len(attempts)} attempts ({shown}); another process "
                                    f"was using this CPU{load}")
    return status, latencies, error


def lock_path(device: str = "cpu", directory: str | os.PathLike | None = None) -> str:
    """The machine-wide measuring lock file of `device` for this user.

    Example:
        >>> lock_path("cpu", "/tmp").startswith("/tmp/felixjax-measure-")
        True
    """
    directory = directory or os.environ.get("FELIXJAX_LOCK_DIR") or tempfile.gettempdir()
    uid = os.getuid() if hasattr(os, "getuid") else 0
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", str(device)) or "cpu"
    return os.path.join(os.fspath(directory), f"felixjax-measure-{uid}-{safe}.lock")


class MeasureLock:
    """A machine-wide exclusive lock for timing kernels on one device: `fcntl.flock` on
    `lock_path(device)`, so two processes (two tuners, a tuner and a benchmark) never time at once.
    The kernel releases it when its holder dies, so a killed tuner never leaves it held. While
    held, the file names the holder's pid (for the message of a waiter that gives up).

    `acquire` blocks (in a helper thread, so it has a timeout) and returns False when `timeout_s`
    passed without the lock; a waiter that gave up never takes the lock afterwards.

    Example:
        >>> lk = MeasureLock("doctest", timeout_s=1.0)
        >>> lk.acquire(), MeasureLock("doctest", timeout_s=0.05).acquire()
        (True, False)
        >>> lk.release()
    """

    def __init__(self, device: str = "cpu", *, directory: str | os.PathLike | None = None,
                 timeout_s: float = _LOCK_TIMEOUT_S) -> None:
        self.path = lock_path(device, directory)
        self.timeout_s = float(timeout_s)
        self._fd: int | None = None

    def _open(self) -> int:
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        return os.open(self.path, flags, 0o600)

    def acquire(self, timeout_s: float | None = None) -> bool:
        """Takes the lock; False when it stayed held by another process for `timeout_s`."""
        if self._fd is not None:
            raise RuntimeError(f"measuring lock {self.path} is already held by this object")
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass
        else:
            return self._held(fd)
        # Wait in a helper thread: a blocking flock is woken as soon as the holder releases (a
        # polling waiter could lose every race to a holder that measures back to back).
        got, mu, state = threading.Event(), threading.Lock(), {"abandoned": False}

        def wait() -> None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:
                with mu:
                    state["abandoned"] = True
                os.close(fd)
                got.set()
                return
            with mu:
                if state["abandoned"]:
                    os.close(fd)  # too late: closing releases it at once
                    return
                got.set()

        threading.Thread(target=wait, name="felixjax-measure-lock", daemon=True).start()
        got.wait(timeout_s)
        with mu:
            if got.is_set() and not state["abandoned"]:
                return self._held(fd)
            state["abandoned"] = True  # the helper closes fd if it ever gets the lock
        return False

    def _held(self, fd: int) -> bool:
        self._fd = fd
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass
        return True

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor releases the flock

    def describe_holder(self) -> str:
        """'process <pid>' as written by the current holder, or 'another process'."""
        try:
            with open(self.path) as f:
                pid = f.read(32).strip()
            return f"process {int(pid)}"
        except (OSError, ValueError):
            return "another process"

    def __enter__(self) -> "MeasureLock":
        if not self.acquire():
            raise TimeoutError(f"measuring lock {self.path} held by {self.describe_holder()} for more than "
                               f"{self.timeout_s:g} s")
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _start_without_main(proc: multiprocessing.process.BaseProcess) -> None:
    """Starts a `spawn` process that does not re-run the parent's `__main__` module.

    `spawn` records the main module's file or name and the child re-imports it: that re-runs
    unguarded scripts (recursively starting runners), fails for `python - < script`, and imports
    JAX into every measuring child. The child needs only this module, so `__main__` is hidden
    for the moment `start()` reads it (the preparation data is taken synchronously in start).
    """
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        proc.start()
    finally:
        sys.modules["__main__"] = main


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
        "K": int(request.reduction_size),
        "threads": int(request.threads),
        "protocol": protocol,
    }


# ---------------------------------------------------------------------------------------------
# Everything below runs in the measuring child.


class _Guarded:
    """A 64-byte aligned byte buffer with canary zones before and after it."""

    def __init__(self, nbytes: int, dtype: np.dtype | str = np.float32) -> None:
        self.nbytes = nbytes
        self.dtype = np.dtype(dtype)  # what the kernel indexes it as (names overwritten guard elements)
        padded = -(-nbytes // _ALIGN) * _ALIGN
        total = _GUARD_BYTES + padded + _GUARD_BYTES
        raw = np.empty(total + _ALIGN, dtype=np.uint8)
        offset = (-raw.ctypes.data) % _ALIGN
        self.raw = raw[offset : offset + total]
        self.pattern = np.full(total // 4, _CANARY_WORD, dtype=np.uint32).view(np.uint8)
        self.raw[:] = self.pattern
        self.data = self.raw[_GUARD_BYTES : _GUARD_BYTES + nbytes]
        self.ptr = self.raw.ctypes.data + _GUARD_BYTES  # 64-byte aligned, valid even if empty

    def view(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        return self.data.view(dtype).reshape(shape)

    def touched_canary(self) -> str | None:
        """Names the first overwritten guard element (as the kernel indexes it), or None."""
        end = _GUARD_BYTES + self.nbytes
        size = self.dtype.itemsize
        unit = {"float32": "floats", "uint8": "bytes"}.get(self.dtype.name, f"{self.dtype.name} elements")
        before = np.flatnonzero(self.raw[:_GUARD_BYTES] != self.pattern[:_GUARD_BYTES])
        after = np.flatnonzero(self.raw[end:] != self.pattern[end:])
        if before.size:
            index = -(-(_GUARD_BYTES - int(before[0])) // size)
            return f"[-{index}] (before its start)"
        if after.size:
            index = (self.nbytes + int(after[0])) // size
            return f"[{index}] (past its end, {self.nbytes // size} {unit})"
        return None


def load_kernel_library(path: str) -> ctypes.CDLL:
    """Load a kernel library and declare the ABI (``fj_kernel``, ``fj_time``, ``fj_set_threads``)."""
    lib = ctypes.CDLL(path)
    lib.fj_kernel.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    lib.fj_kernel.restype = None
    lib.fj_time.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_long]
    lib.fj_time.restype = ctypes.c_double
    lib.fj_set_threads.argtypes = [ctypes.c_int]
    lib.fj_set_threads.restype = None
    return lib


class _LibCache:
    """A small LRU of loaded kernel libraries (evicted ones are dlclose'd when safe)."""

    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        self.libs: collections.OrderedDict[tuple, ctypes.CDLL] = collections.OrderedDict()
        # Holding libgomp open keeps it loaded while kernel libraries come and go, so its idle
        # worker threads never outlive their code; without it, unloading is not safe.
        gomp = ctypes.util.find_library("gomp")
        try:
            self.gomp = ctypes.CDLL(gomp, mode=ctypes.RTLD_GLOBAL) if gomp else None
        except OSError:
            self.gomp = None

    def get(self, path: str) -> ctypes.CDLL:
        st = os.stat(path)
        key = (path, st.st_ino, st.st_mtime_ns)
        if key in self.libs:
            self.libs.move_to_end(key)
            return self.libs[key]
        for old in [k for k in self.libs if k[0] == path]:  # same path, new file: reload
            self._unload(old)
        lib = load_kernel_library(path)
        try:
            lib.fj_prepare.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
            lib.fj_prepare.restype = None
        except AttributeError:  # optional symbol
            lib.fj_prepare = None
        self.libs[key] = lib
        while len(self.libs) > self.size:
            self._unload(next(iter(self.libs)))
        return lib

    def _unload(self, key: tuple) -> None:
        lib = self.libs.pop(key)
        if self.gomp is not None and _dlclose is not None:
            _dlclose(lib._handle)


def _child_main(conn, lib_cache_size: int) -> None:
    """Entry point of the measuring process: serve requests until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when this process ends
    libs = _LibCache(lib_cache_size)
    flush: dict[int, np.ndarray] = {}
    conn.send(("ready", os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg[0] == "stop":
            return
        try:
            result = _measure(conn, msg[1], libs, flush)
        except Exception:
            result = {
                "status": "runtime_error",
                "error": "measuring process failed: " + traceback.format_exc(limit=4),
                "restart": True,
            }
        conn.send(("result", result))


def _measure(conn, p: dict[str, Any], libs: _LibCache, flush: dict) -> dict[str, Any]:
    """Runs, checks and times one kernel; returns a result dict (status, latencies, error)."""

    def fail(status: str, error: str, restart: bool = True) -> dict[str, Any]:
        return {"status": status, "error": error, "restart": restart}

    try:
        lib = libs.get(p["lib_path"])
    except (OSError, AttributeError) as e:  # missing file or missing ABI symbol
        return fail("runtime_error", f"cannot load kernel library: {e}", restart=False)

    inputs: list[np.ndarray] = p["inputs"]
    out_shape = p["out_shape"]
    names = [f"input{i}" for i in range(len(inputs))] + ["output", "workspace"]
    out_dtype = np.dtype(p["out_dtype"])
    out_bytes = out_dtype.itemsize * math.prod(out_shape)
    bufs = [_Guarded(x.nbytes, x.dtype) for x in inputs]
    bufs += [_Guarded(out_bytes, out_dtype), _Guarded(p["workspace_bytes"], np.uint8)]
    for buf, x in zip(bufs, inputs):
        buf.data[:] = x.reshape(-1).view(np.uint8)
    out = bufs[-2].view(out_dtype, out_shape)
    if out_dtype.kind == "f":
        out.fill(np.nan)  # a kernel that skips elements leaves NaN behind
    else:
        bufs[-2].data.fill(0xFF)
    bufs[-1].data.fill(0xFF)  # workspace starts uninitialized: all-ones bytes are NaN in every float type
    ptrs = (ctypes.c_void_p * len(bufs))(*[b.ptr for b in bufs])

    def memory_error() -> str | None:
        for name, buf in zip(names, bufs):
            where = buf.touched_canary()
            if where is not None:
                return f"out-of-bounds write: {name}{where} was overwritten"
        for i, (buf, x) in enumerate(zip(bufs, inputs)):
            changed = buf.data != x.reshape(-1).view(np.uint8)
            if changed.any():
                return f"kernel wrote into read-only input {i} (byte {int(np.argmax(changed))})"
        return None

    expected, K, rtol = p["expected"], p["K"], p["rtol"]
    protocol: TimingProtocol = p["protocol"]
    lib.fj_set_threads(p["threads"])
    if lib.fj_prepare is not None:
        lib.fj_prepare(ptrs)  # e.g. weight packing: once, untimed, checked through the output
    timed = _AnnouncedTimer(conn, lib, ptrs)
    try:
        timed(1)  # the first call, bounded by the request's timeout
    except _InvalidTime as e:
        return fail("runtime_error", str(e), restart=False)
    conn.send(("progress", 0.0))  # checks follow: a fresh window
    if (err := memory_error()) is not None:
        return fail("runtime_error", err)
    ok, msg = check_output(out, expected, K, rtol)
    if not ok:
        return fail("wrong_result", f"after the first call: {msg}")

    try:
        for _ in range(protocol.warmup):
            timed(1)
        number = _calibrate(timed, protocol)
        flush_buf = _flush_buffer(protocol, flush) if protocol.flush_cache else None
        max_ratio, attempts, latencies = p.get("max_wall_cpu_ratio"), [], []
        best = -1.0
        for _attempt in range(1 + int(p.get("remeasure", 0))):
            lat, wall_s, cpu_s = [], 0.0, 0.0
            for _ in range(protocol.repeats):
                if flush_buf is not None:
                    flush_buf += 1.0  # read and write every line: evicts the kernel's data
                c0, w0 = time.process_time(), time.perf_counter()
                lat.append(timed(number) / number)
                cpu_s += time.process_time() - c0  # every thread of this process
                wall_s += time.perf_counter() - w0
            attempts.append((wall_s, cpu_s))
            share = cpu_s / wall_s if wall_s > 0 else math.inf
            if share > best:  # keep the least disturbed attempt's latencies
                best, latencies = share, lat
            if not disturbed(wall_s, cpu_s, max_ratio):
                break
    except _InvalidTime as e:
        return fail("runtime_error", str(e), restart=False)

    conn.send(("progress", 0.0))
    if (err := memory_error()) is not None:
        return fail("runtime_error", err)
    ok, msg = check_output(out, expected, K, rtol)
    if not ok:
        return fail(
            "wrong_result",
            f"correct after the first call, wrong after the timed calls "
            f"(does it accumulate into its output?): {msg}",
        )
    if (bad := invalid_latencies(latencies)) is not None:
        return fail("runtime_error", bad, False)
    return {"status": "ok", "latencies": tuple(latencies), "error": "", "restart": False, "attempts": attempts}


class _InvalidTime(Exception):
    """fj_time returned NaN, inf or a negative time."""


class _AnnouncedTimer:
    """Calls fj_time, first telling the parent how long the call should take (hang detection)."""

    def __init__(self, conn, lib: ctypes.CDLL, ptrs) -> None:
        self.conn, self.lib, self.ptrs = conn, lib, ptrs
        self.per_call_s: float | None = None  # latest measured seconds per call

    def __call__(self, number: int) -> float:
        if self.per_call_s is not None:
            self.conn.send(("progress", number * self.per_call_s))
        seconds = self.lib.fj_time(self.ptrs, number)
        if not (math.isfinite(seconds) and seconds >= 0):
            raise _InvalidTime(f"the timer (fj_time) returned {seconds} s for {number} calls: NaN, inf or "
                               f"negative times cannot be latencies")
        self.per_call_s = seconds / number
        return seconds


def _calibrate(timed: _AnnouncedTimer, protocol: TimingProtocol) -> int:
    """Finds calls per repeat so that one repeat lasts at least min_repeat_ms."""
    min_s = protocol.min_repeat_ms / 1e3
    number, t = 1, timed.per_call_s
    while t < min_s and number < protocol.max_number:
        # Grow by the predicted factor (x1.2 margin), at most 100x per step: early timings of
        # a microsecond kernel are too coarse to extrapolate far.
        factor = min(100.0, 1.2 * min_s / max(t, 1e-9))
        number = min(protocol.max_number, max(number + 1, math.ceil(number * factor)))
        t = timed(number)
    return number


def _flush_buffer(protocol: TimingProtocol, cache: dict) -> np.ndarray:
    nbytes = protocol.flush_bytes
    if nbytes <= 0:
        from codegen.target import _cache_sizes

        nbytes = 2 * _cache_sizes()["l2_bytes"]
    if nbytes not in cache:
        cache[nbytes] = np.zeros(nbytes // 4, dtype=np.float32)
    return cache[nbytes]
