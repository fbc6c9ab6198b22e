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

import numpy as np

from .lower import Plan
from .measure import load_kernel_library


class Kernel:
    """A compiled kernel as a Python callable: ``kernel(*api_arrays) -> output`` (a fresh array).

    Weights are packed into the kernel's layout once and reused while the caller passes the *same*
    weights again: the cache keeps a reference to the array it packed (so its ``id`` cannot be
    recycled by another array) and a private copy of its contents, and re-packs when the array
    differs or was edited in place. ``kernel.bind(weights)`` packs once and returns a
    :class:`BoundKernel` whose calls skip even that check (weights are constants, as at inference;
    later edits of the caller's array do not reach it).

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
        if threads:
            self._lib.fj_set_threads(int(threads))
        self._fn = self._lib.fj_kernel
        self._ws = np.zeros(max(plan.workspace_bytes, 64) + 64, dtype=np.uint8)  # bytes, aligned by _aligned
        self._ws_ptr = _aligned(self._ws).ctypes.data
        task = plan.space.task
        self._name = task.name
        self._shapes = tuple(tuple(int(d) for d in s) for s in task.input_shapes())
        self._out_shape = tuple(task.output_shape)
        self._dts = self.plan.arg_dtypes()  # ABI order: inputs, then out
        self._ptr_type = ctypes.c_void_p * (len(self._shapes) + 2)
        self._packed: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # (weights seen, copy, packed)

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
        if cached is not None and cached[0] is w and np.array_equal(cached[1], w):
            return cached[2]
        copy = np.array(w, copy=True)
        self._packed = (w, copy, self.plan.pack_weight(copy))
        return self._packed[2]

    def _run(self, x, packed, rest) -> np.ndarray:
        dts = self._dts
        bufs = [np.ascontiguousarray(x, dtype=dts[0]), packed]
        bufs += [np.ascontiguousarray(a, dtype=dt) for a, dt in zip(rest, dts[2:-1])]
        out = np.empty(self._out_shape, dtype=dts[-1])
        self._fn(self._ptr_type(*[b.ctypes.data for b in bufs], out.ctypes.data, self._ws_ptr))
        return out

    def __call__(self, *arrays: np.ndarray) -> np.ndarray:
        self._check(arrays)
        return self._run(arrays[0], self._packed_weights(arrays[1]), arrays[2:])

    def bind(self, weights: np.ndarray) -> "BoundKernel":
        """Pack ``weights`` once (a private copy) and return ``f(data, *rest) -> output``."""
        if np.shape(weights) != self._shapes[1]:
            raise ValueError(f"{self._name}: weights have shape {np.shape(weights)}, expected {self._shapes[1]}")
        return BoundKernel(self, self.plan.pack_weight(np.array(weights, copy=True)))


class BoundKernel:
    """A :class:`Kernel` with its weights packed once: ``f(data, *rest) -> output`` (a fresh array)."""

    def __init__(self, kernel: Kernel, packed: np.ndarray):
        self.kernel, self._packed = kernel, packed
        n = len(kernel._shapes)
        # one argument array for every call: the packed weights and the workspace never move
        self._ptrs = kernel._ptr_type(*([0] * (n + 2)))
        self._ptrs[1], self._ptrs[n + 1] = packed.ctypes.data, kernel._ws_ptr
        self._out_slot = n

    def __call__(self, data: np.ndarray, *rest: np.ndarray) -> np.ndarray:
        k = self.kernel
        if np.shape(data) != k._shapes[0] or len(rest) != len(k._shapes) - 2:
            k._check((data, np.empty(k._shapes[1], np.uint8), *rest))
        dts = k._dts
        x = data if (type(data) is np.ndarray and data.dtype == dts[0] and data.flags.c_contiguous) else \
            np.ascontiguousarray(data, dtype=dts[0])
        keep = [np.ascontiguousarray(a, dtype=dt) for a, dt in zip(rest, dts[2:-1])]
        out = np.empty(k._out_shape, dtype=dts[-1])
        ptrs = self._ptrs
        ptrs[0] = x.ctypes.data
        for i, a in enumerate(keep):
            ptrs[2 + i] = a.ctypes.data
        ptrs[self._out_slot] = out.ctypes.data
        k._fn(ptrs)
        return out


def _aligned(buf: np.ndarray) -> np.ndarray:
    """A 64-byte aligned view into the byte buffer ``buf`` (which has 64 spare bytes)."""
    skip = -buf.ctypes.data % 64
    return buf[skip:]
