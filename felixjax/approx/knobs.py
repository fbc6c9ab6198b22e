"""Approximation knobs of a fused graph: which channels can be pruned together, and pruning them.

**Channel groups.** Every conv2d (``groups == 1``) and dense anchor creates the channels of its output.
Channels that must disappear together form one group: a residual add (fused or not) ties its two
operands' channels, a depthwise conv passes its input's channels through, a concatenation lays groups
side by side (segments), a flatten repeats each channel ``H * W`` times (``inner``). Consumers follow:
a conv's or a dense's input channels are sliced with their producer's group. A group that reaches an
op this analysis does not understand (a Softmax over channels, a transpose, a graph output, ...) is
*frozen* with the reason: it keeps every channel.

**Ranking.** A group's channels are ranked by the summed L1 norms of their filters in every producing
anchor (``Groups.ranking``); keeping ``n`` channels keeps the ``n`` first (the top filters by norm).

Example:
    >>> import felixjax as fj
    >>> m = fj.load_onnx(fj.zoo.make_model("resnet18", dataset="cifar10"))
    >>> g = analyze(m.graph)
    >>> sizes = sorted(g.size(k) for k in g.prunable())
    >>> len(sizes), sizes[:3]
    (12, [64, 64, 64])
    >>> pruned = prune(m.graph, g, {k: g.size(k) // 2 for k in g.prunable()})
    >>> pruned.nodes[0].task.output_shape
    (1, 32, 32, 32)
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from codegen import ops
from felixjax.graph_passes import Graph, Node

#: ops applied channel by channel: the output keeps the input's channel layout
PASS_THROUGH = ("Relu", "Clip", "Sigmoid", "Tanh", "LeakyRelu", "HardSwish", "HardSigmoid", "Identity", "Dropout",
                "Elu", "Gelu", "Erf", "Sqrt", "Exp", "Neg", "Abs", "Softplus", "MaxPool", "AveragePool",
                "ScaleShift", "BatchNormalization", "PRelu")
BINARY = ("Add", "Sub", "Mul", "Div", "Max", "Min")

Segment = tuple[int, int]  # (group id, channels)


@dataclass(frozen=True)
class Layout:
    """The channel axis (axis 1) of a value: groups side by side, each channel repeated ``inner`` times."""

    segments: tuple[Segment, ...]
    inner: int = 1

    @property
    def channels(self) -> int:
        return sum(s for _, s in self.segments) * self.inner


@dataclass
class Groups:
    """The channel groups of a graph (see the module docstring)."""

    layouts: dict[str, Layout] = field(default_factory=dict)
    sizes: dict[int, int] = field(default_factory=dict)
    producers: dict[int, list[tuple[str, int]]] = field(default_factory=dict)  # group -> (anchor, first filter)
    frozen: dict[int, str] = field(default_factory=dict)            # group -> why it keeps every channel
    parent: dict[int, int] = field(default_factory=dict)
    ranking: dict[int, np.ndarray] = field(default_factory=dict)    # group -> channel order, best first

    def find(self, g: int) -> int:
        while self.parent[g] != g:
            self.parent[g] = self.parent[self.parent[g]]
            g = self.parent[g]
        return g

    def size(self, g: int) -> int:
        return self.sizes[self.find(g)]

    def prunable(self) -> list[int]:
        """Root ids of the groups that may lose channels, in creation order."""
        roots = sorted({self.find(g) for g in self.parent})
        return [g for g in roots if g not in self.frozen]

    def is_frozen(self, g: int) -> bool:
        return self.find(g) in self.frozen

    def group_of(self, anchor_name: str) -> int | None:
        """The (root) group an anchor's output channels belong to, or None."""
        for g, made in self.producers.items():
            if any(name == anchor_name for name, _ in made):
                return self.find(g)
        return None

    # ---- building ---------------------------------------------------------------------------
    def new(self, size: int, producer: str) -> int:
        g = len(self.parent)
        self.parent[g], self.sizes[g], self.producers[g] = g, size, [(producer, 0)]
        return g

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        if self.sizes[ra] != self.sizes[rb]:
            self.freeze_group(ra, "tied to a group of another size")
            self.freeze_group(rb, "tied to a group of another size")
            return
        lo, hi = min(ra, rb), max(ra, rb)
        self.parent[hi] = lo
        self.producers[lo] = self.producers.get(lo, []) + self.producers.pop(hi, [])
        reason = self.frozen.pop(hi, None) or self.frozen.get(lo)
        if reason:
            self.frozen[lo] = reason

    def freeze_group(self, g: int, reason: str) -> None:
        self.frozen.setdefault(self.find(g), reason)

    def freeze(self, layout: Layout | None, reason: str) -> None:
        for g, _ in (layout.segments if layout else ()):
            self.freeze_group(g, reason)

    def unify(self, a: Layout | None, b: Layout | None, reason: str) -> Layout | None:
        """Tie two layouts that are added / multiplied element by element."""
        if a is None or b is None or a.inner != b.inner or [s for _, s in a.segments] != [s for _, s in b.segments]:
            self.freeze(a, reason)
            self.freeze(b, reason)
            return None
        for (ga, _), (gb, _) in zip(a.segments, b.segments):
            self.union(ga, gb)
        return a

    # ---- indices ----------------------------------------------------------------------------
    def kept(self, layout: Layout, keep: Mapping[int, int]) -> np.ndarray:
        """Indices kept along axis 1 of a value with ``layout`` when group ``g`` keeps ``keep[g]``."""
        parts, offset = [], 0
        for g, size in layout.segments:
            r = self.find(g)
            n = keep.get(r, size) if r not in self.frozen else size
            parts.append(offset + np.sort(self.ranking[r][:n]) if n < size else offset + np.arange(size))
            offset += size
        idx = np.concatenate(parts) if parts else np.arange(0)
        if layout.inner > 1:
            idx = (idx[:, None] * layout.inner + np.arange(layout.inner)[None, :]).reshape(-1)
        return idx


def analyze(graph: Graph) -> Groups:
    """The channel groups of a fused graph and the L1 ranking of each group's channels."""
    gr = Groups()
    lay = gr.layouts
    consts = graph.constants
    for node in graph.nodes:
        ins = [lay.get(i) if i else None for i in node.inputs]
        out = node.outputs[0]
        if node.is_anchor:
            _anchor(gr, node, ins, graph)
        elif node.op in PASS_THROUGH:
            params = [i for i in node.inputs[1:] if i]
            if ins[0] is not None and all(p in consts for p in params):
                lay[out] = ins[0]
            else:
                gr.freeze(ins[0], f"{node.op} {node.name!r} with non-constant parameters")
        elif node.op in BINARY:
            a, b = node.inputs[:2]
            if a in consts or b in consts:
                c, v = (a, ins[1]) if a in consts else (b, ins[0])
                if v is not None and _channel_const(consts[c].shape, graph.shapes[out]) is not None:
                    lay[out] = v
                else:
                    gr.freeze(v, f"{node.op} {node.name!r} with a constant of shape {consts[c].shape}")
            elif graph.shapes[a] == graph.shapes[b]:
                u = gr.unify(ins[0], ins[1], f"{node.op} {node.name!r} with an operand of unknown channels")
                if u is not None:
                    lay[out] = u
            else:
                gr.freeze(ins[0], f"broadcasting {node.op} {node.name!r}")
                gr.freeze(ins[1], f"broadcasting {node.op} {node.name!r}")
        elif node.op == "Concat" and node.attrs["axis"] == 1 and all(l is not None and l.inner == 1 for l in ins):
            lay[out] = Layout(tuple(s for l in ins for s in l.segments))
        elif node.op in ("ReduceMean", "ReduceSum", "ReduceMax") and ins[0] is not None \
                and 1 not in node.attrs["axes"] and ins[0].inner == 1 \
                and (node.attrs["keepdims"] or tuple(node.attrs["axes"]) == tuple(range(2, len(graph.shapes[node.inputs[0]])))):
            lay[out] = ins[0]
        elif node.op == "Reshape" and ins[0] is not None and ins[0].inner == 1:
            s_in, s_out = graph.shapes[node.inputs[0]], tuple(node.attrs["shape"])
            if len(s_out) == 2 and s_out[0] == s_in[0] and s_out[1] == math.prod(s_in[1:]):
                lay[out] = Layout(ins[0].segments, math.prod(s_in[2:]))
            else:
                gr.freeze(ins[0], f"Reshape {node.name!r} to {s_out}")
        else:
            for l in ins:
                gr.freeze(l, f"{node.op} {node.name!r} reads the channels")
    for o in graph.outputs:
        gr.freeze(lay.get(o), f"graph output {o!r}")
    _rank(gr, graph)
    return gr


def _channel_const(cshape: tuple, vshape: tuple) -> int | None:
    """Axis of a broadcast constant that runs along the channels (-1: none, it broadcasts), or None."""
    rank = len(vshape)
    full = (1,) * (rank - len(cshape)) + tuple(cshape)
    others = [d for k, d in enumerate(full) if k != 1]
    if any(d != 1 for d in others):
        return None
    return 1 if full[1] != 1 else -1


def _anchor(gr: Groups, node: Node, ins: list, graph: Graph) -> None:
    task, out, lay = node.task, node.outputs[0], gr.layouts
    res = ins[-1] if task.residual else None
    p = task.p
    if task.op == "conv2d" and p["groups"] == 1 or task.op == "dense":
        k = task.output_shape[1]
        if task.op == "dense" and len(graph.shapes[out]) != 2:
            gr.freeze(ins[0], f"dense {node.name!r} on a rank-{len(graph.shapes[out])} value")
            return
        if res is not None and res.inner == 1 and len(res.segments) > 1 and res.channels == k:
            # the residual's channels are several groups side by side (a concat): this anchor's filters
            # join those groups, segment by segment
            offset = 0
            for g, size in res.segments:
                gr.producers[gr.find(g)].append((node.name, offset))
                offset += size
            lay[out] = res
            return
        mine = Layout(((gr.new(k, node.name), k),))
        if task.residual:
            mine = gr.unify(mine, res, f"residual of {node.name!r}")
            if mine is None:
                return
        lay[out] = mine
    elif task.op == "conv2d" and p["groups"] == p["c"] == p["k"] and ins[0] is not None and ins[0].inner == 1:
        lay[out] = ins[0]  # depthwise: channel c in, channel c out
        if task.residual:
            u = gr.unify(ins[0], res, f"residual of {node.name!r}")
            if u is None:
                lay.pop(out)
    else:
        gr.freeze(ins[0], f"{task.op} {node.name!r} ({task.name}) reads the channels")
        gr.freeze(res, f"residual of {node.name!r}")


def _rank(gr: Groups, graph: Graph) -> None:
    by_name = {n.name: n for n in graph.nodes}
    score: dict[int, np.ndarray] = {}
    for g, made in gr.producers.items():
        r = gr.find(g)
        for name, offset in made:
            w = graph.constants[by_name[name].inputs[1]][offset: offset + gr.sizes[r]]
            l1 = np.abs(w.reshape(w.shape[0], -1)).sum(axis=1)
            score[r] = score.get(r, 0) + l1 / (l1.mean() + 1e-12)  # each producer counts equally
    for g in {gr.find(g) for g in gr.parent}:
        gr.ranking[g] = np.argsort(-score.get(g, np.zeros(gr.sizes[g])), kind="stable")


def prune(graph: Graph, groups: Groups, keep: Mapping[int, int]) -> Graph:
    """A smaller graph: group ``g`` keeps its ``keep[g]`` best channels (by L1 norm); consumers follow.

    Raises:
        ValueError: a count outside ``1..size`` or a frozen group asked to shrink.
    """
    keep = {groups.find(g): int(n) for g, n in keep.items()}
    for g, n in keep.items():
        if not 1 <= n <= groups.sizes[g]:
            raise ValueError(f"channel group {g} has {groups.sizes[g]} channels; cannot keep {n}")
        if g in groups.frozen and n < groups.sizes[g]:
            raise ValueError(f"channel group {g} is frozen ({groups.frozen[g]}); it keeps every channel")
    idx = {v: groups.kept(l, keep) for v, l in groups.layouts.items()}
    shapes, consts = dict(graph.shapes), dict(graph.constants)
    for v, i in idx.items():
        s = list(shapes[v])
        s[1] = len(i)
        shapes[v] = tuple(s)

    def const(name: str, owner: Node, value: np.ndarray) -> str:
        new = f"{owner.name}/{name}:pruned"
        consts[new] = np.ascontiguousarray(value, dtype=np.float32)
        shapes[new] = consts[new].shape
        return new

    nodes = []
    for node in graph.nodes:
        o = node.outputs[0]
        if node.is_anchor and (o in idx or node.inputs[0] in idx):
            nodes.append(_prune_anchor(node, idx, shapes, graph, const))
        elif node.op in PASS_THROUGH + BINARY and o in idx:
            inputs = list(node.inputs)
            for k, name in enumerate(inputs):
                if name in graph.constants and name not in idx:
                    c = graph.constants[name]
                    if node.op in ("ScaleShift", "BatchNormalization", "PRelu") and c.ndim == 1:
                        inputs[k] = const(f"p{k}", node, c[idx[o]])
                    elif _channel_const(c.shape, graph.shapes[o]) == 1:
                        rank = len(graph.shapes[o])
                        full = c.reshape((1,) * (rank - c.ndim) + c.shape)
                        cax = c.ndim - (rank - 1)  # the channel axis inside c
                        sliced = np.take(full, idx[o], axis=1)
                        inputs[k] = const(f"p{k}", node, sliced.reshape(
                            tuple(len(idx[o]) if j == cax else d for j, d in enumerate(c.shape))))
            nodes.append(dataclasses.replace(node, inputs=tuple(inputs)))
        elif node.op == "Reshape" and o in idx:
            nodes.append(dataclasses.replace(node, attrs={**node.attrs, "shape": shapes[o]}))
        else:
            nodes.append(node)
    out = graph.replace(nodes=tuple(nodes), shapes=shapes, constants=consts)
    from felixjax.graph_passes import eliminate_dead
    return eliminate_dead(out)


def _prune_anchor(node: Node, idx: Mapping[str, np.ndarray], shapes: dict, graph: Graph, const) -> Node:
    task, p = node.task, node.task.p
    out_i, in_i = idx.get(node.outputs[0]), idx.get(node.inputs[0])
    w = graph.constants[node.inputs[1]]
    inputs = list(node.inputs)
    depthwise = task.op == "conv2d" and p["groups"] > 1
    if depthwise:
        w = w[in_i] if in_i is not None else w
    else:
        w = w[out_i] if out_i is not None else w
        w = w[:, in_i] if in_i is not None else w
    inputs[1] = const("w", node, w)
    if task.bias:
        b = graph.constants[node.inputs[2]]
        sel = in_i if depthwise else out_i
        inputs[2] = const("b", node, b[sel] if sel is not None else b)
    k = w.shape[0]
    if task.op == "conv2d":
        n, c, h, wd = shapes[node.inputs[0]]
        new = ops.conv2d(n, c, h, wd, out_channels=k, kernel=(p["r"], p["s"]), stride=p["stride"], padding=p["pad"],
                         dilation=p["dilation"], groups=c if depthwise else 1, bias=task.bias, act=task.act,
                         residual=task.residual)
    else:
        new = ops.dense(p["n"], w.shape[1], k, bias=task.bias, act=task.act, residual=task.residual)
    return dataclasses.replace(node, inputs=tuple(inputs), attrs={**node.attrs, "task": new})


def mask_vector(groups: Groups, layout: Layout, masks: Mapping[int, object], xp: object = np) -> object:
    """The per-channel mask of a value (``masks[g]``: a vector in *ranking* order -> channel order)."""
    parts = []
    for g, size in layout.segments:
        r = groups.find(g)
        m = masks.get(r) if r not in groups.frozen else None
        if m is None:
            parts.append(xp.ones(size))
        else:
            inv = np.argsort(groups.ranking[r])  # channel c sits at rank inv[c]
            parts.append(xp.take(m, inv))
    v = xp.concatenate(parts)
    return xp.repeat(v, layout.inner) if layout.inner > 1 else v
