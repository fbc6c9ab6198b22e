"""Cost-aware early stop on real hardware (issue 19): what the plateau rule saves and loses on measured runs.

Early stop is a stopping rule: up to the round where it fires, a run with it is the run without it. So
per task and seed this script makes **one** full-budget run with real builds and timings (no cost-aware
options), keeps its round boundaries (trials, clock), and replays the rule on the log with the live
decision function (:func:`felixjax.cost_aware.plateau_decision`, through
``benchmarks/cost_aware_stoprule.simulate``). Then the best configs of the stopped prefix and of the
full run are **re-timed interleaved** in one ``TuningSession.retime`` call (A B A B ..., ``--repeats``
rounds; one config in both is one timing, so a stop that kept the best loses exactly 0%).

Reported per run and in total: trials saved (``1 - n_stop / budget``), seconds saved (the run's own
clock at the stop over its clock at the end: proposing, building, measuring), and the final latency lost
(re-timed best of the prefix over re-timed best of the full run; geomean over the runs).

Why one run and not two arms (``benchmarks/cost_aware.py``): two arms on hardware diverge with the
timing noise, and the second arm to build a config finds it in the build cache, so its seconds are not
comparable; here the stopped run *is* the prefix of the full one.

    python benchmarks/cost_aware_hw.py --suite ops --seeds 1 --trials 512 --out results/ca_hw/ops.json

Resumable per run: runs already in ``--out`` are skipped. Not run in CI (minutes per run).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.cost_aware_stoprule import geomean, simulate  # noqa: E402

# the rule held-out calibration picked on the replayed logs of session 17 (both halves picked it)
RULE = {"early_stop": 1e-4, "window": 32, "min_share": 0.5, "plateau": 0.0, "jump_weight": 0.0, "explore": 0}


def run_one(task, seed: int, args, opt) -> dict:
    from felixjax import Target
    from felixjax.session import TuningSession

    t0 = time.time()
    with TuningSession(Target.cpu(), db=args.db, threads=args.threads, progress=False, seed=seed) as s:
        tr = s.add(task, args.strategy, seed=seed, trials=args.trials, run=f"full:{seed}")
        if tr.resumed:
            raise SystemExit(f"{task.name} seed {seed}: {args.db} already holds this run (its round boundaries "
                             f"are not in {args.out}); use another --db")
        rounds = []
        while not tr.done:
            rounds.append((len(tr.history), tr.clock))  # where the rule decides, and the clock then
            s.step(tr)
        lat = [r.latency_s if r.ok else math.inf for r in tr.history]
        n, sec, _ = simulate({"lat": lat, "clock": tr.clock, "rounds": rounds}, opt, args.trials, True)
        stopped = SimpleNamespace(task=task, run=f"stop:{seed}", history=tr.history[:n], clock=sec)
        retimed = s.retime([tr, stopped], top=args.top, repeats=args.repeats)
    full, stop = retimed[tr.run][0], retimed[stopped.run][0]
    return {"task": task.name, "seed": seed, "budget": len(lat), "trials": n, "seconds": sec, "full_seconds": tr.clock,
            "best_while_tuning": {"stop": min(lat[:n]), "full": min(lat)},
            "retimed": {"stop": stop.latency_s if stop.ok else math.inf, "full": full.latency_s if full.ok else math.inf},
            "same_best": stop.config == full.config, "started": t0, "wall_s": time.time() - t0}


def report(rows: list[dict]) -> None:
    for r in rows:
        loss = r["retimed"]["stop"] / r["retimed"]["full"] - 1
        print(f"  {r['task']:42s} seed {r['seed']}: trials {r['budget']} -> {r['trials']:3d}, seconds "
              f"{r['full_seconds']:6.0f} -> {r['seconds']:6.0f}, re-timed loss {100 * loss:+6.2f}%"
              f"{' (same best config)' if r['same_best'] else ''}", flush=True)
    if not rows:
        return
    trials = 1 - sum(r["trials"] for r in rows) / sum(r["budget"] for r in rows)
    seconds = 1 - sum(r["seconds"] for r in rows) / sum(r["full_seconds"] for r in rows)
    loss = geomean([r["retimed"]["stop"] / r["retimed"]["full"] for r in rows]) - 1
    worst = max(r["retimed"]["stop"] / r["retimed"]["full"] for r in rows) - 1
    print(f"total over {len(rows)} runs: {100 * trials:.1f}% of trials, {100 * seconds:.1f}% of seconds saved, "
          f"re-timed final latency {100 * loss:+.2f}% geomean (worst run {100 * worst:+.2f}%)")


def main() -> None:
    from felixjax.cost_aware import CostAware
    from felixjax.suites import suite

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", default="ops")
    p.add_argument("--only", default=None, help="indices of the suite's tasks to run (e.g. 0,1)")
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--strategy", default="genetic")
    p.add_argument("--trials", type=int, default=512, help="the full budget (the rule's min_share counts on it)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rule", default=json.dumps(RULE), help="CostAware keywords of the plateau rule (JSON)")
    p.add_argument("--top", type=int, default=3, help="best configs of each side re-timed")
    p.add_argument("--repeats", type=int, default=3, help="interleaved re-timing rounds")
    p.add_argument("--db", default=None, help="tuning database (default: beside --out)")
    p.add_argument("--out", required=True, help="JSON of the rows (written after every run; resumable)")
    args = p.parse_args()
    opt = CostAware(stop_rule="plateau", warmup=64, **json.loads(args.rule))
    args.db = args.db or os.path.splitext(args.out)[0] + ".db"
    os.makedirs(os.path.dirname(os.path.abspath(args.out)) or ".", exist_ok=True)
    rows = json.load(open(args.out))["rows"] if os.path.exists(args.out) else []
    done = {(r["task"], r["seed"]) for r in rows}
    tasks = suite(args.suite)
    if args.only:
        tasks = [tasks[int(i)] for i in args.only.split(",")]
    print(f"rule {args.rule}; {platform.processor() or platform.machine()}, {os.cpu_count()} cpus", flush=True)
    for task in tasks:
        for seed in range(args.seeds):
            if (task.name, seed) in done:
                continue
            rows.append(run_one(task, seed, args, opt))
            with open(args.out, "w") as f:  # after every run: an interrupted benchmark keeps what it measured
                json.dump({"args": vars(args), "rows": rows}, f, indent=1)
            report(rows[-1:])
    report(rows)


if __name__ == "__main__":
    main()
