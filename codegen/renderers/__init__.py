"""Rendering lowered plans as source: a C-family renderer base and one dialect table per target.

* :mod:`codegen.renderers.cstyle`: :class:`Dialect` (every target-specific spelling), :class:`CStyleRenderer`
  (the loop structure, register block and epilogue shared by the C family), :class:`Writer`.
* :mod:`codegen.renderers.c`: the C + OpenMP + vector-extension dialect (``C_DIALECT``, ``render``).
* :mod:`codegen.renderers.harness`: the timing harnesses appended to standalone kernel sources.

(Named ``renderers``, not ``render``: ``codegen.render`` is the public C render function.)

Adding a target: a new :class:`Dialect` (and its harness), ``CStyleRenderer(dialect)``.

ABI (every kernel library exports):

* ``void fj_kernel(void* const* bufs)``: ``bufs`` = kernel inputs (``Plan.args`` order: data,
  packed weights, bias, residual), then the output, then the workspace; each argument buffer holds
  elements of its ``Plan.arg_dtypes()`` entry (the task's dtype), the workspace is
  ``Plan.workspace_bytes`` bytes; every pointer is 64-byte aligned;
* ``double fj_time(void* const* bufs, long number)``: seconds for ``number`` back-to-back calls;
* ``void fj_set_threads(int n)``.
"""
from __future__ import annotations

from .c import C_DIALECT, C_RENDERER, render, render_kernel
from .cstyle import CStyleRenderer, Dialect, Writer
from .harness import HARNESSES, TIMING_HARNESS_C

__all__ = ["C_DIALECT", "C_RENDERER", "HARNESSES", "TIMING_HARNESS_C", "CStyleRenderer", "Dialect", "Writer",
           "render", "render_kernel"]
