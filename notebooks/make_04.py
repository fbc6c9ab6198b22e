"""Writes notebooks/04_network.ipynb (nbformat v4, no outputs): `python notebooks/make_04.py`.

The notebook is generated so its source stays reviewable as plain Python; CI executes it
(tests/test_notebooks.py). Edit the cells here, then rerun this script.
"""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared generator helper
from nbgen import IMPORT_FELIXJAX, build_notebook, write_notebook  # noqa: E402

NOTEBOOK = Path(__file__).with_name("04_network.ipynb")

CELLS = [
    ("md", """# 04 · A whole network: ONNX → tuned C library → checked against onnxruntime

A ResNet-18 for CIFAR-10 (32×32 inputs) from the model zoo travels the whole pipeline: ONNX import and
fusion into tunable tasks, a (tiny) tuning run spread over the tasks by Ansor's gradient task scheduler,
one C library for the whole network built from the best schedules, its output checked against
onnxruntime, both timed side by side, and a standalone C folder exported. The budget here is tiny so the
notebook runs in about a minute; `felixjax tune model.onnx --trials 2000` is the real thing."""),
    ("code", """import sys
import tempfile
from pathlib import Path

""" + IMPORT_FELIXJAX + """
import numpy as np
from felixjax.network import build_model, compare_onnxruntime, tune_model

tmp = tempfile.TemporaryDirectory(prefix="felixjax-nb04-")  # ~140 MB; removed by the last cell (or at exit)
work = Path(tmp.name)
onnx_path = fj.zoo.save("resnet18", work / "resnet18.onnx", dataset="cifar10")
model = fj.load_onnx(onnx_path)
print(f"{model.name}: input {model.input_shapes}, output {model.output_shapes}")
print(f"{len(model.graph.nodes)} nodes after fusion, {len(model.tasks)} distinct tasks, "
      f"{sum(w for _, w in model.tasks)} anchor ops")"""),
    ("md", """## Fusion and tasks

Batch norms fold into the convolutions, and bias, residual add and ReLU fuse into the convolution before
them: what is left are *anchor* nodes (one tunable `Task` each) and a few cheap ops (global average
pooling as a `ReduceMean`, a `Reshape`). Identical tasks are deduplicated; their count is the weight the
task scheduler uses."""),
    ("code", """print("\\n".join(model.summary().splitlines()[:6]), "\\n...")
for task, weight in model.tasks:
    print(f"x{weight}  {task.name:<48} {task.flops / 1e6:7.1f} MFLOP")"""),
    ("md", """## Tuning under one budget

`tune_model` measures each sketch's default schedule first, then gives every task a warm-up round and
each later round to the task whose next round promises the largest cut of the estimated end-to-end
latency `sum(weight * best latency)` (Ansor's gradient scheduler: α = 0.2, β = 2, window 3). A budget
of three trials per task on average (the scheduler gives some tasks more, many just one), random search,
so it finishes quickly; every measurement lands in a SQLite database.
Everything here runs on one thread: on a small shared machine that is what gives steady timings."""),
    ("code", """db = work / "runs.db"
net = tune_model(model, trials=3 * len(model.tasks), strategy="random", db=db, trials_per_round=1,
                 threads=1, progress=False)
print(net)
print(net.table())
print("rounds went to tasks:", [r["index"] for r in net.rounds])"""),
    ("md", """## Schedules chosen inside the network

Each kernel above was timed alone, its weights warm in cache. Inside the network the layers before it
have evicted them, and a kernel that streams more bytes (a Winograd kernel's transformed weights) pays
for it there. So `tune_model` ends by building the network with each task's best config of its first,
second and third fastest sketch families, profiling the builds layer by layer, and giving each task the
schedule its layers ran fastest with *in the network* (kept only when the whole build gets faster;
`in_network=0` turns it off). What it measured, kernel alone / in the network (ms), the built schedule
starred:"""),
    ("code", """sel = net.selection
print(sel.table() if sel is not None else "no task had two sketch families to choose between")"""),
    ("md", """## One C library for the whole network

`build_model` takes every task's best record from the database, lowers it, renders every kernel plus a
small generated C function for each cheap op into one source file with a static memory plan (a single
arena, buffers reused by liveness), compiles it and loads it. Calling it runs the compiled C."""),
    ("code", """exe = build_model(model, db=db, threads=1)
print(exe.summary().splitlines()[0])
x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
y = exe(x)
print("logits:", np.round(y[0], 3))

import onnxruntime as ort
ref = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
print(f"max |felixjax - onnxruntime| / max |onnxruntime| = {np.abs(y - ref).max() / np.abs(ref).max():.1e}")"""),
    ("md", """## Against onnxruntime, and where the time goes

Timed interleaved in this process with the same thread count (one), onnxruntime at its default options. With
about three trials per task the schedules are barely tuned (the sketches' hand-written defaults do most of the work),
so either side may be ahead here. `benchmarks/networks.py` measures the tuned builds with a real budget."""),
    ("code", """cmp = compare_onnxruntime(exe, onnx_path, threads=1, rounds=3, min_time_s=0.1)
print(f"felixjax {cmp['felixjax_ms']:.2f} ms, onnxruntime {cmp['onnxruntime_ms']:.2f} ms "
      f"({cmp['threads']} thread{'' if cmp['threads'] == 1 else 's'}, medians of {cmp['rounds']})")
rows = sorted(exe.profile(x, number=5), key=lambda r: -r["ms"])
total = sum(r["ms"] for r in rows)
for r in rows[:6]:
    print(f"{r['ms']:7.3f} ms {100 * r['ms'] / total:5.1f}%  {r['op']}")"""),
    ("md", """## A standalone folder for an edge board

`export` writes the same C source with a header, a Makefile, the packed weights and a tiny demo program:
`make` needs nothing but a C compiler (OpenMP optional)."""),
    ("code", """import subprocess

out = exe.export(work / "resnet18_c")
print(sorted(p.name for p in out.iterdir()))
print((out / "model.h").read_text().split("#ifndef")[0])
x.tofile(out / "input.bin")
print(subprocess.run(["make", "-s", "demo"], cwd=out, capture_output=True, text=True).returncode == 0)
print(subprocess.run(["./demo", "weights.bin", "input.bin", "output.bin"], cwd=out).returncode == 0)
print("same logits:", np.array_equal(np.fromfile(out / "output.bin", dtype="<f4").reshape(1, 10), y))"""),
    ("md", """## A layout chosen per network

onnxruntime runs a CNN's convolutions in the channel-blocked NCHW8c layout from one conv to the next.
`load_onnx(..., layout="nchwc")` does the same here: eligible convolutions become `conv2d_nchwc` tasks
(tuned in that layout, under their own database keys), blocked values stay blocked between them, and a
`Reblock` step converts back where an NCHW op reads one. Which layout is faster depends on the network
(depthwise convs gain the most; ResNet's 3x3 convs run Winograd in NCHW), so `choose_layout` builds both
with default schedules and times them; it also profiles both builds step by step and, where some convs ran
faster in each, builds up to two mixes and times them too (a mix only where it differs from both
pure layouts and from the other mix): each conv NCHW where that pays for a conversion on
each side (`felixjax.pipeline.mixed_layout`), and each conv in the layout it ran faster in, conversions not
charged (`felixjax.pipeline.fastest_plan`: a run of NCHW convs converts only at its ends). A mixed layout
comes back as a mapping `{conv name: "nchw"}` that `load_onnx(..., layout=...)` takes."""),
    ("code", """mb = fj.zoo.save("mobilenet_v2", work / "mobilenet_v2.onnx", dataset="cifar10")
layout, times = fj.choose_layout(mb, threads=1, rounds=3, number=3)
print({k: f"{1e3 * v:.2f} ms" for k, v in times.items()}, "->",
      layout if isinstance(layout, str) else f"mixed, NCHW: {sorted(layout)}")
blocked = fj.load_onnx(mb, layout="nchwc")
print([t.name for t, _ in blocked.tasks][:3])
print(sum(n.op == "Reblock" for n in blocked.graph.nodes), "Reblock step(s):",
      [n.name for n in blocked.graph.nodes if n.op == "Reblock"])
xb = np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)
print("same output as NCHW:", np.allclose(build_model(blocked, threads=1)(xb), fj.load_onnx(mb).run_numpy(xb),
                                          rtol=1e-4, atol=1e-4))"""),
    ("md", """## Cleaning up

The ONNX file, the database and the exported folder (about 140 MB: packed weights are larger than the ONNX
file's) lived in a temporary folder; the
compiled library stays in the build cache (`$FELIXJAX_CACHE`, default `~/.cache/felixjax/build`)."""),
    ("code", """tmp.cleanup()
print(work.exists())"""),
]


def build() -> nbformat.NotebookNode:
    return build_notebook(CELLS)


if __name__ == "__main__":
    write_notebook(build(), NOTEBOOK)
