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

``--oracle`` also prints what a stopping rule could save at best on these logs: each run stopped where a
rule that knew its future would stop it (at a multiple of ``--oracle-step`` trials, at least one step),
trading trials saved against the geomean loss of the best latency *while tuning* (the logs' records;
Lagrangian sweep over the trade-off), so the target can be judged against the runs themselves.
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

from benchmarks.cost_aware_stoprule import geomean, simulate

# overrides of CostAware.calibrated() (picked on the genetic + gradient replay logs of session 17: w64):
# w32 is what the genetic logs alone picked
RULES = {"w32": {"window": 32}, "w64": {}}


def run_one(task, seed: int, args, rules: dict) -> dict:
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
        stops = {name: simulate({"lat": lat, "clock": tr.clock, "rounds": rounds}, opt, args.trials, True)[:2]
                 for name, opt in rules.items()}
        prefixes = {n: SimpleNamespace(task=task, run=f"stop{n}:{seed}", history=tr.history[:n], clock=sec)
                    for n, sec in stops.values() if n < len(lat)}
        retimed = s.retime([tr, *prefixes.values()], top=args.top, repeats=args.repeats)  # one interleaved call
    full = retimed[tr.run][0]

    def best(n: int):
        rec = retimed[prefixes[n].run][0] if n in prefixes else full
        return (rec.latency_s if rec.ok else math.inf), rec.config == full.config

    out = {}
    for name, (n, sec) in stops.items():
        lat_n, same = best(n)
        out[name] = {"trials": n, "seconds": sec, "retimed": lat_n, "same_best": same,
                     "best_while_tuning": min(lat[:n])}
    return {"task": task.name, "seed": seed, "budget": len(lat), "full_seconds": tr.clock,
            "full_retimed": full.latency_s if full.ok else math.inf, "rules": out, "lat": lat, "rounds": rounds,
            "started": t0, "wall_s": time.time() - t0}


def report(rows: list[dict], name: str, total: bool = True) -> None:
    for r in rows:
        x = r["rules"][name]
        print(f"  [{name}] {r['task']:42s} seed {r['seed']}: trials {r['budget']} -> {x['trials']:3d}, seconds "
              f"{r['full_seconds']:6.0f} -> {x['seconds']:6.0f}, re-timed loss "
              f"{100 * (x['retimed'] / r['full_retimed'] - 1):+6.2f}%{' (same best config)' if x['same_best'] else ''}",
              flush=True)
    if not rows or not total:
        return
    ratios = [r["rules"][name]["retimed"] / r["full_retimed"] for r in rows]
    trials = 1 - sum(r["rules"][name]["trials"] for r in rows) / sum(r["budget"] for r in rows)
    seconds = 1 - sum(r["rules"][name]["seconds"] for r in rows) / sum(r["full_seconds"] for r in rows)
    print(f"[{name}] total over {len(rows)} runs: {100 * trials:.1f}% of trials, {100 * seconds:.1f}% of seconds "
          f"saved, re-timed final latency {100 * (geomean(ratios) - 1):+.2f}% geomean (worst run "
          f"{100 * (max(ratios) - 1):+.2f}%)")


def oracle(rows: list[dict], step: int = 32) -> list[tuple[float, float, list[int]]]:
    """``(trials saved, geomean loss, stops)`` of the best per-run stopping points (perfect foresight) for a
    sweep of trade-offs between trials saved and log-loss, losses from the best-so-far records."""
    curves = []
    for r in rows:
        best, run = math.inf, []
        for x in r["lat"]:
            best = min(best, x if x and x > 0 else math.inf)
            run.append(best)
        curves.append([b / run[-1] for b in run])
    out = []
    for weight in (0.5, 1, 2, 4, 8, 16, 32, 1000):
        stops, saved, loss = [], 0.0, 0.0
        for c in curves:
            n = len(c)
            k = max(range(step, n + 1, step), key=lambda k: (n - k) / n - weight * math.log(c[k - 1]))
            stops.append(k)
            saved += (n - k) / n
            loss += math.log(c[k - 1])
        out.append((saved / len(curves), math.exp(loss / len(curves)) - 1, stops))
    return out


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
    p.add_argument("--rules", default=json.dumps(RULES),
                   help="name -> overrides of CostAware.calibrated() (JSON), one rule per name")
    p.add_argument("--top", type=int, default=3, help="best configs of each side re-timed")
    p.add_argument("--repeats", type=int, default=3, help="interleaved re-timing rounds")
    p.add_argument("--db", default=None, help="tuning database (default: beside --out)")
    p.add_argument("--out", required=True, help="JSON of the rows (written after every run; resumable)")
    p.add_argument("--oracle", action="store_true", help="also print the perfect-foresight bound on these logs")
    p.add_argument("--oracle-step", type=int, default=32, help="granularity of the oracle's stopping points")
    args = p.parse_args()
    rules = {k: CostAware.calibrated(**v) for k, v in json.loads(args.rules).items()}
    args.db = args.db or os.path.splitext(args.out)[0] + ".db"
    os.makedirs(os.path.dirname(os.path.abspath(args.out)) or ".", exist_ok=True)
    rows = []
    if os.path.exists(args.out):
        with open(args.out) as f:
            rows = json.load(f)["rows"]
    done = {(r["task"], r["seed"]) for r in rows}
    tasks = suite(args.suite)
    if args.only:
        tasks = [tasks[int(i)] for i in args.only.split(",")]
    print(f"rules {args.rules}; {platform.processor() or platform.machine()}, {os.cpu_count()} cpus", flush=True)
    for task in tasks:
        for seed in range(args.seeds):
            if (task.name, seed) in done:
                continue
            rows.append(run_one(task, seed, args, rules))
            with open(args.out, "w") as f:  # after every run: an interrupted benchmark keeps what it measured
                json.dump({"args": vars(args), "rows": rows}, f)
            for name in rules:
                report(rows[-1:], name, total=False)
    for name in rules:
        report(rows, name)
    if args.oracle and rows:
        print(f"oracle (each run stopped where its own future says, multiples of {args.oracle_step} trials; "
              "losses of the best record while tuning):")
        for saved, loss, stops in oracle(rows, args.oracle_step):
            print(f"  {100 * saved:5.1f}% of trials saved at {100 * loss:+.2f}% geomean loss; stops {stops}")


if __name__ == "__main__":
    main()
