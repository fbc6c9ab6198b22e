"""The network graph of stages ① and ②: records, numpy semantics, fusion passes and task extraction.

``felixjax.onnx_import`` turns an ONNX model into a :class:`Graph` of *canonical* nodes: ONNX op names
whose attributes are resolved once (every opset's attribute-vs-input variant, ``auto_pad``, negative
axes, default values), so nothing downstream ever looks at an opset version. The passes below rewrite
that graph, each one a pure function ``Graph -> Graph``:

    remove_identities   Identity and inference-mode Dropout vanish
    fold_constants      a node whose inputs are all constants becomes a constant
    fold_batchnorm      Conv -> BatchNormalization becomes one Conv; a lone BN becomes ScaleShift
    form_anchors        Conv / Gemm / MatMul with constant weights become Task anchors
    fuse_epilogues      anchor -> +bias -> +residual -> relu / relu6 collapses into the anchor
    eliminate_dead      nodes and constants no graph output depends on are dropped

The result holds *anchor* nodes (``conv2d``, ``dense``, ``matmul``: one tunable ``codegen.ops.Task``
each, with the fused epilogue) and *cheap* nodes (everything else). Canonical node forms:

=================================  ==================================  ===========================================
op                                 inputs                              attrs
=================================  ==================================  ===========================================
``conv2d`` ``dense`` ``matmul``    data, weight[, bias][, residual]    task (arrays reshape to task.input_shapes())
``Conv``                           x, w[, b]                           kernel, strides, pads (t, l, b, r), dilations, groups
``Gemm``                           a, b[, c]                           alpha, beta, trans_a, trans_b
``MatMul``                         a, b                                (numpy ``matmul`` semantics)
``Add Sub Mul Div Pow``            a, b                                (numpy broadcasting)
``Sqrt Relu Sigmoid Tanh Erf``     x
``Identity Dropout``               x                                   (inference: y = x)
``Clip``                           x, lo or "", hi or ""               ("" = unbounded)
``BatchNormalization``             x, scale, bias, mean, var           epsilon (channel axis 1)
``ScaleShift``                     x, scale, shift                     (y = x * scale[c] + shift[c], axis 1)
``LayerNormalization``             x, scale[, bias]                    axis, epsilon; outputs y[, mean, inv_std_dev]
``ReduceMean``                     x                                   axes (sorted, >= 0), keepdims
``MaxPool``                        x (NCHW)                            kernel, strides, pads, dilations, ceil_mode
``AveragePool``                    x (NCHW)                            same + count_include_pad
``Reshape``                        x                                   shape (static, fully resolved)
``Transpose``                      x                                   perm
``Concat``                         x0, x1, ...                         axis (>= 0)
``Softmax``                        x                                   axes (the trailing axes normalized over)
``Pad``                            x, value (a scalar)                 pads: ((before, after) per dim), may be < 0
=================================  ==================================  ===========================================

Every value name has a static shape in ``Graph.shapes``; pooling output sizes (``ceil_mode``) are read
from there. Constants are read-only float32 arrays in ``Graph.constants``.

Example:
    >>> import numpy as np
    >>> w = np.ones((4, 3, 1, 1), np.float32)
    >>> g = Graph(nodes=(Node("Conv", ("x", "w"), ("y",), {"kernel": (1, 1), "strides": (1, 1),
    ...                                                       "pads": (0, 0, 0, 0), "dilations": (1, 1),
    ...                                                       "groups": 1}),
    ...                  Node("Relu", ("y",), ("z",))),
    ...           inputs=("x",), outputs=("z",),
    ...           shapes={"x": (1, 3, 8, 8), "w": (4, 3, 1, 1), "y": (1, 4, 8, 8), "z": (1, 4, 8, 8)},
    ...           constants={"w": w})
    >>> fused = optimize(g)
    >>> [n.op for n in fused.nodes], fused.nodes[0].attrs["task"].act
    (['conv2d'], 'relu')
    >>> float(run_graph(fused, {"x": np.ones((1, 3, 8, 8), np.float32)})["z"].max())
    3.0
"""
from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from codegen import ops
from codegen.limits import SizeLimitError
from codegen.ops import Task
from felixjax import graph_ops, op_table

ANCHOR_OPS = ("conv2d", "dense", "matmul")


# ----------------------------------------------------------------------------------------------
# Records
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Node:
    """One operation: ``outputs = op(inputs)``. Inputs and outputs are value names; ``""`` marks an
    absent optional input. Compared and hashed by identity (passes keep sets of nodes)."""

    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    name: str = ""

    @property
    def is_anchor(self) -> bool:
        return self.op in ANCHOR_OPS

    @property
    def task(self) -> Task:
        """The tunable Task of an anchor node."""
        if not self.is_anchor:
            raise ValueError(f"node {self.name!r} ({self.op}) is not an anchor")
        return self.attrs["task"]

    def __repr__(self) -> str:
        extra = f" {self.task.name}" if self.is_anchor else ""
        return f"Node({self.name or self.op}: {self.op}{extra} {list(self.inputs)} -> {list(self.outputs)})"


@dataclass(frozen=True, eq=False)
class Graph:
    """A network: nodes in topological order, named inputs / outputs, the static shape of every
    value (inputs, intermediates, constants) and the constant arrays (read-only float32)."""

    nodes: tuple[Node, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    shapes: Mapping[str, tuple[int, ...]]
    constants: Mapping[str, np.ndarray]

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "shapes", {k: tuple(int(d) for d in v) for k, v in self.shapes.items()})
        consts = {}
        for k, v in self.constants.items():
            a = np.asarray(v)
            if a.flags.writeable:
                a = a.view()  # a read-only view: no copy of large weights
                a.flags.writeable = False
            consts[k] = a
        object.__setattr__(self, "constants", consts)

    def replace(self, **changes: Any) -> "Graph":
        return dataclasses.replace(self, **changes)

    def producers(self) -> dict[str, Node]:
        return {o: n for n in self.nodes for o in n.outputs if o}

    def consumers(self) -> dict[str, list[Node]]:
        """Value name -> consuming nodes, one entry per use (a node using a value twice appears twice)."""
        uses: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                if i:
                    uses.setdefault(i, []).append(n)
        return uses

    @property
    def anchors(self) -> list[Node]:
        return [n for n in self.nodes if n.is_anchor]

    def summary(self) -> str:
        """One line per node: name, op (task name for anchors), input and output shapes."""
        lines = []
        for n in self.nodes:
            what = n.task.name if n.is_anchor else n.op
            ins = ", ".join(("const" if i in self.constants else "") + str(self.shapes.get(i, "-")) for i in n.inputs if i)
            outs = ", ".join(str(self.shapes.get(o, "-")) for o in n.outputs if o)
            lines.append(f"{n.name:<28} {what:<44} ({ins}) -> {outs}")
        return "\n".join(lines)


def _unique(name: str, taken: Mapping[str, Any] | set[str]) -> str:
    if name not in taken:
        return name
    i = 1
    while f"{name}_{i}" in taken:
        i += 1
    return f"{name}_{i}"


# ----------------------------------------------------------------------------------------------
# Numpy semantics (the reference for every later backend)
# ----------------------------------------------------------------------------------------------

def conv_task(attrs: Mapping[str, Any], x_shape: Sequence[int], w_shape: Sequence[int], *, bias: bool = False,
              act: str | None = None, residual: bool = False) -> Task:
    """The ``codegen.ops.conv2d`` Task of a canonical ``Conv`` node (raises ValueError if it rejects it).

    Example:
        >>> a = {"kernel": (3, 3), "strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1), "groups": 1}
        >>> conv_task(a, (1, 8, 16, 16), (4, 8, 3, 3)).output_shape
        (1, 4, 16, 16)
    """
    n, c, h, w = (int(d) for d in x_shape)
    return ops.conv2d(n, c, h, w, out_channels=int(w_shape[0]), kernel=tuple(attrs["kernel"]),
                      stride=tuple(attrs["strides"]), padding=tuple(attrs["pads"]),
                      dilation=tuple(attrs["dilations"]), groups=int(attrs["groups"]), bias=bias, act=act,
                      residual=residual)


def evaluate(node: Node, args: Sequence[np.ndarray | None],
             out_shapes: Sequence[Sequence[int]] | None = None) -> list[np.ndarray]:
    """Numpy semantics of one canonical node: ``args`` and ``out_shapes`` follow ``node.inputs`` and
    ``node.outputs`` (None for ""); returns one array per output. Float32 in, float32 out (integer
    constants are folded with the same code).

    Example:
        >>> import numpy as np
        >>> evaluate(Node("Softmax", ("x",), ("y",), {"axes": (1,)}), [np.zeros((1, 4), np.float32)])[0]
        array([[0.25, 0.25, 0.25, 0.25]], dtype=float32)
    """
    op, a = node.op, node.attrs
    x = args[0] if args else None
    with np.errstate(all="ignore"):
        if op in ANCHOR_OPS:
            task = a["task"]
            arrays = [np.reshape(v, s) for v, s in zip(args, task.input_shapes())]
            y = task.reference(*arrays)
            return [y.reshape(out_shapes[0]) if out_shapes else y]
        if op in op_table.OPS:  # written once for numpy and JAX (felixjax.op_table)
            return op_table.OPS[op](np, a, args, out_shapes or [None] * len(node.outputs))
        if op == "Conv":  # the C build's own reference (Task.reference); JAX: approx.executor
            task = conv_task(a, x.shape, args[1].shape, bias=len(args) > 2 and args[2] is not None)
            return [task.reference(*(v for v in args if v is not None))]
        extra = graph_ops.evaluate_extra(op, a, args, out_shapes)
        if extra is not None:
            return extra
    raise ValueError(f"node {node.name!r}: no numpy semantics for op {op!r}")


def run_graph(graph: Graph, feeds: Mapping[str, np.ndarray], *,
              node_eval: Callable[[Node, list, list], list] | None = None) -> dict[str, np.ndarray]:
    """Execute ``graph`` in numpy; returns ``{output name: array}``. Intermediates are freed after
    their last use, so large networks run in bounded memory. ``node_eval(node, args, out_shapes)``
    replaces :func:`evaluate` (e.g. ``felixjax.fake_quant``'s, for low-precision layers).

    Example:
        >>> import numpy as np
        >>> g = Graph((Node("Relu", ("x",), ("y",)),), ("x",), ("y",), {"x": (2,), "y": (2,)}, {})
        >>> run_graph(g, {"x": np.array([-1, 2], np.float32)})["y"]
        array([0., 2.], dtype=float32)
    """
    env: dict[str, np.ndarray] = dict(graph.constants)
    for name in graph.inputs:
        if name not in feeds:
            raise ValueError(f"missing input {name!r}; the graph takes {list(graph.inputs)}")
        env[name] = feeds[name]
    last_use = {i: k for k, n in enumerate(graph.nodes) for i in n.inputs if i}
    keep = set(graph.outputs) | set(graph.constants) | set(graph.inputs)
    for k, node in enumerate(graph.nodes):
        args = [env[i] if i else None for i in node.inputs]
        outs = (node_eval or evaluate)(node, args, [graph.shapes.get(o) for o in node.outputs])
        for name, value in zip(node.outputs, outs):
            if not name:
                continue
            if tuple(value.shape) != graph.shapes[name]:
                raise AssertionError(f"node {node.name!r} ({node.op}) produced {name!r} with shape {value.shape}, "
                                     f"the graph says {graph.shapes[name]}")
            env[name] = value
        for i in set(node.inputs):
            if i and last_use.get(i) == k and i not in keep:
                del env[i]
    return {o: env[o] for o in graph.outputs}


# ----------------------------------------------------------------------------------------------
# Passes
# ----------------------------------------------------------------------------------------------

def _rename(node: Node, mapping: Mapping[str, str]) -> Node:
    return dataclasses.replace(node, inputs=tuple(mapping.get(i, i) for i in node.inputs),
                               outputs=tuple(mapping.get(o, o) for o in node.outputs))


def remove_identities(graph: Graph) -> Graph:
    """Drop Identity and (inference) Dropout nodes by rewiring their consumers to their input."""
    alias: dict[str, str] = {}

    def resolve(v: str) -> str:
        while v in alias:
            v = alias[v]
        return v

    kept = []
    for node in graph.nodes:
        if node.op in ("Identity", "Dropout") and node.outputs[0] not in graph.outputs:
            alias[node.outputs[0]] = resolve(node.inputs[0])
        else:
            kept.append(dataclasses.replace(node, inputs=tuple(resolve(i) for i in node.inputs)))
    # An Identity producing a graph output: let the producer of its input write the output directly.
    uses = Graph(tuple(kept), graph.inputs, graph.outputs, {}, {}).consumers()
    producers = {o: n for n in kept for o in n.outputs if o}
    renames: dict[Node, Node | None] = {}
    for node in kept:
        if node.op in ("Identity", "Dropout"):
            x, y = node.inputs[0], node.outputs[0]
            p = producers.get(x)
            if p is not None and p not in renames and x not in graph.outputs and len(uses[x]) == 1:
                renames[p] = _rename(p, {x: y})
                renames[node] = None
    nodes = tuple(renames.get(n, n) for n in kept if renames.get(n, n) is not None)
    return graph.replace(nodes=nodes)


def fold_constants(graph: Graph) -> Graph:
    """Evaluate every node whose inputs are all constants; its outputs become constants."""
    constants = dict(graph.constants)
    nodes = []
    for node in graph.nodes:
        if all(i == "" or i in constants for i in node.inputs):
            outs = evaluate(node, [constants[i] if i else None for i in node.inputs],
                            [graph.shapes.get(o) for o in node.outputs])
            constants.update((o, v) for o, v in zip(node.outputs, outs) if o)
        else:
            nodes.append(node)
    return graph.replace(nodes=tuple(nodes), constants=constants)


def _const_param(graph: Graph, name: str) -> bool:
    return name == "" or name in graph.constants


def fold_batchnorm(graph: Graph) -> Graph:
    """Fold inference BatchNormalization into the Conv before it (``W' = W * s``, ``b' = (b - mean) * s +
    beta`` with ``s = gamma / sqrt(var + eps)``); a BN that cannot fold becomes a per-channel ScaleShift."""
    constants, shapes = dict(graph.constants), dict(graph.shapes)
    producers, uses = graph.producers(), graph.consumers()
    replaced: dict[Node, Node] = {}
    dropped: set[Node] = set()
    for bn in graph.nodes:
        if bn.op != "BatchNormalization" or not all(_const_param(graph, i) for i in bn.inputs[1:]):
            continue
        gamma, beta, mean, var = (constants[i].astype(np.float64) for i in bn.inputs[1:5])
        s = gamma / np.sqrt(var + bn.attrs["epsilon"])
        x, y = bn.inputs[0], bn.outputs[0]
        conv = producers.get(x)
        if (conv is not None and conv.op == "Conv" and conv not in replaced and len(uses.get(x, [])) == 1
                and x not in graph.outputs and conv.inputs[1] in constants
                and _const_param(graph, conv.inputs[2] if len(conv.inputs) > 2 else "")):
            w = constants[conv.inputs[1]].astype(np.float64)
            b = constants[conv.inputs[2]].astype(np.float64) if len(conv.inputs) > 2 and conv.inputs[2] else 0.0
            wn, bname = _unique(f"{conv.name}/w_bn", constants), _unique(f"{conv.name}/b_bn", constants)
            constants[wn] = (w * s.reshape(-1, 1, 1, 1)).astype(np.float32)
            constants[bname] = ((b - mean) * s + beta).astype(np.float32)
            shapes[wn], shapes[bname] = constants[wn].shape, constants[bname].shape
            replaced[conv] = dataclasses.replace(conv, inputs=(conv.inputs[0], wn, bname), outputs=(y,))
            dropped.add(bn)
        else:
            sn, tn = _unique(f"{bn.name}/scale", constants), _unique(f"{bn.name}/shift", constants)
            constants[sn], constants[tn] = s.astype(np.float32), (beta - mean * s).astype(np.float32)
            shapes[sn], shapes[tn] = constants[sn].shape, constants[tn].shape
            replaced[bn] = Node("ScaleShift", (x, sn, tn), (y,), {}, bn.name)
    nodes = tuple(replaced.get(n, n) for n in graph.nodes if n not in dropped)
    return graph.replace(nodes=nodes, constants=constants, shapes=shapes)


def _anchor_for(node: Node, constants: dict, shapes: dict) -> list[Node] | None:
    """The anchor (plus, for Gemm's C, an Add) replacing a Conv / Gemm / MatMul, or None if it stays cheap."""
    ins = list(node.inputs) + [""] * (3 - len(node.inputs))
    x, w, b = ins[0], ins[1], ins[2]
    if w not in constants:
        return None  # anchors take constant weights (packed once at load); activation x activation stays cheap
    y = node.outputs[0]

    def add_const(suffix: str, value: np.ndarray) -> str:
        name = _unique(f"{node.name}/{suffix}", constants)
        constants[name] = np.ascontiguousarray(value, dtype=np.float32)
        shapes[name] = constants[name].shape
        return name

    try:
        if node.op == "Conv":
            if b and b not in constants:
                return None
            task = conv_task(node.attrs, shapes[x], shapes[w], bias=bool(b))
            return [Node("conv2d", (x, w) + ((b,) if b else ()), (y,), {"task": task}, node.name)]
        if node.op == "Gemm":
            a = node.attrs
            if a["trans_a"] or (b and b not in constants and a["beta"] != 1.0):
                return None
            wt = constants[w] if a["trans_b"] else constants[w].T
            (m, k), n = shapes[x], wt.shape[0]
            task = ops.dense(m, k, n)
            wname = add_const("weight", wt if a["alpha"] == 1.0 else wt * np.float32(a["alpha"]))  # no 0.4 GB copy
            if not b:
                return [Node("dense", (x, wname), (y,), {"task": task}, node.name)]
            c = add_const("c", constants[b] * np.float32(a["beta"])) if b in constants else b
            mid = _unique(f"{node.name}/gemm", shapes)
            shapes[mid] = shapes[y]
            return [Node("dense", (x, wname), (mid,), {"task": task}, node.name),
                    Node("Add", (mid, c), (y,), {}, f"{node.name}/add_c")]
        if node.op == "MatMul":
            xs, ws = shapes[x], shapes[w]
            if len(xs) < 2 or len(ws) < 2:
                return None
            (m, k), n = xs[-2:], ws[-1]
            if math.prod(ws[:-2]) == 1 and len(ws) <= len(xs):
                task = ops.matmul(math.prod(xs[:-1]), n, k)  # B is one matrix: fold A's batch dims into M
                wname = add_const("weight", constants[w].reshape(k, n))
            elif tuple(ws[:-2]) == tuple(xs[:-2]):
                task = ops.matmul(m, n, k, batch=math.prod(ws[:-2]))
                wname = add_const("weight", constants[w].reshape(-1, k, n))
            else:
                return None
            return [Node("matmul", (x, wname), (y,), {"task": task}, node.name)]
    except SizeLimitError:
        raise  # too large to tune or to run: refused, never silently left to the numpy executor
    except ValueError:
        return None  # a shape the Task constructors reject stays a cheap op
    return None


def form_anchors(graph: Graph) -> Graph:
    """Turn each Conv, Gemm (no transA) and MatMul whose weights are constants into a Task anchor."""
    constants, shapes = dict(graph.constants), dict(graph.shapes)
    nodes: list[Node] = []
    for node in graph.nodes:
        new = _anchor_for(node, constants, shapes) if node.op in ("Conv", "Gemm", "MatMul") else None
        nodes.extend(new if new else [node])
    return graph.replace(nodes=tuple(nodes), constants=constants, shapes=shapes)


def _as_bias(c: np.ndarray, out_shape: tuple[int, ...], channel_axis: int) -> np.ndarray | None:
    """``c`` as a per-channel vector if adding it to an ``out_shape`` tensor is a bias add, else None."""
    rank = len(out_shape)
    if c.ndim > rank:
        return None
    full = (1,) * (rank - c.ndim) + c.shape
    if any(d != 1 for i, d in enumerate(full) if i != channel_axis) or full[channel_axis] not in (1, out_shape[channel_axis]):
        return None
    return np.broadcast_to(c.reshape(-1), (out_shape[channel_axis],)).astype(np.float32)


def _absorb(graph: Graph, anchor: Node, uses: dict[str, list[Node]], constants: dict,
            shapes: dict) -> tuple[Node, list[Node]]:
    """Grow one anchor along its single-consumer chain of bias / residual / activation nodes."""
    task: Task = anchor.attrs["task"]
    data, weight = anchor.inputs[:2]
    bias_name = anchor.inputs[2] if task.bias else ""
    bias = constants[bias_name].astype(np.float32) if bias_name else None
    residual = anchor.inputs[-1] if task.residual else ""
    act, y, absorbed = task.act, anchor.outputs[0], []
    channel_axis = 1 if task.op == "conv2d" else len(shapes[y]) - 1
    while act is None and y not in graph.outputs and len(uses.get(y, [])) == 1:
        nxt = uses[y][0]
        if nxt.op in ("Add", "Sub") and nxt.inputs.count(y) == 1 and shapes[nxt.outputs[0]] == shapes[y]:
            other = nxt.inputs[1] if nxt.inputs[0] == y else nxt.inputs[0]
            if other in constants and not np.isfinite(constants[other]).all():
                break  # a mask of -inf stays a node: the layer's weights would not be finite (refused)
            vec = _as_bias(constants[other], shapes[y], channel_axis) if other in constants else None
            if nxt.op == "Sub" and nxt.inputs[0] != y:
                break  # c - y negates the anchor
            if vec is not None:
                vec = -vec if nxt.op == "Sub" else vec
                bias = vec if bias is None else bias + vec
            elif nxt.op == "Add" and not residual and shapes[other] == shapes[y]:
                residual = other
            else:
                break
        elif nxt.op == "Relu":
            act = "relu"
        elif nxt.op == "Clip" and all(i == "" or i in constants for i in nxt.inputs[1:]):
            lo = constants[nxt.inputs[1]].item() if len(nxt.inputs) > 1 and nxt.inputs[1] else -math.inf
            hi = constants[nxt.inputs[2]].item() if len(nxt.inputs) > 2 and nxt.inputs[2] else math.inf
            if lo == 0 and hi == 6:
                act = "relu6"
            elif lo == 0 and hi == math.inf:
                act = "relu"
            else:
                break
        else:
            break
        absorbed.append(nxt)
        y = nxt.outputs[0]
    if not absorbed:
        return anchor, []
    inputs = [data, weight]
    if bias is not None:
        if bias_name == "" or not np.array_equal(bias, constants[bias_name]):
            bias_name = _unique(f"{anchor.name}/bias", constants)
            constants[bias_name] = bias
            shapes[bias_name] = bias.shape
        inputs.append(bias_name)
    if residual:
        inputs.append(residual)
    new_task = dataclasses.replace(task, bias=bias is not None, act=act, residual=bool(residual))
    return Node(task.op, tuple(inputs), (y,), {"task": new_task}, anchor.name), absorbed


def fuse_epilogues(graph: Graph) -> Graph:
    """Fuse into each anchor the chain ``+bias (per-channel constant) -> +residual (same shape) ->
    relu | relu6`` that follows it, as long as each link is the only consumer of the previous one.

    The residual is added before the activation (conv -> +bias -> +residual -> act). Where both operands
    of a residual Add are anchors, the one with more FLOPs (the main path) takes it. The fused node sits
    where its last absorbed node was, after everything it reads.
    """
    constants, shapes = dict(graph.constants), dict(graph.shapes)
    nodes = list(graph.nodes)
    order = sorted((n for n in nodes if n.is_anchor), key=lambda n: -n.task.flops)
    for anchor in order:
        uses: dict[str, list[Node]] = {}
        for n in nodes:
            for i in n.inputs:
                if i:
                    uses.setdefault(i, []).append(n)
        fused, absorbed = _absorb(graph, anchor, uses, constants, shapes)
        if absorbed:
            at = nodes.index(absorbed[-1])
            nodes[at] = fused
            nodes = [n for n in nodes if n is not anchor and n not in absorbed[:-1]]
    return graph.replace(nodes=tuple(nodes), constants=constants, shapes=shapes)


def eliminate_dead(graph: Graph) -> Graph:
    """Drop nodes no graph output depends on, and the constants and shapes nobody references."""
    needed = set(graph.outputs)
    kept = []
    for node in reversed(graph.nodes):
        if any(o in needed for o in node.outputs):
            kept.append(node)
            needed.update(i for i in node.inputs if i)
    nodes = tuple(reversed(kept))
    live = needed | set(graph.inputs) | {o for n in nodes for o in n.outputs if o}
    return graph.replace(nodes=nodes, constants={k: v for k, v in graph.constants.items() if k in live},
                         shapes={k: v for k, v in graph.shapes.items() if k in live})


PASSES: tuple[tuple[str, Callable[[Graph], Graph]], ...] = (
    ("remove_identities", remove_identities),
    ("fold_constants", fold_constants),
    ("fold_batchnorm", fold_batchnorm),
    ("form_anchors", form_anchors),
    ("fuse_epilogues", fuse_epilogues),
    ("eliminate_dead", eliminate_dead),
)


def optimize(graph: Graph) -> Graph:
    """Run every pass of stage ② in order (see the module docstring)."""
    for _, run in PASSES:
        graph = run(graph)
    return graph


def extract_tasks(graph: Graph) -> list[tuple[Task, int]]:
    """The distinct anchor Tasks of ``graph`` in first-use order, each with its number of occurrences.

    Example:
        >>> extract_tasks(Graph((), (), (), {}, {}))
        []
    """
    counts = Counter(n.task for n in graph.anchors)
    return list(counts.items())
