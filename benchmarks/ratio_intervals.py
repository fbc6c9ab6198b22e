"""How much do three seeds per op pin down an ablation's or a comparison's geomean ratios? (issue 15)

Reads the per-trial CSV a comparison or a measured ablation writes (``cmp.csv``, or the gzipped copies
under ``docs/data/``) and prints, for every strategy (arm) over ``--ref``, the geomean over ops of the
ratio of per-op medians (trials and seconds to 95% of the best any run of the file found, final latency:
the median of a run's re-timings where the file has them, else its best while tuning), as
:meth:`felixjax.compare.Comparison.ratios` computes them, beside a percentile bootstrap interval over each
op's seeds (:func:`felixjax.compare.bootstrap_ratios`). A censored run (never within 5%) enters at the
trials and seconds it spent, as in the tables. Nothing is measured.

Files of one suite with different seeds (``--csv`` repeated) are pooled as more seeds of the same ops (each
file's own best known decides its runs' reach); files of different suites, as more ops. A repeat of the same
seeds in another file pools the same way (as more runs: timing noise makes a repeat a new run). ``--arms`` keeps
only the named arms (and ``--ref``), so files whose other arms differ pool on the arms they share. ``--ops``
keeps only the ops whose names start with one of its prefixes (an op family pooled across suites' files, e.g.
``--ops dwconv2d``); each file's 95% is still taken per op, so the filter changes no run's reach.

``--bound`` asks how far a perfect lever could take ``--ref`` on these very runs (session 68): each of its runs is
rewritten as if the lever had been perfect, the other arms stay as measured, and the geomeans and intervals are
taken again (``--batch``: the trials of a round in these runs). ``later-rounds``: a run that misses 95% in its
first round reaches it on the first trial of its second (the most any lever acting after the first round can buy);
``first-order``: a run whose first round holds a config within 95% measures it first (a perfect order of the first
round, the same picks); ``rest-order``: the first round's trials after its first ``--chunk`` in a perfect order (the
most a re-ranking of the round's rest by its first results as they arrive could buy); ``every-order``: each round
in a perfect order; ``both``: ``later-rounds`` and ``first-order`` together; ``oracle``: every run there at its
first trial (no search can do better: the ceiling of the ratios themselves). Seconds are the run's own clock at the
rewritten trial. The bar (95% of the file's best) is held where it is: a lever that found faster kernels than any
run did would also move it. ``sooner:K`` (session 69) is a better search rather than a perfect one: each run's
trials after its first round, until 95%, divided by K (a run that never got there counted as getting there on its
last trial: optimistic, so the K a target turns out to need is the least that could do).

Runs that measured the defaults first (a comparison with ``--defaults on``; its CSV marks them in the column
``opening`` since session 69) keep that shared opening where it is under every bound: the search's own picks start
after it, and a run the opening already took within 95% stays as measured. The ops whose opening alone reaches 95%
are left out, as the headline reports them apart (``--keep-apart``: kept); files without the column have none.

``--settled first`` keeps the ops where at least half of all runs (every arm kept, as measured) reached 95% within
their first round (``--batch`` trials), ``--settled later`` the others: the ops the opening round decides and the
ops the search's later rounds do.

    python benchmarks/ratio_intervals.py --csv docs/data/ablation_evo_s48/fresh_seeds0-2.csv.gz \
        --ref gradient_pre_b32_spread4_flat
    python benchmarks/ratio_intervals.py --csv results/ablation_fresh_deep_s49/cmp.csv --ref gradient_pre_b32_spread4_flat
    python benchmarks/ratio_intervals.py --csv docs/data/own_s67/fresh.csv.gz --ref gradient_pre_b32_spread4_flat \
        --paired --bound later-rounds
"""
from __future__ import annotations

import argparse
import csv
import functools
import gzip
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from felixjax.compare import METRICS, REACH, bootstrap_ratios


def read_rows(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="") as f:
        return list(csv.DictReader(f))


BOUNDS = ("later-rounds", "first-order", "rest-order", "every-order", "both", "oracle")


def sooner_factor(bound: str) -> float | None:
    """``K`` of a bound named ``sooner:K`` (K >= 1), None for the other names; ValueError for a bad K."""
    if not bound.startswith("sooner:"):
        return None
    try:
        k = float(bound.split(":", 1)[1])
    except ValueError:
        k = math.nan
    if not k >= 1 or not math.isfinite(k):
        raise ValueError(f"{bound!r}: K in sooner:K must be a number >= 1")
    return k


def bound_name(text: str) -> str:
    """``--bound``'s type: one of :data:`BOUNDS` or ``sooner:K``."""
    if text not in BOUNDS:
        try:
            sooner_factor(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if not text.startswith("sooner:"):
            raise argparse.ArgumentTypeError(f"unknown bound {text!r}: one of {BOUNDS} or sooner:K")
    return text


def bounded(hits: list[bool], bound: str, batch: int, chunk: int = 8, opening: int = 0) -> int | None:
    """The index of a run's first trial within 95% had a perfect lever ``bound`` (:data:`BOUNDS`) steered it
    (``hits``: each trial within 95% or not, in trial order; None: it still never gets there). ``opening``: the
    run's first trials that are the shared opening (the defaults every run measures first, at the head of its
    first round): no lever of the search moves them, so its own picks start after them.

    ``sooner:K`` is not a perfect lever but a better one: the trials a run spends after its first round until 95%
    divided by K (rounded down). A run that never got there is taken as getting there on its last trial, then
    sped up: optimistic, so the K this bound says a target needs is the least that could do."""
    first = next((i for i, h in enumerate(hits) if h), None)
    k = sooner_factor(bound)
    if bound not in BOUNDS and k is None:
        raise ValueError(f"unknown bound {bound!r}: one of {BOUNDS} or sooner:K")
    if first is not None and first < opening:  # the opening got there before any pick of the search
        return first
    if k is not None:
        last = len(hits) - 1 if first is None else first
        return first if last < batch else batch + int((last - batch) / k)
    if bound == "oracle":
        return opening if len(hits) > opening else None
    if bound in ("later-rounds", "both") and (first is None or first >= batch) and len(hits) > batch:
        first = batch
    if first is not None and (bound == "every-order" or (bound in ("first-order", "both") and first < batch)):
        first = max(first // batch * batch, opening)
    if bound == "rest-order" and first is not None and max(chunk, opening) <= first < batch:
        first = max(chunk, opening)
    return first


def tune_records(path: Path) -> tuple[dict, dict, dict, set]:
    """One CSV parsed once however many bounds read it: ``(tune, retimed, best, apart)`` with ``tune[(task,
    strategy, seed)]`` the run's ``(trial, elapsed, latency, opening)`` in trial order (``opening``: the config is
    one of the task's shared opening; False in files written before session 69, which do not say),
    ``retimed[(task, strategy, seed)]`` its final re-timings, ``best[task]`` the lowest latency of any row and
    ``apart`` the tasks whose opening alone reaches 95% of it (the median over the compared runs of their best
    opening latency, as :meth:`felixjax.compare.Comparison.opening_reaches`: the headline reports them apart).
    Shared: read, do not change."""
    st = path.stat()
    return _parse(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=64)
def _parse(path: str, _mtime_ns: int, _size: int) -> tuple[dict, dict, dict, set]:
    tune: dict = defaultdict(list)
    retimed: dict = defaultdict(list)
    best: dict = defaultdict(lambda: math.inf)
    for r in read_rows(Path(path)):
        lat = float(r["latency_s"]) if r["latency_s"] else math.inf
        key = (r["task"], r["strategy"], r["seed"])
        if r["phase"] == "remeasure":
            if math.isfinite(lat):
                retimed[key].append(lat)
            continue
        best[r["task"]] = min(best[r["task"]], lat)
        if r["phase"] in ("tune", "reference"):  # the reference runs' under their reserved names (reference:*)
            tune[key].append((int(r["trial"]), float(r["elapsed_s"] or 0.0), lat, r.get("opening") == "1"))
    openings: dict = defaultdict(list)
    for (task, strategy, _), recs in tune.items():
        recs.sort()
        if not strategy.startswith("reference:") and any(o for *_, o in recs):
            openings[task].append(min(lat for *_, lat, o in recs if o))
    apart = {t: float(np.median(v)) <= best[t] / REACH for t, v in openings.items()}
    return dict(tune), dict(retimed), dict(best), {t for t, a in apart.items() if a}


def runs_from_csv(path: Path, tag: str = "", bound: str | None = None, of: str | None = None, batch: int = 32,
                  chunk: int = 8, keep_apart: bool = False,
                  references: bool = False) -> dict[tuple[str, str], dict[str, list[float]]]:
    """``{(task, strategy): {metric: [one value per seed]}}`` from one CSV (seeds tagged with ``tag`` so
    several files pool); 95% is taken against the best latency of any row of the task in the file. With
    ``bound``, the runs of strategy ``of`` reach it where :func:`bounded` says (rounds of ``batch`` trials, each
    run's shared opening held where it is). The tasks whose opening alone reaches 95% are left out (the
    headline's rule; ``keep_apart``: kept). ``references``: the reference runs (a comparison's 2x-budget runs under
    the reserved names ``reference:<strategy>``) as the arms, by their strategies' names, instead of the compared
    runs: the same comparison at twice the budget, judged against the same best."""
    tune, retimed, best, apart = tune_records(path)
    out: dict = defaultdict(lambda: {m: [] for m in METRICS})
    for (task, name, seed), recs in sorted(tune.items()):  # one tag per file: the seeds sort as tagged
        if name.startswith("reference:") != references or (task in apart and not keep_apart):
            continue
        strategy = name.removeprefix("reference:")
        bar = best[task] / REACH
        hits = [lat <= bar for _, _, lat, _ in recs]
        opening = next((i for i, rec in enumerate(recs) if not rec[3]), len(recs))
        hit = bounded(hits, bound, batch, chunk, opening) if bound is not None and strategy == of else next(
            (i for i, h in enumerate(hits) if h), None)
        i = len(recs) - 1 if hit is None else hit
        cell = out[(task, strategy)]
        cell["trials95"].append(i + 1)
        cell["seconds95"].append(recs[i][1])
        times = retimed.get((task, name, seed))
        cell["final"].append(float(np.median(times)) if times else min(lat for _, _, lat, _ in recs))
    return dict(out)


def pooled(paths: list[Path], keep: set | None = None, prefixes: tuple | None = None, **bound) -> dict:
    """Every file's runs (:func:`runs_from_csv`, ``bound`` and ``keep_apart`` passed on) as more seeds of the same
    ops; only the arms in ``keep`` and the ops starting with one of ``prefixes`` (None: all). An op whose opening
    reaches 95% in one file is left out of that file's runs only (each file's own best decides)."""
    runs: dict = {}
    for i, path in enumerate(paths):
        for key, cell in runs_from_csv(path, tag=f"{i}:", **bound).items():
            if (keep is not None and key[1] not in keep) or (prefixes is not None and not key[0].startswith(prefixes)):
                continue
            mine = runs.setdefault(key, {m: [] for m in METRICS})
            for m in METRICS:
                mine[m] += cell[m]
    return runs


def apart_ops(paths: list[Path]) -> list[str]:
    """The ops of these files whose shared opening alone reaches 95% (in any of them), sorted."""
    return sorted(set().union(*(tune_records(p)[3] for p in paths)))


def settled_first(runs: dict, batch: int) -> set[str]:
    """The ops at least half of whose runs (every arm) reached 95% within their first ``batch`` trials."""
    trials: dict = defaultdict(list)
    for (task, _), cell in runs.items():
        trials[task] += cell["trials95"]
    return {t for t, got in trials.items() if 2 * sum(x <= batch for x in got) >= len(got)}


def settled_part(runs: dict, first: set[str], part: str) -> dict:
    """``runs`` of all ops (``part`` 'all'), of the ops in ``first`` ('first') or of the others ('later')."""
    return runs if part == "all" else {k: v for k, v in runs.items() if (k[0] in first) == (part == "first")}


def point_ratios(runs: dict, ref: str) -> dict[str, dict[str, float]]:
    """The tables' geomean over ops of ``strategy / ref`` per-op medians (no resampling)."""
    tasks = sorted({t for t, _ in runs})
    out = {}
    for s in sorted({s for _, s in runs} - {ref}):
        both = [t for t in tasks if (t, s) in runs and (t, ref) in runs]
        out[s] = {m: math.exp(np.mean([math.log(np.median(runs[(t, s)][m]) / np.median(runs[(t, ref)][m]))
                                       for t in both])) for m in METRICS}
        out[s]["ops"] = len(both)
    return out


def early_table(runs: dict, within: tuple[int, ...] = (8, 16, 32)) -> str:
    """Per strategy, how many of its runs reached 95% within the first ``within`` trials (a batch of that size: a
    run that gets there inside its first round got there on the model it opened with), and the median trials."""
    out = ["| strategy | runs | " + " | ".join(f"95% within {w} trials" for w in within) + " | median trials to 95% |",
           "| --- | ---: | " + " | ".join("---:" for _ in within) + " | ---: |"]
    for s in sorted({s for _, s in runs}):
        trials = np.concatenate([runs[k]["trials95"] for k in runs if k[1] == s])
        out.append(f"| {s} | {len(trials)} | " + " | ".join(str(int((trials <= w).sum())) for w in within)
                   + f" | {np.median(trials):g} |")
    return "\n".join(out)


def per_op_table(runs: dict, ref: str) -> str:
    """Per op: each strategy's median trials to 95% over its seeds with how many runs got there before the
    budget (a run censored at its budget, or reaching 95% on its very last trial, counts as not reached; ``>``:
    most did not), and the final latency of each strategy over ``ref`` (geomean of seed-paired ratios)."""
    strategies = [ref] + sorted({s for _, s in runs} - {ref})
    budget = max(max(cell["trials95"]) for cell in runs.values())
    out = ["| op | " + " | ".join(f"{s}: median trials (reached)" for s in strategies) + " | "
           + " | ".join(f"final, {s} / {ref}" for s in strategies[1:]) + " |",
           "| --- | " + " | ".join("---:" for _ in strategies[1:] + strategies[1:]) + " | ---: |"]
    for task in sorted({t for t, _ in runs}):
        cells, finals = [], []
        for s in strategies:
            trials = np.asarray(runs.get((task, s), {}).get("trials95", []))
            got = int((trials < budget).sum())
            cells.append(f"{'>' if 2 * got < len(trials) else ''}{np.median(trials):g} ({got}/{len(trials)})"
                         if len(trials) else "—")
        for s in strategies[1:]:
            a, b = runs.get((task, s), {}).get("final", []), runs[(task, ref)]["final"] if (task, ref) in runs else []
            finals.append(f"{math.exp(np.mean(np.log(np.asarray(a) / np.asarray(b)))):.3f}" if a and len(a) == len(b)
                          else "—")
        out.append(f"| {task} | " + " | ".join(cells) + " | " + " | ".join(finals) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--csv", type=Path, action="append", required=True, help="a per-trial CSV (.csv or .csv.gz); "
                    "repeat to pool")
    ap.add_argument("--ref", required=True, help="the strategy (arm) ratios are taken over")
    ap.add_argument("--n", type=int, default=2000, help="bootstrap resamples (default 2000)")
    ap.add_argument("--level", type=float, default=0.9, help="central share of the resamples (default 0.9)")
    ap.add_argument("--paired", action="store_true", help="resample each op's seeds jointly for every arm (arms "
                    "that share their random numbers seed by seed: ablations since session 51)")
    ap.add_argument("--early", action="store_true", help="also print how many runs of each strategy reached 95%% "
                    "within their first 8 / 16 / 32 trials (censored runs count at their budget)")
    ap.add_argument("--per-op", action="store_true", help="also print each op's median trials to 95%% per "
                    "strategy (runs reached) and its final latency over --ref (seed-paired)")
    ap.add_argument("--arms", default=None, help="comma-separated strategies to keep (with --ref), e.g. to pool "
                    "files whose other arms differ; each file's 95%% is still taken against all of its arms")
    ap.add_argument("--ops", default=None, help="comma-separated prefixes of op names to keep (e.g. "
                    "'dwconv2d,dense': one op family across files); default: every op")
    ap.add_argument("--bound", type=bound_name, default=None, help="rewrite --ref's runs as a perfect lever would "
                    "have steered them, or (sooner:K) with the trials after the first round K times fewer (see "
                    "above); the other arms as measured")
    ap.add_argument("--batch", type=int, default=32, help="trials per round in these runs (--bound, --settled; "
                    "default 32)")
    ap.add_argument("--chunk", type=int, default=8, help="results that arrive together (--bound rest-order; default "
                    "8, the measurer's build_chunk)")
    ap.add_argument("--settled", choices=("first", "later"), default=None, help="keep the ops at least half of whose "
                    "runs reached 95%% within their first round (first), or the others (later)")
    ap.add_argument("--references", action="store_true", help="the comparison's reference runs (2x the budget, "
                    "reference:*) as the arms instead of its compared runs: the same strategies at twice the budget, "
                    "fewer runs censored")
    ap.add_argument("--keep-apart", action="store_true", help="keep the ops whose shared opening (the defaults "
                    "measured first, marked in CSVs since session 69) alone reaches 95%%; default: left out, as the "
                    "headline reports them apart")
    args = ap.parse_args(argv)
    if args.batch < 1 or args.chunk < 1:
        ap.error("--batch and --chunk must be at least 1")
    prefixes = None if args.ops is None else tuple(p.strip() for p in args.ops.split(",") if p.strip())
    keep = None if args.arms is None else {a.strip() for a in args.arms.split(",") if a.strip()} | {args.ref}
    missing = [p for p in args.csv if not p.exists()]
    if missing:
        ap.error(f"{missing[0]}: no such file")
    runs = pooled(args.csv, keep, prefixes, bound=args.bound, of=args.ref, batch=args.batch, chunk=args.chunk,
                  keep_apart=args.keep_apart, references=args.references)
    if args.settled is not None:
        measured = (pooled(args.csv, keep, prefixes, keep_apart=args.keep_apart, references=args.references)
                    if args.bound else runs)
        first = settled_first(measured, args.batch)
        runs = settled_part(runs, first, args.settled)
        if not runs:
            ap.error(f"--settled {args.settled}: no op of these files")
    if prefixes is not None and not runs:
        ap.error(f"--ops {args.ops!r}: no op of these files starts with it")
    if not any(s == args.ref for _, s in runs):
        ap.error(f"--ref {args.ref!r} is not a strategy of these files: {sorted({s for _, s in runs})}")
    if keep is not None and keep - {s for _, s in runs}:
        ap.error(f"--arms {sorted(keep - {s for _, s in runs})} not among these files' strategies")
    try:
        spans = bootstrap_ratios(runs, args.ref, n=args.n, level=args.level, paired=args.paired)
    except ValueError as e:  # paired arms with different numbers of runs: files whose arms differ
        ap.error(f"{e} (to pool files whose arms differ, keep the shared ones with --arms)")
    points = point_ratios(runs, args.ref)
    apart = apart_ops(args.csv)
    print(f"{', '.join(map(str, args.csv))}: strategy / {args.ref}, geomean over ops of per-op medians; "
          f"[{args.level:.0%} bootstrap interval over each op's seeds, {args.n}"
          f"{' seed-paired' if args.paired else ''} resamples]"
          + ("; the reference runs (2x the budget) as the arms" if args.references else "")
          + (f"; {args.ref} bounded: {args.bound} (rounds of {args.batch})" if args.bound else "")
          + (f"; ops settled in the {args.settled} round(s)" if args.settled else "")
          + (f"; {'kept' if args.keep_apart else 'left out'}, the opening alone reaches 95%: {', '.join(apart)}"
             if apart else "") + "\n")
    print("| strategy | ops | seeds per op | trials to 95% | seconds to 95% | final latency |\n"
          "|---|---:|---:|---:|---:|---:|")
    for s, p in points.items():
        seeds = sorted({len(runs[k]["trials95"]) for k in runs if k[1] == s})
        cells = [f"{p[m]:.2f}x [{spans[s][m][0]:.2f}, {spans[s][m][1]:.2f}]" for m in METRICS]
        print(f"| {s} | {p['ops']} | {'/'.join(map(str, seeds))} | " + " | ".join(cells) + " |")
    if args.early:
        print("\n" + early_table(runs))
    if args.per_op:
        print("\n" + per_op_table(runs, args.ref))
    return 0


if __name__ == "__main__":
    sys.exit(main())
