"""Stage ① importers for the ops real exporters emit beyond the core set of ``felixjax.onnx_import``.

Each importer takes the importer context of one ONNX node (``onnx_import._Ctx``: inputs, attributes,
shapes, constants, ``fail``) and returns canonical nodes (see ``felixjax.graph_passes``). Several ops are
rewritten into canonical ones the rest of the stack already runs:

    Squeeze / Unsqueeze / Flatten       Reshape
    Cast to float32 / CastLike          Identity
    Split                               one Slice per output
    DepthToSpace / SpaceToDepth         Reshape -> Transpose -> Reshape
    GroupNormalization                  as InstanceNormalization over groups (opset 18 scales gathered)
    RMSNormalization, LpNormalization   chains of Mul / ReduceMean / ReduceL1 / ReduceL2 / Max / Sqrt / Div
    Trilu                               Where with a constant triangular mask
    Tile                                one Gather per repeated axis
    GatherND (constant indices)         Reshape (the indexed axes as one) -> one Gather of flat offsets
    GatherElements (constant indices)   Reshape (flat) -> one Gather of each element's flat offset
    Sum / Mean / variadic Max, Min      chains of binary nodes (Mean: then Mul by 1/n)
    GlobalMaxPool                       ReduceMax over the spatial axes
    InstanceNormalization               Reshape -> LayerNormalization -> Reshape -> ScaleShift
    ConvTranspose                       zero insertion (Reshape, Pad, Reshape), Pad, Conv with the flipped,
                                        transposed weights (a tunable conv2d anchor once weights are constant)
    Upsample / Resize                   Resize with per-axis tap tables (source index, weight) computed here,
                                        once, for every mode / coordinate_transformation_mode / nearest_mode

(Resize / Upsample, ConvTranspose and the 1-D lifting of convolution and pooling live in
``felixjax.onnx_spatial``.)

Canonical forms added by this module (numpy semantics in ``felixjax.graph_ops``):

=====================================  ==================  =============================================
op                                     inputs              attrs
=====================================  ==================  =============================================
``Exp Log Neg Floor Ceil Abs``         x
``Reciprocal HardSwish Softplus``      x
``Sin Cos Tan Atan Sinh Cosh Sign``    x
``Round Softsign Mish``                x
``Asin Acos Asinh Acosh Atanh``        x
``HardSigmoid``                        x                   alpha, beta
``LeakyRelu Elu Celu ThresholdedRelu`` x                   alpha
``Selu``                               x                   alpha, gamma
``Shrink``                             x                   bias, lambd
``Swish``                              x                   alpha
``LogSoftmax``                         x                   axes (as Softmax)
``Gelu``                               x                   approximate ("none" | "tanh")
``Max Min PRelu``                      a, b                (numpy broadcasting; PRelu: b is the slope)
``Mod FloorMod``                       a, b                (ONNX Mod fmod=1: C's fmod; fmod=0: numpy's mod)
``Where``                              cond, a, b          (cond: float 0/1, a constant or a mask)
``Slice``                              x                   slices: ((start, stop or None, step) per dim)
``Gather``                             x                   axis, indices (an int64 array, >= 0)
``Expand``                             x                   shape (the output shape)
``CumSum``                             x                   axis (>= 0), exclusive, reverse (0 / 1)
``ReduceSum ReduceMax ReduceMin``      x                   axes (sorted, >= 0), keepdims
``ReduceProd ReduceL1 ReduceL2``       x                   axes, keepdims
``ReduceSumSquare ReduceLogSum(Exp)``  x                   axes, keepdims
``LRN``                                x (N, C, ...)       size, alpha, beta, bias
``Resize``                             x                   taps: ((axis, index (out, T), weight (out, T),
                                                           extrapolated rows or None) per resized axis),
                                                           extrapolation_value
=====================================  ==================  =============================================

``Pad`` gains ``mode`` ("constant", "reflect", "edge").
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from onnx import TensorProto

from felixjax.graph_passes import Node
from felixjax.onnx_logic import cast_to_bool, float_operand

REDUCE = ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare",
          "ReduceLogSum", "ReduceLogSumExp")
UNARY = ("Exp", "Log", "Neg", "Floor", "Ceil", "Abs", "Reciprocal", "HardSwish", "Softplus", "Sin", "Cos", "Tan",
         "Atan", "Sinh", "Cosh", "Sign", "Round", "Softsign", "Mish", "Asin", "Acos", "Asinh", "Acosh", "Atanh")
PARAM_UNARY = ("HardSigmoid", "LeakyRelu", "Elu", "Gelu", "Selu", "Celu", "ThresholdedRelu", "Shrink", "Swish")
OPS = UNARY + PARAM_UNARY + (
    "Max", "Min", "PRelu", "Mod", "Sum", "Mean", "Where", "Slice", "Gather", "GatherND", "GatherElements", "CumSum",
    "Expand", "Split",
    "Squeeze", "Unsqueeze",
    "Cast", "CastLike", *REDUCE, "GlobalMaxPool", "InstanceNormalization", "LRN",
    "Resize", "Upsample", "ConvTranspose", "Tile", "LogSoftmax", "DepthToSpace", "SpaceToDepth",
    "GroupNormalization", "RMSNormalization", "LpNormalization", "Trilu",
    # only ever folded to constants (static shapes); the importer explains when they are not
    "Shape", "Size",
)
ATTRS: dict[str, set[str]] = {
    "HardSigmoid": {"alpha", "beta"}, "LeakyRelu": {"alpha"}, "Elu": {"alpha"}, "Gelu": {"approximate"},
    "Selu": {"alpha", "gamma"}, "Celu": {"alpha"}, "ThresholdedRelu": {"alpha"}, "LogSoftmax": {"axis"},
    "Shrink": {"bias", "lambd"}, "Swish": {"alpha"}, "DepthToSpace": {"blocksize", "mode"},
    "SpaceToDepth": {"blocksize", "mode"}, "GroupNormalization": {"num_groups", "epsilon", "stash_type"},
    "RMSNormalization": {"axis", "epsilon", "stash_type"}, "LpNormalization": {"axis", "p"},
    "Trilu": {"upper"}, "Mod": {"fmod"},
    "Slice": {"starts", "ends", "axes"}, "Gather": {"axis"}, "GatherND": {"batch_dims"}, "GatherElements": {"axis"},
    "CumSum": {"exclusive", "reverse"}, "Split": {"axis", "split", "num_outputs"},
    "Squeeze": {"axes"}, "Unsqueeze": {"axes"}, "Cast": {"to", "saturate", "round_mode"},
    "CastLike": {"saturate", "round_mode"},
    **{op: {"axes", "keepdims", "noop_with_empty_axes"} for op in REDUCE},
    "InstanceNormalization": {"epsilon"}, "LRN": {"size", "alpha", "beta", "bias"},
    "Resize": {"mode", "coordinate_transformation_mode", "nearest_mode", "cubic_coeff_a", "exclude_outside",
               "extrapolation_value", "antialias", "axes", "keep_aspect_ratio_policy"},
    "Upsample": {"mode", "scales", "height_scale", "width_scale"},
    "ConvTranspose": {"auto_pad", "dilations", "group", "kernel_shape", "output_padding", "output_shape", "pads",
                      "strides"},
    "Shape": {"start", "end"},
}


def _node(ctx: Any, op: str, inputs: Sequence[str], attrs: Mapping[str, Any] | None = None,
          outputs: Sequence[str] | None = None) -> Node:
    return Node(op, tuple(inputs), tuple(outputs if outputs is not None else ctx.outputs[:1]), dict(attrs or {}),
                ctx.name)


def _tmp(ctx: Any, suffix: str, shape: Sequence[int]) -> str:
    """A fresh intermediate value of ``shape`` (float32)."""
    name = ctx.fresh(suffix)
    ctx.types[name] = (TensorProto.FLOAT, tuple(int(d) for d in shape))
    return name


def _ints(ctx: Any, k: int, attr: str, what: str) -> list[int] | None:
    """An int list from input ``k`` (a constant) or, in older opsets, attribute ``attr``."""
    if ctx.input(k):
        return [int(v) for v in ctx.const(ctx.input(k), what).reshape(-1)]
    if attr in ctx.attrs:
        return [int(v) for v in ctx.attrs[attr]]
    return None


# ---- pointwise ---------------------------------------------------------------------------------

def _unary(ctx: Any) -> list[Node]:
    return [_node(ctx, ctx.op, ctx.inputs[:1])]


def _param_unary(ctx: Any) -> list[Node]:
    a = ctx.attrs
    if ctx.op == "HardSigmoid":
        attrs = {"alpha": float(a.get("alpha", 0.2)), "beta": float(a.get("beta", 0.5))}
    elif ctx.op == "LeakyRelu":
        attrs = {"alpha": float(a.get("alpha", 0.01))}
    elif ctx.op in ("Elu", "Celu", "ThresholdedRelu"):
        attrs = {"alpha": float(a.get("alpha", 1.0))}
    elif ctx.op == "Shrink":
        attrs = {"bias": float(a.get("bias", 0.0)), "lambd": float(a.get("lambd", 0.5))}
    elif ctx.op == "Swish":
        attrs = {"alpha": float(a.get("alpha", 1.0))}
    elif ctx.op == "Selu":
        attrs = {"alpha": float(a.get("alpha", 1.67326319217681884765625)),
                 "gamma": float(a.get("gamma", 1.05070102214813232421875))}
    else:
        approx = a.get("approximate", "none")
        if approx not in ("none", "tanh"):
            ctx.fail(f"approximate={approx!r} is not supported (supported: none, tanh)")
        attrs = {"approximate": approx}
    return [_node(ctx, ctx.op, ctx.inputs[:1], attrs)]


def _chain(ctx: Any, op: str, inputs: Sequence[str], out: str) -> list[Node]:
    """``out = op(op(op(x0, x1), x2), ...)`` with intermediates of their broadcast shapes."""
    inputs = [i for i in inputs]
    if len(inputs) == 1:
        return [_node(ctx, "Identity", inputs, outputs=[out])]
    nodes, acc = [], inputs[0]
    shape = ctx.shape(acc)
    for k, x in enumerate(inputs[1:], 1):
        shape = np.broadcast_shapes(shape, ctx.shape(x))
        y = out if k == len(inputs) - 1 else _tmp(ctx, f"{op.lower()}{k}", shape)
        nodes.append(_node(ctx, op, [acc, x], outputs=[y]))
        acc = y
    return nodes


def _variadic(ctx: Any) -> list[Node]:
    if not ctx.inputs:
        ctx.fail("needs at least one input")
    if ctx.op in ("Max", "Min"):
        return _chain(ctx, ctx.op, ctx.inputs, ctx.outputs[0])
    if ctx.op == "Sum":
        return _chain(ctx, "Add", ctx.inputs, ctx.outputs[0])
    n = len(ctx.inputs)  # Mean
    if n == 1:
        return [_node(ctx, "Identity", ctx.inputs[:1])]
    shape = ctx.out_shape(ctx.outputs[0])
    total = _tmp(ctx, "sum", shape)
    return _chain(ctx, "Add", ctx.inputs, total) + [
        _node(ctx, "Mul", [total, ctx.new_const("inv_n", np.float32(1.0 / n))])]


def _mod(ctx: Any) -> list[Node]:
    """Mod of float data (integer constants fold at import): ``fmod=1`` C's fmod (the sign of a), ``fmod=0`` a
    floored modulo (the sign of b, as numpy's mod)."""
    a, b = float_operand(ctx, 0), float_operand(ctx, 1)
    return [_node(ctx, "Mod" if int(ctx.attrs.get("fmod", 0)) else "FloorMod", [a, b])]


def _prelu(ctx: Any) -> list[Node]:
    x, slope = ctx.input(0), ctx.input(1)
    xs, ss = ctx.shape(x), ctx.shape(slope)
    try:
        np.broadcast_shapes(tuple(xs), tuple(ss))
    except ValueError:
        # older exporters: a (C,) slope is per channel (axis 1)
        if len(ss) == 1 and len(xs) >= 2 and ss[0] == xs[1] and slope in ctx.consts:
            slope = ctx.new_const("slope", ctx.consts[slope].reshape((-1,) + (1,) * (len(xs) - 2)))
        else:
            ctx.fail(f"slope of shape {ss} does not broadcast to the input {xs}")
    return [_node(ctx, "PRelu", [x, slope])]


def _where(ctx: Any) -> list[Node]:
    c = ctx.input(0)  # a mask computed at run time is float 0 / 1 already (felixjax.onnx_logic)
    if c in ctx.consts:
        c = ctx.new_const("cond", ctx.consts[c].astype(bool).astype(np.float32))
    return [_node(ctx, "Where", [c, ctx.input(1), ctx.input(2)])]


# ---- data movement -----------------------------------------------------------------------------

def _reshape_to(ctx: Any, shape: Sequence[int]) -> list[Node]:
    return [_node(ctx, "Reshape", ctx.inputs[:1], {"shape": tuple(int(d) for d in shape)})]


def _squeeze(ctx: Any) -> list[Node]:
    xs = ctx.shape(ctx.input(0))
    axes = _ints(ctx, 1, "axes", "axes")
    if ctx.op == "Squeeze":
        axes = [k for k, d in enumerate(xs) if d == 1] if axes is None else \
            sorted({ctx.axis(a, len(xs), "axes entry") for a in axes})
        if any(xs[a] != 1 for a in axes):
            ctx.fail(f"cannot squeeze axes {axes} of shape {xs}")
        return _reshape_to(ctx, [d for k, d in enumerate(xs) if k not in axes])
    if axes is None:
        ctx.fail("axes are required")
    rank = len(xs) + len(axes)
    axes = sorted({ctx.axis(a, rank, "axes entry") for a in axes})
    shape = list(xs)
    for a in axes:
        shape.insert(a, 1)
    return _reshape_to(ctx, shape)


def _cast(ctx: Any) -> list[Node]:
    if ctx.op == "Cast":
        to = int(ctx.attrs.get("to", 0))
    else:
        like = ctx.input(1)
        to = TensorProto.FLOAT if like in ctx.consts and ctx.consts[like].dtype == np.float32 else \
            ctx.types.get(like, (0,))[0]
    if to == TensorProto.BOOL:
        return cast_to_bool(ctx)
    if to != TensorProto.FLOAT:
        ctx.fail(f"a cast of a data tensor to {TensorProto.DataType.Name(to).lower() if to else 'another type'} "
                 f"is not supported (felixjax runs float32 tensors; casts of constants and shapes fold)")
    return [_node(ctx, "Identity", ctx.inputs[:1])]


def slice_spec(dim: int, start: int, end: int, step: int) -> tuple[int, int | None, int]:
    """ONNX Slice clamping for one axis as a Python slice (``stop`` None: run to the front)."""
    if step == 0:
        raise ValueError("step 0")
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return start, (None if end < 0 else end), step


def _slice(ctx: Any) -> list[Node]:
    xs = ctx.shape(ctx.input(0))
    if ctx.opset < 10:
        starts, ends = [int(v) for v in ctx.attrs["starts"]], [int(v) for v in ctx.attrs["ends"]]
        axes, steps = [int(v) for v in ctx.attrs.get("axes", range(len(starts)))], [1] * len(starts)
    else:
        starts, ends = _ints(ctx, 1, "", "starts"), _ints(ctx, 2, "", "ends")
        axes = _ints(ctx, 3, "", "axes") or list(range(len(starts)))
        steps = _ints(ctx, 4, "", "steps") or [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        ctx.fail("starts, ends, axes and steps differ in length")
    slices = [(0, d, 1) for d in xs]
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = ctx.axis(a, len(xs), "axes entry")
        if st == 0:
            ctx.fail("a step of 0")
        slices[a] = slice_spec(xs[a], s, e, st)
    return [_node(ctx, "Slice", ctx.inputs[:1], {"slices": tuple(slices)})]


def _gather(ctx: Any) -> list[Node]:
    xs = ctx.shape(ctx.input(0))
    axis = ctx.axis(int(ctx.attrs.get("axis", 0)), len(xs))
    idx = ctx.const(ctx.input(1), "the indices").astype(np.int64)
    if idx.size and (idx.min() < -xs[axis] or idx.max() >= xs[axis]):
        ctx.fail(f"indices out of range for axis {axis} of size {xs[axis]}")
    idx = np.where(idx < 0, idx + xs[axis], idx)
    return [_node(ctx, "Gather", ctx.inputs[:1], {"axis": axis, "indices": idx})]


def _gather_nd(ctx: Any) -> list[Node]:
    """GatherND with constant indices: the indexed axes (after ``batch_dims``) flattened into one, then one Gather
    of the flat offsets (a batch's offset included): output ``batch + index shape + the rest``."""
    xs = ctx.shape(ctx.input(0))
    idx = ctx.const(ctx.input(1), "the indices").astype(np.int64)
    b = int(ctx.attrs.get("batch_dims", 0))
    k = idx.shape[-1] if idx.ndim else -1
    if idx.ndim < b + 1 or not 0 <= b < len(xs) or not 0 <= k <= len(xs) - b or tuple(idx.shape[:b]) != xs[:b]:
        ctx.fail(f"indices of shape {idx.shape} with batch_dims={b} do not fit data of shape {xs}")
    dims = np.array(xs[b:b + k], np.int64)
    if ((idx < -dims) | (idx >= dims)).any():
        ctx.fail(f"indices out of range for axes of sizes {tuple(int(d) for d in dims)}")
    idx = np.where(idx < 0, idx + dims, idx)
    strides = np.array([math.prod(xs[b + j + 1:b + k]) for j in range(k)], np.int64)
    nb, nd, rest = math.prod(xs[:b]), math.prod(xs[b:b + k]), tuple(xs[b + k:])
    flat = (idx * strides).sum(-1) + np.arange(nb, dtype=np.int64).reshape(xs[:b] + (1,) * (idx.ndim - 1 - b)) * nd
    return _flat_gather(ctx, (nb * nd,) + rest, flat)


def _gather_elements(ctx: Any) -> list[Node]:
    """GatherElements with constant indices: the data flattened, then one Gather of each element's flat offset
    (output: the indices' shape)."""
    xs = ctx.shape(ctx.input(0))
    idx = ctx.const(ctx.input(1), "the indices").astype(np.int64)
    axis = ctx.axis(int(ctx.attrs.get("axis", 0)), len(xs))
    if idx.ndim != len(xs) or any(i > x for k, (i, x) in enumerate(zip(idx.shape, xs)) if k != axis):
        ctx.fail(f"indices of shape {idx.shape} do not fit data of shape {xs} on axis {axis}")
    if idx.size and (idx.min() < -xs[axis] or idx.max() >= xs[axis]):
        ctx.fail(f"indices out of range for axis {axis} of size {xs[axis]}")
    pos = list(np.indices(idx.shape, dtype=np.int64))
    pos[axis] = np.where(idx < 0, idx + xs[axis], idx)
    flat = np.ravel_multi_index(tuple(pos), xs) if idx.size else np.zeros(idx.shape, np.int64)
    return _flat_gather(ctx, (math.prod(xs),), flat.astype(np.int64))


def _flat_gather(ctx: Any, shape: tuple[int, ...], indices: np.ndarray) -> list[Node]:
    """GatherND / GatherElements: the input reshaped to ``shape`` (the indexed axes as one, first), then one
    Gather of ``indices`` along it."""
    mid = _tmp(ctx, "flat", shape)
    return [_node(ctx, "Reshape", ctx.inputs[:1], {"shape": shape}, [mid]),
            _node(ctx, "Gather", [mid], {"axis": 0, "indices": indices})]


def _cumsum(ctx: Any) -> list[Node]:
    rank = len(ctx.shape(ctx.input(0)))
    axis = ctx.const(ctx.input(1), "the axis").reshape(-1)
    if axis.size != 1:
        ctx.fail(f"the axis must be one integer (got {axis.tolist()})")
    return [_node(ctx, "CumSum", ctx.inputs[:1], {"axis": ctx.axis(int(axis[0]), rank),
                                                  "exclusive": int(ctx.attrs.get("exclusive", 0)),
                                                  "reverse": int(ctx.attrs.get("reverse", 0))})]


def _expand(ctx: Any) -> list[Node]:
    xs = ctx.shape(ctx.input(0))
    target = [int(v) for v in ctx.const(ctx.input(1), "the shape").reshape(-1)]
    try:
        shape = np.broadcast_shapes(tuple(xs), tuple(target))
    except ValueError:
        ctx.fail(f"cannot expand {xs} to {target}")
    return [_node(ctx, "Expand", ctx.inputs[:1], {"shape": tuple(int(d) for d in shape)})]


def _tile(ctx: Any) -> list[Node]:
    """Tile as one Gather per repeated axis (indices 0..d-1 repeated)."""
    x = ctx.input(0)
    xs = list(ctx.shape(x))
    reps = [int(r) for r in ctx.const(ctx.input(1), "repeats").reshape(-1)]
    if len(reps) != len(xs) or min(reps, default=1) < 1:
        ctx.fail(f"repeats {reps} must be >= 1, one per axis of {tuple(xs)}")
    axes = [a for a, r in enumerate(reps) if r > 1]
    if not axes:
        return [_node(ctx, "Identity", [x])]
    nodes, cur = [], x
    for k, a in enumerate(axes):
        shape = list(xs)
        shape[a] *= reps[a]
        out = ctx.outputs[0] if k == len(axes) - 1 else _tmp(ctx, f"tile{a}", shape)
        nodes.append(_node(ctx, "Gather", [cur], {"axis": a, "indices": np.tile(np.arange(xs[a]), reps[a])}, [out]))
        cur, xs = out, shape
    return nodes


def _depth_space(ctx: Any) -> list[Node]:
    """DepthToSpace / SpaceToDepth as Reshape -> Transpose -> Reshape."""
    x = ctx.input(0)
    xs = ctx.shape(x)
    if len(xs) != 4 or "blocksize" not in ctx.attrs:
        ctx.fail("needs a 4-D NCHW input and a blocksize")
    b, mode = int(ctx.attrs["blocksize"]), ctx.attrs.get("mode", "DCR")
    n, c, h, w = xs
    if mode not in ("DCR", "CRD") or b < 1:
        ctx.fail(f"mode={mode!r} / blocksize={b} is not supported (DCR, CRD)")
    if ctx.op == "DepthToSpace":
        if c % (b * b):
            ctx.fail(f"{c} channels do not divide by blocksize^2 = {b * b}")
        mid, perm = ((n, b, b, c // (b * b), h, w), (0, 3, 4, 1, 5, 2)) if mode == "DCR" else \
            ((n, c // (b * b), b, b, h, w), (0, 1, 4, 2, 5, 3))
        out = (n, c // (b * b), h * b, w * b)
    else:
        if h % b or w % b:
            ctx.fail(f"spatial size {h}x{w} does not divide by blocksize {b}")
        mid = (n, c, h // b, b, w // b, b)
        perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
        out = (n, c * b * b, h // b, w // b)
    r1 = _tmp(ctx, "blocks", mid)
    r2 = _tmp(ctx, "moved", [mid[p] for p in perm])
    return [_node(ctx, "Reshape", [x], {"shape": mid}, [r1]), _node(ctx, "Transpose", [r1], {"perm": perm}, [r2]),
            _node(ctx, "Reshape", [r2], {"shape": out})]


def _group_norm(ctx: Any) -> list[Node]:
    """GroupNormalization as Reshape -> LayerNormalization -> Reshape -> per-channel ScaleShift (opset 18's
    per-group scale and bias are gathered to channels)."""
    x, scale, bias = ctx.input(0), ctx.input(1), ctx.input(2)
    xs = ctx.shape(x)
    if len(xs) < 3 or "num_groups" not in ctx.attrs:
        ctx.fail("needs a (N, C, ...) input and num_groups")
    g = int(ctx.attrs["num_groups"])
    if g < 1 or xs[1] % g:
        ctx.fail(f"{xs[1]} channels do not divide into {g} groups")
    rows, cols = xs[0] * g, math.prod(xs[1:]) // g
    flat, normed, back = _tmp(ctx, "rows", (rows, cols)), _tmp(ctx, "normalized", (rows, cols)), _tmp(ctx, "y", xs)
    nodes = [_node(ctx, "Reshape", [x], {"shape": (rows, cols)}, [flat]),
             _node(ctx, "LayerNormalization", [flat, ctx.new_const("ones", np.ones(cols, np.float32))],
                   {"axis": 1, "epsilon": float(ctx.attrs.get("epsilon", 1e-5))}, [normed]),
             _node(ctx, "Reshape", [normed], {"shape": tuple(xs)}, [back])]
    params = []
    for v in (scale, bias):
        if ctx.shape(v) != (xs[1],):
            if ctx.shape(v) != (g,):
                ctx.fail(f"scale / bias of shape {ctx.shape(v)} fit neither {g} groups nor {xs[1]} channels")
            per_channel = _tmp(ctx, "per_channel", (xs[1],))
            ctx.shapes[per_channel] = (xs[1],)
            nodes.append(_node(ctx, "Gather", [v], {"axis": 0, "indices": np.repeat(np.arange(g), xs[1] // g)},
                               [per_channel]))
            v = per_channel
        params.append(v)
    # the input's shape: onnx infers none for the deprecated opset-18 op (onnxruntime runs it)
    ctx.types[ctx.outputs[0]] = (ctx.types.get(ctx.outputs[0], (TensorProto.FLOAT, None))[0], tuple(xs))
    return nodes + [_node(ctx, "ScaleShift", [back] + params)]


def _norm_chain(ctx: Any, x: str, axes: Sequence[int], kind: str) -> list[Node]:
    """Normalizations as chains of canonical ops (every one has a C kernel): ``rms`` x / sqrt(mean(x^2) +
    eps) * scale, ``l1`` / ``l2`` x / norm (a zero norm gives 0, as onnx's reference)."""
    xs = ctx.shape(x)
    red = tuple(1 if k in axes else d for k, d in enumerate(xs))
    nodes: list[Node] = []

    def add(op: str, ins: Sequence[str], shape: Sequence[int], attrs: Mapping[str, Any] | None = None,
            out: str | None = None) -> str:
        y = out or _tmp(ctx, op.lower(), shape)
        nodes.append(_node(ctx, op, ins, attrs, [y]))
        return y

    reduce = {"axes": tuple(axes), "keepdims": 1}
    if kind == "rms":
        ms = add("ReduceMean", [add("Mul", [x, x], xs)], red, reduce)
        eps = ctx.new_const("eps", np.float32(ctx.attrs.get("epsilon", 1e-5)))
        normed = add("Div", [x, add("Sqrt", [add("Add", [ms, eps], red)], red)], xs)
        add("Mul", [normed, ctx.input(1)], ctx.out_shape(ctx.outputs[0]), out=ctx.outputs[0])
    else:
        norm = add("ReduceL1" if kind == "l1" else "ReduceL2", [x], red, reduce)
        norm = add("Max", [norm, ctx.new_const("tiny", np.float32(np.finfo(np.float32).tiny))], red)
        add("Div", [x, norm], xs, out=ctx.outputs[0])
    return nodes


def _normalization(ctx: Any) -> list[Node]:
    x = ctx.input(0)
    rank = len(ctx.shape(x))
    if ctx.op == "RMSNormalization":
        if int(ctx.attrs.get("stash_type", 1)) != 1:
            ctx.fail("stash_type other than 1 (float32) is not supported")
        axis = ctx.axis(int(ctx.attrs.get("axis", -1)), rank)
        return _norm_chain(ctx, x, range(axis, rank), "rms")
    p = int(ctx.attrs.get("p", 2))  # LpNormalization
    if p not in (1, 2):
        ctx.fail(f"p={p} is not supported (1 or 2)")
    return _norm_chain(ctx, x, [ctx.axis(int(ctx.attrs.get("axis", -1)), rank)], f"l{p}")


def _trilu(ctx: Any) -> list[Node]:
    """Trilu as Where with a constant triangular mask."""
    xs = ctx.shape(ctx.input(0))
    if len(xs) < 2:
        ctx.fail("the input must be at least 2-D")
    k = int(ctx.const(ctx.input(1), "k").reshape(-1)[0]) if ctx.input(1) else 0
    ones = np.ones(xs[-2:], bool)
    mask = np.triu(ones, k) if int(ctx.attrs.get("upper", 1)) else np.tril(ones, k)
    return [_node(ctx, "Where", [ctx.new_const("mask", mask.astype(np.float32)), ctx.input(0),
                                 ctx.new_const("zero", np.float32(0.0))])]


def _log_softmax(ctx: Any) -> list[Node]:
    rank = len(ctx.shape(ctx.input(0)))
    if ctx.opset < 13:  # before opset 13 the input is coerced to 2-D at `axis` (default 1)
        axes = tuple(range(ctx.axis(int(ctx.attrs.get("axis", 1)), rank), rank))
    else:
        axes = (ctx.axis(int(ctx.attrs.get("axis", -1)), rank),)
    return [_node(ctx, "LogSoftmax", ctx.inputs[:1], {"axes": axes})]


def _split(ctx: Any) -> list[Node]:
    xs = ctx.shape(ctx.input(0))
    axis = ctx.axis(int(ctx.attrs.get("axis", 0)), len(xs))
    n = len(ctx.onode.output)
    sizes = _ints(ctx, 1, "split", "split")
    if sizes is None:
        if "num_outputs" in ctx.attrs:
            n = int(ctx.attrs["num_outputs"])
        chunk = -(-xs[axis] // n)
        sizes = [min(chunk, xs[axis] - k * chunk) for k in range(n)]
    if sum(sizes) != xs[axis] or min(sizes) < 0 or len(sizes) != len(ctx.onode.output):
        ctx.fail(f"split sizes {sizes} do not divide axis {axis} of size {xs[axis]} into {len(ctx.onode.output)} "
                 f"outputs")
    nodes, begin = [], 0
    for size, out in zip(sizes, ctx.onode.output):
        if out:
            slices = [(0, d, 1) for d in xs]
            slices[axis] = (begin, begin + size, 1)
            nodes.append(_node(ctx, "Slice", ctx.inputs[:1], {"slices": tuple(slices)}, [out]))
        begin += size
    return nodes


# ---- reductions and normalization ----------------------------------------------------------------

def _reduce(ctx: Any) -> list[Node]:
    x = ctx.input(0)
    rank = len(ctx.shape(x))
    axes = _ints(ctx, 1, "axes", "axes") or []
    if not axes:
        if int(ctx.attrs.get("noop_with_empty_axes", 0)):
            return [_node(ctx, "Identity", [x])]
        axes = list(range(rank))
    axes = sorted({ctx.axis(v, rank, "axes entry") for v in axes})
    return [_node(ctx, ctx.op, [x], {"axes": tuple(axes), "keepdims": int(ctx.attrs.get("keepdims", 1))})]


def _global_max_pool(ctx: Any) -> list[Node]:
    rank = len(ctx.shape(ctx.input(0)))
    if rank < 3:
        ctx.fail("the input needs spatial axes (rank >= 3)")
    return [_node(ctx, "ReduceMax", ctx.inputs[:1], {"axes": tuple(range(2, rank)), "keepdims": 1})]


def _instance_norm(ctx: Any) -> list[Node]:
    x, scale, bias = ctx.input(0), ctx.input(1), ctx.input(2)
    xs = ctx.shape(x)
    if len(xs) < 3:
        ctx.fail("the input needs spatial axes (rank >= 3)")
    rows, cols = xs[0] * xs[1], math.prod(xs[2:])
    flat, normed, back = _tmp(ctx, "rows", (rows, cols)), _tmp(ctx, "normalized", (rows, cols)), _tmp(ctx, "y", xs)
    ones = ctx.new_const("ones", np.ones(cols, np.float32))
    return [_node(ctx, "Reshape", [x], {"shape": (rows, cols)}, [flat]),
            _node(ctx, "LayerNormalization", [flat, ones], {"axis": 1, "epsilon": float(ctx.attrs.get("epsilon", 1e-5))},
                  [normed]),
            _node(ctx, "Reshape", [normed], {"shape": tuple(xs)}, [back]),
            _node(ctx, "ScaleShift", [back, scale, bias])]


def _lrn(ctx: Any) -> list[Node]:
    if len(ctx.shape(ctx.input(0))) < 3:
        ctx.fail("the input needs a channel axis and spatial axes (rank >= 3)")
    if "size" not in ctx.attrs:
        ctx.fail("size is required")
    a = ctx.attrs
    return [_node(ctx, "LRN", ctx.inputs[:1], {"size": int(a["size"]), "alpha": float(a.get("alpha", 1e-4)),
                                               "beta": float(a.get("beta", 0.75)), "bias": float(a.get("bias", 1.0))})]


# ---- ops that must fold ---------------------------------------------------------------------------

def _must_fold(ctx: Any) -> list[Node]:
    ctx.fail("this op computes shapes or indices and must fold to a constant once the input shapes are static; "
             "it reads a value computed at run time (pin dynamic inputs with input_shapes= / --input-shape, "
             "non-float inputs with input_values=)")


IMPORTERS = {
    **{op: _unary for op in UNARY}, **{op: _param_unary for op in PARAM_UNARY},
    **{op: _variadic for op in ("Max", "Min", "Sum", "Mean")}, "PRelu": _prelu, "Mod": _mod, "Where": _where,
    "Slice": _slice, "Gather": _gather, "GatherND": _gather_nd, "GatherElements": _gather_elements, "CumSum": _cumsum,
    "Expand": _expand,
    "Split": _split, "Squeeze": _squeeze,
    "Unsqueeze": _squeeze, "Cast": _cast, "CastLike": _cast,
    **{op: _reduce for op in REDUCE}, "GlobalMaxPool": _global_max_pool,
    "InstanceNormalization": _instance_norm, "LRN": _lrn, "Tile": _tile, "LogSoftmax": _log_softmax,
    "DepthToSpace": _depth_space, "SpaceToDepth": _depth_space, "GroupNormalization": _group_norm,
    **{op: _normalization for op in ("RMSNormalization", "LpNormalization")},
    "Trilu": _trilu,
    **{op: _must_fold for op in ("Shape", "Size", "Range", "NonZero")},
}

# Resize / Upsample, ConvTranspose and 1-D lifting live in felixjax/onnx_spatial.py (it imports the helpers
# above); felixjax.onnx_importers merges its SPATIAL_IMPORTERS with these, so the imports point one way.
__all__ = ["ATTRS", "IMPORTERS", "OPS", "slice_spec"]
