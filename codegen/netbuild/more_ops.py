"""Generic C kernels of the cheap ops real exporters add (felixjax issue 13): more pointwise ops, Where,
Slice, Gather, Expand, ReduceSum / ReduceMax / ReduceMin, LRN, Pad reflect / edge, Resize.

Semantics are numpy's (``felixjax.graph_ops``); every shape, index table and weight table is baked in.
``kernels`` merges :data:`MORE_RENDERERS` and :data:`MORE_PRELUDE` with cheap_ops' tables.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .cheap_ops import PARALLEL_MIN, _bcast, _Ctx, _flt, _idx, _pointwise, _strides, close_reduction_nest, reduction_nest, softmax_extents
from .cheap_ops import _r_pad as _r_pad_const

MORE_PRELUDE = """
static inline float fj_gelu(float x) { return (float)(0.5 * (double)x * (1.0 + erf((double)x * 0.70710678118654752440))); }
static inline float fj_gelu_tanh(float x) {
    const double d = (double)x;
    return (float)(0.5 * d * (1.0 + tanh(0.79788456080286535588 * (d + 0.044715 * d * d * d))));
}
static inline float fj_mod(float a, float b) {  /* ONNX Mod fmod=0 (numpy's mod): the sign of b */
    float m = fmodf(a, b);
    if (m != 0.0f) { if ((b < 0.0f) != (m < 0.0f)) m += b; }
    else m = copysignf(0.0f, b);
    return m;
}
static inline float fj_softplus(float x) {
    const double d = (double)x;
    return (float)(d > 0.0 ? d + log1p(exp(-d)) : log1p(exp(d)));
}
"""

# unary ops: a template of the input (and of the step's attributes)
UNARY: dict[str, Callable[[dict], str]] = {
    "Exp": lambda a: "expf({0})",
    "Log": lambda a: "logf({0})",
    "Neg": lambda a: "-({0})",
    "Floor": lambda a: "floorf({0})",
    "Ceil": lambda a: "ceilf({0})",
    "Abs": lambda a: "fabsf({0})",
    "Reciprocal": lambda a: "1.0f / ({0})",
    "Softplus": lambda a: "fj_softplus({0})",
    "HardSwish": lambda a: "{0} * fj_min(fj_max({0} / 6.0f + 0.5f, 0.0f), 1.0f)",
    "HardSigmoid": lambda a: f"fj_min(fj_max((float){_flt(a['alpha'])} * {{0}} + (float){_flt(a['beta'])}, 0.0f), 1.0f)",
    "LeakyRelu": lambda a: f"({{0}} < 0.0f ? {{0}} * (float){_flt(a['alpha'])} : {{0}})",
    "Elu": lambda a: f"({{0}} < 0.0f ? (float){_flt(a['alpha'])} * expm1f({{0}}) : {{0}})",
    "Gelu": lambda a: "fj_gelu_tanh({0})" if a.get("approximate", "none") == "tanh" else "fj_gelu({0})",
    "Sin": lambda a: "sinf({0})", "Cos": lambda a: "cosf({0})", "Tan": lambda a: "tanf({0})",
    "Atan": lambda a: "atanf({0})", "Sinh": lambda a: "sinhf({0})", "Cosh": lambda a: "coshf({0})",
    "Sign": lambda a: "(float)(({0} > 0.0f) - ({0} < 0.0f))", "Round": lambda a: "nearbyintf({0})",
    "Softsign": lambda a: "{0} / (1.0f + fabsf({0}))",
    "Mish": lambda a: "(float)((double){0} * tanh((double)fj_softplus({0})))",
    "Selu": lambda a: f"(float)({_flt(a['gamma'])} * ({{0}} > 0.0f ? (double){{0}} : {_flt(a['alpha'])} * "
                      f"expm1((double){{0}})))",
    "Celu": lambda a: f"(float)(fmax(0.0, (double){{0}}) + fmin(0.0, {_flt(a['alpha'])} * "
                      f"expm1((double){{0}} / {_flt(a['alpha'])})))",
    "ThresholdedRelu": lambda a: f"({{0}} > (float){_flt(a['alpha'])} ? {{0}} : 0.0f)",
    "Shrink": lambda a: f"({{0}} < -(float){_flt(a['lambd'])} ? {{0}} + (float){_flt(a['bias'])} : "
                        f"({{0}} > (float){_flt(a['lambd'])} ? {{0}} - (float){_flt(a['bias'])} : 0.0f))",
    "Swish": lambda a: f"(float)((double){{0}} / (1.0 + exp(-{_flt(a['alpha'])} * (double){{0}})))",
    "Not": lambda a: "({0} == 0.0f ? 1.0f : 0.0f)",  # a mask's negation (felixjax.onnx_logic)
    "IsNaN": lambda a: "({0} != {0} ? 1.0f : 0.0f)",
    "IsInf": lambda a: f"(({{0}} == INFINITY && {int(bool(a['positive']))}) || "
                       f"({{0}} == -INFINITY && {int(bool(a['negative']))}) ? 1.0f : 0.0f)",
    "Asin": lambda a: "asinf({0})", "Acos": lambda a: "acosf({0})", "Asinh": lambda a: "asinhf({0})",
    "Acosh": lambda a: "acoshf({0})", "Atanh": lambda a: "atanhf({0})",
}
BINARY = {"Max": "fj_max({0}, {1})", "Min": "fj_min({0}, {1})", "PRelu": "({0} < 0.0f ? {0} * {1} : {0})",
          "Mod": "fmodf({0}, {1})", "FloorMod": "fj_mod({0}, {1})",
          # masks as float 0 / 1 (felixjax.onnx_logic); a NaN compares false, as in IEEE
          **{op: f"({{0}} {c} {{1}} ? 1.0f : 0.0f)" for op, c in (("Greater", ">"), ("Less", "<"),
                                                                   ("GreaterOrEqual", ">="), ("LessOrEqual", "<="),
                                                                   ("Equal", "=="))},
          **{op: f"(({{0}} != 0.0f) {c} ({{1}} != 0.0f) ? 1.0f : 0.0f)" for op, c in (("And", "&&"), ("Or", "||"),
                                                                                       ("Xor", "!="))}}


def _r_unary(c: _Ctx, w: Any) -> None:
    shape = c.need(0)
    tmpl = UNARY[c.step.op](dict(c.step.attrs))
    _pointwise(w, shape, (c.y[0], _strides(shape), 0), [(c.x[0], _strides(shape), 0)], lambda v: tmpl.format(*v))


def _r_binary(c: _Ctx, w: Any) -> None:
    out = c.out_shapes[0]
    tmpl = BINARY[c.step.op]
    _pointwise(w, out, (c.y[0], _strides(out), 0),
               [(c.x[k], _bcast(c.need(k), out, f"input {k}"), 0) for k in (0, 1)], lambda v: tmpl.format(*v))


def _r_where(c: _Ctx, w: Any) -> None:
    out = c.out_shapes[0]
    _pointwise(w, out, (c.y[0], _strides(out), 0),
               [(c.x[k], _bcast(c.need(k), out, f"input {k}"), 0) for k in (0, 1, 2)],
               lambda v: f"({v[0]} != 0.0f ? {v[1]} : {v[2]})")


def _r_expand(c: _Ctx, w: Any) -> None:
    out = c.out_shapes[0]
    _pointwise(w, out, (c.y[0], _strides(out), 0), [(c.x[0], _bcast(c.need(0), out, "input"), 0)], lambda v: v[0])


def _r_slice(c: _Ctx, w: Any) -> None:
    shape, out = c.need(0), c.out_shapes[0]
    st = _strides(shape)
    slices = [tuple(s) for s in c.step.attrs["slices"]]
    if len(slices) != len(shape):
        c.fail(f"{len(slices)} slices for a rank-{len(shape)} input")
    base, strides = 0, []
    for d, (start, stop, step) in enumerate(slices):
        n = len(range(*slice(start, stop, step).indices(shape[d])))
        if n != out[d]:
            c.fail(f"slice {slices[d]} of axis {d} gives {n} entries, the output has {out[d]}")
        base += st[d] * (slice(start, stop, step).indices(shape[d])[0] if n else 0)
        strides.append(st[d] * step)
    _pointwise(w, out, (c.y[0], _strides(out), 0), [(c.x[0], strides, base)], lambda v: v[0])


def _table(w: Any, name: str, ctype: str, values: Sequence[Any]) -> None:
    items = [repr(float(v)) if ctype == "double" else str(int(v)) for v in values]
    w(f"static const {ctype} {name}[{max(1, len(items))}] = {{")
    for k in range(0, len(items), 16):
        w("    " + ", ".join(items[k:k + 16]) + ",")
    w("};")


def _r_gather(c: _Ctx, w: Any) -> None:
    shape = c.need(0)
    axis = int(c.step.attrs["axis"])
    idx = np.asarray(c.step.attrs["indices"], np.int64).reshape(-1)
    if idx.size and (idx.min() < 0 or idx.max() >= shape[axis]):
        c.fail(f"indices out of range for axis {axis} of size {shape[axis]}")
    outer, inner, n = math.prod(shape[:axis]), math.prod(shape[axis + 1:]), shape[axis]
    _table(w, "gi", "int", idx)
    if outer * idx.size * inner >= PARALLEL_MIN and outer * idx.size > 1:
        w("#pragma omp parallel for schedule(static) collapse(2)")
    w.open(f"for (long o = 0; o < {outer}; ++o)")
    w.open(f"for (long j = 0; j < {idx.size}; ++j)")
    w(f"const float* src = {c.x[0]} + (o*{n} + gi[j])*{inner};")
    w(f"float* dst = {c.y[0]} + (o*{idx.size} + j)*{inner};")
    w("#pragma omp simd")
    w(f"for (long i = 0; i < {inner}; ++i) dst[i] = src[i];")
    w.close()
    w.close()


def _r_reduce(c: _Ctx, w: Any) -> None:
    op = c.step.op
    k_ext, kn, r_ext, r_st, _ = reduction_nest(c, w)
    rn = [f"r{d}" for d in range(len(r_ext))]
    v = f"p[{_idx(0, r_st, rn)}]"

    def loop(body: str) -> None:
        for e, nm in zip(r_ext, rn):
            w.open(f"for (long {nm} = 0; {nm} < {e}; ++{nm})")
        w(body)
        for _ in r_ext:
            w.close()

    if op in ("ReduceMax", "ReduceMin"):
        w(f"float s = {'-' if op == 'ReduceMax' else ''}INFINITY;")
        cmp = ">" if op == "ReduceMax" else "<"
        loop(f"{{ const float v = {v}; s = (v {cmp} s || v != v) ? v : s; }}")
        final = "s"
    elif op == "ReduceLogSumExp":
        w("double m = -INFINITY, s = 0.0;")
        loop(f"{{ const double v = (double){v}; m = (v > m || v != v) ? v : m; }}")
        loop(f"s += exp((double){v} - m);")
        final = "log(s) + m"
    else:
        w(f"double s = {'1.0' if op == 'ReduceProd' else '0.0'};")
        acc = {"ReduceSum": "s += (double){0};", "ReduceLogSum": "s += (double){0};",
               "ReduceProd": "s *= (double){0};", "ReduceL1": "s += fabs((double){0});",
               "ReduceL2": "{{ const double v = (double){0}; s += v * v; }}",
               "ReduceSumSquare": "{{ const double v = (double){0}; s += v * v; }}"}[op]
        loop(acc.format(v))
        final = {"ReduceL2": "sqrt(s)", "ReduceLogSum": "log(s)"}.get(op, "s")
    w(f"{c.y[0]}[{_idx(0, _strides(k_ext), kn)}] = (float)({final});")
    close_reduction_nest(w, k_ext)


def _r_lrn(c: _Ctx, w: Any) -> None:
    shape = c.need(0)
    a = c.step.attrs
    size = int(a["size"])
    n, ch, inner = shape[0], shape[1], math.prod(shape[2:])
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    scale = float(a["alpha"]) / size
    if n * ch * inner * size >= PARALLEL_MIN and n * ch > 1:
        w("#pragma omp parallel for schedule(static) collapse(2)")
    w.open(f"for (long ni = 0; ni < {n}; ++ni)")
    w.open(f"for (long k = 0; k < {ch}; ++k)")
    w(f"const long c0 = k - {lo} < 0 ? 0 : k - {lo}, c1 = k + {hi} >= {ch} ? {ch - 1} : k + {hi};")
    w(f"const float* xp = {c.x[0]} + ni*{ch * inner};")
    w.open(f"for (long i = 0; i < {inner}; ++i)")
    w("double s = 0.0;")
    w(f"for (long j = c0; j <= c1; ++j) {{ const double v = (double)xp[j*{inner} + i]; s += v * v; }}")
    w(f"{c.y[0]}[(ni*{ch} + k)*{inner} + i] = (float)((double)xp[k*{inner} + i] / "
      f"pow({_flt(a['bias'])} + {_flt(scale)} * s, {_flt(a['beta'])}));")
    w.close()
    w.close()
    w.close()


def _r_pad(c: _Ctx, w: Any) -> None:
    mode = c.step.attrs.get("mode", "constant")
    if mode == "constant":
        return _r_pad_const(c, w)
    if mode not in ("reflect", "edge"):
        c.fail(f"pad mode {mode!r} has no C implementation")
    shape, out = c.need(0), c.out_shapes[0]
    pads = [(int(b), int(e)) for b, e in c.step.attrs["pads"]]
    ist, ost = _strides(shape), _strides(out)
    names = [f"o{d}" for d in range(len(out))]
    total = math.prod(out)
    if total >= PARALLEL_MIN and len(out) and out[0] > 1:
        w("#pragma omp parallel for schedule(static)")
    for d, e in enumerate(out):
        w.open(f"for (long {names[d]} = 0; {names[d]} < {e}; ++{names[d]})")
    terms = []
    for d, (b, e) in enumerate(pads):
        lo = max(0, -b)                      # the cropped region of the input along d
        n = shape[d] - lo - max(0, -e)
        w(f"long s{d} = {names[d]} - {max(0, b)};")
        if mode == "edge":
            w(f"s{d} = s{d} < 0 ? 0 : (s{d} >= {n} ? {n - 1} : s{d});")
        else:
            w(f"if (s{d} < 0) s{d} = -s{d};")
            w(f"if (s{d} >= {n}) s{d} = {2 * (n - 1)} - s{d};")
        terms.append(f"(s{d} + {lo})*{ist[d]}")
    w(f"{c.y[0]}[{_idx(0, ost, names)}] = {c.x[0]}[{' + '.join(terms) or '0'}];")
    for _ in out:
        w.close()


def _r_resize(c: _Ctx, w: Any) -> None:
    shape, out = c.need(0), c.out_shapes[0]
    taps = c.step.attrs["taps"]
    extrap = float(c.step.attrs.get("extrapolation_value", 0.0))
    by_axis = {int(ax): (np.asarray(i), np.asarray(wt), e) for ax, i, wt, e in taps}
    ist = _strides(shape)
    names = [f"o{d}" for d in range(len(out))]
    masked = []
    for ax, (index, weight, extra) in sorted(by_axis.items()):
        if index.shape[0] != out[ax]:
            c.fail(f"tap table of axis {ax} has {index.shape[0]} rows, the output has {out[ax]}")
        _table(w, f"ti{ax}", "int", index.reshape(-1))  # int: gcc 12 -O3 -march=native miscompiles long
        _table(w, f"tw{ax}", "double", weight.reshape(-1))
        if extra is not None:
            _table(w, f"tm{ax}", "unsigned char", np.asarray(extra, np.uint8))
            masked.append(ax)
    for d in range(len(out)):
        if d not in by_axis and out[d] != shape[d]:
            c.fail(f"axis {d} changes size ({shape[d]} -> {out[d]}) without a tap table")
    work = math.prod(out) * math.prod(by_axis[a][0].shape[1] for a in by_axis)
    if work >= PARALLEL_MIN and len(out) > 1 and out[0] * out[1] > 1:
        w("#pragma omp parallel for schedule(static) collapse(2)")
    for d, e in enumerate(out):
        w.open(f"for (long {names[d]} = 0; {names[d]} < {e}; ++{names[d]})")
    y = f"{c.y[0]}[{_idx(0, _strides(out), names)}]"
    if masked:
        w(f"if ({' || '.join(f'tm{a}[{names[a]}]' for a in masked)}) {{ {y} = (float){_flt(extrap)}; continue; }}")
    # one partial sum per resized axis (nested as the separable sum). gcc 12 -O3 -march=native (AVX-512)
    # miscompiles these loops with 64-bit index tables (garbage outputs): the index tables are int.
    src = [f"{names[d]}*{ist[d]}" for d in range(len(out)) if d not in by_axis]
    axes = sorted(by_axis)
    for k, d in enumerate(axes):
        t = by_axis[d][0].shape[1]
        w(f"double acc{d} = 0.0;")
        w.open(f"for (long t{d} = 0; t{d} < {t}; ++t{d})")
        w(f"const long r{d} = {names[d]}*{t} + t{d};")
        src.append(f"ti{d}[r{d}]*{ist[d]}")
    w(f"acc{axes[-1]} += tw{axes[-1]}[r{axes[-1]}] * (double){c.x[0]}[{' + '.join(src)}];")
    for k in range(len(axes) - 1, 0, -1):
        w.close()
        w(f"acc{axes[k - 1]} += tw{axes[k - 1]}[r{axes[k - 1]}] * acc{axes[k]};")
    w.close()
    w(f"{y} = (float)acc{axes[0]};")
    for _ in out:
        w.close()


def _r_log_softmax(c: _Ctx, w: Any) -> None:
    outer, cnt, inner = softmax_extents(c, "log-softmax")
    if outer * inner >= 2 and outer * cnt * inner >= PARALLEL_MIN // 4:
        w("#pragma omp parallel for schedule(static) collapse(2)")
    w.open(f"for (long o = 0; o < {outer}; ++o)")
    w.open(f"for (long i = 0; i < {inner}; ++i)")
    w(f"const float* xp = {c.x[0]} + o*{cnt * inner} + i;")
    w(f"float* yp = {c.y[0]} + o*{cnt * inner} + i;")
    w("double m = -INFINITY;")
    w(f"for (long j = 0; j < {cnt}; ++j) {{ const double v = (double)xp[j*{inner}]; m = (v > m || v != v) ? v : m; }}")
    w("double s = 0.0;")
    w(f"for (long j = 0; j < {cnt}; ++j) s += exp((double)xp[j*{inner}] - m);")
    w("const double lse = m + log(s);")
    w(f"for (long j = 0; j < {cnt}; ++j) yp[j*{inner}] = (float)((double)xp[j*{inner}] - lse);")
    w.close()
    w.close()


def _r_cumsum(c: _Ctx, w: Any) -> None:
    """ONNX CumSum along ``axis`` (``exclusive``, ``reverse``), accumulated in double (as the numpy reference)."""
    shape = c.need(0)
    axis = int(c.step.attrs["axis"])
    outer, cnt, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
    excl, rev = bool(c.step.attrs["exclusive"]), bool(c.step.attrs["reverse"])
    if outer * inner >= 2 and outer * cnt * inner >= PARALLEL_MIN:
        w("#pragma omp parallel for schedule(static) collapse(2)")
    w.open(f"for (long o = 0; o < {outer}; ++o)")
    w.open(f"for (long i = 0; i < {inner}; ++i)")
    w(f"const float* xp = {c.x[0]} + o*{cnt * inner} + i;")
    w(f"float* yp = {c.y[0]} + o*{cnt * inner} + i;")
    w(f"double s = {'0.0' if excl else '-0.0'};")  # (-0.0 + x is x, a -0.0 included, as onnxruntime's first sum)
    w.open(f"for (long t = 0; t < {cnt}; ++t)")
    w(f"const long j = {f'{cnt - 1} - t' if rev else 't'};")
    add, put = f"s += (double)xp[j*{inner}];", f"yp[j*{inner}] = (float)s;"
    w(f"{put} {add}" if excl else f"{add} {put}")
    w.close()
    w.close()
    w.close()


def _r_arg(c: _Ctx, w: Any) -> None:
    """ONNX ArgMax / ArgMin along ``axis`` as onnxruntime scans (see ``felixjax.graph_ops.arg_index``); the index
    is written as a float."""
    shape = c.need(0)
    axis = int(c.step.attrs["axis"])
    outer, cnt, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
    cmp = ">" if c.step.op == "ArgMax" else "<"
    if c.step.attrs.get("select_last_index"):
        cmp += "="
    if outer * inner >= 2 and outer * cnt * inner >= PARALLEL_MIN:
        w("#pragma omp parallel for schedule(static) collapse(2)")
    w.open(f"for (long o = 0; o < {outer}; ++o)")
    w.open(f"for (long i = 0; i < {inner}; ++i)")
    w(f"const float* xp = {c.x[0]} + o*{cnt * inner} + i;")
    w("float best = xp[0]; long at = 0;")
    w.open(f"for (long j = 1; j < {cnt}; ++j)")
    w(f"const float v = xp[j*{inner}];")
    w(f"if (v {cmp} best) {{ best = v; at = j; }}")
    w.close()
    w(f"{c.y[0]}[o*{inner} + i] = (float)at;")
    w.close()
    w.close()


def _r_topk(c: _Ctx, w: Any) -> None:
    """ONNX TopK (see ``felixjax.graph_ops.topk``): per row an insertion into the k slots of the outputs (unused
    indices' slots in the scratch), O(n k)."""
    shape = c.need(0)
    a = c.step.attrs
    axis, k = int(a["axis"]), int(a["k"])
    outer, n, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
    vals, idx = c.y[0], (c.y[1] if len(c.y) > 1 else None) or "((float*)ws)"
    beats = ("(v > b || (v != v && b == b))" if a["largest"] else "(v < b || (v == v && b != b))")
    if outer * inner >= 2 and outer * n * inner >= PARALLEL_MIN:
        w("#pragma omp parallel for schedule(static) collapse(2)")
    w.open(f"for (long o = 0; o < {outer}; ++o)")
    w.open(f"for (long i = 0; i < {inner}; ++i)")
    w(f"const float* xp = {c.x[0]} + o*{n * inner} + i;")
    w(f"float* vp = {vals} + o*{k * inner} + i;")
    w(f"float* ip = {idx} + o*{k * inner} + i;")
    w("long cnt = 0;")
    w.open(f"for (long j = 0; j < {n}; ++j)")
    w(f"const float v = xp[j*{inner}];")
    w(f"if (cnt == {k}) {{ const float b = vp[{(k - 1) * inner}]; if (!{beats}) continue; }}")
    w(f"long p = cnt < {k} ? cnt : {k - 1};")
    w(f"while (p > 0) {{ const float b = vp[(p - 1)*{inner}]; if (!{beats}) break; "
      f"vp[p*{inner}] = b; ip[p*{inner}] = ip[(p - 1)*{inner}]; --p; }}")
    w(f"vp[p*{inner}] = v; ip[p*{inner}] = (float)j;")
    w(f"if (cnt < {k}) ++cnt;")
    w.close()
    w.close()
    w.close()


MORE_RENDERERS: dict[str, Callable[[_Ctx, Any], None]] = {
    **{op: _r_unary for op in UNARY}, **{op: _r_binary for op in BINARY},
    "Where": _r_where, "Expand": _r_expand, "Slice": _r_slice, "Gather": _r_gather,
    **{op: _r_reduce for op in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                                "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp")},
    "LRN": _r_lrn, "Pad": _r_pad,
    "Resize": _r_resize, "LogSoftmax": _r_log_softmax, "CumSum": _r_cumsum,
    "ArgMax": _r_arg, "ArgMin": _r_arg, "TopK": _r_topk,
}
