"""How clustered a search's measured batches are: for each run of a comparison database, the share of each
round's configs that lie within L1 distance ``r`` (in the relaxed integer space of their sketch,
:class:`felixjax.relax.Relaxation`; 2 is one move of ``neighbours_x``) of an earlier config of the same round,
and the number of sketches a round touches. The evidence behind ``GradientSearch(spread=...)``: a batch
crowded into one region the model over-rates fails together.

Usage (the databases ``benchmarks/ablation.py --db`` and ``benchmarks/compare.py`` write, or a ``.jsonl.gz``
export of one):

    python benchmarks/pick_spread.py --db docs/data/headline15_defaults_s29_records.jsonl.gz --round 64
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from codegen.spaces import spaces_for  # noqa: E402
from codegen.target import Target  # noqa: E402
from felixjax.database import Database  # noqa: E402
from felixjax.relax import Relaxation  # noqa: E402


def crowded_share(points: list, radius: float) -> float:
    """Share of ``points`` (``(sketch, x)`` in measurement order) within ``radius`` of an earlier one of
    their sketch."""
    seen: dict = defaultdict(list)
    near = 0
    for sketch, x in points:
        if seen[sketch] and np.abs(np.asarray(seen[sketch]) - x).sum(axis=1).min() <= radius:
            near += 1
        seen[sketch].append(x)
    return near / max(1, len(points))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", required=True, help="a comparison database (read only), or a .jsonl.gz export of one")
    ap.add_argument("--round", type=int, default=64, help="trials per round of the runs")
    ap.add_argument("--rounds", type=int, default=2, help="rounds per run looked at (from the first)")
    ap.add_argument("--radius", default="2,4", help="comma-separated L1 radii")
    args = ap.parse_args(argv)
    from benchmarks.model_pool import as_database

    radii = [float(r) for r in args.radius.split(",")]
    db = Database(as_database(args.db), readonly=True)
    stats: dict = defaultdict(list)  # (strategy, round) -> [(shares per radius..., sketches)]
    for task, _ in db.tasks():
        records = db.records(task)
        target = Target.from_json(records[0].target)
        rels = {name: Relaxation(space) for name, space in spaces_for(task, target).items()}
        for run in sorted({r.run for r in records if not r.run.startswith("reference")}):
            recs = [r for r in records if r.run == run and r.config.sketch in rels]
            strategy = run.split(":")[0]
            for k in range(args.rounds):
                batch = recs[k * args.round:(k + 1) * args.round]
                if len(batch) < args.round // 2:
                    continue
                pts = [(r.config.sketch, rels[r.config.sketch].to_x(r.config)) for r in batch]
                stats[(strategy, k)].append([crowded_share(pts, rad) for rad in radii]
                                            + [len({s for s, _ in pts})])
    print(f"Share of a round's configs within L1 r of an earlier one of the round (means over tasks and runs; "
          f"{args.round} per round); sketches: distinct sketches per round.\n")
    print("| strategy | round | runs | " + " | ".join(f"within {r:g}" for r in radii) + " | sketches |")
    print("| --- | ---: | ---: | " + " | ".join("---:" for _ in radii) + " | ---: |")
    for (strategy, k), rows in sorted(stats.items()):
        m = np.mean(np.asarray(rows, float), axis=0)
        print(f"| {strategy} | {k + 1} | {len(rows)} | " + " | ".join(f"{v:.2f}" for v in m[:-1]) + f" | {m[-1]:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
