"""Writes notebooks/03_gradient_vs_genetic.ipynb (nbformat v4, no outputs): `python notebooks/make_03.py`.

The notebook is generated so its source stays reviewable as plain Python; CI executes it
(tests/test_notebooks.py). Edit the cells here, then rerun this script.
"""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared generator helper
from nbgen import IMPORT_FELIXJAX, build_notebook, write_notebook  # noqa: E402

NOTEBOOK = Path(__file__).with_name("03_gradient_vs_genetic.ipynb")

CELLS = [
    ("md", """# 03 · Gradient vs genetic search, side by side

`fj.compare` runs strategies × seeds × operators with the same budget (trials and seconds, whichever
ends first), interleaved round by round so machine drift hits every strategy alike, then re-times
every run's final best kernel interleaved (A B C A B C) and summarizes:

* **final best**: the re-measured best kernel, median over seeds;
* **trials / seconds to 95%**: until a run's latency was within 95% of the best any strategy found
  for that operator (latency ≤ best / 0.95). A run that never got there is *censored* at its budget,
  marked `>`;
* **geomean ratios** over operators against `gradient` (or the first strategy, when gradient is not
  compared).

This notebook runs in **replay mode** (`replay=True`): no kernels are built or timed; each operator's
latencies come from a synthetic, noise-free oracle (`felixjax.testing.SyntheticOracle`) and every
trial adds a simulated 0.3 s to its run's clock, on top of the search's own real time (proposing,
fitting its model). That compares the search logic alone, repeatably,
in seconds. On hardware, drop `replay=True` (or run the CLI command at the end).

The strategies are `fj.compare`'s default: `gradient`, `genetic@32` (the genetic search at the gradient
search's 32 candidates per round: the equal-batch pair), `genetic` at Ansor's 64 per round, and `random`."""),
    ("code", """import os
import sys
import tempfile
from pathlib import Path

""" + IMPORT_FELIXJAX + """
from IPython.display import Image, Markdown, display

# tests/test_notebooks.py executes this notebook with FELIXJAX_NOTEBOOK_QUICK=1: the same cells on
# smaller budgets (CI time); without it, every budget is the one the text describes
QUICK = os.environ.get("FELIXJAX_NOTEBOOK_QUICK") == "1"


def budget(full, quick):
    return quick if QUICK else full


strategies = [s for s in ("gradient", "genetic@32", "genetic", "random") if s.partition("@")[0] in fj.strategies()]
tasks = [fj.ops.conv2d(1, 32, 28, 28, out_channels=32, kernel=3, padding=1)]
print("strategies:", strategies)
print("operators: ", [t.name for t in tasks])"""),
    ("md", """## A small replayed comparison

96 trials per run, 2 seeds (the gradient search at its default 64 starts x 32 steps; 16 x 8 when CI runs it). `db=None` keeps the records in memory; give a path to keep them (an
interrupted comparison then resumes from the database). `warmup=64` first runs each strategy once on the
oracle, unrecorded, so that no run's clock pays JAX's one-off compilations, which every later run (and the
later comparisons of this notebook) reuse; `felixjax compare` does that by default, `fj.compare` by default
only when kernels are measured."""),
    ("code", """out = Path(tempfile.mkdtemp(prefix="fj03_"))
cmp = fj.compare(tasks, strategies, trials=budget(96, 32), seeds=budget(2, 1), db=None, replay=True, out=out,
                 warmup=budget(64, 16), progress=False, strategy_options={"gradient": budget({"starts": 64, "steps": 32},
                                                                      {"starts": 16, "steps": 8})})
display(Markdown(cmp.table()))"""),
    ("code", """display(Image(filename=str(out / "curves.png")))
print("every measurement:", out / "cmp.csv")"""),
    ("md", """## What the cost model is worth to the genetic search

Genetic search picks parents by predicted throughput and proposes the best *predicted* configs, so it is
only as good as its cost model: with an uninformed one it is random search with extra steps. Here the
same search is given a model that knows the oracle up to noise (standing in for a well-trained model),
next to plain random search."""),
    ("code", """from felixjax.strategies.genetic import GeneticSearch
from felixjax.testing import OracleScorer, SyntheticOracle


class GeneticWithOracle(GeneticSearch):
    name = "genetic+oracle"

    def __init__(self):
        super().__init__(scorer=lambda ctx: OracleScorer(SyntheticOracle(ctx.task, ctx.target), noise=0.3))


cmp2 = fj.compare(tasks, [GeneticWithOracle, "random"], trials=budget(128, 32), seeds=budget(2, 1), db=None,
                  replay=True, progress=False)
display(Markdown(cmp2.table()))"""),
    ("md", """## Starting both strategies from a pretrained cost model

Felix and Ansor start from a model pretrained on other programs (TenSet) instead of a prior.
`felixjax.pretrain.pretrain` does that from your own databases: here a database of random-search
measurements of *other* convolutions (replayed, so instant), with one of them held out whole to
report transfer to an unseen task. Both strategies then start from the same checkpoint
(`cost_model=`) and fine-tune it online."""),
    ("code", """from felixjax.pretrain import pretrain

others = [fj.ops.conv2d(1, 16, 28, 28, out_channels=32, kernel=3, padding=1),
          fj.ops.conv2d(1, 32, 14, 14, out_channels=64, kernel=3, padding=1),
          fj.ops.conv2d(1, 64, 14, 14, out_channels=32, kernel=1)]
fj.compare(others, ["random"], trials=budget(96, 32), seeds=1, db=str(out / "others.db"), replay=True, progress=False,
           remeasure=0)
report = pretrain([out / "others.db"], out / "cost_model.npz", holdout=0.34, sample_budget=budget(30_000, 2_000),
                  max_epochs=budget(60, 5))
print("trained on", report["train_tasks"], "held out", report["heldout_tasks"])
print(f"held-out pairwise accuracy: MLP {report['heldout_mlp_pairwise']:.3f}, "
      f"roofline prior {report['heldout_prior_pairwise']:.3f}")"""),
    ("code", """pre = {"cost_model": str(out / "cost_model.npz")}
cmp3 = fj.compare(tasks, ["gradient", "genetic@32"], trials=budget(64, 16), seeds=1, db=None, replay=True, progress=False,
                  strategy_options={"gradient": {**budget({"starts": 64, "steps": 32}, {"starts": 16, "steps": 8}),
                                                 **pre}, "genetic": pre})
display(Markdown(cmp3.table()))"""),
    ("md", """## The model shipped with felixjax

The runs of the first section started from a pretrained model too (those just above from this notebook's
own checkpoint): the one shipped as package data
(`felixjax/data/pretrain_cpu.npz`, the default `cost_model="auto"` on CPU targets), trained on 4800 real
measurements (4564 distinct configs) of 25 CIFAR-size layers (`felixjax/data/pretrain_cpu.jsonl.gz`). It learned real hardware, not
this notebook's synthetic oracle; the online model falls back to the roofline prior wherever the MLP ranks
the task's held-out measurements worse. Its provenance and transfer check (whole tasks held out), then the
genetic search started from the shipped model and from the roofline prior (`cost_model=None`, what it
started from before a model was shipped), side by side:"""),
    ("code", """import json

from felixjax.model import PACKAGED_MODEL

shipped = json.loads(Path(str(PACKAGED_MODEL) + ".json").read_text())
print("data:", shipped["data"], "-", shipped["data_provenance"]["date_utc"], shipped["data_provenance"]["machine"][0])
check = shipped["transfer_check"]
print(f"held-out tasks {check['heldout_tasks']}: pairwise accuracy MLP {check['heldout_mlp_pairwise']:.3f}, "
      f"roofline prior {check['heldout_prior_pairwise']:.3f}")


class GeneticFromPrior(GeneticSearch):  # the same search, its model starting from the roofline prior
    name = "genetic-prior"

    def __init__(self):
        super().__init__(cost_model=None)


cmp4 = fj.compare(tasks, ["genetic", GeneticFromPrior], trials=budget(64, 16), seeds=1, db=None, replay=True,
                  progress=False)
display(Markdown(cmp4.table()))"""),
    ("md", """## The oracle timed with noise

A host never times a kernel the same twice: interference only slows it, so timings scatter above the kernel's
floor. `ReplayRunner.from_oracle(task, noise=sigma)` (`felixjax.testing.TimingNoise`) times the oracle that way,
each measurement the true latency × exp(sigma |z|), drawn afresh: sigma 0.1 puts a kernel's median timing about
7% above its lowest. Both the searches' models and "95% of the best" then see noisy timings, as on hardware
(`benchmarks/compare.py --replay --replay-noise 0.1`; docs/BENCHMARKS.md, "Issue 15, session 70")."""),
    ("code", """import numpy as np

from felixjax.testing import ReplayRunner, SyntheticOracle

noisy = fj.compare(tasks, ["gradient", "genetic@32"], trials=budget(64, 16), seeds=1, db=None, progress=False,
                   replay=lambda task, target: ReplayRunner.from_oracle(task, target, noise=0.1))
display(Markdown(noisy.table()))
oracle = SyntheticOracle(tasks[0])
recs = [r for run in noisy.histories.values() for r in run if r.ok]
slowdown = np.array([r.latency_s for r in recs]) / oracle.latencies([r.config for r in recs])
print(f"{len(recs)} timings: never below the truth: {bool((slowdown >= 1).all())}; "
      f"median {np.median(slowdown):.3f}x, 95th percentile {np.quantile(slowdown, 0.95):.3f}x the true latency")"""),
    ("md", """## On hardware

The same comparison with real, checked, timed C kernels, on the operator suite of the benchmark
(`felixjax/suites.py`), writes `cmp.csv`, `table.md`, `curves.png` and the database `cmp.db` into the
output folder (the default strategies as above; `--reference` judges "95% of best" against runs of twice the
budget, `--run-caches` gives each run its own build cache so that no run gets another's compiles free):

```bash
felixjax compare --suite ops --seeds 3 --trials 256 --threads 1 --reference --run-caches --out results/
```

Add `--replay` to run it against the synthetic oracle instead, as above, and `--cost-model
cost_model.npz` (from `felixjax pretrain runs.db -o cost_model.npz`) to start both from a pretrained
model."""),
]


def build() -> nbformat.NotebookNode:
    return build_notebook(CELLS)


if __name__ == "__main__":
    write_notebook(build(), NOTEBOOK)
