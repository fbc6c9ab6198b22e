"""The C dialect: C11 (GNU) + OpenMP + GCC vector extensions, the CPU target's renderer.

Every spelling is a field of :class:`~codegen.renderers.cstyle.Dialect`; the defaults of that table are the
C spellings, so this table only names the prelude and the harness. ``render`` / ``render_kernel`` are
the bound methods of the C renderer.

Example:
    >>> from codegen.ops import matmul
    >>> from codegen.space import Space
    >>> from codegen.target import Target
    >>> from codegen.lower import lower
    >>> sp = Space(matmul(64, 64, 64), "gemm_packed", Target.cpu())
    >>> "fj_kernel" in render(lower(sp, sp.default()))
    True
"""
from __future__ import annotations

from .cstyle import CStyleRenderer, Dialect, Writer
from .harness import TIMING_HARNESS_C
from .depthwise import is_depthwise, render_depthwise, render_depthwise_kernel
from .dw_nchwc import is_dw_nchwc, render_dw_nchwc, render_dw_nchwc_kernel
from .sparse import render_sparse, render_sparse_kernel
from .winograd import is_winograd, render_winograd, render_winograd_kernel

#: masked loads / stores of the first n lanes (the rest zero / untouched): AVX-512 mask registers, AVX2
#: vmaskmov, else lane by lane (a GNU statement expression). Masked lanes never fault.
MASK_MACRO = r"""#ifndef FJ_MLOAD16
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#define FJ_MLOADN(p, n, w) ({ vf fj_t_ = {0}; for (long fj_j_ = 0; fj_j_ < (long)(n) && fj_j_ < (w); ++fj_j_) \
    fj_t_[fj_j_] = (p)[fj_j_]; fj_t_; })
#define FJ_MSTOREN(p, n, v, w) do { for (long fj_j_ = 0; fj_j_ < (long)(n) && fj_j_ < (w); ++fj_j_) \
    (p)[fj_j_] = (v)[fj_j_]; } while (0)
#if defined(__AVX512F__)
#define FJ_MASK16(n) ((__mmask16)((long)(n) >= 16 ? 0xFFFFu : ((long)(n) <= 0 ? 0u : (1u << (n)) - 1u)))
#define FJ_MLOAD16(p, n) ((vf)_mm512_maskz_loadu_ps(FJ_MASK16(n), (p)))
#define FJ_MSTORE16(p, n, v) _mm512_mask_storeu_ps((p), FJ_MASK16(n), (__m512)(v))
#else
#define FJ_MLOAD16(p, n) FJ_MLOADN(p, n, 16)
#define FJ_MSTORE16(p, n, v) FJ_MSTOREN(p, n, v, 16)
#endif
#if defined(__AVX2__)
#define FJ_MASK8(n) _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
#define FJ_MLOAD8(p, n) ((vf)_mm256_maskload_ps((p), FJ_MASK8(n)))
#define FJ_MSTORE8(p, n, v) _mm256_maskstore_ps((p), FJ_MASK8(n), (__m256)(v))
#define FJ_MASK4(n) _mm_cmpgt_epi32(_mm_set1_epi32((int)(n)), _mm_setr_epi32(0, 1, 2, 3))
#define FJ_MLOAD4(p, n) ((vf)_mm_maskload_ps((p), FJ_MASK4(n)))
#define FJ_MSTORE4(p, n, v) _mm_maskstore_ps((p), FJ_MASK4(n), (__m128)(v))
#else
#define FJ_MLOAD8(p, n) FJ_MLOADN(p, n, 8)
#define FJ_MSTORE8(p, n, v) FJ_MSTOREN(p, n, v, 8)
#define FJ_MLOAD4(p, n) FJ_MLOADN(p, n, 4)
#define FJ_MSTORE4(p, n, v) FJ_MSTOREN(p, n, v, 4)
#endif
#define FJ_MLOAD2(p, n) FJ_MLOADN(p, n, 2)
#define FJ_MSTORE2(p, n, v) FJ_MSTOREN(p, n, v, 2)
#endif"""

# FJ_PIN<lanes>(v): keep a float32 vector of that many lanes in a vector register (an empty asm that claims to
# rewrite it); a no-op where the compiler's flags have no register that wide (an exported network built with
# another -march than the machine it was generated for: "+x" on a 64-byte vector without AVX-512 does not compile)
PIN_MACRO = """#ifndef FJ_PIN4
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && defined(__SSE__)
#define FJ_PIN_X(v) __asm__("" : "+x"(v))
#else
#define FJ_PIN_X(v) ((void)0)
#endif
#define FJ_PIN2(v) FJ_PIN_X(v)
#define FJ_PIN4(v) FJ_PIN_X(v)
#if defined(__AVX__)
#define FJ_PIN8(v) FJ_PIN_X(v)
#else
#define FJ_PIN8(v) ((void)0)
#endif
#if defined(__AVX512F__)
#define FJ_PIN16(v) FJ_PIN_X(v)
#else
#define FJ_PIN16(v) ((void)0)
#endif
#endif"""

C_DIALECT = Dialect(
    name="c",
    prelude="#include <math.h>\n#include <stddef.h>\n#include <time.h>\n#include <omp.h>\n",
    harness=TIMING_HARNESS_C,
    pin="FJ_PIN{vec}({v});",
    pin_macro=PIN_MACRO,
    no_predictive_commoning='__attribute__((optimize("no-predictive-commoning"))) ',
    load_masked="FJ_MLOAD{vec}({ptr}, {n})",
    store_masked="FJ_MSTORE{vec}({ptr}, {n}, {v});",
    mask_macro=MASK_MACRO,
    bcast8="FJ_BCAST8({ptr})",
    bcast_macro=("#ifndef FJ_BCAST8\n#if defined(__AVX__)\n#include <immintrin.h>\n"
                 "#define FJ_BCAST8(p) ((vf)_mm256_broadcast_ss(p))\n#else\n"
                 "#define FJ_BCAST8(p) ((vf){0} + *(p))\n#endif\n#endif"),
)

C_RENDERER = CStyleRenderer(C_DIALECT)


def render(plan) -> str:
    """Full C source of a lowered plan (a sparse sketch's plan: :mod:`codegen.renderers.sparse`; the
    depthwise sketch's: :mod:`codegen.renderers.depthwise`)."""
    if is_depthwise(plan):
        return render_depthwise(plan)
    if is_dw_nchwc(plan):
        return render_dw_nchwc(plan)
    if is_winograd(plan):
        return render_winograd(plan)
    return render_sparse(plan) if getattr(plan, "sparse", False) else C_RENDERER.render(plan)


def render_kernel(plan, w: Writer, *, name: str = "fj_kernel", static: bool = False, local_types: bool = False) -> None:
    """Only the kernel function (and, for a sparse plan, its static weights) of ``plan`` into ``w``."""
    fn = render_sparse_kernel if getattr(plan, "sparse", False) else C_RENDERER.render_kernel
    if is_depthwise(plan):
        fn = render_depthwise_kernel
    if is_dw_nchwc(plan):
        fn = render_dw_nchwc_kernel
    if is_winograd(plan):
        fn = render_winograd_kernel
    fn(plan, w, name=name, static=static, local_types=local_types)
