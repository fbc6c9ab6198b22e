"""What `fj.compare`'s JIT warm-up buys: how much longer the first run of each strategy takes than
the same strategy's second seed, with and without the warm-up.

Each arm runs in a fresh process with a fresh build cache and (by default) no persistent JAX
compilation cache, as a first comparison on a new machine would: a measured comparison of the given
strategies, two seeds each, interleaved as `fj.compare` runs them. The first seed of a strategy is the
first run to propose, so without the warm-up its clock pays the compilations the second seed reuses.
Prints, per arm and strategy, the seconds at the end of each seed's first round and of its run.

    python benchmarks/compare_warmup.py                      # matmul 96x64x80, gradient + genetic, 64 trials
    python benchmarks/compare_warmup.py --op "conv2d:n=1,c=32,h=14,w=14,k=32,r=3,pad=1" --jax-cache
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
import felixjax as fj
op, strategies, trials, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
t0 = time.perf_counter()
c = fj.compare([op], strategies=strategies, trials=trials, seeds=[0, 1], db=None, threads=1, progress=False,
               remeasure=1, warmup=None if warmup == "default" else int(warmup))
first = {f"{s}:{seed}": [h[min(31, len(h) - 1)].elapsed_s, h[-1].elapsed_s]
         for (_, s, seed), h in c.histories.items()}
print(json.dumps({"warmup_s": c.warmup_s, "wall_s": time.perf_counter() - t0, "runs": first}))
"""


def run_arm(op: str, strategies: str, trials: int, warmup: str, jax_cache: bool) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, FELIXJAX_CACHE=cache)
        if not jax_cache:
            env["FELIXJAX_JAX_CACHE"] = "0"
        out = subprocess.run([sys.executable, "-c", CHILD, op, strategies, str(trials), warmup], env=env,
                             capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--op", default="matmul:m=96,n=64,k=80")
    ap.add_argument("--strategies", default="gradient,genetic")
    ap.add_argument("--trials", type=int, default=64)
    ap.add_argument("--jax-cache", action="store_true",
                    help="keep JAX's persistent compilation cache on (the skew is then its loading, not compiling)")
    args = ap.parse_args(argv)
    print(f"{args.op}, {args.strategies}, 2 seeds x {args.trials} trials, 1 thread, fresh build cache, JAX cache "
          f"{'on' if args.jax_cache else 'off'}")
    print("| warm-up | warm-up s | strategy | seed 0 first round s | seed 1 first round s | seed 0 run s | seed 1 run s |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for warmup in ("0", "default"):
        res = run_arm(args.op, args.strategies, args.trials, warmup, args.jax_cache)
        for s in args.strategies.split(","):
            a, b = res["runs"][f"{s}:0"], res["runs"][f"{s}:1"]
            print(f"| {warmup} | {res['warmup_s']:.1f} | {s} | {a[0]:.2f} | {b[0]:.2f} | {a[1]:.2f} | {b[1]:.2f} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
