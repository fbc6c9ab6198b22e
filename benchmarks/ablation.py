"""Ablation of issue 15's levers on the replay oracle (no timing): which lever buys the gradient
search fewer measurements to 95% of the best, next to the genetic search given the same lever.

Arms (each a strategy object with its own name, all through ``fj.compare`` with the same replay,
budget, seeds and opening — no default schedules measured first, so search logic alone counts):

* ``gradient`` — the defaults (64 per round);
* ``gradient_b16`` — 16 candidates per round (more rounds to learn from);
* ``gradient_trust`` — the trust region around the best measured points (weight 1, radius 2);
* ``gradient_b16_trust`` — both;
* ``genetic`` — Ansor's GA (64 per round) and ``genetic_b16`` (the same batch as the b16 arms).

"95% of best" is taken against the best latency any arm found for the task (the union of arms and
seeds); ratios are ``arm / gradient`` geomeans over the ops (above 1: the default gradient is better).
The replay oracle is :class:`felixjax.testing.SyntheticOracle`: an analytic stand-in for hardware, so
these numbers rank levers, they do not replace the measured comparison.

Usage:
    python benchmarks/ablation.py --ops conv28,dw28,matmul512,dense4096 --seeds 2 --trials 128 --write
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import felixjax as fj  # noqa: E402
from felixjax.strategies.genetic import GeneticSearch  # noqa: E402
from felixjax.strategies.gradient import GradientSearch  # noqa: E402
from felixjax.suites import suite  # noqa: E402

SHORT = {"matmul512": 0, "matmul1024": 1, "conv56": 2, "conv28": 3, "conv14": 4, "dw28": 5, "dense4096": 6}


def arms() -> list:
    def named(obj, name):
        obj.name = name
        return obj

    return [
        named(GradientSearch(), "gradient"),
        named(GradientSearch(batch_size=16), "gradient_b16"),
        named(GradientSearch(trust_weight=1.0, trust_radius=2.0), "gradient_trust"),
        named(GradientSearch(batch_size=16, trust_weight=1.0, trust_radius=2.0), "gradient_b16_trust"),
        named(GeneticSearch(), "genetic"),
        named(GeneticSearch(batch_size=16), "genetic_b16"),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", default="conv28,dw28,matmul512,dense4096", help=f"from {', '.join(SHORT)}")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--trials", type=int, default=128)
    ap.add_argument("--out", default="results/ablation")
    ap.add_argument("--write", action="store_true", help="write the table into docs/BENCHMARKS.md")
    args = ap.parse_args(argv)
    ops = suite("ops")
    tasks = [ops[SHORT[name]] for name in args.ops.split(",")]
    t0 = time.perf_counter()
    cmp = fj.compare(tasks, arms(), trials=args.trials, seeds=args.seeds, db=None, replay=True, out=args.out,
                     progress=True, remeasure=0, defaults=False)
    minutes = (time.perf_counter() - t0) / 60
    text = cmp.table()
    print(text)
    if args.write:
        from benchmarks.kernels import write_doc

        head = (f"Replay oracle (no timing), {len(tasks)} ops x {args.seeds} seeds x {args.trials} trials, no "
                f"default schedules first; `python benchmarks/ablation.py --ops {args.ops} --seeds {args.seeds} "
                f"--trials {args.trials} --write` ({minutes:.1f} min). Ratios: arm / gradient (above 1: the "
                "default gradient needed fewer trials / seconds, or found a faster kernel).")
        write_doc(head + "\n\n" + text, begin="<!-- ablation:begin -->", end="<!-- ablation:end -->",
                  heading="Ablation of the gradient search's levers on the replay oracle (benchmarks/ablation.py)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
