"""Stage ①: an ONNX file becomes a canonical :class:`~felixjax.graph_passes.Graph`; stage ② fuses it
into a :class:`Model` whose anchors are tunable ``codegen.ops`` Tasks.

What is accepted: static shapes (after onnx shape inference; a dynamic dimension is an error unless
``input_shapes=`` pins it), default-domain opsets 6 and newer, float32 tensors, 2-D spatial convolution
and pooling, and the ops in :data:`SUPPORTED_OPS`. Every opset's attribute-vs-input variant (Clip bounds,
Pad pads, Reshape shape, ReduceMean axes, Dropout ratio, Softmax's pre-13 "flatten to 2-D" axis, legacy
``broadcast``/``axis`` on elementwise ops) is resolved here, once, into the canonical node forms listed in
``felixjax.graph_passes``. Anything else raises one :class:`~felixjax.errors.UnsupportedModelError` naming
the node, its op type and what is supported; unreadable bytes raise
:class:`~felixjax.errors.ModelFormatError`. Nothing half-imported is ever returned.

Example:
    >>> import numpy as np
    >>> from felixjax import zoo
    >>> model = load_onnx(zoo.make_model("resnet18", dataset="cifar10"))
    >>> len(model.tasks), sum(w for _, w in model.tasks)      # distinct tasks, anchor ops in the network
    (16, 21)
    >>> model.run_numpy(np.zeros((1, 3, 32, 32), np.float32)).shape
    (1, 10)
"""
from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from codegen.limits import check_buffers
from codegen.limits import override as size_limits
from codegen.ops import Task
from felixjax.errors import ModelFormatError, UnsupportedModelError
from felixjax.graph_passes import Graph, Node, evaluate, extract_tasks, optimize, run_graph
from felixjax.onnx_ops import ATTRS as _NEW_ATTRS
from felixjax.onnx_ops import IMPORTERS as _NEW_IMPORTERS
from felixjax.onnx_ops import OPS as _NEW_OPS
from felixjax.onnx_shapes import fix_hint, fold_model

MIN_OPSET = 6
SUPPORTED_OPS = (
    "Conv", "Gemm", "MatMul", "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Relu", "Clip", "Sigmoid", "Tanh",
    "Erf", "BatchNormalization", "LayerNormalization", "ReduceMean", "MaxPool", "AveragePool",
    "GlobalAveragePool", "Flatten", "Reshape", "Transpose", "Concat", "Softmax", "Pad", "Identity", "Dropout",
    "Constant", "ConstantOfShape",
) + _NEW_OPS

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
    **_NEW_ATTRS,
}


# ----------------------------------------------------------------------------------------------
# The user-facing record
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Model:
    """An imported network: the fused graph (anchors + cheap ops), the canonical graph as imported,
    and the tunable tasks.

    Example:
        >>> from felixjax import zoo
        >>> m = load_onnx(zoo.make_model("transformer_block", seq=64, dim=128, heads=2))
        >>> [t.name for t, w in m.tasks]
        ['matmul_64x128x128_bias', 'matmul_64x128x128_bias_res', 'matmul_64x512x128_bias', 'matmul_64x128x512_bias_res']
    """

    name: str
    graph: Graph    # after stage ②: what a whole-network build compiles
    source: Graph   # after stage ① only (canonical ops, nothing fused)
    opset: int

    @property
    def tasks(self) -> list[tuple[Task, int]]:
        """Distinct anchor Tasks with their occurrence counts (the task scheduler's weights)."""
        return extract_tasks(self.graph)

    @property
    def input_names(self) -> tuple[str, ...]:
        return self.graph.inputs

    @property
    def output_names(self) -> tuple[str, ...]:
        return self.graph.outputs

    @property
    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        return {i: self.graph.shapes[i] for i in self.graph.inputs}

    @property
    def output_shapes(self) -> dict[str, tuple[int, ...]]:
        return {o: self.graph.shapes[o] for o in self.graph.outputs}

    def summary(self) -> str:
        """The fused graph, one node per line."""
        return self.graph.summary()

    def run_numpy(self, inputs: Mapping[str, np.ndarray] | np.ndarray | Sequence[np.ndarray], *,
                  fused: bool = True) -> np.ndarray | list[np.ndarray]:
        """Run the network in numpy: anchors through ``Task.reference``, cheap ops in numpy.

        ``inputs`` is a dict by input name, one array (single-input models) or a sequence in input order.
        Returns the output array, or a list in output order when the model has several outputs.
        ``fused=False`` runs the imported graph before stage ② (to check the passes).

        Example:
            >>> import numpy as np
            >>> from felixjax import zoo
            >>> m = load_onnx(zoo.make_model("vgg16", dataset="cifar10"))
            >>> m.run_numpy({"input": np.zeros((1, 3, 32, 32), np.float32)}).shape
            (1, 10)
        """
        graph = self.graph if fused else self.source
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        if not isinstance(inputs, Mapping):
            inputs = list(inputs)
            if len(inputs) != len(graph.inputs):
                raise ValueError(f"{self.name} takes {len(graph.inputs)} inputs {list(graph.inputs)}, got {len(inputs)}")
            inputs = dict(zip(graph.inputs, inputs))
        unknown = set(inputs) - set(graph.inputs)
        if unknown:
            raise ValueError(f"unknown inputs {sorted(unknown)}; {self.name} takes {list(graph.inputs)}")
        feeds = {}
        for name in graph.inputs:
            if name not in inputs:
                raise ValueError(f"missing input {name!r}; {self.name} takes {list(graph.inputs)}")
            arr = np.asarray(inputs[name], dtype=np.float32)
            if arr.shape != graph.shapes[name]:
                raise ValueError(f"input {name!r} has shape {arr.shape}, the model expects {graph.shapes[name]}")
            feeds[name] = arr
        out = run_graph(graph, feeds)
        outs = [out[o] for o in graph.outputs]
        return outs[0] if len(outs) == 1 else outs


def load_onnx(model: str | os.PathLike | bytes | onnx.ModelProto, *,
              input_shapes: Mapping[str, Sequence[int]] | None = None, limits: Any = None,
              input_values: Mapping[str, Any] | None = None) -> Model:
    """Import an ONNX model (path, bytes or ModelProto), run the graph passes, extract the tasks.

    ``input_shapes`` pins the dimensions of inputs declared with dynamic (symbolic) sizes; once pinned,
    shape subgraphs (``Shape -> Gather -> Concat -> Reshape`` ...) fold to constants
    (:mod:`felixjax.onnx_shapes`). ``input_values`` turns inputs into constants: the way to pass a
    non-float input such as an int64 image-size tensor. ``limits``
    (a dict such as ``{"max_buffer_bytes": 2**34}``) changes the size limits of ``codegen.limits``.

    Raises:
        ModelFormatError: the bytes are not a readable ONNX model.
        UnsupportedModelError: an op, attribute, dtype or dynamic shape felixjax does not support.
        codegen.limits.SizeLimitError: a tensor or a task is larger than the size limits.

    Example:
        >>> from felixjax import zoo
        >>> m = load_onnx(zoo.make_model("mobilenet_v2", dataset="cifar10"))
        >>> m.tasks[0][0].name, m.input_shapes
        ('conv2d_1x3x32x32_k32_3x3_s1_p1_bias_relu6', {'input': (1, 3, 32, 32)})
    """
    with size_limits(limits):
        proto, name = _read(model)
        source, opset = import_graph(proto, input_shapes=input_shapes, input_values=input_values)
        return Model(name=name, graph=optimize(source), source=source, opset=opset)


# ----------------------------------------------------------------------------------------------
# Reading and validating the protobuf
# ----------------------------------------------------------------------------------------------

def _read(model: Any) -> tuple[onnx.ModelProto, str]:
    if isinstance(model, onnx.ModelProto):
        proto, src, name = model, "<ModelProto>", model.graph.name or "model"
    elif isinstance(model, (bytes, bytearray, memoryview)):
        proto, src = _parse(bytes(model), "<bytes>"), "<bytes>"
        name = proto.graph.name or "model"
    elif isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise ModelFormatError(f"{path}: no such file")
        proto, src, name = _parse(path.read_bytes(), str(path)), str(path), path.stem
        if any(t.data_location == TensorProto.EXTERNAL for t in proto.graph.initializer):
            try:
                onnx.external_data_helper.load_external_data_for_model(proto, str(path.parent))
            except Exception as e:  # missing or short external data file
                raise ModelFormatError(f"{path}: cannot load external tensor data ({e})") from None
    else:
        raise TypeError(f"load_onnx takes a path, bytes or onnx.ModelProto, got {type(model).__name__}")
    if not proto.HasField("graph") or not proto.graph.node and not proto.graph.output:
        raise ModelFormatError(f"{src}: not an ONNX model (no graph)")
    if proto.ir_version < 3 or not any(o.domain in ("", "ai.onnx") for o in proto.opset_import):
        raise ModelFormatError(f"{src}: not a complete ONNX model (ir_version {proto.ir_version}, "
                               f"no default-domain opset_import; truncated?)")
    for t in proto.graph.initializer:
        if t.data_location == TensorProto.EXTERNAL:
            raise ModelFormatError(f"{src}: initializer {t.name!r} is stored in external data that was not loaded; "
                                   f"pass the .onnx path so its data files can be found")
    return proto, name


def _parse(data: bytes, src: str) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as e:  # google.protobuf DecodeError and friends
        raise ModelFormatError(f"{src}: not a valid ONNX file (protobuf parse failed: {e})") from None
    return proto


def _opset(proto: onnx.ModelProto) -> int:
    version = max(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    if version < MIN_OPSET:
        raise UnsupportedModelError(f"model opset {version} is older than the oldest supported ({MIN_OPSET})")
    if version > onnx.defs.onnx_opset_version():
        raise UnsupportedModelError(f"model opset {version} is newer than this onnx package knows "
                                    f"({onnx.defs.onnx_opset_version()})")
    return version


def _check_ops(graph: onnx.GraphProto) -> None:
    bad = [n for n in graph.node if n.domain not in ("", "ai.onnx") or n.op_type not in SUPPORTED_OPS]
    if bad:
        n = bad[0]
        name = n.name or f"{n.op_type}_{list(graph.node).index(n)}"
        op = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
        more = f" (and {len(bad) - 1} more unsupported nodes: {', '.join(sorted({b.op_type for b in bad[1:]}))})" \
            if len(bad) > 1 else ""
        raise UnsupportedModelError(f"node {name!r} (op {op}) is not supported{more}; supported ops: "
                                    f"{', '.join(SUPPORTED_OPS)}")


def _infer_types(proto: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]] | None
                 ) -> dict[str, tuple[int, tuple[int | str | None, ...] | None]]:
    """Run the onnx checker and shape inference on a copy without large weights; returns
    ``{value name: (elem_type, shape)}`` where a dim is an int, a symbol, or None (unknown)."""
    g = proto.graph
    inits = {t.name: t for t in g.initializer}
    light = onnx.GraphProto(name=g.name or "graph")
    light.node.extend(g.node)
    light.output.extend(g.output)
    pinned = dict(input_shapes or {})
    for vi in g.input:
        if vi.name in inits:
            continue
        vi2 = onnx.ValueInfoProto()
        vi2.CopyFrom(vi)
        if vi.name in pinned:
            shape = [int(d) for d in pinned.pop(vi.name)]
            vi2 = helper.make_tensor_value_info(vi.name, vi.type.tensor_type.elem_type, shape)
        light.input.append(vi2)
    if pinned:
        raise UnsupportedModelError(f"input_shapes names {sorted(pinned)}, which are not inputs of the model "
                                    f"(inputs: {[v.name for v in g.input if v.name not in inits]})")
    for t in g.initializer:
        if t.data_type in (TensorProto.INT64, TensorProto.INT32) or math.prod(t.dims) <= 64:
            light.initializer.append(t)  # small: their values may feed shape computations
        else:
            light.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    model = helper.make_model(light, opset_imports=proto.opset_import, ir_version=max(proto.ir_version, 4))
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        raise ModelFormatError(f"invalid ONNX model: {str(e).strip().splitlines()[0]}") from None
    try:
        model = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    except Exception as e:  # onnx.shape_inference.InferenceError
        raise ModelFormatError(f"ONNX shape inference failed: {str(e).strip().splitlines()[0]}") from None
    types: dict[str, tuple[int, tuple | None]] = {}
    for vi in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            types[vi.name] = (-1, None)  # sequence / optional / map: refused where used
            continue
        shape = None
        if tt.HasField("shape"):
            shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
        types.setdefault(vi.name, (tt.elem_type, shape))
    for t in g.initializer:
        types[t.name] = (t.data_type, tuple(t.dims))
    return types


# ----------------------------------------------------------------------------------------------
# Stage ①: canonical graph
# ----------------------------------------------------------------------------------------------

def import_graph(proto: onnx.ModelProto, *, input_shapes: Mapping[str, Sequence[int]] | None = None,
                 input_values: Mapping[str, Any] | None = None) -> tuple[Graph, int]:
    """Stage ① alone: the canonical, constant-folded graph of ``proto`` and its default-domain opset.

    Example:
        >>> from felixjax import zoo
        >>> g, opset = import_graph(zoo.make_model("resnet18", dataset="cifar10"))
        >>> g.nodes[0].op, g.nodes[1].op, opset
        ('Conv', 'BatchNormalization', 13)
    """
    opset = _opset(proto)
    _check_inputs(proto, input_shapes, input_values)
    try:
        proto = fold_model(proto, input_shapes=input_shapes, input_values=input_values)
    except (UnsupportedModelError, ModelFormatError):
        raise
    except Exception as e:  # a malformed graph the folder cannot read
        raise ModelFormatError(f"cannot fold the model's constants: {type(e).__name__}: {e}") from None
    graph = proto.graph
    _check_ops(graph)
    types = _infer_types(proto, None)
    inits = {t.name for t in graph.initializer}
    consts: dict[str, np.ndarray] = {}
    for t in graph.initializer:
        try:
            consts[t.name] = numpy_helper.to_array(t)
        except Exception as e:
            raise ModelFormatError(f"initializer {t.name!r} is corrupt ({e})") from None
        if consts[t.name].dtype.kind in "fc" and not np.isfinite(consts[t.name]).all():
            bad = consts[t.name].size - int(np.isfinite(consts[t.name]).sum())
            raise UnsupportedModelError(f"initializer {t.name!r} holds {bad} NaN/Inf value(s); felixjax refuses "
                                        f"non-finite weights (their outputs would be NaN/Inf)")

    inputs = tuple(vi.name for vi in graph.input if vi.name not in inits)
    shapes: dict[str, tuple[int, ...]] = {}
    for name in inputs:
        elem, shape = types[name]
        if elem != TensorProto.FLOAT:
            raise UnsupportedModelError(f"input {name!r} has dtype {_dtype_name(elem)}; felixjax supports float32 "
                                        f"tensors only (pin a non-float input to a value with "
                                        f"load_onnx(..., input_values={{{name!r}: ...}}))")
        if shape is None or any(not isinstance(d, int) for d in shape):
            raise UnsupportedModelError(f"input {name!r} has a dynamic shape {_show_shape(shape)}; felixjax needs "
                                        f"static shapes: {fix_hint(name, shape)}")
        if 0 in shape:
            raise UnsupportedModelError(f"input {name!r} has a zero-sized dimension {shape}; empty tensors are not "
                                        f"supported")
        _check_size("model input", name, shape)
        shapes[name] = shape

    nodes: list[Node] = []
    taken = set(types) | set(consts) | {o for n in graph.node for o in n.output}
    read = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    for index, onode in enumerate(graph.node):
        ctx = _Ctx(onode, index, opset, consts, types, shapes, taken, read)
        for o in ctx.outputs:  # inferred sizes, before the importer or folding allocates anything
            if o and (s := ctx.static_shape(o)) is not None:
                _check_size(f"node {ctx.name!r} (op {ctx.op})", o, s)
        for node in _IMPORTERS[onode.op_type](ctx):
            if all(i == "" or i in consts for i in node.inputs):  # fold now: later parameters may need it
                outs = evaluate(node, [consts[i] if i else None for i in node.inputs],
                                [ctx.static_shape(o) for o in node.outputs])
                consts.update((o, v) for o, v in zip(node.outputs, outs) if o)
                continue
            for o in node.outputs:
                if o:
                    shapes[o] = ctx.out_shape(o)
                    if types.get(o, (TensorProto.FLOAT,))[0] != TensorProto.FLOAT:
                        ctx.fail(f"output {o!r} has dtype {_dtype_name(types[o][0])}; felixjax supports float32 "
                                 f"tensors only")
            for i in node.inputs:
                if i in consts and consts[i].dtype != np.float32:
                    ctx.fail(f"input {i!r} is a {consts[i].dtype} constant; felixjax supports float32 tensors only")
            nodes.append(node)

    used = {i for n in nodes for i in n.inputs if i} | {o.name for o in graph.output}
    constants = {k: v for k, v in consts.items() if k in used}
    for k, v in constants.items():
        shapes[k] = tuple(v.shape)
    for out in graph.output:
        if out.name in constants and constants[out.name].dtype != np.float32:
            raise UnsupportedModelError(f"output {out.name!r} is a {constants[out.name].dtype} constant; felixjax "
                                        f"supports float32 tensors only")
        if out.name not in shapes:
            raise UnsupportedModelError(f"output {out.name!r} is not produced by any node")
    return Graph(tuple(nodes), inputs, tuple(o.name for o in graph.output), shapes, constants), opset


def _check_size(what: str, value: str, shape: Sequence[int]) -> None:
    """Refuse a value whose shape is negative (ModelFormatError) or too large for ``codegen.limits``
    (SizeLimitError: the value, its size, the limit and how to raise it), before anything allocates it."""
    if any(d < 0 for d in shape):
        raise ModelFormatError(f"{what}: {value!r} has a negative dimension {tuple(shape)}")
    check_buffers([(f"{value!r}", shape)], what=what)


def _check_inputs(proto: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]] | None,
                  input_values: Mapping[str, Any] | None) -> None:
    """Refuse, before any work, an input that is dynamic and not pinned or not float and not given a value."""
    inits = {t.name for t in proto.graph.initializer}
    pinned, values = set(input_shapes or ()), set(input_values or ())
    for vi in proto.graph.input:
        if vi.name in inits or vi.name in values or not vi.type.HasField("tensor_type"):
            continue
        tt = vi.type.tensor_type
        if tt.elem_type != TensorProto.FLOAT:
            raise UnsupportedModelError(
                f"input {vi.name!r} has dtype {_dtype_name(tt.elem_type)}; felixjax runs float32 tensors only: pin "
                f"this input to a value with load_onnx(..., input_values={{{vi.name!r}: ...}})")
        if vi.name in pinned:
            continue
        shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim) \
            if tt.HasField("shape") else None
        if shape is None or any(not isinstance(d, int) for d in shape):
            raise UnsupportedModelError(f"input {vi.name!r} has a dynamic shape {_show_shape(shape)}; felixjax needs "
                                        f"static shapes: {fix_hint(vi.name, shape)}")


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
                 taken: set[str], used: set[str]) -> None:
        self.onode, self.opset, self.consts, self.types, self.shapes, self.taken, self.used = (
            onode, opset, consts, types, shapes, taken, used)
        self.op = onode.op_type
        self.name = onode.name or f"{onode.op_type}_{index}"
        self.attrs = {a.name: helper.get_attribute_value(a) for a in onode.attribute}
        self.attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in self.attrs.items()}
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
    attrs = {"kernel": kernel, "strides": strides, "dilations": dilations, "groups": int(ctx.attrs.get("group", 1)),
             "pads": ctx.spatial_pads(xs[2:], kernel, strides, dilations)}
    return [_node(ctx, "Conv", [x, w] + ([b] if b else []), attrs)]


def _gemm(ctx: _Ctx) -> list[Node]:
    a, b, c = ctx.input(0), ctx.input(1), ctx.input(2)
    if len(ctx.shape(a)) != 2 or len(ctx.shape(b)) != 2:
        ctx.fail("A and B must be 2-D matrices")
    attrs = {"alpha": float(ctx.attrs.get("alpha", 1.0)), "beta": float(ctx.attrs.get("beta", 1.0)),
             "trans_a": int(ctx.attrs.get("transA", 0)), "trans_b": int(ctx.attrs.get("transB", 0))}
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
    if rank != 4:
        ctx.fail(f"only 2-D pooling (4-D NCHW input) is supported; the input is {rank}-D")
    return [_node(ctx, "ReduceMean", ctx.inputs[:1], {"axes": (2, 3), "keepdims": 1})]


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
}
