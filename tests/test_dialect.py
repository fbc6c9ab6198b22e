"""Walkthrough "add a target dialect", done once: a test-only dialect is a table (a Dialect with its own
spellings and harness) handed to CStyleRenderer; nothing else changes. Here: serial C without OpenMP,
with its own loop, parallel-loop, FMA and qualifier spellings, checked against numpy."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from codegen import ops
from codegen.build import DEFAULT_FLAGS, build
from codegen.lower import lower
from codegen.measure import check_output
from codegen.renderers import C_DIALECT, CStyleRenderer, Dialect
from codegen.runtime import Kernel
from codegen.space import Space, sketches_for
from codegen.target import Target

SERIAL_HARNESS = r"""
/* serial timing harness (no OpenMP) */
#include <time.h>
typedef void (*fj_kernel_fn)(void* const*);
double fj_time(void* const* bufs, long number) {
  fj_kernel_fn volatile kernel = (fj_kernel_fn)fj_kernel;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long i = 0; i < number; ++i) { kernel(bufs); __asm__ __volatile__("" ::: "memory"); }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  return (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
}
void fj_set_threads(int n) { (void)n; }
"""

# the whole target: one table (spellings that differ from C's defaults) ...
SERIAL_C = dataclasses.replace(
    C_DIALECT,
    name="c-serial",
    prelude="#include <math.h>\n#include <stddef.h>\n",
    harness=SERIAL_HARNESS,
    parallel_for="", simd="", unroll="",  # no pragmas at all
    parallel_loop="for (long {var} = {n} - 1; {var} >= 0; --{var})  /* serial, reversed */",
    loop="for (long {var} = 0; {var} != {n}; {var}++)",
    fma="{acc} = {acc} + {a} * {b};",
    kernel_qualifier="__attribute__((noinline)) ",
)
# ... and one renderer for it
SERIAL = CStyleRenderer(SERIAL_C)

TASKS = [ops.matmul(24, 40, 36, bias=True, act="relu"),
         ops.conv2d(1, 6, 9, 9, out_channels=16, kernel=3, padding=1, residual=True),
         ops.depthwise_conv2d(1, 8, 10, 7, kernel=3, stride=2, padding=1, act="relu6")]


def test_a_dialect_is_a_table():
    assert isinstance(SERIAL_C, Dialect) and SERIAL_C.name == "c-serial"
    fields = {f.name for f in dataclasses.fields(Dialect)}
    # the target-specific spellings the base renderer takes from the table
    assert {"kernel_signature", "bind_arg", "bind_workspace", "vector_typedefs", "load_unaligned", "load_stride2",
            "load_gather", "store_unaligned", "fma", "parallel_for", "parallel_loop", "loop", "restrict",
            "stack_array", "kernel_qualifier", "harness"} <= fields


@pytest.mark.cc
@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
def test_walkthrough_add_a_dialect(task):
    target = Target.cpu()
    rng = np.random.default_rng(5)
    for sk in sketches_for(task):
        sp = Space(task, sk, target)
        for cfg in [sp.default()] + sp.sample_many(rng, 2):
            plan = lower(sp, cfg)
            src = SERIAL.render(plan)
            assert "#pragma" not in src and "omp" not in src
            assert "__attribute__((noinline)) void fj_kernel(void* const* bufs)" in src
            b = build(src, flags=tuple(f for f in DEFAULT_FLAGS if f != "-fopenmp"))  # the dialect needs no OpenMP
            assert b.status == "ok", b.error
            arrays = task.random_inputs(seed=2)
            ok, msg = check_output(Kernel(plan, b.lib_path)(*arrays), task.reference(*arrays),
                                   plan.con.reduction_size)
            assert ok, f"{sk.name} {cfg}: {msg}"
