"""The measuring child process: guarded buffers, the kernel library cache, and one request measured
(run, check, time, check again). Everything here runs in the process :class:`codegen.measure.LocalRunner`
starts; the parent never runs kernel code."""
from __future__ import annotations

import collections
import ctypes
import ctypes.util
import math
import os
import signal
import threading
import time
import traceback
from typing import Any

import numpy as np

from codegen.measure_records import (
    _ALIGN,
    _CANARY_WORD,
    _GUARD_BYTES,
    TimingProtocol,
    _dlclose,
    check_output,
    disturbed,
    invalid_latencies,
    longest_wait_s,
    run_delays,
    spread_out,
)


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
        key = (path, st.st_ino, st.st_size)  # a rebuilt library is a new file (os.replace): a new inode; a hit only
        # touches its mtime (LRU for pruning, codegen.build) and must not reload it
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


PARENT_CHECK_S = 0.5  # how often the measuring process looks whether its parent is still there


def _end_with_parent(parent: int) -> None:
    """Exit this process once ``parent`` is gone (SIGKILL, SIGTERM: no ``stop`` was sent), even in the middle
    of a kernel that never returns (a daemon thread; kernel calls release the GIL). A session-82 review left an
    orphan spinning a core, disturbing every later timing on the machine."""
    def watch() -> None:
        while True:
            time.sleep(PARENT_CHECK_S)
            if os.getppid() != parent:  # re-parented (to init or a subreaper)
                os._exit(0)

    threading.Thread(target=watch, name="felixjax-parent-watch", daemon=True).start()


def _child_main(conn, lib_cache_size: int, parent: int | None = None) -> None:
    """Entry point of the measuring process: serve requests until told to stop (or the ``parent`` process
    is gone)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when this process ends
    if parent is not None:
        _end_with_parent(parent)
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
        except (BrokenPipeError, ConnectionResetError):  # the parent is gone (killed): nobody to report to,
            return  # and no traceback in its terminal
        except Exception:
            result = {
                "status": "runtime_error",
                "error": "measuring process failed: " + traceback.format_exc(limit=4),
                "restart": True,
            }
        try:
            conn.send(("result", result))
        except (BrokenPipeError, ConnectionResetError):
            return


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
    atol = float(p.get("atol", 0.0))
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
    ok, msg = check_output(out, expected, K, rtol, atol=atol)
    if not ok:
        return fail("wrong_result", f"after the first call: {msg}")

    try:
        for _ in range(protocol.warmup):
            timed(1)
        number = _calibrate(timed, protocol)
        flush_buf = _flush_buffer(protocol, flush) if protocol.flush_cache else None
        max_ratio, attempts, latencies = p.get("max_wall_cpu_ratio"), [], []
        best = math.inf
        for _attempt in range(1 + int(p.get("remeasure", 0))):
            lat, wall_s, cpu_s, waited_s = [], 0.0, 0.0, 0.0
            for _ in range(protocol.repeats):
                if flush_buf is not None:
                    flush_buf += 1.0  # read and write every line: evicts the kernel's data
                d0 = run_delays()  # each thread's run-queue delay so far (None: not on this OS)
                c0, w0 = time.process_time(), time.perf_counter()
                lat.append(timed(number) / number)
                cpu_s += time.process_time() - c0  # every thread of this process
                wall_s += time.perf_counter() - w0
                waited = longest_wait_s(d0, run_delays())
                waited_s = math.nan if waited is None else waited_s + waited
            waited_s = None if math.isnan(waited_s) else waited_s
            attempts.append((wall_s, cpu_s, waited_s))
            # keep the least disturbed attempt's latencies: the smallest share of time lost either way; a clean
            # attempt's (it ends the loop) even where an earlier one lost less CPU time but spread its repeats
            lost = max(1 - cpu_s / wall_s, (waited_s or 0.0) / wall_s) if wall_s > 0 else 0.0
            clean = not (disturbed(wall_s, cpu_s, max_ratio, waited_s) or max_ratio is not None and spread_out(lat))
            if lost < best or clean:
                best, latencies = lost, lat
            if clean:
                break
    except _InvalidTime as e:
        return fail("runtime_error", str(e), restart=False)

    conn.send(("progress", 0.0))
    if (err := memory_error()) is not None:
        return fail("runtime_error", err)
    ok, msg = check_output(out, expected, K, rtol, atol=atol)
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
