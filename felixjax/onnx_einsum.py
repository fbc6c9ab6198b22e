"""Stage ① importer for ONNX ``Einsum``: canonical Transpose / Reshape / Gather / ReduceSum / MatMul nodes.

Exporters emit Einsum for attention scores, projections (``"bsd,df->bsf"``) and batched products
(jax2onnx for every ``jnp.einsum``, PyTorch for ``torch.einsum``). The equation is lowered once, at import:

1. each operand's subscripts are read, ``...`` expanded to broadcast labels aligned from the right;
2. a label repeated within one operand takes the diagonal (Transpose, Reshape, Gather of ``i * (n + 1)``);
3. a size-1 axis whose label is longer elsewhere is dropped (it broadcasts: the value is constant along
   that label, so it multiplies the other operands' sum over it or spreads along the output);
4. a label no other operand and not the output names is summed out (ReduceSum);
5. operands are contracted left to right, each pair as one batched MatMul: labels in both operands and
   still needed are batch axes, labels in both and no longer needed are the contraction, the rest are
   the matrix rows and columns (Transpose + Reshape around the MatMul);
6. a last Transpose puts the labels in the output's order.

A projection with constant weights becomes a plain 2-D MatMul with constant weights, which
``graph_passes.form_anchors`` turns into a tunable ``matmul`` task; activation x activation products stay
cheap nodes run by the numpy executor / C runtime.

Example:
    >>> labels, out = parse_equation("bij,bjk", [3, 3])
    >>> labels, out
    ([['b', 'i', 'j'], ['b', 'j', 'k']], ['i', 'k'])
    >>> parse_equation("...ii->...i", [3])
    ([['...0', 'i', 'i']], ['...0', 'i'])
"""
from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import TensorProto

from felixjax.errors import ModelFormatError
from felixjax.graph_passes import Node

__all__ = ["ATTRS", "IMPORTERS", "OPS", "EquationError", "check_model_equations", "check_syntax", "parse_equation"]


class EquationError(ValueError):
    """An Einsum equation that is malformed or does not fit its operands."""


_TERM = re.compile(r"[A-Za-z]*(\.\.\.)?[A-Za-z]*")


def check_syntax(equation: str) -> None:
    """Raise :class:`EquationError` unless ``equation`` is terms of letters with at most one ``...`` each,
    separated by commas, and at most one ``->``. Run before ONNX's own shape inference, which loops
    forever on some malformed ellipses (``"i..j->i"``, ``"...i...->i"``; onnx 1.17-1.19)."""
    eq = "".join(equation.split())
    lhs, _, rhs = eq.partition("->")
    for term in lhs.split(",") + ([rhs] if "->" in eq else []):
        if not _TERM.fullmatch(term):
            raise EquationError(f"term {term!r} is not letters a-z, A-Z with at most one '...'")


def check_model_equations(nodes: Sequence[Any]) -> None:
    """Raise ``ModelFormatError`` naming the first Einsum node (ONNX NodeProto) whose equation is malformed."""
    for k, node in enumerate(nodes):
        if node.op_type == "Einsum" and node.domain in ("", "ai.onnx"):
            eq = next((a.s.decode(errors="replace") for a in node.attribute if a.name == "equation"), "")
            try:
                check_syntax(eq)
            except EquationError as e:
                raise ModelFormatError(f"node {node.name or f'Einsum_{k}'!r} (op Einsum): equation {eq!r}: {e}") \
                    from None


def _term(text: str, rank: int, ellipsis_rank: int | None) -> list[str]:
    """The labels of one subscript term; ``...`` becomes ``ellipsis_rank`` labels ``...k`` (right-aligned)."""
    head, dots, tail = text.partition("...")  # (check_syntax ran: letters and at most one "...")
    if not dots:
        if rank >= 0 and len(text) != rank:
            raise EquationError(f"term {text!r} names {len(text)} axes of a rank-{rank} operand")
        return list(text)
    e = rank - len(head) - len(tail) if rank >= 0 else ellipsis_rank
    if e is None or e < 0:
        raise EquationError(f"term {text!r} names more axes than its rank-{rank} operand has")
    total = e if ellipsis_rank is None else ellipsis_rank
    return list(head) + [f"...{total - e + k}" for k in range(e)] + list(tail)


def parse_equation(equation: str, ranks: Sequence[int]) -> tuple[list[list[str]], list[str]]:
    """Each operand's labels and the output's labels of ``equation`` (spaces ignored; implicit output:
    the broadcast labels, then the letters named exactly once, sorted)."""
    check_syntax(equation)
    eq = "".join(equation.split())
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise EquationError(f"it has {len(terms)} operand terms for {len(ranks)} inputs")
    width = max([r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t], default=0)
    labels = [_term(t, r, width) for t, r in zip(terms, ranks)]
    if arrow:
        if "-" in rhs or ">" in rhs or "," in rhs:
            raise EquationError(f"the output term {rhs!r} is malformed")
        if "..." not in rhs and width:
            raise EquationError("the inputs' '...' axes need a '...' in the output")
        out = _term(rhs, -1, width)
        if len(set(out)) != len(out):
            raise EquationError("the output names a label twice")
        missing = [x for x in out if not any(x in lab for lab in labels)]
        if missing:
            raise EquationError(f"output label {missing[0]!r} names no input axis")
    else:
        count = Counter(x for lab in labels for x in lab if not x.startswith("..."))
        out = [f"...{k}" for k in range(width)] + sorted(x for x, c in count.items() if c == 1)
    return labels, out


@dataclass
class _Operand:
    name: str
    labels: list[str]
    shape: list[int]


class _Lowering:
    """Emits the canonical nodes of one Einsum node, tracking each intermediate's labels and shape."""

    def __init__(self, ctx: Any) -> None:
        self.ctx, self.nodes = ctx, []

    def emit(self, op: str, x: str, attrs: dict, shape: Sequence[int], out: str | None = None) -> str:
        name = out or self.ctx.fresh(op.lower())
        if out is None:
            self.ctx.types[name] = (TensorProto.FLOAT, tuple(int(d) for d in shape))
        inputs = [x] if isinstance(x, str) else list(x)
        self.nodes.append(Node(op, tuple(inputs), (name,), attrs, self.ctx.name))
        return name

    def transpose(self, a: _Operand, order: list[str]) -> _Operand:
        perm = tuple(a.labels.index(x) for x in order)
        if perm == tuple(range(len(perm))):
            return a
        shape = [a.shape[p] for p in perm]
        return _Operand(self.emit("Transpose", a.name, {"perm": perm}, shape), list(order), shape)

    def reshape(self, name: str, old: Sequence[int], new: Sequence[int]) -> str:
        return name if tuple(old) == tuple(new) else self.emit("Reshape", name, {"shape": tuple(new)}, new)

    def diagonal(self, a: _Operand) -> _Operand:
        """Take the diagonal of every label ``a`` names twice or more."""
        while len(set(a.labels)) != len(a.labels):
            label = next(x for x in a.labels if a.labels.count(x) > 1)
            p = a.labels.index(label)
            q = a.labels.index(label, p + 1)
            n = a.shape[p]
            if a.shape[q] != n:
                raise EquationError(f"label {label!r} names axes of sizes {n} and {a.shape[q]}")
            order = [x for i, x in enumerate(a.labels) if i != q]
            idx = [i for i in range(len(a.labels)) if i != q]
            idx.insert(p + 1, q)
            moved = self.transpose(_Operand(a.name, [f"#{i}" for i in range(len(a.labels))], a.shape),
                                   [f"#{i}" for i in idx])
            merged = moved.shape[:p] + [n * n] + moved.shape[p + 2:]
            flat = self.reshape(moved.name, moved.shape, merged)
            shape = moved.shape[:p] + [n] + moved.shape[p + 2:]
            taken = self.emit("Gather", flat, {"axis": p, "indices": np.arange(n, dtype=np.int64) * (n + 1)}, shape)
            a = _Operand(taken, order, shape)
        return a

    def drop(self, a: _Operand, labels: set[str]) -> _Operand:
        """Remove size-1 axes (broadcast labels) by a Reshape."""
        keep = [i for i, x in enumerate(a.labels) if x not in labels]
        if len(keep) == len(a.labels):
            return a
        shape = [a.shape[i] for i in keep]
        return _Operand(self.reshape(a.name, a.shape, shape), [a.labels[i] for i in keep], shape)

    def reduce(self, a: _Operand, labels: set[str]) -> _Operand:
        """Sum out ``labels``."""
        axes = tuple(i for i, x in enumerate(a.labels) if x in labels)
        if not axes:
            return a
        keep = [i for i in range(len(a.labels)) if i not in axes]
        shape = [a.shape[i] for i in keep]
        name = self.emit("ReduceSum", a.name, {"axes": axes, "keepdims": 0}, shape)
        return _Operand(name, [a.labels[i] for i in keep], shape)

    def contract(self, a: _Operand, b: _Operand, needed: set[str]) -> _Operand:
        """One batched MatMul of ``a`` and ``b`` keeping the labels in ``needed``."""
        a = self.reduce(a, {x for x in a.labels if x not in b.labels and x not in needed})
        b = self.reduce(b, {x for x in b.labels if x not in a.labels and x not in needed})
        batch = [x for x in a.labels if x in b.labels and x in needed]
        k = [x for x in a.labels if x in b.labels and x not in needed]
        m = [x for x in a.labels if x not in b.labels]
        n = [x for x in b.labels if x not in a.labels]
        size = {**dict(zip(b.labels, b.shape)), **dict(zip(a.labels, a.shape))}  # (_einsum checked they agree)
        bs = [size[x] for x in batch]
        pm, pk, pn = (math.prod(size[x] for x in g) for g in (m, k, n))
        at = self.transpose(a, batch + m + k)
        bt = self.transpose(b, batch + k + n)
        a2 = self.reshape(at.name, at.shape, bs + [pm, pk])
        b2 = self.reshape(bt.name, bt.shape, bs + [pk, pn])
        y = self.emit("MatMul", [a2, b2], {}, bs + [pm, pn])
        shape = bs + [size[x] for x in m + n]
        return _Operand(self.reshape(y, bs + [pm, pn], shape), batch + m + n, shape)


def _einsum(ctx: Any) -> list[Node]:
    if "equation" not in ctx.attrs:
        ctx.fail("the equation attribute is required")
    if not ctx.inputs or not all(ctx.inputs):
        ctx.fail("needs at least one input")
    shapes = [list(ctx.shape(x)) for x in ctx.inputs]
    try:
        labels, out = parse_equation(str(ctx.attrs["equation"]), [len(s) for s in shapes])
        low = _Lowering(ctx)
        ops = [low.diagonal(_Operand(x, lab, s)) for x, lab, s in zip(ctx.inputs, labels, shapes)]
        sizes: dict[str, int] = {}
        for o in ops:
            for x, d in zip(o.labels, o.shape):
                if d != 1 and sizes.get(x, 1) not in (1, d):
                    raise EquationError(f"label {x!r} names axes of sizes {sizes[x]} and {d}")
                sizes[x] = max(sizes.get(x, 1), d)
        ops = [low.drop(o, {x for x, d in zip(o.labels, o.shape) if d == 1 and sizes[x] > 1}) for o in ops]
        wanted = set(out)
        for i, o in enumerate(ops):
            elsewhere = {x for j, p in enumerate(ops) if j != i for x in p.labels}
            ops[i] = low.reduce(o, {x for x in o.labels if x not in elsewhere and x not in wanted})
        acc = ops[0]
        for j in range(1, len(ops)):
            later = {x for p in ops[j + 1:] for x in p.labels}
            other = ops[j]
            if acc.name in ctx.consts and other.name not in ctx.consts:  # weights second: a MatMul anchor (tunable)
                acc, other = other, acc
            acc = low.contract(acc, other, wanted | later)
        acc = low.transpose(acc, out)
    except EquationError as e:
        raise ModelFormatError(f"node {ctx.name!r} (op Einsum): equation {ctx.attrs['equation']!r}: {e}") from None
    expected = ctx.static_shape(ctx.outputs[0])
    if expected is None:  # ONNX's inference left it open (e.g. an implicit scalar output): ours is exact
        ctx.types[ctx.outputs[0]] = (ctx.types.get(ctx.outputs[0], (TensorProto.FLOAT,))[0], tuple(acc.shape))
    elif tuple(expected) != tuple(acc.shape):  # ONNX's inference takes a size-1 first operand's size for a label
        # that broadcasts (onnxruntime computes ours); the shapes it inferred after this node are wrong too
        ctx.fail(f"the equation gives shape {tuple(acc.shape)}, ONNX's shape inference says {expected} (a size-1 "
                 f"axis broadcast against a longer one: list the operand with the longer axis first, or expand it)")
    # the last node writes the Einsum's output (an Identity where the lowering is empty)
    if low.nodes and low.nodes[-1].outputs == (acc.name,):
        last = low.nodes.pop()
        low.nodes.append(Node(last.op, last.inputs, (ctx.outputs[0],), last.attrs, last.name))
    else:
        low.nodes.append(Node("Identity", (acc.name,), (ctx.outputs[0],), {}, ctx.name))
    return low.nodes


OPS = ("Einsum",)
ATTRS: dict[str, set[str]] = {"Einsum": {"equation"}}
IMPORTERS = {"Einsum": _einsum}
