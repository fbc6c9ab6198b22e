"""Offline: how well does each pretrained cost model rank one host's real measurements before the search has
measured anything? (issue 15: the packaged model was pretrained on one CPU; does a model pretrained on the
host's own CPU, or on both, start better?)

For every task of each database of real measurements (``--db``: a comparison's ``cmp.db`` or a ``.jsonl.gz``
export), the pool is every distinct correctly measured config (median latency, ``retime:*`` runs left out;
:func:`benchmarks.flat_offline.task_pools`) and a *hit* a config within 95% of the pool's best. Each model of
``--model NAME=CHECKPOINT`` (``packaged``: the shipped one) scores the pool through the scorer a search starts
from (hard features of the record's own target), and per task the table gives the hits among its top ``--k``,
Kendall's tau over the pool and over the best quarter of the pool (how well it orders the near-good configs,
which decides what a search measures once it is close), and its top pick's latency over the best.

No timing: seconds per database. The models must not have been trained on the pools' tasks (the packaged
datasets' shapes are disjoint from the ``ops`` and ``fresh`` suites, checked when they are generated).

    python benchmarks/pretrain_transfer.py --db results/compare_fresh_s35/cmp.db \\
        --model packaged --model zen5=results/s36/zen5.npz
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.flat_offline import pool_scorer, task_pools  # noqa: E402
from benchmarks.model_pool import as_database  # noqa: E402
from costmodels import kendall_tau  # noqa: E402
from felixjax.compare import REACH  # noqa: E402
from felixjax.database import Database  # noqa: E402


def parse_models(specs: list[str]) -> dict[str, str]:
    """``NAME=CHECKPOINT`` (or ``packaged``) -> ``{name: checkpoint}``, checked to exist."""
    out = {}
    for spec in specs:
        name, _, path = spec.partition("=")
        path = path or name
        if path != "packaged" and not Path(path).exists():
            raise SystemExit(f"--model {spec}: no checkpoint at {path}")
        out[name] = path
    return out


def pool_rows(db_path: str, models: dict[str, str], k: int) -> list[dict]:
    """One row per (task, model) of a database of measurements."""
    rows = []
    db = Database(as_database(db_path), readonly=True)
    for task, target, configs, latency in task_pools(db):
        for name, path in models.items():
            scorer = pool_scorer(task, target, path)
            keep = np.array([c.sketch in scorer.relaxations for c in configs])
            cfg, lat = [c for c, ok in zip(configs, keep) if ok], latency[keep]
            score = np.asarray(scorer.score(cfg), np.float64)
            order = np.argsort(-score, kind="stable")
            hit = lat <= lat.min() / REACH
            good = lat <= np.quantile(lat, 0.25)
            rows.append({"db": db_path, "task": task.name, "model": name, "pool": len(cfg), "hits_pool": int(hit.sum()),
                         "hits_top": int(hit[order[:k]].sum()), "tau": kendall_tau(score, lat),
                         "tau_good": kendall_tau(score[good], lat[good]) if good.sum() > 2 else float("nan"),
                         "top1": float(lat[order[0]] / lat.min())})
    return rows


def report(rows: list[dict], models: list[str], k: int) -> str:
    lines = []
    for db in dict.fromkeys(r["db"] for r in rows):
        lines += [f"\n{db}\n", "| task | pool (hits) | " + " | ".join(f"{m}: top-{k} hits, tau, tau best 1/4, top1"
                                                                    for m in models) + " |",
                  "|---|---:|" + "---:|" * len(models)]
        mine = [r for r in rows if r["db"] == db]
        for task in dict.fromkeys(r["task"] for r in mine):
            rs = {r["model"]: r for r in mine if r["task"] == task}
            first = rs[models[0]]
            lines.append(f"| {task} | {first['pool']} ({first['hits_pool']}) | " + " | ".join(
                f"{rs[m]['hits_top']}, {rs[m]['tau']:+.2f}, {rs[m]['tau_good']:+.2f}, {rs[m]['top1']:.2f}"
                for m in models) + " |")
        lines.append(f"\nmeans over {len({r['task'] for r in mine})} tasks (top-{k} hits, tau, tau best 1/4; "
                     "top pick / best as a geomean):")
        for m in models:
            rs = [r for r in mine if r["model"] == m]
            lines.append(f"  {m:10s} {np.mean([r['hits_top'] for r in rs]):5.1f} "
                         f"{np.nanmean([r['tau'] for r in rs]):+.3f} {np.nanmean([r['tau_good'] for r in rs]):+.3f} "
                         f"{np.exp(np.mean(np.log([r['top1'] for r in rs]))):.3f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", required=True, action="append", help="a database or a .jsonl.gz export (repeatable)")
    ap.add_argument("--model", action="append", default=None,
                    help="NAME=CHECKPOINT or 'packaged' (repeatable; default: packaged)")
    ap.add_argument("--k", type=int, default=32, help="picks per model (default 32: a round)")
    args = ap.parse_args(argv)
    models = parse_models(args.model or ["packaged"])
    rows = [r for db in args.db for r in pool_rows(db, models, args.k)]
    print(report(rows, list(models), args.k))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
