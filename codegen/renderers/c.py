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

C_DIALECT = Dialect(
    name="c",
    prelude="#include <math.h>\n#include <stddef.h>\n#include <time.h>\n#include <omp.h>\n",
    harness=TIMING_HARNESS_C,
    pin="FJ_PIN({v});",
    pin_macro=("#ifndef FJ_PIN\n#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))\n"
               "#define FJ_PIN(v) __asm__(\"\" : \"+x\"(v))\n#else\n#define FJ_PIN(v) ((void)0)\n#endif\n#endif"),
    no_predictive_commoning='__attribute__((optimize("no-predictive-commoning"))) ',
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
