"""Model-local ONNX functions (``ModelProto.functions``, IR 8+) inlined before import: a node whose
``(domain, op_type, overload)`` names a function of the model is replaced by the function's body, its
formal inputs / outputs renamed to the node's, its intermediates given names of their own, its attribute
references (``ref_attr_name``) bound to the node's attributes or the function's defaults. jax2onnx's
``@onnx_function`` modules and onnxscript's local ``@script`` functions write them; onnxruntime runs such
models, and ``onnx.inliner.inline_local_functions`` leaves jax2onnx's in place (session 79, a review of
other exporters: felixjax refused both as unknown ops).

Example:
    >>> from onnx import TensorProto, helper
    >>> f = helper.make_function("local", "Twice", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])],
    ...                          [helper.make_opsetid("", 18)])
    >>> g = helper.make_graph([helper.make_node("Twice", ["x"], ["y"], domain="local")], "g",
    ...                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
    ...                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    >>> m = helper.make_model(g, functions=[f],
    ...                       opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("local", 1)])
    >>> [(n.op_type, list(n.input), list(n.output)) for n in inline_local_functions(m).graph.node]
    [('Add', ['x', 'x'], ['y'])]
"""
from __future__ import annotations

from typing import Any

import onnx

from felixjax.errors import ModelFormatError, UnsupportedModelError
from felixjax.onnx_shapes import FoldedGraph, FoldedModel

MAX_DEPTH = 32  # functions calling functions: deeper than this is taken as recursion


def _key(domain: str, name: str, overload: str = "") -> tuple[str, str, str]:
    return ("" if domain == "ai.onnx" else domain, name, overload)


def inline_local_functions(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with every call of a model-local function replaced by its body (itself when it has none).

    Raises:
        UnsupportedModelError: a function calls itself (deeper than :data:`MAX_DEPTH`), or imports the
            default ONNX domain at another version than the model (its ops would change meaning).
    """
    if not proto.functions:
        return proto
    funcs = {_key(f.domain, f.name, getattr(f, "overload", "")): f for f in proto.functions}
    model_opset = {o.domain or "": o.version for o in proto.opset_import}
    default = model_opset.get("", model_opset.get("ai.onnx"))
    for f in proto.functions:
        for o in f.opset_import:
            if o.domain in ("", "ai.onnx") and default is not None and o.version != default:
                raise UnsupportedModelError(f"model-local function {f.domain}.{f.name} imports ONNX opset "
                                            f"{o.version}, the model {default}: felixjax inlines functions of the "
                                            f"model's opset only")
    fresh = _Fresh(proto.graph)

    def expand(nodes, depth: int) -> list[onnx.NodeProto]:
        out = []
        for node in nodes:
            f = funcs.get(_key(node.domain, node.op_type, getattr(node, "overload", "")))
            if f is None:
                out.append(node)
                continue
            if depth >= MAX_DEPTH:
                raise UnsupportedModelError(f"model-local function {f.domain}.{f.name} calls functions more than "
                                            f"{MAX_DEPTH} deep (recursion?)")
            out.extend(expand(_body(f, node, fresh(node.name or f.name)), depth + 1))
        return out

    inlined = onnx.ModelProto()
    inlined.CopyFrom(proto)
    del inlined.graph.node[:]
    inlined.graph.node.extend(expand(proto.graph.node, 0))
    del inlined.functions[:]
    return inlined


class _Fresh:
    """Prefixes ``<base>__fn<n>/`` for the intermediates of inlined bodies that no name of ``graph`` starts with
    (a session-81 review: a local function and an ONNX op of one name, or a user's value named like an
    intermediate, gave two nodes one output)."""

    def __init__(self, graph: Any):
        self.taken = {v.name for v in list(graph.input) + list(graph.output) + list(graph.initializer)}
        for node in graph.node:
            self.taken.update([node.name, *node.input, *node.output])
        self.n = 0

    def __call__(self, base: str) -> str:
        while True:
            prefix, self.n = f"{base}__fn{self.n}/", self.n + 1
            if not any(name.startswith(prefix) for name in self.taken):
                return prefix


def _body(f: onnx.FunctionProto, call: onnx.NodeProto, prefix: str) -> list[onnx.NodeProto]:
    """The nodes of ``f`` for one ``call``: names bound, intermediates under ``prefix``, attributes resolved."""
    names = {formal: actual for formal, actual in zip(f.input, call.input)}
    names.update({formal: "" for formal in f.input[len(call.input):]})  # optional inputs not given
    # an output the call omits ("") stays an intermediate: the body may still read it
    names.update({formal: actual or prefix + formal for formal, actual in zip(f.output, call.output)})
    given = {a.name: a for a in call.attribute}
    defaults = {a.name: a for a in getattr(f, "attribute_proto", ())}
    body = []
    for node in f.node:
        new = onnx.NodeProto()
        new.CopyFrom(node)
        new.name = prefix + (node.name or node.op_type)
        del new.input[:], new.output[:], new.attribute[:]
        new.input.extend(names.get(x, prefix + x) if x else "" for x in node.input)
        new.output.extend(names.get(x, prefix + x) if x else "" for x in node.output)
        for a in node.attribute:
            if not a.ref_attr_name:
                new.attribute.append(a)
                continue
            bound = given.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
            if bound is not None:  # an unbound reference leaves the attribute at the op's own default
                b = onnx.AttributeProto()
                b.CopyFrom(bound)
                b.name = a.name
                new.attribute.append(b)
        body.append(new)
    return body


#: ONNX ops felixjax runs as the function body their schema defines (the spec's own definition, in ops felixjax
#: runs): Attention (opset 23+: MHA / GQA / MQA, 3-D or 4-D, masks, causal, softcap, a KV cache, sliding
#: windows), RotaryEmbedding, MeanVarianceNormalization, CenterCropPad, SwiGLU, CausalConvWithState.
#: (LinearAttention's body is a Scan, AffineGrid's an If, which felixjax does not run.)
SCHEMA_FUNCTIONS = ("Attention", "RotaryEmbedding", "MeanVarianceNormalization", "CenterCropPad", "SwiGLU",
                    "CausalConvWithState")


def expand_schema_functions(proto: onnx.ModelProto, opset: int) -> onnx.ModelProto | FoldedModel:
    """``proto`` (a view of it, as ``fold_model(copy=False)`` returns) with every node of
    :data:`SCHEMA_FUNCTIONS` replaced by the body ONNX defines for it (a context-dependent function: built for
    the node's attributes and its inputs' types, which shape inference gives, symbolic dims and all: inputs
    are pinned afterwards, when the model folds). Itself when there is none.

    Raises:
        UnsupportedModelError: an input's type is unknown, or onnx builds no body for the node.
    """
    if not any(n.op_type in SCHEMA_FUNCTIONS and n.domain in ("", "ai.onnx") for n in proto.graph.node):
        return proto
    g = proto.graph
    inputs = {vi.name for vi in g.input}
    light = onnx.helper.make_graph(  # types only: weights as typed inputs (their data is not copied)
        list(g.node), g.name or "graph", list(g.input) + [onnx.helper.make_tensor_value_info(
            t.name, t.data_type, list(t.dims)) for t in g.initializer if t.name not in inputs], list(g.output))
    try:
        inferred = onnx.shape_inference.infer_shapes(onnx.helper.make_model(
            light, opset_imports=list(proto.opset_import), ir_version=max(proto.ir_version, 4)))
    except Exception as e:  # noqa: BLE001 (onnx.shape_inference.InferenceError and C++ errors)
        raise ModelFormatError(f"ONNX shape inference failed: {str(e).strip().splitlines()[0]}") from None
    types = {vi.name: vi.type for vi in
             list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output)}
    fresh = _Fresh(g)
    nodes = []
    for index, node in enumerate(proto.graph.node):
        if node.op_type not in SCHEMA_FUNCTIONS or node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        name = node.name or f"{node.op_type}_{index}"
        missing = [i for i in node.input if i and i not in types]
        if missing:
            raise UnsupportedModelError(f"node {name!r} (op {node.op_type}): the type of input {missing[0]!r} is "
                                        f"unknown; felixjax expands {node.op_type} for its inputs' types")
        if node.op_type == "Attention":
            _check_attention(node, name, [_dims(types[i]) if i else None for i in node.input])
        try:
            schema = onnx.defs.get_schema(node.op_type, opset)
        except onnx.defs.SchemaError:
            since = min(s.since_version for s in onnx.defs.get_all_schemas_with_history()
                        if s.name == node.op_type and s.domain in ("", "ai.onnx"))
            raise UnsupportedModelError(f"node {name!r}: {node.op_type} does not exist at opset {opset} (ONNX added it "
                                        f"at opset {since})") from None
        if len([i for i in node.input if i]) < schema.min_input:
            raise UnsupportedModelError(f"node {name!r} (op {node.op_type}): takes at least {schema.min_input} "
                                        f"inputs, got {len([i for i in node.input if i])}")
        dependent = schema.has_context_dependent_function
        versions = [v for v in (schema.context_dependent_function_opset_versions if dependent
                                else schema.function_opset_versions) if v <= opset]
        if not versions:
            raise UnsupportedModelError(f"node {name!r} (op {node.op_type}): onnx {onnx.__version__} defines no "
                                        f"function body for opset {opset}")
        full = onnx.NodeProto()
        full.CopyFrom(node)
        given = {a.name for a in node.attribute}  # the schema's defaults, as onnx's own expansion adds them
        full.attribute.extend(a.default_value for k, a in schema.attributes.items()
                              if k not in given and a.default_value.name)
        empty = onnx.TypeProto()
        try:
            body = schema.get_context_dependent_function_with_opset_version(
                max(versions), full.SerializeToString(),
                [(types[i] if i else empty).SerializeToString() for i in node.input]) if dependent else \
                schema.get_function_with_opset_version(max(versions))
        except Exception as e:  # noqa: BLE001 (onnx.defs.SchemaError and friends: a malformed node)
            raise UnsupportedModelError(f"node {name!r} (op {node.op_type}): onnx builds no function body for it "
                                        f"({str(e).strip().splitlines()[0][:200]})") from None
        f = onnx.FunctionProto()
        f.ParseFromString(body)
        nodes.extend(_body(f, full, fresh(node.name or node.op_type)))
    return FoldedModel(FoldedGraph(g.name, nodes, list(g.input), list(g.output), list(g.initializer)),
                       list(proto.opset_import), proto.ir_version)  # (lists of the protos: no weight copied)


def _dims(t: onnx.TypeProto) -> tuple | None:
    """A tensor type's dims (an int, or None where unknown), or None without a shape."""
    if not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else None for d in t.tensor_type.shape.dim)


def _check_attention(node: onnx.NodeProto, name: str, shapes: list) -> None:
    """What onnx's function body takes for granted about an Attention node (its shape inference then fails
    deep inside the body, or a Mod stays unfolded): one clear error instead."""
    a = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
    q, k, v = (shapes + [None] * 3)[:3]
    ranks = {len(x) for x in (q, k, v) if x is not None}

    def fail(message: str) -> None:
        raise UnsupportedModelError(f"node {name!r} (op Attention): {message}")

    if not ranks:  # no shapes known: onnx's body says what is wrong, if anything
        return
    if len(ranks) > 1 or not ranks <= {3, 4}:
        fail(f"Q, K and V must all be 3-D or all 4-D (shapes {q}, {k}, {v})")
    if ranks == {4}:
        if "q_num_heads" in a or "kv_num_heads" in a:
            fail("q_num_heads / kv_num_heads are for 3-D inputs; 4-D inputs carry their heads in dim 1")
        hq, hkv = (q[1] if q else None), (k[1] if k else None)
    else:
        if "q_num_heads" not in a or "kv_num_heads" not in a:
            fail("3-D inputs need both q_num_heads and kv_num_heads")
        hq, hkv = int(a["q_num_heads"]), int(a["kv_num_heads"])
        if min(hq, hkv) < 1:
            fail(f"q_num_heads={hq} and kv_num_heads={hkv} must be positive")
        for what, x, h in (("Q", q, hq), ("K", k, hkv), ("V", v, hkv)):
            if x is not None and x[2] is not None and x[2] % h:
                fail(f"{what}'s hidden size {x[2]} is not a multiple of its {h} heads")
    if hq and hkv and hq % hkv:
        fail(f"{hq} query heads do not split into groups over {hkv} key / value heads")
    batch = {x[0] for x in (q, k, v) if x is not None and x[0]}
    seq = {x[-2] if ranks == {4} else x[1] for x in (k, v) if x is not None}
    if len(batch) > 1 or len(seq - {None}) > 1:
        fail(f"Q, K and V must have one batch size, and K and V one sequence length (shapes {q}, {k}, {v})")
    if q and k and ranks == {3} and q[2] and k[2] and q[2] // hq != k[2] // hkv or \
            q and k and ranks == {4} and q[3] and k[3] and q[3] != k[3]:
        fail(f"the query and key head sizes differ (Q {q}, K {k}, {hq} / {hkv} heads)")
