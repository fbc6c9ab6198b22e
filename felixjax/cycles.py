"""CPU cycles and instructions of this process's threads, from the kernel's performance counters.

This host is a shared VM: its wall-clock time per call of one unchanged kernel moves by 10-20% within
minutes (other tenants, frequency), and a 5x swing while tests ran beside it. Cycles counted in user
mode while the process's own threads run do not include the time the thread was descheduled, and
instructions barely move at all, so an A/B comparison of two kernels of the same task in cycles per
call separates differences of a few percent that wall time cannot (issue 14's kernel work). It is a
development measure, not a latency: it ignores time lost to preemption, and at several threads it sums
every thread's cycles (spin-waits at barriers included), so it is CPU cost, not elapsed time.
Published speed ratios against onnxruntime stay in wall time (``time_interleaved``).

Linux only (``perf_event_open``, user-mode counting of one's own threads: ``perf_event_paranoid`` <= 2);
:func:`available` says whether this machine allows it.

Example:
    >>> if available():
    ...     with ThreadCounters("instructions") as c:
    ...         _ = sum(range(10_000))
    ...     assert c.read() > 10_000
"""
from __future__ import annotations

import ctypes
import fcntl
import functools
import os
import platform
import struct

#: name -> (perf type, config): PERF_TYPE_HARDWARE cycles / instructions; PERF_TYPE_HW_CACHE L1D reads
#: and their misses ((L1D) | (OP_READ << 8) | (RESULT_ACCESS / _MISS << 16))
EVENTS = {"cycles": (0, 0), "instructions": (0, 1), "l1d-loads": (3, 0), "l1d-misses": (3, 1 << 16)}
_SYSCALL = {"x86_64": 298, "aarch64": 241}  # __NR_perf_event_open
_ENABLE, _DISABLE = 0x2400, 0x2401  # PERF_EVENT_IOC_ENABLE / _DISABLE
# attr.flags bits: disabled (0), exclude_kernel (5), exclude_hv (6)
_FLAGS = (1 << 0) | (1 << 5) | (1 << 6)


class _Attr(ctypes.Structure):  # struct perf_event_attr, PERF_ATTR_SIZE_VER5 (112 bytes)
    _fields_ = [("type", ctypes.c_uint32), ("size", ctypes.c_uint32), ("config", ctypes.c_uint64),
                ("sample_period", ctypes.c_uint64), ("sample_type", ctypes.c_uint64),
                ("read_format", ctypes.c_uint64), ("flags", ctypes.c_uint64), ("wakeup_events", ctypes.c_uint32),
                ("bp_type", ctypes.c_uint32), ("config1", ctypes.c_uint64), ("config2", ctypes.c_uint64),
                ("branch_sample_type", ctypes.c_uint64), ("sample_regs_user", ctypes.c_uint64),
                ("sample_stack_user", ctypes.c_uint32), ("clockid", ctypes.c_int32),
                ("sample_regs_intr", ctypes.c_uint64), ("aux_watermark", ctypes.c_uint32),
                ("sample_max_stack", ctypes.c_uint16), ("reserved", ctypes.c_uint16)]


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _open(event: str, tid: int) -> int:
    """A disabled user-mode counter of ``event`` on thread ``tid`` of this process (raises OSError)."""
    nr = _SYSCALL.get(platform.machine())
    if nr is None or not hasattr(ctypes, "CDLL"):
        raise OSError(f"no perf_event_open on {platform.system()} {platform.machine()}")
    kind, config = EVENTS[event]
    attr = _Attr(type=kind, size=ctypes.sizeof(_Attr), config=config, flags=_FLAGS)
    fd = _libc().syscall(ctypes.c_long(nr), ctypes.byref(attr), ctypes.c_int(tid), ctypes.c_int(-1),
                      ctypes.c_int(-1), ctypes.c_ulong(0))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"perf_event_open({event}): {os.strerror(err)}")
    return int(fd)


def _threads() -> list[int]:
    return sorted(int(t) for t in os.listdir(f"/proc/{os.getpid()}/task"))


class ThreadCounters:
    """One event counted on every thread this process has when the block starts (OpenMP's and
    onnxruntime's pools included), summed; a context manager. Threads started inside the block are not
    counted: warm a contender up first, so its pool exists.

    Raises ``OSError`` on entry where counters are unavailable (see :func:`available`)."""

    def __init__(self, event: str = "cycles"):
        if event not in EVENTS:
            raise ValueError(f"unknown event {event!r}; one of {sorted(EVENTS)}")
        self.event, self._fds, self._total = event, [], 0

    def __enter__(self) -> ThreadCounters:
        try:
            for tid in _threads():
                try:
                    self._fds.append(_open(self.event, tid))
                except ProcessLookupError:  # the thread ended meanwhile
                    continue
        except BaseException:
            self._close()
            raise
        for fd in self._fds:
            fcntl.ioctl(fd, _ENABLE, 0)
        return self

    def __exit__(self, *exc) -> None:
        for fd in self._fds:
            fcntl.ioctl(fd, _DISABLE, 0)
        self._total = sum(struct.unpack("q", os.read(fd, 8))[0] for fd in self._fds)
        self._close()

    def _close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []

    def read(self) -> int:
        """The event's count over the block (after it ended)."""
        return self._total


def available(event: str = "cycles") -> bool:
    """Whether this process may count ``event`` on its own threads (Linux, a PMU the VM exposes,
    ``perf_event_paranoid`` <= 2)."""
    try:
        with ThreadCounters(event) as c:
            sum(range(1000))
        return c.read() > 0
    except OSError:
        return False

