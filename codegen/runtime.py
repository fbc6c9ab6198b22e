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
    """A compiled kernel as a Python callable: ``kernel(*api_arrays) -> output``.

    Packed weights are cached by the identity of the weight array passed last time, so calling
    repeatedly with the same weights packs them once (as at inference).
    """

    def __init__(self, plan: Plan, lib_path: str, *, threads: int | None = None):
        self.plan = plan
        self.lib_path = lib_path
        self._lib = load_kernel_library(lib_path)
        if threads:
            self._lib.fj_set_threads(int(threads))
        self._ws = np.zeros(max(plan.workspace_bytes, 64) + 64, dtype=np.uint8)  # bytes, aligned by _aligned
        self._packed: tuple[int, np.ndarray] | None = None

    def __repr__(self) -> str:
        return f"Kernel({self.plan.space.task.name}, {self.plan.config.sketch})"

    def __call__(self, *arrays: np.ndarray) -> np.ndarray:
        task = self.plan.space.task
        shapes = task.input_shapes()
        if len(arrays) != len(shapes):
            raise ValueError(f"{task.name} takes {len(shapes)} arrays, got {len(arrays)}")
        for i, (a, s) in enumerate(zip(arrays, shapes)):
            if tuple(np.shape(a)) != tuple(s):
                raise ValueError(f"{task.name}: input {i} has shape {np.shape(a)}, expected {s}")
        if self._packed is None or self._packed[0] != id(arrays[1]):
            self._packed = (id(arrays[1]), self.plan.pack_weight(arrays[1]))
        dts = self.plan.arg_dtypes()  # ABI order: inputs, then out
        bufs = [np.ascontiguousarray(arrays[0], dtype=dts[0]), self._packed[1]]
        bufs += [np.ascontiguousarray(a, dtype=dt) for a, dt in zip(arrays[2:], dts[2:-1])]
        out = np.empty(task.output_shape, dtype=dts[-1])
        ws = _aligned(self._ws)
        ptrs = (ctypes.c_void_p * (len(bufs) + 2))(*[b.ctypes.data for b in bufs], out.ctypes.data, ws.ctypes.data)
        self._lib.fj_kernel(ptrs)
        return out


def _aligned(buf: np.ndarray) -> np.ndarray:
    """A 64-byte aligned view into the byte buffer ``buf`` (which has 64 spare bytes)."""
    skip = -buf.ctypes.data % 64
    return buf[skip:]
