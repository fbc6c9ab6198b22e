"""Does a residual GP over a run's measurements rank the *next* round's candidates better than the cost model?

Offline, on a comparison database (``benchmarks/compare.py --out DIR`` leaves ``DIR/cmp.db``): for every task
and every chosen run, at the round boundaries ``--at`` (trials already measured), the scorer a run would hold
then is rebuilt — the packaged pretrained model fine-tuned on the run's first ``t`` measurements, as the
session's online model is — and the run's next ``--next`` measured configs (the candidates its strategy
proposed then: near-good configs, where ranking decides) are ranked by

* ``raw``: the model, calibrated (``a · score + b``, :func:`felixjax.strategies.residual.calibrate`);
* ``gp``: plus the residual GP's posterior mean (the ``GradientSearch(residual=True)`` ranking, beta 0);
* ``gp_noisy``: the same with noise shares 0.25 / 1.0 (a smoother GP);
* ``gp_long``: the same with length scales 2.5 / 4 only;
* ``offset``: plus only a per-sketch offset, the sketch's mean residual shrunk by one pseudo-count.

Reported per variant (means over tasks, runs and boundaries): Kendall tau with the measured latencies, the
recall of the true top 25%, and the best of the variant's top 8 over the round's best (1.0: the top 8 hold it).
Measures nothing; minutes of CPU for the model fits.

Usage (session 29's comparison with the defaults first, its compared runs as committed):
    python benchmarks/residual_offline.py --db docs/data/headline15_defaults_s29_records.jsonl.gz \\
        --runs gradient:0,genetic:0,gradient:1,genetic:1,gradient:2,genetic:2
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from codegen.spaces import spaces_for  # noqa: E402
from codegen.target import Target  # noqa: E402
from costmodels import kendall_tau  # noqa: E402
from felixjax.context import SearchContext  # noqa: E402
from felixjax.database import Database  # noqa: E402
from felixjax.strategies import residual as res  # noqa: E402
from felixjax.strategies.gradient import GradientSearch  # noqa: E402

VARIANTS = {"raw": None, "gp": (res.LENGTHSCALES, res.NOISES), "gp_noisy": (res.LENGTHSCALES, (0.25, 1.0)),
            "gp_long": ((2.5, 4.0), res.NOISES), "offset": "offset"}


def rank_round(scorer, past: list, nxt: list) -> dict[str, np.ndarray]:
    """Each variant's scores of the configs of ``nxt`` given the measured records ``past``."""
    g = GradientSearch(residual=True, scorer=scorer)
    sketches = sorted({r.config.sketch for r in past + nxt})
    xs, ss, ys = {}, {}, {}
    for name in sketches:
        rel = scorer.relaxations[name]
        recs = sorted((r for r in past if r.config.sketch == name), key=lambda r: r.latency_s)
        xs[name] = np.stack([rel.to_x(r.config) for r in recs]).astype(np.float32) if recs else None
        ss[name] = g._score(scorer, name, rel, xs[name]) if recs else np.zeros(0)
        ys[name] = -np.log([r.latency_s for r in recs]) if recs else np.zeros(0)
    a, b = res.calibrate(np.concatenate(list(ss.values())), np.concatenate(list(ys.values())))
    out = {v: np.zeros(len(nxt)) for v in VARIANTS}
    for name in sketches:
        idx = [i for i, r in enumerate(nxt) if r.config.sketch == name]
        if not idx:
            continue
        rel = scorer.relaxations[name]
        pts = np.stack([rel.to_x(nxt[i].config) for i in idx]).astype(np.float32)
        base = a * g._score(scorer, name, rel, pts) + b
        resid = ys[name] - a * ss[name] - b
        for v, spec in VARIANTS.items():
            extra = 0.0
            if spec == "offset":
                extra = resid.sum() / (len(resid) + 1) if len(resid) else 0.0
            elif spec is not None and len(resid) >= res.MIN_POINTS:
                extra = res.fit_residual(xs[name], resid, rows=256, lengthscales=spec[0], noises=spec[1]).predict(pts)[0]
            out[v][idx] = base + extra
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", required=True, help="a comparison database (read only), or a .jsonl.gz export of one")
    ap.add_argument("--runs", default="gradient:0,genetic:0", help="comma-separated run names")
    ap.add_argument("--at", default="64,128,192", help="round boundaries (trials measured before the round)")
    ap.add_argument("--next", type=int, default=64, help="configs of the next round ranked")
    ap.add_argument("--rows", default=None, help="also write every row as JSON lines here")
    args = ap.parse_args(argv)
    from benchmarks.model_pool import as_database

    db = Database(as_database(args.db), readonly=True)
    rows = []
    for task, _ in db.tasks():
        records = db.records(task)
        target = Target.from_json(records[0].target)
        for run in args.runs.split(","):
            recs = [r for r in records if r.run == run]
            for t in (int(x) for x in args.at.split(",")):
                past = [r for r in recs[:t] if r.ok and r.latency_s > 0]
                nxt = [r for r in recs[t: t + args.next] if r.ok and r.latency_s > 0]
                if len(nxt) < 16 or len(past) < res.MIN_POINTS:
                    continue
                ctx = SearchContext(task, target, spaces_for(task, target), np.random.default_rng(0),
                                    history=list(recs[:t]), measured={r.config for r in recs[:t]})
                scorer = ctx.get_scorer("packaged")
                scorer.update(list(recs[:t]))
                scores = rank_round(scorer, past, nxt)
                lat = np.array([r.latency_s for r in nxt])
                k = max(1, len(lat) // 4)
                row = {"task": task.name, "run": run, "t": t}
                for v, s in scores.items():
                    order = np.argsort(-s, kind="stable")
                    row["tau_" + v] = kendall_tau(s, lat)
                    row["recall_" + v] = len(set(order[:k]) & set(np.argsort(lat)[:k])) / k
                    row["top8_" + v] = float(lat[order[:8]].min() / lat.min())
                rows.append(row)
                print(json.dumps({key: round(x, 3) if isinstance(x, float) else x for key, x in row.items()}),
                      file=sys.stderr, flush=True)
    if args.rows:
        Path(args.rows).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(rows)} rounds ({len({r['task'] for r in rows})} tasks, runs {args.runs}, boundaries {args.at})\n")
    print("| runs | metric | " + " | ".join(VARIANTS) + " |")
    print("| --- | --- | " + " | ".join("---:" for _ in VARIANTS) + " |")
    for kind in sorted({r["run"].split(":")[0] for r in rows}) + ["all"]:
        sub = [r for r in rows if kind == "all" or r["run"].split(":")[0] == kind]
        for metric in ("tau", "recall", "top8"):
            vals = " | ".join(f"{np.nanmean([r[metric + '_' + v] for r in sub]):.3f}" for v in VARIANTS)
            print(f"| {kind} ({len(sub)}) | {metric} | {vals} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
