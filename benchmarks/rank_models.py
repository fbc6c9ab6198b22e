"""Held-out ranking quality of the cost models on real measurements (issue 3's cost-model check).

For every task in a tuning database: hard-mode features of its correctly measured configs, a
seeded 75/25 split, the MLP trained on the 75%, then within-task pairwise accuracy and Kendall tau
of the MLP and of the analytic roofline prior on the held-out 25%. No timing happens here: the
latencies are the database's measurements.

    python benchmarks/rank_models.py runs.db [--write]
"""
from __future__ import annotations

import argparse
import sys

import numpy as np


def evaluate(db_path: str, *, seed: int = 0, min_records: int = 40) -> list[dict]:
    import felixjax as fj
    from codegen.space import Space, sketches_for
    from codegen.target import Target
    from costmodels import Features, kendall_tau, pairwise_accuracy
    from felixjax.model import CostModelScorer

    rows = []
    with fj.Database(db_path) as db:
        for task, target_key in db.tasks():
            recs = {}
            for r in db.records(task=task, target=target_key):
                if r.ok:
                    recs.setdefault(r.config, r)  # one row per config
            recs = list(recs.values())
            if len(recs) < min_records:
                continue
            target = Target.from_json(recs[0].target) if recs[0].target else Target.cpu()
            spaces = {s.name: Space(task, s, target) for s in sketches_for(task)}
            rng = np.random.default_rng(seed)
            order = rng.permutation(len(recs))
            cut = int(0.75 * len(recs))
            train, test = [recs[i] for i in order[:cut]], [recs[i] for i in order[cut:]]
            scorer = CostModelScorer(spaces, target, seed=seed)
            scorer.MIN_TRAIN = 1
            scorer.update(train)
            f = scorer.features([r.config for r in test])
            lat = np.array([r.latency_s for r in test])
            mlp, prior = scorer.mlp.predict(f), scorer.prior.predict(f)
            rows.append({"task": task.name, "train": len(train), "held_out": len(test),
                         "mlp_pairwise": pairwise_accuracy(mlp, lat), "prior_pairwise": pairwise_accuracy(prior, lat),
                         "mlp_tau": kendall_tau(mlp, lat), "prior_tau": kendall_tau(prior, lat)})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| task | train | held out | MLP pairwise | prior pairwise | MLP tau | prior tau |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['task']} | {r['train']} | {r['held_out']} | {r['mlp_pairwise']:.3f} | "
                     f"{r['prior_pairwise']:.3f} | {r['mlp_tau']:.3f} | {r['prior_tau']:.3f} |")
    if rows:
        lines.append(f"| **mean** | | | {np.mean([r['mlp_pairwise'] for r in rows]):.3f} | "
                     f"{np.mean([r['prior_pairwise'] for r in rows]):.3f} | "
                     f"{np.mean([r['mlp_tau'] for r in rows]):.3f} | {np.mean([r['prior_tau'] for r in rows]):.3f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("db")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--write", action="store_true", help="write the table into docs/BENCHMARKS.md")
    args = p.parse_args(argv)
    rows = evaluate(args.db, seed=args.seed)
    text = table(rows)
    print(text)
    if args.write:
        import os
        import subprocess

        here = os.path.dirname(os.path.abspath(__file__))
        doc = os.path.join(here, "..", "docs", "BENCHMARKS.md")
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=here).stdout.strip()
        section = (f"<!-- rank_models:begin -->\n## Cost model ranking on held-out measurements\n\n"
                   f"Command: `python benchmarks/rank_models.py {args.db} --write` (commit {commit}). "
                   f"Configs measured by real tuning runs; MLP trained on a seeded 75% of each task's "
                   f"configs, both models scored on the other 25% (within-task pairs).\n\n{text}\n"
                   f"<!-- rank_models:end -->")
        body = open(doc).read() if os.path.exists(doc) else "# Benchmarks\n"
        if "<!-- rank_models:begin -->" in body:
            pre, rest = body.split("<!-- rank_models:begin -->", 1)
            body = pre + section + rest.split("<!-- rank_models:end -->", 1)[1]
        else:
            body = body.rstrip() + "\n\n" + section + "\n"
        open(doc, "w").write(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
