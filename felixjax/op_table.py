"""The op table shared by the numpy executor and the JAX executor: each op here is written once.

Every entry is ``OPS[op](xp, attrs, args, out_shapes) -> outputs`` with ``xp`` the array namespace
(``numpy`` for ``felixjax.graph_passes.evaluate``, ``jax.numpy`` for ``felixjax.approx.executor``), so
the two executors cannot drift on these ops. It holds the elementwise ops, MatMul, Reshape, Concat, Transpose and Slice,
whose numpy and JAX forms are the same calls; the other ops still have one definition per executor,
checked against each other by ``felixjax.approx.executor.drift_report``.

Example:
    >>> import numpy as np
    >>> OPS["Abs"](np, {}, [np.array([-1.5, 2.0], np.float32)], None)
    [array([1.5, 2. ], dtype=float32)]
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

#: ONNX unary op -> the name of the elementwise function in both numpy and jax.numpy.
_UNARY = {"Sqrt": "sqrt", "Tanh": "tanh", "Exp": "exp", "Log": "log", "Neg": "negative", "Abs": "abs",
          "Floor": "floor", "Ceil": "ceil", "Sin": "sin", "Cos": "cos", "Tan": "tan", "Atan": "arctan",
          "Sinh": "sinh", "Cosh": "cosh", "Sign": "sign", "Round": "round"}


def _unary(name: str) -> Callable[..., list]:
    return lambda xp, attrs, args, out_shapes: [getattr(xp, name)(args[0])]


#: ONNX binary op -> the name of the broadcasting function in both numpy and jax.numpy.
_BINARY = {"Add": "add", "Sub": "subtract", "Mul": "multiply", "Div": "divide", "Pow": "power", "Max": "maximum",
           "Min": "minimum"}


def _binary(name: str) -> Callable[..., list]:
    def f(xp: Any, attrs: Mapping[str, Any], args: Sequence[Any], out_shapes: Any) -> list:
        x, b = args[0], args[1]
        if name == "divide" and xp.issubdtype(x.dtype, xp.integer):
            return [xp.trunc(x / b).astype(x.dtype)]  # ONNX integer division truncates (constant folding)
        return [getattr(xp, name)(x, b).astype(xp.result_type(x, b))]
    return f


def _contiguous(xp: Any, y: Any) -> Any:
    """A numpy view made C-contiguous (the C build reads it flat); JAX arrays have no views."""
    return np.ascontiguousarray(y) if xp is np else y


def _clip(xp: Any, attrs: Mapping[str, Any], args: Sequence[Any], out_shapes: Any) -> list:
    x = args[0]
    lo, hi = args[1] if len(args) > 1 else None, args[2] if len(args) > 2 else None
    y = x if lo is None else xp.maximum(x, lo)
    y = y if hi is None else xp.minimum(y, hi)
    return [y.astype(x.dtype)]


def _identity(xp: Any, attrs: Mapping[str, Any], args: Sequence[Any], out_shapes: Any) -> list:
    return [args[0]]


#: op -> ``(xp, attrs, args, out_shapes) -> outputs``.
OPS: dict[str, Callable[[Any, Mapping[str, Any], Sequence[Any], Any], list]] = {
    "Identity": _identity, "Dropout": _identity, **{op: _unary(f) for op, f in _UNARY.items()},
    **{op: _binary(f) for op, f in _BINARY.items()},
    "MatMul": lambda xp, a, args, s: [xp.matmul(args[0], args[1])],
    "Reshape": lambda xp, a, args, s: [xp.reshape(args[0], a["shape"])],
    "Concat": lambda xp, a, args, s: [xp.concatenate(list(args), axis=a["axis"])],
    "Transpose": lambda xp, a, args, s: [_contiguous(xp, xp.transpose(args[0], a["perm"]))],
    "Slice": lambda xp, a, args, s: [_contiguous(xp, args[0][tuple(slice(*v) for v in a["slices"])])],
    "Relu": lambda xp, a, args, s: [xp.maximum(args[0], 0).astype(args[0].dtype)], "Clip": _clip}
