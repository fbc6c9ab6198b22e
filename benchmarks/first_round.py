"""What decides trials to 95% on the ops a search solves in its first round: how many of the first batch's
configs reach 95% of the best known (its hits), and where in the batch the first of them was measured.

For every compared run of a comparison database (``benchmarks/compare.py``'s ``cmp.db``; the ``reference:*``
and ``retime:*`` runs are left out but count for the best known, as in the comparison) this reports:

- ``opening``: the configs every run of the task measured first (``--defaults on``: the default schedules);
- ``first``: trials to 95% as the comparison counts them (1-based, the opening included; blank: never);
- ``hits``: how many of the search's first ``--batch`` configs after the opening reach 95%;
- ``random``: the expected 1-based position of the first hit if that batch were measured in a random order,
  ``(batch + 1) / (hits + 1)`` plus the opening (blank without a hit): ``first`` well below it means the
  batch's order found the hit early, near it means the order did not matter;
- ``tau``: Kendall's tau, within that batch, between the packaged cost model's score (the prior both
  searches start from, before any measurement of the task) and the measured speed (``-latency``);
- ``top1``: the measured latency of the model's top-scored config in the batch over the best known.

The summary gives per strategy the mean hits, the mean tau and the geomean of ``first`` over the runs that hit
in their first batch, and per task the genetic / gradient ratio of the medians of ``first`` beside the ratio
the hit counts alone predict (the medians of ``random``).

    python benchmarks/first_round.py --db results/compare_fresh_s33/cmp.db --batch 32
    python benchmarks/first_round.py --db results/compare_fresh_s33/cmp.db --rows first_round.csv
"""
from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from codegen.spaces import spaces_for  # noqa: E402
from codegen.target import Target  # noqa: E402
from costmodels import kendall_tau  # noqa: E402
from felixjax.compare import REACH  # noqa: E402
from felixjax.context import SearchContext  # noqa: E402
from felixjax.database import Database  # noqa: E402

RESERVED = ("reference:", "retime:")


def opening_of(runs: dict[str, list]) -> set:
    """The configs every run measured first: the largest leading stretch whose set of configs is the
    same in every run (empty with one run, or when the runs start apart)."""
    lists = [r for r in runs.values() if r]
    if len(lists) < 2:
        return set()
    common: set = set()
    for k in range(1, min(32, *(len(r) for r in lists)) + 1):  # an opening is a few defaults per sketch
        sets = [{x.config for x in r[:k]} for r in lists]
        if all(s == sets[0] for s in sets):
            common = sets[0]
    return common


def first_hit(records: list, cutoff: float) -> int | None:
    """1-based trial of the first correct record at or under ``cutoff`` (None: none)."""
    for i, r in enumerate(records):
        if r.ok and r.latency_s <= cutoff:
            return i + 1
    return None


def run_rows(db: Database, batch: int) -> list[dict]:
    rows = []
    for task, _ in db.tasks():
        records = db.records(task)
        best = min((r.latency_s for r in records if r.ok and r.latency_s > 0 and not r.run.startswith("retime:")),
                   default=None)
        if best is None:
            continue
        runs: dict[str, list] = defaultdict(list)
        for r in records:
            if not r.run.startswith(RESERVED):
                runs[r.run].append(r)
        opening = opening_of(runs)
        target = Target.from_json(records[0].target)
        scorer = SearchContext(task, target, spaces_for(task, target), np.random.default_rng(0)).get_scorer("packaged")
        cutoff = best / REACH  # the comparison's bar
        for run, recs in sorted(runs.items()):
            n_open = sum(1 for r in recs[: len(opening)] if r.config in opening)
            first = [r for r in recs[n_open: n_open + batch] if r.ok and r.latency_s > 0]
            lat = np.array([r.latency_s for r in first])
            hits = int((lat <= cutoff).sum())
            scores = np.asarray(scorer.score([r.config for r in first]), np.float64) if first else np.zeros(0)
            strategy, _, seed = run.rpartition(":")
            rows.append({
                "task": task.name, "strategy": strategy, "seed": seed, "opening": n_open,
                "first": first_hit(recs, cutoff), "hits": hits, "batch": len(first),
                "random": n_open + (batch + 1) / (hits + 1) if hits else None,
                "tau": kendall_tau(scores, lat) if len(first) > 2 else float("nan"),
                "top1": float(lat[int(np.argmax(scores))] / best) if len(first) else float("nan"),
            })
    return rows


def _gmean(xs) -> float:
    xs = [x for x in xs if x]
    return float(np.exp(np.mean(np.log(xs)))) if xs else float("nan")


def summary(rows: list[dict], base: str = "gradient") -> list[str]:
    out = [("| strategy | runs | mean hits in first batch | runs with a hit | trials to 95% (geomean, runs hit in batch 1) "
            "| random order would give | mean tau (model, within batch) | model's top-1 / best (geomean) |"),
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    by = defaultdict(list)
    for r in rows:
        by[r["strategy"]].append(r)
    for s, rs in sorted(by.items()):
        hit = [r for r in rs if r["hits"]]
        taus = [r["tau"] for r in rs if np.isfinite(r["tau"])]
        out.append(f"| {s} | {len(rs)} | {np.mean([r['hits'] for r in rs]):.1f} | {len(hit)} | "
                   f"{_gmean([r['first'] for r in hit]):.1f} | {_gmean([r['random'] for r in hit]):.1f} | "
                   f"{np.mean(taus):+.2f} | {_gmean([r['top1'] for r in rs]):.3f} |")
    out += ["", f"Per task, medians over seeds; ratios strategy / {base} (> 1: {base} reached 95% in fewer trials).", "",
            "| task | strategy | trials to 95% | random order | hits | ratio | ratio from hits alone |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    tasks = sorted({r["task"] for r in rows})
    for t in tasks:
        med = {}
        for s in sorted(by):
            rs = [r for r in by[s] if r["task"] == t]
            if not rs:
                continue
            first = [r["first"] if r["first"] else np.inf for r in rs]
            rnd = [r["random"] if r["random"] else np.inf for r in rs]
            med[s] = (float(np.median(first)), float(np.median(rnd)), float(np.median([r["hits"] for r in rs])))
        for s, (f, rn, h) in med.items():
            ratio = rat2 = ""
            if s != base and base in med:
                ratio = f"{f / med[base][0]:.2f}" if np.isfinite(f) and np.isfinite(med[base][0]) else "—"
                rat2 = f"{rn / med[base][1]:.2f}" if np.isfinite(rn) and np.isfinite(med[base][1]) else "—"
            out.append(f"| {t} | {s} | {f:g} | {rn:.1f} | {h:g} | {ratio} | {rat2} |")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", required=True, action="append",
                    help="a comparison database (read only) or a .jsonl.gz export of one; repeatable")
    ap.add_argument("--batch", type=int, default=32, help="the first batch's size (the runs' trials per round)")
    ap.add_argument("--base", default="gradient", help="the strategy the ratios divide by")
    ap.add_argument("--rows", help="also write every run's row to this CSV")
    args = ap.parse_args(argv)
    from benchmarks.model_pool import as_database

    rows = []
    for path in args.db:
        rows += run_rows(Database(as_database(path), readonly=True), args.batch)
    if args.rows:
        with open(args.rows, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    print("\n".join(summary(rows, args.base)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
