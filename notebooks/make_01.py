"""Writes notebooks/01_kernels.ipynb (nbformat v4, no outputs): `python notebooks/make_01.py`.

The notebook is generated so its source stays reviewable as plain Python; CI executes it
(tests/test_notebooks.py). Edit the cells here, then rerun this script.
"""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared generator helper
from nbgen import IMPORT_FELIXJAX, build_notebook, write_notebook  # noqa: E402

NOTEBOOK = Path(__file__).with_name("01_kernels.ipynb")

CELLS = [
    ("md", """# 01 · From a schedule to a timed C kernel

One operator, its schedule space, the C source felixjax generates for one schedule, and real timings
on this machine next to onnxruntime. Everything here is small enough to run in well under a minute.

The operator: a 3×3 convolution, 1×32×28×28 input, 32 output channels, padding 1, fused ReLU."""),
    ("code", """import sys
from pathlib import Path

""" + IMPORT_FELIXJAX + """
import numpy as np

task = fj.ops.conv2d(1, 32, 28, 28, out_channels=32, kernel=3, padding=1, act="relu")
target = fj.Target.cpu()
print(task.name, "|", f"{task.flops / 1e6:.1f} MFLOP", "|", task.input_shapes(), "->", task.output_shape)
print(target.name, f"{target.cores} cores, {target.simd_lanes} fp32 lanes, L1d {target.l1d_bytes // 1024} KiB")"""),
    ("md", """## The schedule space

A *sketch* fixes the loop structure and data layouts; a `Config` holds its integer knobs: tile sizes
per axis (4 spatial levels, 2 reduction levels, loop order `S0 S1 R0 S2 R1 S3`), how many outer loops
are fused into the OpenMP parallel loop, the SIMD width and the unroll factor. Convolutions have several
sketches: direct NCHW (vectorized along the output width), spatial pack (NCHW[x]c, vectorized along
output channels), and for 3x3 stride-1 convolutions Winograd F(2x2, 3x3) and F(4x4, 3x3) (padded
variants of awkward extents join them when tuning; `codegen.space.default_sketch` picks the untuned one)."""),
    ("code", """spaces = {sk.name: fj.Space(task, sk, target) for sk in fj.sketches_for(task)}
rng = np.random.default_rng(0)
for name, space in spaces.items():
    print(f"{name}: axes {[(a.name, a.extent) for a in space.axes]}")
    print(f"  product of knob domains (upper bound on the space): {space.size():.3g}")
    print(f"  default: {space.default().dumps()}")
    for cfg in space.sample_many(rng, 2):
        print(f"  random:  {cfg.dumps()}")"""),
    ("md", """## The generated C

Lowering turns (task, sketch, config) into a loop-nest plan; the C renderer prints it. Note the
register block of GCC-vector accumulators held across the inner reduction loop, and the fused
bias/activation epilogue."""),
    ("code", """from codegen.lower import lower
from codegen.render_c import render

space = spaces["conv_spatial_pack"]
plan = lower(space, space.default())
source = render(plan)
print(f"{len(source.splitlines())} lines; workspace {plan.workspace} floats; weights packed as "
      f"{plan.buffers['weight'].layout.shape} -> {plan.buffers['weight'].size} floats")
print(source)"""),
    ("md", """## Timing through the runner

`Measurer` builds every candidate (gcc, cached), then measures them one at a time in a separate
measuring process: the output is checked against numpy before and after timing, and a crash or a
wrong answer becomes a status instead of an exception. The *quick* protocol keeps this cheap
(3 repeats of at least 1 ms), so expect noisy numbers. GFLOP/s here is the direct convolution's FLOPs
over the time: a Winograd kernel does fewer multiplications, so its rate can exceed the core's fp32 peak."""),
    ("code", """from codegen.measure import LocalRunner, TimingProtocol
from felixjax.tuner import Measurer

configs = [sp.default() for sp in spaces.values()]
configs += [spaces[name].sample(rng) for name in sorted(spaces) for _ in range(2)]
results = {}
with LocalRunner(protocol=TimingProtocol.quick()) as runner:
    Measurer(task, target, runner, threads=1).measure(configs, lambda c, r: results.__setitem__(c, r) or True)
for i, cfg in enumerate(configs):
    r = results[cfg]
    kind = "default" if i < len(spaces) else "random"
    speed = f"{task.flops / r.latency_s / 1e9:6.1f} GFLOP/s" if r.ok else r.status
    print(f"{i}: {kind:7s} {cfg.sketch:18s} vec={cfg.vec:2d} unroll={cfg.unroll:3d} par={cfg.parallel}  {speed}")"""),
    ("md", """## Next to onnxruntime

The fastest default schedule, the fastest random one and onnxruntime (weights as initializers, one thread,
default options),
timed interleaved in this process (A B A B ...), both checked against the numpy reference before and
after timing."""),
    ("code", """from felixjax import baselines

arrays = task.random_inputs(seed=0)
expected = task.reference(*arrays)
sampled = configs[len(spaces):]
best = min((c for c in sampled if results[c].ok), key=lambda c: results[c].latency_s)
default = min((c for c in configs[: len(spaces)] if results[c].ok), key=lambda c: results[c].latency_s)
contenders = {
    "felixjax default": baselines.kernel_contender(task, default, arrays, threads=1, expected=expected),
    f"best of {len(sampled)} random": baselines.kernel_contender(task, best, arrays, threads=1, expected=expected),
    "onnxruntime": baselines.ort_contender(task, arrays, threads=1, expected=expected),
}
for c in contenders.values():
    c.check()
times = baselines.time_interleaved(contenders, rounds=5, min_time_s=0.01)
for c in contenders.values():
    c.check(run=False)
summary = baselines.summarize(times)
for name, s in summary.items():
    med, top = s.gflops(task.flops)
    print(f"{name:20s} median {med:6.1f} GFLOP/s   best {top:6.1f} GFLOP/s")"""),
    ("code", """import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from IPython.display import Image, display

names = list(summary)
med = [summary[n].gflops(task.flops)[0] for n in names]
fig, ax = plt.subplots(figsize=(5, 2.2))
ax.barh(names, med, color=["#9ab", "#36c", "#c63"][: len(names)])
ax.set_xlabel("GFLOP/s (median, 1 thread)")
ax.set_title(task.name, fontsize=9)
fig.tight_layout()
buf = io.BytesIO()
fig.savefig(buf, format="png", dpi=90)
plt.close(fig)
display(Image(buf.getvalue()))"""),
    ("md", """A few random schedules rarely come near the sketches' hand-written defaults (compare their rows in
the table above): the space can express fast kernels (a register block, packed weights, a unit-stride
vector axis, Winograd's fewer multiplications), but finding ones faster than the defaults takes search. That is what the
rest of felixjax (gradient descent on a learned latency model) is for; `benchmarks/kernels.py` runs the
full comparison."""),
]


def build() -> nbformat.NotebookNode:
    return build_notebook(CELLS)


if __name__ == "__main__":
    write_notebook(build(), NOTEBOOK)
