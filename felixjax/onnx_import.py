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
import numbers
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from codegen.limits import SizeLimitError, check_buffers
from codegen.limits import override as size_limits
from codegen.ops import Task
from felixjax.errors import ModelFormatError, UnsupportedModelError
from felixjax.fake_quant import fake_quant_run, precision_of
from felixjax.graph_passes import Graph, Node, evaluate, extract_tasks, optimize, run_graph
from felixjax.layout import check_layout, resolve as resolve_layout
from felixjax.onnx_einsum import check_model_equations
from felixjax.onnx_functions import expand_schema_functions, inline_local_functions
from felixjax.onnx_importers import _IMPORTERS, SUPPORTED_OPS, _Ctx, _dtype_name, _show_shape, node_names
from felixjax.onnx_shapes import ceil_pool_pads, data_prop_safe, fix_hint, fold_model, gather_nd_shapes

MIN_OPSET = 6
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

    def run_numpy(self, inputs: Mapping[str, np.ndarray] | np.ndarray | Sequence[np.ndarray] = (), *,
                  fused: bool = True) -> np.ndarray | list[np.ndarray]:
        """Run the network in numpy: anchors through ``Task.reference``, cheap ops in numpy; an int8 or
        float16 layer (:func:`felixjax.quantize.with_precisions`) as the C build computes it
        (:func:`felixjax.fake_quant.fake_quant_run`).

        ``inputs`` is a dict by input name, one array (single-input models) or a sequence in input order
        (none for a model whose inputs are all pinned values).
        Returns the output array, or a list in output order when the model has several outputs.
        ``fused=False`` runs the imported graph before stage ② (to check the passes; float32 throughout,
        whatever precisions ``with_precisions`` gave the fused graph's layers).

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
        lowp = any(n.is_anchor and precision_of(n.task) != "float32" for n in graph.nodes)
        out = (fake_quant_run if lowp else run_graph)(graph, feeds)
        outs = [out[o] for o in graph.outputs]
        return outs[0] if len(outs) == 1 else outs


def load_onnx(model: str | os.PathLike | bytes | onnx.ModelProto, *,
              input_shapes: Mapping[str, Sequence[int]] | None = None, limits: Any = None,
              input_values: Mapping[str, Any] | None = None, layout: str | Mapping[str, str] = "nchw") -> Model:
    """Import an ONNX model (path, bytes or ModelProto), run the graph passes, extract the tasks.

    ``input_shapes`` pins the dimensions of inputs declared with dynamic (symbolic) sizes; once pinned,
    shape subgraphs (``Shape -> Gather -> Concat -> Reshape`` ...) fold to constants
    (:mod:`felixjax.onnx_shapes`). ``input_values`` turns inputs into constants: the way to pass a
    non-float input such as an int64 image-size tensor. ``limits``
    (a dict such as ``{"max_buffer_bytes": 2**34}``) changes the size limits of ``codegen.limits``.
    ``layout="nchwc"`` runs the convolutions in the channel-blocked NCHW8c layout from one conv to the
    next (:func:`felixjax.layout.block_channels`; their tasks are then ``conv2d_nchwc``); the model's
    inputs and outputs keep their layouts. A mapping ``{conv node name: "nchw" | "nchwc"}`` mixes them:
    the named ``"nchw"`` convs stay NCHW, the others are blocked (:func:`felixjax.layout.resolve`; what
    :func:`felixjax.choose_layout` returns when converting conv by conv measured fastest).

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
    check_layout(layout)  # before the import: None or a list failed after it, in the mapping's check
    with size_limits(limits):
        proto, name = _read(model)
        try:
            proto = inline_local_functions(proto)  # jax2onnx / onnxscript write model-local functions
            source, opset = import_graph(proto, input_shapes=input_shapes, input_values=input_values)
            graph = optimize(source)
            _finite_layer_weights(graph, proto)
        except (UnsupportedModelError, SizeLimitError):
            raise
        except Exception as e:  # last resort (tests/test_fuzz_onnx.py counts these as failures to fix)
            detail = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
            raise ModelFormatError(f"{name}: cannot import this model, it is malformed in a way felixjax does not "
                                   f"check yet ({type(e).__name__}: {detail}); please report it") from e
        return Model(name=name, graph=resolve_layout(graph, layout), source=source, opset=opset)


def _finite_layer_weights(graph: Graph, proto: onnx.ModelProto) -> None:
    """Refuse NaN / Inf in the constant inputs of the tuned layers (conv, dense, matmul: weights, bias): their
    kernels would pack and multiply them. Other constants may hold them (a causal mask of -inf before a
    Softmax, as onnxruntime runs it)."""
    for node in graph.anchors:
        for name in node.inputs:
            a = graph.constants.get(name)
            if a is not None and a.dtype.kind in "fc" and not np.isfinite(a).all():
                bad = a.size - int(np.isfinite(a).sum())
                sources = [t.name for t in proto.graph.initializer if t.data_type in
                           (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16)
                           and not np.isfinite(numpy_helper.to_array(t)).all()]
                where = f" (the model's initializer(s) with NaN/Inf: {', '.join(map(repr, sources))})" if sources else ""
                raise UnsupportedModelError(f"layer {node.name!r} ({node.task.name}): its constant {name!r} holds "
                                            f"{bad} NaN/Inf value(s){where}; felixjax refuses non-finite weights of "
                                            f"conv, dense and matmul layers (their outputs would be NaN/Inf)")


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
    _check_strings(proto, src)
    return proto, name


def _check_strings(message: Any, src: str) -> None:
    """Refuse names and other text fields that are not valid UTF-8 (protobuf hands them over as bytes,
    which would break every later step with a TypeError)."""
    from google.protobuf.descriptor import FieldDescriptor

    for field, value in message.ListFields():
        if field.type == FieldDescriptor.TYPE_STRING:
            values = value if _repeated(field) else [value]
            bad = next((v for v in values if not isinstance(v, str)), None)
            if bad is not None:
                raise ModelFormatError(f"{src}: a {message.DESCRIPTOR.name}.{field.name} is not valid UTF-8 "
                                       f"({bytes(bad)[:40]!r}); the file is corrupt")
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if _repeated(field):
                if field.message_type.name in ("TensorProto",) and field.name == "initializer":
                    for t in value:  # only the text fields of weights (never walk their data)
                        _check_strings_shallow(t, src)
                    continue
                for v in value:
                    _check_strings(v, src)
            else:
                _check_strings(value, src)


def _repeated(field: Any) -> bool:
    rep = getattr(field, "is_repeated", None)  # protobuf >= 5; `label` before
    return bool(rep) if rep is not None else field.label == field.LABEL_REPEATED


def _check_strings_shallow(tensor: Any, src: str) -> None:
    for name in ("name", "doc_string"):
        if not isinstance(getattr(tensor, name), str):
            raise ModelFormatError(f"{src}: an initializer's {name} is not valid UTF-8; the file is corrupt")


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

        def shown(text: str) -> str:  # a model's strings never drive the terminal (escape sequences)
            return text if text.isprintable() else repr(text)

        others = sorted({shown(b.op_type if b.domain in ("", "ai.onnx") else f"{b.domain}.{b.op_type}")
                         for b in bad[1:]})
        more = f" (and {len(bad) - 1} more unsupported nodes: {', '.join(others)})" if len(bad) > 1 else ""
        op = shown(op)
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
    except (onnx.checker.ValidationError, UnicodeDecodeError) as e:
        message = str(e).strip().splitlines()[0]
        # an output declared without a shape makes the checker say only this whatever else is wrong (and
        # onnxruntime runs such a model): shape inference below names the real problem, if there is one. A
        # deprecated op (GroupNormalization-18, Upsample after opset 9) runs as onnxruntime runs it.
        if "Field 'shape' of 'type' is required but missing" not in message and \
                not re.search(r"Op registered for \w+ is deprecated in domain_version", message):
            raise ModelFormatError(f"invalid ONNX model: {message}") from None
    for vi in model.graph.output:  # an output typed without a shape stops inference for every node (a graph
        if vi.type.HasField("tensor_type") and not vi.type.tensor_type.HasField("shape"):  # input as an output)
            vi.ClearField("type")
    for _ in range(len(light.node) + 1):  # once, or again per ceil_mode pool whose extra window shape inference kept
        try:
            inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True,
                                                         data_prop=data_prop_safe(model.graph))
        except Exception as e:  # onnx.shape_inference.InferenceError
            raise ModelFormatError(f"ONNX shape inference failed: {str(e).strip().splitlines()[0]}") from None
        fixes = ceil_pool_pads(inferred)
        if not fixes:
            if not (found := gather_nd_shapes(inferred)):
                break
            model.graph.value_info.extend(found)
            continue
        for i, pads in fixes.items():  # shapes only: the node run keeps its own attributes (op_table's pools)
            node = model.graph.node[i]
            kept = [at for at in node.attribute if at.name not in ("ceil_mode", "pads")]
            del node.attribute[:]
            node.attribute.extend(kept + [helper.make_attribute("ceil_mode", 0), helper.make_attribute("pads", pads)])
        del model.graph.value_info[:]  # shapes declared after such a pool (an exporter's own inference) follow it
        for vi in model.graph.output:
            vi.type.tensor_type.ClearField("shape")
    model = inferred
    types: dict[str, tuple[int, tuple | None]] = {}
    for vi in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            types.setdefault(vi.name, (-1, None))  # sequence / optional / map: refused where used
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
    check_model_equations(proto.graph.node)  # before ONNX's shape inference, which can hang on them
    proto = expand_schema_functions(proto, opset)  # Attention as the spec's own function body
    try:
        proto = fold_model(proto, input_shapes=input_shapes, input_values=input_values, copy=False)
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
    for index, (onode, name) in enumerate(zip(graph.node, node_names(list(graph.node)))):
        ctx = _Ctx(onode, index, opset, consts, types, shapes, taken, read, name)
        for o in ctx.outputs:  # inferred sizes, before the importer or folding allocates anything
            if o and (s := ctx.static_shape(o)) is not None and not (ctx.op == "Conv" and min(s, default=0) < 0):
                _check_size(f"node {ctx.name!r} (op {ctx.op})", o, s)  # (a Conv's importer says why it is empty)
        for node in _IMPORTERS[onode.op_type](ctx):
            _check_node_shapes(ctx, node)
            if all(i == "" or i in consts for i in node.inputs):  # fold now: later parameters may need it
                try:
                    outs = evaluate(node, [consts[i] if i else None for i in node.inputs],
                                    [ctx.static_shape(o) for o in node.outputs])
                except (ValueError, IndexError, TypeError, ZeroDivisionError, OverflowError) as e:
                    ctx.fail(f"cannot be evaluated on its constant inputs ({type(e).__name__}: "
                             f"{str(e).strip()[:200]})")
                consts.update((o, v) for o, v in zip(node.outputs, outs) if o)
                continue
            if node.op in _MASK_MOVES and any(types.get(o, (0,))[0] == TensorProto.BOOL for o in node.outputs if o):
                node = _float_bool_constants(node, consts)
            for o in node.outputs:
                if o:
                    shapes[o] = ctx.out_shape(o)
                    if types.get(o, (0,))[0] == TensorProto.BOOL and node.op in _MASK_MOVES:  # a mask moved (its
                        types[o] = (TensorProto.FLOAT, types[o][1])  # data inputs are float 0 / 1: onnx_logic)
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


def _known_shape(ctx: "_Ctx", value: str) -> tuple[int, ...] | None:
    if not value:
        return None
    if value in ctx.consts:
        return tuple(ctx.consts[value].shape)
    return ctx.shapes.get(value)


#: canonical ops that only move or select values: a bool (mask) output of these holds 0 / 1 floats as its inputs do
_MASK_MOVES = frozenset({"Reshape", "Transpose", "Concat", "Slice", "Gather", "Expand", "Identity", "Pad", "Where"})


def _float_bool_constants(node: Node, consts: dict[str, np.ndarray]) -> Node:
    """A mask moved with bool constants (a Concat of a mask and a constant one): the constants as 0 / 1 floats."""
    inputs = list(node.inputs)
    for k, i in enumerate(inputs):
        if i in consts and consts[i].dtype == bool:
            inputs[k] = f"{i}/as_float"
            consts.setdefault(inputs[k], consts[i].astype(np.float32))
    return Node(node.op, tuple(inputs), node.outputs, node.attrs, node.name) if inputs != list(node.inputs) else node


def _check_node_shapes(ctx: "_Ctx", node: Node) -> None:
    """Parameter shapes and attribute values that onnx's checker and shape inference let through (Conv
    groups, weights and bias; pool and conv windows; BatchNormalization / LayerNormalization parameters;
    Gemm's operands; Clip bounds; broadcasting of elementwise ops): one clear error at import instead of
    a numpy error when the model runs."""
    op, a = node.op, node.attrs
    s = [_known_shape(ctx, i) for i in node.inputs]
    s += [None] * (3 - len(s))

    def positive(key: str) -> None:
        if key in a and min((int(v) for v in a[key]), default=1) < 1:
            ctx.fail(f"{key}={list(a[key])} must be positive")

    if op in ("Conv", "MaxPool", "AveragePool"):
        for key in ("kernel", "strides", "dilations"):
            positive(key)
    if "keepdims" in a and int(a["keepdims"]) not in (0, 1):
        ctx.fail(f"keepdims={a['keepdims']} must be 0 or 1")
    if op == "ScaleShift" and s[0] is not None and len(s[0]) >= 2:
        for p in (s[1], s[2]):
            if p is not None and math.prod(p) != s[0][1]:
                ctx.fail(f"scale / bias of shape {p} do not have one value per channel ({s[0][1]})")
    if op == "Conv" and s[0] is not None and s[1] is not None:
        x, w, g = s[0], s[1], int(a["groups"])
        if len(w) != 4:
            ctx.fail(f"the weights have shape {w}; 2-D convolution needs 4-D OIHW weights")
        if g < 1 or x[1] != w[1] * g or w[0] % g:
            ctx.fail(f"weights {w} with group={g} do not fit an input of {x[1]} channels (needs channels = "
                     f"W[1] * group and W[0] divisible by group)")
        if s[2] is not None and tuple(s[2]) != (w[0],):
            ctx.fail(f"the bias has shape {s[2]}; expected ({w[0]},)")
    elif op == "Gemm" and s[0] is not None and s[1] is not None:
        am = s[0][::-1] if a["trans_a"] else s[0]
        bm = s[1][::-1] if a["trans_b"] else s[1]
        if len(am) != 2 or len(bm) != 2 or am[1] != bm[0]:
            ctx.fail(f"A {s[0]} and B {s[1]} (transA={a['trans_a']}, transB={a['trans_b']}) cannot be multiplied")
        if s[2] is not None and not _broadcasts_to(s[2], (am[0], bm[1])):
            ctx.fail(f"C has shape {s[2]}, which does not broadcast to the output {(am[0], bm[1])}")
    elif op == "BatchNormalization" and s[0] is not None:
        for k, p in enumerate(_known_shape(ctx, i) for i in node.inputs[1:5]):
            if p is not None and tuple(p) != (s[0][1],):
                ctx.fail(f"parameter {k + 1} has shape {p}; expected ({s[0][1]},) (one per channel)")
    elif op == "LayerNormalization" and s[0] is not None:
        norm = tuple(s[0][int(a["axis"]):])
        for p in (s[1], s[2]):
            if p is not None and not _broadcasts_to(p, norm):
                ctx.fail(f"scale / bias of shape {p} do not broadcast to the normalized shape {norm}")
    elif op == "Clip":
        for p in (s[1], s[2]):
            if p is not None and math.prod(p) != 1:
                ctx.fail(f"min / max must be scalars, got a tensor of shape {p}")
    elif op == "Pad" and s[1] is not None and math.prod(s[1]) != 1:
        ctx.fail(f"the constant pad value must be a scalar, got a tensor of shape {s[1]}")
    elif op in ("Add", "Sub", "Mul", "Div", "Pow") and s[0] is not None and s[1] is not None:
        try:
            np.broadcast_shapes(s[0], s[1])
        except ValueError:
            ctx.fail(f"operands of shapes {s[0]} and {s[1]} do not broadcast")


def _broadcasts_to(shape: Sequence[int], target: Sequence[int]) -> bool:
    try:
        return np.broadcast_shapes(tuple(shape), tuple(target)) == tuple(target)
    except ValueError:
        return False


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
    for name, given in (input_shapes or {}).items():  # 1.5 was truncated to 1
        if isinstance(given, (str, bytes)) or any(isinstance(d, (bool, np.bool_)) or not isinstance(d, numbers.Real)
                                                  or not float(d).is_integer() for d in given):
            raise UnsupportedModelError(f"input_shapes[{name!r}] = {given!r}: dimensions are whole numbers")
    runtime = [vi.name for vi in proto.graph.input if vi.name not in inits]
    unknown = sorted((pinned | values) - set(runtime))
    if unknown:
        raise UnsupportedModelError(f"input_shapes / input_values name {unknown}, which are not inputs of the model "
                                    f"(inputs: {runtime})")
    for vi in proto.graph.input:
        if vi.name in inits or vi.name in values or not vi.type.HasField("tensor_type"):
            continue
        tt = vi.type.tensor_type
        if tt.elem_type != TensorProto.FLOAT:
            floating = tt.elem_type in (TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16)
            raise UnsupportedModelError(
                f"input {vi.name!r} has dtype {_dtype_name(tt.elem_type)}; felixjax runs float32 tensors only: "
                + ("export the model in float32 (its data input and weights; felixjax's own low precision is "
                   "fj.approximate / float16 and int8 tasks)" if floating else
                   f"pin this input to a value with load_onnx(..., input_values={{{vi.name!r}: ...}}) or --input-value "
                   f"{vi.name}=V1,V2,... (shape and index inputs)"))
        if vi.name in pinned:
            continue
        shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim) \
            if tt.HasField("shape") else None
        if shape is None or any(not isinstance(d, int) for d in shape):
            raise UnsupportedModelError(f"input {vi.name!r} has a dynamic shape {_show_shape(shape)}; felixjax needs "
                                        f"static shapes: {fix_hint(vi.name, shape)}")
