"""Does the online fine-tuning of the shared cost model rank the *next* round better, and with which settings?

Issue 15, item 1 asks for the cost model's ranking accuracy on the next round's candidates. Sessions 35-39 measured
it at today's settings (Kendall tau 0.15-0.33); the fine-tuning itself (learning rate, epochs per update, the
RankNet / MSE balance, and the gate that hands ranking back to the roofline prior when the MLP loses to it on the
held-out rows) was never varied. This script replays a comparison database as the session lived it, offline:

for every compared run (strategy and seed), one :class:`~felixjax.model.OnlineCostModel` from the packaged
pretrained checkpoint is shared by all the database's tasks (as :func:`felixjax.compare.compare` shares one per
strategy and seed) and fed each task's measurements round by round (``--batch`` per round, tasks in turn, one
fine-tune after each task's round, exactly the session's ``CostModelScorer.update``). At each round boundary up to
``--rounds``, every task's next ``--batch`` measured configs (the candidates that run's strategy proposed next) are
ranked by

* the model as the session would hold it (``gated``: the MLP, or the roofline prior when the gate picked it), and
* the MLP alone (``mlp``: as if the gate were off),

under each variant of the fine-tuning (``--variants``; ``frozen`` never fine-tunes: the packaged model as shipped).
Reported per variant (means over runs, tasks and rounds): Kendall tau with the measured latencies, the recall of the
true top quarter in the predicted top quarter, the best of the predicted top 8 over the round's best (1.0: the top 8
hold it), and the share of rounds the gate handed ranking to the prior. And, closer to what "trials to 95%" needs: the
**pool** metrics rank every distinct config any run of the database measured for the task (the references' too,
~5000 per task) by the MLP as it stands at that boundary, and report the best of its top 32 over the pool's best
(``pool top``) and whether that top 32 holds a config within 95% of the best (``pool hit``). The ``- default``
columns pair each round with the default's and bootstrap over (run, task) pairs: they hold the runs' measurements
fixed, not the fine-tuning's own randomness, which ``default_reseed`` (the default again, other seeds) shows.
Measures nothing; about 20 minutes of CPU per database for every variant.

Usage (the headline's runs without the defaults first, sessions 41-45, as committed):
    python benchmarks/finetune_offline.py --db docs/data/headline_fresh_s41_42/cmp_db_fresh.jsonl.gz --rounds 7 \\
        --rows results/ft_fresh.jsonl
    python benchmarks/finetune_offline.py --summarize results/ft_fresh.jsonl results/ft_ops.jsonl
    python benchmarks/finetune_offline.py --summarize docs/data/finetune_s50/rows_*_off.jsonl.gz   # session 50's
"""
from __future__ import annotations

import argparse
import functools
import gzip
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from codegen.spaces import spaces_for
from codegen.target import Target
from costmodels import TrainConfig, kendall_tau
from felixjax.database import Database
from felixjax.model import OnlineCostModel

#: The session's online settings (``OnlineCostModel``: sample budget 4096, at most 100 epochs per update) and
#: one change each. ``None``: no fine-tuning at all.
BASE = {"sample_budget": OnlineCostModel.SAMPLE_BUDGET, "max_epochs": 100}
VARIANTS: dict[str, dict | None] = {
    "frozen": None,
    "default": {},
    "lr_x4": {"learning_rate": 2.8e-3},
    "lr_div4": {"learning_rate": 1.75e-4},
    "budget_x4": {"sample_budget": 4 * OnlineCostModel.SAMPLE_BUDGET, "max_epochs": 400},
    "budget_div4": {"sample_budget": OnlineCostModel.SAMPLE_BUDGET // 4},
    "rank_x10": {"rank_weight": 10.0},
    "mse_only": {"rank_weight": 0.0},
    # rehearsal: rows of the packaged pretraining dataset (other tasks) kept in every update beside the session's
    "replay1024": {"replay": 1024},
    # the default again with other fine-tuning seeds: how far the same settings move by chance alone
    "default_reseed": {"seed_offset": 100},
    # the mean of four members fine-tuned alike from the same checkpoint, own seeds (batch order, hold-out draws)
    "ens4": {"members": 4},
    # one model per task, fine-tuned on that task's measurements only (no sharing across the session's tasks)
    "per_task": {"per_task": True},
}
METRICS = ("tau", "recall", "top8")
POOL_METRICS = ("pool_top", "pool_hit", "pool_hit8", "pool_hit1")


@functools.cache
def _pretrain_rows(n: int, seed: int):
    """``n`` rows of the packaged pretraining dataset (features, latencies, task ids), drawn evenly over its tasks."""
    from felixjax.pretrain import load_dataset

    data = load_dataset([str(Path(__file__).resolve().parent.parent / "felixjax" / "data" / "pretrain_cpu.jsonl.gz")])
    rng = np.random.default_rng(seed)
    per = max(1, n // len(data.tasks))
    rows = np.concatenate([rng.permutation(np.flatnonzero(data.groups == g))[:per] for g in range(len(data.tasks))])
    f = data.features
    return type(f)(f.access[rows], f.mask[rows], f.glob[rows]), data.latencies[rows], data.groups[rows]


def add_replay(shared: OnlineCostModel, n: int, seed: int) -> None:
    """Put ``n`` packaged pretraining rows into ``shared`` under group ids no session task uses (10000 + task)."""
    feats, lat, groups = _pretrain_rows(n, seed)
    for g in np.unique(groups):
        idx = np.flatnonzero(groups == g)
        sub = type(feats)(feats.access[idx], feats.mask[idx], feats.glob[idx])
        shared.add(10_000 + int(g), [("replay", int(g), int(i)) for i in idx], sub, lat[idx])


def task_pool(db: Database, task) -> tuple[list, np.ndarray]:
    """Every distinct correctly measured config of ``task`` in the database (any run, the references' too) and
    its best latency: the configs the searches found, against which a model's own top picks are judged."""
    best: dict = {}
    for r in db.records(task):
        if r.ok and r.latency_s > 0 and not r.run.startswith("retime:"):
            best[r.config] = min(best.get(r.config, np.inf), r.latency_s)
    configs = list(best)
    return configs, np.array([best[c] for c in configs])


_POOLS: dict = {}


def pool_features(db: Database, task, target: Target, scorer) -> tuple:
    """:func:`task_pool`'s configs as hard features (with their latencies), computed once per database, task and
    target in a process: every run and variant replayed ranks the same pool."""
    key = (db.path, task.key, target.key)
    if key not in _POOLS:
        configs, lat = task_pool(db, task)
        _POOLS[key] = (scorer.features(configs), lat)
    return _POOLS[key]


def pool_metrics(scores: np.ndarray, lat: np.ndarray, k: int = 32) -> dict[str, float]:
    """How close the model's own top ``k`` of the pool come to the pool's best (1.0: they hold it), and whether they
    reach 95% of it (the comparison's "95% of the best"); ``pool_hit8`` / ``pool_hit1``: the same for its top 8 and
    its single top pick."""
    order = np.argsort(-scores, kind="stable")
    best = lat.min()
    top = lat[order[:k]].min() / best
    return {"pool_top": float(top), "pool_hit": float(top <= 1 / 0.95),
            "pool_hit8": float(lat[order[:8]].min() <= best / 0.95), "pool_hit1": float(lat[order[0]] <= best / 0.95)}


def run_reach(db: Database, tasks: list, runs: list[str], *, batch: int, rounds: int) -> dict[tuple, float]:
    """The runs' own progress beside the pool metric: for each (strategy, boundary t), the share of (task, run)
    pairs whose first ``t + batch`` trials hold a config within 95% of the task's pool best (the round after t)."""
    out: dict[tuple, list[float]] = {}
    for task in tasks:
        _, lat = task_pool(db, task)
        if not len(lat):
            continue
        for run in runs:
            recs = sorted(db.records(task, run=run), key=lambda r: r.trial)
            for rnd in range(1, rounds + 1):
                t = rnd * batch
                ok = [r.latency_s for r in recs[: t + batch] if r.ok and r.latency_s > 0]
                if recs:
                    out.setdefault((run.split(":")[0], t), []).append(float(bool(ok) and min(ok) <= lat.min() / 0.95))
    return {k: float(np.mean(v)) for k, v in out.items()}


def rank_metrics(scores: np.ndarray, lat: np.ndarray) -> dict[str, float]:
    """Kendall tau (higher score = faster is a positive tau), top-quarter recall and the top 8's best / best."""
    k = max(1, len(lat) // 4)
    order = np.argsort(-scores, kind="stable")
    return {"tau": kendall_tau(scores, lat),
            "recall": len(set(order[:k]) & set(np.argsort(lat)[:k])) / k,
            "top8": float(lat[order[:8]].min() / lat.min())}


def ranking_row(own: list, feats, lat: np.ndarray, pool_feats, pool_lat: np.ndarray) -> dict[str, float]:
    """One row's metrics: the gated model's and the MLP's ranking of the measured batch (``feats``, ``lat``) and the
    MLP's of the task's pool, the members' scores averaged (one member: its own)."""
    row = {}
    for kind in ("gated", "mlp"):
        score = np.mean([np.asarray((m.model if kind == "gated" else m.mlp).predict(feats), np.float64) for m in own],
                        axis=0)
        row.update({f"{kind}_{key}": val for key, val in rank_metrics(score, lat).items()})
    pool_score = np.mean([np.asarray(m.mlp.predict(pool_feats), np.float64) for m in own], axis=0)
    row.update({f"mlp_{key}": val for key, val in pool_metrics(pool_score, pool_lat).items()})
    row["pool_size"] = len(pool_lat)
    return row


def replay_run(db: Database, tasks: list, run: str, variant: str, *, batch: int, rounds: int, seed: int) -> list[dict]:
    """One compared run replayed under one fine-tuning variant: a row per task and round boundary."""
    overrides = VARIANTS[variant]
    records = {t.name: [r for r in db.records(t, run=run)] for t in tasks}
    records = {k: sorted(v, key=lambda r: r.trial) for k, v in records.items() if v}
    if not records:
        return []
    target = Target.from_json(next(iter(records.values()))[0].target)
    settings = dict(overrides or {})
    replay = int(settings.pop("replay", 0))
    seed += int(settings.pop("seed_offset", 0))
    members = int(settings.pop("members", 1))
    per_task = bool(settings.pop("per_task", False))
    checkpoint = settings.pop("checkpoint", "packaged")
    frozen = overrides is None or bool(settings.pop("frozen", False))
    cfg = TrainConfig(**{**BASE, **settings})
    names = [t.name for t in tasks if t.name in records]

    def new_models() -> list[OnlineCostModel]:
        out = [OnlineCostModel(target, seed=seed + 1000 * m, pretrained=checkpoint, train_config=cfg)
               for m in range(members)]
        for m, model in enumerate(out):
            if replay:
                add_replay(model, replay, seed + m)
        return out

    shared = None if per_task else new_models()
    models = {name: new_models() if per_task else shared for name in names}  # per task: the members ranking it
    scorers = {t.name: [m.scorer(spaces_for(t, target)) for m in models[t.name]] for t in tasks if t.name in records}
    pools = {t.name: pool_features(db, t, target, scorers[t.name][0]) for t in tasks if t.name in records}
    rows = []
    for rnd in range(rounds):
        lo, hi = rnd * batch, (rnd + 1) * batch
        if not frozen:
            for name in names:
                for member in scorers[name]:
                    member.update(records[name][lo:hi])
        for name in names:
            nxt = [r for r in records[name][hi: hi + batch] if r.ok and r.latency_s > 0]
            if len(nxt) < batch // 2:
                continue
            lat = np.array([r.latency_s for r in nxt])
            feats = scorers[name][0].features([r.config for r in nxt])
            own = models[name]
            row = {"db": Path(db.path).stem, "run": run, "variant": variant, "task": name, "t": hi,
                   "gate_prior": float(np.mean([m.active == "prior" for m in own])), "n_model": own[0].samples}
            rows.append({**row, **ranking_row(own, feats, lat, *pools[name])})
    return rows


def first_round_run(db: Database, tasks: list, run: str, variant: str, *, batch: int, seed: int) -> list[dict]:
    """Each task's *first* round under one fine-tuning variant: the session proposes task k's first batch after the
    shared model was fine-tuned on tasks 0..k-1's first rounds (the tasks take their rounds in turn), so the model
    that opens task k has seen other shapes only. A row per task k >= 1 (task 0 opens on the checkpoint in every
    variant): the pool metrics of the model as it stands when task k opens, and its ranking of the batch the run
    then measured."""
    overrides = VARIANTS[variant]
    records = {t.name: sorted(db.records(t, run=run), key=lambda r: r.trial) for t in tasks}
    records = {k: v for k, v in records.items() if v}
    if not records:
        return []
    target = Target.from_json(next(iter(records.values()))[0].target)
    settings = dict(overrides or {})
    if settings.pop("per_task", False) or settings.pop("members", 1) != 1 or settings.pop("replay", 0):
        raise ValueError(f"--first-round replays one shared model; variant {variant!r} is not one")
    seed += int(settings.pop("seed_offset", 0))
    checkpoint = settings.pop("checkpoint", "packaged")
    frozen = overrides is None or bool(settings.pop("frozen", False))
    model = OnlineCostModel(target, seed=seed, pretrained=checkpoint, train_config=TrainConfig(**{**BASE, **settings}))
    rows = []
    for k, task in enumerate(t for t in tasks if t.name in records):
        scorer = model.scorer(spaces_for(task, target))
        first = [r for r in records[task.name][:batch] if r.ok and r.latency_s > 0]
        if k and len(first) >= batch // 2:
            lat = np.array([r.latency_s for r in first])
            feats = scorer.features([r.config for r in first])
            row = {"db": Path(db.path).stem, "run": run, "variant": variant, "task": task.name, "t": 0, "k": k,
                   "gate_prior": float(model.active == "prior"), "n_model": model.samples}
            rows.append({**row, **ranking_row([model], feats, lat, *pool_features(db, task, target, scorer))})
        if not frozen:
            scorer.update(records[task.name][:batch])
    return rows


def paired_difference(rows: list[dict], variant: str, metric: str = "mlp_tau", ref: str = "default", *,
                      n_boot: int = 2000, level: float = 0.9, seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``metric`` under ``variant`` minus under ``ref`` over the rounds both replayed, with a bootstrap
    interval that redraws whole (run, task) pairs (their rounds are not independent)."""
    key = lambda r: (r.get("db", ""), r["run"], r["task"], r["t"])
    ref_rows = {key(r): r[metric] for r in rows if r["variant"] == ref and metric in r}
    diffs: dict[tuple, list[float]] = {}
    for r in rows:
        if (r["variant"] == variant and metric in r and key(r) in ref_rows and np.isfinite(r[metric])
                and np.isfinite(ref_rows[key(r)])):
            diffs.setdefault(key(r)[:3], []).append(r[metric] - ref_rows[key(r)])
    if not diffs:
        return float("nan"), float("nan"), float("nan")
    units = list(diffs.values())
    sums, counts = np.array([sum(u) for u in units]), np.array([len(u) for u in units])
    rng = np.random.default_rng(seed)
    draws = rng.integers(len(units), size=(n_boot, len(units)))
    boot = sums[draws].sum(1) / counts[draws].sum(1)
    tail = (1 - level) / 2
    return float(sums.sum() / counts.sum()), float(np.quantile(boot, tail)), float(np.quantile(boot, 1 - tail))


def variants_in(rows: list[dict]) -> list[str]:
    """The variants the rows hold: the known ones in their order, then any other (``--checkpoint``'s) as they come."""
    seen = list(dict.fromkeys(r["variant"] for r in rows))
    return [v for v in VARIANTS if v in seen] + [v for v in seen if v not in VARIANTS]


def summarize(rows: list[dict]) -> str:
    """A markdown table: per variant, the means (over runs, tasks, rounds) of each metric (the gated model's tau,
    then the MLP's), and the MLP's tau and pool hit rate minus the default's, with 90% intervals."""
    variants = variants_in(rows)
    cols = ["gated_tau", *(f"mlp_{m}" for m in METRICS + POOL_METRICS)]
    diffs = ("mlp_tau", "mlp_pool_hit")
    out = ["| variant | rounds | gate: prior | " + " | ".join(c.replace("_", " ") for c in cols) + " | "
           + " | ".join(f"{d.replace('_', ' ')} - default [90%]" for d in diffs) + " |",
           "| --- | ---: | ---: | " + " | ".join("---:" for _ in cols + list(diffs)) + " |"]
    for v in variants:
        sub = [r for r in rows if r["variant"] == v]
        cells = [f"{np.nanmean([r.get(c, np.nan) for r in sub]):.3f}" for c in cols]
        for metric in diffs:
            d, lo, hi = paired_difference(rows, v, metric)
            cells.append("—" if v == "default" or not np.isfinite(d) else f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]")
        out.append(f"| {v} | {len(sub)} | {np.mean([r['gate_prior'] for r in sub]):.2f} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def by_strategy(rows: list[dict], metric: str = "mlp_tau") -> str:
    """Per variant, ``metric`` by strategy (the run name's prefix) and by round boundary."""
    strategies = sorted({r["run"].split(":")[0] for r in rows})
    ts = sorted({r["t"] for r in rows})
    variants = variants_in(rows)
    head = [*(f"{s}" for s in strategies), *(f"t={t}" for t in ts)]
    out = [f"| variant ({metric}) | " + " | ".join(head) + " |", "| --- | " + " | ".join("---:" for _ in head) + " |"]
    for v in variants:
        sub = [r for r in rows if r["variant"] == v]
        cells = [np.nanmean([r.get(metric, np.nan) for r in sub if r["run"].split(":")[0] == s]) for s in strategies]
        cells += [np.nanmean([r.get(metric, np.nan) for r in sub if r["t"] == t]) for t in ts]
        out.append(f"| {v} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
    return "\n".join(out)


def read_text(path: str) -> str:
    """A rows file's text (``.gz``: gunzipped, as docs/data ships them)."""
    if str(path).endswith(".gz"):
        with gzip.open(path, "rt") as f:
            return f.read()
    return Path(path).read_text()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", help="a comparison database (read only), or a .jsonl.gz export of one")
    ap.add_argument("--runs", default="gradient:0,genetic@32:0,gradient:1,genetic@32:1,gradient:2,genetic@32:2",
                    help="comma-separated run names (each gets its own shared model)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of: {', '.join(VARIANTS)}")
    ap.add_argument("--checkpoint", action="append", default=[], metavar="NAME=PATH",
                    help="also replay from another pretrained checkpoint (`felixjax pretrain`): adds the variants NAME "
                         "(fine-tuned as the default) and NAME_frozen; repeatable")
    ap.add_argument("--batch", type=int, default=32, help="measurements per round (the runs' batch size)")
    ap.add_argument("--rounds", type=int, default=4, help="round boundaries replayed (the first `batch` x rounds)")
    ap.add_argument("--rows", default=None, help="append every row as JSON lines here")
    ap.add_argument("--first-round", action="store_true",
                    help="replay each task's first round only: the model that opens task k after the first rounds "
                         "of tasks 0..k-1 (fine-tuned by the variant), against the packaged model (`frozen`)")
    ap.add_argument("--reach", action="store_true",
                    help="print, per strategy and boundary, how often the runs themselves reach 95%% of the pool best "
                         "by the next round's end (the pool metric's counterpart; no model is fitted)")
    ap.add_argument("--summarize", nargs="+", default=None, metavar="ROWS",
                    help="measure nothing: print the tables of earlier --rows files")
    args = ap.parse_args(argv)
    if args.summarize:
        rows = [json.loads(line) for p in args.summarize for line in read_text(p).splitlines() if line]
        print("\n\n".join([summarize(rows), by_strategy(rows), by_strategy(rows, "mlp_pool_hit"),
                             by_strategy(rows, "mlp_pool_hit1")]))
        return 0
    if not args.db:
        ap.error("--db is required unless --summarize")
    for spec in args.checkpoint:
        name, _, path = spec.partition("=")
        if not name or not path or not Path(path).exists():
            ap.error(f"--checkpoint wants NAME=PATH of an existing checkpoint (got {spec!r})")
        VARIANTS[name], VARIANTS[name + "_frozen"] = {"checkpoint": path}, {"checkpoint": path, "frozen": True}
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {unknown}; known: {', '.join(VARIANTS)}")
    from benchmarks.model_pool import as_database

    db = Database(as_database(args.db), readonly=True)
    tasks = [t for t, _ in db.tasks()]
    if args.reach:
        reach = run_reach(db, tasks, args.runs.split(","), batch=args.batch, rounds=args.rounds)
        ts = sorted({t for _, t in reach})
        print("| runs reach 95% of the pool best by t + batch | " + " | ".join(f"t={t}" for t in ts) + " |")
        print("| --- | " + " | ".join("---:" for _ in ts) + " |")
        for strat in sorted({s for s, _ in reach}) + ["all"]:
            vals = [np.mean([v for (s, tt), v in reach.items() if tt == t and strat in (s, "all")]) for t in ts]
            print(f"| {strat} | " + " | ".join(f"{v:.2f}" for v in vals) + " |")
        return 0
    rows = []
    for i, run in enumerate(args.runs.split(",")):
        for v in variants:
            start = time.perf_counter()
            new = (first_round_run(db, tasks, run, v, batch=args.batch, seed=i) if args.first_round else
                   replay_run(db, tasks, run, v, batch=args.batch, rounds=args.rounds, seed=i))
            rows += new
            if args.rows:
                with open(args.rows, "a") as f:
                    f.writelines(json.dumps(r) + "\n" for r in new)
            tau = np.nanmean([r["mlp_tau"] for r in new]) if new else float("nan")
            print(f"[finetune] {run} {v}: {len(new)} rounds, mlp tau {tau:.3f}, {time.perf_counter() - start:.0f} s",
                  file=sys.stderr, flush=True)
    print(summarize(rows) + "\n\n" + by_strategy(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
