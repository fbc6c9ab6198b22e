"""Cost-aware tuning (issue 19): cold-candidate filtering + early stop ON vs OFF, same strategy and seeds.

For every operator of a suite and every seed, one tuning session runs two arms of the same task side by
side (rounds interleaved, so drifting machine load hits both): ``off`` with the full trial budget and
no options, ``on`` with ``CostAware(filter_p, early_stop)``. Each arm has its own cost-model group (one
arm's measurements never train the other's model). At the end the best configs of both arms are
re-timed **interleaved** (``TuningSession.retime``, A B A B ...), and the script reports per run and in
total:

* trials saved: ``1 - trials(on) / trials(off)``;
* seconds saved: ``1 - seconds(on) / seconds(off)`` (each arm's own clock: proposing, building,
  measuring, model updates, and the ensemble's fitting for ``on``);
* final latency lost: ``best(on) / best(off) - 1`` on the re-timed figures (geomean over the suite);
* why ``on`` stopped, and how many candidates it filtered.

The issue's target: >= 40% of trials and >= 30% of seconds saved at <= 2% loss (geomean over the suite).

With ``--network NAME`` (a zoo model) it also tunes the model with ``fj.tune_model`` off and on (two
databases), builds both and times them interleaved end to end.

    python benchmarks/cost_aware.py --suite ops --strategy gradient --seeds 2 --trials 256 \
        --filter-p 0.05 --early-stop 0.001 --threads 1 --out results/cost_aware.json
    python benchmarks/cost_aware.py --replay --trials 128    # a dry run on the replay oracle (no compiling)

Not run in CI (hours of machine time on the real suite).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time


def cost_aware_options(args):
    from felixjax.cost_aware import CostAware

    kw = {k: getattr(args, k) for k in ("warmup", "window", "patience", "stop_rule", "min_share", "plateau",
                                        "jump_weight", "explore", "min_keep") if getattr(args, k) is not None}
    return CostAware(filter_p=args.filter_p, early_stop=args.early_stop, **kw)


def tune_pair(task, args, seed: int, target, db: str) -> dict:
    from felixjax.session import TuningSession
    from felixjax.testing import ReplayRunner

    measurer = (lambda t, tg: ReplayRunner.from_oracle(t)) if args.replay else None
    on_opts = cost_aware_options(args)
    with TuningSession(target, db=db, measurer=measurer, threads=args.threads, progress=False, seed=seed) as s:
        # two models drawing the same random numbers (model_seed): the arms differ only in their options
        off = s.add(task, args.strategy, seed=seed, trials=args.trials, run=f"off:{seed}", group=("off", seed),
                    model_seed=("pair", seed))
        on = s.add(task, args.strategy, seed=seed, trials=args.trials, run=f"on:{seed}", group=("on", seed),
                   cost_aware=on_opts, model_seed=("pair", seed))
        while not (off.done and on.done):  # the least advanced arm steps next: interleaved rounds
            tr = min((r for r in (off, on) if not r.done), key=lambda r: (r.progress(), r.run))
            s.step(tr)
        retimed = s.retime([off, on], top=3, repeats=args.retime_repeats)
    row = {"task": task.name, "seed": seed, "strategy": args.strategy}
    for name, tr in (("off", off), ("on", on)):
        best = retimed.get(tr.run, [])
        row[name] = {"trials": len(tr.history), "seconds": tr.clock, "stop_reason": tr.stop_reason,
                     "filtered": int(tr.stats.get("filtered", 0)), "screen_s": tr.stats.get("screen_s", 0.0),
                     "best_s": best[0].latency_s if best and best[0].ok else math.inf,
                     "best_while_tuning_s": tr.best().latency_s if tr.best() else math.inf}
    row["trials_saved"] = 1 - row["on"]["trials"] / max(1, row["off"]["trials"])
    row["seconds_saved"] = 1 - row["on"]["seconds"] / max(1e-9, row["off"]["seconds"])
    row["latency_ratio"] = row["on"]["best_s"] / row["off"]["best_s"]
    return row


def tune_network(args, target) -> dict:
    import numpy as np

    import felixjax as fj
    from felixjax.testing import ReplayRunner

    model = fj.load_onnx(fj.zoo.make_model(args.network, dataset="cifar10"))
    out, built = {"network": args.network, "replay": args.replay}, {}
    measurer = (lambda t, tg: ReplayRunner.from_oracle(t)) if args.replay else None
    for name, ca in (("off", None), ("on", cost_aware_options(args))):
        db = os.path.join(args.workdir, f"net-{name}.db")
        t0 = time.perf_counter()
        res = fj.tune_model(model, target, trials=args.network_trials, db=db, strategy=args.strategy, seed=0,
                            threads=args.threads, progress=False, measurer=measurer, cost_aware=ca)
        wall = time.perf_counter() - t0
        # a replay's trials cost simulated seconds (ReplayRunner.trial_s) that no wall clock sees
        out[name] = {"trials": res.trials, "seconds": wall + (res.trials * 0.3 if args.replay else 0.0),
                     "estimated_ms": res.estimated_latency_s * 1e3,
                     "tasks": [{"task": t.task.name, "weight": t.weight, "trials": t.trials,
                                "stop_reason": t.stop_reason} for t in res.tasks]}
        if not args.replay:
            built[name] = res.build(threads=args.threads)
    if args.replay:  # the oracle's estimate (sum of weight x best) stands for the network's latency
        out["latency_ratio"] = out["on"]["estimated_ms"] / out["off"]["estimated_ms"]
        out["trials_saved"] = 1 - out["on"]["trials"] / out["off"]["trials"]
        out["seconds_saved"] = 1 - out["on"]["seconds"] / out["off"]["seconds"]
        return out
    x = [np.random.default_rng(0).standard_normal(s).astype(np.float32) for s in built["off"].net.input_shapes]
    times = {"off": [], "on": []}
    for _ in range(args.network_repeats):  # interleaved end-to-end timing
        for name in ("off", "on"):
            times[name].append(built[name].timeit(x, number=20))
    for name in ("off", "on"):
        out[name]["latency_ms"] = statistics.median(times[name]) * 1e3
    out["trials_saved"] = 1 - out["on"]["trials"] / out["off"]["trials"]
    out["seconds_saved"] = 1 - out["on"]["seconds"] / out["off"]["seconds"]
    out["latency_ratio"] = out["on"]["latency_ms"] / out["off"]["latency_ms"]
    return out


def geomean(xs: list[float]) -> float:
    xs = [x for x in xs if math.isfinite(x) and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else math.nan


def main() -> None:
    import felixjax as fj
    from felixjax.suites import suite

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", default="ops", help="a named suite (felixjax.suites), or 'none' (--network only)")
    p.add_argument("--op", action="append", default=[], metavar="SPEC", help="operators instead of --suite")
    p.add_argument("--only", default=None, help="indices of the suite's tasks to run (e.g. 0,1; parallel parts)")
    p.add_argument("--strategy", default="gradient")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--trials", type=int, default=256, help="the full budget of both arms")
    p.add_argument("--filter-p", type=lambda v: None if v.lower() == "none" else float(v), default=0.05,
                   help="a probability, or 'none' (no filtering)")
    p.add_argument("--stop-rule", default=None, help="CostAware's stop_rule (both, model, observed, plateau)")
    p.add_argument("--early-stop", type=float, default=0.001, help="expected -log latency gain per trial")
    p.add_argument("--warmup", type=int, default=None, help="CostAware's warmup (default: its default)")
    p.add_argument("--window", type=int, default=None, help="CostAware's window (default: its default)")
    p.add_argument("--patience", type=int, default=None, help="CostAware's patience (default: its default)")
    p.add_argument("--min-share", type=float, default=None, help="CostAware's min_share (stop_rule plateau)")
    p.add_argument("--plateau", type=float, default=None, help="CostAware's plateau (stop_rule plateau)")
    p.add_argument("--jump-weight", type=float, default=None, help="CostAware's jump_weight (stop_rule plateau)")
    p.add_argument("--explore", type=int, default=None, help="CostAware's explore (stop_rule plateau)")
    p.add_argument("--min-keep", type=float, default=None, help="CostAware's min_keep (filtering)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--retime-repeats", type=int, default=3)
    p.add_argument("--replay", action="store_true", help="replay the synthetic oracle (no compiling; a dry run)")
    p.add_argument("--network", default=None, help="also tune this zoo model off vs on (e.g. resnet18)")
    p.add_argument("--network-trials", type=int, default=1000)
    p.add_argument("--network-repeats", type=int, default=10)
    p.add_argument("--out", default=None, help="write every row as JSON here")
    args = p.parse_args()
    args.workdir = tempfile.mkdtemp(prefix="fj-cost-aware-")
    target = fj.Target.cpu()
    tasks = [fj.ops.parse_spec(s) for s in args.op] if args.op else [] if args.suite == "none" else suite(args.suite)
    if args.only:
        tasks = [tasks[int(i)] for i in args.only.split(",")]
    rows = []
    for task in tasks:
        for seed in range(args.seeds):
            rows.append(tune_pair(task, args, seed, target, os.path.join(args.workdir, "ops.db")))
            r = rows[-1]
            print(f"{r['task']:40s} seed {seed}: trials {r['off']['trials']:4d} -> {r['on']['trials']:4d} "
                  f"({100 * r['trials_saved']:5.1f}% saved), seconds {r['off']['seconds']:7.1f} -> "
                  f"{r['on']['seconds']:7.1f} ({100 * r['seconds_saved']:5.1f}% saved), final latency "
                  f"{100 * (r['latency_ratio'] - 1):+5.2f}%, stop {r['on']['stop_reason']}, "
                  f"filtered {r['on']['filtered']}", flush=True)
    trials_saved = seconds_saved = loss = math.nan
    if rows:
        trials_saved = 1 - sum(r["on"]["trials"] for r in rows) / sum(r["off"]["trials"] for r in rows)
        seconds_saved = 1 - sum(r["on"]["seconds"] for r in rows) / sum(r["off"]["seconds"] for r in rows)
        loss = geomean([r["latency_ratio"] for r in rows]) - 1
    if rows:  # (--suite none: a network only)
        print(f"\nsuite total: {100 * trials_saved:.1f}% of trials and {100 * seconds_saved:.1f}% of seconds saved, "
              f"final latency {100 * loss:+.2f}% (geomean of re-timed on/off; target >= 40%, >= 30%, <= +2%)")
    net = None
    if args.network:
        net = tune_network(args, target)
        print(f"{args.network}: trials {net['off']['trials']} -> {net['on']['trials']} "
              f"({100 * net['trials_saved']:.1f}% saved), seconds {100 * net['seconds_saved']:.1f}% saved, "
              f"{'estimated (oracle)' if args.replay else 'end-to-end'} latency {100 * (net['latency_ratio'] - 1):+.2f}%")
        for t_off, t_on in zip(net["off"]["tasks"], net["on"]["tasks"]):
            print(f"  {t_on['task']:42s} x{t_on['weight']}: trials {t_off['trials']:4d} -> {t_on['trials']:4d}, "
                  f"stop {t_on['stop_reason'] or '-'}")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items()}, "machine": platform.processor() or
                       platform.machine(), "cpus": os.cpu_count(), "python": sys.version.split()[0],
                       "rows": rows, "network": net, "trials_saved": trials_saved,
                       "seconds_saved": seconds_saved, "latency_loss": loss}, f, indent=1)


if __name__ == "__main__":
    main()
