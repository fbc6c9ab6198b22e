"""How far could any lever take the gradient search on runs already measured? (issue 15, session 68)

Reads per-trial CSVs of seed-paired runs (an ablation's or a comparison's; ``--csv`` repeated pools them as
``ratio_intervals.py`` does) and prints one table: the ratios ``strategy / --ref`` (trials and seconds to 95% of the
best any run of the file found, final latency; geomean over ops of per-op medians, with seed-paired bootstrap
intervals) as measured, and again with ``--ref``'s runs rewritten as each perfect lever of
:data:`benchmarks.ratio_intervals.BOUNDS` would have steered them: a perfect search after the first round
(``later-rounds``), a perfect order of the first round's own picks (``first-order``), a perfect re-ranking of the
first round after its first ``--chunk`` results (``rest-order``), every round in a perfect order, ``later-rounds``
with ``first-order``, and an oracle whose first measurement is within 95% (the ceiling of any search). The other
arms stay as measured. Each row also for the ops the first round settles (at least half of all runs within 95% in
their first ``--batch`` trials) and for the others. With ``--plot``, the trials ratios as bars with their intervals
and the 3x target. Measures nothing.

Runs that measured the defaults first (a comparison with ``--defaults on``; CSVs written since session 69 mark
them, column ``opening``) keep that opening where it is: every bound reorders only the search's own picks, which
start after it, and a run the opening already took within 95% stays as measured. The ops whose opening alone
reaches 95% are left out as the headline leaves them out (``--keep-apart``: kept).

``--sooner 2,4,8`` adds a row per K for a better rather than perfect later search: ``--ref``'s trials after its
first round, until 95%, K times fewer (``ratio_intervals``' ``sooner:K``; optimistic for runs that never got
there), which says how much better the rounds after the first would have to be for a target.

``--others first-order`` (session 72) rewrites every other arm too, the same way in every row: a lever that is the
cost model's rather than the search's (a better ranking of the first round's picks) goes to every search that ranks
with that model, as issue 15's equally equipped genetic search does. Every arm is taken in rounds of ``--batch``
(so a file's arm with another round size, genetic at 64 per round, is not rewritten faithfully: read the arms
that share the batch).

    python benchmarks/lever_bounds.py --csv docs/data/own_s67/fresh.csv.gz --csv docs/data/own_s67/dwg.csv.gz \\
        --csv docs/data/own_s67/ops.csv.gz --ref gradient_pre_b32_spread4_flat --plot docs/img/bounds.png
    python benchmarks/lever_bounds.py --csv results/headline_on.csv --ref gradient --arm genetic@32 --sooner 2,4,8
    python benchmarks/lever_bounds.py --csv results/headline_off.csv --ref gradient --arm genetic@32 --others first-order
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.ratio_intervals import (
    BOUNDS,
    apart_ops,
    bound_name,
    point_ratios,
    pooled,
    settled_first,
    settled_part,
    sooner_factor,
    tune_records,
)
from felixjax.compare import METRICS, bootstrap_ratios

ROWS = ("measured",) + BOUNDS
WHAT = {"measured": "as measured",
        "later-rounds": "a perfect search after the first round",
        "first-order": "the first round's picks in a perfect order",
        "rest-order": "the first round's rest in a perfect order after its first chunk",
        "every-order": "every round's picks in a perfect order",
        "both": "first-order and later-rounds together",
        "oracle": "every run there at its first trial (after the opening)"}


def what(bound: str) -> str:
    """A bound's row label."""
    k = sooner_factor(bound)
    return WHAT[bound] if k is None else f"the trials after the first round {k:g}x fewer"


def bound_rows(paths: list[Path], ref: str, *, batch: int = 32, chunk: int = 8, n: int = 2000,
               level: float = 0.9, keep_apart: bool = False, sooner: tuple[float, ...] = (),
               others: str | None = None) -> list[dict]:
    """One dict per (bound, ops): ``bound``, ``ops`` ('all', 'first', 'later'), ``n_ops`` and, per other strategy,
    ``{metric: (point, low, high)}`` under ``strategy``; the bounds of :data:`ROWS`, then ``sooner:K`` for each K
    of ``sooner``. ``others``: a bound every other arm's runs are rewritten with in every row (a lever all the
    compared searches would share, such as a better first-round ranking by the cost model they all use); None:
    the other arms as measured. Which ops the first round settles is decided on the runs as measured."""
    measured = pooled(paths, keep_apart=keep_apart)
    if not any(s == ref for _, s in measured):
        raise ValueError(f"{ref!r} is not a strategy of these files: {sorted({s for _, s in measured})}")
    first = settled_first(measured, batch)
    fixed = {}  # the other arms' runs, the same in every row
    for arm in sorted({s for _, s in measured} - {ref}):
        arm_runs = measured if others is None else pooled(paths, bound=others, of=arm, batch=batch, chunk=chunk,
                                                          keep_apart=keep_apart)
        fixed.update({k: v for k, v in arm_runs.items() if k[1] == arm})
    out = []
    for bound in ROWS + tuple(f"sooner:{k:g}" for k in sooner):
        runs = measured if bound == "measured" else pooled(paths, bound=bound, of=ref, batch=batch, chunk=chunk,
                                                           keep_apart=keep_apart)
        runs = {**{k: v for k, v in runs.items() if k[1] == ref}, **fixed}
        for ops in ("all", "first", "later"):
            part = settled_part(runs, first, ops)
            if not part:
                continue
            points = point_ratios(part, ref)
            spans = bootstrap_ratios(part, ref, n=n, level=level, paired=True)
            row = {"bound": bound, "ops": ops, "n_ops": len({t for t, _ in part})}
            for s, p in points.items():
                row[s] = {m: (p[m], *spans[s][m]) for m in METRICS}
            out.append(row)
    return out


def first_result_seconds(paths: list[Path], keep_apart: bool = False) -> dict[str, float]:
    """Per strategy, the median over its runs of the run's clock at its first result (what every bound's seconds
    start from: no lever that keeps the search's own work and the builds can bring a run's first result sooner);
    the ops the bounds leave out are left out here too."""
    got: dict[str, list[float]] = {}
    for path in paths:
        tune, _, _, apart = tune_records(path)
        for (task, strategy, _), recs in tune.items():
            if recs[0][0] == 0 and not strategy.startswith("reference:") and (keep_apart or task not in apart):
                got.setdefault(strategy, []).append(recs[0][1])
    return {s: float(np.median(v)) for s, v in sorted(got.items())}


def _cell(v: tuple) -> str:
    return f"{v[0]:.2f}x [{v[1]:.2f}, {v[2]:.2f}]"


def table(rows: list[dict], strategy: str) -> str:
    out = [f"| {strategy} / ref, ref rewritten as | ops | trials to 95% | seconds to 95% | final latency |",
           "| --- | --- | ---: | ---: | ---: |"]
    names = {"all": "all", "first": "settled in round 1", "later": "settled later"}
    for r in rows:
        if strategy in r:
            out.append(f"| {r['bound']}: {what(r['bound'])} | {names[r['ops']]} ({r['n_ops']}) | "
                       + " | ".join(_cell(r[strategy][m]) for m in METRICS) + " |")
    return "\n".join(out)


def plot(rows: list[dict], strategy: str, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bounds = list(dict.fromkeys(r["bound"] for r in rows))
    fig, ax = plt.subplots(figsize=(8 + 0.6 * max(0, len(bounds) - len(ROWS)), 4))
    width = 0.27
    for j, (ops, colour) in enumerate((("all", "tab:blue"), ("first", "tab:green"), ("later", "tab:orange"))):
        got = {r["bound"]: r for r in rows if r["ops"] == ops and strategy in r}
        xs = [i + (j - 1) * width for i, b in enumerate(bounds) if b in got]
        vals = [got[b][strategy]["trials95"] for b in bounds if b in got]
        if not vals:
            continue
        n_ops = next(iter(got.values()))["n_ops"]
        ax.bar(xs, [v[0] for v in vals], width, color=colour,
               label={"all": "all ops", "first": "ops settled in round 1", "later": "ops settled later"}[ops]
               + f" ({n_ops})",
               yerr=[[v[0] - v[1] for v in vals], [v[2] - v[0] for v in vals]], capsize=2)
    ax.axhline(3.0, color="red", ls="--", lw=1, label="issue 15's target (3x)")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(bounds)), bounds, fontsize=7)
    ax.set_ylabel(f"trials to 95%: {strategy} / ref", fontsize=8)
    ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--csv", type=Path, action="extend", nargs="+", required=True,
                    help="per-trial CSVs (several after one --csv, or --csv repeated): pooled")
    ap.add_argument("--ref", required=True, help="the arm rewritten (the gradient search)")
    ap.add_argument("--batch", type=int, default=32, help="trials per round in these runs (default 32)")
    ap.add_argument("--chunk", type=int, default=8, help="results that arrive together (default 8)")
    ap.add_argument("--n", type=int, default=2000, help="bootstrap resamples (default 2000)")
    ap.add_argument("--plot", type=Path, default=None, help="write the trials ratios as a bar chart (PNG)")
    ap.add_argument("--title", default="", help="the plot's title")
    ap.add_argument("--arm", default=None, help="the arm the plot shows over --ref (default: the first other arm)")
    ap.add_argument("--sooner", default="", help="comma-separated K (>= 1): add a row per K with --ref's trials "
                    "after its first round K times fewer")
    ap.add_argument("--others", type=bound_name, default=None, help="rewrite every other arm's runs with this "
                    "bound in every row (e.g. first-order: a better first-round ranking, which every search using "
                    "the same cost model would get; default: the other arms as measured)")
    ap.add_argument("--keep-apart", action="store_true", help="keep the ops whose opening alone reaches 95%% "
                    "(default: left out, as the headline leaves them out)")
    args = ap.parse_args(argv)
    missing = [p for p in args.csv if not p.exists()]
    if missing:
        ap.error(f"{missing[0]}: no such file")
    if args.batch < 1 or args.chunk < 1:
        ap.error("--batch and --chunk must be at least 1")
    try:
        sooner = tuple(float(k) for k in args.sooner.split(",") if k.strip())
    except ValueError:
        ap.error(f"--sooner {args.sooner!r}: comma-separated numbers >= 1")
    if any(not 1 <= k < float("inf") for k in sooner):
        ap.error(f"--sooner {args.sooner!r}: every K must be >= 1")
    try:
        rows = bound_rows(args.csv, args.ref, batch=args.batch, chunk=args.chunk, n=args.n, keep_apart=args.keep_apart,
                          sooner=sooner, others=args.others)
    except ValueError as e:  # no such --ref, or paired arms with different numbers of runs
        ap.error(str(e))
    others = [s for s in rows[0] if s not in ("bound", "ops", "n_ops")]
    if not others:
        ap.error(f"--ref {args.ref!r}: no other arm in these files to compare with")
    apart = apart_ops(args.csv)
    print(f"{len(args.csv)} file(s): {', '.join(map(str, args.csv))}; {args.ref}'s runs rewritten, the other arms "
          + ("as measured" if args.others is None else f"rewritten as {args.others} ({what(args.others)}) in every row")
          + f"; rounds of {args.batch}, chunks of {args.chunk}; 90% seed-paired bootstrap intervals, "
          f"{args.n} resamples"
          + (f"; {'kept' if args.keep_apart else 'left out'}, the opening alone reaches 95%: {', '.join(apart)}"
             if apart else "") + "\n")
    for s in others:
        print(table(rows, s) + "\n")
    print("first result at (median over runs): " + ", ".join(f"{s} {v:.2f} s"
                                                             for s, v in first_result_seconds(
                                                                 args.csv, args.keep_apart).items()))
    if args.arm is not None and args.arm not in others:
        ap.error(f"--arm {args.arm!r}: not one of {others}")
    if args.plot:
        arm = args.arm or others[0]
        plot(rows, arm, args.plot, args.title or f"{arm} / {args.ref}: perfect levers on measured runs"
             + ("" if args.others is None else f" ({arm} as {args.others})"))
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
