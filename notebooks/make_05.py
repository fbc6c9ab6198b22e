"""Writes notebooks/05_approximation.ipynb (nbformat v4, no outputs): `python notebooks/make_05.py`.

The notebook is generated so its source stays reviewable as plain Python; CI executes it
(tests/test_notebooks.py). Edit the cells here, then rerun this script.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared generator helper
from nbgen import IMPORT_FELIXJAX, build_notebook, write_notebook  # noqa: E402

NOTEBOOK = Path(__file__).with_name("05_approximation.ipynb")

CELLS = [
    ("md", """# 05 · Approximation in the same objective: channel pruning under a quality budget

A small residual CNN is trained on scikit-learn's bundled digits (upsampled to 16×16, offline), exported
to ONNX, and handed to `fj.approximate` with 300 images held back from training and a budget of two
accuracy points. Each round descends one objective — the layers' latency, read from tables of the
learned cost model over schedulable channel counts, plus a weighted cross-entropy computed by running
the ONNX graph in JAX with soft channel masks — then rounds the channel counts, prunes, tunes the new
tasks, builds the C network, and **measures** its latency and accuracy. Held-out images that
`approximate` never sees judge the result. The budgets here are tiny so the notebook runs in about a
minute; `benchmarks/approx.py` is the real comparison (uniform pruning, a FLOPs proxy, onnxruntime int8)."""),
    ("code", """import sys
from pathlib import Path

""" + IMPORT_FELIXJAX + """
import numpy as np
from felixjax.approx import digits
from felixjax.approx.search import Approximator, uniform_keep

x, y = digits.load(size=16)
train, test = digits.split(len(x), seed=0)
calib, train = train[:300], train[300:]            # given to approximate / used for training
params = digits.train_cnn(x[train], y[train], width=8, epochs=5, batch=32, lr=1e-2)
proto = digits.to_onnx(params, 16)
model = fj.load_onnx(proto)
print(model.summary())
print(f"{sum(t.flops * w for t, w in model.tasks) / 1e6:.2f} MFLOP; held-out images: {len(test)}")"""),
    ("md", """## Channel groups

Filters are ranked by L1 norm. The residual add ties `conv2`'s and `conv4`'s output channels (one
group), the flatten before the classifier repeats each channel 16 times, and the logits are frozen."""),
    ("code", """from felixjax.approx.knobs import analyze

groups = analyze(model.graph)
for g in groups.prunable():
    print(f"group {g}: {groups.size(g)} channels, made by {[n for n, _ in groups.producers[g]]}")
print("frozen:", groups.frozen)"""),
    ("md", """## `fj.approximate`

One thread (steady timings on a small shared machine), channel counts rounded to multiples of 4, and
`trials=0`: every network here is built with default schedules, so the notebook runs in about a minute
(with `trials=N` the baseline and every new task are tuned by the tuning session first). Precision and sparsity knobs are probed on the code generator; the
reasons they are excluded today are printed.

One descent round, then the front search (`search="front"`, the default): the uniform 50% and 75%
configurations are seeds (built and measured), a per-layer local search from them and from the descent's point looks for
faster configurations of at least the same quality on the given data (scored in JAX with hard channel
masks, no build), and `measure=1` of them is built and measured. `res.front` is the measured Pareto
front. Every quality figure of the search is in-sample (measured on the 300 given images that chose the
network; one image is a third of a point); `holdout=` scores the baseline and the chosen network on the
held-out images at the end (the table's "held out" line), and the chosen point is timed again beside the
baseline after the choice."""),
    ("code", """import tempfile

tmp = tempfile.TemporaryDirectory(prefix="felixjax-nb05-")
db = fj.Database(Path(tmp.name) / "runs.db")       # shared by every point below: same tuned kernels
target = fj.Target.cpu(cores=1)
res = fj.approximate(proto, target, data=(x[calib], y[calib]), quality_budget=0.02, trials=0, rounds=1,
                     steps=15, strategy="random", multiple=4, db=db, progress=True,
                     seeds=(0.5, 0.75), measure=1,   # front search: from uniform 50% and 75% and the descent's
                     holdout=(x[test], y[test]))     # never seen by the search: the chosen network checked on it
print(res.table())
print("front:", [(f"{p.speedup:.2f}x", round(p.quality, 4), p.note) for p in res.front])"""),
    ("md", """## Judged on held-out images, next to uniform pruning

Every point is rebuilt from its channel counts (its schedules come from the same database) and scored
on the held-out images; a uniform 50% keep ratio is measured the same way. Speedups are each point's
latency against the float32 build timed interleaved with it (the same minute, the same machine load)."""),
    ("code", """def held_out(exe):
    out = np.stack([exe(x[i: i + 1]) for i in test]).reshape(len(test), -1)
    return float(np.mean(out.argmax(1) == y[test]))

ax = Approximator(proto, target, data=(x[calib], y[calib]), db=db, trials_per_task=0, multiple=4)
rows = [("float32", 1.0, held_out(res.baseline))]       # (method, measured speedup, held-out accuracy)
for p in res.pareto[1:]:  # the measured front beyond the baseline, each named by how it was found
    rows.append((p.note or "descent", p.speedup, held_out(ax.build(ax.pruned_model(dict(p.keep))))))
half = uniform_keep(groups, 0.5, 4)                  # the uniform baseline (also a seed of ours)
pt, exe, _ = ax.point(half, "uniform", base_exe=res.baseline)
rows.append(("uniform 50%", pt.speedup, held_out(exe)))
for name, speedup, acc in rows:
    print(f"{name:<22} {speedup:5.2f}x  held-out accuracy {acc:.4f}")
print(f"chosen: {res.speedup:.2f}x measured, loss on the given data {res.quality_loss:+.4f}, held out "
      f"{res.heldout_loss:+.4f}; {res.quality_evals} quality evaluations")"""),
    ("code", """import matplotlib.pyplot as plt

fig, axp = plt.subplots(figsize=(5.5, 3.6))
for name, sp, acc in rows:
    marker = {"float32": "*", "uniform 50%": "^"}.get(name, "o")
    axp.scatter(res.baseline_latency_s * 1e3 / sp, 100 * acc, marker=marker, s=60, label=name)
axp.set_xlabel("latency (ms: float32 build / measured speedup)")
axp.set_ylabel("held-out accuracy (%)")
axp.grid(alpha=0.3)
axp.legend()
plt.show()
db.close()
tmp.cleanup()"""),
    ("md", """Read the front's notes: a point named `seed uniform ...` is one of the seeds, `local ...` the local
search's and `descent` the descent's own. On a network this small (1.2 MFLOP, a few hundredths of a
millisecond) two accuracy points leave little to prune: the chosen point is often a seed, or the float32
network itself when nothing measured stays within budget (the log above says which). Where the descent's
weighted latency never pays for a lost point, its rounds print "keeps the full network".
With no tuning and one round this is a demonstration of the loop, not of the targets:
`benchmarks/approx.py` and docs/BENCHMARKS.md hold the measured comparison, including where it falls
short."""),
]


def build():
    return build_notebook(CELLS)


if __name__ == "__main__":
    write_notebook(build(), NOTEBOOK)
