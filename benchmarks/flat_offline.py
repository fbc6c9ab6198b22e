"""Offline: does ranking by a score smoothed over the ±1 neighbourhood pick more near-best configs than the
point score? (issue 15; the evidence behind ``GradientSearch(flat=...)``)

For every task of a database of real measurements (a comparison's ``cmp.db``, or a ``.jsonl.gz`` export such
as ``docs/data/headline15_defaults_s29_records.jsonl.gz`` or the pools in ``docs/data/pools_s23/``), the pool is
every distinct correctly measured config (its median latency; ``retime:*`` runs left out) and a *hit* is a config
within 95% of the pool's best. Each config is scored by the packaged cost model (the model both searches start
from, before any measurement of the task) on its own (``point``) and over its valid ±1 neighbours
(:meth:`felixjax.relax.Relaxation.neighbours_x`): ``mean`` (the config and its neighbours, equally weighted),
``q25`` (their lower quartile), ``min`` and ``mix`` (half the point score, half ``mean``: ``flat=0.5``; the
strategy averages over the neighbours alone, this over the config and its neighbours, nearly the same). Per
scoring: the hits among its top ``--k`` and among the ``--k`` that :func:`felixjax.strategies.base.spread_picks`
keeps 4 apart (as the gradient search picks), Kendall's tau over the pool and the latency of its top pick over
the best.

The pool is what the searches measured, not what a descent harvests, so this only hints at the lever; the
measured ablations (``benchmarks/ablation.py --arms gradient_pre_b32_spread4,gradient_pre_b32_spread4_flat``)
judge it.

    python benchmarks/flat_offline.py --db docs/data/headline15_defaults_s29_records.jsonl.gz
    python benchmarks/flat_offline.py --db docs/data/pools_s23/ops.jsonl.gz
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.model_pool import as_database  # noqa: E402
from codegen.spaces import spaces_for  # noqa: E402
from codegen.target import Target  # noqa: E402
from costmodels import kendall_tau  # noqa: E402
from felixjax.compare import REACH  # noqa: E402
from felixjax.context import SearchContext  # noqa: E402
from felixjax.database import Database  # noqa: E402
from felixjax.strategies.base import spread_picks  # noqa: E402

SCORINGS = ("point", "mean", "q25", "min", "mix")


def smoothed(scorer, configs: list) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Integer points ``[N, N_X]`` of ``configs`` and each scoring of :data:`SCORINGS` ``[N]``."""
    n = len(configs)
    xs = [None] * n
    out = {k: np.zeros(n) for k in SCORINGS}
    for name, rel in scorer.relaxations.items():
        idx = [i for i, c in enumerate(configs) if c.sketch == name]
        if not idx:
            continue
        x = np.stack([rel.to_x(configs[i]) for i in idx]).astype(np.float32)
        own = scorer.score_x(name, x)
        for j, i in enumerate(idx):
            xs[i] = x[j]
            nb = rel.neighbours_x(x[j: j + 1])
            around = np.concatenate([[own[j]], scorer.score_x(name, nb) if len(nb) else np.zeros(0)])
            out["point"][i], out["mean"][i] = own[j], around.mean()
            out["q25"][i], out["min"][i] = np.quantile(around, 0.25), around.min()
    out["mix"] = 0.5 * out["point"] + 0.5 * out["mean"]
    return np.stack(xs), out


def task_pools(db: Database):
    """``(task, target, configs, latency)`` per task of ``db``: every distinct correctly measured config and
    its median latency (``retime:*`` runs left out)."""
    for task, _ in db.tasks():
        lat: dict = defaultdict(list)
        records = [r for r in db.records(task) if r.ok and r.latency_s > 0 and not r.run.startswith("retime:")]
        for r in records:
            lat[r.config].append(r.latency_s)
        if records:
            yield task, Target.from_json(records[0].target), list(lat), np.array([np.median(v) for v in lat.values()])


def pool_scorer(task, target, cost_model: str = "packaged"):
    """The scorer a search of ``task`` starts from with ``cost_model`` (before any measurement)."""
    return SearchContext(task, target, spaces_for(task, target), np.random.default_rng(0)).get_scorer(cost_model)


def task_rows(db: Database, k: int) -> list[dict]:
    rows = []
    for task, target, configs, latency in task_pools(db):
        scorer = pool_scorer(task, target)
        keep = [c.sketch in scorer.relaxations for c in configs]
        configs, latency = [c for c, ok in zip(configs, keep) if ok], latency[np.array(keep)]
        hit = latency <= latency.min() / REACH
        xs, scores = smoothed(scorer, configs)
        sketch = [c.sketch for c in configs]
        for name, s in scores.items():
            order = np.argsort(-s, kind="stable")
            rows.append({"task": task.name, "scoring": name, "pool": len(configs), "hits_pool": int(hit.sum()),
                         "hits_top": int(hit[order[:k]].sum()),
                         "hits_spread": int(hit[spread_picks(order, xs, sketch, k, 4.0)].sum()),
                         "tau": kendall_tau(s, latency), "top1": float(latency[order[0]] / latency.min())})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", required=True, help="a database or a .jsonl.gz export of one")
    ap.add_argument("--k", type=int, default=32, help="picks per scoring (default 32: a round)")
    args = ap.parse_args(argv)
    rows = task_rows(Database(as_database(args.db), readonly=True), args.k)
    print("| task | pool (hits) | " + " | ".join(f"{s}: top / spread hits, tau" for s in SCORINGS) + " |")
    print("|---|---:|" + "---:|" * len(SCORINGS))
    for task in dict.fromkeys(r["task"] for r in rows):
        rs = {r["scoring"]: r for r in rows if r["task"] == task}
        first = next(iter(rs.values()))
        print(f"| {task} | {first['pool']} ({first['hits_pool']}) | "
              + " | ".join(f"{rs[s]['hits_top']} / {rs[s]['hits_spread']}, {rs[s]['tau']:+.2f}" for s in SCORINGS) + " |")
    print(f"\nmeans over {len({r['task'] for r in rows})} tasks (top-{args.k} hits, spread-picked hits, tau; "
          "top pick / best as a geomean):")
    for s in SCORINGS:
        rs = [r for r in rows if r["scoring"] == s]
        print(f"  {s:6s} {np.mean([r['hits_top'] for r in rs]):5.1f} {np.mean([r['hits_spread'] for r in rs]):5.1f} "
              f"{np.nanmean([r['tau'] for r in rs]):+.3f} {np.exp(np.mean(np.log([r['top1'] for r in rs]))):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
