"""Contenders for one Task, timed interleaved: onnxruntime, numpy, jax.jit and our own kernels.

Benchmarks compare ratios measured in one process, never absolute times (DESIGN.md ⑩). Each
contender is prepared once (model built, weights prepacked, inputs and outputs preallocated,
compiled), checked against ``Task.reference`` before and after timing, and timed by
:func:`time_interleaved`, which runs A B C A B C ... so machine drift hits every contender alike.

Thread counts: every contender gets the same number ``threads`` of cores.

* onnxruntime: at its default session options, as users run it (its idle workers spin), with
  ``intra_op_num_threads=threads``; :func:`time_interleaved` pauses before every timed block so the
  spinning threads go idle before the next contender. ``ort_contender(spinning=False)`` gives the
  spinning-off variant for a column of its own.
* numpy: OpenBLAS threads limited around each timed block (``threadpoolctl`` when installed, else
  OpenBLAS's own ``*set_num_threads*`` found in the loaded library). Its idle workers spin for a while
  after a call; benchmark scripts set ``OPENBLAS_THREAD_TIMEOUT=4`` before importing numpy to stop that.
* jax.jit: XLA's CPU thread pool is sized once per process (all cores) and cannot be resized. With
  fewer threads than cores, every thread of the process is pinned (``sched_setaffinity``) to the
  first ``threads`` CPUs while jax runs, and unpinned afterwards: XLA's workers then share those cores.
* ours: a generated kernel called through ctypes; its timing loop runs in C (``fj_time``), weights are
  packed once untimed, as for onnxruntime's prepacked initializers.

Example:
    >>> from codegen.ops import matmul
    >>> task = matmul(64, 64, 64)
    >>> arrays = task.random_inputs(seed=0)
    >>> cs = {"onnxruntime": ort_contender(task, arrays, threads=1),
    ...       "numpy": numpy_contender(task, arrays, threads=1)}
    >>> for c in cs.values():
    ...     c.check()
    >>> times = time_interleaved(cs, rounds=3, min_time_s=0.002)
    >>> sorted(times), len(times["numpy"])
    (['numpy', 'onnxruntime'], 3)
"""
from __future__ import annotations

import contextlib
import ctypes
import math
import os
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from codegen.measure import check_output
from codegen.ops import Task
from codegen.runtime import use_threads

from .cycles import ThreadCounters

__all__ = [
    "CONTENDERS",
    "ONNX_IR_VERSION",
    "ONNX_OPSET",
    "Contender",
    "KernelContender",
    "Summary",
    "applicable",
    "blas_threads",
    "checked_medians",
    "jax_contender",
    "kernel_contender",
    "make_contenders",
    "numpy_contender",
    "onnx_model",
    "ort_contender",
    "pinned",
    "summarize",
    "time_interleaved",
]

# onnxruntime 1.31 rejects IR versions newer than it knows; IR 8 + opset 17 is read by every ORT >= 1.13.
ONNX_IR_VERSION = 8
ONNX_OPSET = 17

CONTENDERS = ("numpy", "onnxruntime", "jax")


def applicable(task: Task) -> tuple[str, ...]:
    """Names of the peer contenders that apply to ``task`` (numpy has no convolution).

    Example:
        >>> from codegen.ops import conv2d
        >>> applicable(conv2d(1, 8, 8, 8, out_channels=8))
        ('onnxruntime', 'jax')
    """
    return tuple(n for n in CONTENDERS if not (n == "numpy" and task.op == "conv2d"))


# ----------------------------------------------------------------------------------------------
# Contenders
# ----------------------------------------------------------------------------------------------

class Contender:
    """One prepared implementation of a task: ``c()`` runs it once, ``c.timeit(n)`` times n calls.

    Subclasses set ``task``, ``threads``, ``expected`` and implement ``__call__`` and ``output``;
    ``timeit`` defaults to a Python loop (override it to time in C or to set up threads per block).
    """

    name = "contender"
    task: Task
    threads: int
    expected: np.ndarray

    def __call__(self) -> None:
        raise NotImplementedError

    def output(self) -> np.ndarray:
        """The output of the latest call, as a numpy array."""
        raise NotImplementedError

    def timeit(self, number: int) -> float:
        """Seconds for ``number`` back-to-back calls."""
        t0 = time.perf_counter()
        for _ in range(number):
            self()
        return time.perf_counter() - t0

    def check(self, *, run: bool = True) -> None:
        """Raise ``AssertionError`` unless the output matches ``Task.reference``.

        ``run=False`` checks the output left by the latest call (after timing: catches a contender
        that accumulates into its output).
        """
        if run:
            self()
        ok, msg = check_output(self.output(), self.expected, self.task.contraction().reduction_size)
        if not ok:
            raise AssertionError(f"{self.name} on {self.task.name}: wrong result: {msg}")

    def close(self) -> None:
        """Releases what the contender holds (sessions, libraries); optional."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.task.name}, threads={self.threads})"


def _aligned_empty(shape: tuple[int, ...], align: int = 64, dtype=np.float32) -> np.ndarray:
    dtype = np.dtype(dtype)
    n = max(1, math.prod(shape))
    raw = np.empty((n + align) * dtype.itemsize, dtype=np.uint8)
    skip = -raw.ctypes.data % align
    return raw[skip: skip + n * dtype.itemsize].view(dtype)[: math.prod(shape)].reshape(shape)


def _aligned_copy(a: np.ndarray) -> np.ndarray:
    """A 64-byte aligned copy of ``a`` in its own dtype (an int8 kernel reads uint8 data, int8 weights,
    int32 zero points; a float16 one float16: session 73, every one was copied as float32)."""
    out = _aligned_empty(a.shape, dtype=a.dtype)
    out[...] = a
    return out


def _expected(task: Task, arrays: list[np.ndarray], expected: np.ndarray | None) -> np.ndarray:
    return task.reference(*arrays) if expected is None else expected


# ---- onnxruntime -----------------------------------------------------------------------------

def onnx_model(task: Task, arrays: list[np.ndarray], *, ir_version: int = ONNX_IR_VERSION,
               opset: int = ONNX_OPSET):
    """An ONNX model computing ``task``: weights and bias are initializers (constants ORT may prepack).

    Graph inputs are ``x`` (data) and, with a residual, ``residual``; the output is ``y``. Matmul is
    ``MatMul``, dense is ``Gemm(transB=1)``, conv2d is ``Conv`` (group, pads, strides, dilations);
    the epilogue is bias, then the residual ``Add``, then ``Relu`` or ``Clip(0, 6)``, as in
    ``Task.reference``.

    Example:
        >>> from codegen.ops import dense
        >>> t = dense(2, 16, 8, bias=True, act="relu")
        >>> m = onnx_model(t, t.random_inputs())
        >>> [n.op_type for n in m.graph.node], m.ir_version
        (['Gemm', 'Relu'], 8)
    """
    from onnx import TensorProto, helper, numpy_helper

    p = task.p
    data, weight, *rest = [np.asarray(a, dtype=np.float32) for a in arrays]
    bias = rest.pop(0) if task.bias else None
    inits = [numpy_helper.from_array(weight, "w")]
    if bias is not None:
        inits.append(numpy_helper.from_array(bias, "b"))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(data.shape))]
    nodes = []
    if task.op == "matmul":
        nodes.append(helper.make_node("MatMul", ["x", "w"], ["mm"]))
        y = "mm"
        if bias is not None:
            nodes.append(helper.make_node("Add", [y, "b"], ["mm_b"]))
            y = "mm_b"
    elif task.op == "dense":
        nodes.append(helper.make_node("Gemm", ["x", "w"] + (["b"] if bias is not None else []), ["gemm"],
                                      transB=1))
        y = "gemm"
    else:
        (sh, sw), (dh, dw) = p["stride"], p["dilation"]
        nodes.append(helper.make_node("Conv", ["x", "w"] + (["b"] if bias is not None else []), ["conv"],
                                      kernel_shape=[p["r"], p["s"]], strides=[sh, sw], dilations=[dh, dw],
                                      pads=list(p["pad"]), group=p["groups"]))  # (top, left, bottom, right)
        y = "conv"
    if task.residual:
        inputs.append(helper.make_tensor_value_info("residual", TensorProto.FLOAT, list(task.output_shape)))
        nodes.append(helper.make_node("Add", [y, "residual"], ["res"]))
        y = "res"
    if task.act == "relu":
        nodes.append(helper.make_node("Relu", [y], ["act"]))
        y = "act"
    elif task.act == "relu6":
        inits += [numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
                  numpy_helper.from_array(np.array(6.0, np.float32), "hi")]
        nodes.append(helper.make_node("Clip", [y, "lo", "hi"], ["act"]))
        y = "act"
    nodes[-1].output[0] = "y"  # the last node writes the graph output
    graph = helper.make_graph(nodes, task.name, inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(task.output_shape))],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="felixjax.baselines")
    model.ir_version = ir_version
    return model


class _OrtContender(Contender):
    name = "onnxruntime"

    def __init__(self, task: Task, arrays: list[np.ndarray], *, threads: int, expected: np.ndarray | None,
                 spinning: bool = True):
        import onnxruntime as ort

        self.task, self.threads = task, int(threads)
        self.expected = _expected(task, arrays, expected)
        self.model = onnx_model(task, arrays)
        so = ort.SessionOptions()  # the defaults (ORT_ENABLE_ALL, sequential, spinning on) but the thread count
        so.intra_op_num_threads = self.threads
        if not spinning:
            self.name = "onnxruntime (spinning off)"
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
            so.add_session_config_entry("session.inter_op.allow_spinning", "0")
        so.log_severity_level = 3
        self.session = ort.InferenceSession(self.model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        # IO binding to preallocated numpy buffers: no per-call allocation or copies.
        self._inputs = {"x": np.ascontiguousarray(arrays[0], dtype=np.float32)}
        if task.residual:
            self._inputs["residual"] = np.ascontiguousarray(arrays[-1], dtype=np.float32)
        self._out = np.empty(task.output_shape, dtype=np.float32)
        self._binding = self.session.io_binding()
        for k, v in self._inputs.items():
            self._binding.bind_input(k, "cpu", 0, np.float32, list(v.shape), v.ctypes.data)
        self._binding.bind_output("y", "cpu", 0, np.float32, list(self._out.shape), self._out.ctypes.data)
        self._run_options = ort.RunOptions()

    def __call__(self) -> None:
        self.session.run_with_iobinding(self._binding, self._run_options)

    def output(self) -> np.ndarray:
        return self._out

    def close(self) -> None:
        self._binding = None
        self.session = None


def ort_contender(task: Task, arrays: list[np.ndarray], *, threads: int = 1,
                  expected: np.ndarray | None = None, spinning: bool = True) -> Contender:
    """onnxruntime (CPU provider, default session options but ``threads``) on an ONNX model of
    ``task`` built by :func:`onnx_model`; ``spinning=False`` turns its idle-thread spinning off.

    Example:
        >>> from codegen.ops import depthwise_conv2d
        >>> t = depthwise_conv2d(1, 8, 10, 10, kernel=3, padding=1, act="relu6")
        >>> ort_contender(t, t.random_inputs()).check()
    """
    return _OrtContender(task, arrays, threads=threads, expected=expected, spinning=spinning)


# ---- numpy -------------------------------------------------------------------------------------

def _openblas_setters() -> list[tuple[Callable[[int], None], Callable[[], int]]]:
    """(set, get) thread functions of every OpenBLAS loaded in this process (numpy's included)."""
    import numpy  # noqa: F401  (loads numpy's BLAS)

    paths = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if "/" in line else ""
                if "openblas" in os.path.basename(path).lower() and ".so" in path:
                    paths.add(path)
    except OSError:
        return []
    found = []
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)  # already loaded: the same handle
        except OSError:
            continue
        for suffix in ("", "64_", "_64_"):
            for prefix in ("openblas", "scipy_openblas"):
                set_name, get_name = f"{prefix}_set_num_threads{suffix}", f"{prefix}_get_num_threads{suffix}"
                if hasattr(lib, set_name) and hasattr(lib, get_name):
                    s, g = getattr(lib, set_name), getattr(lib, get_name)
                    s.argtypes, s.restype, g.restype = [ctypes.c_int], None, ctypes.c_int
                    found.append((s, g))
                    break
            else:
                continue
            break
    return found


@contextlib.contextmanager
def blas_threads(n: int) -> Iterator[str]:
    """Limit numpy's BLAS to ``n`` threads inside the block; yields how (for reports).

    Uses ``threadpoolctl`` when installed, else OpenBLAS's ``set_num_threads`` through ctypes; if
    neither is available it warns (set ``OPENBLAS_NUM_THREADS`` before starting Python instead).

    Example:
        >>> with blas_threads(1) as how:
        ...     _ = np.ones((64, 64), np.float32) @ np.ones((64, 64), np.float32)
        >>> how in ("threadpoolctl", "openblas", "none")
        True
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        threadpool_limits = None
    if threadpool_limits is not None:
        with threadpool_limits(limits=int(n), user_api="blas"):
            yield "threadpoolctl"
        return
    setters = _openblas_setters()
    if not setters:
        warnings.warn("numpy's BLAS thread count cannot be set (no threadpoolctl, no OpenBLAS found): "
                      "set OPENBLAS_NUM_THREADS before starting Python", RuntimeWarning, stacklevel=3)
        yield "none"
        return
    old = [g() for _, g in setters]
    for s, _ in setters:
        s(int(n))
    try:
        yield "openblas"
    finally:
        for (s, _), o in zip(setters, old):
            s(o)


class _NumpyContender(Contender):
    name = "numpy"

    def __init__(self, task: Task, arrays: list[np.ndarray], *, threads: int, expected: np.ndarray | None):
        if task.op not in ("matmul", "dense"):
            raise ValueError(f"numpy contender: {task.op} is not supported (matmul and dense only)")
        self.task, self.threads = task, int(threads)
        self.expected = _expected(task, arrays, expected)
        x, w, *rest = [np.ascontiguousarray(a, dtype=np.float32) for a in arrays]
        self._x = x
        self._w = w if task.op == "matmul" else w.T  # a transposed view: BLAS reads it with trans flag
        self._bias = rest.pop(0) if task.bias else None
        self._res = rest.pop(0) if task.residual else None
        self._out = np.empty(task.output_shape, dtype=np.float32)

    def __call__(self) -> None:
        y = self._out
        np.matmul(self._x, self._w, out=y)
        if self._bias is not None:
            y += self._bias
        if self._res is not None:
            y += self._res
        if self.task.act == "relu":
            np.maximum(y, 0.0, out=y)
        elif self.task.act == "relu6":
            np.clip(y, 0.0, 6.0, out=y)

    def output(self) -> np.ndarray:
        return self._out

    def timeit(self, number: int) -> float:
        with blas_threads(self.threads):
            return super().timeit(number)

    def check(self, *, run: bool = True) -> None:
        with blas_threads(self.threads):
            super().check(run=run)


def numpy_contender(task: Task, arrays: list[np.ndarray], *, threads: int = 1,
                    expected: np.ndarray | None = None) -> Contender:
    """``x @ w`` (matmul) or ``x @ w.T`` (dense) into a preallocated output, epilogue in place.

    Example:
        >>> from codegen.ops import dense
        >>> t = dense(4, 32, 8, bias=True, act="relu")
        >>> numpy_contender(t, t.random_inputs()).check()
    """
    return _NumpyContender(task, arrays, threads=threads, expected=expected)


# ---- jax.jit -----------------------------------------------------------------------------------

def _thread_ids() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


@contextlib.contextmanager
def pinned(cpus: set[int] | None) -> Iterator[None]:
    """Pin every thread of this process to ``cpus`` inside the block (``None``: do nothing).

    Threads keep their own previous masks afterwards; threads started inside the block get the
    process's mask from before the block.

    Example:
        >>> with pinned({sorted(os.sched_getaffinity(0))[0]}):
        ...     len(os.sched_getaffinity(0))
        1
    """
    if not cpus or not hasattr(os, "sched_setaffinity"):
        yield
        return
    default = os.sched_getaffinity(0)
    saved = {}
    for tid in _thread_ids():
        try:
            saved[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, cpus)
        except OSError:  # the thread ended meanwhile
            pass
    try:
        yield
    finally:
        for tid in _thread_ids():
            try:
                os.sched_setaffinity(tid, saved.get(tid, default))
            except OSError:
                pass


def _cpus_for(threads: int) -> set[int] | None:
    """The first ``threads`` CPUs this process may use, or None when that is all of them."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not allowed or threads >= len(allowed):
        return None
    return set(allowed[: max(1, threads)])


class _JaxContender(Contender):
    name = "jax"

    def __init__(self, task: Task, arrays: list[np.ndarray], *, threads: int, expected: np.ndarray | None):
        import jax
        import jax.numpy as jnp

        self.task, self.threads = task, int(threads)
        self.expected = _expected(task, arrays, expected)
        self._cpus = _cpus_for(self.threads)
        p = task.p
        has_bias, has_res, act = task.bias, task.residual, task.act

        def f(x, w, *rest):
            rest = list(rest)
            if task.op == "matmul":
                y = jnp.matmul(x, w)
            elif task.op == "dense":
                # x . W^T as one dot: jnp.matmul(x, w.T) makes XLA copy W transposed on every call.
                y = jax.lax.dot_general(x, w, (((1,), (1,)), ((), ())))
            else:
                pt, pl, pb, pr = p["pad"]
                y = jax.lax.conv_general_dilated(
                    x, w, window_strides=p["stride"], padding=[(pt, pb), (pl, pr)], rhs_dilation=p["dilation"],
                    dimension_numbers=("NCHW", "OIHW", "NCHW"), feature_group_count=p["groups"])
            if has_bias:
                b = rest.pop(0)
                y = y + (b.reshape(1, -1, 1, 1) if task.op == "conv2d" else b)
            if has_res:
                y = y + rest.pop(0)
            if act == "relu":
                y = jnp.maximum(y, 0.0)
            elif act == "relu6":
                y = jnp.clip(y, 0.0, 6.0)
            return y

        cpu = jax.devices("cpu")[0]
        self._args = [jax.device_put(np.asarray(a, dtype=np.float32), cpu) for a in arrays]
        self._fn = jax.jit(f)
        with pinned(self._cpus):
            self._y = self._fn(*self._args).block_until_ready()  # compiles

    def __call__(self) -> None:
        self._y = self._fn(*self._args).block_until_ready()

    def output(self) -> np.ndarray:
        return np.asarray(self._y)

    def timeit(self, number: int) -> float:
        with pinned(self._cpus):
            return super().timeit(number)

    def check(self, *, run: bool = True) -> None:
        with pinned(self._cpus):
            super().check(run=run)


def jax_contender(task: Task, arrays: list[np.ndarray], *, threads: int = 1,
                  expected: np.ndarray | None = None) -> Contender:
    """``jax.jit`` of jnp.matmul (dense: lax.dot_general on W's last axis) or lax.conv_general_dilated
    (groups) plus the epilogue, on CPU.

    XLA's thread pool always has one thread per core; with fewer ``threads`` the process is pinned
    to that many CPUs while jax runs (see module docstring).

    Example:
        >>> from codegen.ops import conv2d
        >>> t = conv2d(1, 4, 9, 9, out_channels=8, kernel=3, stride=2, padding=(1, 0, 0, 1), groups=2)
        >>> jax_contender(t, t.random_inputs()).check()
    """
    return _JaxContender(task, arrays, threads=threads, expected=expected)


# ---- ours ----------------------------------------------------------------------------------------

class KernelContender(Contender):
    """A felixjax kernel library called through ctypes on preallocated 64-byte aligned buffers.

    Weights are packed once here (untimed); ``timeit`` runs the library's own C loop ``fj_time``.
    Build one with :func:`kernel_contender` (from a config) or directly from a ``Plan`` and library.
    """

    def __init__(self, plan, lib_path: str, arrays: list[np.ndarray], *, threads: int,
                 expected: np.ndarray | None = None, name: str = "felixjax"):
        task = plan.space.task
        self.name, self.plan, self.lib_path = name, plan, lib_path
        self.task, self.threads = task, int(threads)
        self.expected = _expected(task, arrays, expected)
        from codegen.measure import load_kernel_library

        lib = load_kernel_library(lib_path)
        self._lib = lib
        self._bufs = [_aligned_copy(a) for a in plan.kernel_inputs(list(arrays))]
        self._out = _aligned_empty(task.output_shape, dtype=plan.arg_dtypes()[-1])  # float16 / int8 outputs too
        self._ws = _aligned_empty((max(int(plan.workspace), 1),))
        self._bufs += [self._out, self._ws]
        self._ptrs = (ctypes.c_void_p * len(self._bufs))(*[b.ctypes.data for b in self._bufs])

    def __call__(self) -> None:
        use_threads(self._lib.fj_set_threads, self.threads)  # libgomp is shared by every kernel library
        self._lib.fj_kernel(self._ptrs)

    def output(self) -> np.ndarray:
        return self._out

    def timeit(self, number: int) -> float:
        use_threads(self._lib.fj_set_threads, self.threads)
        return float(self._lib.fj_time(self._ptrs, int(number)))

    def __repr__(self) -> str:
        return f"KernelContender({self.task.name}, {self.plan.config.sketch}, threads={self.threads})"


def kernel_contender(task: Task, config, arrays: list[np.ndarray], *, threads: int = 1, target=None,
                     expected: np.ndarray | None = None, name: str = "felixjax") -> KernelContender:
    """Lower, render and build ``config`` of ``task`` (build cache) and wrap it as a contender.

    Run a kernel through the measuring process (``fj.tune`` or ``LocalRunner``) first if it may
    crash: this one runs in the calling process.

    Example:
        >>> from codegen.ops import matmul
        >>> from codegen.space import Space, sketches_for
        >>> from codegen.target import Target
        >>> t = matmul(32, 48, 16)
        >>> cfg = Space(t, sketches_for(t)[0], Target.cpu()).default()
        >>> kernel_contender(t, cfg, t.random_inputs()).check()
    """
    from codegen.build import build
    from codegen.lower import lower
    from codegen.render_c import render
    from codegen.space import Space
    from codegen.target import Target

    plan = lower(Space(task, config.sketch, target or Target.cpu()), config)
    b = build(render(plan))
    if b.status != "ok":
        raise RuntimeError(f"building {task.name} {config.dumps()} failed ({b.status}): {b.error}")
    return KernelContender(plan, b.lib_path, arrays, threads=threads, expected=expected, name=name)


def make_contenders(task: Task, arrays: list[np.ndarray], *, threads: int = 1,
                    which: tuple[str, ...] | None = None, expected: np.ndarray | None = None,
                    ) -> dict[str, Contender]:
    """The peer contenders that apply to ``task`` (or those named in ``which``), prepared.

    Example:
        >>> from codegen.ops import matmul
        >>> t = matmul(16, 16, 16)
        >>> sorted(make_contenders(t, t.random_inputs(), which=("numpy", "onnxruntime")))
        ['numpy', 'onnxruntime']
    """
    makers = {"numpy": numpy_contender, "onnxruntime": ort_contender, "jax": jax_contender}
    names = applicable(task) if which is None else tuple(which)
    expected = _expected(task, arrays, expected)
    out = {}
    for n in names:
        if n not in makers:
            raise ValueError(f"unknown contender {n!r}; known: {', '.join(makers)}")
        out[n] = makers[n](task, arrays, threads=threads, expected=expected)
    return out


# ----------------------------------------------------------------------------------------------
# Interleaved timing
# ----------------------------------------------------------------------------------------------

def _timer(c: Callable[[], object]) -> Callable[[int], float]:
    if isinstance(c, Contender):
        return c.timeit

    def loop(number: int) -> float:
        t0 = time.perf_counter()
        for _ in range(number):
            c()
        return time.perf_counter() - t0

    return loop


def _calibrate(timeit: Callable[[int], float], min_time_s: float, max_number: int) -> int:
    """Calls per block so that one block lasts at least ``min_time_s``."""
    number, t = 1, timeit(1)
    while t < min_time_s and number < max_number:
        factor = min(100.0, 1.2 * min_time_s / max(t, 1e-9))
        number = min(max_number, max(number + 1, math.ceil(number * factor)))
        t = timeit(number)
    return number


def time_interleaved(contenders: dict[str, Callable[[], object]], *, rounds: int = 5, min_time_s: float = 0.05,
                     warmup: int = 1, max_number: int = 100_000, pause_s: float = 0.1,
                     settle: int = 2, event: str | None = None) -> dict[str, list[float]]:
    """Time contenders in turn, A B C A B C ..., so that machine drift hits all of them alike.

    Each contender is warmed up, then its calls per block are calibrated so one block lasts at least
    ``min_time_s``; then ``rounds`` rounds time one block of each contender in the dict's order.
    Before every timed block the machine gets ``pause_s`` of quiet and the contender ``settle``
    untimed calls, so a peer that spins its idle threads (onnxruntime at its defaults, OpenBLAS)
    has let go of the cores before the next contender is timed, and the timed one is warm.
    A contender is a :class:`Contender` (timed by its ``timeit``, e.g. a C loop) or any callable
    running one invocation (timed by a Python loop).

    Args:
        contenders: name -> contender.
        rounds: blocks per contender (samples in each returned list).
        min_time_s: minimum duration of one block.
        warmup: untimed calls per contender before calibration.
        max_number: cap on calls per block.
        pause_s: sleep before each timed block.
        settle: untimed calls right before each timed block.
        event: a :data:`felixjax.cycles.EVENTS` name (``"cycles"``, ...) to return that count per call instead of seconds
            (:mod:`felixjax.cycles`: user-mode counts of the process's threads; blocks still calibrated
            in wall time). For A/B comparisons of kernels on a noisy host, not published latencies.

    Returns:
        name -> seconds per call (or ``event`` counts per call), one entry per round. See :func:`summarize` for median and min.

    Example:
        >>> t = time_interleaved({"a": lambda: sum(range(100)), "b": lambda: None}, rounds=2, min_time_s=1e-3,
        ...                      pause_s=0.0)
        >>> [len(v) for v in t.values()]
        [2, 2]
    """
    return time_blocks({name: _timer(c) for name, c in contenders.items()}, rounds=rounds, min_time_s=min_time_s,
                       warmup=warmup, max_number=max_number, pause_s=pause_s, settle=settle, event=event)


def checked_medians(contenders: dict[str, Contender], *, rounds: int = 5, **kwargs) -> dict[str, float]:
    """Every contender's output checked against its expected result, all timed interleaved
    (:func:`time_interleaved`; ``kwargs`` are its options), checked again: the median seconds per call
    of each. The probes' A/B step (a contender that went wrong while timed raises)."""
    for c in contenders.values():
        c.check()
    times = time_interleaved(contenders, rounds=rounds, **kwargs)
    for c in contenders.values():
        c.check()
    return {k: float(np.median(v)) for k, v in times.items()}


def time_blocks(timers: dict[str, Callable[[int], float]], *, rounds: int = 5, min_time_s: float = 0.05,
                warmup: int = 1, max_number: int = 1_000_000, pause_s: float = 0.1,
                settle: int = 2, event: str | None = None) -> dict[str, list[float]]:
    """:func:`time_interleaved` for block timers: ``timers[name](number)`` runs ``number`` calls and
    returns their seconds (a loop in C, an IO-bound session loop, ...)."""
    if rounds < 1 or min_time_s < 0 or pause_s < 0 or settle < 0:
        raise ValueError(f"rounds must be >= 1 and min_time_s, pause_s, settle >= 0 "
                         f"(got {rounds}, {min_time_s}, {pause_s}, {settle})")
    numbers = {}
    for name, timeit in timers.items():
        if warmup:
            timeit(warmup)
        numbers[name] = _calibrate(timeit, min_time_s, max_number)
    out: dict[str, list[float]] = {name: [] for name in timers}
    for _ in range(rounds):
        for name, timeit in timers.items():
            if pause_s:
                time.sleep(pause_s)
            if settle:
                timeit(settle)
            if event is None:
                out[name].append(timeit(numbers[name]) / numbers[name])
                continue
            with ThreadCounters(event) as counter:
                timeit(numbers[name])
            out[name].append(counter.read() / numbers[name])
    return out


@dataclass(frozen=True)
class Summary:
    """Median and minimum seconds per call of one contender."""

    median_s: float
    min_s: float
    samples: int

    def gflops(self, flops: float) -> tuple[float, float]:
        """(GFLOP/s at the median, GFLOP/s at the minimum) for a task of ``flops``."""
        return flops / self.median_s / 1e9, flops / self.min_s / 1e9


def summarize(times: dict[str, list[float]]) -> dict[str, Summary]:
    """Median and min of every contender's samples (as returned by :func:`time_interleaved`).

    Example:
        >>> summarize({"a": [3.0, 1.0, 2.0]})["a"]
        Summary(median_s=2.0, min_s=1.0, samples=3)
    """
    return {name: Summary(statistics.median(v), min(v), len(v)) for name, v in times.items()}


def compare_best(result, *, threads: int = 1, rounds: int = 5) -> dict[str, float]:
    """Time a tuning result's best kernel and onnxruntime interleaved (same threads); both are
    checked against the numpy reference before and after timing.

    Returns ``{"onnxruntime_ms", "felixjax_median_ms", "ours_vs_ort"}`` (> 1: ours is faster).
    """
    task = result.task
    arrays = task.random_inputs(seed=0)
    expected = task.reference(*arrays)
    ours = kernel_contender(task, result.best.config, arrays, threads=threads, target=result.target,
                            expected=expected)
    ort = ort_contender(task, arrays, threads=threads, expected=expected)
    for c in (ours, ort):
        c.check()
    times = summarize(time_interleaved({"felixjax": ours, "onnxruntime": ort}, rounds=rounds))
    for c in (ours, ort):
        c.check(run=False)
    return {"onnxruntime_ms": times["onnxruntime"].median_s * 1e3,
            "felixjax_median_ms": times["felixjax"].median_s * 1e3,
            "ours_vs_ort": times["onnxruntime"].median_s / times["felixjax"].median_s}


def short_error(e: BaseException) -> str:
    """One line naming an exception, for benchmark tables."""
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]


def add_checked_peers(task: Task, arrays: list[np.ndarray], contenders: dict, errors: dict, *, threads: int,
                      expected: np.ndarray | None = None) -> dict:
    """Add every applicable peer to ``contenders``, then drop any contender whose output is wrong.

    A missing or failing peer is recorded in ``errors`` (name -> one line), never fatal.
    """
    for name in applicable(task):
        try:
            contenders.update(make_contenders(task, arrays, threads=threads, which=(name,), expected=expected))
        except Exception as e:
            errors[name] = short_error(e)
    for name, c in list(contenders.items()):
        try:
            c.check()
        except AssertionError as e:
            errors[name] = short_error(e)
            contenders.pop(name).close()
    return contenders
