"""Run a built kernel in-process: the callable behind ``TuneResult.kernel()``.

Kernels reach this only after the measuring process checked them against numpy; running them here
(ctypes, no subprocess) is for users who want the tuned operator as a function.

Example:
    >>> from codegen.ops import matmul
    >>> from codegen.space import Space
    >>> from codegen.target import Target
    >>> from codegen.lower import lower
    >>> from codegen.render_c import render
    >>> from codegen.build import build
    >>> sp = Space(matmul(32, 32, 32), "gemm_packed", Target.cpu())
    >>> plan = lower(sp, sp.default())
    >>> k = Kernel(plan, build(render(plan)).lib_path)
    >>> a, b = sp.task.random_inputs()
    >>> bool(abs(k(a, b) - sp.task.reference(a, b)).max() < 1e-4)
    True
"""
from __future__ import annotations

import ctypes
import os
import threading

import numpy as np

from . import fastcall
from .lower import Plan
from .measure import load_kernel_library
from .ops import check_weight_range

#: an int8 task's quantization parameters among its inputs (checked by value when they change)
_QUANT_NAMES = ("x_scale", "x_zp", "w_scales", "y_scale", "y_zp")


class Kernel:
    """A compiled kernel as a Python callable: ``kernel(*api_arrays) -> output`` (a fresh array).

    Weights are packed into the kernel's layout once and reused while the caller passes the *same*
    weights again: the cache keeps a reference to the array it packed (so its ``id`` cannot be
    recycled by another array) and a private copy of its bytes, and re-packs when the array differs
    or was edited in place (a ``memcmp`` of the bytes, at memory speed). ``kernel.bind(weights)``
    packs once and returns a :class:`BoundKernel` whose calls skip even that check (weights are
    constants, as at inference; later edits of the caller's array do not reach it).

    The per-call path is prepared once (issue 14: a few microseconds per call): the argument array
    of pointers, the workspace, the expected shapes and dtypes. A call whose arrays are C-contiguous
    ndarrays of the expected shapes and dtypes only compares them, allocates a fresh output and makes
    one C call (:mod:`codegen.fastcall`: addresses through the buffer protocol, the weights' check,
    the kernel; ctypes where that extension cannot be built); anything else takes the checked path
    (shapes checked with a clear error, other dtypes or layouts converted). Calls from several threads
    take turns (a lock: the argument array and the workspace are the kernel's and its bound kernels').
    In a process forked from one that had run kernels every kernel refuses to run (OpenMP's thread pool
    does not survive the fork: a call would hang, a kernel loaded in the child too): use the spawn or
    forkserver start method.

    Example:
        >>> import numpy as np
        >>> from codegen.ops import dense
        >>> from codegen.space import Space
        >>> from codegen.target import Target
        >>> from codegen.lower import lower
        >>> from codegen.render_c import render
        >>> from codegen.build import build
        >>> sp = Space(dense(1, 64, 16), "gemm_packed", Target.cpu())
        >>> plan = lower(sp, sp.default())
        >>> k = Kernel(plan, build(render(plan)).lib_path)
        >>> x, w = sp.task.random_inputs()
        >>> y1 = k(x, w); w *= 2; y2 = k(x, w)          # an in-place edit is seen
        >>> bool(np.allclose(y2, 2 * y1, rtol=1e-5, atol=1e-6))
        True
    """

    def __init__(self, plan: Plan, lib_path: str, *, threads: int | None = None):
        self.plan = plan
        self.lib_path = lib_path
        self._lib = load_kernel_library(lib_path)
        self._threads, self._set_threads = int(threads or 0), self._lib.fj_set_threads
        self._fn = self._lib.fj_kernel
        self._ws = np.zeros(max(plan.workspace_bytes, 64) + 64, dtype=np.uint8)  # bytes, aligned by _aligned
        self._ws_ptr = _aligned(self._ws).ctypes.data
        task = plan.space.task
        self._name = task.name
        self._shapes = tuple(tuple(int(d) for d in s) for s in task.input_shapes())
        self._out_shape = tuple(task.output_shape)
        self._dts = self.plan.arg_dtypes()  # ABI order: inputs, then out
        self._n = len(self._shapes)
        self._ptr_type = ctypes.c_void_p * (self._n + 2)
        # the fast path's data: (shape, dtype) per API input and one argument array reused by every call
        self._sig = tuple(zip(self._shapes, self._dts[:-1]))
        self._ptrs = self._ptr_type(*([0] * (self._n + 2)))
        self._ptrs[self._n + 1] = self._ws_ptr
        self._out_dt = self._dts[-1]
        self._packed: tuple | None = None  # see _packed_weights
        self._fast = fastcall.load()  # the one-C-call path, or None (ctypes)
        self._fn_addr = ctypes.cast(self._fn, ctypes.c_void_p).value
        self._ptrs_addr = ctypes.addressof(self._ptrs)
        self._task = task
        # int8: (position, name) of each quantization parameter, and the bytes of the last ones checked
        self._quant_at = tuple((i, n) for i, n in enumerate(task.input_names()) if n in _QUANT_NAMES) \
            if task.quantized else ()
        self._quant_seen: tuple | None = None
        self._lock = threading.Lock()  # one call at a time: 8 threads on one kernel got wrong outputs (session 78)

    def _check_quant(self, arrays, skip: int = 0) -> None:
        """An int8 kernel's scales and zero points checked as ``task.reference`` checks them (a scale that
        is NaN or <= 0, a zero point outside the data's range: a ValueError, not numbers computed from
        them). The dtype and bytes of the last ones checked are kept, so a call with the same values costs
        a byte comparison per parameter (about a microsecond in all). ``arrays`` are the API inputs from
        position ``skip`` on."""
        seen = self._quant_seen
        if seen is not None:
            for (i, _), (dt, raw) in zip(self._quant_at, seen):
                v = arrays[i - skip]
                if type(v) is not _ndarray or v.dtype != dt or v.tobytes() != raw:
                    break
            else:
                return
        vals = [np.asarray(arrays[i - skip]) for i, _ in self._quant_at]
        self._task.check_quant_params({n: v for (_, n), v in zip(self._quant_at, vals)})
        self._quant_seen = tuple((v.dtype, v.tobytes()) for v in vals)

    def __repr__(self) -> str:
        return f"Kernel({self._name}, {self.plan.config.sketch})"

    def _check(self, arrays) -> None:
        if len(arrays) != len(self._shapes):
            raise ValueError(f"{self._name} takes {len(self._shapes)} arrays, got {len(arrays)}")
        for i, (a, s) in enumerate(zip(arrays, self._shapes)):
            if np.shape(a) != s:
                raise ValueError(f"{self._name}: input {i} has shape {np.shape(a)}, expected {s}")

    def _packed_weights(self, w) -> np.ndarray:
        cached = self._packed
        if cached is not None and cached[0] is w and _same_bytes(cached[1], w):
            return cached[2]
        copy = np.array(w, copy=True, order="C")
        exact = _exact(copy, self._dts[1], self._name, 1)
        check_weight_range(self._task, exact)
        packed = self.plan.pack_weight(exact)
        # (weights seen, their copy, packed, the copy's address and size (ctypes; ints), packed's address):
        # the fast paths' check
        self._packed = (w, copy, packed, ctypes.c_void_p(copy.ctypes.data), ctypes.c_size_t(copy.nbytes),
                        packed.ctypes.data, copy.ctypes.data, copy.nbytes)
        return packed

    def _run(self, x, packed, rest) -> np.ndarray:
        dts = self._dts
        bufs = [_exact(x, dts[0], self._name, 0), packed]
        bufs += [_exact(a, dt, self._name, i) for i, (a, dt) in enumerate(zip(rest, dts[2:-1]), 2)]
        out = np.empty(self._out_shape, dtype=dts[-1])
        self._fn(self._ptr_type(*[b.ctypes.data for b in bufs], out.ctypes.data, self._ws_ptr))
        return out

    def __call__(self, *arrays: np.ndarray) -> np.ndarray:
        if _FORK[1]:
            raise _forked(self._name)
        _FORK[0] = True
        with self._lock:
            if self._threads and _OMP.__dict__.get("n") != self._threads:  # (per OS thread: another kernel may
                use_threads(self._set_threads, self._threads)               # have set another count)
            return self._call(*arrays)

    def _call(self, *arrays: np.ndarray) -> np.ndarray:
        if self._quant_at and len(arrays) == self._n:
            self._check_quant(arrays)
        fc = self._fast
        if fc is not None and len(arrays) == self._n and _shapes_ok(arrays, self._sig):
            cached, w = self._packed, arrays[1]
            if cached is None or cached[0] is not w or not fc.same(w, cached[6], cached[7]):
                self._packed_weights(w)
                cached = self._packed
            self._ptrs[1] = cached[5]
            out = _empty(self._out_shape, self._out_dt)
            try:
                fc.run(self._fn_addr, self._ptrs_addr, arrays[0], None, *arrays[2:], out)
                return out
            except (BufferError, ValueError, TypeError):  # not C-contiguous: the checked path converts it
                pass
        addrs = None
        if len(arrays) == self._n:
            try:  # the data addresses without a.ctypes (a third of its cost): writable C-contiguous buffers only
                addrs = [_addressof(_c_char.from_buffer(a)) for a in arrays]
            except (TypeError, ValueError):  # read-only, strided, empty, not a buffer: the checked path
                pass
        if addrs is not None and _shapes_ok(arrays, self._sig):
            ptrs, cached, w = self._ptrs, self._packed, arrays[1]
            ptrs[:self._n] = addrs
            if cached is not None and cached[0] is w and _memcmp(cached[3], addrs[1], cached[4]) == 0:
                ptrs[1] = cached[5]
            else:
                ptrs[1] = _address(self._packed_weights(w))
            out = _empty(self._out_shape, self._out_dt)
            ptrs[self._n] = _addressof(_c_char.from_buffer(out))
            self._fn(ptrs)
            return out
        self._check(arrays)
        return self._run(arrays[0], self._packed_weights(arrays[1]), arrays[2:])

    def bind(self, weights: np.ndarray) -> "BoundKernel":
        """Pack ``weights`` once (a private copy) and return ``f(data, *rest) -> output``."""
        if np.shape(weights) != self._shapes[1]:
            raise ValueError(f"{self._name}: weights have shape {np.shape(weights)}, expected {self._shapes[1]}")
        exact = _exact(np.array(weights, copy=True), self._dts[1], self._name, 1)
        check_weight_range(self._task, exact)
        return BoundKernel(self, self.plan.pack_weight(exact))


class BoundKernel:
    """A :class:`Kernel` with its weights packed once: ``f(data, *rest) -> output`` (a fresh array).

    Same fast path as the kernel's (shapes, dtypes and layout compared, addresses written into an
    argument array made once, a fresh output), without the weights' check."""

    def __init__(self, kernel: Kernel, packed: np.ndarray):
        self.kernel, self._packed = kernel, packed
        n = kernel._n
        # one argument array for every call: the packed weights and the workspace never move
        self._ptrs = kernel._ptr_type(*([0] * (n + 2)))
        self._ptrs[1], self._ptrs[n + 1] = packed.ctypes.data, kernel._ws_ptr
        self._out_slot = n
        (self._shape0, self._dt0), self._sig_rest = kernel._sig[0], kernel._sig[2:]
        self._rest_slots, self._n_rest = tuple(range(2, n)), n - 2
        self._fn, self._out_shape, self._out_dt = kernel._fn, kernel._out_shape, kernel._dts[-1]
        self._fast, self._fn_addr, self._ptrs_addr = kernel._fast, kernel._fn_addr, ctypes.addressof(self._ptrs)
        self._quant = bool(kernel._quant_at)

    def __call__(self, data: np.ndarray, *rest: np.ndarray) -> np.ndarray:
        k = self.kernel
        if _FORK[1]:
            raise _forked(k._name)
        _FORK[0] = True
        with k._lock:  # the kernel's workspace: its calls and its bound kernels' take turns
            if k._threads and _OMP.__dict__.get("n") != k._threads:
                use_threads(k._set_threads, k._threads)
            return self._call(data, *rest)

    def _call(self, data: np.ndarray, *rest: np.ndarray) -> np.ndarray:
        if self._quant and len(rest) == self._n_rest:
            self.kernel._check_quant(rest, skip=2)
        ptrs, fc = self._ptrs, self._fast
        if (fc is not None and type(data) is _ndarray and data.shape == self._shape0 and data.dtype == self._dt0
                and len(rest) == self._n_rest and (not rest or _shapes_ok(rest, self._sig_rest))):
            out = _empty(self._out_shape, self._out_dt)
            try:
                fc.run(self._fn_addr, self._ptrs_addr, data, None, *rest, out)
                return out
            except (BufferError, ValueError, TypeError):  # not C-contiguous: the checked path converts it
                pass
        if (type(data) is _ndarray and data.shape == self._shape0 and data.dtype == self._dt0
                and data.flags.c_contiguous and len(rest) == self._n_rest and (not rest or _ready(rest, self._sig_rest))):
            try:  # the data address without data.ctypes (a third of its cost); read-only arrays need the latter
                ptrs[0] = _addressof(_c_char.from_buffer(data))
            except (TypeError, ValueError):
                ptrs[0] = data.ctypes.data
            if rest:
                for i, a in zip(self._rest_slots, rest):
                    ptrs[i] = _address(a)
            out = _empty(self._out_shape, self._out_dt)
            ptrs[self._out_slot] = _addressof(_c_char.from_buffer(out))
            self._fn(ptrs)
            return out
        k = self.kernel
        if len(rest) != self._n_rest:  # (the weights are bound: not counted)
            raise ValueError(f"{k._name} bound to its weights takes {self._n_rest + 1} arrays, got {len(rest) + 1}")
        k._check((data, np.empty(k._shapes[1], np.uint8), *rest))
        dts = k._dts
        keep = [_exact(data, dts[0], k._name, 0)]
        keep += [_exact(a, dt, k._name, i) for i, (a, dt) in enumerate(zip(rest, dts[2:-1]), 2)]
        out = np.empty(self._out_shape, dtype=self._out_dt)
        ptrs[0] = keep[0].ctypes.data
        for i, a in zip(self._rest_slots, keep[1:]):
            ptrs[i] = a.ctypes.data
        ptrs[self._out_slot] = out.ctypes.data
        self._fn(ptrs)
        return out


#: [this process has run a kernel, this process was forked from one that had]: OpenMP's thread pool does not
#: survive a fork, so in such a child any kernel's parallel region hangs (a new one's too); checked per call
#: (cheaper than os.getpid(), a system call)
_FORK = [False, False]
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _FORK.__setitem__(1, _FORK[1] or _FORK[0]))


#: the OpenMP thread count each OS thread last set through :func:`use_threads`. omp_set_num_threads sets the
#: calling thread's count (shared by every kernel library of the process): a kernel or network made with
#: ``threads=N`` sets it on each call where it differs, so it runs at N from any thread, beside others made with
#: ``threads=M``. (One made without ``threads=`` runs at whatever the calling thread's count is; a direct
#: ``fj_set_threads`` call bypasses this record: use :func:`use_threads`.)
_OMP = threading.local()


def use_threads(setter, n: int) -> None:
    """``setter(n)`` (a library's ``fj_set_threads``) unless this thread's count is ``n`` already."""
    if getattr(_OMP, "n", None) != n:
        setter(n)
        _OMP.n = n


def _forked(name: str) -> RuntimeError:
    return RuntimeError(f"{name}: this process was forked from one that had run kernels; their OpenMP threads do "
                        f"not survive a fork (a kernel's call here would hang, one loaded here too): use the 'spawn' "
                        f"or 'forkserver' multiprocessing start method")


_addressof, _c_char = ctypes.addressof, ctypes.c_char
_ndarray, _empty = np.ndarray, np.empty


def _exact(a, dt: np.dtype, name: str, index: int) -> np.ndarray:
    """``a`` as a C-contiguous array of ``dt``. Into an integer type only exactly: a float that is not an integer,
    or a value out of the type's range, is a ValueError (numpy's cast would truncate or wrap it silently, and an
    int8 kernel would compute on other numbers than the caller's)."""
    src = np.asarray(a)
    if src.dtype.kind == "c":  # numpy's cast drops the imaginary part with only a warning
        raise ValueError(f"{name}: input {index} is complex ({src.dtype}); the kernel takes real {dt} values")
    if dt.kind not in "iu" or src.dtype == dt:
        return np.ascontiguousarray(src, dtype=dt)
    with np.errstate(invalid="ignore"):  # NaN / inf into an integer type: caught just below
        out = np.ascontiguousarray(src, dtype=dt)
        same = np.array_equal(out, src)
    if not same:
        raise ValueError(f"{name}: input {index} ({src.dtype}) does not convert exactly to {dt}: a value is not an "
                         f"integer or is out of {dt}'s range; pass {dt} arrays (or exact integers)")
    return out


def _ready(arrays, sig) -> bool:
    """Whether every array is a C-contiguous ndarray of its (shape, dtype): the fast path's only check."""
    for a, (shape, dt) in zip(arrays, sig):
        if type(a) is not _ndarray or a.shape != shape or a.dtype != dt or not a.flags.c_contiguous:
            return False
    return True


def _shapes_ok(arrays, sig) -> bool:
    """Whether every array is an ndarray of its (shape, dtype) (contiguity checked by the caller)."""
    for a, (shape, dt) in zip(arrays, sig):
        if type(a) is not _ndarray or a.shape != shape or not (a.dtype is dt or a.dtype == dt):
            return False
    return True


def _address(a: np.ndarray) -> int:
    """The data address of a C-contiguous array (a third of the cost of ``a.ctypes.data``)."""
    try:
        return _addressof(_c_char.from_buffer(a))
    except (TypeError, ValueError):  # read-only or empty arrays
        return a.ctypes.data


_libc = ctypes.CDLL(None)
_memcmp = _libc.memcmp
_memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
_memcmp.restype = ctypes.c_int


def _same_bytes(copy: np.ndarray, w) -> bool:
    """Whether ``w`` still holds the bytes of ``copy`` (C-contiguous, same dtype and shape)."""
    if type(w) is not _ndarray or w.dtype != copy.dtype or w.shape != copy.shape or not w.flags.c_contiguous:
        return np.array_equal(copy, w) and np.asarray(w).dtype == copy.dtype
    return copy.nbytes == 0 or _memcmp(_address(copy), _address(w), copy.nbytes) == 0


def _aligned(buf: np.ndarray) -> np.ndarray:
    """A 64-byte aligned view into the byte buffer ``buf`` (which has 64 spare bytes)."""
    skip = -buf.ctypes.data % 64
    return buf[skip:]
