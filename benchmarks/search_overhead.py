"""Where a search spends its own seconds: propose and update per round, gradient next to genetic.

Issue 15's seconds-to-95% ratio charges each strategy its wall clock, so the search's own work (descents,
rounding, scoring the pool, statistics, the cost model's refit) counts beside building and timing
kernels. This script runs the strategies on the replay oracle (:class:`felixjax.testing.SyntheticOracle`,
no kernels built, so what is left is the search's own time), interleaved per round as ``fj.compare``
runs them, after an untimed warm-up that pays the JIT compilations, and reports per strategy the mean
seconds per round spent in ``propose`` and in ``update`` (the session's ``TaskRun.stats``).

With ``--profile`` it also profiles the gradient search's ``propose`` (cProfile, which sees one thread:
the gradient searches then run with ``workers=1``; cumulative seconds
per round of its parts: the descents, rounding, scoring the pool, the ±1 neighbourhood, the rounding
statistics and the soft/hard tau of the picks).

    python benchmarks/search_overhead.py                                   # fresh suite, 2 seeds x 128
    python benchmarks/search_overhead.py --ops 'matmul:m=257;n=96;k=384' --seeds 1 --profile
    python benchmarks/search_overhead.py --strategies gradient,gradient_stats,genetic@32
    python benchmarks/search_overhead.py --strategies gradient,gradient_noflat,genetic@32 --seeds 1 --trials 96

With ``--trace FILE`` it also writes every run's measured configs in trial order (JSON); ``--same-as FILE``
compares this run's with such a trace written by another checkout (say, the commit before a speed-up that
should not change what the search proposes) and prints how many runs proposed exactly the same configs:

    git worktree add /tmp/before HEAD~1 && cp benchmarks/search_overhead.py /tmp/before/benchmarks/
    (cd /tmp/before && python benchmarks/search_overhead.py --ops dw_gemv,fresh --seeds 1 --trace /tmp/before.json)
    python benchmarks/search_overhead.py --ops dw_gemv,fresh --seeds 1 --same-as /tmp/before.json

``gradient_serial`` is the gradient search with ``workers=1``: its descents, and then its sketches' rounding and
scoring, one after another instead of in threads over the cores (session 66; the same picks).
``gradient_stats`` is the gradient search with its per-round statistics on (``stats=True``, the default
until session 33); the picks are the same with them on or off (tested in tests/test_gradient_levers.py),
so any difference in seconds is the statistics' cost. Timings on a busy machine are noisy: compare the
rows of one run.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import felixjax as fj
from codegen.ops import parse_spec
from felixjax.strategies.gradient import GradientSearch
from felixjax.suites import SUITES, suite

#: the gradient search's parts that ``--profile`` reports (function name in gradient.py / relax.py / model.py)
PARTS = {
    "descents (jitted Adam)": "_run_descent",
    "rounding (round_points)": "round_points",
    "scoring (hard features + MLP)": "_score",
    "±1 neighbourhood": "neighbours_x",
    "rounding statistics": "_round_stats",
    "soft scores (statistics)": "_soft_scores",
    "spread picks": "spread_picks",
    "flat (neighbourhood means)": "_flattened",
}


VARIANTS = {"gradient_stats": {"stats": True}, "gradient_noflat": {"flat": 0.0}, "gradient_serial": {"workers": 1}}


def strategy(name: str, serial: bool = False):
    """What ``fj.compare`` is given for a name: ``gradient_stats`` becomes the gradient search with
    ``stats=True``, ``gradient_noflat`` with ``flat=0`` (the default before session 35), ``gradient_serial``
    with ``workers=1`` (its descents and sketches one after another, as before session 66); any other name
    (``NAME@N`` too) is passed as it is. ``serial``: every gradient search with ``workers=1`` (a profile
    sees only this thread)."""
    if name not in VARIANTS and not (serial and name.startswith("gradient")):
        return name
    st = GradientSearch(**{**VARIANTS.get(name, {}), **({"workers": 1} if serial else {})})
    st.name = name
    return st


def parts(profile: cProfile.Profile) -> dict[str, float]:
    """Cumulative seconds of each of :data:`PARTS` in a profile (a part called from another counts in
    both: the rounding statistics call rounding and scoring too)."""
    st = pstats.Stats(profile)
    out = {}
    for label, fn in PARTS.items():
        out[label] = sum(v[3] for k, v in st.stats.items() if k[2] == fn)
    out["propose (all)"] = sum(v[3] for k, v in st.stats.items()
                               if k[2] == "propose" and k[0].endswith("gradient.py"))
    return out


def trace_of(cmp) -> dict[str, list[str]]:
    """Every run's measured configs in trial order, keyed ``task|strategy|seed`` (the replay oracle is
    deterministic, so two checkouts that propose the same configs write the same trace)."""
    return {f"{task}|{label}|{seed}": [repr(r.config) for r in recs]
            for (task, label, seed), recs in sorted(cmp.histories.items())}


def same_picks(ours: dict[str, list[str]], theirs: dict[str, list[str]]) -> dict:
    """How two traces compare: runs in both, runs whose configs are identical in order, and for each run
    that differs the first trial at which it does."""
    common = sorted(set(ours) & set(theirs))
    differ = {}
    for key in common:
        a, b = ours[key], theirs[key]
        if a != b:
            differ[key] = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return {"runs": len(common), "identical": len(common) - len(differ), "first_difference": differ,
            "only_one_side": sorted(set(ours) ^ set(theirs))}


def tasks_of(ops: str) -> list:
    """The tasks of ``--ops``: suite names or op specs (``;`` between an op's fields), comma-separated."""
    return [t for spec in ops.split(",") for t in (suite(spec) if spec in SUITES else [parse_spec(spec.replace(";", ","))])]


def warm_up(tasks: list, strategies: list) -> None:
    """The JIT warm-up, untimed: every strategy once on the first op (64 trials, seed 99, replayed)."""
    fj.compare(tasks[:1], strategies, trials=64, seeds=[99], db=None, replay=True, progress=False, remeasure=0,
               defaults=False)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default="fresh", help="suite names or op specs (';' between an op's fields), comma-separated (default fresh)")
    ap.add_argument("--strategies", default="gradient,gradient_stats,genetic@32",
                    help="comma-separated: gradient, gradient_stats, gradient_noflat, gradient_serial, genetic, NAME@N")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--trials", type=int, default=128)
    ap.add_argument("--profile", action="store_true",
                    help="profile the gradient search's propose by part (its work then in one thread: workers=1)")
    ap.add_argument("--trace", help="write every run's measured configs in trial order to this JSON file")
    ap.add_argument("--same-as", help="compare the runs' configs with a trace written by --trace (another checkout)")
    args = ap.parse_args(argv)
    tasks = tasks_of(args.ops)
    names = args.strategies.split(",")
    warm_up(tasks, [strategy(n, args.profile) for n in names])
    prof = cProfile.Profile() if args.profile else None
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    cmp = fj.compare(tasks, [strategy(n, args.profile) for n in names], trials=args.trials, seeds=args.seeds, db=None,
                     replay=True, progress=False, remeasure=0, defaults=False)
    if prof:
        prof.disable()
    wall = time.perf_counter() - t0
    print(f"replay oracle, {len(tasks)} ops x {args.seeds} seeds x {args.trials} trials, no defaults first; "
          f"{wall:.0f} s in all\n")
    print("| strategy | rounds | propose s / round | update s / round | propose + update s / run |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for n in names:
        runs = [s for (_, label, _), s in cmp.stats.items() if label == n]
        rounds = sum(s["rounds"] for s in runs)
        prop = sum(s["propose_s"] for s in runs)
        upd = sum(s["update_s"] for s in runs)
        print(f"| {n} | {rounds} | {prop / rounds:.3f} | {upd / rounds:.3f} | {(prop + upd) / len(runs):.2f} |")
    if args.trace:
        Path(args.trace).write_text(json.dumps(trace_of(cmp)))
    if args.same_as:
        cmpd = same_picks(trace_of(cmp), json.loads(Path(args.same_as).read_text()))
        print(f"\nsame configs as {args.same_as}: {cmpd['identical']} of {cmpd['runs']} runs identical in trial order"
              + (f"; first differences: {cmpd['first_difference']}" if cmpd["first_difference"] else "")
              + (f"; in one trace only: {cmpd['only_one_side']}" if cmpd["only_one_side"] else ""))
    if prof:
        rounds = sum(s["rounds"] for (_, label, _), s in cmp.stats.items() if label.startswith("gradient"))
        print(f"\ngradient searches' propose by part (cumulative seconds per round, {rounds} rounds; "
              f"a part inside another counts in both):\n")
        for label, sec in parts(prof).items():
            print(f"- {label}: {sec / max(rounds, 1):.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
