"""How well does each search optimize its cost model? The first round of every variant below, proposed
from scratch under the same packaged model (no measurement, no timing), scored by that model's hard
features: the best pick, the mean of the best 8, the mean of the batch; for the gradient search also the
per-round statistics (score lost to rounding, trajectories leaving their basin, soft/hard tau) and the
seconds ``propose`` took.

Issue 15 asks what the descent's temperature and rounding do; this answers the question under them: does
the descent reach the configs the model rates highest, compared with an evolution under the same model?
(A higher score is not a faster kernel: the model errs most where it is optimized. The measured
ablation, ``benchmarks/ablation.py --measured``, decides whether reaching higher helps.)

Usage:
    python benchmarks/model_optimum.py --suite ops --seeds 2
    python benchmarks/model_optimum.py --suite fresh --variants default,climb4,genetic@32 --csv out.csv
"""
from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import felixjax as fj  # noqa: E402
from codegen.ops import parse_spec  # noqa: E402
from codegen.spaces import spaces_for  # noqa: E402
from felixjax.context import SearchContext  # noqa: E402
from felixjax.strategies.genetic import GeneticSearch  # noqa: E402
from felixjax.strategies.gradient import GradientSearch  # noqa: E402
from felixjax.suites import suite  # noqa: E402

PLAIN = {"flat": 0.0, "spread": 0.0, "eps_greedy": 0.0}  # the pool's top scores, nothing kept apart or random

#: name -> strategy factory (the gradient search at its defaults unless the name says otherwise)
VARIANTS = {
    "default": lambda: GradientSearch(stats=True),
    "T2": lambda: GradientSearch(temperature=2.0, stats=True),
    "T0.5": lambda: GradientSearch(temperature=0.5, stats=True),
    "T0.25": lambda: GradientSearch(temperature=0.25, stats=True),
    "T0.1": lambda: GradientSearch(temperature=0.1, stats=True),
    "climb4": lambda: GradientSearch(climb=4, stats=True),
    "plain": lambda: GradientSearch(stats=True, **PLAIN),
    "plain_T0.25": lambda: GradientSearch(temperature=0.25, stats=True, **PLAIN),
    "plain_lr0.1": lambda: GradientSearch(lr=0.1, stats=True, **PLAIN),
    "plain_128x64": lambda: GradientSearch(starts=128, steps=64, stats=True, **PLAIN),
    "plain_climb4": lambda: GradientSearch(climb=4, stats=True, **PLAIN),
    "plain_climb16": lambda: GradientSearch(climb=16, stats=True, **PLAIN),
    "genetic@32": lambda: GeneticSearch(batch_size=32),
    "genetic@32_eps0": lambda: GeneticSearch(batch_size=32, eps_greedy=0.0),
}
COLUMNS = ("top", "top8", "mean", "rounding_loss", "left_basin", "soft_hard_tau", "propose_s")


def first_round(task, variants: dict, seed: int, n: int = 32, target=None) -> dict[str, dict]:
    """Each variant's first ``n`` picks on ``task`` from scratch, every variant under one scorer (the
    packaged model, never updated): ``{variant: {column: value}}``."""
    target = target or fj.Target.cpu()
    spaces = spaces_for(task, target)
    shared = SearchContext(task, target, spaces, np.random.default_rng(0)).get_scorer("packaged")
    out = {}
    for name, make in variants.items():
        strategy = make()
        ctx = SearchContext(task, target, spaces, np.random.default_rng(seed), scorer_factory=lambda c: shared)
        t0 = time.perf_counter()
        picks = strategy.propose(ctx, n)
        seconds = time.perf_counter() - t0
        s = np.sort(np.asarray(shared.score(picks), np.float64))
        st = getattr(strategy, "last_round", {}) if isinstance(strategy, GradientSearch) else {}
        out[name] = {"top": s[-1], "top8": s[-8:].mean(), "mean": s.mean(),
                     "rounding_loss": st.get("rounding_loss", np.nan), "left_basin": st.get("left_basin", np.nan),
                     "soft_hard_tau": st.get("soft_hard_tau", np.nan), "propose_s": seconds}
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", default="ops", help="a named suite, or op specs (KIND:key=value;...) joined by ','")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS))
    ap.add_argument("--csv", help="write every (task, seed, variant) row here")
    args = ap.parse_args(argv)
    names = args.variants.split(",")
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    tasks = suite(args.suite) if ":" not in args.suite else [parse_spec(s) for s in args.suite.split(",")]
    rows = []
    for task in tasks:
        for seed in range(args.seeds):
            res = first_round(task, {v: VARIANTS[v] for v in names}, seed)
            rows += [{"task": task.name, "seed": seed, "variant": v, **cols} for v, cols in res.items()]
            print(task.name, seed, "  ".join(f"{v} {c['top']:.3f}" for v, c in res.items()), flush=True)
    print("\n| variant | best pick's score | mean of the best 8 | batch mean | rounding loss | left basin "
          "| soft/hard tau | propose (s) |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for v in names:
        mine = np.array([[r[c] for c in COLUMNS] for r in rows if r["variant"] == v], np.float64)
        means = [np.nanmean(col) if np.isfinite(col).any() else np.nan for col in mine.T]
        print(f"| {v} | " + " | ".join("—" if np.isnan(m) else f"{m:.3f}" for m in means) + " |")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["task", "seed", "variant", *COLUMNS])
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
