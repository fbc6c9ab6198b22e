"""Writes notebooks/06_cuda.ipynb (nbformat v4, no outputs): `python notebooks/make_06.py`.

The notebook is generated so its source stays reviewable as plain Python; CI executes it
(tests/test_notebooks.py). Edit the cells here, then rerun this script (and notebooks/execute.py 06).
"""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared generator helper
from nbgen import IMPORT_FELIXJAX, build_notebook, write_notebook  # noqa: E402

NOTEBOOK = Path(__file__).with_name("06_cuda.ipynb")

CELLS = [
    ("md", """# 06 · CUDA kernels for GPUs you may not have

felixjax emits real CUDA C for a GPU sketch (after Ansor's multi-level GPU tiling), checks every kernel
by compiling **the emitted `.cu` source itself** for the CPU (a small shim runs each block's threads as
fibers between `__syncthreads()` barriers), compiles it with `nvcc` where nvcc exists (reading `ptxas`'s
register and shared-memory counts back), and ranks it with an analytic GPU simulator built from
published spec tables. No GPU was used to make this notebook: every latency below is **simulated**.

Budgets are tiny so the notebook runs in well under a minute; nvcc is skipped here for the same reason
(`GpuSimMeasurer(nvcc=False)`: registers are then estimated and marked so)."""),
    ("code", """import sys
from pathlib import Path

""" + IMPORT_FELIXJAX + """
import numpy as np
from codegen.cuda.space import CudaSpace
from codegen.cuda.render import render
from codegen.cuda.emulate import check
from codegen.cuda.sim import simulate_config, reference_kernels, simulate
from codegen.run.gpusim import GpuSimMeasurer

gpus = {name: fj.Target.cuda_sim(name) for name in ("a100", "orin")}
for name, tg in gpus.items():
    s = tg.spec
    print(f"{name:5s} {s.full_name}: {s.sm_count} SMs, {s.peak_flops / 1e12:.1f} TFLOP/s fp32, "
          f"{s.dram_bandwidth / 1e9:.0f} GB/s, L2 {s.l2_bytes >> 20} MiB, {s.arch}")"""),
    ("md", """## The GPU sketch and the emitted kernel

Spatial axes get four tile levels (blocks, virtual threads, threads, inner), reduction axes two (steps
staged through shared memory, and the slice inside a step); `parallel` switches the shared-memory staging
(cooperative fetch) on, `unroll` is the inner reduction loop's `#pragma unroll`. Limits: at most 1024
threads per block, shared memory and estimated registers within the GPU's limits."""),
    ("code", """task = fj.ops.matmul(512, 512, 512)
space = CudaSpace(task, gpus["a100"])
cfg = space.default()
g = space.geometry(cfg)
print(cfg.dumps())
print(f"grid {g.n_blocks} blocks x {g.n_threads} threads, {g.outputs_per_thread} outputs per thread, "
      f"{g.smem_bytes} B shared memory, ~{space.registers(cfg)} registers (estimate)")
src = render(space, cfg).source
print("\\n".join(src.splitlines()[:40]))"""),
    ("md", """## Correct without a GPU

`check` compiles that exact source with g++ behind the shim and runs sampled blocks (every corner block
of the grid plus random ones) against numpy. A bug planted in the CUDA dialect table (the thread index
spelled `threadIdx.y`) is caught as `wrong_result`."""),
    ("code", """import dataclasses
from codegen.cuda.render import CUDA

print(check(space, cfg, max_blocks=16))
print(check(space, cfg, max_blocks=16, dialect=dataclasses.replace(CUDA, thread_index="threadIdx.y")).status)"""),
    ("md", """## Tuning a matmul and a convolution for an A100 and a Jetson Orin

The same `fj.tune` as on the CPU; the target decides the sketch and the measurer (build, emulation check,
simulator). Given a database (`db=`; here none, the records stay in memory), records of `cuda-sim:*` targets
are stored under their own target key, apart from the CPU's and from a real GPU's."""),
    ("code", """import time

tasks = [fj.ops.matmul(512, 512, 512), fj.ops.conv2d(1, 64, 28, 28, out_channels=64, kernel=3, padding=1)]
no_nvcc = lambda t, tg: GpuSimMeasurer(t, tg, nvcc=False)
results = {}
t0 = time.perf_counter()
for name, tg in gpus.items():
    for t in tasks:
        res = fj.tune(t, tg, strategy="random", trials=6, seed=0, progress=False, retime=1, measurer=no_nvcc)
        results[name, t.name] = res
        b = res.best
        print(f"{name:5s} {t.name:36s} best {b.latency_s * 1e6:8.1f} us  {b.gflops:8.0f} GFLOP/s "
              f"({b.gflops * 1e9 / tg.spec.peak_flops:5.1%} of peak)  {res.status_counts()}")
print(f"{time.perf_counter() - t0:.0f} s")"""),
    ("md", """## The simulated roofline

Each measured config is a point at its arithmetic intensity (FLOPs over the compulsory DRAM bytes: inputs
and output once) and its simulated throughput; the simulator never puts a point above the roofline
`min(peak, intensity x bandwidth)`. The gap below it is what the search works on: occupancy, bank
conflicts, coalescing, wave quantization, latency not hidden."""),
    ("code", """import io
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from IPython.display import Image, display

fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
for ax, (name, tg) in zip(axes, gpus.items()):
    s = tg.spec
    x = np.logspace(-1, 3, 200)
    ax.loglog(x, np.minimum(s.peak_flops, x * s.dram_bandwidth) / 1e9, "k-", lw=1, label="roofline")
    for t, marker in zip(tasks, "os"):
        ok = [r for r in results[name, t.name].history if r.ok]
        nbytes = 4.0 * (sum(np.prod(shape) for shape in t.input_shapes()) + np.prod(t.output_shape))
        ax.scatter([t.flops / nbytes] * len(ok), [r.gflops for r in ok], marker=marker, s=18, alpha=0.6,
                   label=t.name.split("_")[0])
    ax.set_title(f"{name}: simulated", fontsize=10)
    ax.set_xlabel("FLOP / compulsory DRAM byte")
    ax.set_ylabel("GFLOP/s")
    ax.legend(fontsize=7)
fig.tight_layout()
buf = io.BytesIO()
fig.savefig(buf, format="png", dpi=90)
plt.close(fig)
display(Image(buf.getvalue()))"""),
    ("md", """## How far to trust the simulator

The simulator's constants (one table, `codegen.cuda.sim.CALIBRATION`) were set against published SGEMM
figures: Simon Boehm's A6000 worklog kernels and cuBLAS, and, for 2048³ on A100/H100, an **assumed**
vendor figure of 85% of the fp32 peak. Agreement with numbers it was fitted to is a sanity check, not a
validation; comparing against CUDA-event timings on a real GPU (rank correlation, error) is still to do."""),
    ("code", """from codegen.cuda.specs import get_spec

for name, gpu, prof, published, source in reference_kernels():
    r = simulate(prof, get_spec(gpu))
    print(f"{name:13s} {gpu:6s} simulated {r.gflops:8.0f}  published {published:8.0f} GFLOP/s  "
          f"x{r.gflops / published:4.2f}  ({source})")"""),
]


def build() -> nbformat.NotebookNode:
    return build_notebook(CELLS)


if __name__ == "__main__":
    write_notebook(build(), NOTEBOOK)
