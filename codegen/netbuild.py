"""Whole-network C build: one C library for a whole model, from a neutral description of its steps.

The description (:class:`NetSpec`) knows nothing of ONNX or of felixjax's graph records; the front end
fills it in. It is a list of *values* (graph inputs, constants, intermediates, each with a static shape)
and a list of *steps* in execution order:

* ``Step("kernel", ..., plan=plan)``: an anchor, i.e. a tuned (or default) contraction kernel lowered to
  a :class:`~codegen.lower.Plan`. Its inputs follow the Task order (data, weight, [bias], [residual]); the
  weight must be a constant, which is packed once into the kernel's layout (as at inference).
* a cheap op by name (:data:`CHEAP_OPS`): numpy semantics, broadcasting included; each gets a small
  generated C function with every shape baked in. The attributes are those of the canonical node forms
  (``felixjax.graph_passes``): e.g. ``MaxPool`` takes ``kernel``, ``strides``, ``dilations``, ``pads``
  (top, left, bottom, right); ``Softmax`` ``axes`` (a contiguous range); ``Pad`` ``pads`` (before, after)
  per dimension, possibly negative.

:func:`emit` turns a spec into a :class:`NetSource`: one self-contained C file, a weights blob (packed
kernel weights and the other constants, 64-byte aligned entries) and a static memory plan. Intermediates
live in one arena, placed by liveness (first fit over values whose lifetimes overlap), so a step's
outputs never overlap its inputs; only ``Reshape`` may alias its input (when its output is not a graph
output). Graph outputs are written directly into the caller's buffers.

The C interface of every build::

    int    fj_model_init(const float* weights);                    // keeps the pointer; 0 = ok
    int    fj_model_run(const float* const* inputs, float* const* outputs);
    int    fj_model_run_with(const float* weights, float* arena,   // re-entrant: caller-owned arena
                             const float* const* inputs, float* const* outputs);
    double fj_model_time_with(const float* weights, float* arena, const float* const* inputs,
                              float* const* outputs, long number);  // seconds for `number` runs
    void   fj_model_profile_with(const float* weights, float* arena, const float* const* inputs,
                                 float* const* outputs, double* seconds);  // += seconds of every step
    long   fj_model_arena_floats(void);
    void   fj_model_set_threads(int n);

:func:`load` compiles it (``codegen.build``) and returns a callable :class:`NetLibrary`; :func:`export`
writes a standalone folder (``model.c``, ``model.h``, ``main.c``, ``Makefile``, ``weights.bin``,
``README.txt``) that builds with ``make`` and nothing but a C compiler.

Every C identifier is generated here (``fj_k3``, ``fj_s12``); no name from the model reaches the source.

Example:
    >>> import numpy as np
    >>> spec = NetSpec(values=(Value((2, 3), "input"), Value((3,), "const", np.ones(3, np.float32)),
    ...                        Value((2, 3), "temp"), Value((2, 3), "temp")),
    ...                inputs=(0,), outputs=(3,),
    ...                steps=(Step("Add", (0, 1), (2,)), Step("Relu", (2,), (3,))))
    >>> net = load(emit(spec))
    >>> net([np.array([[-3, 0, 1], [2, -1, 5]], np.float32)])[0]
    array([[0., 1., 2.],
           [3., 0., 6.]], dtype=float32)
"""
from __future__ import annotations

import ctypes
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .build import DEFAULT_FLAGS, build
from .lower import Plan
from .render_c import _Writer, render_kernel

ALIGN = 16  # floats: 64-byte alignment of arena and weight entries
PARALLEL_MIN = 1 << 15  # elements (or multiply-adds) below which a cheap op runs on one thread

ELEMENTWISE_BINARY = {"Add": "{0} + {1}", "Sub": "{0} - {1}", "Mul": "{0} * {1}", "Div": "{0} / {1}",
                      "Pow": "powf({0}, {1})"}
ELEMENTWISE_UNARY = {"Sqrt": "sqrtf({0})", "Relu": "fj_relu({0})", "Sigmoid": "fj_sigmoid({0})",
                     "Tanh": "tanhf({0})", "Erf": "fj_erf({0})", "Identity": "{0}", "Dropout": "{0}"}
CHEAP_OPS = tuple(ELEMENTWISE_BINARY) + tuple(ELEMENTWISE_UNARY) + (
    "Clip", "ScaleShift", "BatchNormalization", "LayerNormalization", "ReduceMean", "MaxPool", "AveragePool",
    "Softmax", "Transpose", "Concat", "Pad", "Reshape", "Conv", "Gemm", "MatMul")
VALUE_KINDS = ("input", "const", "temp")

_PRELUDE = """\
#include <math.h>
#include <stddef.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static inline float fj_relu(float x) { return x < 0.0f ? 0.0f : x; }  /* NaN passes, as in numpy */
static inline float fj_max(float a, float b) { return a < b ? b : a; }
static inline float fj_min(float a, float b) { return a > b ? b : a; }
static inline float fj_erf(float x) {
    /* rational approximation on [-4, 4] (as XLA's ErfImpl32): <= 4.5e-7 relative error, vectorizable */
    const float a = x < -4.0f ? -4.0f : (x > 4.0f ? 4.0f : x);
    const float x2 = a * a;
    float p = -2.72614225801306e-10f;
    p = p * x2 + 2.77068142495902e-08f;
    p = p * x2 + -2.10102402082508e-06f;
    p = p * x2 + -5.69250639462346e-05f;
    p = p * x2 + -7.34990630326855e-04f;
    p = p * x2 + -2.95459980854025e-03f;
    p = p * x2 + -1.60960333262415e-02f;
    float q = -1.45660718464996e-05f;
    q = q * x2 + -2.13374055278905e-04f;
    q = q * x2 + -1.68282697438203e-03f;
    q = q * x2 + -7.37332916720468e-03f;
    q = q * x2 + -1.42647390514189e-02f;
    return a * p / q;
}
static inline float fj_exp(float x) {
    /* Cephes-style expf: 2^n * p(r), |r| <= ln2/2; < 1e-7 relative error, vectorizable (no libm call) */
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  /* round to nearest */
    const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int bits = ((int)n + 127) << 23;
    float scale;
    __builtin_memcpy(&scale, &bits, 4);
    return p * scale;
}
static inline float fj_sigmoid(float x) {
    const float e = fj_exp(x < 0.0f ? x : -x);  /* exp(-|x|) <= 1: no overflow either way */
    return x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}
"""


class NetBuildError(ValueError):
    """The spec cannot be built: an unknown op, a malformed step, an unsupported attribute value."""


# ----------------------------------------------------------------------------------------------
# The neutral description
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Value:
    """A tensor of the network: a graph ``input``, a ``const`` (with its float32 ``data``) or a ``temp``
    (an intermediate or output, produced by exactly one step)."""

    shape: tuple[int, ...]
    kind: str
    data: np.ndarray | None = None

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True, eq=False)
class Step:
    """``outputs = op(inputs)``; inputs and outputs are value ids (``None`` marks an absent optional
    input or an output nobody reads). ``plan`` is set for ``op == "kernel"``; ``label`` only appears in
    Python error messages, never in the C source."""

    op: str
    inputs: tuple[int | None, ...]
    outputs: tuple[int | None, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    plan: Plan | None = None
    label: str = ""

    def where(self) -> str:
        return f"step {self.label or self.op!r} ({'kernel ' + self.plan.space.task.name if self.plan else self.op})"


@dataclass(frozen=True, eq=False)
class NetSpec:
    """A network as values and steps (see the module docstring). ``inputs`` / ``outputs`` are value ids
    in the order of the C entry point's arrays."""

    values: tuple[Value, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    steps: tuple[Step, ...]


# ----------------------------------------------------------------------------------------------
# Static memory plan
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MemoryPlan:
    """Where every value lives.

    Attributes:
        arena_floats: size of the intermediate arena.
        where: value id -> ``("input", i)``, ``("output", j)``, ``("const", offset in the weights blob)``,
            ``("arena", offset)`` or ``("alias", value id)`` (a Reshape that shares its input's storage).
        scratch: step index -> arena offset of the step's private workspace (kernels, layer norm).
        lifetimes: arena-placed item -> (first step, last step), for checks. Items are value ids, or
            ``("scratch", step)``.
        packed: (weight value id, step index) -> offset of the kernel-packed copy in the weights blob.
        weight_floats: size of the weights blob.
        copies: (output index, value id) pairs copied into the caller's buffer after the last step
            (outputs that are inputs, constants or repeated).
    """

    arena_floats: int
    where: dict[int, tuple[str, int]]
    scratch: dict[int, int]
    lifetimes: dict[Any, tuple[int, int]]
    placement: dict[Any, tuple[int, int]]  # item -> (offset, floats)
    packed: dict[tuple[int, int], int]
    weight_floats: int
    copies: tuple[tuple[int, int], ...]

    def root(self, v: int) -> int:
        while self.where[v][0] == "alias":
            v = self.where[v][1]
        return v


def _round_up(n: int) -> int:
    return -(-max(int(n), 0) // ALIGN) * ALIGN


def _scratch_floats(step: Step, values: Sequence[Value]) -> int:
    if step.op == "kernel":
        return step.plan.workspace
    if step.op == "LayerNormalization":
        x = values[step.inputs[0]]
        return 4 * math.prod(x.shape[: step.attrs["axis"]])  # mean and 1/std per row, as doubles
    return 0


def plan_memory(spec: NetSpec) -> MemoryPlan:
    """The static memory plan of a spec (see :class:`MemoryPlan`). Pure; raises NetBuildError on a
    malformed spec (a value produced twice, read before it is produced, an unknown id)."""
    values, n = spec.values, len(spec.values)
    where: dict[int, tuple[str, int]] = {}
    for i, v in enumerate(spec.inputs):
        if values[v].kind != "input":
            raise NetBuildError(f"graph input {i} is value {v} of kind {values[v].kind!r}, not 'input'")
        where[v] = ("input", i)
    out_slot: dict[int, int] = {}
    copies: list[tuple[int, int]] = []
    producer: dict[int, int] = {}
    for s, step in enumerate(spec.steps):
        for o in step.outputs:
            if o is None:
                continue
            if not 0 <= o < n or values[o].kind != "temp":
                raise NetBuildError(f"{step.where()}: output {o} is not a temp value")
            if o in producer:
                raise NetBuildError(f"{step.where()}: value {o} is already produced by step {producer[o]}")
            producer[o] = s
    for j, v in enumerate(spec.outputs):
        if values[v].kind == "temp" and v in producer and v not in out_slot:
            out_slot[v] = j
        else:
            copies.append((j, v))
    # weights blob: raw constants read by cheap ops (or copied out), kernel-packed weights per step
    weight_floats = 0
    packed: dict[tuple[int, int], int] = {}
    packed_by_layout: dict[tuple[int, Any], int] = {}
    raw_needed = {v for _, v in copies if values[v].kind == "const"}
    for s, step in enumerate(spec.steps):
        for k, i in enumerate(step.inputs):
            if i is None:
                continue
            if not 0 <= i < n:
                raise NetBuildError(f"{step.where()}: input {i} is not a value id")
            if values[i].kind == "temp" and producer.get(i, s) >= s:
                raise NetBuildError(f"{step.where()}: input value {i} is read before it is produced")
            if step.op == "kernel" and k == 1:
                if values[i].kind != "const":
                    raise NetBuildError(f"{step.where()}: kernel weights must be a constant")
                layout = step.plan.buffers["weight"].layout
                key = (i, layout)
                if key not in packed_by_layout:
                    packed_by_layout[key] = weight_floats
                    weight_floats += _round_up(layout.size)
                packed[(i, s)] = packed_by_layout[key]
            elif values[i].kind == "const":
                raw_needed.add(i)
    for v in sorted(raw_needed):
        where[v] = ("const", weight_floats)
        weight_floats += _round_up(values[v].size)
    # storage of produced values: the caller's output buffer, an alias (Reshape) or the arena
    last_use: dict[int, int] = {}
    for s, step in enumerate(spec.steps):
        for i in step.inputs:
            if i is not None:
                last_use[i] = s
    for v, j in out_slot.items():
        where[v] = ("output", j)
    for s, step in enumerate(spec.steps):
        if step.op == "Reshape" and step.outputs[0] is not None and step.outputs[0] not in out_slot:
            where[step.outputs[0]] = ("alias", step.inputs[0])
    for _, v in copies:
        if values[v].kind == "temp" and v not in producer:
            raise NetBuildError(f"graph output value {v} is never produced")
    items: dict[Any, tuple[int, int, int]] = {}  # item -> (first, last, floats)
    for v, s in producer.items():
        if v not in where:
            where[v] = ("arena", -1)
            items[v] = (s, s, values[v].size)
    for v in producer:  # extend each arena root's lifetime over the uses of its aliases
        root = v
        while where[root][0] == "alias":
            root = where[root][1]
        if root in items:
            first, last, size = items[root]
            end = max(last, last_use.get(v, producer[v]))
            if any(c[1] == v for c in copies):
                end = len(spec.steps)
            items[root] = (first, end, size)
    scratch_items = {}
    for s, step in enumerate(spec.steps):
        floats = _scratch_floats(step, values)
        if floats:
            scratch_items[("scratch", s)] = (s, s, floats)
    items.update(scratch_items)
    placement = _place(items)
    for item, (off, _) in placement.items():
        if isinstance(item, int):
            where[item] = ("arena", off)
    arena = max((off + _round_up(size) for off, size in placement.values()), default=0)
    return MemoryPlan(arena, where, {s: placement[("scratch", s)][0] for _, s in scratch_items},
                      {k: (a, b) for k, (a, b, _) in items.items()}, placement, packed, weight_floats,
                      tuple(copies))


def _place(items: Mapping[Any, tuple[int, int, int]]) -> dict[Any, tuple[int, int]]:
    """First-fit placement of lifetime intervals: an item never overlaps (in memory) an item whose
    lifetime overlaps its own. Larger items first among those born at the same step."""
    order = sorted(items, key=lambda k: (items[k][0], -items[k][2], str(k)))
    placed: list[tuple[int, int, int, int]] = []  # (first, last, offset, floats)
    out: dict[Any, tuple[int, int]] = {}
    for item in order:
        first, last, size = items[item]
        need = _round_up(max(size, 1))
        busy = sorted((off, off + fl) for f, l, off, fl in placed if f <= last and first <= l)
        off = 0
        for lo, hi in busy:
            if off + need <= lo:
                break
            off = max(off, hi)
        placed.append((first, last, off, need))
        out[item] = (off, size)
    return out


# ----------------------------------------------------------------------------------------------
# C emission helpers
# ----------------------------------------------------------------------------------------------

def _strides(shape: Sequence[int]) -> list[int]:
    out, acc = [0] * len(shape), 1
    for d in range(len(shape) - 1, -1, -1):
        out[d] = acc
        acc *= int(shape[d])
    return out


def _bcast(in_shape: Sequence[int], out_shape: Sequence[int], what: str = "operand") -> list[int]:
    """Strides of a contiguous ``in_shape`` array read at the indices of ``out_shape`` (numpy broadcasting,
    right-aligned; broadcast dimensions get stride 0)."""
    r = len(out_shape)
    if len(in_shape) > r:
        raise NetBuildError(f"{what} of shape {tuple(in_shape)} does not broadcast to {tuple(out_shape)}")
    st = _strides(in_shape)
    out = [0] * r
    for d in range(len(in_shape)):
        od = r - len(in_shape) + d
        if in_shape[d] == out_shape[od]:
            out[od] = st[d] if in_shape[d] != 1 else 0
        elif in_shape[d] != 1:
            raise NetBuildError(f"{what} of shape {tuple(in_shape)} does not broadcast to {tuple(out_shape)}")
    return out


def _merge(extents: Sequence[int], strides: Sequence[Sequence[int]]) -> tuple[list[int], list[list[int]]]:
    """Drop extent-1 dims and fuse neighbours that are contiguous in every operand."""
    keep = [d for d in range(len(extents)) if extents[d] != 1]
    ext = [int(extents[d]) for d in keep]
    sts = [[int(s[d]) for d in keep] for s in strides]
    d = len(ext) - 2
    while d >= 0:
        if all(s[d] == s[d + 1] * ext[d + 1] for s in sts):
            ext[d] *= ext[d + 1]
            for s in sts:
                s[d] = s[d + 1]
                del s[d + 1]
            del ext[d + 1]
        d -= 1
    return ext, sts


def _flt(x: float) -> str:
    """A float constant as C source (finite values only)."""
    x = float(x)
    if not math.isfinite(x):
        return "INFINITY" if x > 0 else ("-INFINITY" if x < 0 else "NAN")
    return repr(x)


def _idx(base: int, strides: Sequence[int], names: Sequence[str]) -> str:
    parts = [(f"{s}*{v}" if s != 1 else v) for s, v in zip(strides, names) if s]
    if base or not parts:
        parts.append(str(base))
    return " + ".join(parts)


def _pointwise(w: _Writer, extents: Sequence[int], out: tuple[str, Sequence[int], int],
               ins: Sequence[tuple[str, Sequence[int], int]], expr: Callable[[list[str]], str]) -> None:
    """``out[...] = expr(ins[...])`` over an iteration space. Each operand is (pointer, strides over the
    iteration dims, base offset); dims are merged where every operand is contiguous; large nests run in
    parallel (OpenMP) and the innermost loop is a SIMD loop."""
    ext, sts = _merge(extents, [out[1]] + [s for _, s, _ in ins])
    names = [f"i{d}" for d in range(len(ext))]
    total = math.prod(ext)
    w("{")
    w.depth += 1
    if ext:
        if total >= PARALLEL_MIN:
            collapse, chunks = 1, ext[0]
            while collapse < len(ext) - 1 and chunks < 64:
                chunks *= ext[collapse]
                collapse += 1
            simd = " simd" if len(ext) == 1 else ""
            w(f"#pragma omp parallel for{simd} schedule(static)" + (f" collapse({collapse})" if collapse > 1 else ""))
        for d, (e, nm) in enumerate(zip(ext, names)):
            if d == len(ext) - 1 and not (total >= PARALLEL_MIN and len(ext) == 1):
                w("#pragma omp simd")
            w.open(f"for (long {nm} = 0; {nm} < {e}; ++{nm})")
    loads = [f"{p}[{_idx(b, s, names)}]" for (p, _, b), s in zip(ins, sts[1:])]
    w(f"{out[0]}[{_idx(out[2], sts[0], names)}] = {expr(loads)};")
    for _ in ext:
        w.close()
    w.depth -= 1
    w("}")


# ----------------------------------------------------------------------------------------------
# Cheap ops: each renders the body of one static function
# ----------------------------------------------------------------------------------------------

@dataclass
class _Ctx:
    """What an op renderer sees: shapes of its inputs / outputs, the C names of their pointers, the
    constant data of constant inputs (for specializations) and the step."""

    step: Step
    in_shapes: list[tuple[int, ...] | None]
    out_shapes: list[tuple[int, ...] | None]
    x: list[str | None]  # input pointer names ("x0", ...) or None when absent
    y: list[str | None]
    consts: list[np.ndarray | None]

    def fail(self, msg: str) -> None:
        raise NetBuildError(f"{self.step.where()}: {msg}")

    def need(self, k: int) -> tuple[int, ...]:
        if k >= len(self.in_shapes) or self.in_shapes[k] is None:
            self.fail(f"input {k} is required")
        return self.in_shapes[k]


def _r_binary(c: _Ctx, w: _Writer) -> None:
    a, b = c.need(0), c.need(1)
    out = c.out_shapes[0]
    tmpl = ELEMENTWISE_BINARY[c.step.op]
    k = c.consts[1]
    if c.step.op == "Pow" and k is not None and k.size == 1 and float(k.reshape(-1)[0]) == 2.0:
        tmpl = "{0} * {0}"  # x ** 2 (exact, as numpy's square fast path)
    _pointwise(w, out, (c.y[0], _strides(out), 0),
               [(c.x[0], _bcast(a, out, "input 0"), 0), (c.x[1], _bcast(b, out, "input 1"), 0)],
               lambda v: tmpl.format(*v))


def _r_unary(c: _Ctx, w: _Writer) -> None:
    shape = c.need(0)
    tmpl = ELEMENTWISE_UNARY[c.step.op]
    _pointwise(w, shape, (c.y[0], _strides(shape), 0), [(c.x[0], _strides(shape), 0)], lambda v: tmpl.format(*v))


def _r_clip(c: _Ctx, w: _Writer) -> None:
    shape = c.need(0)
    lo = c.x[1] if len(c.x) > 1 else None
    hi = c.x[2] if len(c.x) > 2 else None
    for p, name in ((lo, "lo"), (hi, "hi")):
        if p is not None:
            if math.prod(c.in_shapes[1 if name == "lo" else 2]) != 1:
                c.fail(f"the {name} bound must be a scalar")
            w(f"const float {name} = {p}[0];")

    def expr(v: list[str]) -> str:
        e = v[0]
        if lo is not None:
            e = f"fj_max({e}, lo)"
        if hi is not None:
            e = f"fj_min({e}, hi)"
        return e

    _pointwise(w, shape, (c.y[0], _strides(shape), 0), [(c.x[0], _strides(shape), 0)], expr)


def _channel_strides(shape: Sequence[int], vec_shape: Sequence[int], c: _Ctx) -> list[int]:
    if len(shape) < 2 or math.prod(vec_shape) not in (1, shape[1]):
        c.fail(f"a per-channel parameter of shape {tuple(vec_shape)} does not match input {tuple(shape)}")
    return [1 if d == 1 and math.prod(vec_shape) > 1 else 0 for d in range(len(shape))]


def _r_scale_shift(c: _Ctx, w: _Writer) -> None:
    shape = c.need(0)
    ins = [(c.x[0], _strides(shape), 0)] + [(c.x[k], _channel_strides(shape, c.need(k), c), 0) for k in (1, 2)]
    _pointwise(w, shape, (c.y[0], _strides(shape), 0), ins, lambda v: f"{v[0]} * {v[1]} + {v[2]}")


def _r_batchnorm(c: _Ctx, w: _Writer) -> None:
    shape = c.need(0)
    eps = _flt(c.step.attrs.get("epsilon", 1e-5))
    ins = [(c.x[0], _strides(shape), 0)] + [(c.x[k], _channel_strides(shape, c.need(k), c), 0) for k in (1, 2, 3, 4)]
    _pointwise(w, shape, (c.y[0], _strides(shape), 0), ins,
               lambda v: f"(float)(((double){v[0]} - (double){v[3]}) / sqrt((double){v[4]} + {eps}) * (double){v[1]}"
                         f" + (double){v[2]})")


def _r_layernorm(c: _Ctx, w: _Writer) -> None:
    shape = c.need(0)
    axis = int(c.step.attrs["axis"])
    eps = _flt(c.step.attrs.get("epsilon", 1e-5))
    outer, n = math.prod(shape[:axis]), math.prod(shape[axis:])
    w("double* st = (double*)ws;  /* mean, 1/std per row */")
    if outer * n >= PARALLEL_MIN:
        w("#pragma omp parallel for schedule(static)")
    w.open(f"for (long o = 0; o < {outer}; ++o)")
    w(f"const float* r = {c.x[0]} + o*{n};")
    w("double s = 0.0, q = 0.0;")
    w(f"for (long j = 0; j < {n}; ++j) s += (double)r[j];")
    w(f"const double m = s / {n}.0;")
    w(f"for (long j = 0; j < {n}; ++j) {{ const double d = (double)r[j] - m; q += d * d; }}")
    w(f"st[2*o] = m; st[2*o + 1] = 1.0 / sqrt(q / {n}.0 + {eps});")
    for k, yk in ((1, 0), (2, 1)):
        if len(c.y) > k and c.y[k] is not None:
            w(f"{c.y[k]}[o] = (float)st[2*o + {yk}];")
    w.close()
    stat = [2 * s for s in _strides(shape[:axis])] + [0] * (len(shape) - axis)
    ins = [(c.x[0], _strides(shape), 0), ("st", stat, 0), ("st", stat, 1),
           (c.x[1], _bcast(c.need(1), shape, "scale"), 0)]
    has_bias = len(c.x) > 2 and c.x[2] is not None
    if has_bias:
        ins.append((c.x[2], _bcast(c.need(2), shape, "bias"), 0))
    _pointwise(w, shape, (c.y[0], _strides(shape), 0), ins,
               lambda v: f"(float)(((double){v[0]} - {v[1]}) * {v[2]} * (double){v[3]}"
                         + (f" + (double){v[4]})" if has_bias else ")"))


def _r_reduce_mean(c: _Ctx, w: _Writer) -> None:
    shape = c.need(0)
    axes = sorted({int(a) for a in c.step.attrs["axes"]})
    if any(not 0 <= a < len(shape) for a in axes):
        c.fail(f"axes {axes} out of range for rank {len(shape)}")
    st = _strides(shape)
    kept = [d for d in range(len(shape)) if d not in axes]
    k_ext, (k_st,) = _merge([shape[d] for d in kept], [[st[d] for d in kept]])
    r_ext, (r_st,) = _merge([shape[d] for d in axes], [[st[d] for d in axes]])
    count = math.prod(shape[d] for d in axes)
    outer = math.prod(k_ext)
    w("{")
    w.depth += 1
    if outer >= 2 and outer * count >= PARALLEL_MIN and k_ext:
        w("#pragma omp parallel for schedule(static)" + (f" collapse({len(k_ext)})" if len(k_ext) > 1 else ""))
    kn = [f"k{d}" for d in range(len(k_ext))]
    for e, nm in zip(k_ext, kn):
        w.open(f"for (long {nm} = 0; {nm} < {e}; ++{nm})")
    w(f"const float* p = {c.x[0]} + {_idx(0, k_st, kn)};")
    w("double s = 0.0;")
    rn = [f"r{d}" for d in range(len(r_ext))]
    for e, nm in zip(r_ext, rn):
        w.open(f"for (long {nm} = 0; {nm} < {e}; ++{nm})")
    w(f"s += (double)p[{_idx(0, r_st, rn)}];")
    for _ in r_ext:
        w.close()
    out_idx = _idx(0, _strides(k_ext), kn)
    w(f"{c.y[0]}[{out_idx}] = (float)(s / {count}.0);")
    for _ in k_ext:
        w.close()
    w.depth -= 1
    w("}")


def _r_pool(c: _Ctx, w: _Writer) -> None:
    shape, out = c.need(0), c.out_shapes[0]
    if len(shape) != 4 or len(out) != 4:
        c.fail("pooling takes 4-D NCHW tensors")
    a = c.step.attrs
    (kh, kw), (sh, sw), (dh, dw) = a["kernel"], a["strides"], a.get("dilations", (1, 1))
    pt, pl, pb, pr = a["pads"]
    n, ch, h, wd = shape
    oh, ow = out[2], out[3]
    is_max = c.step.op == "MaxPool"
    include = bool(a.get("count_include_pad", 0))
    if n * ch * oh * ow * kh * kw >= PARALLEL_MIN and n * ch > 1:
        w("#pragma omp parallel for schedule(static)")
    w.open(f"for (long nc = 0; nc < {n * ch}; ++nc)")
    w(f"const float* xp = {c.x[0]} + nc*{h * wd};")
    w(f"float* yp = {c.y[0]} + nc*{oh * ow};")
    w.open(f"for (long oy = 0; oy < {oh}; ++oy)")
    w.open(f"for (long ox = 0; ox < {ow}; ++ox)")
    w("float m = -INFINITY;" if is_max else "double s = 0.0; long cnt = 0;")
    w.open(f"for (long ky = 0; ky < {kh}; ++ky)")
    w(f"const long iy = oy*{sh} - {pt} + ky*{dh};")
    w.open(f"for (long kx = 0; kx < {kw}; ++kx)")
    w(f"const long ix = ox*{sw} - {pl} + kx*{dw};")
    w(f"const int inside = iy >= 0 && iy < {h} && ix >= 0 && ix < {wd};")
    if is_max:
        w(f"if (inside) {{ const float v = xp[iy*{wd} + ix]; m = (v > m || v != v) ? v : m; }}")
    else:
        w(f"if (inside) s += (double)xp[iy*{wd} + ix];")
        if include:
            w(f"cnt += iy >= -{pt} && iy < {h + pb} && ix >= -{pl} && ix < {wd + pr};")
        else:
            w("cnt += inside;")
    w.close()
    w.close()
    w(f"yp[oy*{ow} + ox] = " + ("m;" if is_max else "(float)(s / (double)cnt);"))
    w.close()
    w.close()
    w.close()


def _r_softmax(c: _Ctx, w: _Writer) -> None:
    shape = c.need(0)
    axes = sorted(int(a) for a in c.step.attrs["axes"])
    if not axes or axes != list(range(axes[0], axes[-1] + 1)) or axes[-1] >= len(shape):
        c.fail(f"softmax axes {axes} must be a contiguous range of the {len(shape)} axes")
    outer = math.prod(shape[: axes[0]])
    cnt = math.prod(shape[axes[0]: axes[-1] + 1])
    inner = math.prod(shape[axes[-1] + 1:])
    if inner == 1:  # rows are contiguous: SIMD loops with reductions
        if outer >= 2 and outer * cnt >= PARALLEL_MIN // 4:
            w("#pragma omp parallel for schedule(static)")
        w.open(f"for (long o = 0; o < {outer}; ++o)")
        w(f"const float* xp = {c.x[0]} + o*{cnt};")
        w(f"float* yp = {c.y[0]} + o*{cnt};")
        w("float m = -INFINITY;")
        w("int has_nan = 0;")
        w("#pragma omp simd reduction(max:m) reduction(|:has_nan)")
        w(f"for (long j = 0; j < {cnt}; ++j) {{ m = xp[j] > m ? xp[j] : m; has_nan |= xp[j] != xp[j]; }}")
        w("if (has_nan) m = NAN;")
        w("float sum = 0.0f;  /* a float reduction: a double one does not vectorize (5x slower) */")
        w("#pragma omp simd reduction(+:sum)")
        w(f"for (long j = 0; j < {cnt}; ++j) {{ const float e = fj_exp(xp[j] - m); yp[j] = e; sum += e; }}")
        w("#pragma omp simd")
        w(f"for (long j = 0; j < {cnt}; ++j) yp[j] = yp[j] / sum;")
        w.close()
        return
    if outer * inner >= 2 and outer * cnt * inner >= PARALLEL_MIN // 4:
        w("#pragma omp parallel for schedule(static) collapse(2)")
    w.open(f"for (long o = 0; o < {outer}; ++o)")
    w.open(f"for (long i = 0; i < {inner}; ++i)")
    w(f"const float* xp = {c.x[0]} + o*{cnt * inner} + i;")
    w(f"float* yp = {c.y[0]} + o*{cnt * inner} + i;")
    w("float m = -INFINITY;")
    w(f"for (long j = 0; j < {cnt}; ++j) {{ const float v = xp[j*{inner}]; m = (v > m || v != v) ? v : m; }}")
    w("double s = 0.0;")
    w(f"for (long j = 0; j < {cnt}; ++j) {{ const float e = fj_exp(xp[j*{inner}] - m); yp[j*{inner}] = e; s += e; }}")
    w("const float inv = (float)s;")
    w(f"for (long j = 0; j < {cnt}; ++j) yp[j*{inner}] = yp[j*{inner}] / inv;")
    w.close()
    w.close()


def _r_transpose(c: _Ctx, w: _Writer) -> None:
    shape = c.need(0)
    perm = [int(p) for p in c.step.attrs["perm"]]
    if sorted(perm) != list(range(len(shape))):
        c.fail(f"perm {perm} is not a permutation of {len(shape)} axes")
    out = [shape[p] for p in perm]
    st = _strides(shape)
    _pointwise(w, out, (c.y[0], _strides(out), 0), [(c.x[0], [st[p] for p in perm], 0)], lambda v: v[0])


def _r_concat(c: _Ctx, w: _Writer) -> None:
    out = c.out_shapes[0]
    axis = int(c.step.attrs["axis"])
    inner = math.prod(out[axis + 1:])
    off = 0
    for k, p in enumerate(c.x):
        shape = c.need(k)
        if len(shape) != len(out) or any(shape[d] != out[d] for d in range(len(out)) if d != axis):
            c.fail(f"input {k} of shape {shape} does not concatenate into {tuple(out)} along axis {axis}")
        _pointwise(w, shape, (c.y[0], _strides(out), off * inner), [(p, _strides(shape), 0)], lambda v: v[0])
        off += shape[axis]
    if off != out[axis]:
        c.fail(f"inputs fill {off} of the {out[axis]} entries along axis {axis}")


def _r_pad(c: _Ctx, w: _Writer) -> None:
    shape, out = c.need(0), c.out_shapes[0]
    pads = [(int(b), int(e)) for b, e in c.step.attrs["pads"]]
    if len(pads) != len(shape) or any(shape[d] + b + e != out[d] for d, (b, e) in enumerate(pads)):
        c.fail(f"pads {pads} do not take {tuple(shape)} to {tuple(out)}")
    region, out_base, in_base = [], 0, 0
    ost, ist = _strides(out), _strides(shape)
    for d, (b, e) in enumerate(pads):
        region.append(shape[d] - max(0, -b) - max(0, -e))
        out_base += ost[d] * max(0, b)
        in_base += ist[d] * max(0, -b)
    fill = any(b > 0 or e > 0 for b, e in pads) or min(region, default=1) <= 0
    if fill:
        if len(c.x) < 2 or c.x[1] is None:
            w("const float value = 0.0f;")
        else:
            w(f"const float value = {c.x[1]}[0];")
        _pointwise(w, out, (c.y[0], ost, 0), [], lambda v: "value")
    if min(region, default=1) > 0:
        _pointwise(w, region, (c.y[0], ost, out_base), [(c.x[0], ist, in_base)], lambda v: v[0])


def _r_copy(c: _Ctx, w: _Writer) -> None:
    shape = c.need(0)
    if math.prod(shape) != math.prod(c.out_shapes[0]):
        c.fail(f"cannot reshape {tuple(shape)} to {tuple(c.out_shapes[0])}")
    w(f"memcpy({c.y[0]}, {c.x[0]}, {4 * math.prod(shape)});")


def _r_conv(c: _Ctx, w: _Writer) -> None:
    xs, ws_, out = c.need(0), c.need(1), c.out_shapes[0]
    if len(xs) != 4 or len(ws_) != 4 or len(out) != 4:
        c.fail("Conv takes 4-D NCHW data and OIHW weights")
    a = c.step.attrs
    g = int(a.get("groups", 1))
    (sh, sw), (dh, dw) = a["strides"], a.get("dilations", (1, 1))
    pt, pl, _, _ = a["pads"]
    n, ch, h, wd = xs
    k, cg, r, s = ws_
    oh, ow = out[2], out[3]
    if ch != cg * g or k % g or out[1] != k:
        c.fail(f"groups={g} do not fit data {tuple(xs)} and weights {tuple(ws_)}")
    kg = k // g
    has_bias = len(c.x) > 2 and c.x[2] is not None
    if n * k * oh * ow * cg * r * s >= PARALLEL_MIN and n * k > 1:
        w("#pragma omp parallel for schedule(static) collapse(2)")
    w.open(f"for (long ni = 0; ni < {n}; ++ni)")
    w.open(f"for (long ko = 0; ko < {k}; ++ko)")
    w(f"const float* xg = {c.x[0]} + ni*{ch * h * wd} + (ko / {kg})*{cg * h * wd};")
    w(f"const float* wk = {c.x[1]} + ko*{cg * r * s};")
    w(f"float* yp = {c.y[0]} + (ni*{k} + ko)*{oh * ow};")
    w.open(f"for (long oy = 0; oy < {oh}; ++oy)")
    w.open(f"for (long ox = 0; ox < {ow}; ++ox)")
    w("double acc = 0.0;")
    w.open(f"for (long ci = 0; ci < {cg}; ++ci)")
    w.open(f"for (long ky = 0; ky < {r}; ++ky)")
    w(f"const long iy = oy*{sh} - {pt} + ky*{dh};")
    w(f"if (iy < 0 || iy >= {h}) continue;")
    w.open(f"for (long kx = 0; kx < {s}; ++kx)")
    w(f"const long ix = ox*{sw} - {pl} + kx*{dw};")
    w(f"if (ix >= 0 && ix < {wd}) acc += (double)xg[ci*{h * wd} + iy*{wd} + ix] * (double)wk[(ci*{r} + ky)*{s} + kx];")
    w.close()
    w.close()
    w.close()
    w(f"yp[oy*{ow} + ox] = (float)(acc" + (f" + (double){c.x[2]}[ko]);" if has_bias else ");"))
    for _ in range(4):
        w.close()


def _matmul_rows(w: _Writer, a: str, a_row: str, a_k: int, b: str, b_k: int, b_n: int, y: str, n: int,
                 kk: int) -> None:
    """``y[0:n] = sum_k a[a_row + k*a_k] * b[k*b_k + j*b_n]`` (i-k-j order: the j loop is SIMD)."""
    w(f"for (long j = 0; j < {n}; ++j) {y}[j] = 0.0f;")
    w.open(f"for (long k = 0; k < {kk}; ++k)")
    w(f"const float av = {a}[{a_row} + k*{a_k}];" if a_row != "0" else f"const float av = {a}[k*{a_k}];")
    w("#pragma omp simd")
    w(f"for (long j = 0; j < {n}; ++j) {y}[j] += av * {b}[k*{b_k} + j*{b_n}];")
    w.close()


def _r_gemm(c: _Ctx, w: _Writer) -> None:
    sa, sb, out = c.need(0), c.need(1), c.out_shapes[0]
    a = c.step.attrs
    ta, tb = int(a.get("trans_a", 0)), int(a.get("trans_b", 0))
    if len(sa) != 2 or len(sb) != 2 or len(out) != 2:
        c.fail("Gemm takes 2-D matrices")
    m, kk = (sa[1], sa[0]) if ta else sa
    n = sb[0] if tb else sb[1]
    if (sb[1] if tb else sb[0]) != kk or tuple(out) != (m, n):
        c.fail(f"shapes {tuple(sa)} x {tuple(sb)} -> {tuple(out)} do not match")
    a_i, a_k = (1, m) if ta else (kk, 1)
    b_k, b_n = (1, kk) if tb else (n, 1)
    alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
    has_c = len(c.x) > 2 and c.x[2] is not None
    if m > 1 and m * n * kk >= PARALLEL_MIN:
        w("#pragma omp parallel for schedule(static)")
    w.open(f"for (long i = 0; i < {m}; ++i)")
    w(f"float* yr = {c.y[0]} + i*{n};")
    _matmul_rows(w, c.x[0], f"i*{a_i}", a_k, c.x[1], b_k, b_n, "yr", n, kk)
    terms = "yr[j]" if alpha == 1.0 else f"(float){_flt(alpha)} * yr[j]"
    if has_c:
        cs = _bcast(c.need(2), out, "C")
        cterm = f"{c.x[2]}[{_idx(0, [cs[0]], ['i'])} + {cs[1]}*j]"
        terms += f" + {cterm}" if beta == 1.0 else f" + (float){_flt(beta)} * {cterm}"
    if terms != "yr[j]":
        w(f"for (long j = 0; j < {n}; ++j) yr[j] = {terms};")
    w.close()


def _r_matmul(c: _Ctx, w: _Writer) -> None:
    sa, sb, out = c.need(0), c.need(1), c.out_shapes[0]
    a2 = (1,) + tuple(sa) if len(sa) == 1 else tuple(sa)
    b2 = tuple(sb) + (1,) if len(sb) == 1 else tuple(sb)
    m, kk = a2[-2:]
    n = b2[-1]
    if b2[-2] != kk:
        c.fail(f"inner dimensions of {tuple(sa)} and {tuple(sb)} differ")
    try:
        batch = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
    except ValueError:
        c.fail(f"batch dimensions of {tuple(sa)} and {tuple(sb)} do not broadcast")
    if math.prod(batch) * m * n != math.prod(out):
        c.fail(f"{tuple(sa)} @ {tuple(sb)} does not give {tuple(out)}")
    a_st = [s * m * kk for s in _bcast(a2[:-2], batch)]
    b_st = [s * kk * n for s in _bcast(b2[:-2], batch)]
    nb = math.prod(batch)
    if nb * m > 1 and nb * m * n * kk >= PARALLEL_MIN:
        w("#pragma omp parallel for schedule(static) collapse(2)")
    w.open(f"for (long bi = 0; bi < {nb}; ++bi)")
    w.open(f"for (long i = 0; i < {m}; ++i)")
    w("long rest = bi, ao = 0, bo = 0;")
    for d in range(len(batch) - 1, -1, -1):
        if batch[d] > 1:
            w(f"{{ const long q = rest % {batch[d]}; rest /= {batch[d]}; ao += q*{a_st[d]}; bo += q*{b_st[d]}; }}")
    w("(void)rest;")
    w(f"const float* ap = {c.x[0]} + ao + i*{kk};")
    w(f"const float* bp = {c.x[1]} + bo;")
    w(f"float* yr = {c.y[0]} + (bi*{m} + i)*{n};")
    _matmul_rows(w, "ap", "0", 1, "bp", n, 1, "yr", n, kk)
    w.close()
    w.close()


_RENDERERS: dict[str, Callable[[_Ctx, _Writer], None]] = {
    **{op: _r_binary for op in ELEMENTWISE_BINARY},
    **{op: _r_unary for op in ELEMENTWISE_UNARY},
    "Clip": _r_clip, "ScaleShift": _r_scale_shift, "BatchNormalization": _r_batchnorm,
    "LayerNormalization": _r_layernorm, "ReduceMean": _r_reduce_mean, "MaxPool": _r_pool, "AveragePool": _r_pool,
    "Softmax": _r_softmax, "Transpose": _r_transpose, "Concat": _r_concat, "Pad": _r_pad, "Reshape": _r_copy,
    "Conv": _r_conv, "Gemm": _r_gemm, "MatMul": _r_matmul,
}
assert set(_RENDERERS) == set(CHEAP_OPS)


# ----------------------------------------------------------------------------------------------
# Emission of the whole file
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class NetSource:
    """A generated whole-network build: C source, header, weights blob and memory plan.

    Attributes:
        source: ``model.c`` (self-contained).
        header: ``model.h`` (the C interface, sizes as macros).
        weights: the float32 weights blob ``fj_model_init`` takes (``weights.bin``).
        memory: the static memory plan.
        input_shapes, output_shapes: in entry-point order.
        kernels: number of distinct tuned kernel functions.
    """

    source: str
    header: str
    weights: np.ndarray
    memory: MemoryPlan
    input_shapes: tuple[tuple[int, ...], ...]
    output_shapes: tuple[tuple[int, ...], ...]
    kernels: int
    steps: int

    @property
    def arena_bytes(self) -> int:
        return 4 * self.memory.arena_floats

    @property
    def weight_bytes(self) -> int:
        return 4 * self.memory.weight_floats


def _check_step(step: Step, values: Sequence[Value]) -> None:
    if step.op == "kernel":
        if step.plan is None:
            raise NetBuildError(f"{step.where()}: a kernel step needs a plan")
        task = step.plan.space.task
        shapes = task.input_shapes()
        if len(step.inputs) != len(shapes) or any(i is None for i in step.inputs):
            raise NetBuildError(f"{step.where()}: takes {len(shapes)} inputs (data, weight[, bias][, residual])")
        for k, (i, s) in enumerate(zip(step.inputs, shapes)):
            if values[i].size != math.prod(s):
                raise NetBuildError(f"{step.where()}: input {k} has {values[i].size} elements, the task "
                                    f"expects shape {s}")
        if len(step.outputs) != 1 or step.outputs[0] is None or values[step.outputs[0]].size != math.prod(
                task.output_shape):
            raise NetBuildError(f"{step.where()}: one output of shape {task.output_shape} expected")
        return
    if step.op not in _RENDERERS:
        raise NetBuildError(f"{step.where()}: op {step.op!r} has no C implementation; supported: "
                            f"{', '.join(CHEAP_OPS)}")
    if not step.outputs or step.outputs[0] is None:
        raise NetBuildError(f"{step.where()}: the first output is required")


def emit(spec: NetSpec) -> NetSource:
    """Generate the C source, header and weights blob of a network (see the module docstring).

    Raises:
        NetBuildError: a malformed spec or an op / attribute the C build does not implement.
    """
    values = spec.values
    for v in values:
        if v.kind not in VALUE_KINDS:
            raise NetBuildError(f"value kind {v.kind!r}; expected one of {VALUE_KINDS}")
        if v.kind == "const" and (v.data is None or np.asarray(v.data).size != v.size):
            raise NetBuildError(f"constant of shape {v.shape} has no data of that size")
    for step in spec.steps:
        _check_step(step, values)
    mem = plan_memory(spec)

    # weights blob
    blob = _aligned_zeros(mem.weight_floats)
    for (v, s), off in mem.packed.items():
        plan = spec.steps[s].plan
        wshape = plan.space.task.input_shapes()[1]
        packed = plan.pack_weight(np.asarray(values[v].data, dtype=np.float32).reshape(wshape))
        blob[off: off + packed.size] = packed
    for v, (kind, off) in mem.where.items():
        if kind == "const":
            data = np.asarray(values[v].data, dtype=np.float32).reshape(-1)
            blob[off: off + data.size] = data

    blob.flags.writeable = False

    def ref(v: int) -> str:
        kind, x = mem.where[mem.root(v)]
        return {"input": f"in[{x}]", "output": f"out[{x}]", "const": f"(W + {x})", "arena": f"(A + {x})"}[kind]

    w = _Writer()
    n_kernels = 0
    w("/* felixjax whole-network build (generated: do not edit).")
    w(f" * {len(spec.steps)} steps, arena {mem.arena_floats} floats, weights {mem.weight_floats} floats. */")
    w(_PRELUDE.rstrip("\n"))
    w()
    # tuned kernels, one function per distinct (task, config)
    kernel_names: dict[tuple[str, str], str] = {}
    for step in spec.steps:
        if step.op != "kernel":
            continue
        key = (step.plan.space.task.key, step.plan.config.dumps())
        if key in kernel_names:
            continue
        name = kernel_names[key] = f"fj_k{len(kernel_names)}"
        w(f"/* kernel {name}: {step.plan.space.task.name}, sketch {step.plan.config.sketch} */")
        render_kernel(step.plan, w, name=name, static=True, local_types=True)
        w()
    n_kernels = len(kernel_names)
    # cheap ops, one function per step
    calls: list[str] = []
    for s, step in enumerate(spec.steps):
        if step.op == "kernel":
            name = kernel_names[(step.plan.space.task.key, step.plan.config.dumps())]
            args = [f"(float*){ref(step.inputs[0])}", f"(float*)(W + {mem.packed[(step.inputs[1], s)]})"]
            args += [f"(float*){ref(i)}" for i in step.inputs[2:]]
            args.append(ref(step.outputs[0]))
            args.append(f"(A + {mem.scratch[s]})" if s in mem.scratch else "NULL")
            calls.append(f"{{ float* b[] = {{{', '.join(args)}}}; {name}(b); }}  /* {step.plan.space.task.name} */")
            continue
        if step.op == "Reshape" and mem.where[step.outputs[0]][0] == "alias":
            calls.append(f"/* step {s}: Reshape (aliases its input) */")
            continue
        ins = [i for i in step.inputs]
        c = _Ctx(step, [values[i].shape if i is not None else None for i in ins],
                 [values[o].shape if o is not None else None for o in step.outputs],
                 [f"x{k}" if i is not None else None for k, i in enumerate(ins)],
                 [f"y{k}" if o is not None else None for k, o in enumerate(step.outputs)],
                 [np.asarray(values[i].data) if i is not None and values[i].kind == "const" else None for i in ins])
        params = [f"const float* restrict x{k}" for k, i in enumerate(ins) if i is not None]
        params += [f"float* restrict y{k}" for k, o in enumerate(step.outputs) if o is not None]
        params.append("float* restrict ws")
        w(f"/* step {s}: {step.op} */")
        w.open(f"static void fj_s{s}({', '.join(params)})")
        w(" ".join(f"(void){p.split()[-1]};" for p in params))
        _RENDERERS[step.op](c, w)
        w.close()
        w()
        args = [ref(i) for i in ins if i is not None]
        args += [ref(o) for o in step.outputs if o is not None]
        args.append(f"(A + {mem.scratch[s]})" if s in mem.scratch else "NULL")
        calls.append(f"fj_s{s}({', '.join(args)});")
    copies = [f"memcpy(out[{j}], {ref(v)}, {4 * values[v].size});" for j, v in mem.copies]

    arena_decl = max(mem.arena_floats, ALIGN)
    w(f"static float fj_arena[{arena_decl}] __attribute__((aligned(64)));")
    w("static const float* fj_weights;")
    w("static int fj_ready;")
    w()
    w("long fj_model_arena_floats(void) { return %dL; }" % mem.arena_floats)
    w()
    w.open("int fj_model_run_with(const float* weights, float* arena, const float* const* in, float* const* out)")
    w("const float* W = weights;")
    w("float* A = arena;")
    w("(void)W; (void)A; (void)in;")
    for line in calls + copies:
        w(line)
    w("return 0;")
    w.close()
    w()
    w.open("int fj_model_init(const float* weights)")
    w(f"if (!weights && {mem.weight_floats}L > 0) return 1;")
    w("fj_weights = weights;")
    w("fj_ready = 1;")
    w("return 0;")
    w.close()
    w()
    w.open("int fj_model_run(const float* const* inputs, float* const* outputs)")
    w("if (!fj_ready) return 1;")
    w("return fj_model_run_with(fj_weights, fj_arena, inputs, outputs);")
    w.close()
    w()
    w.open("double fj_model_time_with(const float* weights, float* arena, const float* const* inputs, "
           "float* const* outputs, long number)")
    w("int (*volatile run)(const float*, float*, const float* const*, float* const*) = fj_model_run_with;")
    w("struct timespec t0, t1;")
    w("clock_gettime(CLOCK_MONOTONIC, &t0);")
    w("for (long i = 0; i < number; ++i) { run(weights, arena, inputs, outputs); "
      "__asm__ __volatile__(\"\" ::: \"memory\"); }")
    w("clock_gettime(CLOCK_MONOTONIC, &t1);")
    w("return (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);")
    w.close()
    w()
    w.open("void fj_model_profile_with(const float* weights, float* arena, const float* const* in, float* const* out, "
           "double* seconds)")
    w("/* one run with every step timed (seconds[k] += time of step k): where the time goes */")
    w("const float* W = weights;")
    w("float* A = arena;")
    w("(void)W; (void)A; (void)in;")
    w("struct timespec t0, t1;")
    for k, line in enumerate(calls):
        w(f"clock_gettime(CLOCK_MONOTONIC, &t0); {line}")
        w(f"clock_gettime(CLOCK_MONOTONIC, &t1); seconds[{k}] += (double)(t1.tv_sec - t0.tv_sec) + "
          "1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);")
    for line in copies:
        w(line)
    w.close()
    w()
    w.open("void fj_model_set_threads(int n)")
    w("#ifdef _OPENMP")
    w("if (n > 0) omp_set_num_threads(n);")
    w("#else")
    w("(void)n;")
    w("#endif")
    w.close()

    in_shapes = tuple(values[v].shape for v in spec.inputs)
    out_shapes = tuple(values[v].shape for v in spec.outputs)
    return NetSource(w.text(), _header(in_shapes, out_shapes, mem), blob, mem, in_shapes, out_shapes, n_kernels,
                     len(spec.steps))


def _header(in_shapes, out_shapes, mem: MemoryPlan) -> str:
    def arr(shapes) -> str:
        return ", ".join(f"{math.prod(s)}L" for s in shapes) or "0L"

    def shape_lines(kind: str, shapes) -> list[str]:
        return [f" *   {kind} {k}: float32 {' x '.join(map(str, s)) or 'scalar'} (row-major)"
                for k, s in enumerate(shapes)]

    lines = [
        "/* felixjax whole-network build: the C interface (generated: do not edit).",
        " *",
        *shape_lines("input", in_shapes),
        *shape_lines("output", out_shapes),
        " *",
        " * weights.bin holds FJ_MODEL_WEIGHT_FLOATS little-endian float32 values: pass them to fj_model_init",
        " * (the pointer is kept, not copied). fj_model_run uses a static arena: one call at a time; use",
        " * fj_model_run_with and an arena of fj_model_arena_floats() floats (64-byte aligned) per thread",
        " * for concurrent calls. Input and output buffers must not overlap. All functions return 0 on success.",
        " */",
        "#ifndef FJ_MODEL_H",
        "#define FJ_MODEL_H",
        "#ifdef __cplusplus",
        'extern "C" {',
        "#endif",
        "",
        f"#define FJ_MODEL_NUM_INPUTS {len(in_shapes)}",
        f"#define FJ_MODEL_NUM_OUTPUTS {len(out_shapes)}",
        f"#define FJ_MODEL_WEIGHT_FLOATS {mem.weight_floats}L",
        f"#define FJ_MODEL_ARENA_FLOATS {mem.arena_floats}L",
        f"static const long fj_model_input_floats[] = {{{arr(in_shapes)}}};",
        f"static const long fj_model_output_floats[] = {{{arr(out_shapes)}}};",
        "",
        "int fj_model_init(const float* weights);",
        "int fj_model_run(const float* const* inputs, float* const* outputs);",
        "int fj_model_run_with(const float* weights, float* arena, const float* const* inputs, float* const* outputs);",
        "double fj_model_time_with(const float* weights, float* arena, const float* const* inputs, "
        "float* const* outputs, long number);",
        "void fj_model_profile_with(const float* weights, float* arena, const float* const* inputs, "
        "float* const* outputs, double* seconds);",
        "long fj_model_arena_floats(void);",
        "void fj_model_set_threads(int n);",
        "",
        "#ifdef __cplusplus",
        "}",
        "#endif",
        "#endif",
    ]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# Loading into Python and exporting
# ----------------------------------------------------------------------------------------------

def _aligned_zeros(n: int) -> np.ndarray:
    raw = np.zeros(max(n, 1) + ALIGN, dtype=np.float32)
    skip = (-raw.ctypes.data % 64) // 4
    return raw[skip: skip + max(n, 1)]


class NetLibrary:
    """A compiled network as a callable: ``net(inputs) -> outputs`` (lists of float32 arrays in
    entry-point order). Holds its own weights and arena, so several instances of one library are
    independent. Calls are serialized by the caller (one at a time per instance).

    Example:
        >>> import numpy as np
        >>> spec = NetSpec((Value((4,), "input"), Value((4,), "temp")), (0,), (1,), (Step("Sigmoid", (0,), (1,)),))
        >>> float(load(emit(spec))([np.zeros(4, np.float32)])[0][0])
        0.5
    """

    def __init__(self, net: NetSource, lib_path: str, *, threads: int | None = None):
        self.net, self.lib_path = net, lib_path
        lib = ctypes.CDLL(lib_path)
        pp = ctypes.POINTER(ctypes.c_void_p)
        lib.fj_model_run_with.argtypes = [ctypes.c_void_p, ctypes.c_void_p, pp, pp]
        lib.fj_model_run_with.restype = ctypes.c_int
        lib.fj_model_time_with.argtypes = [ctypes.c_void_p, ctypes.c_void_p, pp, pp, ctypes.c_long]
        lib.fj_model_time_with.restype = ctypes.c_double
        lib.fj_model_set_threads.argtypes = [ctypes.c_int]
        lib.fj_model_profile_with.argtypes = [ctypes.c_void_p, ctypes.c_void_p, pp, pp, ctypes.c_void_p]
        lib.fj_model_profile_with.restype = None
        lib.fj_model_arena_floats.restype = ctypes.c_long
        if lib.fj_model_arena_floats() != net.memory.arena_floats:
            raise RuntimeError(f"{lib_path} does not match its source (arena size differs)")
        self._lib = lib
        if net.weights.ctypes.data % 64:
            self._weights = _aligned_zeros(net.weights.size)
            self._weights[:] = net.weights
        else:
            self._weights = net.weights  # read only by the library: shared, not copied
        self._arena = _aligned_zeros(net.memory.arena_floats)
        self.threads = threads
        if threads:
            lib.fj_model_set_threads(int(threads))

    def set_threads(self, n: int) -> None:
        """OpenMP threads of the calling thread's later runs."""
        self.threads = int(n)
        self._lib.fj_model_set_threads(int(n))

    def _pointers(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]):
        if len(inputs) != len(self.net.input_shapes):
            raise ValueError(f"the network takes {len(self.net.input_shapes)} inputs, got {len(inputs)}")
        for k, (x, s) in enumerate(zip(inputs, self.net.input_shapes)):
            if tuple(x.shape) != tuple(s) or x.dtype != np.float32 or not x.flags.c_contiguous:
                raise ValueError(f"input {k}: expected a C-contiguous float32 array of shape {s}, got "
                                 f"{x.dtype} {x.shape}")
        ins = (ctypes.c_void_p * max(1, len(inputs)))(*[x.ctypes.data for x in inputs])
        outs = (ctypes.c_void_p * max(1, len(outputs)))(*[y.ctypes.data for y in outputs])
        return ins, outs

    def new_outputs(self) -> list[np.ndarray]:
        return [np.empty(s, dtype=np.float32) for s in self.net.output_shapes]

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        """Run once into preallocated ``outputs`` (C-contiguous float32 of the output shapes)."""
        if self._lib is None:
            raise RuntimeError("the library was closed")
        ins, outs = self._pointers(inputs, outputs)
        rc = self._lib.fj_model_run_with(self._weights.ctypes.data, self._arena.ctypes.data, ins, outs)
        if rc:
            raise RuntimeError(f"fj_model_run_with returned {rc}")

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        inputs = [np.require(np.asarray(x, dtype=np.float32), requirements="C") for x in inputs]
        outputs = self.new_outputs()
        self.run(inputs, outputs)
        return outputs

    def timeit(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray], number: int) -> float:
        """Seconds for ``number`` back-to-back runs, timed in C (no Python overhead per run)."""
        ins, outs = self._pointers(inputs, outputs)
        return float(self._lib.fj_model_time_with(self._weights.ctypes.data, self._arena.ctypes.data, ins, outs,
                                                  int(number)))

    def profile(self, inputs: Sequence[np.ndarray], *, number: int = 1) -> np.ndarray:
        """Seconds per step (spec order), averaged over ``number`` runs with every step timed in C."""
        outputs = self.new_outputs()
        ins, outs = self._pointers([np.require(np.asarray(x, dtype=np.float32), requirements="C") for x in inputs],
                                   outputs)
        acc = np.zeros(self.net.steps, dtype=np.float64)
        for _ in range(number):
            self._lib.fj_model_profile_with(self._weights.ctypes.data, self._arena.ctypes.data, ins, outs,
                                            acc.ctypes.data)
        return acc / max(1, number)

    def close(self) -> None:
        """Forget the library (ctypes never unloads it; the process keeps the mapping)."""
        self._lib = None


def load(net: NetSource, *, flags: Sequence[str] = DEFAULT_FLAGS, threads: int | None = None,
         timeout_s: float = 600.0) -> NetLibrary:
    """Compile a generated network (through the build cache) and load it.

    Raises:
        RuntimeError: the compiler failed (the message holds its first errors).
    """
    res = build(net.source, flags=flags, timeout_s=timeout_s)
    if res.status != "ok":
        raise RuntimeError(f"building the network failed ({res.status}): {res.error}")
    return NetLibrary(net, res.lib_path, threads=threads)


_MAKEFILE = """\
# Builds the felixjax network with nothing but a C compiler: `make` (demo program and shared library).
# Drop -fopenmp to build single-threaded; replace -march=native when cross-compiling for a board.
CFLAGS ?= -O3 -march=native -fopenmp -ffp-contract=fast
LDLIBS = -lm

all: demo libmodel.so

model.o: model.c model.h
\t$(CC) $(CFLAGS) -std=gnu11 -fPIC -c -o $@ model.c

demo: main.c model.h model.o
\t$(CC) $(CFLAGS) -std=gnu11 -o $@ main.c model.o $(LDLIBS)

libmodel.so: model.o
\t$(CC) $(CFLAGS) -shared -o $@ model.o $(LDLIBS)

clean:
\trm -f demo libmodel.so model.o

.PHONY: all clean
"""

_MAIN_C = r"""/* Demo: run the network once on inputs read from a file, write the outputs to a file.
 *
 *   ./demo weights.bin inputs.bin outputs.bin [repeats]
 *
 * inputs.bin: every input in order, raw little-endian float32, row-major; outputs.bin likewise.
 * With repeats > 0, also prints the mean latency of that many runs. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "model.h"

static float* read_floats(const char* path, long count) {
    FILE* f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "cannot open %s\n", path); return NULL; }
    float* buf = (float*)malloc(sizeof(float) * (size_t)(count > 0 ? count : 1));
    size_t got = buf ? fread(buf, sizeof(float), (size_t)count, f) : 0;
    int extra = fgetc(f) != EOF;
    fclose(f);
    if (!buf || got != (size_t)count || extra) {
        fprintf(stderr, "%s: expected exactly %ld float32 values\n", path, count);
        free(buf);
        return NULL;
    }
    return buf;
}

int main(int argc, char** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s weights.bin inputs.bin outputs.bin [repeats]\n", argv[0]);
        return 2;
    }
    long n_in = 0, n_out = 0;
    for (int k = 0; k < FJ_MODEL_NUM_INPUTS; ++k) n_in += fj_model_input_floats[k];
    for (int k = 0; k < FJ_MODEL_NUM_OUTPUTS; ++k) n_out += fj_model_output_floats[k];
    float* weights = read_floats(argv[1], FJ_MODEL_WEIGHT_FLOATS);
    float* inputs = read_floats(argv[2], n_in);
    float* outputs = (float*)malloc(sizeof(float) * (size_t)(n_out > 0 ? n_out : 1));
    if (!weights || !inputs || !outputs) return 1;
    const float* in_ptrs[FJ_MODEL_NUM_INPUTS > 0 ? FJ_MODEL_NUM_INPUTS : 1];
    float* out_ptrs[FJ_MODEL_NUM_OUTPUTS];
    long off = 0;
    for (int k = 0; k < FJ_MODEL_NUM_INPUTS; ++k) { in_ptrs[k] = inputs + off; off += fj_model_input_floats[k]; }
    off = 0;
    for (int k = 0; k < FJ_MODEL_NUM_OUTPUTS; ++k) { out_ptrs[k] = outputs + off; off += fj_model_output_floats[k]; }
    if (fj_model_init(weights) || fj_model_run(in_ptrs, out_ptrs)) { fprintf(stderr, "run failed\n"); return 1; }
    long repeats = argc > 4 ? atol(argv[4]) : 0;
    if (repeats > 0) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (long i = 0; i < repeats; ++i) fj_model_run(in_ptrs, out_ptrs);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        printf("%.6f ms per run (%ld runs)\n", 1e3 * s / (double)repeats, repeats);
    }
    FILE* f = fopen(argv[3], "wb");
    if (!f || fwrite(outputs, sizeof(float), (size_t)n_out, f) != (size_t)n_out) {
        fprintf(stderr, "cannot write %s\n", argv[3]);
        return 1;
    }
    fclose(f);
    free(weights); free(inputs); free(outputs);
    return 0;
}
"""


def export(net: NetSource, directory: str | os.PathLike, *, readme: str = "") -> Path:
    """Write a standalone folder: model.c, model.h, main.c (a demo reading / writing raw float32 files),
    Makefile, weights.bin and README.txt. ``make`` in that folder builds ``demo`` and ``libmodel.so``.

    Returns the folder path.
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / "model.c").write_text('#include "model.h"\n' + net.source)
    (d / "model.h").write_text(net.header)
    (d / "main.c").write_text(_MAIN_C)
    (d / "Makefile").write_text(_MAKEFILE)
    np.asarray(net.weights[: net.memory.weight_floats], dtype="<f4").tofile(d / "weights.bin")
    shapes = "\n".join([f"  input {k}: {list(s)}" for k, s in enumerate(net.input_shapes)]
                       + [f"  output {k}: {list(s)}" for k, s in enumerate(net.output_shapes)])
    (d / "README.txt").write_text(
        (readme.rstrip() + "\n\n" if readme else "")
        + "A felixjax whole-network build. Build with `make` (needs only a C compiler; OpenMP optional).\n\n"
        "  make\n  ./demo weights.bin inputs.bin outputs.bin [repeats]\n\n"
        "inputs.bin / outputs.bin: all inputs / outputs in order, raw little-endian float32, row-major.\n"
        f"Tensors:\n{shapes}\n\n"
        "Link model.c into your program and see model.h for the interface (fj_model_init, fj_model_run).\n")
    return d
