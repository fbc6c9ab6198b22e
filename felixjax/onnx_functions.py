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

import itertools

import onnx

from felixjax.errors import UnsupportedModelError

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
    calls = itertools.count()

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
            out.extend(expand(_body(f, node, next(calls)), depth + 1))
        return out

    inlined = onnx.ModelProto()
    inlined.CopyFrom(proto)
    del inlined.graph.node[:]
    inlined.graph.node.extend(expand(proto.graph.node, 0))
    del inlined.functions[:]
    return inlined


def _body(f: onnx.FunctionProto, call: onnx.NodeProto, n: int) -> list[onnx.NodeProto]:
    """The nodes of ``f`` for one ``call``: names bound, intermediates prefixed, attributes resolved."""
    prefix = f"{call.name or f.name}__fn{n}/"
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
