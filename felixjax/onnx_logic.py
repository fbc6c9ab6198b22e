"""Stage ① importers for ONNX comparisons, boolean logic and arg-reductions on data tensors.

felixjax runs float32 tensors only; a boolean tensor computed at run time (a mask: ``x > 0``, ``a == b``,
``Not``, ``And``, ``Or``, ``Xor``) is held as a float32 tensor of 0.0 / 1.0. Its consumers read it as ONNX
does: ``Where``'s condition (non-zero: true), another logic op, or ``Cast`` back to float (an Identity:
the 0 / 1 values are already the cast's). A Cast of float data to bool is ``x != 0`` (``Not`` twice).
Comparisons follow IEEE rules (a NaN compares false, ``Equal`` is exact), as onnxruntime's do. On
constants every one of these folds at import (``felixjax.onnx_shapes``), as shape computations need.

Canonical ops (numpy semantics in ``felixjax.graph_ops``, C in ``codegen.netbuild.more_ops``):

==========================================================  ========  ==================================
op                                                          inputs    output
==========================================================  ========  ==================================
``Greater Less GreaterOrEqual LessOrEqual Equal``           a, b      1.0 where the comparison holds
``And Or Xor``                                              a, b      of ``a != 0`` and ``b != 0``
``Not``                                                     x         1.0 where ``x == 0``
``IsNaN``, ``IsInf`` (attrs positive, negative: 0 / 1)      x         1.0 where x is NaN / such an infinity
``ArgMax ArgMin``                                           x         the index along ``axis`` (float32)
``TopK`` (attrs axis, k, largest)                           x         values, indices (float32): sorted
==========================================================  ========  ==================================

Hardmax is imported as ``Equal(TopK(x, 1).indices, iota)``. (numpy broadcasting throughout; ArgMax / ArgMin
attrs: axis (>= 0), keepdims, select_last_index.) A model
whose *output* is such a mask returns it as float32 0 / 1. The int64 indices of ArgMax / ArgMin are held as
float32 too (exact below 2**24), and so come out of a model: a consumer reads them as numbers (``Equal`` to
labels, ``Cast`` to float). They follow onnxruntime's scan: the first element is the running best, a later one
replaces it when strictly greater (ArgMin: less), or equal too with ``select_last_index``, so a NaN is passed
over, except a first one, which stays. TopK orders as onnxruntime does: NaN above every number, equal values
by index.

Example:
    >>> import numpy as np
    >>> from felixjax.graph_ops import evaluate_extra
    >>> evaluate_extra("Greater", {}, [np.array([1., -2., np.nan], np.float32), np.float32(0)], None)
    [array([1., 0., 0.], dtype=float32)]
"""
from __future__ import annotations

from typing import Any

import numpy as np
from onnx import TensorProto

from felixjax.graph_passes import Node

COMPARE = ("Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Equal")
LOGIC = ("And", "Or", "Xor")
OPS = COMPARE + LOGIC + ("Not", "IsNaN", "IsInf", "ArgMax", "ArgMin", "TopK", "Hardmax")
ATTRS: dict[str, set[str]] = {**{op: {"axis", "keepdims", "select_last_index"} for op in ("ArgMax", "ArgMin")},
                              "IsInf": {"detect_negative", "detect_positive"},
                              "TopK": {"axis", "largest", "sorted", "k"}, "Hardmax": {"axis"}}


def float_operand(ctx: Any, k: int) -> str:
    """Input ``k``: a constant as float32 (a bool or integer constant's 0 / 1 or values), else the value."""
    name = ctx.input(k)
    if name in ctx.consts and ctx.consts[name].dtype != np.float32:
        value = ctx.consts[name]
        if value.dtype != bool and not np.issubdtype(value.dtype, np.floating):
            as_float = value.astype(np.float32)
            if not np.array_equal(as_float.astype(value.dtype), value):
                ctx.fail(f"constant {name!r} ({value.dtype}) is not exact in float32, where felixjax compares")
        return ctx.new_const(f"in{k}", value.astype(np.float32))
    return name


def _mask_output(ctx: Any, k: int = 0) -> None:
    """Output ``k`` is a bool (or int64 index) tensor to ONNX: held as float32 here."""
    out = ctx.outputs[k]
    ctx.types[out] = (TensorProto.FLOAT, ctx.out_shape(out))


def _binary(ctx: Any) -> list[Node]:
    a, b = float_operand(ctx, 0), float_operand(ctx, 1)
    _mask_output(ctx)
    return [Node(ctx.op, (a, b), (ctx.outputs[0],), {}, ctx.name)]


def _not(ctx: Any) -> list[Node]:
    """Not, IsNaN, IsInf (``positive`` / ``negative``: which infinities count)."""
    x = float_operand(ctx, 0)
    _mask_output(ctx)
    attrs = {"positive": int(ctx.attrs.get("detect_positive", 1)),
             "negative": int(ctx.attrs.get("detect_negative", 1))}
    return [Node(ctx.op, (x,), (ctx.outputs[0],), attrs if ctx.op == "IsInf" else {}, ctx.name)]


def cast_to_bool(ctx: Any) -> list[Node]:
    """``Cast(x, to=BOOL)`` of float data: ``x != 0`` as ``Not(Not(x))`` (0 / 1)."""
    x, out = float_operand(ctx, 0), ctx.outputs[0]
    _mask_output(ctx)
    mid = ctx.fresh("is_zero")
    ctx.types[mid] = (TensorProto.FLOAT, ctx.out_shape(out))
    return [Node("Not", (x,), (mid,), {}, ctx.name), Node("Not", (mid,), (out,), {}, ctx.name)]


def _exact_indices(ctx: Any, size: int) -> None:
    """Indices along an axis of ``size`` are held as float32: exact up to 2**24 only."""
    if size > 2**24:
        ctx.fail(f"its indices along an axis of {size} elements would not be exact in float32, where felixjax "
                 f"holds them (2**24 at most)")


def _arg(ctx: Any) -> list[Node]:
    """ArgMax / ArgMin: the int64 index held as float32, as a mask's bool is."""
    shape = ctx.shape(ctx.input(0))
    if not shape:
        ctx.fail("needs an input of rank 1 or more")
    rank = len(shape)
    _exact_indices(ctx, shape[ctx.axis(int(ctx.attrs.get("axis", 0)), rank)])
    attrs = {"axis": ctx.axis(int(ctx.attrs.get("axis", 0)), rank), "keepdims": int(ctx.attrs.get("keepdims", 1)),
             "select_last_index": int(ctx.attrs.get("select_last_index", 0))}
    _mask_output(ctx)
    return [Node(ctx.op, (ctx.input(0),), (ctx.outputs[0],), attrs, ctx.name)]


def _hardmax(ctx: Any) -> list[Node]:
    """Hardmax (opset 13: along ``axis``): 1.0 at the first largest element, a NaN counting as the largest (the
    ONNX reference's ``np.argmax``; onnxruntime's vectorized max gives no consistent answer around NaNs), as
    ``Equal(TopK(x, 1).indices, iota)``."""
    shape = ctx.shape(ctx.input(0))
    if not shape:
        ctx.fail("needs an input of rank 1 or more")
    if ctx.opset < 13:
        ctx.fail("Hardmax before opset 13 (a flattened 2-D view) is not supported")
    axis = ctx.axis(int(ctx.attrs.get("axis", -1)), len(shape))
    _exact_indices(ctx, shape[axis])
    top, at = ctx.fresh("max"), ctx.fresh("argmax")
    for v in (top, at):
        ctx.types[v] = (TensorProto.FLOAT, tuple(1 if d == axis else n for d, n in enumerate(shape)))
    iota = ctx.new_const("iota", np.arange(shape[axis], dtype=np.float32).reshape(
        tuple(-1 if d == axis else 1 for d in range(len(shape)))))
    return [Node("TopK", (ctx.input(0),), (top, at), {"axis": axis, "k": 1, "largest": 1}, ctx.name),
            Node("Equal", (at, iota), (ctx.outputs[0],), {}, ctx.name)]


def _topk(ctx: Any) -> list[Node]:
    """TopK with a constant K: the values and their int64 indices (held as float32), sorted (``sorted=0``
    leaves the order to the runtime: this one sorts too)."""
    shape = ctx.shape(ctx.input(0))
    if not shape:
        ctx.fail("needs an input of rank 1 or more")
    axis = ctx.axis(int(ctx.attrs.get("axis", -1)), len(shape))
    _exact_indices(ctx, shape[axis])
    k = ctx.const(ctx.input(1), "K").reshape(-1) if ctx.input(1) else np.array([ctx.attrs.get("k", -1)])
    if k.size != 1 or not 1 <= int(k[0]) <= shape[axis]:
        ctx.fail(f"K={k.tolist()} must be one integer in 1..{shape[axis]} (the size of axis {axis})")
    values, indices = ctx.outputs[0], ctx.outputs[1] if len(ctx.outputs) > 1 and ctx.outputs[1] in ctx.used else ""
    if indices:
        _mask_output(ctx, 1)
    attrs = {"axis": axis, "k": int(k[0]), "largest": int(ctx.attrs.get("largest", 1))}
    return [Node("TopK", (ctx.input(0),), (values, indices), attrs, ctx.name)]


IMPORTERS = {**{op: _binary for op in COMPARE + LOGIC}, "Not": _not, "IsNaN": _not, "IsInf": _not, "ArgMax": _arg,
             "ArgMin": _arg, "TopK": _topk, "Hardmax": _hardmax}

__all__ = ["ATTRS", "COMPARE", "IMPORTERS", "LOGIC", "OPS", "cast_to_bool", "float_operand"]
