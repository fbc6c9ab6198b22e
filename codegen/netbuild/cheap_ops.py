"""Generic C kernels of the cheap (untuned) ops: one static function body per step, every shape baked
in (numpy semantics, broadcasting included). ``_RENDERERS`` maps an op name to its renderer."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..render_c import _Writer
from .spec import NetBuildError, Step

PARALLEL_MIN = 1 << 15  # elements (or multiply-adds) below which a cheap op runs on one thread
ROW_IN_REGISTERS = 64  # MatMul / Gemm rows accumulate in register chunks of this many outputs (8 AVX2 vectors)

ELEMENTWISE_BINARY = {"Add": "{0} + {1}", "Sub": "{0} - {1}", "Mul": "{0} * {1}", "Div": "{0} / {1}",
                      "Pow": "powf({0}, {1})"}
ELEMENTWISE_UNARY = {"Sqrt": "sqrtf({0})", "Relu": "fj_relu({0})", "Sigmoid": "fj_sigmoid({0})",
                     "Tanh": "tanhf({0})", "Erf": "fj_erf({0})", "Identity": "{0}", "Dropout": "{0}"}
CHEAP_OPS = tuple(ELEMENTWISE_BINARY) + tuple(ELEMENTWISE_UNARY) + (
    "Clip", "ScaleShift", "BatchNormalization", "LayerNormalization", "ReduceMean", "MaxPool", "AveragePool",
    "Softmax", "Transpose", "Concat", "Pad", "Reshape", "Conv", "Gemm", "MatMul", "Reblock")

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
#if defined(__FAST_MATH__) || defined(__ASSOCIATIVE_MATH__) || defined(__clang__)
    /* reassociation would fold the shift below (clang allows it without saying: no __ASSOCIATIVE_MATH__) */
    const float n = __builtin_rintf(x * 1.44269504088896341f);
#else
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  /* round to nearest */
#endif
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
typedef float fj_v8 __attribute__((vector_size(32)));  /* MatMul rows: named vector accumulators */
static inline fj_v8 fj_ld8(const float* p) { fj_v8 v; __builtin_memcpy(&v, p, sizeof v); return v; }
static inline float fj_sigmoid(float x) {
    const float e = fj_exp(x < 0.0f ? x : -x);  /* exp(-|x|) <= 1: no overflow either way */
    return x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}
"""


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


def reduction_nest(c: _Ctx, w: _Writer) -> tuple[list, list, list, list, int]:
    """Open the loop nest of a reduction over ``axes`` of input 0 (the kept axes, parallel when large
    enough) and point ``p`` at the first reduced element; returns ``(k_ext, kn, r_ext, r_st, count)``.
    The caller emits the reduction over ``r_ext`` (strides ``r_st``), stores at ``kn``, then calls
    :func:`close_reduction_nest`."""
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
    return k_ext, kn, r_ext, r_st, count


def close_reduction_nest(w: _Writer, k_ext: list) -> None:
    for _ in k_ext:
        w.close()
    w.depth -= 1
    w("}")


def _r_reduce_mean(c: _Ctx, w: _Writer) -> None:
    k_ext, kn, r_ext, r_st, count = reduction_nest(c, w)
    w("double s = 0.0;")
    rn = [f"r{d}" for d in range(len(r_ext))]
    for e, nm in zip(r_ext, rn):
        w.open(f"for (long {nm} = 0; {nm} < {e}; ++{nm})")
    w(f"s += (double)p[{_idx(0, r_st, rn)}];")
    for _ in r_ext:
        w.close()
    out_idx = _idx(0, _strides(k_ext), kn)
    w(f"{c.y[0]}[{out_idx}] = (float)(s / {count}.0);")
    close_reduction_nest(w, k_ext)


def _r_pool(c: _Ctx, w: _Writer) -> None:
    shape, out = c.need(0), c.out_shapes[0]
    if len(shape) != 4 or len(out) != 4:
        c.fail("pooling takes 4-D NCHW tensors")
    a = c.step.attrs
    (kh, kw), (sh, sw), (dh, dw) = a["kernel"], a["strides"], a.get("dilations", (1, 1))
    pt, pl, pb, pr = a["pads"]
    n, ch, h, wd = shape
    oh, ow = out[2], out[3]
    include = bool(a.get("count_include_pad", 0))
    if n * ch * oh * ow * kh * kw >= PARALLEL_MIN and n * ch > 1:
        w("#pragma omp parallel for schedule(static)")
    if c.step.op == "MaxPool":
        _max_pool_rows(c, w, shape, out)
        return
    # AveragePool: per output pixel (the sum in double, the count with or without the padding)
    w.open(f"for (long nc = 0; nc < {n * ch}; ++nc)")
    w(f"const float* xp = {c.x[0]} + nc*{h * wd};")
    w(f"float* yp = {c.y[0]} + nc*{oh * ow};")
    w.open(f"for (long oy = 0; oy < {oh}; ++oy)")
    w.open(f"for (long ox = 0; ox < {ow}; ++ox)")
    w("double s = 0.0; long cnt = 0;")
    w.open(f"for (long ky = 0; ky < {kh}; ++ky)")
    w(f"const long iy = oy*{sh} - {pt} + ky*{dh};")
    w.open(f"for (long kx = 0; kx < {kw}; ++kx)")
    w(f"const long ix = ox*{sw} - {pl} + kx*{dw};")
    w(f"const int inside = iy >= 0 && iy < {h} && ix >= 0 && ix < {wd};")
    w(f"if (inside) s += (double)xp[iy*{wd} + ix];")
    if include:
        w(f"cnt += iy >= -{pt} && iy < {h + pb} && ix >= -{pl} && ix < {wd + pr};")
    else:
        w("cnt += inside;")
    w.close()
    w.close()
    w(f"yp[oy*{ow} + ox] = (float)(s / (double)cnt);")
    w.close()
    w.close()
    w.close()


def _max_pool_rows(c: _Ctx, w: _Writer, shape, out) -> None:
    """MaxPool a row of outputs at a time: the row starts at -inf and every kernel tap whose input row is
    inside the image updates, in one loop over the output columns, the range of columns whose input
    column is inside (computed per tap: no per-element bounds test, so the loop vectorizes, strided
    loads included). Same result as the per-pixel loop, NaN propagation included (a NaN input wins,
    and a NaN kept stays). ResNet-18's 3x3 stride-2 pool over 64 x 112 x 112 took 5.96 ms of a 48 ms
    network at 1 thread in the per-pixel form (AVX2 EPYC, ``benchmarks/network_gap.py``)."""
    a = c.step.attrs
    (kh, kw), (sh, sw), (dh, dw) = a["kernel"], a["strides"], a.get("dilations", (1, 1))
    pt, pl = a["pads"][0], a["pads"][1]
    _, _, h, wd = shape
    oh, ow = out[2], out[3]
    w.open(f"for (long nc = 0; nc < {shape[0] * shape[1]}; ++nc)")
    w(f"const float* xp = {c.x[0]} + nc*{h * wd};")
    w(f"float* yp = {c.y[0]} + nc*{oh * ow};")
    w.open(f"for (long oy = 0; oy < {oh}; ++oy)")
    w(f"float* yr = yp + oy*{ow};")
    w(f"for (long ox = 0; ox < {ow}; ++ox) yr[ox] = -INFINITY;")
    w.open(f"for (long ky = 0; ky < {kh}; ++ky)")
    w(f"const long iy = oy*{sh} - {pt} + ky*{dh};")
    w(f"if (iy < 0 || iy >= {h}) continue;")
    w(f"const float* xr = xp + iy*{wd};")
    w.open(f"for (long kx = 0; kx < {kw}; ++kx)")
    # input column ix = ox*sw - a; inside for ox in [lo, hi)
    w(f"const long a = {pl} - kx*{dw}, b = {wd - 1} + a;")
    w(f"long lo = a > 0 ? (a + {sw - 1}) / {sw} : 0, hi = b >= 0 ? b / {sw} + 1 : 0;")
    w(f"lo = lo < {ow} ? lo : {ow}; hi = hi < {ow} ? hi : {ow};")
    w.open("for (long ox = lo; ox < hi; ++ox)")
    w(f"const float v = xr[ox*{sw} - a], m = yr[ox];")
    w("yr[ox] = (v > m || v != v) ? v : m;")
    w.close()
    w.close()
    w.close()
    w.close()
    w.close()


def softmax_extents(c: _Ctx, what: str) -> tuple[int, int, int]:
    """``(outer, count, inner)`` of a (log-)softmax over a contiguous range of input 0's axes."""
    shape = c.need(0)
    axes = sorted(int(a) for a in c.step.attrs["axes"])
    if not axes or axes != list(range(axes[0], axes[-1] + 1)) or axes[-1] >= len(shape):
        c.fail(f"{what} axes {axes} must be a contiguous range of the {len(shape)} axes")
    return (math.prod(shape[: axes[0]]), math.prod(shape[axes[0]: axes[-1] + 1]),
            math.prod(shape[axes[-1] + 1:]))


def _r_softmax(c: _Ctx, w: _Writer) -> None:
    outer, cnt, inner = softmax_extents(c, "softmax")
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


def _r_reblock(c: _Ctx, w: _Writer) -> None:
    """NCHW -> NCHW[b]c (``to="nchwc"``) or back (``"nchw"``): a transpose of the channel blocks' lanes,
    iterated in the blocked side's order, lanes innermost (felixjax.layout). To NCHW that reads 8-lane
    vectors; over the destination's order each lane's pass read every b-th float (a 64x112x112 value
    1.34 -> 0.59 ms, 1 thread)."""
    b = int(c.step.attrs["block"])
    n, ch, h, wd = c.need(0) if c.step.attrs["to"] == "nchwc" else c.out_shapes[0]
    order = (0, 1, 3, 4, 2)  # n, channel block, h, w, lane
    ext = tuple((n, ch // b, b, h, wd)[i] for i in order)
    plain = [[ch * h * wd, b * h * wd, h * wd, wd, 1][i] for i in order]
    blocked = [[ch * h * wd, b * h * wd, 1, wd * b, b][i] for i in order]
    if c.step.attrs["to"] == "nchwc":
        _pointwise(w, ext, (c.y[0], blocked, 0), [(c.x[0], plain, 0)], lambda v: v[0])
    else:
        _pointwise(w, ext, (c.y[0], plain, 0), [(c.x[0], blocked, 0)], lambda v: v[0])


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
    """``y[0:n] = sum_k a[a_row + k*a_k] * b[k*b_k + j*b_n]`` (i-k-j order: the j loop is SIMD). The row
    is computed in chunks of at most :data:`ROW_IN_REGISTERS` outputs, each accumulated in registers
    across the k loop (the output row in memory cost a load and a store per FMA: an attention MatMul 4 x
    128 x 128 x 64 ran at ~28 GFLOP/s in a built transformer block); a longer row re-reads its ``a``
    values once per chunk. With contiguous ``b`` rows (``b_n == 1``) the accumulators are named 8-lane
    vectors: a local array was kept on the stack by gcc inside the parallel loop (a load and a store per
    FMA again, 0.39 ms for the block's Q.K^T); the last ``size % 8`` outputs (and strided ``b``) use a
    local array."""
    a_at = f"{a}[{a_row} + k*{a_k}]" if a_row != "0" else f"{a}[k*{a_k}]"

    def chunk(off: str, size: int) -> None:  # outputs off .. off + size - 1 of the row
        nv = size // 8 if b_n == 1 else 0  # named vector accumulators
        tail = size - 8 * nv
        if nv:
            w("fj_v8 " + ", ".join(f"v{m} = {{0}}" for m in range(nv)) + ";")
        if tail:
            w(f"float acc[{tail}];")
            w(f"for (long j = 0; j < {tail}; ++j) acc[j] = 0.0f;")
        w.open(f"for (long k = 0; k < {kk}; ++k)")
        w(f"const float av = {a_at};")
        if nv:
            w(f"const fj_v8 avv = (fj_v8){{0}} + av; const float* bk = {b} + k*{b_k} + {off}0;")
            for m in range(nv):
                w(f"v{m} += avv * fj_ld8(bk + {8 * m});")
        if tail:
            w("#pragma omp simd")
            w(f"for (long j = 0; j < {tail}; ++j) acc[j] += av * {b}[k*{b_k} + ({off}{8 * nv} + j)*{b_n}];")
        w.close()
        for m in range(nv):
            w(f"__builtin_memcpy({y} + {off}{8 * m}, &v{m}, sizeof v{m});")
        if tail:
            w(f"for (long j = 0; j < {tail}; ++j) {y}[{off}{8 * nv} + j] = acc[j];")

    full = n // ROW_IN_REGISTERS if n > ROW_IN_REGISTERS else 0
    rest = n - full * ROW_IN_REGISTERS
    if full:
        w.open(f"for (long j0 = 0; j0 < {full * ROW_IN_REGISTERS}; j0 += {ROW_IN_REGISTERS})")
        chunk("j0 + ", ROW_IN_REGISTERS)
        w.close()
    if rest:
        w.open("")
        chunk(f"{full * ROW_IN_REGISTERS} + " if full else "", rest)
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
    "Conv": _r_conv, "Gemm": _r_gemm, "MatMul": _r_matmul, "Reblock": _r_reblock,
}
assert set(_RENDERERS) == set(CHEAP_OPS)
# the ops real exporters add (Where, Slice, Gather, Resize, LRN, ...) are in more_ops.py (which imports the
# helpers above); codegen/netbuild/kernels.py merges both into the tables emission uses.
