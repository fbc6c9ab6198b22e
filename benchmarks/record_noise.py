"""How well do tuning records rank kernels on this host? The noise ceiling of any cost model (issue 15).

A cost model learns from the tuner's records: one timing per config, taken whenever the search reached
it. Where the host drifts, a record ranks configs only as well as two timings of the same configs
agree. This script tunes a task with random search (real builds and timings), then re-times every
correct config it measured twice more, interleaved in one process (``time_interleaved``), and prints
Kendall's tau between the records and each re-timing and between the two re-timings, over all configs
and over the 16 fastest (where a search's decisions are made), and the records' spread around the
re-timed values.

Session 16 measured the fitted model's Kendall tau on each next round's candidates at about 0 on real
measurements; if the records themselves agree with a re-timing far better than that, the model, not
the measurements, is what limits model-guided search.

Run: ``python benchmarks/record_noise.py [--op conv2d:n=1,c=128,h=17,w=17,k=128,r=3,pad=1] [--trials 96]``
(about 3 minutes per 96 trials at 1 thread).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
from scipy.stats import kendalltau

import felixjax as fj
from codegen.target import Target
from felixjax.baselines import kernel_contender, time_interleaved
from felixjax.suites import parse_spec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", default="conv2d:n=1,c=128,h=17,w=17,k=128,r=3,pad=1")
    ap.add_argument("--trials", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--top", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    task, target = parse_spec(args.op), Target.cpu()
    res = fj.tune(task, target, strategy="random", trials=args.trials, threads=args.threads, seed=args.seed,
                  progress=False)
    records = {}
    for r in res.history:
        if r.ok and r.config not in records:
            records[r.config] = r
    recs = list(records.values())
    arrays = task.random_inputs(0)
    expected = task.reference(*arrays)
    contenders = {i: kernel_contender(task, r.config, arrays, threads=args.threads, target=target, expected=expected)
                  for i, r in enumerate(recs)}
    for c in contenders.values():
        c.check()
    first = time_interleaved(contenders, rounds=3, min_time_s=0.02)
    second = time_interleaved(contenders, rounds=3, min_time_s=0.02)
    for c in contenders.values():
        c.check()  # after timing too
    rec = np.array([r.latency_s for r in recs])
    t1 = np.array([np.median(first[i]) for i in contenders])
    t2 = np.array([np.median(second[i]) for i in contenders])

    def tau(a: np.ndarray, b: np.ndarray) -> float:
        return float(kendalltau(a, b)[0])

    top = np.argsort(t1 + t2)[: args.top]
    print(f"{task.name}, {args.threads} thread(s): {len(recs)} correct configs of {args.trials} random trials")
    print("| configs | tau(record, re-timing 1) | tau(record, re-timing 2) | tau(re-timing 1, re-timing 2) |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| all {len(recs)} | {tau(rec, t1):.3f} | {tau(rec, t2):.3f} | {tau(t1, t2):.3f} |")
    print(f"| fastest {len(top)} | {tau(rec[top], t1[top]):.3f} | {tau(rec[top], t2[top]):.3f} | "
          f"{tau(t1[top], t2[top]):.3f} |")
    p5, p50, p95 = np.percentile(rec / np.minimum(t1, t2), [5, 50, 95])
    print(f"record / faster re-timing: p5 {p5:.3f}, median {p50:.3f}, p95 {p95:.3f}; the fastest record's config "
          f"ranks {int(np.argsort(np.argsort(t1 + t2))[int(np.argmin(rec))])} (0 = fastest) on re-timing")


if __name__ == "__main__":
    main()
