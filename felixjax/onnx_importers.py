"""The op importers of stage ①: the context an importer sees of one ONNX node (:class:`_Ctx`), the
importers of the core ops, and the table of every importer (the core ones here, the ones real exporters
add in ``felixjax.onnx_ops``). ``felixjax.onnx_import`` drives them node by node.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from felixjax.errors import ModelFormatError, UnsupportedModelError
from felixjax.graph_passes import Node
from felixjax.onnx_einsum import ATTRS as _EINSUM_ATTRS
from felixjax.onnx_einsum import IMPORTERS as _EINSUM_IMPORTERS
from felixjax.onnx_einsum import OPS as _EINSUM_OPS
from felixjax.onnx_functions import SCHEMA_FUNCTIONS
from felixjax.onnx_logic import ATTRS as _LOGIC_ATTRS
from felixjax.onnx_logic import IMPORTERS as _LOGIC_IMPORTERS
from felixjax.onnx_logic import OPS as _LOGIC_OPS
from felixjax.onnx_ops import ATTRS as _NEW_ATTRS
from felixjax.onnx_ops import IMPORTERS as _NEW_IMPORTERS
from felixjax.onnx_ops import OPS as _NEW_OPS
from felixjax.onnx_spatial import SPATIAL_IMPORTERS, lift_1d

SUPPORTED_OPS = (
    "Conv", "Gemm", "MatMul", "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Relu", "Clip", "Sigmoid", "Tanh",
    "Erf", "BatchNormalization", "LayerNormalization", "ReduceMean", "MaxPool", "AveragePool",
    "GlobalAveragePool", "Flatten", "Reshape", "Transpose", "Concat", "Softmax", "Pad", "Identity", "Dropout",
    "Constant", "ConstantOfShape",
) + _NEW_OPS + _EINSUM_OPS + _LOGIC_OPS + SCHEMA_FUNCTIONS

# Attributes each op may carry (any other one is refused, never ignored).
_ATTRS: dict[str, set[str]] = {
    "Conv": {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"},
    "Gemm": {"alpha", "beta", "transA", "transB", "broadcast"},
    "BatchNormalization": {"epsilon", "momentum", "spatial", "is_test", "training_mode"},
    "LayerNormalization": {"axis", "epsilon", "stash_type"},
    "ReduceMean": {"axes", "keepdims", "noop_with_empty_axes"},
    "MaxPool": {"auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "storage_order", "strides"},
    "AveragePool": {"auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape", "pads", "strides"},
    "Flatten": {"axis"}, "Reshape": {"allowzero"}, "Transpose": {"perm"}, "Concat": {"axis"},
    "Softmax": {"axis"}, "Pad": {"mode", "pads", "value"}, "Dropout": {"ratio", "is_test", "seed"},
    "Clip": {"min", "max"}, "Constant": {"value", "value_float", "value_floats", "value_int", "value_ints"},
    "ConstantOfShape": {"value"},
    **{op: {"broadcast", "axis"} for op in ("Add", "Sub", "Mul", "Div", "Pow")},
    **_NEW_ATTRS, **_EINSUM_ATTRS, **_LOGIC_ATTRS,
}



def _dtype_name(elem: int) -> str:
    try:
        return TensorProto.DataType.Name(elem).lower()
    except ValueError:
        return "a non-tensor type"


def _show_shape(shape: Any) -> str:
    return "unknown" if shape is None else "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"


class _Ctx:
    """What an op importer sees of one ONNX node: its inputs, attributes, shapes and known constants."""

    def __init__(self, onode: onnx.NodeProto, index: int, opset: int, consts: dict, types: dict, shapes: dict,
                 taken: set[str], used: set[str], name: str | None = None) -> None:
        self.onode, self.opset, self.consts, self.types, self.shapes, self.taken, self.used = (
            onode, opset, consts, types, shapes, taken, used)
        self.op = onode.op_type
        self.name = name or onode.name or f"{onode.op_type}_{index}"
        self.attrs = {a.name: helper.get_attribute_value(a) for a in onode.attribute}
        try:
            self.attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in self.attrs.items()}
        except UnicodeDecodeError:
            raise ModelFormatError(f"node {self.name!r} (op {self.op}): a string attribute is not valid UTF-8; "
                                   f"the file is corrupt") from None
        for a in onode.attribute:
            if a.ref_attr_name:
                self.fail(f"attribute {a.name!r} refers to a function attribute, which is not supported")
        extra = set(self.attrs) - _ATTRS.get(self.op, set())
        if extra:
            allowed = ", ".join(sorted(_ATTRS.get(self.op, set()))) or "none"
            self.fail(f"attribute {sorted(extra)[0]!r} is not supported (supported attributes: {allowed})")
        self.inputs = list(onode.input)
        self.outputs = [o for o in onode.output]
        while self.outputs and self.outputs[-1] == "":
            self.outputs.pop()

    def fail(self, message: str) -> None:
        raise UnsupportedModelError(f"node {self.name!r} (op {self.op}): {message}")

    def input(self, k: int) -> str:
        return self.inputs[k] if k < len(self.inputs) else ""

    def shape(self, value: str) -> tuple[int, ...]:
        if value in self.consts:
            return tuple(self.consts[value].shape)
        if value in self.shapes:
            return self.shapes[value]
        self.fail(f"the shape of input {value!r} is unknown")

    def out_shape(self, value: str) -> tuple[int, ...]:
        shape = self.types.get(value, (0, None))[1]
        if shape is None or any(not isinstance(d, int) for d in shape):
            self.fail(f"output {value!r} has a dynamic or unknown shape {_show_shape(shape)}; felixjax needs static "
                      f"shapes")
        return tuple(shape)

    def static_shape(self, value: str) -> tuple[int, ...] | None:
        shape = self.types.get(value, (0, None))[1]
        return None if shape is None or any(not isinstance(d, int) for d in shape) else tuple(shape)

    def const(self, value: str, what: str) -> np.ndarray:
        if value not in self.consts:
            self.fail(f"{what} must be a constant (static shapes); input {value!r} is computed at run time")
        return self.consts[value]

    def new_const(self, suffix: str, value: np.ndarray) -> str:
        name = self.fresh(suffix)
        self.consts[name] = np.asarray(value)
        return name

    def fresh(self, suffix: str) -> str:
        name, i = f"{self.name}/{suffix}", 1
        while name in self.taken:
            name, i = f"{self.name}/{suffix}_{i}", i + 1
        self.taken.add(name)
        return name

    def axis(self, axis: int, rank: int, what: str = "axis") -> int:
        if not -rank <= axis < rank:
            self.fail(f"{what} {axis} is out of range for a rank-{rank} input")
        return axis % rank

    def pair(self, key: str, default: int) -> tuple[int, int]:
        v = [int(d) for d in self.attrs.get(key, [default, default])]
        if len(v) != 2:
            self.fail(f"{key}={v} must have 2 entries (2-D spatial only)")
        return v[0], v[1]

    def spatial_pads(self, in_hw: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                     dilations: Sequence[int]) -> tuple[int, int, int, int]:
        """(top, left, bottom, right) from ``pads`` or ``auto_pad``."""
        auto = self.attrs.get("auto_pad", "NOTSET")
        if auto == "NOTSET":
            p = [int(d) for d in self.attrs.get("pads", [0, 0, 0, 0])]
            if len(p) != 4:
                self.fail(f"pads={p} must have 4 entries (2-D spatial only)")
            if min(p) < 0:
                self.fail(f"negative pads {p} are not supported")
            return p[0], p[1], p[2], p[3]
        if auto == "VALID":
            return 0, 0, 0, 0
        if auto not in ("SAME_UPPER", "SAME_LOWER"):
            self.fail(f"auto_pad={auto!r} is not supported (supported: NOTSET, VALID, SAME_UPPER, SAME_LOWER)")
        begin, end = [], []
        for size, k, s, d in zip(in_hw, kernel, strides, dilations):
            total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
            small, big = total // 2, total - total // 2
            begin.append(small if auto == "SAME_UPPER" else big)
            end.append(big if auto == "SAME_UPPER" else small)
        return begin[0], begin[1], end[0], end[1]


def _node(ctx: _Ctx, op: str, inputs: Sequence[str], attrs: Mapping[str, Any] | None = None,
          outputs: Sequence[str] | None = None) -> Node:
    return Node(op, tuple(inputs), tuple(outputs if outputs is not None else ctx.outputs[:1]), dict(attrs or {}),
                ctx.name)


def _only_first_output(ctx: _Ctx, what: str) -> None:
    used = [o for o in ctx.outputs[1:] if o in ctx.used]
    if used:
        ctx.fail(f"the {what} output ({used[0]!r}) is not supported (inference only)")


# ---- op importers: each yields canonical nodes ---------------------------------------------------

def _conv(ctx: _Ctx) -> list[Node]:
    x, w, b = ctx.input(0), ctx.input(1), ctx.input(2)
    xs, ws = ctx.shape(x), ctx.shape(w)
    if len(xs) != 4:
        ctx.fail(f"only 2-D convolution (4-D NCHW input) is supported; the input is {len(xs)}-D")
    kernel = tuple(int(k) for k in ctx.attrs.get("kernel_shape", ws[2:]))
    if kernel != tuple(ws[2:]):
        ctx.fail(f"kernel_shape {kernel} does not match the weights {ws}")
    strides, dilations = ctx.pair("strides", 1), ctx.pair("dilations", 1)
    pads = ctx.spatial_pads(xs[2:], kernel, strides, dilations)
    if 0 in xs:
        ctx.fail(f"its input {x!r} is empty {tuple(xs)}; empty tensors are not supported")
    for i, axis in enumerate(("height", "width")):  # onnxruntime refuses such a model; the C build returned nothing
        span, padded = (kernel[i] - 1) * dilations[i] + 1, xs[2 + i] + pads[i] + pads[i + 2]
        if span > padded:
            ctx.fail(f"the kernel's {axis} spans {span} pixels (kernel {kernel[i]}, dilation {dilations[i]}), more "
                     f"than the padded input's {padded}: the output would be empty")
    attrs = {"kernel": kernel, "strides": strides, "dilations": dilations, "groups": int(ctx.attrs.get("group", 1)),
             "pads": pads}
    return [_node(ctx, "Conv", [x, w] + ([b] if b else []), attrs)]


def _gemm(ctx: _Ctx) -> list[Node]:
    a, b, c = ctx.input(0), ctx.input(1), ctx.input(2)
    if len(ctx.shape(a)) != 2 or len(ctx.shape(b)) != 2:
        ctx.fail("A and B must be 2-D matrices")
    attrs = {"alpha": float(ctx.attrs.get("alpha", 1.0)), "beta": float(ctx.attrs.get("beta", 1.0)),
             "trans_a": int(ctx.attrs.get("transA", 0)), "trans_b": int(ctx.attrs.get("transB", 0))}
    if attrs["beta"] == 0.0:  # beta * C adds nothing (onnxruntime ignores C, NaN / Inf in it included)
        c = ""
    return [_node(ctx, "Gemm", [a, b] + ([c] if c else []), attrs)]


def _matmul(ctx: _Ctx) -> list[Node]:
    return [_node(ctx, "MatMul", ctx.inputs[:2])]


def _binary(ctx: _Ctx) -> list[Node]:
    a, b = ctx.input(0), ctx.input(1)
    if ctx.attrs.get("broadcast", 0) and "axis" in ctx.attrs:
        # opset < 7 legacy broadcasting: B's dims line up with A's starting at `axis`
        ra, bs = len(ctx.shape(a)), ctx.shape(b)
        axis = ctx.axis(int(ctx.attrs["axis"]), ra)
        target = (1,) * axis + tuple(bs) + (1,) * (ra - axis - len(bs))
        if b in ctx.consts:
            b = ctx.new_const("b", ctx.consts[b].reshape(target))
        else:
            reshaped = ctx.fresh("b")
            ctx.types[reshaped] = (TensorProto.FLOAT, target)
            return [_node(ctx, "Reshape", [b], {"shape": target}, [reshaped]), _node(ctx, ctx.op, [a, reshaped])]
    return [_node(ctx, ctx.op, [a, b])]


def _unary(ctx: _Ctx) -> list[Node]:
    return [_node(ctx, ctx.op, ctx.inputs[:1])]


def _clip(ctx: _Ctx) -> list[Node]:
    x, lo, hi = ctx.input(0), ctx.input(1), ctx.input(2)
    if ctx.opset < 11:  # bounds are attributes before opset 11
        lo = ctx.new_const("min", np.float32(ctx.attrs["min"])) if "min" in ctx.attrs else ""
        hi = ctx.new_const("max", np.float32(ctx.attrs["max"])) if "max" in ctx.attrs else ""
    return [_node(ctx, "Clip", [x, lo, hi])]


def _batchnorm(ctx: _Ctx) -> list[Node]:
    if int(ctx.attrs.get("training_mode", 0)):
        ctx.fail("training_mode=1 is not supported (inference only)")
    if int(ctx.attrs.get("spatial", 1)) != 1:
        ctx.fail("spatial=0 (per-activation statistics) is not supported")
    _only_first_output(ctx, "running statistics")
    if len(ctx.shape(ctx.input(0))) < 2:
        ctx.fail("the input must have a channel axis (rank >= 2)")
    return [_node(ctx, "BatchNormalization", ctx.inputs[:5], {"epsilon": float(ctx.attrs.get("epsilon", 1e-5))})]


def _layernorm(ctx: _Ctx) -> list[Node]:
    if int(ctx.attrs.get("stash_type", 1)) != 1:
        ctx.fail("stash_type other than 1 (float32) is not supported")
    rank = len(ctx.shape(ctx.input(0)))
    attrs = {"axis": ctx.axis(int(ctx.attrs.get("axis", -1)), rank), "epsilon": float(ctx.attrs.get("epsilon", 1e-5))}
    inputs = ctx.inputs[:2] + ([ctx.input(2)] if ctx.input(2) else [])
    return [_node(ctx, "LayerNormalization", inputs, attrs, ctx.outputs)]


def _reduce_mean(ctx: _Ctx) -> list[Node]:
    x = ctx.input(0)
    rank = len(ctx.shape(x))
    if ctx.input(1):
        axes = [int(v) for v in ctx.const(ctx.input(1), "axes").reshape(-1)]
    else:
        axes = [int(v) for v in ctx.attrs.get("axes", [])]
    if not axes:
        if int(ctx.attrs.get("noop_with_empty_axes", 0)):
            return [_node(ctx, "Identity", [x])]
        axes = list(range(rank))
    axes = sorted({ctx.axis(v, rank, "axes entry") for v in axes})
    return [_node(ctx, "ReduceMean", [x], {"axes": tuple(axes), "keepdims": int(ctx.attrs.get("keepdims", 1))})]


def _pool(ctx: _Ctx) -> list[Node]:
    x = ctx.input(0)
    xs = ctx.shape(x)
    if len(xs) != 4:
        ctx.fail(f"only 2-D pooling (4-D NCHW input) is supported; the input is {len(xs)}-D")
    _only_first_output(ctx, "Indices")
    if "kernel_shape" not in ctx.attrs:
        ctx.fail("kernel_shape is required")
    kernel = tuple(int(k) for k in ctx.attrs["kernel_shape"])
    if len(kernel) != 2:
        ctx.fail(f"kernel_shape={list(kernel)} must have 2 entries (2-D spatial only)")
    strides, dilations = ctx.pair("strides", 1), ctx.pair("dilations", 1)
    attrs = {"kernel": kernel, "strides": strides, "dilations": dilations,
             "pads": ctx.spatial_pads(xs[2:], kernel, strides, dilations),
             "ceil_mode": int(ctx.attrs.get("ceil_mode", 0))}
    if ctx.op == "AveragePool":
        attrs["count_include_pad"] = int(ctx.attrs.get("count_include_pad", 0))
    return [_node(ctx, ctx.op, [x], attrs)]


def _global_avg_pool(ctx: _Ctx) -> list[Node]:
    rank = len(ctx.shape(ctx.input(0)))
    if rank < 3:
        ctx.fail(f"the input needs spatial axes (rank >= 3); it is {rank}-D")
    return [_node(ctx, "ReduceMean", ctx.inputs[:1], {"axes": tuple(range(2, rank)), "keepdims": 1})]


def _flatten(ctx: _Ctx) -> list[Node]:
    xs = ctx.shape(ctx.input(0))
    axis = int(ctx.attrs.get("axis", 1))
    axis = axis if axis == len(xs) else ctx.axis(axis, len(xs))
    return [_node(ctx, "Reshape", ctx.inputs[:1], {"shape": (math.prod(xs[:axis]), math.prod(xs[axis:]))})]


def _reshape(ctx: _Ctx) -> list[Node]:
    xs = ctx.shape(ctx.input(0))
    spec = [int(v) for v in ctx.const(ctx.input(1), "the target shape").reshape(-1)]
    allowzero = int(ctx.attrs.get("allowzero", 0))
    shape = [xs[i] if (d == 0 and not allowzero) else d for i, d in enumerate(spec)]
    if shape.count(-1) > 1:
        ctx.fail(f"target shape {spec} has more than one -1")
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        if known == 0 or math.prod(xs) % known:
            ctx.fail(f"cannot reshape {xs} to {spec}")
        shape[shape.index(-1)] = math.prod(xs) // known
    if math.prod(shape) != math.prod(xs) or min(shape, default=1) < 0:
        ctx.fail(f"cannot reshape {xs} to {spec}")
    return [_node(ctx, "Reshape", ctx.inputs[:1], {"shape": tuple(shape)})]


def _transpose(ctx: _Ctx) -> list[Node]:
    rank = len(ctx.shape(ctx.input(0)))
    perm = [int(p) for p in ctx.attrs.get("perm", range(rank - 1, -1, -1))]
    if sorted(perm) != list(range(rank)):
        ctx.fail(f"perm={perm} is not a permutation of the {rank} axes")
    return [_node(ctx, "Transpose", ctx.inputs[:1], {"perm": tuple(perm)})]


def _concat(ctx: _Ctx) -> list[Node]:
    rank = len(ctx.shape(ctx.input(0)))
    if "axis" not in ctx.attrs:
        ctx.fail("axis is required")
    return [_node(ctx, "Concat", ctx.inputs, {"axis": ctx.axis(int(ctx.attrs["axis"]), rank)})]


def _softmax(ctx: _Ctx) -> list[Node]:
    rank = len(ctx.shape(ctx.input(0)))
    if ctx.opset < 13:  # before opset 13 the input is coerced to 2-D at `axis` (default 1)
        axis = ctx.axis(int(ctx.attrs.get("axis", 1)), rank)
        axes = tuple(range(axis, rank))
    else:
        axes = (ctx.axis(int(ctx.attrs.get("axis", -1)), rank),)
    return [_node(ctx, "Softmax", ctx.inputs[:1], {"axes": axes})]


def _pad(ctx: _Ctx) -> list[Node]:
    x = ctx.input(0)
    rank = len(ctx.shape(x))
    mode = ctx.attrs.get("mode", "constant")
    if mode not in ("constant", "reflect", "edge"):
        ctx.fail(f"mode={mode!r} is not supported (supported: constant, reflect, edge)")
    if ctx.opset < 11:
        pads, value = [int(p) for p in ctx.attrs.get("pads", [])], np.float32(ctx.attrs.get("value", 0.0))
        value_name = ctx.new_const("value", value)
    else:
        pads = [int(p) for p in ctx.const(ctx.input(1), "pads").reshape(-1)]
        value_name = ctx.input(2) or ctx.new_const("value", np.float32(0.0))
    axes = list(range(rank))
    if ctx.input(3):
        axes = [ctx.axis(int(a), rank, "axes entry") for a in ctx.const(ctx.input(3), "axes").reshape(-1)]
    if len(pads) != 2 * len(axes):
        ctx.fail(f"pads has {len(pads)} entries, expected {2 * len(axes)}")
    per_dim = [(0, 0)] * rank
    for j, axis in enumerate(axes):
        per_dim[axis] = (pads[j], pads[j + len(axes)])
    if mode == "reflect" and any(max(b, e) >= d for (b, e), d in zip(per_dim, ctx.shape(x))):
        ctx.fail(f"reflect pads {per_dim} must be smaller than the dims {ctx.shape(x)}")
    return [_node(ctx, "Pad", [x, value_name], {"pads": tuple(per_dim), "mode": mode})]


def _identity(ctx: _Ctx) -> list[Node]:
    return [_node(ctx, "Identity", ctx.inputs[:1])]


def _dropout(ctx: _Ctx) -> list[Node]:
    _only_first_output(ctx, "mask")
    if ctx.input(2) and bool(ctx.const(ctx.input(2), "training_mode").reshape(-1)[0]):
        ctx.fail("training_mode=True is not supported (inference only)")
    return [_node(ctx, "Dropout", ctx.inputs[:1])]


def _constant(ctx: _Ctx) -> list[Node]:
    a = ctx.attrs
    if "value" in a:
        value = numpy_helper.to_array(a["value"])
    elif "value_float" in a:
        value = np.array(a["value_float"], np.float32)
    elif "value_floats" in a:
        value = np.array(a["value_floats"], np.float32)
    elif "value_int" in a:
        value = np.array(a["value_int"], np.int64)
    elif "value_ints" in a:
        value = np.array(a["value_ints"], np.int64)
    else:
        ctx.fail("needs a value (supported: value, value_float(s), value_int(s))")
    ctx.consts[ctx.outputs[0]] = value
    return []


def _constant_of_shape(ctx: _Ctx) -> list[Node]:
    shape = [int(d) for d in ctx.const(ctx.input(0), "the shape").reshape(-1)]
    fill = numpy_helper.to_array(ctx.attrs["value"]).reshape(-1) if "value" in ctx.attrs else np.zeros(1, np.float32)
    ctx.consts[ctx.outputs[0]] = np.full(shape, fill[0], dtype=fill.dtype)
    return []


_IMPORTERS = {
    "Conv": _conv, "Gemm": _gemm, "MatMul": _matmul,
    **{op: _binary for op in ("Add", "Sub", "Mul", "Div", "Pow")},
    **{op: _unary for op in ("Sqrt", "Relu", "Sigmoid", "Tanh", "Erf")},
    "Clip": _clip, "BatchNormalization": _batchnorm, "LayerNormalization": _layernorm, "ReduceMean": _reduce_mean,
    "MaxPool": _pool, "AveragePool": _pool, "GlobalAveragePool": _global_avg_pool, "Flatten": _flatten,
    "Reshape": _reshape, "Transpose": _transpose, "Concat": _concat, "Softmax": _softmax, "Pad": _pad,
    "Identity": _identity, "Dropout": _dropout, "Constant": _constant, "ConstantOfShape": _constant_of_shape,
    **_NEW_IMPORTERS,
    **SPATIAL_IMPORTERS, **_EINSUM_IMPORTERS, **_LOGIC_IMPORTERS,
}
for _op in ("Conv", "MaxPool", "AveragePool"):  # 1-D (N, C, L) inputs run as 2-D with a unit height
    _IMPORTERS[_op] = lift_1d(_IMPORTERS[_op])


def node_names(nodes: list[onnx.NodeProto]) -> list[str]:
    """A distinct name per node: its own, else ``<OpType>_<index>``; one taken already (an unnamed node's
    ``Conv_0`` beside a node named so, or two nodes of one name, which onnxruntime refuses) gets ``_2``,
    ``_3``, ... A layout mapping or a per-layer timing names one layer alone (a session-82 review: two convs
    answered to ``Conv_0`` and ``mixed_layout`` gave both the second one's times)."""
    explicit = {n.name for n in nodes if n.name}
    out: list[str] = []
    given: set[str] = set()
    for index, n in enumerate(nodes):
        name = base = n.name or f"{n.op_type}_{index}"
        k = 2
        while name in given or (not n.name and name in explicit):
            name, k = f"{base}_{k}", k + 1
        given.add(name)
        out.append(name)
    return out
