"""Which cost model picks fast kernels from a pool of real measurements? (issue 15, cause 1)

The measured ablations (docs/BENCHMARKS.md, issue 15) found the online MLP ranking each next round's
candidates at chance on real hardware (Kendall tau ~0), while on a random 75/25 split of the same kind of
records it reached tau ~0.4 (`benchmarks/rank_models.py`). This script separates the model from the
search and from the host's noise: every task's pool is a set of configs measured once (random draws,
`record`), and a model-guided selection is replayed on it (`eval`): start from `--init` random configs,
then rounds of `--batch` picks, each the model's top predictions among the configs not yet revealed, the
model refit on everything revealed after every round, up to `--budget` trials. No timing happens in
`eval`; the latencies are the pool's measurements, so every model sees the same numbers.

Models (`--models`):
- ``random``: no model (picks uniformly; the bar);
- ``prior``: the tuner's analytic prior alone (``OnlineCostModel.prior_kind``, the roofline by default);
- ``prior_ml``: the multilevel roofline prior (``felixjax.model.multilevel_prior``) alone;
- ``online``: the tuner's own :class:`felixjax.model.OnlineCostModel` for one task (MLP fine-tuned each
  round, switched on once its held-out pairwise accuracy beats the prior's), as a tuning run uses it;
- ``mlp``: the same MLP, always used (never the prior);
- ``gbdt``: gradient-boosted trees (scikit-learn's ``HistGradientBoostingRegressor``, the model family
  Ansor and TenSet use) on the same hard-mode features, refit from scratch each round on -log latency;
- ``gbdt_others``: the trees also trained on the other tasks' whole pools (targets centred per task; the
  task's own rows weighted up), as a model pretrained on other tasks and fine-tuned would be.
- ``mlp_others``: the differentiable MLP pretrained on the other tasks' pools (within-task rank loss, as
  ``felixjax pretrain`` trains it), then fine-tuned online on the task's revealed rows and always used;
- ``online_others``: the same pretrained MLP in the tuner's :class:`OnlineCostModel` (``pretrained=``),
  whose gate falls back to the prior where the MLP ranks the held-out rows worse;
- ``mlp_pre`` / ``online_pre``: as the two above, starting from the checkpoint ``--cost-model`` (e.g. one
  pretrained on the packaged dataset: ``felixjax pretrain``), as ``fj.tune(strategy_options={"cost_model": ...})``.

Metrics per task and model (means over ``--seeds``): trials until a config within 5% of the pool's best
is revealed (censored at the budget), the best revealed at the budget over the pool's best, and the
model's Kendall tau on each round's picks (the "next round's candidates" of the ablation) and on the
whole unrevealed rest, and top-10% recall on the rest.

    python benchmarks/model_pool.py record --db results/pool/ops.db --suite ops --trials 192
    python benchmarks/model_pool.py record --db results/pool/ops_genetic.db --suite ops --trials 192 --strategy genetic
    python benchmarks/model_pool.py eval --db results/pool/ops.db --budget 64 --init 16 --batch 8 --seeds 5
    python benchmarks/model_pool.py eval --db docs/data/pools_s23/ops_genetic.jsonl.gz \
        --db docs/data/pools_s23/calibration_genetic.jsonl.gz --seeds 3 --budget 40 --init 8 --batch 8   # session 23's pools
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np

from felixjax.ranker import flat_features

OTHERS_PER_TASK = 128
MODELS = ("random", "prior", "prior_ml", "online", "mlp", "gbdt", "gbdt_others", "mlp_others", "online_others", "mlp_pre",
          "online_pre")
COST_MODEL: list = [None]  # --cost-model: the checkpoint the *_pre models start from
_PRETRAINED: dict = {}  # (task key, seed) -> path of an MLP pretrained on the other pools (reused across seeds)


def record(db: str, suite_name: str, trials: int, skip: list[str], seed: int = 0, strategy: str = "random") -> None:
    """Measure ``trials`` configs of every task of a suite (1 thread, no defaults): uniformly random ones,
    or what a search proposes (``strategy="genetic"``: mostly near-good configs, where ranking is hard)."""
    import felixjax as fj
    from felixjax.suites import suite

    for task in suite(suite_name):
        if any(s in task.name for s in skip):
            continue
        t0 = time.time()
        fj.tune(task, strategy=strategy, trials=trials, db=db, seed=seed, run=f"pool:{strategy}:{seed}", threads=1,
                defaults=False, retime=0, progress=False)
        print(f"{task.name}: {time.time() - t0:.0f} s", flush=True)


def as_database(path: str) -> str:
    """A database path for ``path``: itself, or a fresh file holding a ``.jsonl.gz`` export's records
    (the committed pools, docs/data/pools_s23/)."""
    if not path.endswith(".jsonl.gz"):
        return path
    import os
    import tempfile

    from felixjax.database import Database

    out = os.path.join(tempfile.mkdtemp(prefix="fj_pool_"), os.path.basename(path)[: -len(".jsonl.gz")] + ".db")
    with Database(out) as db:
        db.import_jsonl(path)
    return out


def load_pools(db_path: str, min_records: int = 48) -> list[dict]:
    """Per task: its distinct correctly measured configs, their latencies and hard-mode features
    (``db_path``: a database, or a ``.jsonl.gz`` export of one)."""
    import felixjax as fj

    db_path = as_database(db_path)
    from codegen.spaces import spaces_for
    from codegen.target import Target
    from felixjax.model import CostModelScorer

    pools = []
    with fj.Database(db_path, readonly=True) as db:
        for task, target_key in db.tasks():
            recs: dict = {}
            for r in db.records(task=task, target=target_key):
                if r.ok and not r.run.startswith("retime:"):
                    recs.setdefault(r.config, r)
            recs = list(recs.values())
            if len(recs) < min_records:
                continue
            target = Target.from_json(recs[0].target) if recs[0].target else Target.cpu()
            spaces = spaces_for(task, target)
            recs = [r for r in recs if r.config.sketch in spaces]
            scorer = CostModelScorer(spaces, target, seed=0)
            configs = [r.config for r in recs]
            pools.append({"task": task, "target": target, "spaces": spaces, "configs": configs,
                          "lat": np.array([r.latency_s for r in recs]), "features": scorer.features(configs)})
    return pools


def _take(features, idx):
    from costmodels import Features

    return Features(features.access[idx], features.mask[idx], features.glob[idx])


class _Model:
    """fit(revealed indices) then predict(all) -> higher = predicted faster."""

    def __init__(self, kind: str, pool: dict, others: list[dict], seed: int):
        self.kind, self.pool, self.seed = kind, pool, seed
        self.rng = np.random.default_rng(seed + 1000)
        if kind in ("prior", "online", "mlp"):
            from felixjax.model import OnlineCostModel

            self.online = OnlineCostModel(pool["target"], seed=seed)
        if kind in ("mlp_others", "online_others"):
            from felixjax.model import OnlineCostModel

            self.online = OnlineCostModel(pool["target"], seed=seed, pretrained=pretrained_on(others, pool, seed=0))
        if kind in ("mlp_pre", "online_pre"):
            from felixjax.model import OnlineCostModel

            if COST_MODEL[0] is None:
                raise SystemExit(f"model {kind} needs --cost-model")
            self.online = OnlineCostModel(pool["target"], seed=seed, pretrained=COST_MODEL[0])
        if kind == "prior_ml":
            from felixjax.model import multilevel_prior

            self.ml = multilevel_prior(pool["target"])
        if kind in ("gbdt", "gbdt_others"):  # felixjax's TreeRanker, fitted from the first revealed rows
            from felixjax.ranker import TreeRanker, centred_targets

            data = None
            if kind == "gbdt_others":
                X, y = [], []
                for o in others:  # at most OTHERS_PER_TASK rows of each other task (a seeded draw): fits stay seconds
                    keep = np.sort(self.rng.permutation(len(o["lat"]))[:OTHERS_PER_TASK])
                    X.append(flat_features(_take(o["features"], keep)))
                    y.append(centred_targets(o["lat"][keep], np.zeros(len(keep), int)))
                data = (np.concatenate(X), np.concatenate(y)) if X else None
            self.tree = TreeRanker(data, min_rows=1, seed=seed)

    def fit(self, idx: np.ndarray) -> None:
        p = self.pool
        if self.kind in ("online", "mlp", "mlp_others", "online_others", "mlp_pre", "online_pre"):
            new = [i for i in idx if (0, p["configs"][i]) not in self.online._seen]
            if new:
                self.online.add(0, [p["configs"][i] for i in new], _take(p["features"], np.asarray(new)),
                                p["lat"][np.asarray(new)])
                self.online.fit()
        elif self.kind in ("gbdt", "gbdt_others"):
            self.tree.fit(flat_features(_take(p["features"], idx)), p["lat"][idx], np.zeros(len(idx), int))

    def predict(self) -> np.ndarray:
        p = self.pool
        if self.kind == "random":
            return self.rng.normal(size=len(p["lat"]))
        if self.kind == "prior":
            return np.asarray(self.online.prior.predict(p["features"]), np.float64)
        if self.kind == "prior_ml":
            return np.asarray(self.ml.predict(p["features"]), np.float64)
        if self.kind in ("online", "online_others", "online_pre"):
            return np.asarray(self.online.model.predict(p["features"]), np.float64)
        if self.kind in ("mlp", "mlp_others", "mlp_pre"):
            m = self.online.mlp if self.online.updates or self.kind != "mlp" else self.online.prior
            return np.asarray(m.predict(p["features"]), np.float64)
        return self.tree.predict(flat_features(p["features"]))


def pretrained_on(others: list[dict], pool: dict, seed: int = 0) -> str:
    """A checkpoint of the tuner's MLP pretrained on the other pools' rows (all of them, groups per task,
    the budget ``felixjax pretrain`` uses), cached per target pool: each simulation loads a fresh copy."""
    key = (pool["task"].key, seed)
    if key not in _PRETRAINED:
        import os
        import tempfile

        from costmodels import MLPCostModel, TrainConfig, concat_features
        from felixjax.features import N_ACCESS_FEATURES, N_GLOBAL_FEATURES

        feats = concat_features([o["features"] for o in others])
        lat = np.concatenate([o["lat"] for o in others])
        groups = np.concatenate([np.full(len(o["lat"]), i, np.int64) for i, o in enumerate(others)])
        model = MLPCostModel(N_ACCESS_FEATURES, N_GLOBAL_FEATURES, hidden=128, seed=seed,
                             config=TrainConfig(sample_budget=200_000, max_epochs=200))
        t0 = time.time()
        fit = model.update(feats, lat, groups)
        path = os.path.join(tempfile.mkdtemp(prefix="fj_pool_pre_"), "mlp.npz")
        model.save(path)
        print(f"  [pretrained for {pool['task'].name} on {len(others)} other pools, {len(lat)} rows: "
              f"val pairwise {fit.get('val_pairwise_accuracy', float('nan')):.3f}, {time.time() - t0:.0f}s]",
              flush=True)
        _PRETRAINED[key] = path
    return _PRETRAINED[key]


def simulate(pool: dict, others: list[dict], kind: str, seed: int, *, budget: int, init: int, batch: int,
             first: str = "random") -> dict:
    """One model-guided selection on a pool; returns its metrics. ``first``: the first ``init`` configs
    drawn at random, or the prior's top ones (as a search's first round is before anything is measured)."""
    from costmodels import kendall_tau

    lat = pool["lat"]
    n = len(lat)
    best = lat.min()
    rng = np.random.default_rng(seed)
    model = _Model(kind, pool, others, seed)
    if first == "prior" and kind != "random":
        from felixjax.model import OnlineCostModel

        prior = np.asarray(OnlineCostModel(pool["target"], seed=seed).prior.predict(pool["features"]))
        noise = rng.normal(scale=1e-9, size=n)  # ties broken by the seed
        revealed = list(np.argsort(-(prior + noise), kind="stable")[:min(init, n)])
    else:
        revealed = list(rng.choice(n, size=min(init, n), replace=False))
    taus_next, taus_rest, recalls = [], [], []
    while len(revealed) < min(budget, n):
        model.fit(np.asarray(revealed))
        score = model.predict()
        rest = np.setdiff1d(np.arange(n), revealed)
        k = min(batch, budget - len(revealed), len(rest))
        pick = rest[np.argsort(-score[rest], kind="stable")[:k]]
        if kind != "random":
            if k >= 3:
                taus_next.append(kendall_tau(score[pick], lat[pick]))
            if len(rest) >= 10:
                taus_rest.append(kendall_tau(score[rest], lat[rest]))
                top = max(1, len(rest) // 10)
                true_top = set(rest[np.argsort(lat[rest])[:top]])
                pred_top = set(rest[np.argsort(-score[rest], kind="stable")[:top]])
                recalls.append(len(true_top & pred_top) / top)
        revealed += list(pick)
    curve = np.minimum.accumulate(lat[np.asarray(revealed)])
    hit = np.nonzero(curve <= best / 0.95)[0]
    return {"trials_to_95": int(hit[0]) + 1 if len(hit) else None, "final": float(curve[-1] / best),
            "tau_next": _mean(taus_next), "tau_rest": _mean(taus_rest), "recall10": _mean(recalls)}


def _mean(xs) -> float:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return float(np.mean(xs)) if xs else float("nan")


def evaluate(pools: list[dict], models: list[str], seeds: int, **kw) -> list[dict]:
    rows = []
    for i, pool in enumerate(pools):
        others = [p for j, p in enumerate(pools) if j != i]
        for kind in models:
            t0 = time.time()
            runs = [simulate(pool, others, kind, s, **kw) for s in range(seeds)]
            reached = [r["trials_to_95"] for r in runs if r["trials_to_95"] is not None]
            # censored runs enter at the budget (a lower bound on their trials), flagged by the count
            trials = [r["trials_to_95"] if r["trials_to_95"] is not None else kw["budget"] for r in runs]
            rows.append({"task": pool["task"].name, "pool": len(pool["lat"]), "model": kind,
                         "trials_to_95": float(np.exp(np.mean(np.log(trials)))), "reached": len(reached),
                         "runs": len(runs), "final": float(np.exp(np.mean(np.log([r["final"] for r in runs])))),
                         **{m: _mean([r[m] for r in runs]) for m in ("tau_next", "tau_rest", "recall10")},
                         "seconds": time.time() - t0})
            r = rows[-1]
            print(f"{r['task']:38s} {kind:12s} trials {r['trials_to_95']:6.1f} ({r['reached']}/{r['runs']})  "
                  f"final {r['final']:.3f}  tau next {r['tau_next']:+.2f} rest {r['tau_rest']:+.2f}  "
                  f"recall10 {r['recall10']:.2f}  {r['seconds']:.0f}s", flush=True)
    return rows


def table(rows: list[dict], models: list[str], budget: int) -> str:
    lines = ["| task | pool | " + " | ".join(models) + " |", "| --- | ---: |" + " ---: |" * len(models)]
    for task in dict.fromkeys(r["task"] for r in rows):
        cells = []
        for m in models:
            r = next((r for r in rows if r["task"] == task and r["model"] == m), None)
            cells.append("—" if r is None else f"{r['trials_to_95']:.0f} ({r['reached']}/{r['runs']}), "
                         f"{r['final']:.3f}, tau {r['tau_next']:+.2f} / {r['tau_rest']:+.2f}")
        pool = next(r["pool"] for r in rows if r["task"] == task)
        lines.append(f"| {task} | {pool} | " + " | ".join(cells) + " |")
    geo = []
    for m in models:
        rs = [r for r in rows if r["model"] == m]
        geo.append(f"**{np.exp(np.mean(np.log([r['trials_to_95'] for r in rs]))):.1f}**, "
                   f"{np.exp(np.mean(np.log([r['final'] for r in rs]))):.3f}, tau {_mean([r['tau_next'] for r in rs]):+.2f} / "
                   f"{_mean([r['tau_rest'] for r in rs]):+.2f}" if rs else "—")
    lines.append("| geomean / mean | | " + " | ".join(geo) + " |")
    lines.append(f"\n(each cell: trials to 5% of the pool's best, geomean over seeds with censored runs at the "
                 f"budget of {budget} (runs that reached it / runs); best revealed at the budget over the pool's "
                 f"best; Kendall tau on each round's picks / on the unrevealed rest, mean over rounds and seeds.)")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="measure random configs into a database (real builds and timings)")
    r.add_argument("--db", required=True)
    r.add_argument("--suite", default="ops")
    r.add_argument("--trials", type=int, default=192)
    r.add_argument("--skip", default="matmul_1024", help="comma-separated task-name parts to leave out")
    r.add_argument("--strategy", default="random", help="what proposes the configs (random, genetic, gradient)")
    r.add_argument("--seed", type=int, default=0)
    e = sub.add_parser("eval", help="replay model-guided selection on the recorded pools (no timing)")
    e.add_argument("--db", required=True, action="append")
    e.add_argument("--models", default=",".join(MODELS))
    e.add_argument("--budget", type=int, default=64)
    e.add_argument("--init", type=int, default=16)
    e.add_argument("--batch", type=int, default=8)
    e.add_argument("--seeds", type=int, default=5)
    e.add_argument("--first", choices=("random", "prior"), default="random",
                   help="the first --init configs: random, or the tuner's prior's top ones")
    e.add_argument("--out", help="write the rows as JSON here")
    e.add_argument("--cost-model", help="a pretrained MLP checkpoint for the mlp_pre / online_pre models")
    args = p.parse_args(argv)
    if args.cmd == "record":
        record(args.db, args.suite, args.trials, [s for s in args.skip.split(",") if s], args.seed, args.strategy)
        return 0
    models = [m for m in args.models.split(",") if m]
    unknown = set(models) - set(MODELS)
    if unknown:
        p.error(f"unknown models {sorted(unknown)}; choose from {', '.join(MODELS)}")
    COST_MODEL[0] = args.cost_model
    pools = [pool for db in args.db for pool in load_pools(db)]
    rows = evaluate(pools, models, args.seeds, budget=args.budget, init=args.init, batch=args.batch,
                    first=args.first)
    print(table(rows, models, args.budget))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
