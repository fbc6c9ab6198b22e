"""A layout chosen per network (issue 14): the convolutions of a fused graph run in NCHW[b]c.

:func:`block_channels` rewrites every eligible convolution anchor (float32, dense, groups 1 or
depthwise, in and out channels multiples of the block, constant weights) into a ``conv2d_nchwc`` anchor
(:mod:`codegen.blocked`) whose data, residual and output are channel-blocked, its weights reordered once
here, and keeps the blocked activations blocked from one such conv to the next. A groups-1 conv whose
data comes from outside the blocked region (the network's image, a pooling's output) reads it as NCHW
and writes NCHW[b]c (``plain_data``: no reorder); elsewhere, where a blocked value meets a node that
reads NCHW (the last conv's output going into a pooling) or an NCHW value meets a depthwise conv, a
``Reblock`` node converts it, once per value and direction. The
graph's inputs and outputs keep their layouts, so a model built from the rewritten graph takes and
returns the same arrays.

The rewritten anchors are new tasks: a tuning run over the rewritten graph tunes them in the layout they
run in, under their own database keys (``conv2d_nchwc8_...``).

Example:
    >>> from felixjax import zoo
    >>> from felixjax.onnx_import import load_onnx
    >>> m = load_onnx(zoo.make_model("mobilenet_v2", dataset="cifar10"), layout="nchwc")
    >>> sum(n.op == "Reblock" for n in m.graph.nodes), m.tasks[1][0].name
    (1, 'dwconv2d_nchwc8_1x32x32x32_k32_3x3_s1_p1_bias_relu6')
"""
from __future__ import annotations

import warnings
from collections.abc import Collection, Mapping

from codegen import blocked

from .graph_passes import Graph, Node, _unique
from .relax import MAX_AXES

LAYOUTS = ("nchw", "nchwc")


def eligible(node: Node, graph: Graph, block: int = blocked.BLOCK) -> bool:
    """Whether ``node`` can run as a channel-blocked convolution: a float32 dense conv anchor with
    constant weights whose output channels are a multiple of ``block``, groups 1 (any input channels: a
    conv reading an NCHW value takes it as it is, ``plain_data``) or depthwise (channels a multiple of
    ``block``), within the relaxation's 8 axes, not writing a graph output."""
    if not node.is_anchor or node.task.op != "conv2d":
        return False
    t, p = node.task, node.task.p
    if t.dtype != "float32" or t.sparsity or p["k"] % block or node.inputs[1] not in graph.constants:
        return False
    if p["groups"] != 1 and not (p["groups"] == p["c"] == p["k"] and p["c"] % block == 0):
        return False
    if any(o in graph.outputs for o in node.outputs):
        return False
    plain = p["groups"] == 1 and p["c"] % block != 0
    return len(blocked.conv2d_nchwc(**_conv_args(t), block=block, plain_data=plain).contraction().axes) <= MAX_AXES


def resolve(graph: Graph, layout: str | Mapping[str, str]) -> Graph:
    """``graph`` in ``layout``: ``"nchw"`` (as it is), ``"nchwc"`` (:func:`block_channels`), or a mixed
    layout, a mapping from conv node names (the fused graph's anchors, ``Model.graph.nodes``) to
    ``"nchw"`` / ``"nchwc"``: the convs mapped to ``"nchw"`` stay NCHW, every other eligible conv is
    blocked (what :func:`felixjax.choose_layout` picks conv by conv from measured per-layer times).

    Raises:
        ValueError: an unknown layout, or a mapping naming a node that is not a convolution of ``graph``.
    """
    check_layout(layout)
    convs = {n.name: n for n in graph.nodes if n.is_anchor and n.task.op == "conv2d"}
    if isinstance(layout, str):
        if layout == "nchwc" and convs and not any(eligible(n, graph) for n in convs.values()):
            warnings.warn(f"layout='nchwc': none of the {len(convs)} convolution(s) can be blocked ({WHY_NOT}); "
                          "the build is NCHW", UserWarning, stacklevel=3)
        return block_channels(graph) if layout == "nchwc" else graph
    bad = {k: v for k, v in layout.items() if k not in convs or v not in LAYOUTS}
    if bad:
        k, v = next(iter(bad.items()))
        why = f"{k!r} is not a convolution of this model" if k not in convs else f"unknown layout {v!r}"
        raise ValueError(f"mixed layout: {why} ({len(bad)} bad entr{'y' if len(bad) == 1 else 'ies'}; "
                         f"conv names: {', '.join(sorted(convs)[:6])}{', ...' if len(convs) > 6 else ''})")
    stay = sorted(k for k, v in layout.items() if v == "nchwc" and not eligible(convs[k], graph))
    if stay:  # they were accepted and stayed NCHW, silently
        warnings.warn(f"mixed layout: {', '.join(map(repr, stay))} cannot be blocked ({WHY_NOT}): NCHW",
                      UserWarning, stacklevel=3)
    return block_channels(graph, keep={k for k, v in layout.items() if v == "nchw"})


WHY_NOT = ("a blocked conv needs groups 1 or depthwise, output channels a multiple of 8, at most 8 loop axes (batch 1 "
           "for a 3x3 conv) and an output that is not the graph's")


def check_layout(layout: object) -> None:
    """A ValueError unless ``layout`` is ``"nchw"``, ``"nchwc"`` or a mapping (its entries: :func:`resolve`)."""
    if isinstance(layout, str) and layout in LAYOUTS or isinstance(layout, Mapping) and not isinstance(layout, str):
        return
    raise ValueError(f"layout must be one of {', '.join(LAYOUTS)} or a mapping of conv names to them, "
                     f"got {layout!r}")


def reblocked_shape(shape: tuple[int, ...], block: int) -> tuple[int, ...]:
    n, c, h, w = shape
    return (n * c // block, h, w, block)


def block_channels(graph: Graph, block: int = blocked.BLOCK, *, keep: Collection[str] = ()) -> Graph:
    """``graph`` with its eligible convolutions in NCHW[block]c (see the module docstring), except the
    conv nodes named in ``keep``, which stay NCHW (a mixed layout, :func:`resolve`)."""
    chosen = {n for n in graph.nodes if n.name not in keep and eligible(n, graph, block)}
    if not chosen:
        return graph
    shapes, consts = dict(graph.shapes), dict(graph.constants)
    taken = set(shapes) | set(consts) | {n.name for n in graph.nodes}
    blocked_values = {n.outputs[0] for n in chosen}
    plain_shape = {v: shapes[v] for v in blocked_values}
    nodes: list[Node] = []
    converted: dict[tuple[str, bool], str] = {}

    def as_layout(v: str, want_blocked: bool) -> str:
        if not v or (v in blocked_values) == want_blocked:
            return v
        if (v, want_blocked) not in converted:
            name = _unique(f"{v}/{'nchwc' if want_blocked else 'nchw'}", taken)
            taken.add(name)
            shapes[name] = reblocked_shape(shapes[v], block) if want_blocked else plain_shape[v]
            nodes.append(Node("Reblock", (v,), (name,), {"block": block, "to": "nchwc" if want_blocked else "nchw"},
                              name=name))
            converted[(v, want_blocked)] = name
        return converted[(v, want_blocked)]

    for node in graph.nodes:
        if node not in chosen:
            nodes.append(Node(node.op, tuple(as_layout(i, False) for i in node.inputs), node.outputs, node.attrs,
                              node.name))
            continue
        t = node.task
        roles = dict(zip(t.input_names(), node.inputs))
        # data from outside the blocked region: a groups-1 conv reads it as NCHW (no reorder)
        plain = t.p["groups"] == 1 and roles["data"] not in blocked_values
        bt = blocked.conv2d_nchwc(**_conv_args(t), block=block, plain_data=plain)
        w = _unique(f"{roles['weight']}/nchwc{block}", taken)
        taken.add(w)
        consts[w] = blocked.weight_to_blocked(graph.constants[roles["weight"]].reshape(t.input_shapes()[1]), bt)
        shapes[w] = consts[w].shape
        ins = [roles["data"] if plain else as_layout(roles["data"], True), w]
        if t.bias:
            ins.append(roles["bias"])
        if t.residual:
            ins.append(as_layout(roles["residual"], True))
        out = node.outputs[0]
        shapes[out] = reblocked_shape(plain_shape[out], block)
        nodes.append(Node(node.op, tuple(ins), node.outputs, {**node.attrs, "task": bt}, node.name))
    used = {i for n in nodes for i in n.inputs}
    consts = {k: v for k, v in consts.items() if k in used or k in graph.outputs}
    return Graph(tuple(nodes), graph.inputs, graph.outputs, shapes, consts)


def _conv_args(t) -> dict:
    p = t.p
    return dict(n=p["n"], c=p["c"], h=p["h"], w=p["w"], out_channels=p["k"], kernel=(p["r"], p["s"]),
                stride=p["stride"], padding=p["pad"], dilation=p["dilation"], groups=p["groups"], bias=t.bias,
                act=t.act, residual=t.residual)
