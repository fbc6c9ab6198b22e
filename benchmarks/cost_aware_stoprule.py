"""Calibrate and judge early-stop rules on recorded tuning logs, with held-out tasks (issue 19).

Early stop is a stopping rule: up to the round where it fires, a run with it is the run without it. So
the full-budget runs recorded by ``benchmarks/cost_aware_calibrate.py`` (latency of every trial, the
clock at every round) tell, for any rule, where it would have stopped, what it had found by then and
what its clock read; :func:`felixjax.cost_aware.plateau_decision` is the live rule itself, called here
on the replayed log, so the figures are the rule's, not a re-implementation's.

Honest protocol: the tasks (both seeds of a task together) are split into two halves, A and B (the
task names sorted, alternately; ``--split``). Every threshold is picked on A only (the setting that
saves the most trials with geomean loss <= ``--max-loss`` and >= ``--min-seconds`` of the seconds saved
on A) and reported on B (held out), on A, and on the whole set, with per-run numbers; then the same
with the halves swapped. Loss is the final best latency of the stopped run over the full-budget
``off`` run's best (geomean over runs); trials and seconds saved are totals over the runs (a replay
trial costs 0.3 simulated seconds plus the real proposing time; without filtering a model-free rule
does not pay the ensemble's fitting, which the traced arm did and is taken out; its ``off`` reference is
then the traced arm itself at the full budget, the same run: the calibration suite's ``off`` arms were
recorded before the two arms' models were seeded alike).

    python benchmarks/cost_aware_stoprule.py --load results/cost_aware_calibration.json \\
        --load 'results/cost_aware_ops_*.json' --load 'results/cost_aware_fresh_*.json' --arm on:None

The replay oracle is synthetic and noise-free: the figures compare rules; they do not measure hardware.
"""
from __future__ import annotations

import argparse
import glob
import itertools
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from codegen.ops import parse_spec
from felixjax.cost_aware import CostAware, observed_gain, plateau_decision
from felixjax.suites import SUITES

GRID = {"early_stop": (1e-4, 3e-4, 1e-3), "window": (32, 64, 128), "min_share": (0.0, 0.25, 0.375, 0.5),
        "plateau": (0.0, 0.5, 1.0, 2.0), "jump_weight": (0.0, 2.0, 8.0), "explore": (0, 64, 128)}


def load(paths: list[str]) -> list[dict]:
    """Runs merged by (task, seed, strategy): the arms of one run may come from several files; the same
    task and seed under two strategies are two runs (``r["strategy"]``, from the file's arguments)."""
    runs: dict[tuple, dict] = {}
    for pattern in paths:
        for path in sorted(glob.glob(pattern)) or [pattern]:
            with open(path) as f:
                data = json.load(f)
            strategy = data.get("args", {}).get("strategy", "genetic")
            for r in data["runs"]:
                runs.setdefault((r["task"], r["seed"], strategy), {"strategy": strategy}).update(r)
    for r in runs.values():  # an untraced off arm recorded beside a traced no-filter arm: the same trials
        if "off" in r and not r["off"].get("rounds") and r.get("on:None", {}).get("lat") == r["off"]["lat"]:
            r["off"] = r["on:None"]
    return [runs[k] for k in sorted(runs)]


def simulate(arm: dict, opt: CostAware, budget: int, model_free: bool) -> tuple[int, float, float]:
    """(trials, seconds, best) of the traced ``arm`` had ``opt``'s plateau rule run on it."""
    lat, fired = arm["lat"], None
    trace = arm.get("trace") or []
    # where the rule decides: the traced rounds (after warmup), or every round of an untraced arm
    points = [(e["trials"], e["clock"]) for e in trace] if trace else [tuple(x) for x in arm["rounds"]]
    screen_s = arm.get("screen_s", 0.0)
    per_round_screen = screen_s / max(1, len(trace)) if model_free and trace else 0.0
    for i, (n, clock) in enumerate(points):
        stop, fired = plateau_decision(lat[:n], budget, opt, fired)
        if stop:
            return n, clock - per_round_screen * (i + 1), min(lat[:n])
    return len(lat), arm["clock"] - per_round_screen * len(trace), min(lat)


def simulate_observed(arm: dict, threshold: float, window: int, warmup: int = 64) -> tuple[int, float, float]:
    """The previous calibrated rule (``stop_rule="observed"``), exactly, on an untraced no-filter arm."""
    lat = arm["lat"]
    points = [(e["trials"], e["clock"]) for e in arm["trace"]] if arm.get("trace") else arm["rounds"]
    per_round_screen = arm.get("screen_s", 0.0) / max(1, len(arm.get("trace") or []))
    for i, (n, clock) in enumerate(points):
        if n >= warmup and observed_gain(lat[:n], window) < threshold:
            return n, clock - (per_round_screen * (i + 1) if arm.get("trace") else 0.0), min(lat[:n])
    return len(lat), arm["clock"] - arm.get("screen_s", 0.0), min(lat)


def simulate_cut(arm: dict, share: float, budget: int) -> tuple[int, float, float]:
    """No rule: stop at the first round boundary at or past ``share`` of the budget."""
    lat = arm["lat"]
    for n, clock in arm["rounds"]:
        if n >= share * budget:
            return n, clock, min(lat[:n])
    return len(lat), arm["clock"], min(lat)


def geomean(xs: list[float]) -> float:
    xs = [x for x in xs if math.isfinite(x) and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else math.nan


def evaluate(runs: list[dict], arm: str, opt: CostAware, per_run: bool = False) -> dict:
    model_free = arm in ("off", "on:None")  # no filtering: the rule needs no model
    tr_on = tr_off = s_on = s_off = 0.0
    ratios, rows = [], []
    for r in runs:
        off = r[arm] if model_free else r["off"]  # without filtering, the same run without the rule is the arm
        off = {"lat": off["lat"], "clock": off["clock"] - off.get("screen_s", 0.0)}  # without an ensemble's time
        if isinstance(opt, tuple) and opt[0] == "cut":  # ("cut", share): stop at the first round past it
            n, sec, best = simulate_cut(r[arm], opt[1], len(off["lat"]))
        elif isinstance(opt, tuple):  # ("observed", T, W): the previous rule, for comparison
            n, sec, best = simulate_observed(r[arm], opt[1], opt[2])
        else:
            n, sec, best = simulate(r[arm], opt, len(off["lat"]), model_free)
        tr_on, tr_off = tr_on + n, tr_off + len(off["lat"])
        s_on, s_off = s_on + sec, s_off + off["clock"]
        ratios.append(best / min(off["lat"]))
        if per_run:
            rows.append({"task": r["task"], "seed": r["seed"], "strategy": r["strategy"], "trials": n, "budget": len(off["lat"]),
                         "seconds": sec, "off_seconds": off["clock"], "loss": ratios[-1] - 1})
    out = {"runs": len(runs), "trials_saved": 1 - tr_on / tr_off, "seconds_saved": 1 - s_on / s_off,
           "latency_loss": geomean(ratios) - 1, "worst": max(ratios) - 1}
    if per_run:
        out["per_run"] = rows
    return out


def options(kw: dict) -> CostAware:
    return CostAware(stop_rule="plateau", warmup=64, **kw)


def pick(runs: list[dict], arm: str, max_loss: float, min_seconds: float) -> tuple[dict, dict]:
    """The grid's setting with the most trials saved on ``runs`` within the loss and seconds limits; if
    none is within both, the most trials within the loss limit; if none, the least loss."""
    best = None
    for values in itertools.product(*GRID.values()):
        kw = dict(zip(GRID, values))
        if kw["plateau"] == 0 and kw["jump_weight"]:
            continue  # jump_weight scales the plateau patience only
        r = evaluate(runs, arm, options(kw))
        within = r["latency_loss"] <= max_loss
        key = (within and r["seconds_saved"] >= min_seconds, within,
               r["trials_saved"] if within else -r["latency_loss"], r["seconds_saved"])
        if best is None or key > best[0]:
            best = (key, kw, r)
    if not best[0][0]:
        print(f"(no setting within {100 * max_loss:.1f}% loss and {100 * min_seconds:.0f}% seconds saved on the "
              f"calibration half: {'most trials within the loss' if best[0][1] else 'least loss'} taken)")
    return best[1], best[2]


def split(runs: list[dict], how: str) -> tuple[list[dict], list[dict]]:
    names = sorted({r["task"] for r in runs})
    if how == "alternate":
        a = set(names[0::2])
    else:  # a comma-separated list of task names for half A
        a = set(how.split(","))
    return [r for r in runs if r["task"] in a], [r for r in runs if r["task"] not in a]


def fmt(r: dict) -> str:
    return (f"{100 * r['trials_saved']:5.1f}% trials, {100 * r['seconds_saved']:5.1f}% seconds saved, loss "
            f"{100 * r['latency_loss']:+6.2f}% geomean (worst run {100 * r['worst']:+.1f}%), {r['runs']} runs")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--load", action="append", required=True, help="JSON of cost_aware_calibrate.py (globs ok)")
    p.add_argument("--arm", default="on:None", help="the traced arm the rule stops (on:None: no filtering)")
    p.add_argument("--split", default="alternate", help="'alternate' (sorted task names) or half A's tasks")
    p.add_argument("--max-loss", type=float, default=0.01, help="geomean loss allowed on the calibration half")
    p.add_argument("--min-seconds", type=float, default=0.30, help="seconds saved required on it")
    p.add_argument("--rule", default=None, help="evaluate this setting (JSON of CostAware keywords) instead")
    p.add_argument("--same-first", type=int, default=64, help="trials both arms must share (the warmup)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    runs = [r for r in load(args.load) if "off" in r and args.arm in r]
    if args.arm != "off":  # before filtering acts (warmup), both arms measure the same configs when the code
        # and seeds agree: a run whose arms differ there was recorded at another version (left out)
        stale = [r for r in runs if r[args.arm]["lat"][:args.same_first] != r["off"]["lat"][:args.same_first]]
        for r in stale:
            print(f"left out (arms differ in the first {args.same_first} trials): {r['task']} seed {r['seed']}")
        runs = [r for r in runs if r not in stale]
    a, b = split(runs, args.split)
    report = {"arm": args.arm, "halves": [sorted({r["task"] for r in a}), sorted({r["task"] for r in b})],
              "folds": []}
    print(f"{len(runs)} runs with arm {args.arm}; half A: {', '.join(report['halves'][0])}; "
          f"half B: {', '.join(report['halves'][1])}")
    if args.arm == "off":  # the previous calibration (stop_rule="observed", T=0.001, W=128) on the same logs
        prev = {name: evaluate(rs, "off", ("observed", 0.001, 128), per_run=True)
                for name, rs in (("A", a), ("B", b), ("whole", runs))}
        report["previous_rule"] = prev
        print("previous rule (observed, T=0.001, W=128, warmup 64) on the same logs:")
        for name in ("A", "B", "whole"):
            print(f"  {name:5s}: {fmt(prev[name])}")
        for sname, specs in SUITES.items():
            names = {parse_spec(x).name for x in specs}
            sub = [r for r in runs if r["task"] in names]
            if sub:
                prev[f"suite:{sname}"] = evaluate(sub, "off", ("observed", 0.001, 128))
                print(f"  suite {sname:12s}: {fmt(prev[f'suite:{sname}'])}")
    cut = {}  # the rule-free baseline: every run cut at a fixed share of its budget
    for share in (0.375, 0.5, 0.625):
        cut[share] = evaluate(runs, args.arm, ("cut", share))
        print(f"fixed cut at {100 * share:.1f}% of the budget (no rule), all runs: {fmt(cut[share])}")
    report["fixed_cut"] = cut
    folds = [("A", a, "B", b), ("B", b, "A", a)]
    for cal_name, cal, held_name, held in folds:
        if args.rule:
            kw = json.loads(args.rule)
        else:
            kw, _ = pick(cal, args.arm, args.max_loss, args.min_seconds)
        opt = options(kw)
        res = {name: evaluate(rs, args.arm, opt, per_run=True)
               for name, rs in (("calibration", cal), ("held_out", held), ("whole", runs))}
        report["folds"].append({"calibrated_on": cal_name, "rule": kw, **res})
        print(f"\n{'given rule' if args.rule else 'calibrated'}, half {cal_name} as calibration: {json.dumps(kw)}")
        for name in ("calibration", "held_out", "whole"):
            print(f"  {name:12s} ({cal_name if name == 'calibration' else held_name if name == 'held_out' else 'A+B'}): "
                  f"{fmt(res[name])}")
        for sname, specs in SUITES.items():  # the same rule on each named suite's runs
            names = {parse_spec(x).name for x in specs}
            sub = [r for r in runs if r["task"] in names]
            if sub:
                res[f"suite:{sname}"] = evaluate(sub, args.arm, opt)
                print(f"  suite {sname:12s}: {fmt(res[f'suite:{sname}'])}")
        for strategy in sorted({r["strategy"] for r in runs}):  # and on each strategy's runs (held out only)
            sub = [r for r in held if r["strategy"] == strategy]
            if sub and len({r["strategy"] for r in runs}) > 1:
                res[f"held_out:{strategy}"] = evaluate(sub, args.arm, opt)
                print(f"  held out, {strategy:9s}: {fmt(res[f'held_out:{strategy}'])}")
        for row in res["whole"]["per_run"]:
            half = "cal " if any(r["task"] == row["task"] for r in cal) else "held"
            print(f"    [{half}] {row['strategy'][:4]} {row['task']:40s} seed {row['seed']}: trials {row['budget']} -> {row['trials']:3d}, "
                  f"seconds {row['off_seconds']:5.0f} -> {row['seconds']:5.0f}, loss {100 * row['loss']:+6.2f}%")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), **report}, f, indent=1)


if __name__ == "__main__":
    main()
