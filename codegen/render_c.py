"""C renderer (the old module name): re-exports :mod:`codegen.renderers` (the C-family base in
:mod:`codegen.renderers.cstyle`, the C dialect in :mod:`codegen.renderers.c`), so
``from codegen.render_c import render`` keeps working.

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

# ruff: noqa: F401  (re-exports)
from .renderers.c import C_DIALECT, C_RENDERER, render, render_kernel
from .renderers.cstyle import (L1_SET_BYTES, MAX_UNROLLED_FMAS, PACK_MAX_FLOATS, PACK_MIN_REUSE, PACK_NAME,
                                PACK_PAD, CStyleRenderer, Dialect, Writer, _affine, _data_pack, _DataPack,
                                _l1_conflicts, _live, _offset, _Writer)
from .renderers.harness import TIMING_HARNESS_C
