"""Timing harnesses: the entry points a standalone kernel source gets appended so the runner can time
it without Python overhead per call.

Every kernel library exports the kernel ABI (see :mod:`codegen.renderers`)::

    void fj_kernel(void* const* bufs);               // one call of the kernel
    double fj_time(void* const* bufs, long number);  // `number` calls, returns total seconds
    void fj_set_threads(int n);                      // omp_set_num_threads

:data:`TIMING_HARNESS_C` provides the last two for C + OpenMP (the timed loop runs in C: a volatile
function pointer and a memory clobber keep the compiler from hoisting the kernel out of it). It is
appended after the kernel's definition and calls it through a cast, so a hand-written kernel still
declared with the older ``float* const*`` parameter (same calling convention) links too. A CUDA
harness (events around a launch loop) is another string here, named by its dialect table.
"""
from __future__ import annotations

from .cstyle import Writer

TIMING_HARNESS_C = r"""
/* felixjax timing harness: append to a source that defines fj_kernel. */
#include <time.h>
#include <omp.h>
typedef void (*fj_kernel_fn)(void* const*);
double fj_time(void* const* bufs, long number) {
  /* Called through a volatile pointer so the kernel is not inlined and hoisted out of the loop; the
     cast accepts kernels declared with float* const* (the ABI before buffers carried dtypes). */
  fj_kernel_fn volatile kernel = (fj_kernel_fn)fj_kernel;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long i = 0; i < number; ++i) {
    kernel(bufs);
    __asm__ __volatile__("" ::: "memory");
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  return (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
}
void fj_set_threads(int n) { omp_set_num_threads(n); }
"""

HARNESSES = {"c": TIMING_HARNESS_C}


def standalone_c(plan, title: str, render_kernel, includes: tuple[str, ...] = ("stddef.h", "string.h")) -> str:
    """Full C source of one kernel rendered by a sketch's own renderer: a header comment (``title``, the
    task and the config), ``includes``, what ``render_kernel(plan, writer)`` writes, and
    :data:`TIMING_HARNESS_C`."""
    task, cfg = plan.space.task, plan.config
    w = Writer()
    w(f"/* felixjax generated {title}")
    w(f" * task:   {task.name}  ({task.key})")
    w(f" * config: {cfg.dumps()} */")
    for inc in includes:
        w(f"#include <{inc}>")
    render_kernel(plan, w)
    return w.text() + TIMING_HARNESS_C
