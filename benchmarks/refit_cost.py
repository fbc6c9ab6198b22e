"""Seconds of one online update of the shared cost model as a run's history grows, with and without the
per-update cap (`TrainConfig.max_samples`, session 78).

A tuning round refits the session's MLP on every measured row (`OnlineCostModel`: `sample_budget` samples per
update, at least `min_epochs` epochs), so past `sample_budget / min_epochs` rows an update's cost grows with the
history; the cap trains each epoch on a fresh random subset instead. Rows here are synthetic (random features
of the real feature widths, log-normal latencies in 20 groups): the update's cost depends on their count and
shape, not their values. The model is the shipped MLP (the default start on CPUs) with OnlineCostModel's config.

    python benchmarks/refit_cost.py                      # 3000, 12000, 30000 rows
    python benchmarks/refit_cost.py --rows 1000,50000
"""
from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="3000,12000,30000", help="history sizes (comma-separated)")
    args = ap.parse_args()

    from costmodels import Features
    from costmodels.mlp import TrainConfig
    from felixjax.model import OnlineCostModel, load_pretrained

    base = load_pretrained("packaged")
    f, g, a = base.n_access_features, base.n_glob_features, base.max_accesses or 8
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, load "
          f"{os.getloadavg()[0]:.2f}; the shipped MLP, sample_budget {OnlineCostModel.SAMPLE_BUDGET}, max_epochs 100")
    print(f"{'rows':>7} {'cap':>7} {'seconds':>8} {'epochs':>6} {'rows/epoch':>10}")
    for n in (int(r) for r in args.rows.split(",")):
        rng = np.random.default_rng(0)
        feats = Features(rng.normal(size=(n, a, f)).astype(np.float32), np.ones((n, a), np.float32),
                         rng.normal(size=(n, g)).astype(np.float32))
        lat, groups = np.exp(rng.normal(size=n)) * 1e-3, rng.integers(0, 20, n)
        for cap in (0, OnlineCostModel.MAX_SAMPLES):
            m = load_pretrained("packaged")
            m.config = TrainConfig(sample_budget=OnlineCostModel.SAMPLE_BUDGET, max_epochs=100, max_samples=cap)
            m.update(feats, lat, groups)  # compiles every shape of this size outside the timing (train, hold-out)
            t = time.perf_counter()  # the next round's update: same rows, continuing from the weights
            r = m.update(feats, lat, groups)
            print(f"{n:>7} {cap or 'off':>7} {time.perf_counter() - t:>8.2f} {int(r['epochs']):>6} "
                  f"{int(r['rows_per_epoch']):>10}", flush=True)


if __name__ == "__main__":
    main()
