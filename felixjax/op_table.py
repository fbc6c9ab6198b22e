"""The op table shared by the numpy executor and the JAX executor: each op here is written once.

Every entry is ``OPS[op](xp, attrs, args, out_shapes) -> outputs`` with ``xp`` the array namespace
(``numpy`` for ``felixjax.graph_passes.evaluate``, ``jax.numpy`` for ``felixjax.approx.executor``), so
the two executors cannot drift on these ops. It holds every op the JAX executor runs except ``Conv``:
the elementwise ops and activations, MatMul, Gemm, the shape ops, the normalizations, reductions,
pools, softmaxes and Pad. Where the numpy executor computes in float64 (it is the reference the C
build is checked against) the shared code widens with :func:`_wide` (a no-op under JAX, which runs
float32 and stays differentiable); where the two namespaces need different primitives (erf: numpy has
none) :func:`_erf` picks one. Per executor still: ``Conv`` (numpy runs ``Task.reference``, the C
build's own reference; JAX ``lax.conv_general_dilated``) and the fused anchors, and the numpy-only ops
of ``felixjax.graph_ops`` that the JAX executor does not run. ``felixjax.approx.executor.drift_report``
runs every JAX op through both executors.

Example:
    >>> import numpy as np
    >>> OPS["Abs"](np, {}, [np.array([-1.5, 2.0], np.float32)], None)
    [array([1.5, 2. ], dtype=float32)]
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

#: ONNX unary op -> the name of the elementwise function in both numpy and jax.numpy.
_UNARY = {"Sqrt": "sqrt", "Tanh": "tanh", "Exp": "exp", "Log": "log", "Neg": "negative", "Abs": "abs",
          "Floor": "floor", "Ceil": "ceil", "Sin": "sin", "Cos": "cos", "Tan": "tan", "Atan": "arctan",
          "Sinh": "sinh", "Cosh": "cosh", "Sign": "sign", "Round": "round", "Asin": "arcsin", "Acos": "arccos",
          "Asinh": "arcsinh", "Acosh": "arccosh", "Atanh": "arctanh"}


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


def _wide(xp: Any, x: Any) -> Any:
    """``x`` in float64 under numpy (the reference's precision), unchanged under JAX."""
    return x.astype(np.float64) if xp is np else x


def _erf(xp: Any, x: Any) -> Any:
    if xp is np:  # numpy has no erf: math.erf per element, in float64
        return np.frompyfunc(math.erf, 1, 1)(x.astype(np.float64)).astype(x.dtype)
    import jax.scipy.special

    return jax.scipy.special.erf(x)


def _channel(xp: Any, v: Any, rank: int) -> Any:
    """A per-channel vector shaped to broadcast along axis 1 of a rank-``rank`` tensor."""
    return xp.reshape(v, (1, -1) + (1,) * (rank - 2))


def _elementwise(f: Callable[[Any, Mapping[str, Any], Sequence[Any]], Any]) -> Callable[..., list]:
    """An op of one output with ``x``'s dtype."""
    return lambda xp, attrs, args, out_shapes: [f(xp, attrs, args).astype(args[0].dtype)]


def _sigmoid(xp: Any, a: Mapping[str, Any], args: Sequence[Any]) -> Any:
    x = args[0]
    e = xp.exp(-xp.abs(x))  # stable on both sides
    return xp.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _gelu(xp: Any, a: Mapping[str, Any], args: Sequence[Any]) -> Any:
    x = _wide(xp, args[0])
    if a["approximate"] == "tanh":
        return 0.5 * x * (1 + xp.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + _erf(xp, x / math.sqrt(2)))


def _gemm(xp: Any, a: Mapping[str, Any], args: Sequence[Any]) -> Any:
    am = args[0].T if a["trans_a"] else args[0]
    bm = args[1].T if a["trans_b"] else args[1]
    y = np.float32(a["alpha"]) * xp.matmul(am, bm)
    return y if len(args) < 3 or args[2] is None else y + np.float32(a["beta"]) * args[2]


def _batch_norm(xp: Any, a: Mapping[str, Any], args: Sequence[Any]) -> Any:
    x = args[0]
    s, b, mean, var = (_channel(xp, _wide(xp, v), x.ndim) for v in args[1:5])
    return (x - mean) / xp.sqrt(var + a["epsilon"]) * s + b


def _layer_norm(xp: Any, a: Mapping[str, Any], args: Sequence[Any], out_shapes: Any) -> list:
    x = args[0]
    axes = tuple(range(a["axis"], x.ndim))
    w = _wide(xp, x)
    mean = w.mean(axis=axes, keepdims=True)
    inv_std = 1.0 / xp.sqrt(((w - mean) ** 2).mean(axis=axes, keepdims=True) + a["epsilon"])
    y = (w - mean) * inv_std * args[1]
    if len(args) > 2 and args[2] is not None:
        y = y + args[2]
    outs = [y.astype(x.dtype), mean.astype(x.dtype), inv_std.astype(x.dtype)]
    return outs[: len(out_shapes)] if out_shapes else outs[:1]


def _reduce(name: str, wide: bool) -> Callable[..., list]:
    def f(xp: Any, a: Mapping[str, Any], args: Sequence[Any], out_shapes: Any) -> list:
        x = args[0]
        y = getattr(xp, name)(_wide(xp, x) if wide else x, axis=tuple(a["axes"]), keepdims=bool(a["keepdims"]))
        return [y.astype(x.dtype)]
    return f


def _softmax(xp: Any, a: Mapping[str, Any], args: Sequence[Any]) -> Any:
    x, axes = args[0], tuple(a["axes"])
    e = xp.exp(x - x.max(axis=axes, keepdims=True))
    return e / e.sum(axis=axes, keepdims=True)


def _log_softmax(xp: Any, a: Mapping[str, Any], args: Sequence[Any]) -> Any:
    x, axes = _wide(xp, args[0]), tuple(a["axes"])
    m = x.max(axis=axes, keepdims=True)
    return x - m - xp.log(xp.exp(x - m).sum(axis=axes, keepdims=True))


def pad(xp: Any, x: Any, pads: Sequence[tuple[int, int]], value: Any, mode: str = "constant") -> Any:
    """ONNX Pad: negative pads crop first; then constant, reflect or edge padding.

    Example:
        >>> pad(np, np.arange(3.0), [(1, -1)], 9.0).tolist()
        [9.0, 0.0, 1.0]
    """
    crop = tuple(slice(max(0, -b), x.shape[d] - max(0, -e)) for d, (b, e) in enumerate(pads))
    widths = [(max(0, b), max(0, e)) for b, e in pads]
    if mode == "constant":
        return xp.pad(x[crop], widths, constant_values=value)
    return xp.pad(x[crop], widths, mode=mode)


def _pool(kind: str) -> Callable[..., list]:
    """MaxPool / AveragePool over NCHW: one strided slice per kernel tap (``ceil_mode`` windows that run
    past the padding get uncounted cells; average pools divide by the counted cells)."""
    def f(xp: Any, a: Mapping[str, Any], args: Sequence[Any], out_shapes: Any) -> list:
        x = args[0]
        (kh, kw), (sh, sw), (dh, dw) = a["kernel"], a["strides"], a["dilations"]
        pt, pl, pb, pr = a["pads"]
        oh, ow = int(out_shapes[0][2]), int(out_shapes[0][3])
        h, w = x.shape[2:]
        eh = max(0, (oh - 1) * sh + (kh - 1) * dh + 1 - (h + pt + pb))
        ew = max(0, (ow - 1) * sw + (kw - 1) * dw + 1 - (w + pl + pr))
        padded = xp.pad(x, ((0, 0), (0, 0), (pt, pb + eh), (pl, pr + ew)),
                        constant_values=-np.inf if kind == "max" else 0.0)
        if kind == "avg":
            counted = np.zeros((1, 1) + tuple(padded.shape[2:]), dtype=np.float32)
            if a["count_include_pad"]:
                counted[..., : pt + h + pb, : pl + w + pr] = 1
            else:
                counted[..., pt: pt + h, pl: pl + w] = 1
        acc = cnt = None
        for i in range(kh):
            for j in range(kw):
                window = (Ellipsis, slice(i * dh, i * dh + (oh - 1) * sh + 1, sh),
                          slice(j * dw, j * dw + (ow - 1) * sw + 1, sw))
                v = padded[window]
                if kind == "max":
                    acc = v if acc is None else xp.maximum(acc, v)
                else:
                    acc = v if acc is None else acc + v
                    cnt = counted[window] if cnt is None else cnt + counted[window]
        return [acc if kind == "max" else (acc / cnt).astype(x.dtype)]
    return f


#: op -> ``(xp, attrs, args, out_shapes) -> outputs``.
OPS: dict[str, Callable[[Any, Mapping[str, Any], Sequence[Any], Any], list]] = {
    "Identity": _identity, "Dropout": _identity, **{op: _unary(f) for op, f in _UNARY.items()},
    **{op: _binary(f) for op, f in _BINARY.items()},
    "MatMul": lambda xp, a, args, s: [xp.matmul(args[0], args[1])],
    "Reshape": lambda xp, a, args, s: [xp.reshape(args[0], a["shape"])],
    "Flatten": lambda xp, a, args, s: [xp.reshape(args[0], s[0])],
    "Concat": lambda xp, a, args, s: [xp.concatenate(list(args), axis=a["axis"])],
    "Transpose": lambda xp, a, args, s: [_contiguous(xp, xp.transpose(args[0], a["perm"]))],
    "Slice": lambda xp, a, args, s: [_contiguous(xp, args[0][tuple(slice(*v) for v in a["slices"])])],
    "Relu": lambda xp, a, args, s: [xp.maximum(args[0], 0).astype(args[0].dtype)], "Clip": _clip,
    # activations
    "Sigmoid": _elementwise(_sigmoid),
    "Erf": lambda xp, a, args, s: [_erf(xp, args[0])],
    "Reciprocal": _elementwise(lambda xp, a, args: 1 / args[0]),
    "Softplus": _elementwise(lambda xp, a, args: xp.logaddexp(0, _wide(xp, args[0]))),
    "HardSwish": _elementwise(lambda xp, a, args: args[0] * xp.clip(args[0] / np.float32(6) + np.float32(0.5), 0, 1)),
    "HardSigmoid": _elementwise(lambda xp, a, args: xp.clip(np.float32(a["alpha"]) * args[0] + np.float32(a["beta"]), 0, 1)),
    "LeakyRelu": _elementwise(lambda xp, a, args: xp.where(args[0] < 0, args[0] * np.float32(a["alpha"]), args[0])),
    "Elu": _elementwise(lambda xp, a, args: xp.where(args[0] < 0, np.float32(a["alpha"]) * xp.expm1(args[0]), args[0])),
    "Gelu": _elementwise(_gelu),
    "PRelu": _elementwise(lambda xp, a, args: xp.where(args[0] < 0, args[0] * args[1], args[0])),
    # products, normalizations, reductions, pools
    "Gemm": _elementwise(_gemm),
    "BatchNormalization": _elementwise(_batch_norm),
    "ScaleShift": _elementwise(lambda xp, a, args: args[0] * _channel(xp, args[1], args[0].ndim)
                               + _channel(xp, args[2], args[0].ndim)),
    "LayerNormalization": _layer_norm,
    "ReduceMean": _reduce("mean", True), "ReduceSum": _reduce("sum", True),
    "ReduceMax": _reduce("max", False), "ReduceMin": _reduce("min", False),
    "MaxPool": _pool("max"), "AveragePool": _pool("avg"),
    "Softmax": _elementwise(_softmax), "LogSoftmax": _elementwise(_log_softmax),
    "Pad": lambda xp, a, args, s: [pad(xp, args[0], a["pads"], xp.reshape(args[1], ()), a.get("mode", "constant"))],
}
