"""Shape pinning and constant folding on the ONNX protobuf, before stage ① imports it.

Exporters write shape arithmetic into the graph (``Shape -> Gather -> Unsqueeze -> Concat -> Reshape``,
``Range``, ``ConstantOfShape``, ``Cast`` ...) and leave batch and image sizes symbolic. Once the graph
inputs are pinned (``input_shapes=``, and ``input_values=`` for non-float inputs such as an image-size
tensor), every such subgraph is a constant. :func:`fold_model` finds them by alternating onnx shape
inference with folding: a ``Shape`` / ``Size`` of a statically shaped value and any node whose inputs are
all constants (any op onnx's reference evaluator knows) become initializers, until nothing changes. What
is left is the data-flow graph with static shapes everywhere.

Example:
    >>> import numpy as np
    >>> from onnx import TensorProto, helper
    >>> nodes = [helper.make_node("Shape", ["x"], ["s"]),
    ...          helper.make_node("Reshape", ["x", "s2"], ["y"]),
    ...          helper.make_node("Slice", ["s", "z", "o"], ["n"]),
    ...          helper.make_node("Concat", ["n", "m1"], ["s2"], axis=0)]
    >>> g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4])],
    ...                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    ...                       [helper.make_tensor("z", TensorProto.INT64, [1], [0]),
    ...                        helper.make_tensor("o", TensorProto.INT64, [1], [1]),
    ...                        helper.make_tensor("m1", TensorProto.INT64, [1], [-1])])
    >>> m = fold_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), input_shapes={"x": (2, 3, 4)})
    >>> [n.op_type for n in m.graph.node], numpy_helper.to_array(m.graph.initializer[-1]).tolist()
    (['Reshape'], [2, -1])
"""
from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from felixjax.errors import ModelFormatError, UnsupportedModelError

MAX_FOLD_ELEMENTS = 1 << 24   # a node whose constant inputs or output are larger than this is not folded
MAX_ROUNDS = 32               # shape inference / folding alternations (each resolves one more level)
# ops never folded even with constant inputs (random or stateful outputs)
_NO_FOLD = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
            "If", "Loop", "Scan", "SequenceConstruct", "SequenceEmpty", "SplitToSequence", "Optional"}


def parse_input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``"x=1x3x224x224"`` -> ``("x", (1, 3, 224, 224))`` (the ``--input-shape`` syntax; ``,`` also separates).

    Example:
        >>> parse_input_shape("images=1x3x640x640")
        ('images', (1, 3, 640, 640))
    """
    name, sep, dims = text.rpartition("=")
    if not sep or not name or not re.fullmatch(r"\d+([x,]\d+)*", dims.strip()):
        raise ValueError(f"bad input shape {text!r}: expected NAME=D1xD2x..., e.g. x=1x3x224x224")
    return name, tuple(int(d) for d in re.split(r"[x,]", dims.strip()))


def parse_input_value(text: str) -> tuple[str, list[float]]:
    """``"im_shape=640,640"`` -> ``("im_shape", [640, 640])`` (the ``--input-value`` syntax; the values are
    cast to the input's dtype and reshaped to its declared shape).

    Example:
        >>> parse_input_value("scale=0.5")
        ('scale', [0.5])
    """
    name, sep, vals = text.rpartition("=")
    try:
        values = [float(v) if any(c in v for c in ".eE") else int(v) for v in vals.split(",")]
    except ValueError:
        values = []
    if not sep or not name or not values:
        raise ValueError(f"bad input value {text!r}: expected NAME=V1,V2,..., e.g. im_shape=640,640")
    return name, values


def fix_hint(name: str, shape: Sequence[Any] | None) -> str:
    """How to pin a dynamic input, in Python and on the command line."""
    dims = [str(d) if isinstance(d, int) and d > 0 else (str(d) if d and not isinstance(d, int) else f"d{k}")
            for k, d in enumerate(shape or [])] or ["D1", "D2"]
    named = [d for d in dims if not d.isdigit()]
    return (f"pin it with load_onnx(..., input_shapes={{{name!r}: ({', '.join(dims)})}}) or on the command line "
            f"with --input-shape {name}={'x'.join(dims)}, with sizes for {', '.join(named) or 'the names'}")


def _static(shape: Sequence[Any] | None) -> bool:
    return shape is not None and all(isinstance(d, int) and d >= 0 for d in shape)


def _shape_of(vi: onnx.ValueInfoProto) -> tuple | None:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)


def ceil_pool_pads(model: onnx.ModelProto) -> dict[int, list[int]]:
    """Pools whose inferred output keeps a window onnxruntime drops: ``{node index: pads}``, the pads under which
    the same node with ``ceil_mode=0`` has the output onnxruntime gives it.

    With ``ceil_mode=1`` a last window that would start past the input and its leading pad is dropped (the ONNX
    spec, onnxruntime, onnx's reference evaluator, PyTorch); onnx's shape inference (1.1x) keeps it, and every shape
    after it follows. ``model`` is shape-inferred; only explicit pads (``auto_pad`` NOTSET) are looked at."""
    shapes = {vi.name: _shape_of(vi) for vi in
              list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output)}
    out: dict[int, list[int]] = {}
    for i, node in enumerate(model.graph.node):
        if node.op_type not in ("MaxPool", "AveragePool") or node.domain not in ("", "ai.onnx"):
            continue
        a = {at.name: helper.get_attribute_value(at) for at in node.attribute}
        if not a.get("ceil_mode") or a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET", b""):
            continue
        xs, ys = shapes.get(node.input[0]), shapes.get(node.output[0])
        k = list(a.get("kernel_shape", []))
        n = len(k)
        if not n or not xs or not ys or len(xs) != n + 2 or len(ys) != n + 2 \
                or not all(isinstance(v, int) and v > 0 for v in list(xs[2:]) + list(ys[2:])):
            continue
        s, d = list(a.get("strides", [1] * n)), list(a.get("dilations", [1] * n))
        pads = list(a.get("pads", [0] * (2 * n)))
        new, changed = list(pads), False
        for j in range(n):
            size, span = xs[2 + j], (k[j] - 1) * d[j] + 1
            o = -(-(size + pads[j] + pads[n + j] - span) // s[j]) + 1
            if (o - 1) * s[j] >= size + pads[j]:  # the last window would start in the trailing pad: dropped
                o -= 1
            if ys[2 + j] != o:  # the largest end pad whose floor division gives o windows (>= the given one)
                new[n + j] = (o - 1) * s[j] + span - size - pads[j] + s[j] - 1
                changed = True
        if changed:
            out[i] = new
    return out



def gather_nd_shapes(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Shapes onnx's inference leaves out: a GatherND whose result is a scalar per batch (onnx 1.2x gives it no
    shape, and so none to every value after it). ``model`` is shape-inferred; returns value infos to add."""
    vis = list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output)
    shapes = {vi.name: _shape_of(vi) for vi in vis}
    shapes.update((t.name, tuple(t.dims)) for t in model.graph.initializer)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in vis}
    types.update((t.name, t.data_type) for t in model.graph.initializer)
    out = []
    for node in model.graph.node:
        if node.op_type != "GatherND" or node.domain not in ("", "ai.onnx") or len(node.input) < 2 \
                or shapes.get(node.output[0]) is not None:
            continue
        xs, idx = shapes.get(node.input[0]), shapes.get(node.input[1])
        b = next((int(helper.get_attribute_value(a)) for a in node.attribute if a.name == "batch_dims"), 0)
        if xs is None or not idx or not all(isinstance(d, int) for d in xs + idx) or not 0 <= b < len(idx) \
                or not 0 <= idx[-1] <= len(xs) - b:
            continue  # (malformed: the importer says why)
        shape = list(xs[:b]) + list(idx[b:-1]) + list(xs[b + idx[-1]:])
        out.append(helper.make_tensor_value_info(node.output[0], types.get(node.input[0], 0), shape))
    return out

DATA_PROP_MAX_ELEMENTS = 1 << 16  # a 1-D integer tensor longer than this is no shape: no data propagation


def data_prop_safe(graph: onnx.GraphProto) -> bool:
    """Whether onnx's data propagation stays cheap on ``graph``. It materializes 1-D integer tensors
    element by element in C++: ``ConstantOfShape([10**12])`` feeding a ``Concat`` (or
    ``ConstantOfShape([2**31, 2**31])`` feeding a ``Gather``) never returns, and
    10**7 elements already take ~4 s. False when a constant 1-D integer tensor, or the 1-D output of
    ConstantOfShape / Expand / Tile / Range on constant inputs, is longer than
    :data:`DATA_PROP_MAX_ELEMENTS` (for the three, the product of their constant shape / repeats
    input, whatever its rank) (such a tensor is data, not a shape; inference then runs without
    data propagation and the size limits judge the tensor).
    """
    limit = DATA_PROP_MAX_ELEMENTS
    ints: dict[str, np.ndarray] = {}
    for t in graph.initializer:
        if t.data_type in (TensorProto.INT64, TensorProto.INT32):
            if len(t.dims) == 1 and t.dims[0] > limit:
                return False
            if math.prod(t.dims) <= 8:
                try:
                    ints[t.name] = numpy_helper.to_array(t).astype(np.int64)
                except Exception:
                    continue
    for n in graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value" and a.t.data_type in (TensorProto.INT64, TensorProto.INT32) and n.output:
                    if len(a.t.dims) == 1 and a.t.dims[0] > limit:
                        return False
                    if math.prod(a.t.dims) <= 8:
                        with contextlib.suppress(Exception):
                            ints[n.output[0]] = numpy_helper.to_array(a.t).astype(np.int64)
        args = [ints.get(i) for i in n.input]
        try:
            if n.op_type in ("ConstantOfShape", "Expand", "Tile") and len(args) >= 1:
                shape = args[0] if n.op_type == "ConstantOfShape" else (args[1] if len(args) > 1 else None)
                if shape is not None and math.prod(abs(int(d)) for d in shape.reshape(-1)) > limit:
                    return False  # (any rank: data propagation also walks 2-D outputs fed to Gather)
            if n.op_type == "Range" and len(args) == 3 and all(a is not None and a.size == 1 for a in args):
                start, stop, step = (int(a.reshape(-1)[0]) for a in args)
                if step != 0 and (stop - start) // step > limit:
                    return False
        except (ValueError, OverflowError):
            continue
    return True


_SMALL_TYPES = (TensorProto.INT64, TensorProto.INT32, TensorProto.INT16, TensorProto.INT8, TensorProto.UINT8,
                TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64, TensorProto.BOOL)


class _Constants:
    """Constants by name. Initializers stay TensorProtos until a fold reads their values, so large weights
    are neither converted nor copied here; folded values and ``input_values`` are arrays."""

    def __init__(self) -> None:
        self.protos: dict[str, onnx.TensorProto] = {}
        self.arrays: dict[str, np.ndarray] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.arrays or name in self.protos

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.arrays:
            t = self.protos[name]
            try:
                self.arrays[name] = numpy_helper.to_array(t)
            except Exception as e:
                raise ModelFormatError(f"initializer {name!r} is corrupt ({e})") from None
        return self.arrays[name]

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        self.arrays[name] = value
        self.protos.pop(name, None)

    def names(self) -> list[str]:
        return list(self.protos) + [k for k in self.arrays if k not in self.protos]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.protos[name].dims) if name in self.protos else self.arrays[name].shape

    def tensor(self, name: str) -> onnx.TensorProto:
        if name in self.protos:
            return self.protos[name]
        return numpy_helper.from_array(np.require(self.arrays[name], requirements="C"), name)

    def value_info(self, name: str) -> onnx.TensorProto | onnx.ValueInfoProto:
        """The initializer itself when its values may feed shape computations (integer or small), else
        just its type (inference needs no weights)."""
        if name in self.protos:
            t = self.protos[name]
            if t.data_type in _SMALL_TYPES or math.prod(t.dims) <= 64:
                return t
            return helper.make_tensor_value_info(name, t.data_type, list(t.dims))
        v = self.arrays[name]
        if v.dtype.kind in "iub" or v.size <= 64:
            return numpy_helper.from_array(v, name)
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)


def _infer(graph_nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs, consts: _Constants,
           opsets, ir_version: int) -> dict[str, tuple | None]:
    """Shape inference with small constants as initializers (their values feed shape computations)."""
    g = onnx.GraphProto(name="fold")
    g.node.extend(graph_nodes)
    g.input.extend(inputs)
    g.output.extend(outputs)
    for name in consts.names():
        info = consts.value_info(name)
        (g.initializer if isinstance(info, onnx.TensorProto) else g.input).append(info)
    model = helper.make_model(g, opset_imports=opsets, ir_version=max(ir_version, 4))
    try:
        model = onnx.shape_inference.infer_shapes(model, data_prop=data_prop_safe(model.graph))
    except Exception as e:  # onnx.shape_inference.InferenceError
        raise ModelFormatError(f"ONNX shape inference failed: {str(e).strip().splitlines()[0]}") from None
    return {vi.name: _shape_of(vi) for vi in
            list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output)}


def _evaluate(node: onnx.NodeProto, args: list[np.ndarray | None], opsets) -> list[np.ndarray] | None:
    """Outputs of one all-constant node through onnx's reference evaluator (None if it cannot)."""
    from onnx.reference import ReferenceEvaluator

    names = [f"in{k}" if a is not None else "" for k, a in enumerate(args)]
    n2 = onnx.NodeProto()
    n2.CopyFrom(node)
    del n2.input[:]
    n2.input.extend(names)
    del n2.output[:]
    n2.output.extend(f"out{k}" if o else "" for k, o in enumerate(node.output))
    ins = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
           for n, a in zip(names, args) if a is not None]
    outs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in n2.output if o]
    model = helper.make_model(helper.make_graph([n2], "n", ins, outs), opset_imports=opsets)
    try:
        res = ReferenceEvaluator(model).run(None, {n: a for n, a in zip(names, args) if a is not None})
    except Exception:
        return None
    return [np.asarray(r) for r in res]


# ops whose output can be far larger than their constant inputs: folded only when the output size is known
_GROWING = {"Range", "Tile", "Expand", "Resize", "Upsample", "Pad", "ConstantOfShape", "ConvTranspose", "Einsum",
            "MatMul", "Gemm", "OneHot", "RandomNormal", "RandomUniform", "EyeLike", "CenterCropPad",
            "SpaceToDepth", "DepthToSpace", "Col2Im"}


def _small_output(node: onnx.NodeProto, args: list, shapes: dict) -> bool:
    """Whether folding ``node`` stays within :data:`MAX_FOLD_ELEMENTS` per output (a Range(0, 1e11) or a
    Tile by 10**5 of a constant would allocate for minutes)."""
    outs = [shapes.get(o) for o in node.output if o]
    if any(_static(s) and math.prod(s) > MAX_FOLD_ELEMENTS for s in outs):
        return False
    if node.op_type == "Range" and len(args) == 3 and all(a is not None and a.size == 1 for a in args):
        start, limit, delta = (float(a.reshape(-1)[0]) for a in args)
        if delta == 0 or not all(math.isfinite(v) for v in (start, limit, delta)):
            return False
        return max(math.ceil((limit - start) / delta), 0) <= MAX_FOLD_ELEMENTS
    return node.op_type not in _GROWING or node.op_type == "ConstantOfShape" or all(_static(s) for s in outs)


def _fold_node(node: onnx.NodeProto, consts: _Constants, shapes: dict, opsets) -> list[np.ndarray] | None:
    op = node.op_type
    if node.domain not in ("", "ai.onnx") or op in _NO_FOLD:
        return None
    if op in ("Shape", "Size"):
        shape = shapes.get(node.input[0]) if node.input[0] not in consts else consts.shape(node.input[0])
        if not _static(shape):
            return None
        if op == "Size":
            return [np.array(math.prod(shape), np.int64)]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        rank = len(shape)
        start, end = int(attrs.get("start", 0)), int(attrs.get("end", rank))
        start, end = (min(max(v + rank if v < 0 else v, 0), rank) for v in (start, end))
        return [np.array(shape[start:end], np.int64)]
    if any(i and i not in consts for i in node.input) or op == "Constant" and not node.output:
        return None
    if sum(math.prod(consts.shape(i)) for i in node.input if i) > MAX_FOLD_ELEMENTS:
        return None
    args = [consts[i] if i else None for i in node.input]
    if not _small_output(node, args, shapes):
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if op == "ConstantOfShape":  # fast paths for what exporters write hundreds of times
        shape = [int(d) for d in args[0].reshape(-1)] if args else []
        if math.prod(shape) > MAX_FOLD_ELEMENTS or min(shape, default=0) < 0:
            return None
        fill = numpy_helper.to_array(attrs["value"]).reshape(-1) if "value" in attrs else np.zeros(1, np.float32)
        return [np.full(shape, fill[0], dtype=fill.dtype)] if fill.size == 1 else None
    if op == "Unsqueeze" and "axes" in attrs and len(args) == 1:
        axes = sorted(int(a) % (args[0].ndim + len(attrs["axes"])) for a in attrs["axes"])
        y = args[0]
        for a in axes:
            y = np.expand_dims(y, a)
        return [y]
    if op == "Identity":
        return [args[0]]
    if op == "DequantizeLinear" and "block_size" not in attrs and args[0].dtype.kind in "iu":
        return [_dequantize(args, attrs)]  # onnx's reference evaluator has no opset 10-18 version of it
    return _evaluate(node, args, opsets)


def _dequantize(args: list, attrs: dict) -> np.ndarray:
    """DequantizeLinear of constants: ``(x - zero_point) * scale``, per tensor or along ``axis`` (default 1)."""
    x, scale = args[0], np.asarray(args[1], np.float32)
    zp = args[2] if len(args) > 2 and args[2] is not None else np.zeros_like(scale, dtype=x.dtype)
    if scale.ndim == 1 and x.ndim > 0:  # per axis
        axis = int(attrs.get("axis", 1)) % x.ndim
        view = [1] * x.ndim
        view[axis] = -1
        scale, zp = scale.reshape(view), np.asarray(zp).reshape(view)
    return ((x.astype(np.int64) - np.asarray(zp).astype(np.int64)).astype(np.float32) * scale).astype(np.float32)


@dataclass
class FoldedGraph:
    """The parts of a folded graph stage ① reads, as lists of the original protos (nothing copied)."""

    name: str
    node: list
    input: list
    output: list
    initializer: list
    value_info: list = field(default_factory=list)


@dataclass
class FoldedModel:
    """What :func:`fold_model` returns with ``copy=False``: read like a ModelProto by stage ①."""

    graph: FoldedGraph
    opset_import: list
    ir_version: int


def fold_model(proto: onnx.ModelProto, *, input_shapes: Mapping[str, Sequence[int]] | None = None,
               input_values: Mapping[str, Any] | None = None, copy: bool = True) -> onnx.ModelProto | FoldedModel:
    """A copy of ``proto`` with inputs pinned and every constant / shape subgraph folded to initializers.

    ``input_shapes`` pins the dims of inputs (they must agree with the static dims the model declares);
    ``input_values`` turns inputs into constants (any dtype: an int64 image-size input, a bool flag).
    Nodes that stay keep their order; initializers nobody reads are dropped. ``copy=False`` returns a
    :class:`FoldedModel` of lists of the original protos instead of a new ModelProto (copying 0.5 GB of
    weights into a new protobuf takes seconds).
    """
    g = proto.graph
    opsets = list(proto.opset_import)
    inits = {t.name for t in g.initializer}
    runtime = [vi for vi in g.input if vi.name not in inits]
    runtime_names = [vi.name for vi in runtime]
    pinned, values = dict(input_shapes or {}), dict(input_values or {})
    unknown = sorted((set(pinned) | set(values)) - set(runtime_names))
    if unknown:
        raise UnsupportedModelError(f"input_shapes / input_values name {unknown}, which are not inputs of the model "
                                    f"(inputs: {runtime_names})")
    consts = _Constants()
    for t in g.initializer:
        consts.protos[t.name] = t
    inputs = []
    for vi in runtime:
        declared = _shape_of(vi)
        if vi.name in values:
            elem = vi.type.tensor_type.elem_type
            try:
                dtype = helper.tensor_dtype_to_np_dtype(elem)
            except Exception:
                dtype = None
            value = np.asarray(values[vi.name], dtype=dtype)
            if _static(declared) and value.size == math.prod(declared):
                value = value.reshape(declared)  # a flat list (the command line's) for any declared shape
            if declared is not None and (len(declared) != value.ndim or any(
                    isinstance(d, int) and d > 0 and d != s for d, s in zip(declared, value.shape))):
                raise UnsupportedModelError(f"input_values[{vi.name!r}] has shape {value.shape}; the model declares "
                                            f"{_show(declared)}")
            consts[vi.name] = value
            continue
        if vi.name in pinned:
            shape = tuple(int(d) for d in pinned[vi.name])
            if declared is not None and (len(declared) != len(shape) or any(
                    isinstance(d, int) and d > 0 and d != s for d, s in zip(declared, shape))):
                raise UnsupportedModelError(f"input_shapes[{vi.name!r}] = {shape} does not fit the model's declared "
                                            f"shape {_show(declared)}")
            if min(shape, default=1) <= 0:
                raise UnsupportedModelError(f"input_shapes[{vi.name!r}] = {shape}: sizes must be positive")
            vi = helper.make_tensor_value_info(vi.name, vi.type.tensor_type.elem_type, list(shape))
        inputs.append(vi)
    nodes = list(g.node)
    outputs = list(g.output)
    for _ in range(MAX_ROUNDS):
        shapes = _infer(nodes, inputs, outputs, consts, opsets, proto.ir_version)
        kept, changed = [], False
        for node in nodes:
            outs = _fold_node(node, consts, shapes, opsets)
            if outs is not None and len(outs) >= len([o for o in node.output if o]):
                for name, v in zip(node.output, outs):
                    if name:
                        consts[name] = v
                changed = True
            else:
                kept.append(node)
        nodes = kept
        if not changed:
            break
    outputs = [_typed_output(vi, shapes.get(vi.name), consts) for vi in outputs]
    read = {i for n in nodes for i in n.input} | {o.name for o in outputs}
    if not copy:
        return FoldedModel(FoldedGraph(proto.graph.name, nodes, inputs, outputs,
                                       [consts.tensor(k) for k in consts.names() if k in read]),
                           list(proto.opset_import), proto.ir_version)
    out = onnx.ModelProto()  # field by field: a CopyFrom would copy every weight twice
    _copy_fields(proto, out, skip=("graph",))
    graph = out.graph
    _copy_fields(proto.graph, graph, skip=("node", "input", "initializer", "value_info", "output"))
    graph.node.extend(nodes)
    graph.input.extend(inputs)
    graph.output.extend(outputs)
    graph.initializer.extend(consts.tensor(k) for k in consts.names() if k in read)
    return out


def _copy_fields(src: Any, dst: Any, skip: Sequence[str]) -> None:
    for field, value in src.ListFields():
        if field.name in skip:
            continue
        repeated = getattr(field, "is_repeated", None)  # protobuf >= 5; `label` before
        if repeated if repeated is not None else field.label == field.LABEL_REPEATED:
            getattr(dst, field.name).extend(value)
        elif field.type == field.TYPE_MESSAGE:
            getattr(dst, field.name).CopyFrom(value)
        else:
            setattr(dst, field.name, value)


def _typed_output(vi: onnx.ValueInfoProto, inferred: tuple | None, consts: _Constants) -> onnx.ValueInfoProto:
    """The graph output with its inferred static shape (a declared symbolic batch dim would clash)."""
    if not vi.type.HasField("tensor_type"):
        return vi
    shape = consts.shape(vi.name) if vi.name in consts else inferred
    if shape is None:
        return vi  # nothing better known (onnx's checker wants a shape field: keep what was declared)
    return helper.make_tensor_value_info(vi.name, vi.type.tensor_type.elem_type, list(shape))


def _show(shape: Sequence[Any] | None) -> str:
    return "unknown" if shape is None else "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"
