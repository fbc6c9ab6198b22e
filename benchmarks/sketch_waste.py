"""Where a search spends its picks across sketches: the share of each run's trials after its first round
that went to a sketch its own measurements had already left behind (measured at least ``--after`` times,
its best ``--ratio`` times the run's best so far or slower), per task and strategy. Reads a comparison's
records; measures nothing.

This is the measurement behind ``GradientSearch(prune=...)`` (issue 15, session 51): the cost model ranks
candidates across sketches worst, and the gradient search ranks all sketches' candidates in one pool, while
the genetic search breeds from the measured best and so follows the measurements from sketch to sketch.

Usage:
    python benchmarks/sketch_waste.py docs/data/headline_fresh_s41_42/cmp_db_fresh.jsonl.gz \\
        docs/data/headline_ops_off_s43_45/cmp_db_ops_off.jsonl.gz
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.compare import open_records
from felixjax.compare import REFERENCE_PREFIX
from felixjax.session import RETIME_PREFIX


def waste(records, ratio: float = 1.5, after: int = 16, first: int = 32) -> dict[tuple[str, str], tuple[int, int]]:
    """``{(task name, strategy): (trials counted, trials on a left-behind sketch)}`` over the compared runs
    (reference and re-timing runs skipped); trials before ``first`` are not counted (no sketch can be
    left behind before the first round is measured). A failed trial counts as a pick but not as a
    measurement of its sketch."""
    runs = defaultdict(list)
    for rec in records:
        if rec.run.startswith((REFERENCE_PREFIX, RETIME_PREFIX)):
            continue
        runs[(rec.task.name, rec.run)].append(rec)
    out: dict = defaultdict(lambda: [0, 0])
    for (task, run), recs in runs.items():
        best: dict[str, float] = {}
        count: dict[str, int] = defaultdict(int)
        cell = out[(task, run.rsplit(":", 1)[0])]
        for rec in sorted(recs, key=lambda r: r.trial):
            if rec.trial >= first and best:
                top = min(best.values())
                name = rec.config.sketch
                cell[0] += 1
                cell[1] += count[name] >= after and best.get(name, 0.0) >= ratio * top
            if rec.ok and rec.latency_s > 0:
                count[rec.config.sketch] += 1
                best[rec.config.sketch] = min(best.get(rec.config.sketch, float("inf")), rec.latency_s)
    return {k: (v[0], v[1]) for k, v in out.items()}


def table(cells: dict) -> str:
    strategies = sorted({s for _, s in cells})
    tasks = sorted({t for t, _ in cells})
    lines = ["| task | " + " | ".join(strategies) + " |", "| --- |" + " ---: |" * len(strategies)]

    def pct(n: int, bad: int) -> str:
        return f"{100.0 * bad / n:.1f}%" if n else "—"

    for t in tasks:
        lines.append(f"| {t} | " + " | ".join(pct(*cells.get((t, s), (0, 0))) for s in strategies) + " |")
    totals = {s: [sum(cells[(t, s)][i] for t in tasks if (t, s) in cells) for i in (0, 1)] for s in strategies}
    lines.append("| **all tasks** | " + " | ".join(f"**{pct(*totals[s])}**" for s in strategies) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("db", type=Path, nargs="+", help="comparison databases or their JSONL exports (.jsonl[.gz])")
    ap.add_argument("--ratio", type=float, default=1.5, help="left behind: its best this many times the run's best")
    ap.add_argument("--after", type=int, default=16, help="... once measured at least this many times")
    args = ap.parse_args(argv)
    if args.ratio <= 1.0 or args.after < 1:
        ap.error("--ratio must be above 1 and --after at least 1")
    cells: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, path in enumerate(args.db):
            if not path.exists():
                ap.error(f"{path}: no such file")
            db = open_records(path, Path(tmp) / f"r{i}.db")
            try:
                cells.update(waste(db.records(), args.ratio, args.after))
            finally:
                db.close()
    print(f"Share of each strategy's trials after its first round on a sketch measured >= {args.after} times whose "
          f"best was >= {args.ratio}x the run's best so far:\n")
    print(table(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
