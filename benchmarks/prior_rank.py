"""How well the analytic roofline prior ranks real measurements (issue 15).

Two steps:

    python benchmarks/prior_rank.py measure /tmp/prior_rank/db.sqlite   # ~40 random configs per op, 1 thread
    python benchmarks/prior_rank.py eval /tmp/prior_rank/db.sqlite      # old vs new prior, per op
    python benchmarks/prior_rank.py measure /tmp/prior_rank/gen.sqlite --strategy genetic --seed 1
    python benchmarks/prior_rank.py eval /tmp/prior_rank/gen.sqlite     # the candidates a search proposes

(On a machine where another process holds the measuring lock for minutes, measure with
``FELIXJAX_MEASURE_LOCK=0 FELIXJAX_MAX_WALL_CPU_RATIO=off``: timings then overlap with others', which is
tolerable here only because the medians feed a rank correlation.)

``measure`` tunes each op of :data:`OPS` with the random strategy (``fj.tune(..., strategy="random",
trials=40, threads=1)``; every latency is the measurer's median of 7 timed repeats) into a database.
``eval`` scores every correctly measured config with the old prior (``OnlineCostModel.prior_kind =
"roofline"``: one roofline over L3 traffic, efficiency = lanes x balance x registers) and the new one
(``"multilevel"``: L1/L2/L3 traffic over their bandwidths, register-block FMA issue, loop and call
overheads), and reports Kendall tau, the recall of the measured top 10% in the predicted top 10% and
the number of distinct scores. Nothing is fitted to the measurements.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

OPS = {
    "conv3x3": "conv2d:n=1,c=64,h=28,w=28,k=64,r=3,s=3,pad=1",
    "conv1x1": "conv2d:n=1,c=128,h=28,w=28,k=128,r=1,s=1",
    "matmul256": "matmul:m=256,n=256,k=256",
    "dwconv": "depthwise_conv2d:n=1,c=128,h=56,w=56,r=3,s=3,pad=1",
}


def measure(db: str, trials: int, seed: int, strategy: str = "random") -> None:
    import felixjax as fj
    from codegen.measure_records import TimingProtocol
    from codegen.ops import parse_spec
    from codegen.target import Target

    target = Target.cpu(cores=1)
    for name, spec in OPS.items():
        res = fj.tune(parse_spec(spec), target, strategy=strategy, trials=trials, threads=1, db=db, seed=seed,
                      run=f"prior_rank:{strategy}:{seed}", retime=0, progress=False,
                      protocol=TimingProtocol(repeats=7, min_repeat_ms=10.0))
        print(name, strategy, "best while tuning", res.best_while_tuning, flush=True)


def expected_recall(scores: np.ndarray, latencies: np.ndarray, frac: float = 0.1) -> float:
    """Share of the measured-fastest ``k = ceil(frac · n)`` configs in the predicted top ``k``, in
    expectation over random tie-breaking of equal scores (a flat prior gets chance, not luck)."""
    n = len(scores)
    k = max(1, int(np.ceil(frac * n)))
    true_top = np.argsort(latencies, kind="stable")[:k]
    kth = np.sort(scores)[::-1][k - 1]
    above, tied = scores > kth, scores == kth
    p = np.where(above, 1.0, np.where(tied, (k - above.sum()) / max(1, tied.sum()), 0.0))
    return float(p[true_top].sum() / k)


def expected_best_ratio(scores: np.ndarray, latencies: np.ndarray, frac: float = 0.1) -> float:
    """Measured best / best measured latency among the predicted top ``k`` (1 = the prior's top ``k``
    holds the best config); ties broken at random, averaged over 200 draws."""
    rng = np.random.default_rng(0)
    n = len(scores)
    k = max(1, int(np.ceil(frac * n)))
    out = []
    for _ in range(200):
        order = np.lexsort((rng.random(n), -scores))
        out.append(latencies.min() / latencies[order[:k]].min())
    return float(np.mean(out))


def distinct(scores: np.ndarray) -> int:
    return int(len(np.unique(np.round(scores, 5))))


def evaluate(db_path: str) -> list[dict]:
    import felixjax as fj
    from codegen.spaces import spaces_for
    from codegen.target import Target
    from costmodels import kendall_tau
    from felixjax.model import CostModelScorer, OnlineCostModel, multilevel_prior

    OnlineCostModel.prior_kind = "roofline"  # the old prior, whatever the default is
    rows = []
    with fj.Database(db_path) as db:
        for task, _ in db.tasks():
            recs = {}
            for r in db.records(task=task):
                if r.ok:
                    recs.setdefault(r.config, r)
            recs = list(recs.values())
            if len(recs) < 10:
                continue
            target = Target.from_json(recs[0].target) if recs[0].target else Target.cpu(cores=1)
            scorer = CostModelScorer(spaces_for(task, target), target)
            f = scorer.features([r.config for r in recs])
            lat = np.array([r.latency_s for r in recs])
            name = next((k for k, v in OPS.items() if fj.ops.parse_spec(v).key == task.key), task.name)
            row = {"op": name, "n": len(recs), "best_ms": 1e3 * lat.min(), "worst_ms": 1e3 * lat.max()}
            for label, prior in (("old", scorer.shared.prior), ("new", multilevel_prior(target))):
                s = np.asarray(prior.predict(f), np.float64)
                top = np.argsort(-s, kind="stable")[: max(1, int(np.ceil(0.1 * len(s))))]
                fast = lat <= np.median(lat)  # the half a search works in
                row.update({f"{label}_tau": float(kendall_tau(s, lat)),
                            f"{label}_tau_fast": float(kendall_tau(s[fast], lat[fast])), f"{label}_recall10": expected_recall(s, lat),
                            f"{label}_best10": expected_best_ratio(s, lat), f"{label}_distinct": distinct(s),
                            f"{label}_distinct_top10": distinct(s[top])})
            rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    head = ("| op | configs | best / worst ms | tau old / new | tau, fastest half, old / new | recall@10% old / new "
            "| best in top 10% old / new | distinct scores old / new (in top 10%) |")
    lines = [head, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['op']} | {r['n']} | {r['best_ms']:.2f} / {r['worst_ms']:.1f} | "
                     f"{r['old_tau']:.2f} / {r['new_tau']:.2f} | {r['old_tau_fast']:.2f} / {r['new_tau_fast']:.2f} | "
                     f"{r['old_recall10']:.2f} / {r['new_recall10']:.2f} | "
                     f"{r['old_best10']:.2f} / {r['new_best10']:.2f} | {r['old_distinct']} / {r['new_distinct']} "
                     f"({r['old_distinct_top10']} / {r['new_distinct_top10']}) |")
    if rows:
        mean = {k: np.mean([r[k] for r in rows]) for k in rows[0] if k.startswith(("old_", "new_"))}
        lines.append(f"| **mean** | | | {mean['old_tau']:.2f} / {mean['new_tau']:.2f} | "
                     f"{mean['old_tau_fast']:.2f} / {mean['new_tau_fast']:.2f} | "
                     f"{mean['old_recall10']:.2f} / {mean['new_recall10']:.2f} | "
                     f"{mean['old_best10']:.2f} / {mean['new_best10']:.2f} | |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("step", choices=("measure", "eval"))
    p.add_argument("db")
    p.add_argument("--trials", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--strategy", default="random", help="measure: the strategy proposing the configs")
    p.add_argument("--json", help="write the eval rows here")
    args = p.parse_args(argv)
    if args.step == "measure":
        measure(args.db, args.trials, args.seed, args.strategy)
        return 0
    rows = evaluate(args.db)
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
