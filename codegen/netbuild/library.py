"""Loading a generated network: compile it through the build cache and call it from Python
(:class:`NetLibrary`: run, timeit, profile)."""
from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence

import numpy as np

from .. import fastcall
from ..build import DEFAULT_FLAGS, build
from ..runtime import _FORK, _forked, use_threads

from .emission import NetSource
from .memory import _aligned_zeros

_addressof, _c_char, _ndarray, _empty, _f32 = ctypes.addressof, ctypes.c_char, np.ndarray, np.empty, np.dtype(np.float32)


def _address(a: np.ndarray) -> int:
    """The data address of a C-contiguous array (writable ones without the cost of ``a.ctypes``)."""
    try:
        return _addressof(_c_char.from_buffer(a))
    except (TypeError, ValueError):
        return a.ctypes.data


class NetLibrary:
    """A compiled network as a callable: ``net(inputs) -> outputs`` (lists of float32 arrays in
    entry-point order). Holds its own weights and arena, so several instances of one library are
    independent. Calls from several Python threads run one at a time (a lock: they share the arena and
    the pointer arrays; the C call releases the GIL, and two at once returned wrong outputs); for
    concurrent runs use one instance per thread.

    Example:
        >>> import numpy as np
        >>> from codegen.netbuild import NetSpec, Step, Value, emit, load
        >>> spec = NetSpec((Value((4,), "input"), Value((4,), "temp")), (0,), (1,), (Step("Sigmoid", (0,), (1,)),))
        >>> float(load(emit(spec))([np.zeros(4, np.float32)])[0][0])
        0.5
    """

    def __init__(self, net: NetSource, lib_path: str, *, threads: int | None = None):
        self.net, self.lib_path = net, lib_path
        lib = ctypes.CDLL(lib_path)
        pp = ctypes.POINTER(ctypes.c_void_p)
        lib.fj_model_run_with.argtypes = [ctypes.c_void_p, ctypes.c_void_p, pp, pp]
        lib.fj_model_run_with.restype = ctypes.c_int
        lib.fj_model_time_with.argtypes = [ctypes.c_void_p, ctypes.c_void_p, pp, pp, ctypes.c_long]
        lib.fj_model_time_with.restype = ctypes.c_double
        lib.fj_model_set_threads.argtypes = [ctypes.c_int]
        lib.fj_model_profile_with.argtypes = [ctypes.c_void_p, ctypes.c_void_p, pp, pp, ctypes.c_void_p]
        lib.fj_model_profile_with.restype = None
        lib.fj_model_arena_floats.restype = ctypes.c_long
        if lib.fj_model_arena_floats() != net.memory.arena_floats:
            raise RuntimeError(f"{lib_path} does not match its source (arena size differs)")
        self._lib = lib
        self._lock = threading.Lock()  # one run at a time: the arena and the pointer arrays are shared
        if net.weights.ctypes.data % 64:
            self._weights = _aligned_zeros(net.weights.size)
            self._weights[:] = net.weights
        else:
            self._weights = net.weights  # read only by the library: shared, not copied
        self._arena = _aligned_zeros(net.memory.arena_floats)
        self.threads = int(threads or 0)  # set by each run where the calling thread's count differs
        # the per-call path (call_fast): shapes, pointer arrays and the weight / arena pointers made once
        self._in_shapes = tuple(tuple(int(d) for d in s) for s in net.input_shapes)
        self._out_shapes = tuple(tuple(int(d) for d in s) for s in net.output_shapes)
        self._ins = (ctypes.c_void_p * max(1, len(self._in_shapes)))()
        self._outs = (ctypes.c_void_p * max(1, len(self._out_shapes)))()
        one = len(self._in_shapes) == 1 and len(self._out_shapes) == 1  # call_one's case
        self._shape1 = self._in_shapes[0] if one else None
        self._oshape1 = self._out_shapes[0] if one else None
        self._osize1 = int(np.prod(self._oshape1, dtype=np.int64)) if one else 0
        self._wptr = ctypes.c_void_p(self._weights.ctypes.data)
        self._aptr = ctypes.c_void_p(self._arena.ctypes.data)
        self._run_fn = lib.fj_model_run_with
        self._fast = fastcall.load()  # call_one in one C call (None: ctypes)
        self._fast_args = (ctypes.cast(lib.fj_model_run_with, ctypes.c_void_p).value, self._weights.ctypes.data,
                           self._arena.ctypes.data, ctypes.addressof(self._ins), ctypes.addressof(self._outs), 1)

    def _enter(self) -> None:
        """Refuse a run in a process forked from one that had run kernels (OpenMP's pool: it would hang)."""
        if _FORK[1]:
            raise _forked("this network")
        _FORK[0] = True
        if self.threads:
            use_threads(self._lib.fj_model_set_threads, self.threads)

    def set_threads(self, n: int) -> None:
        """OpenMP threads of later runs, from any thread."""
        self.threads = int(n)
        use_threads(self._lib.fj_model_set_threads, self.threads)

    def _pointers(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]):
        if len(inputs) != len(self.net.input_shapes):
            raise ValueError(f"the network takes {len(self.net.input_shapes)} inputs, got {len(inputs)}")
        for k, (x, s) in enumerate(zip(inputs, self.net.input_shapes)):
            if tuple(x.shape) != tuple(s) or x.dtype != np.float32 or not x.flags.c_contiguous:
                raise ValueError(f"input {k}: expected a C-contiguous float32 array of shape {s}, got "
                                 f"{x.dtype} {x.shape}")
        ins = (ctypes.c_void_p * max(1, len(inputs)))(*[x.ctypes.data for x in inputs])
        outs = (ctypes.c_void_p * max(1, len(outputs)))(*[y.ctypes.data for y in outputs])
        return ins, outs

    def new_outputs(self) -> list[np.ndarray]:
        return [np.empty(s, dtype=np.float32) for s in self.net.output_shapes]

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        """Run once into preallocated ``outputs`` (C-contiguous float32 of the output shapes)."""
        if self._lib is None:
            raise RuntimeError("the library was closed")
        self._enter()
        ins, outs = self._pointers(inputs, outputs)
        with self._lock:
            rc = self._lib.fj_model_run_with(self._weights.ctypes.data, self._arena.ctypes.data, ins, outs)
        if rc:
            raise RuntimeError(f"fj_model_run_with returned {rc}")

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        inputs = [np.require(np.asarray(x, dtype=np.float32), requirements="C") for x in inputs]
        outputs = self.new_outputs()
        self.run(inputs, outputs)
        return outputs

    def call_fast(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """``net(inputs)`` for inputs that are already C-contiguous float32 arrays of the input shapes
        (anything else takes the checked path of :meth:`__call__`): fresh output arrays every call,
        the pointer arrays and the weight / arena pointers prepared once."""
        shapes = self._in_shapes
        if self._lib is None or len(inputs) != len(shapes) or _FORK[1]:
            return self(inputs)
        _FORK[0] = True
        if self.threads:
            use_threads(self._lib.fj_model_set_threads, self.threads)
        for x, shape in zip(inputs, shapes):
            if type(x) is not _ndarray or x.shape != shape or x.dtype != _f32:
                return self(inputs)
        ins, outs, outputs = self._ins, self._outs, [_empty(s, _f32) for s in self._out_shapes]
        with self._lock:
            for k, x in enumerate(inputs):
                try:  # the address; from_buffer takes only writable C-contiguous arrays (a third of x.ctypes.data)
                    ins[k] = _addressof(_c_char.from_buffer(x))
                except (TypeError, ValueError):
                    if not x.flags.c_contiguous:
                        break
                    ins[k] = x.ctypes.data  # read-only (or empty)
            else:
                for k, y in enumerate(outputs):
                    outs[k] = _address(y)
                rc = self._run_fn(self._wptr, self._aptr, ins, outs)
                if rc:
                    raise RuntimeError(f"fj_model_run_with returned {rc}")
                return outputs
        return self(inputs)  # an input that is not C-contiguous: the checked path

    def call_one(self, x: np.ndarray) -> np.ndarray | None:
        """The single-input, single-output network's call on a ready array (writable, C-contiguous,
        float32, the input's shape): a fresh output array; None when ``x`` is anything else (the caller
        then takes :meth:`call_fast` or the checked path). The shortest path from Python to the one C
        entry point (``fj_model_run_with``): one compare, two addresses, one ``np.empty``."""
        if type(x) is not _ndarray or x.shape != self._shape1 or x.dtype != _f32 or self._lib is None or _FORK[1]:
            return None
        _FORK[0] = True
        if self.threads:
            use_threads(self._lib.fj_model_set_threads, self.threads)
        if self._fast is not None:
            y = _empty(self._oshape1, _f32)
            try:
                with self._lock:
                    rc = self._fast.run_net(*self._fast_args, x, y)
            except (BufferError, ValueError, TypeError):  # not C-contiguous
                return None
            if rc:
                raise RuntimeError("fj_model_run_with failed")
            return y
        y = _empty(self._oshape1, _f32)
        with self._lock:
            try:
                self._ins[0] = _addressof(_c_char.from_buffer(x))
            except (TypeError, ValueError):
                return None
            self._outs[0] = _addressof(_c_char.from_buffer(y)) if self._osize1 else y.ctypes.data
            if self._run_fn(self._wptr, self._aptr, self._ins, self._outs):
                raise RuntimeError("fj_model_run_with failed")
        return y

    def timeit(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray], number: int) -> float:
        """Seconds for ``number`` back-to-back runs, timed in C (no Python overhead per run)."""
        self._enter()
        ins, outs = self._pointers(inputs, outputs)
        with self._lock:
            return float(self._lib.fj_model_time_with(self._weights.ctypes.data, self._arena.ctypes.data, ins, outs,
                                                      int(number)))

    def profile(self, inputs: Sequence[np.ndarray], *, number: int = 1) -> np.ndarray:
        """Seconds per step (spec order), averaged over ``number`` runs with every step timed in C."""
        self._enter()
        outputs = self.new_outputs()
        ins, outs = self._pointers([np.require(np.asarray(x, dtype=np.float32), requirements="C") for x in inputs],
                                   outputs)
        acc = np.zeros(self.net.steps, dtype=np.float64)
        with self._lock:
            for _ in range(number):
                self._lib.fj_model_profile_with(self._weights.ctypes.data, self._arena.ctypes.data, ins, outs,
                                                acc.ctypes.data)
        return acc / max(1, number)

    def close(self) -> None:
        """Forget the library (ctypes never unloads it; the process keeps the mapping)."""
        self._lib = None


def load(net: NetSource, *, flags: Sequence[str] = DEFAULT_FLAGS, threads: int | None = None,
         timeout_s: float = 600.0) -> NetLibrary:
    """Compile a generated network (through the build cache) and load it.

    Raises:
        RuntimeError: the compiler failed (the message holds its first errors).
    """
    res = build(net.source, flags=flags, timeout_s=timeout_s)
    if res.status != "ok":
        raise RuntimeError(f"building the network failed ({res.status}): {res.error}")
    return NetLibrary(net, res.lib_path, threads=threads)
