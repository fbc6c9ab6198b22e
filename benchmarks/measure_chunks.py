"""When do a batch's results arrive? Building the whole batch first against building it in chunks.

A tuning round proposes a batch (32 at the defaults) in the order its strategy ranks it, and the session
commits each result as it arrives. With ``build_chunk=None`` :class:`felixjax.Measurer` builds every
candidate of the batch (gcc, 2 in parallel) before timing the first (its only behaviour before session 64),
so a round's best-ranked candidate is known only after all of its builds; with ``build_chunk=k`` (8 by
default since session 64) it builds ``k``, times them, builds the next ``k``. This script builds
and times the same random batch of each op both ways, from an empty build cache each time, modes
interleaved per repeat, and reports when result 1, 4, 8, 16 and the whole batch arrived (median over
repeats; seconds since the batch began). Every kernel is checked against numpy before and after it is
timed (the runner's own check); a failed check is counted and shown.

Usage:
    python benchmarks/measure_chunks.py --suite dw_gemv,fresh --batch 32 --repeats 3 --chunks 0,2,4,8
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from codegen.measure import LocalRunner
from codegen.measure_records import TimingProtocol
from codegen.spaces import spaces_for
from codegen.target import Target
from felixjax.context import SearchContext
from felixjax.measurer import Measurer
from felixjax.strategies.random import RandomSearch
from felixjax.suites import suite

MARKS = (1, 4, 8, 16)


def random_batch(task, target: Target, n: int, seed: int) -> list:
    """``n`` distinct valid configs, as the random search proposes them (fixed by ``seed``)."""
    ctx = SearchContext(task, target, spaces_for(task, target), np.random.default_rng(seed))
    return RandomSearch().propose(ctx, n)


def arrivals(task, target, runner, configs, chunk: int | None) -> tuple[list[float], int]:
    """Seconds since the batch began at which each result arrived, and the failed results."""
    with tempfile.TemporaryDirectory() as cache:  # an empty build cache: every mode pays its own compiles
        m = Measurer(task, target, runner, threads=1, build_chunk=chunk, cache_dir=cache,
                     protocol=TimingProtocol(warmup=1, min_repeat_ms=10, repeats=3))
        times: list[float] = []
        bad = [0]
        t0 = time.perf_counter()

        def on_result(cfg, res) -> bool:
            times.append(time.perf_counter() - t0)
            bad[0] += res.status != "ok"
            return True

        m.measure(configs, on_result)
    return times, bad[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="dw_gemv,fresh", help="comma-separated suites of felixjax.suites")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--chunks", default="0,2,4,8", help="build_chunk values; 0 = the whole batch first")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    chunks = [int(c) or None for c in args.chunks.split(",")]
    target = Target.cpu()
    runner = LocalRunner()
    tasks = [t for name in filter(None, args.suite.split(",")) for t in suite(name)]
    print(f"host: {platform.processor() or platform.machine()}, {target.cores} cores; batch {args.batch}, "
          f"{args.repeats} repeats, modes interleaved per repeat, empty build cache per mode\n")
    print("| op | build_chunk | result 1 (s) | result 4 | result 8 | result 16 | whole batch (s) "
          "| whole batch / build-all | failed |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    totals: dict = {c: [] for c in chunks}
    try:
        for ti, task in enumerate(tasks):
            configs = random_batch(task, target, args.batch, args.seed + ti)
            arrivals(task, target, runner, configs[:2], None)  # the child's first run of this op: untimed
            runs: dict = {c: [] for c in chunks}
            failed = dict.fromkeys(chunks, 0)
            for _ in range(args.repeats):
                for c in chunks:
                    times, bad = arrivals(task, target, runner, configs, c)
                    runs[c].append(times)
                    failed[c] += bad
            base = statistics.median(r[-1] for r in runs[chunks[0]])
            for c in chunks:
                med = [statistics.median(r[min(k, len(r)) - 1] for r in runs[c]) for k in MARKS]
                whole = statistics.median(r[-1] for r in runs[c])
                totals[c].append(whole / base)
                print(f"| {task.name} | {c or 'all'} | " + " | ".join(f"{v:.2f}" for v in med)
                      + f" | {whole:.2f} | {whole / base:.2f} | {failed[c]} |", flush=True)
    finally:
        runner.close()
    print("\ngeomean whole batch / the first mode's: "
          + ", ".join(f"{c or 'all'} {float(np.exp(np.mean(np.log(v)))):.3f}" for c, v in totals.items() if v))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
