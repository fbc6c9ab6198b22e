"""The float16 conversion steps of the whole-network build: ``to_float16`` (float32 -> float16, round to
nearest even, as numpy's ``astype(np.float16)``) before a float16 kernel, ``to_float32`` (float16 ->
float32, exact) after it. Activations between layers stay float32; these steps are timed like any other.

Where the compiler targets F16C (``__F16C__``, e.g. ``-march=native`` on AVX2 machines) the C converts
8 lanes at a time with ``_mm256_cvtps_ph`` / ``_mm256_cvtph_ps`` (and the scalar ``_cvtss_sh`` /
``_cvtsh_ss`` for the tail); elsewhere a portable scalar conversion on the bit patterns (rounding to
nearest even, subnormals, overflow to infinity and NaN handled as IEEE 754 does), so an exported model
still builds for a board without F16C. float16 values are stored as ``unsigned short`` bit patterns, through
a ``may_alias`` type (``fj_f16bits``): the float16 kernels read and write the same bytes as ``_Float16``, and
with plain ``unsigned short`` gcc -O3, inlining a network's steps into one function, let a scalar tail read
bytes the kernel before it had written (wrong outputs; session 76, a strict-aliasing violation).
"""
from __future__ import annotations

from ..renderers.cstyle import Writer as _Writer
from .cheap_ops import PARALLEL_MIN

#: conversion step op -> (input dtype, output dtype)
CONVERSIONS = {"to_float16": ("float32", "float16"), "to_float32": ("float16", "float32")}

#: emitted once per file that has a conversion step: the F16C header where the target has it, and the
#: portable scalar conversions (IEEE 754 binary16, round to nearest even)
F16_PRELUDE = r"""#if defined(__F16C__)
#include <immintrin.h>
#endif
typedef unsigned short __attribute__((may_alias)) fj_f16bits;  /* float16 bits: the kernels' _Float16 too */
static inline unsigned short fj_f32_to_f16(float f) {
    unsigned int x;
    memcpy(&x, &f, 4);
    const unsigned int sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u)  /* infinity, NaN (quiet, payload kept where it fits) */
        return (unsigned short)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0u));
    if (ax >= 0x477ff000u)  /* >= 65520 rounds past 65504: infinity */
        return (unsigned short)(sign | 0x7c00u);
    if (ax < 0x38800000u) {  /* below 2^-14: a float16 subnormal, k * 2^-24 */
        const unsigned int e = ax >> 23;
        if (e < 102u) return (unsigned short)sign;  /* below 2^-25: rounds to zero */
        const unsigned int m = (ax & 0x7fffffu) | 0x800000u, shift = 126u - e;  /* 14 .. 24 */
        unsigned int k = m >> shift;
        const unsigned int rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (k & 1u))) ++k;
        return (unsigned short)(sign | k);
    }
    unsigned int r = ax - 0x38000000u;  /* exponent bias 127 -> 15 */
    r += 0xfffu + ((r >> 13) & 1u);  /* round the 13 dropped bits to nearest even */
    return (unsigned short)(sign | (r >> 13));
}
static inline float fj_f16_to_f32(unsigned short h) {
    const unsigned int sign = (unsigned int)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    unsigned int x;
    float f;
    if (e == 0x1fu) {
        x = sign | 0x7f800000u | (m << 13);
    } else if (e) {
        x = sign | ((e + 112u) << 23) | (m << 13);
    } else {
        f = (float)m * 5.9604644775390625e-08f;  /* a subnormal: m * 2^-24, exact */
        memcpy(&x, &f, 4);
        x |= sign;
    }
    memcpy(&f, &x, 4);
    return f;
}
"""


def emit_conversion(w: _Writer, s: int, op: str, n: int) -> str:
    """Write step ``s`` (``to_float16`` or ``to_float32`` of ``n`` elements) as ``fj_s{s}``; returns the
    C type of its input and of its output pointer (the caller casts the arguments)."""
    src, dst = ("float", "fj_f16bits") if op == "to_float16" else ("fj_f16bits", "float")
    blocks = n // 8
    w(f"/* step {s}: {op} of {n} elements (F16C where the target has it, else portable scalar code) */")
    w.open(f"static void fj_s{s}(const {src}* restrict x, {dst}* restrict y)")
    w("#if defined(__F16C__)")
    if blocks:
        if n >= PARALLEL_MIN:
            w("#pragma omp parallel for schedule(static)")
        if op == "to_float16":
            w(f"for (long b = 0; b < {blocks}L; ++b) _mm_storeu_si128((__m128i*)(y + 8 * b), "
              "_mm256_cvtps_ph(_mm256_loadu_ps(x + 8 * b), _MM_FROUND_TO_NEAREST_INT));")
        else:
            w(f"for (long b = 0; b < {blocks}L; ++b) _mm256_storeu_ps(y + 8 * b, "
              "_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(x + 8 * b))));")
    if n % 8:
        tail = "_cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT)" if op == "to_float16" else "_cvtsh_ss(x[i])"
        w(f"for (long i = {8 * blocks}L; i < {n}L; ++i) y[i] = {tail};")
    w("#else")
    if n >= PARALLEL_MIN:
        w("#pragma omp parallel for schedule(static)")
    fn = "fj_f32_to_f16" if op == "to_float16" else "fj_f16_to_f32"
    w(f"for (long i = 0; i < {n}L; ++i) y[i] = {fn}(x[i]);")
    w("#endif")
    w.close()
    w()
    return src, dst
