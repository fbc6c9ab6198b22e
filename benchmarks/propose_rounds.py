"""Each round's propose seconds, op by op: the gradient search next to genetic@32 (issue 15, session 66).

``benchmarks/search_overhead.py`` reports a search's propose time as a mean over all rounds; the first round
is the one that decides how soon a run's first result arrives (a sketch with nothing measured gets two descent
passes). This script times every ``propose`` call of each strategy class on the replay oracle (no kernels
built), after an untimed warm-up on the first op that pays the JIT compilations, and prints one row per op and
strategy with the seconds of its first rounds.

    python benchmarks/propose_rounds.py                         # fresh suite, 1 seed x 128 trials
    python benchmarks/propose_rounds.py --ops dw_gemv --rounds 2
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import felixjax as fj
from benchmarks.search_overhead import tasks_of, warm_up
from felixjax.strategies.genetic import GeneticSearch
from felixjax.strategies.gradient import GradientSearch

TIMES: dict = defaultdict(list)  # (task name, strategy name) -> seconds of each propose call, in order


def timed(cls) -> None:
    """Wrap ``cls.propose`` so every call's seconds land in :data:`TIMES`."""
    inner = cls.propose

    def propose(self, ctx, n):
        t0 = time.perf_counter()
        out = inner(self, ctx, n)
        TIMES[(ctx.task.name, self.name)].append(time.perf_counter() - t0)
        return out

    cls.propose = propose


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default="fresh", help="suite names or op specs (';' between an op's fields), comma-separated")
    ap.add_argument("--strategies", default="gradient,genetic@32")
    ap.add_argument("--trials", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=4, help="rounds shown per run (default 4)")
    args = ap.parse_args(argv)
    tasks = tasks_of(args.ops)
    names = args.strategies.split(",")
    for cls in (GradientSearch, GeneticSearch):
        timed(cls)
    warm_up(tasks, names)
    TIMES.clear()
    fj.compare(tasks, names, trials=args.trials, seeds=1, db=None, replay=True, progress=False, remeasure=0,
               defaults=False)
    k = args.rounds
    print(f"replay oracle, {len(tasks)} ops x 1 seed x {args.trials} trials; propose seconds of rounds 1-{k}\n")
    print("| op | strategy | " + " | ".join(f"round {r + 1}" for r in range(k)) + " |")
    print("| --- | --- | " + " | ".join("---:" for _ in range(k)) + " |")
    for (task, name), secs in TIMES.items():
        print(f"| {task} | {name} | " + " | ".join(f"{s:.2f}" for s in secs[:k]) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
