"""Measurement records and checks: the timing protocol, results, requests, the output check and the
constants shared by the measuring parent (:mod:`codegen.measure`) and child (:mod:`codegen.measure_child`)."""
from __future__ import annotations

import _ctypes
import dataclasses
import math
import numbers
import os
import statistics
import time
from typing import Any, Sequence

import numpy as np


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
        counts = {"warmup": 0, "repeats": 1, "max_number": 1, "flush_bytes": 0}  # whole numbers, at least these
        for name, least in counts.items():
            v = getattr(self, name)
            if not isinstance(v, numbers.Integral) or isinstance(v, (bool, np.bool_)) or v < least:
                raise ValueError(f"invalid timing protocol: {name}={v!r} (a whole number >= {least})")
            object.__setattr__(self, name, int(v))  # (a numpy integer: plain, for JSON and ctypes)
        ms = self.min_repeat_ms
        if not isinstance(ms, numbers.Real) or isinstance(ms, (bool, np.bool_)) or not 0 <= ms < math.inf:
            raise ValueError(f"invalid timing protocol: min_repeat_ms={ms!r} (a finite number of ms >= 0)")
        if not isinstance(self.flush_cache, (bool, np.bool_)):
            raise ValueError(f"invalid timing protocol: flush_cache={self.flush_cache!r} (a bool)")  # noqa: TRY004
        object.__setattr__(self, "min_repeat_ms", float(ms))
        object.__setattr__(self, "flush_cache", bool(self.flush_cache))

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
        """True when the kernel ran correctly and was timed: status ``ok`` and every latency finite and
        positive (a record written by hand or imported with a NaN, infinite or zero time is no measurement;
        the tuner stores such a timer's answer as a ``runtime_error``)."""
        return self.status == "ok" and bool(self.latencies) and all(0.0 < t < math.inf for t in self.latencies)

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
        out_dtype: dtype of the output buffer (float32, float16, or int8 for a requantized int8 task).
        atol: absolute tolerance added to `check_output`'s (e.g. one quantum of a requantized int8 output).
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
    atol: float = 0.0


def check_output(
    y: np.ndarray, ref: np.ndarray, K: int, rtol: float = 1e-4, *, c: float = 4.0, atol: float = 0.0
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
        atol: an absolute tolerance added to every element's (default 0).

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
    tol += _TINY32 + atol  # an all-zero reference still tolerates denormal noise
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


def disturbed(wall_s: float, cpu_s: float, max_ratio: float | None = _MAX_WALL_CPU_RATIO,
              waited_s: float | None = None) -> bool:
    """Whether a timed loop was disturbed, by either of two signs (each beyond clock noise):

    * its wall time exceeds ``max_ratio`` times the measuring process's CPU time (all its threads):
      for a good share of the time none of its threads ran (an undisturbed process has at least one
      thread running, working or spinning, at every moment);
    * ``waited_s``, the longest time one of its threads spent runnable but waiting for a CPU (the
      kernel's run-queue delay, :func:`run_delays`, scaled to the timed repeats), exceeds the same
      share ``1 - 1 / max_ratio`` of the wall time. A multi-threaded kernel waits at every barrier
      for its slowest thread, so one thread kept off its core slows the whole loop while the others
      still fill the CPU time (sessions 72-73: 2-thread re-timings 10x off under a load of 2-5 passed
      the first test). A thread that sleeps at a barrier is not waiting for a CPU: it does not count.

    Example:
        >>> disturbed(0.100, 0.098), disturbed(0.100, 0.050), disturbed(0.100, 0.050, None)
        (False, True, False)
        >>> disturbed(0.100, 0.160, waited_s=0.002), disturbed(0.100, 0.160, waited_s=0.050)
        (False, True)
    """
    if max_ratio is None:
        return False
    if waited_s is not None and waited_s > (1 - 1 / max_ratio) * wall_s and waited_s > _MIN_LOST_S:
        return True
    return wall_s > max_ratio * cpu_s and wall_s - cpu_s > _MIN_LOST_S


MAX_SPREAD = 10.0
"""An attempt whose second slowest repeat took over this many times its fastest is disturbed (timed again; ``noisy``
if the attempt kept is). Session 80: a review saw ``ok`` repeats of 11.9, 11.9, 4.9, 0.058 and 0.015 ms on a busy
virtual machine, median 4.9 ms, past both CPU-time signs of :func:`disturbed` (a hypervisor's stolen time counts
as the guest's CPU time); a kernel's own variation never spreads its repeats that far."""


def spread_out(latencies: Sequence[float]) -> bool:
    """Whether the repeats spread more than :data:`MAX_SPREAD` (see there), the slowest left out (one interrupted
    repeat of a microsecond kernel timed one call per repeat, the cold-cache protocol, is not a disturbed loop)."""
    lat = sorted(latencies)
    return len(lat) > 2 and lat[-2] > MAX_SPREAD * lat[0]


def run_delays() -> dict[str, int] | None:
    """Each thread of this process: nanoseconds it has spent runnable but waiting for a CPU (Linux's
    ``/proc/self/task/<tid>/schedstat``, second field); ``None`` where the kernel does not provide it.
    The difference of two readings around a timed loop is the time another process took from it."""
    out = {}
    try:
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    out[tid] = int(f.read().split()[1])
            except FileNotFoundError:  # a thread that ended between the listing and the read
                continue
    except (OSError, ValueError, IndexError):
        return None
    return out or None


def longest_wait_s(before: dict[str, int] | None, after: dict[str, int] | None) -> float | None:
    """The largest per-thread run-queue delay between two :func:`run_delays` readings, in seconds."""
    if before is None or after is None:
        return None
    return max((after[t] - before.get(t, 0) for t in after), default=0) / 1e9
