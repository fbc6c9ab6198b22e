"""Calibrate cost-aware tuning's thresholds (issue 19) on the replay oracle, offline, on a calibration suite.

Early stop is a stopping rule: up to the round where it fires, a run with it is the same run as one
without it (same seed, same proposals, same measurements). So one full-budget run per task, seed and
filter setting, with every round's screening quantities traced (``Screen.trace``), tells where every
threshold would have stopped it, what it would have found by then and what its clock read. This
script runs, per task and seed, the ``off`` arm (full budget, no options) and one ``on`` arm per
``--filter-p`` value (``none``: no filtering), all with a never-firing early stop, and then evaluates
a grid of stopping rules offline:

* ``observed``: the run's best improved by less than ``T`` per trial (in −log latency) over the
  last ``W`` trials (the convergence curve of best-so-far vs trials);
* ``model``: the ensemble's expected gain per trial of the next round (max EI over the round's
  candidates / trials it costs) stayed below ``T`` for ``patience`` rounds;
* ``both``: both at once (what ``CostAware(early_stop=T, window=W)`` does).

For each rule it reports trials saved, seconds saved (the run's clock at the stop, replay trials at
``trial_s`` simulated seconds plus the real proposing and screening time) and the final latency lost
against the ``off`` arm's full-budget best (geomean), and picks the setting that saves the most
trials with a geomean loss <= ``--max-loss``. The replay oracle is synthetic and
noise-free: the figures calibrate the rule, they do not measure hardware.

    python benchmarks/cost_aware_calibrate.py --suite calibration --seeds 2 --trials 512 \\
        --filter-p none --filter-p 0.05 --out results/cost_aware_calibration.json
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import time


def run_task(task, strategy: str, seed: int, trials: int, filters: list, warmup: int, min_keep: float | None = None,
             skip_off: bool = False) -> dict:
    from felixjax import Target
    from felixjax.cost_aware import CostAware
    from felixjax.session import TuningSession
    from felixjax.testing import ReplayRunner

    out = {"task": task.name, "seed": seed}
    with TuningSession(Target.cpu(), db=None, measurer=lambda t, tg: ReplayRunner.from_oracle(t), threads=1,
                       progress=False, seed=seed) as s:
        # every arm's model draws the same random numbers (model_seed): the arms differ only in their options
        arms = {} if skip_off else {"off": s.add(task, strategy, seed=seed, trials=trials, run="off", group="off",
                                                 model_seed="arms")}
        for fp in filters:
            name = f"on:{fp}" if min_keep is None or fp is None else f"on:{fp}:keep{min_keep:g}"
            arms[name] = s.add(task, strategy, seed=seed, trials=trials, run=name, group=name, model_seed="arms",
                               cost_aware=CostAware(filter_p=fp, early_stop=1e-12, warmup=warmup, patience=10 ** 9,
                                                    min_keep=min_keep))  # traces, never stops
        for name, tr in arms.items():
            t0, rounds = time.perf_counter(), []
            while not tr.done:
                rounds.append((len(tr.history), tr.clock))  # where a stopping rule decides, and the clock then
                s.step(tr)
            out[name] = {"lat": [r.latency_s if r.ok else math.inf for r in tr.history], "clock": tr.clock,
                         "rounds": rounds,
                         "wall_s": time.perf_counter() - t0, "screen_s": tr.stats.get("screen_s", 0.0),
                         "filtered": tr.stats.get("filtered", 0),
                         "trace": tr.screen.trace if tr.screen is not None else []}
    return out


def observed(lat: list[float], n: int, window: int) -> float:
    if n <= window:
        return math.inf
    then, now = min(lat[:n - window]), min(lat[:n])
    return math.log(then / now) / window if math.isfinite(then) else math.inf


def simulate(arm: dict, rule: str, thr: float, window: int, patience: int, no_model_s: bool) -> tuple[int, float, float]:
    """(trials, seconds, best) of ``arm`` had the rule stopped it."""
    lat, cold = arm["lat"], 0
    # the screen's time is the ensemble's: a rule that needs no model (and no filtering) would not pay it
    per_round_screen = arm["screen_s"] / max(1, len(arm["trace"])) if no_model_s else 0.0
    for i, e in enumerate(arm["trace"]):
        n = e["trials"]
        obs_ok = observed(lat, n, window) < thr
        cold = cold + 1 if e["gain"] < thr else 0
        model_ok = cold >= patience
        fire = {"observed": obs_ok, "model": model_ok, "both": obs_ok and model_ok}[rule]
        if fire:
            return n, e["clock"] - per_round_screen * (i + 1), min(lat[:n])
    return len(lat), arm["clock"] - per_round_screen * len(arm["trace"]), min(lat)


def geomean(xs):
    xs = [x for x in xs if math.isfinite(x) and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else math.nan


def evaluate(rows: list[dict], arm: str, rule: str, thr: float, window: int, patience: int) -> dict:
    no_model = arm == "on:None" and rule == "observed"
    tr_on = tr_off = s_on = s_off = 0.0
    ratios, worst = [], 1.0
    for row in rows:
        off = row["off"]
        n, sec, best = simulate(row[arm], rule, thr, window, patience, no_model)
        tr_on, tr_off = tr_on + n, tr_off + len(off["lat"])
        s_on, s_off = s_on + sec, s_off + off["clock"]
        ratios.append(best / min(off["lat"]))
        worst = max(worst, ratios[-1])
    return {"arm": arm, "rule": rule, "threshold": thr, "window": window, "patience": patience,
            "trials_saved": 1 - tr_on / tr_off, "seconds_saved": 1 - s_on / s_off,
            "latency_loss": geomean(ratios) - 1, "worst": worst - 1}


def main() -> None:
    from felixjax.suites import suite

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", default="calibration")
    p.add_argument("--strategy", default="genetic")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--trials", type=int, default=512)
    p.add_argument("--warmup", type=int, default=64)
    p.add_argument("--filter-p", action="append", default=[], help="'none' or a probability; repeatable")
    p.add_argument("--min-keep", type=float, default=None, help="CostAware's min_keep for the filtering arms "
                   "(their arm is then named on:P:keepK)")
    p.add_argument("--off-only", action="store_true", help="only the off arm (with its round boundaries: the "
                   "model-free rules need nothing more)")
    p.add_argument("--skip-off", action="store_true", help="do not run the off arm (another file has it; "
                   "benchmarks/cost_aware_stoprule.py merges runs by task and seed)")
    p.add_argument("--max-loss", type=float, default=0.01, help="geomean latency loss allowed when picking")
    p.add_argument("--only", default=None, help="indices of the suite's tasks to run (e.g. 0,1)")
    p.add_argument("--load", action="append", default=[], help="re-evaluate the rules on the runs saved in "
                   "these JSON files (repeatable)")
    p.add_argument("--rule", default=None, metavar="ARM:RULE:T:W:PATIENCE",
                   help="evaluate this one rule per run (e.g. on:None:observed:0.0001:64:1) instead of the grid")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    filters = [None if f.lower() == "none" else float(f) for f in (args.filter_p or ["none", "0.05"])]
    if args.off_only:
        filters = []
    if args.load:
        rows = []
        for path in args.load:
            with open(path) as f:
                rows += json.load(f)["runs"]
    else:
        rows = []
        tasks = suite(args.suite)
        if args.only:
            tasks = [tasks[int(i)] for i in args.only.split(",")]
        for task in tasks:
            for seed in range(args.seeds):
                rows.append(run_task(task, args.strategy, seed, args.trials, filters, args.warmup, args.min_keep,
                                     args.skip_off))
                r = rows[-1]
                if args.out:  # after every run: a long calibration stopped half-way keeps what it made
                    save(args, rows, [])
                if args.off_only:
                    print(f"{r['task']:42s} seed {seed}: off best {min(r['off']['lat']) * 1e3:.4f} ms, clock "
                          f"{r['off']['clock']:.0f} s", flush=True)
                    continue
                if args.skip_off:
                    print(f"{r['task']:42s} seed {seed}: " + "; ".join(
                        f"{k} best {min(v['lat']) * 1e3:.4f} ms, clock {v['clock']:.0f} s (screen {v['screen_s']:.0f} s), "
                        f"filtered {v['filtered']}" for k, v in r.items() if k.startswith("on:")), flush=True)
                    continue
                print(f"{r['task']:42s} seed {seed}: off best {min(r['off']['lat']) * 1e3:.4f} ms, clock "
                      f"{r['off']['clock']:.0f} s; " + "; ".join(
                          f"{k} best {min(v['lat']) * 1e3:.4f} ms, clock {v['clock']:.0f} s (screen "
                          f"{v['screen_s']:.0f} s), filtered {v['filtered']}, same trials as off: "
                          f"{v['lat'] == r['off']['lat']}"
                          for k, v in r.items() if k.startswith("on:")), flush=True)
    if args.rule:
        arm, rule, thr, window, patience = args.rule.rsplit(":", 4)
        thr, window, patience = float(thr), int(window), int(patience)
        no_model = arm == "on:None" and rule == "observed"
        print(f"rule {args.rule} (offline, on the traced runs):")
        for row in rows:
            n, sec, best = simulate(row[arm], rule, thr, window, patience, no_model)
            off = row["off"]
            print(f"{row['task']:42s} seed {row['seed']}: trials {len(off['lat'])} -> {n:4d}, seconds "
                  f"{off['clock']:6.0f} -> {sec:6.0f}, final latency {100 * (best / min(off['lat']) - 1):+6.2f}%")
        r = evaluate(rows, arm, rule, thr, window, patience)
        print(f"total: {100 * r['trials_saved']:.1f}% of trials, {100 * r['seconds_saved']:.1f}% of seconds saved, "
              f"final latency {100 * r['latency_loss']:+.2f}% (geomean), worst run {100 * r['worst']:+.2f}%")
        return
    if args.skip_off or args.off_only:  # nothing to compare with here: cost_aware_stoprule.py merges the arms by task and seed
        return
    results = []
    for arm in sorted({k for r in rows for k in r if k.startswith("on:")}):
        for rule, thr, window, patience in itertools.product(
                ("observed", "model", "both"), (3e-5, 1e-4, 3e-4, 1e-3, 3e-3), (32, 64, 128), (1, 2)):
            if rule == "observed" and patience == 2 or rule == "model" and window != 64:
                continue  # parameters the rule does not use
            results.append(evaluate(rows, arm, rule, thr, window, patience))
    ok = [r for r in results if r["latency_loss"] <= args.max_loss]
    ok.sort(key=lambda r: (-r["trials_saved"], -r["seconds_saved"]))
    print(f"\n{len(rows)} runs; rules with geomean loss <= {100 * args.max_loss:.1f}%, most trials saved first:")
    print("| arm | rule | T | W | patience | trials saved | seconds saved | loss (geomean) | worst run |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in ok[:15]:
        print(f"| {r['arm']} | {r['rule']} | {r['threshold']:g} | {r['window']} | {r['patience']} | "
              f"{100 * r['trials_saved']:.1f}% | {100 * r['seconds_saved']:.1f}% | "
              f"{100 * r['latency_loss']:+.2f}% | {100 * r['worst']:+.2f}% |")
    if args.out:
        save(args, rows, results)


def save(args, rows: list[dict], results: list[dict]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "runs": rows, "rules": results}, f)


if __name__ == "__main__":
    main()
