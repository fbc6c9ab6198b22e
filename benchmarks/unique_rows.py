"""``felixjax.points.unique_rows`` against ``np.unique(axis=0)`` on arrays shaped like the gradient search's
points (float32 rows of the relaxation's 107 coordinates, a few of them varying over small integers, a third of the
rows repeated): seconds of each (best of 5, `--repeats`) and whether the results are identical.

    python benchmarks/unique_rows.py
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from felixjax.points import unique_rows
from felixjax.relax import N_X


def best_of(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--repeats", type=int, default=5, help="timings of each, the best one counts (default 5)")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    rng = np.random.default_rng(0)
    print("| rows | varying columns | np.unique(axis=0) s | unique_rows s | ratio | identical |")
    print("| ---: | ---: | ---: | ---: | ---: | --- |")
    for rows, varying in ((2000, 15), (8000, 20), (25000, 20)):
        a = np.zeros((rows, N_X), np.float32)
        a[:, rng.choice(N_X, varying, replace=False)] = rng.integers(0, 3, size=(rows, varying))
        a = np.concatenate([a, a[: rows // 3]])
        ref = np.unique(a, axis=0, return_index=True, return_inverse=True)
        ours = unique_rows(a)
        same = all(np.array_equal(x.reshape(-1), y.reshape(-1)) for x, y in zip(ref, ours))
        t_np = best_of(lambda a=a: np.unique(a, axis=0, return_index=True, return_inverse=True), args.repeats)
        t_ours = best_of(lambda a=a: unique_rows(a), args.repeats)
        print(f"| {len(a)} | {varying} | {t_np:.4f} | {t_ours:.4f} | {t_np / t_ours:.1f}x | {same} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
