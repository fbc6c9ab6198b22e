"""Correctness without a GPU: the emitted ``.cu`` source itself, compiled as C++ and run on the CPU.

The kernel text is ``#include``d verbatim after a small shim header (:data:`SHIM`) that defines
``threadIdx``/``blockIdx``/``blockDim``/``gridDim``, turns ``__global__``/``__launch_bounds__`` into
nothing and ``__shared__`` into ``static`` (one copy, shared by the block's threads), and makes
``__syncthreads()`` a fiber switch. A block runs as ``blockDim.x`` fibers on one OS thread (each
started on its own stack by ``setcontext``, then switched by ``_setjmp``/``_longjmp``, no system call): the scheduler resumes thread 0, 1, ... in turn, each runs until its next barrier (or its
end), then the next phase starts; threads reaching a barrier while others finished is reported as
barrier divergence. Execution is therefore phase by phase between barriers, as on the GPU (within a
phase the threads' order is one of the orders a GPU may produce).

The program runs in a child process (a crashing or hanging kernel costs only that process) on the
blocks asked for: every block for small grids, else the grid's corner blocks (each axis's first
and last block index, so edge tiles are covered) plus seeded random ones. The output starts as NaN;
the check requires every output of the sampled blocks written and right, and nothing else written.

Example:
    >>> from codegen.ops import matmul
    >>> from codegen.target import Target
    >>> from codegen.cuda.space import CudaSpace
    >>> sp = CudaSpace(matmul(32, 32, 32), Target.cuda_sim("a100"))
    >>> check(sp, sp.default()).status
    'ok'
"""
from __future__ import annotations

import hashlib
import itertools
import math
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..build import elf_intact
from ..measure import check_output
from ..space import Config
from .render import CUDA, CudaDialect, CudaKernel, render
from .space import CudaSpace

__all__ = ["SHIM", "EmulationResult", "build_emulator", "run_blocks", "check", "sample_blocks", "Emulated"]

SHIM = r"""// felixjax CUDA-on-CPU shim: the kernel's threads as fibers, barriers as fiber switches
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <setjmp.h>
#include <ucontext.h>
struct fj_dim3 { unsigned x, y, z; };
static fj_dim3 threadIdx = {0, 0, 0}, blockIdx = {0, 0, 0}, blockDim = {1, 1, 1}, gridDim = {1, 1, 1};
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
static jmp_buf fj_sched;   // the scheduler's resume point
static jmp_buf* fj_jb;     // each thread's resume point (after its first start)
static ucontext_t* fj_ctx; // each thread's initial context (its own stack)
static int fj_cur;
static volatile int fj_finished;
static inline void fj_sync(void) { if (!_setjmp(fj_jb[fj_cur])) _longjmp(fj_sched, 1); }
#define __syncthreads() fj_sync()
"""

HARNESS = r"""
static float* fj_bufs[{nbuf}];
static const long fj_sizes[{nbuf}] = {{{sizes}}};
static void fj_thread_main(void) {{ {call}; fj_finished = 1; _longjmp(fj_sched, 1); }}
static const size_t FJ_STACK = 64 * 1024;
// A thread starts on its own stack with setcontext (once per block); afterwards the switches are
// _setjmp/_longjmp pairs (no signal-mask system call), so a barrier costs tens of nanoseconds.
static int run_block(long b, int nt, char* stacks, int* done, int* started) {{
  blockIdx.x = (unsigned)b;
  for (int t = 0; t < nt; ++t) {{
    getcontext(&fj_ctx[t]);
    fj_ctx[t].uc_stack.ss_sp = stacks + (size_t)t * FJ_STACK;
    fj_ctx[t].uc_stack.ss_size = FJ_STACK;
    fj_ctx[t].uc_link = 0;
    makecontext(&fj_ctx[t], fj_thread_main, 0);
    done[t] = 0;
    started[t] = 0;
  }}
  int alive = nt;
  while (alive) {{
    int arrived = 0, finished = 0;
    for (int t = 0; t < nt; ++t) {{
      if (done[t]) continue;
      threadIdx.x = (unsigned)t; fj_cur = t; fj_finished = 0;
      if (!_setjmp(fj_sched)) {{
        if (!started[t]) {{ started[t] = 1; setcontext(&fj_ctx[t]); }}
        _longjmp(fj_jb[t], 1);
      }}
      if (fj_finished) {{ done[t] = 1; --alive; ++finished; }} else ++arrived;
    }}
    if (arrived && finished) return 1;  // some threads wait at a barrier others never reach
  }}
  return 0;
}}
int main(int argc, char** argv) {{
  if (argc != 3) {{ fprintf(stderr, "usage: emu DIR NBLOCKS\n"); return 2; }}
  char path[4096];
  for (int i = 0; i < {nbuf}; ++i) {{
    fj_bufs[i] = (float*)malloc(sizeof(float) * (size_t)fj_sizes[i]);
    if (i < {nbuf} - 1) {{
      snprintf(path, sizeof path, "%s/in%d.bin", argv[1], i);
      FILE* f = fopen(path, "rb");
      if (!f || fread(fj_bufs[i], sizeof(float), (size_t)fj_sizes[i], f) != (size_t)fj_sizes[i]) return 4;
      fclose(f);
    }} else {{
      for (long j = 0; j < fj_sizes[i]; ++j) fj_bufs[i][j] = NAN;
    }}
  }}
  long nb = atol(argv[2]);
  long* blocks = (long*)malloc(sizeof(long) * (size_t)(nb > 0 ? nb : 1));
  snprintf(path, sizeof path, "%s/blocks.bin", argv[1]);
  FILE* fb = fopen(path, "rb");
  if (!fb || fread(blocks, sizeof(long), (size_t)nb, fb) != (size_t)nb) return 4;
  fclose(fb);
  const int nt = {threads};
  blockDim.x = nt; gridDim.x = {grid};
  fj_ctx = (ucontext_t*)malloc(sizeof(ucontext_t) * nt);
  fj_jb = (jmp_buf*)malloc(sizeof(jmp_buf) * nt);
  char* stacks = (char*)malloc(FJ_STACK * nt);
  int* done = (int*)malloc(sizeof(int) * nt);
  int* started = (int*)malloc(sizeof(int) * nt);
  for (long i = 0; i < nb; ++i)
    if (run_block(blocks[i], nt, stacks, done, started)) {{ fprintf(stderr, "barrier divergence in block %ld\n", blocks[i]); return 3; }}
  snprintf(path, sizeof path, "%s/out.bin", argv[1]);
  FILE* fo = fopen(path, "wb");
  if (!fo || fwrite(fj_bufs[{nbuf} - 1], sizeof(float), (size_t)fj_sizes[{nbuf} - 1], fo) != (size_t)fj_sizes[{nbuf} - 1]) return 4;
  fclose(fo);
  return 0;
}}
"""


@dataclass(frozen=True)
class EmulationResult:
    """``status``: "ok", "wrong_result", "compile_error", "runtime_error" or "timeout"."""

    status: str
    error: str = ""
    blocks_run: int = 0
    blocks_total: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _cache_dir() -> Path:
    from codegen.build import cache_root

    d = cache_root() / "cuda_emu"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _buffer_sizes(space: CudaSpace) -> list[int]:
    return [math.prod(s) for s in space.task.input_shapes()] + [math.prod(space.task.output_shape)]


def build_emulator(space: CudaSpace, kernel: CudaKernel, *, timeout: float = 120.0) -> tuple[str | None, str]:
    """Compile the emulator of ``kernel`` (cached by content); returns ``(executable, error)``."""
    sizes = _buffer_sizes(space)
    call = f"{kernel.name}({', '.join(f'fj_bufs[{i}]' for i in range(len(sizes)))})"
    harness = HARNESS.format(nbuf=len(sizes), sizes=", ".join(map(str, sizes)), call=call,
                             threads=kernel.block, grid=kernel.grid)
    key = hashlib.sha256("\0".join([SHIM, kernel.source, harness]).encode()).hexdigest()[:24]
    exe = _cache_dir() / f"emu_{key}"
    if exe.exists() and elf_intact(exe):
        return str(exe), ""
    with tempfile.TemporaryDirectory(prefix="fj_emu_") as tmp:
        (Path(tmp) / "kernel.cu").write_text(kernel.source)  # the emitted source, byte for byte
        main = Path(tmp) / "emu.cpp"
        main.write_text(SHIM + '#include "kernel.cu"\n' + harness)
        out = Path(tmp) / "emu"
        try:
            # no _FORTIFY_SOURCE: its longjmp check refuses jumps between the fibers' stacks
            proc = subprocess.run(["g++", "-O1", "-U_FORTIFY_SOURCE", "-D_FORTIFY_SOURCE=0", "-std=c++17", "-w",
                                   "-x", "c++", str(main), "-o", str(out)],
                                  capture_output=True, text=True, timeout=timeout, cwd=tmp)
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, f"g++ failed: {e}"
        if proc.returncode != 0:
            return None, (proc.stdout + proc.stderr).replace(tmp + "/", "")[-4000:]
        part = exe.with_name(exe.name + f".{os.getpid()}.tmp")
        os.replace(out, part)
        os.replace(part, exe)
    return str(exe), ""


def sample_blocks(space: CudaSpace, cfg: Config, max_blocks: int = 48, seed: int = 0) -> np.ndarray:
    """Block ids to run: all of them when there are at most ``max_blocks``, else the corner blocks
    (first/last block index per axis) and seeded random ones up to ``max_blocks``."""
    g = space.geometry(cfg)
    n = g.n_blocks
    if n <= max_blocks:
        return np.arange(n, dtype=np.int64)
    counts = [g.blocks[a] for a in g.spatial]
    strides = [math.prod(counts[i + 1:]) for i in range(len(counts))]
    picks: list[int] = []
    for corner in itertools.product(*[sorted({0, c - 1}) for c in counts]):
        picks.append(sum(i * s for i, s in zip(corner, strides)))
    picks = list(dict.fromkeys(picks))[: max_blocks // 2]
    rng = np.random.default_rng(seed)
    rest = [int(b) for b in rng.choice(n, size=min(n, 2 * max_blocks), replace=False) if int(b) not in picks]
    return np.array((picks + rest)[:max_blocks], dtype=np.int64)


def block_mask(space: CudaSpace, cfg: Config, blocks: np.ndarray) -> np.ndarray:
    """Boolean mask over the output: the elements the given blocks own."""
    g = space.geometry(cfg)
    ext = [g.blocks[a] * g.block_tile[a] for a in g.spatial]
    grid = np.zeros(ext, dtype=bool)
    counts = [g.blocks[a] for a in g.spatial]
    for b in blocks.tolist():
        idx = []
        for a, c in zip(reversed(g.spatial), reversed(counts)):
            idx.append(b % c)
            b //= c
        idx = idx[::-1]
        grid[tuple(slice(i * g.block_tile[a], (i + 1) * g.block_tile[a]) for i, a in zip(idx, g.spatial))] = True
    return grid.reshape(space.task.output_shape)


def run_blocks(space: CudaSpace, kernel: CudaKernel, exe: str, arrays: list[np.ndarray], blocks: np.ndarray,
               *, timeout: float = 60.0) -> tuple[np.ndarray | None, str, str]:
    """Run the emulator on ``blocks``; returns ``(output, status, error)``."""
    with tempfile.TemporaryDirectory(prefix="fj_emurun_") as tmp:
        for i, a in enumerate(arrays):
            np.ascontiguousarray(a, dtype=np.float32).tofile(os.path.join(tmp, f"in{i}.bin"))
        np.asarray(blocks, dtype=np.int64).tofile(os.path.join(tmp, "blocks.bin"))
        try:
            proc = subprocess.run([exe, tmp, str(len(blocks))], capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None, "timeout", f"the emulated kernel ran more than {timeout:.0f} s"
        if proc.returncode != 0:
            why = proc.stderr.strip() or f"exit status {proc.returncode}"
            return None, "runtime_error", f"emulated kernel failed: {why}"
        out = np.fromfile(os.path.join(tmp, "out.bin"), dtype=np.float32)
    return out.reshape(space.task.output_shape), "ok", ""


def check(space: CudaSpace, cfg: Config, arrays: list[np.ndarray] | None = None, expected: np.ndarray | None = None,
          *, dialect: CudaDialect = CUDA, max_blocks: int = 48, kernel: CudaKernel | None = None,
          timeout: float = 60.0) -> EmulationResult:
    """Render (unless ``kernel`` is given), build and run ``cfg`` on sampled blocks; compare."""
    t0 = time.perf_counter()
    task = space.task
    if arrays is None:
        arrays = task.random_inputs(seed=0)
    if expected is None:
        expected = task.reference(*arrays)
    kernel = kernel or render(space, cfg, dialect)
    exe, err = build_emulator(space, kernel)
    if exe is None:
        return EmulationResult("compile_error", err, seconds=time.perf_counter() - t0)
    blocks = sample_blocks(space, cfg, max_blocks)
    out, status, err = run_blocks(space, kernel, exe, arrays, blocks, timeout=timeout)
    n = space.geometry(cfg).n_blocks
    if out is None:
        return EmulationResult(status, err, len(blocks), n, time.perf_counter() - t0)
    mask = block_mask(space, cfg, blocks)
    written = ~np.isnan(out)
    if (written & ~mask).any():
        return EmulationResult("wrong_result", f"{int((written & ~mask).sum())} outputs written outside the blocks run",
                               len(blocks), n, time.perf_counter() - t0)
    ok, msg = check_output(out[mask], expected[mask], space.con.reduction_size)
    return EmulationResult("ok" if ok else "wrong_result", "" if ok else msg, len(blocks), n,
                           time.perf_counter() - t0)


class Emulated:
    """A cuda-sim kernel as a callable ``kernel(*arrays) -> ndarray``: every block run on the CPU."""

    def __init__(self, space: CudaSpace, cfg: Config, dialect: CudaDialect = CUDA):
        self.space, self.cfg = space, cfg
        self.kernel = render(space, cfg, dialect)
        self.exe, err = build_emulator(space, self.kernel)
        if self.exe is None:
            raise RuntimeError(f"building the CPU emulation of the kernel failed: {err}")

    @property
    def source(self) -> str:
        return self.kernel.source

    def __call__(self, *arrays: np.ndarray) -> np.ndarray:
        shapes = self.space.task.input_shapes()
        if len(arrays) != len(shapes) or any(tuple(np.shape(a)) != tuple(s) for a, s in zip(arrays, shapes)):
            raise ValueError(f"{self.space.task.name} takes inputs of shapes {shapes}")
        blocks = np.arange(self.kernel.grid, dtype=np.int64)
        out, status, err = run_blocks(self.space, self.kernel, self.exe, list(arrays), blocks, timeout=600.0)
        if out is None:
            raise RuntimeError(err)
        return out
