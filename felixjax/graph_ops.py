"""Numpy semantics of the canonical ops added by ``felixjax.onnx_ops`` (the reference for the C build).

``felixjax.graph_passes.evaluate`` handles the core ops and asks :func:`evaluate_extra` for these; the
elementwise ops written once for numpy and JAX live in ``felixjax.op_table``.

Example:
    >>> import numpy as np
    >>> evaluate_extra("Softsign", {}, [np.array([-1, 0, 3], np.float32)], None)
    [array([-0.5 ,  0.  ,  0.75], dtype=float32)]
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from felixjax import op_table


def _f32(y: np.ndarray, like: np.ndarray) -> np.ndarray:
    return np.asarray(y).astype(like.dtype, copy=False)


def lrn(x: np.ndarray, size: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    """ONNX LRN across channels (axis 1)."""
    sq = x.astype(np.float64) ** 2
    c = x.shape[1]
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    acc = np.zeros_like(sq)
    for k in range(c):
        acc[:, k] = sq[:, max(0, k - lo): min(c, k + hi + 1)].sum(axis=1)
    return (x / (bias + alpha / size * acc) ** beta).astype(x.dtype)


def resize(x: np.ndarray, taps: Sequence[tuple], extrapolation_value: float) -> np.ndarray:
    """Separable resize: one weighted gather per resized axis, then extrapolated rows (tf_crop_and_resize)."""
    y = x.astype(np.float64)
    mask = None
    for axis, index, weight, extra in taps:
        shape = (1,) * axis + weight.shape + (1,) * (y.ndim - axis - 1)
        y = (np.take(y, index, axis=axis) * weight.reshape(shape)).sum(axis=axis + 1)
        if extra is not None:
            m = extra.reshape((1,) * axis + extra.shape + (1,) * (y.ndim - axis - 1))
            mask = m if mask is None else (mask | m)
    if mask is not None:
        y = np.where(mask, extrapolation_value, y)
    return y.astype(x.dtype)


def cumsum(x: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> np.ndarray:
    """ONNX CumSum in float64 (``exclusive``: each sum leaves its own element out; ``reverse``: from the end)."""
    y = (np.flip(x, axis) if reverse else x).astype(np.float64)
    if exclusive:  # the sums of a +0.0 and the elements before each (a -0.0 first element sums to +0.0, as in C)
        y = np.concatenate([np.zeros_like(np.take(y, [0], axis=axis)), np.delete(y, -1, axis=axis)], axis=axis)
    c = np.cumsum(y, axis=axis)
    return (np.flip(c, axis) if reverse else c).astype(x.dtype)


def arg_index(x: np.ndarray, largest: bool, axis: int, keepdims: bool, last: bool) -> np.ndarray:
    """ONNX ArgMax (``largest``) / ArgMin as onnxruntime scans: the first element is the running best; a later
    one replaces it when strictly better (or equal too with ``last``), so NaNs after the first are passed over.
    The indices as float32 (``felixjax.onnx_logic``)."""
    v = np.moveaxis(x, axis, 0)
    best, index = v[0].copy(), np.zeros(v.shape[1:], np.float32)
    for j in range(1, v.shape[0]):
        better = (v[j] > best if largest else v[j] < best) | (last & (v[j] == best))
        best, index = np.where(better, v[j], best), np.where(better, np.float32(j), index)
    return np.expand_dims(index, axis) if keepdims else index


def topk(x: np.ndarray, k: int, axis: int, largest: bool) -> tuple[np.ndarray, np.ndarray]:
    """ONNX TopK as onnxruntime orders it: NaN above every number (first when ``largest``, after every number
    when not), equal values by index; the indices as float32 (``felixjax.onnx_logic``)."""
    v = np.moveaxis(x, axis, -1)
    nan = np.isnan(v)
    filled = np.where(nan, 0, v)
    order = np.lexsort((np.broadcast_to(np.arange(v.shape[-1]), v.shape),
                        -filled if largest else filled, ~nan if largest else nan), axis=-1)[..., :k]
    values = np.take_along_axis(v, order, axis=-1)
    return np.moveaxis(values, -1, axis), np.moveaxis(order.astype(np.float32), -1, axis)


def pad(x: np.ndarray, pads: Sequence[tuple[int, int]], value: Any, mode: str = "constant") -> np.ndarray:
    """ONNX Pad in numpy (:func:`felixjax.op_table.pad`, written once for numpy and JAX)."""
    return op_table.pad(np, x, pads, value, mode)


_COMPARE = {"Greater": np.greater, "Less": np.less, "GreaterOrEqual": np.greater_equal, "LessOrEqual": np.less_equal,
            "Equal": np.equal}
_LOGIC = {"And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor}


def evaluate_extra(op: str, a: Mapping[str, Any], args: Sequence[np.ndarray | None],
                   out_shapes: Sequence[Sequence[int]] | None) -> list[np.ndarray] | None:
    """One output list for the ops of ``felixjax.onnx_ops`` that only the numpy executor runs (the others
    are in ``felixjax.op_table``); None for an op it does not know."""
    x = args[0] if args else None
    if op == "Reblock":  # NCHW <-> NCHW[b]c (felixjax.layout)
        from codegen import blocked
        return [blocked.to_blocked(x, int(a["block"])) if a["to"] == "nchwc" else
                blocked.from_blocked(x, int(out_shapes[0][0]))]
    if op == "Softsign":
        return [_f32(x / (1 + np.abs(x)), x)]
    if op == "Mish":
        x64 = x.astype(np.float64)
        return [_f32(x64 * np.tanh(np.logaddexp(0, x64)), x)]
    if op == "Selu":
        x64 = x.astype(np.float64)
        return [_f32(a["gamma"] * np.where(x64 > 0, x64, a["alpha"] * np.expm1(x64)), x)]
    if op == "Celu":
        x64 = x.astype(np.float64)
        return [_f32(np.maximum(0, x64) + np.minimum(0, a["alpha"] * np.expm1(x64 / a["alpha"])), x)]
    if op == "Shrink":
        lam, b = np.float32(a["lambd"]), np.float32(a["bias"])
        return [_f32(np.where(x < -lam, x + b, np.where(x > lam, x - b, 0)), x)]
    if op == "Swish":
        x64 = x.astype(np.float64)
        return [_f32(x64 / (1 + np.exp(-a["alpha"] * x64)), x)]
    if op == "ThresholdedRelu":
        return [_f32(np.where(x > np.float32(a["alpha"]), x, 0), x)]
    if op == "Where":
        return [np.where(args[0] != 0, args[1], args[2]).astype(np.result_type(args[1], args[2]))]
    if op in _COMPARE:  # masks as float32 0 / 1 (felixjax.onnx_logic)
        return [_COMPARE[op](args[0], args[1]).astype(np.float32)]
    if op in _LOGIC:
        return [_LOGIC[op](args[0] != 0, args[1] != 0).astype(np.float32)]
    if op == "Not":
        return [(x == 0).astype(np.float32)]
    if op == "IsNaN":
        return [np.isnan(x).astype(np.float32)]
    if op == "IsInf":
        return [((np.isposinf(x) & bool(a["positive"])) | (np.isneginf(x) & bool(a["negative"]))).astype(np.float32)]
    if op in ("Mod", "FloorMod"):
        with np.errstate(divide="ignore", invalid="ignore"):  # (a zero divisor or an infinity: NaN, as ONNX says)
            y = (np.fmod if op == "Mod" else np.mod)(args[0], args[1])
        return [y.astype(np.result_type(args[0], args[1]))]
    if op == "TopK":
        return list(topk(x, int(a["k"]), int(a["axis"]), bool(a["largest"])))
    if op in ("ArgMax", "ArgMin"):
        return [arg_index(x, op == "ArgMax", int(a["axis"]), bool(a["keepdims"]), bool(a["select_last_index"]))]
    if op == "CumSum":
        return [cumsum(x, int(a["axis"]), bool(a["exclusive"]), bool(a["reverse"]))]
    if op == "Gather":
        return [np.take(x, a["indices"], axis=a["axis"])]
    if op == "Expand":
        return [np.ascontiguousarray(np.broadcast_to(x, a["shape"]))]
    if op in ("ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"):
        axes, keep, x64 = tuple(a["axes"]), bool(a["keepdims"]), x.astype(np.float64)
        if op == "ReduceProd":
            y = np.prod(x64, axis=axes, keepdims=keep)
        elif op == "ReduceL1":
            y = np.abs(x64).sum(axis=axes, keepdims=keep)
        elif op == "ReduceL2":
            y = np.sqrt((x64 * x64).sum(axis=axes, keepdims=keep))
        elif op == "ReduceSumSquare":
            y = (x64 * x64).sum(axis=axes, keepdims=keep)
        elif op == "ReduceLogSum":
            y = np.log(x64.sum(axis=axes, keepdims=keep))
        else:
            m = x64.max(axis=axes, keepdims=True)
            y = np.log(np.exp(x64 - m).sum(axis=axes, keepdims=True)) + m
            y = y if keep else np.squeeze(y, axis=axes)
        return [_f32(y, x)]
    if op == "LRN":
        return [lrn(x, a["size"], a["alpha"], a["beta"], a["bias"])]
    if op == "Resize":
        return [resize(x, a["taps"], a["extrapolation_value"])]
    return None
