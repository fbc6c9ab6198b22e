"""Search benchmark (issue 4): gradient vs genetic (and random) search on the op suite, same budgets.

For every operator (``benchmarks/kernels.py``'s ``SUITE``, cheapest first), ``fj.compare`` runs every
strategy x seed with the same budget in trials and seconds (whichever ends first), interleaved round
by round so machine drift hits every strategy alike, through the real runner (every kernel built,
checked against numpy and timed); then every run's final best is re-timed, interleaved. The results of
all operators are merged into one ``felixjax.compare.Comparison``: its table (final best, trials and
seconds to reach 95% of the best latency any strategy found, censored runs marked ``>``, geomean
ratios) and its plot (best so far against trials and against seconds, median and band over seeds).

Target (issue 4): gradient reaches 95% of the best-known latency in >= 3x fewer trials and >= 3x less
wall time than genetic (geomean over operators), and its final best is no worse (geomean of genetic's
final re-timed latency over gradient's >= 1.0). The script reports met / missed with the numbers; a
geomean involving censored medians is a bound, and is flagged.

``--replay`` swaps the hardware for the synthetic oracle of ``felixjax.testing`` (no building or timing;
each trial costs a simulated 0.3 s on its run's clock): search logic alone, repeatably, in minutes. It
writes its own section (``compare_replay`` markers), never the measured one; so does ``--cost-model``
(``compare_pretrained``), where both strategies start from the same pretrained MLP.

``--budget-min`` bounds the whole run: each operator gets an equal share of what is left, split evenly
over its strategy x seed runs as their seconds budget (replay: trials only; operators not started
before the deadline are skipped and listed).

Issue 15 judges against a strong reference (``--reference``, on by default): per op, every strategy x
seed again with 2x the budget under reserved run names (``reference:*``) that no compared run's history,
budget or cost model sees; "95% of best" is taken against the best latency of the union; the reference's
best is re-timed interleaved with the final bests. Ops whose shared opening (the defaults, with
``--defaults``) already reaches 95% are reported apart; censored medians enter the geomean as flagged
bounds; the headline needs >= 5 ops uncensored for both strategies.

The headline of issue 15 (hours; run it once, on a quiet machine). Since session 32 the gradient search
runs 32 candidates per round, so the default strategies are ``gradient,genetic@32,genetic``: the genetic
search at the same batch (``NAME@N``, :func:`felixjax.compare`) and at Ansor's 64 as the reference row
(sessions 27-29 ran ``--strategies gradient,genetic``, both at 64):

    python benchmarks/compare.py --ops ops,fresh --seeds 3 --trials 256 --threads 1 --defaults both \
        --budget-min 1440 --write

Usage:
    python benchmarks/compare.py                            # full: ops + fresh x 3 seeds x 256 trials + reference
    python benchmarks/compare.py --quick                    # smoke test: 1 small op, 1 seed, 24 trials (~4 min:
                                                            # JIT warm-up, reference runs; ~1 min with
                                                            # --no-reference --warmup 0 --trials 8 --budget-min 2)
    python benchmarks/compare.py --strategies gradient,genetic,random --budget-min 240 --write
    python benchmarks/compare.py --replay --write           # synthetic oracle, its own section
    python benchmarks/compare.py --ops matmul1024,conv28 --seeds 2 --trials 256 --threads 1
    python benchmarks/compare.py --ops ops,fresh --defaults both --out results/headline15 --summarize  # so far
    python benchmarks/compare.py --ops ops,fresh --defaults off --summarize --db ops.jsonl.gz --db fresh.db  # pooled
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # as in benchmarks/kernels.py

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import felixjax as fj  # noqa: E402
from benchmarks.kernels import SUITE, machine_lines, select_ops, write_doc  # noqa: E402
from benchmarks.tune_ops import provenance  # noqa: E402
from codegen.measure import MeasureResult, TimingProtocol  # noqa: E402
from codegen.target import Target  # noqa: E402
from codegen.ops import Task  # noqa: E402
from felixjax.compare import Comparison  # noqa: E402
from felixjax.suites import SUITES, suite  # noqa: E402
from felixjax.testing import ReplayRunner, SyntheticOracle
from felixjax.strategies.base import COST_MODEL_STRATEGIES  # noqa: E402

DOC = ROOT / "docs" / "BENCHMARKS.md"
SECTIONS = {  # mode -> (begin, end, heading, image name)
    "measured": ("<!-- compare:begin -->", "<!-- compare:end -->",
                 "Gradient vs genetic search (benchmarks/compare.py)", "compare_curves.png"),
    "replay": ("<!-- compare_replay:begin -->", "<!-- compare_replay:end -->",
               "Gradient vs genetic search, replayed on the synthetic oracle (benchmarks/compare.py --replay)",
               "compare_replay_curves.png"),
    "pretrained": ("<!-- compare_pretrained:begin -->", "<!-- compare_pretrained:end -->",
                   "Gradient vs genetic search, both from a pretrained cost model (benchmarks/compare.py --cost-model)",
                   "compare_pretrained_curves.png"),
}
for _mode, (_b, _e, _h, _img) in list(SECTIONS.items()):  # the same, with the defaults measured first
    SECTIONS[_mode + "_defaults"] = (_b.replace(":begin", "_defaults:begin"), _e.replace(":end", "_defaults:end"),
                                     _h.replace(" (benchmarks", ", defaults measured first (benchmarks"),
                                     _img.replace("_curves", "_defaults_curves"))
QUICK_OPS = "dense4096"
NEED_TRIALS, NEED_SECONDS, NEED_FINAL = 3.0, 2.0, 1.0  # issue 15's targets (geomean genetic / gradient)
REFERENCE_FACTOR = 2.0  # the reference runs' budget, a multiple of the compared runs'
NEED_UNCENSORED = 5  # the headline needs this many ops where neither strategy's median is censored


def _log(msg: str) -> None:
    print(f"[compare] {msg}", file=sys.stderr, flush=True)


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


def merge(parts: list[Comparison], strategies: list[str], seeds: list[int], trials: int, replay: bool,
          warm_s: float = 0.0) -> Comparison:
    """One Comparison of several (one per operator; per-run seconds budgets differ, so ``seconds`` is None);
    ``warm_s``: the warm-up before the first part, added to the parts' own."""
    histories, remeasured, references, openings, stats, batches, tasks = {}, {}, {}, {}, {}, {}, []
    for c in parts:
        tasks += c.tasks
        histories.update(c.histories)
        remeasured.update(c.remeasured)
        references.update(c.references)
        openings.update(c.openings)
        stats.update(c.stats)
        batches.update(c.batches)
    tasks = sorted(tasks, key=lambda t: t.flops)  # cheapest first, as a run goes (pooled parts interleave)
    # the parts' own warm-ups (each op after the first warms its shapes up), their batches and build caches: the
    # merged table says what every part's did (session 76: they were dropped, and its header contradicted it)
    return Comparison(tasks, strategies, seeds, trials, None, histories, remeasured, replay, references, openings,
                      stats, warmup_s=sum(c.warmup_s for c in parts) + warm_s, batches=batches,
                      shared_cache=any(c.shared_cache for c in parts), resumed=any(c.resumed for c in parts))


def pick_ops(spec: str) -> dict[str, Task]:
    """``--ops``: short names of the op suite (``matmul512``, ...), suite names of ``felixjax.suites``
    (``ops``, ``fresh``) or op specs."""
    out: dict[str, Task] = {}
    rest = []
    for item in filter(None, (x.strip() for x in spec.split(","))):
        if item in SUITES:
            out.update((t.name, t) for t in suite(item))
        else:
            rest.append(item)
    if rest:
        out.update(select_ops(",".join(rest)))
    return out


def pretrained_line(path: Path) -> str:
    """Provenance of a pretrained cost model, from the report ``felixjax pretrain`` writes next to it."""
    import json

    rep_path = Path(str(path) + ".json")
    if not rep_path.exists():
        return f"- cost model: both strategies start from `{_rel(path)}` (no pretraining report next to it)"
    rep = json.loads(rep_path.read_text())
    return (f"- cost model: both strategies start from `{_rel(path)}`, pretrained on {len(rep['train_tasks'])} "
            f"task(s) ({rep['train_rows']} measured configs) of {', '.join(map(_rel, map(Path, rep['databases'])))}; "
            f"on {len(rep['heldout_tasks'])} held-out task(s) its within-task pairwise accuracy is "
            f"{rep['heldout_mlp_pairwise']:.3f} (roofline prior {rep['heldout_prior_pairwise']:.3f})")


def judge(cmp: Comparison) -> str:
    """The genetic run the targets are judged on: at the gradient search's batch (``genetic@N``) when it ran,
    else ``genetic`` (the issue: same batch as gradient, plus a reference row at Ansor's 64)."""
    return next((s for s in cmp.strategies if s.startswith("genetic@")), "genetic")


def verdicts(cmp: Comparison) -> list[str]:
    """Markdown table of issue 15's targets, from the geomean ratios genetic / gradient over the ops
    whose shared opening does not already reach 95% of the best known."""
    g = judge(cmp)
    r = cmp.ratios().get(g)
    lines = [f"| target: {g} / gradient, geomean over ops | measured | required | result |",
             "|---|---:|---:|---|"]
    if r is None:
        return lines + ["| (needs both gradient and genetic) | — | — | not run |"]
    cens = r["censored"]
    bound = (f" ({cens} op(s) with a censored median: a {r['bound']} bound, see the per-op table)" if cens else "")
    enough = r["uncensored"] >= NEED_UNCENSORED
    lines.append(f"| ops uncensored for both (headline needs >= {NEED_UNCENSORED}) | {r['uncensored']} of "
                 f"{r['tasks']} | >= {NEED_UNCENSORED} | {'met' if enough else 'missed: no headline'}"
                 + (f"; apart (opening reaches 95%): {', '.join(r['apart'])}" if r["apart"] else "") + " |")
    for label, value, need in (("trials to 95% of best known", r["trials95"], NEED_TRIALS),
                               ("seconds to 95% of best known", r["seconds95"], NEED_SECONDS)):
        if not math.isfinite(value):
            lines.append(f"| {label} | — | >= {need:.0f}x | no result |")
            continue
        verdict = "met" if value >= need else f"missed ({value:.2f}x < {need:.0f}x)"
        lines.append(f"| {label} | {value:.2f}x | >= {need:.0f}x | {verdict}{bound} |")
    fin = r["final"]
    if math.isfinite(fin):
        verdict = "met" if fin >= NEED_FINAL else f"missed: gradient's final best is {100 * (1 / fin - 1):.1f}% slower"
        lines.append(f"| final best latency, re-timed interleaved (> 1: gradient faster) | {fin:.3f}x | >= 1.0x "
                     f"| {verdict} |")
    else:
        lines.append("| final best latency | — | >= 1.0x | no result |")
    return lines


def per_task_ratios(cmp: Comparison) -> list[str]:
    """Per-operator genetic / gradient ratios behind the geomeans (the judged genetic run's)."""
    g = judge(cmp)
    rows = {(r["task"], r["strategy"]): r for r in cmp.rows()}
    out = [f"| op | trials to 95%: {g} / gradient | seconds to 95%: {g} / gradient "
           f"| final: {g} / gradient |",
           "|---|---:|---:|---:|"]
    for t in cmp.tasks:
        a, b = rows.get((t.name, g)), rows.get((t.name, "gradient"))
        if a is None or b is None:
            continue

        def ratio(k: str) -> str:
            mark = ">" if a[f"{k}_censored"] and not b[f"{k}_censored"] else ("?" if b[f"{k}_censored"] else "")
            return f"{mark}{a[k] / max(b[k], 1e-12):.2f}x"

        apart = " (apart: the opening reaches 95%)" if cmp.opening_reaches(t.name) else ""
        out.append(f"| {t.name}{apart} | {ratio('trials95')} | {ratio('seconds95')} "
                   f"| {a['final_ms'] / b['final_ms']:.3f}x |")
    out.append("")
    out.append("`>`: genetic's median is censored (it did not reach 95% within the budget), so the ratio is a lower "
               "bound; `?`: gradient's median is censored, so the ratio is not meaningful.")
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("Usage:")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", default=None, help=f"comma-separated suites ({', '.join(SUITES)}), op names "
                                                f"({', '.join(SUITE)}) or op specs (KIND:key=value;...); default: "
                                                f"ops,fresh (quick: {QUICK_OPS})")
    ap.add_argument("--strategies", default=None,
                    help="comma-separated; NAME@N: that strategy at N per round (default gradient,genetic@32,genetic: "
                         "genetic at gradient's batch and at Ansor's 64; quick: gradient,genetic; add random)")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per strategy and op (default 3; quick 1)")
    ap.add_argument("--trials", type=int, default=None, help="trials per run (default 256; quick 24)")
    ap.add_argument("--threads", type=int, default=1, help="threads per kernel (default 1: one-core timings are "
                                                           "the steadiest on a shared 2-core VM)")
    ap.add_argument("--budget-min", type=float, default=None,
                    help="wall-clock budget of the whole run in minutes (default 600; quick 6)")
    ap.add_argument("--remeasure", type=int, default=None, help="interleaved re-timings of each final best "
                                                                "(default 5; quick 2)")
    ap.add_argument("--replay", action="store_true", help="synthetic oracle instead of building and timing")
    ap.add_argument("--replay-noise", type=float, default=0.0, metavar="SIGMA",
                    help="with --replay: time every measurement of the oracle with host-like noise, the true latency "
                         "x exp(SIGMA |z|) (felixjax.testing.TimingNoise; 0.1: a kernel's median timing ~7%% above "
                         "its lowest); default 0, noise-free")
    ap.add_argument("--defaults", nargs="?", const="on", default="off", choices=("off", "on", "both"),
                    help="measure each sketch's hand-written default first in every run (fj.tune's default): off "
                         "(default; the strategies' own search speed, as Felix and Ansor start), on, or both (the "
                         "whole comparison twice, each in its own folder and section)")
    ap.add_argument("--reference", action=argparse.BooleanOptionalAction, default=True,
                    help="judge 95%% of best against a strong reference: per op, every strategy x seed again with "
                         "2x the budget under reserved run names (reference:*), re-timed with the finals "
                         "(default on; --no-reference: the compared runs' union)")
    ap.add_argument("--cost-model", type=Path, default=None, metavar="NPZ",
                    help="start gradient's and genetic's cost model from this pretrained checkpoint (felixjax "
                         "pretrain; train it on databases without these ops) instead of the roofline prior")
    ap.add_argument("--out", type=Path, default=None,
                    help="folder for cmp.db, cmp.csv, table.md and curves.png (default "
                         "results/compare[_replay][_quick]); runs already in its cmp.db are resumed, not repeated: "
                         "use a fresh folder for a fresh run")
    ap.add_argument("--build-cache", type=Path, default=None,
                    help="compiled-kernel cache of the measured runs (default <out>/build, fresh with a fresh --out): "
                         "a shared cache left by earlier runs would hand some runs free compiles of kernels they "
                         "happen to repeat, and their seconds would not be comparable")
    ap.add_argument("--shared-cache", action="store_true",
                    help="one build cache for every run (the protocol before session 33): a run proposing a kernel "
                         "another run compiled earlier gets it free; by default every run compiles into its own "
                         "cache under <build cache>/runs, so its seconds include every compile of its proposals")
    ap.add_argument("--warmup", type=int, default=None,
                    help="trials of an untimed replayed run per strategy first, so JIT compilation is not charged "
                         "to whichever run comes first (0: off; default 64; quick 24)")
    ap.add_argument("--summarize", action="store_true",
                    help="measure nothing: the table of the ops whose runs have all finished in --out's cmp.db, "
                         "and their curves in <out>/curves_partial.png (a long comparison stopped part-way; the "
                         "same command without it resumes)")
    ap.add_argument("--db", type=Path, action="append", default=None, metavar="PATH",
                    help="with --summarize: read this database (or a JSONL export, .jsonl[.gz]) instead of "
                         "<out>/cmp.db; repeat it to pool the finished ops of several (e.g. the two suites' runs of "
                         "one half) into one table and one geomean")
    ap.add_argument("--margins", default=None, metavar="F,F",
                    help="with --summarize: also the geomeans with 'reached' at these fractions of the best known "
                         "(e.g. 0.9,0.85), to see how the verdict depends on issue 15's 0.95 (never the headline)")
    ap.add_argument("--intervals", type=int, default=0, metavar="N",
                    help="with --summarize: also 90%% bootstrap intervals of the geomeans, N resamples of each op's "
                         "seeds (what three seeds per op leave open; e.g. 2000)")
    ap.add_argument("--csv-out", type=Path, default=None, metavar="PATH",
                    help="with --summarize: also write the finished ops' per-trial CSV here (as cmp.csv; for "
                         "ratio_intervals.py and lever_bounds.py)")
    ap.add_argument("--truth", action="store_true",
                    help="with --summarize --replay: judge the runs by the oracle's noise-free latency of every config "
                         "they measured (and of the config each run ended on) instead of the timings they saw; for a "
                         "--replay-noise run, finding a kernel apart from drawing a low timing of it")
    ap.add_argument("--quick", action="store_true", help="tiny budgets (smoke test, ~4 min with its JIT warm-up and "
                                                          "reference runs)")
    ap.add_argument("--quiet", action="store_true", help="no per-round progress lines")
    ap.add_argument("--write", action="store_true", help="update this mode's section of --doc and its plot in "
                                                         "<doc folder>/img/")
    ap.add_argument("--doc", type=Path, default=DOC, help=f"document --write updates (default {DOC.relative_to(ROOT)})")
    args = ap.parse_args(argv)
    if args.replay_noise and not args.replay:
        ap.error("--replay-noise adds noise to the synthetic oracle: use it with --replay")
    if args.replay_noise < 0:
        ap.error("--replay-noise: a scale >= 0")
    if args.replay_noise and args.write:
        ap.error("--write updates the noise-free replay's section; a noisy replay writes its folder only")
    if args.db and not args.summarize:
        ap.error("--db reads finished runs: use it with --summarize")
    if args.truth and not (args.summarize and args.replay):
        ap.error("--truth re-reads a replayed comparison: use it with --summarize --replay")
    if args.margins and not args.summarize:
        ap.error("--margins re-reads finished runs: use it with --summarize")
    if args.intervals and not args.summarize:
        ap.error("--intervals re-reads finished runs: use it with --summarize")
    if args.csv_out and not args.summarize:
        ap.error("--csv-out writes finished runs: use it with --summarize (a measuring run writes <out>/cmp.csv)")
    try:
        args.margins = [float(x) for x in args.margins.split(",")] if args.margins else []
    except ValueError:
        ap.error(f"--margins {args.margins!r}: comma-separated fractions such as 0.9,0.85")
    if any(not 0 < m <= 1 for m in args.margins):
        ap.error("--margins: each fraction in (0, 1]")
    if args.db and args.defaults == "both":
        ap.error("--db: say which half the databases hold, --defaults on or off")
    q = args.quick
    args.ops = args.ops or (QUICK_OPS if q else "ops,fresh")
    args.seeds = args.seeds if args.seeds is not None else (1 if q else 3)
    args.trials = args.trials if args.trials is not None else (24 if q else 256)
    args.budget_min = args.budget_min if args.budget_min is not None else (6.0 if q else 600.0)
    args.warmup = args.warmup if args.warmup is not None else (24 if q else 64)
    args.remeasure = args.remeasure if args.remeasure is not None else (2 if q else 5)
    # separate folders per mode and for --quick: a run resumes the runs of the same name in its cmp.db
    args.out = args.out or ROOT / "results" / ("compare" + ("_replay" if args.replay else "") + ("_quick" if q else ""))
    args.modes = {"off": [False], "on": [True], "both": [False, True]}[args.defaults]
    args.strategies = args.strategies or ("gradient,genetic" if q else "gradient,genetic@32,genetic")
    args.strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    args.protocol = TimingProtocol.quick() if q else TimingProtocol(warmup=1, min_repeat_ms=10, repeats=3)
    # quick: small rounds so a 24-trial run still has several; full: the strategies' defaults
    args.options = ({"gradient": {"starts": 64, "batch_size": 8}, "genetic": {"population": 256, "batch_size": 8},
                     "random": {}} if q else {})
    if args.cost_model is not None:
        if not args.cost_model.exists():
            ap.error(f"--cost-model {args.cost_model}: no such file (make one with felixjax pretrain)")
        for name in COST_MODEL_STRATEGIES:
            args.options.setdefault(name, {})["cost_model"] = str(args.cost_model)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out, rc = args.out, 0
    for defaults in args.modes:
        # with and without the defaults first: separate folders (a run resumes the same names) and sections
        args.out = out.with_name(out.name + "_defaults") if defaults and len(args.modes) > 1 else out
        rc = max(rc, run_mode(args, argv, defaults))
    return rc


def _replay(args: argparse.Namespace):
    """What ``fj.compare`` replays: nothing (measure), the synthetic oracle, or the oracle timed with noise."""
    if not args.replay:
        return None
    if not args.replay_noise:
        return True
    return lambda task, target: ReplayRunner.from_oracle(task, target, noise=args.replay_noise)


def run_mode(args: argparse.Namespace, argv: list[str] | None, defaults: bool) -> int:
    """One whole comparison (every op), with or without the defaults measured first."""
    if args.summarize:
        return summarize(args, defaults)
    started = time.perf_counter()
    load_start = os.getloadavg()[0]
    deadline = started + 60.0 * args.budget_min
    target = Target.cpu()
    tasks = pick_ops(args.ops)
    order = sorted(tasks.items(), key=lambda kv: kv[1].flops)  # cheapest first: unused budget flows on
    seeds = list(range(args.seeds))
    mode = "replay" if args.replay else ("pretrained" if args.cost_model else "measured")
    mode += "_defaults" if defaults else ""
    units = len(args.strategies) * len(seeds) * (1 + REFERENCE_FACTOR * args.reference)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.replay:
        # codegen.build reads $FELIXJAX_CACHE at every build (the re-timings'); the runs compile into caches of their
        # own under it (fj.compare's run_caches) unless --shared-cache: every run pays every compile of its proposals
        os.environ["FELIXJAX_CACHE"] = str(args.build_cache or args.out / "build")
    db = fj.Database(str(args.out / "cmp.db"))
    parts: list[Comparison] = []
    skipped: list[str] = []
    budgets: dict[str, float | None] = {}
    reserve = 10.0 + 2.0 * args.remeasure  # re-timing the finals, per op
    warm_s = 0.0
    if args.warmup:
        # Compile the strategies' jitted code (descent, features, cost-model training) once, on the replay
        # oracle, so that no measured run's clock pays a one-off compilation the others then reuse.
        t0 = time.perf_counter()
        fj.compare([order[0][1]], args.strategies, trials=args.warmup, seeds=[0], target=target, db=None,
                   replay=True, progress=False, remeasure=0, strategy_options=args.options, defaults=defaults)
        warm_s = time.perf_counter() - t0
        _log(f"warm-up (JIT compilation) on the replay oracle: {warm_s:.0f} s")
    try:
        for i, (key, task) in enumerate(order):
            left = len(order) - i
            now = time.perf_counter()
            if now >= deadline:
                skipped.append(task.name)
                continue
            seconds = None
            if not args.replay:
                share = (deadline - now - reserve * left) / left
                seconds = max(share / units, 5.0)  # the reference runs get REFERENCE_FACTOR x this
            budgets[task.name] = seconds
            _log(f"{task.name}: {len(args.strategies)} strategies x {len(seeds)} seeds, {args.trials} trials"
                 + (f" / {seconds:.0f} s per run" if seconds else "") + f"; total so far {now - started:.0f} s")
            parts.append(fj.compare([task], args.strategies, trials=args.trials, seconds=seconds, seeds=seeds,
                                    target=target, db=db, threads=args.threads,
                                    replay=_replay(args), progress=not args.quiet,
                                    protocol=None if args.replay else args.protocol, remeasure=args.remeasure,
                                    strategy_options=args.options, defaults=defaults,
                                    reference=args.reference, reference_factor=REFERENCE_FACTOR,
                                    run_caches=None if args.replay or args.shared_cache
                                    else Path(os.environ["FELIXJAX_CACHE"]) / "runs",
                                    # each later op warms its own shapes up too (one round: a conv's first gradient
                                    # round compiled 1.4 s of its own after a matmul's warm-up; session 76)
                                    warmup=min(args.warmup, 32) if args.warmup and i else 0))
    finally:
        db.close()
    if not parts:
        _log("no operator ran within the budget")
        return 1
    cmp = merge(parts, parts[0].strategies, seeds, args.trials, args.replay, warm_s)
    cmp.to_csv(args.out / "cmp.csv")
    (args.out / "table.md").write_text(cmp.table() + "\n")
    plot = cmp.plot(args.out / "curves.png")

    begin, end, heading, image = SECTIONS[mode]
    measured, load = provenance(started, argv, "benchmarks/compare.py", load_start)
    secs = [s for s in budgets.values() if s]
    budget = f"{args.trials} trials per run" + (f", seconds per run {min(secs):.0f}-{max(secs):.0f} s (an equal share "
                                                f"of the {args.budget_min:g} min budget per op)" if secs else "")
    header = [measured, "", *machine_lines(target),
              f"- runs: strategies {', '.join(cmp.strategies)} x seeds {', '.join(map(str, seeds))} x "
              f"{len(cmp.tasks)} op(s), {budget}; "
              + ("latencies from the synthetic oracle, 0.3 s simulated per trial"
                 + (f", timed with noise x exp({args.replay_noise:g} |z|)" if args.replay_noise else "")
                 if args.replay else
                 f"kernels at {args.threads} thread(s), timing protocol while tuning {args.protocol}; each run's "
                 f"final best re-timed {args.remeasure}x interleaved; compiled kernels cached in "
                 f"{_rel(Path(os.environ['FELIXJAX_CACHE']))}, empty at the start of a fresh run, "
                 + ("one cache shared by the runs (a kernel another run compiled is free)" if args.shared_cache
                    else "one cache per run (every compile of a run's proposals is on its clock)"))
              + (f"; strategy options {args.options}" if args.options else "; strategy defaults")
              + ("; every run measures the hand-written default schedules first" if defaults else
                 "; runs start from scratch (no hand-written default measured)")
              + (f"; 95% of best judged against a reference of every strategy x seed at {REFERENCE_FACTOR:g}x the "
                 "budget (run names reference:*), re-timed with the finals" if args.reference else
                 "; 95% of best judged against the compared runs' union (no reference run)"),
              f"- JIT warm-up before the runs: " + (f"{args.warmup} replayed trials per strategy, {warm_s:.0f} s (run "
                                                     "clocks exclude one-off compilation)" if args.warmup else
                                                     "off (the first run of each strategy pays its compilations)"),
              load, ""]
    if args.cost_model is not None:
        header.insert(-2, pretrained_line(args.cost_model))
    if skipped:
        header.append(f"Not run (budget spent before they started): {', '.join(skipped)}.\n")
    text = "\n".join(header) + "\n" + "\n".join(verdicts(cmp)) + "\n\n" + cmp.table() + "\n\n" + \
        "\n".join(per_task_ratios(cmp))
    if args.write:
        img = args.doc.parent / "img" / image
        img.parent.mkdir(parents=True, exist_ok=True)
        img.write_bytes(Path(plot).read_bytes())
        text += (f"\n\n![best so far against trials and seconds](img/{image})\n\n"
                 f"CSV of every measurement: `{_rel(args.out)}/cmp.csv`.")
        write_doc(text, args.doc, begin=begin, end=end, heading=heading)
        _log(f"wrote {args.doc} and {img}")
    print(text)
    _log(f"outputs in {args.out}; {time.perf_counter() - started:.0f} s")
    return 0


def summarize(args: argparse.Namespace, defaults: bool) -> int:
    """``--summarize``: what the finished ops of a stopped comparison say (``fj.compare``'s
    ``from_database``), printed; nothing is measured or written but the curves. With ``--db`` (repeated),
    the finished ops of several databases pooled into one table and one geomean (a suite's halves run
    apart, e.g. ``ops`` and ``fresh``; an op finished in more than one counts from the first)."""
    from felixjax.compare import from_database

    paths = args.db or [args.out / "cmp.db"]
    missing = [p for p in paths if not p.exists()]
    if missing:
        _log(f"{', '.join(map(_rel, missing))}: no such database (nothing measured yet in this mode)")
        return 1
    order = sorted(pick_ops(args.ops).values(), key=lambda t: t.flops)
    parts, seen = [], set()
    with tempfile.TemporaryDirectory() as tmp:
        for i, path in enumerate(paths):
            db = open_records(path, Path(tmp) / f"{i}.db")
            try:
                got, _ = from_database(db, [t for t in order if t.name not in seen], args.strategies,
                                       range(args.seeds), args.trials, threads=args.threads, defaults=defaults,
                                       reference=args.reference, replay=args.replay)
            finally:
                db.close()
            if got is not None:
                parts.append(got)
                seen.update(t.name for t in got.tasks)
                if len(paths) > 1:
                    _log(f"{_rel(path)}: {', '.join(t.name for t in got.tasks)}")
    waiting = [t.name for t in order if t.name not in seen]
    cmp = (None if not parts else parts[0] if len(parts) == 1
           else merge(parts, args.strategies, list(range(args.seeds)), args.trials, args.replay))
    source = ", ".join(f"`{_rel(p)}`" for p in paths)
    head = (f"{'Partial comparison' if len(paths) == 1 else 'Comparison pooled'} from {source} "
            f"({'with' if defaults else 'without'} the defaults measured first): "
            f"{0 if cmp is None else len(cmp.tasks)} of {len(order)} op(s) finished"
            + (f"; not yet: {', '.join(waiting)}" if waiting else "") + "."
            + (" (An op is finished once its runs and its reference runs are in the database: summarize a comparison "
               "run with --no-reference with --no-reference.)" if waiting and args.reference else ""))
    if cmp is None:
        print(head)
        return 1
    if args.truth:
        cmp = judged_by_truth(cmp, Target.cpu())
        head += " Judged by the oracle's noise-free latencies (--truth), not the timings the runs saw."
    print("\n".join([head, "", *verdicts(cmp), "", cmp.table(), "", *per_task_ratios(cmp)]))
    if args.csv_out:
        cmp.to_csv(args.csv_out)
        _log(f"per-trial CSV: {_rel(args.csv_out)}")
    if args.margins:
        print("\n".join(["", *margin_table(cmp, args.margins)]))
    if args.intervals:
        print("\n".join(["", *interval_table(cmp, args.intervals)]))
    args.out.mkdir(parents=True, exist_ok=True)
    _log(f"convergence curves of the finished ops: {_rel(Path(cmp.plot(args.out / 'curves_partial.png')))}")
    return 0


def judged_by_truth(cmp: Comparison, target: Target) -> Comparison:
    """``cmp`` (a replay of the synthetic oracle, timed with noise or not) with every ok record's latency
    replaced by the oracle's true latency of its config, and each run's final (and reference) latency by the
    true latency of the config the run ended on: its lowest timing's, as the run picked it. The same runs,
    the same picks; only what they are judged by changes. Noise-free, it is the comparison itself."""
    oracles = {t.name: SyntheticOracle(t, target) for t in cmp.tasks}

    def true(task: str, recs: list) -> list:
        ok = [r for r in recs if r.ok]
        lat = iter(oracles[task].latencies([r.config for r in ok]) if ok else [])
        return [dataclasses.replace(r, result=MeasureResult("ok", (float(next(lat)),))) if r.ok else r for r in recs]

    def final(task: str, recs: list) -> list[float]:
        ok = [r for r in recs if r.ok]
        return [oracles[task](min(ok, key=lambda r: r.latency_s).config)] if ok else [math.inf]

    runs = {**cmp.histories, **cmp.references}
    return dataclasses.replace(cmp, histories={k: true(k[0], v) for k, v in cmp.histories.items()},
                               references={k: true(k[0], v) for k, v in cmp.references.items()},
                               remeasured={k: final(k[0], runs[k]) for k in cmp.remeasured if k in runs})


def interval_table(cmp: Comparison, n: int, level: float = 0.9, paired: bool = False) -> list[str]:
    """Each strategy's geomean ratios over gradient beside their bootstrap interval over the ops' seeds
    (``--intervals``; :meth:`Comparison.intervals`): how far three seeds per op pin the verdict down
    (``paired``: each resample draws one set of seeds for both, as for an ablation's seed-paired arms)."""
    ratios, spans = cmp.ratios(), cmp.intervals(n=n, level=level, paired=paired)
    how = "seed-paired resamples" if paired else "resamples"
    lines = [(f"Bootstrap: {level:.0%} intervals over {n} {how} of each op's seeds (ops fixed; censored runs at "
              f"their budget, as in the geomeans), strategy / {cmp.reference()}:"), "",
             "| strategy | trials to 95% | seconds to 95% | final latency |", "|---|---:|---:|---:|"]
    for s, r in ratios.items():
        span = spans.get(s, {})
        cells = [f"{r[m]:.2f}x [{span[m][0]:.2f}, {span[m][1]:.2f}]" if m in span else f"{r[m]:.2f}x"
                 for m in ("trials95", "seconds95", "final")]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return lines


def margin_table(cmp: Comparison, margins: list[float]) -> list[str]:
    """The judged geomeans again with "reached" at other fractions of the best known (``--margins``):
    how much of the verdict is the 5% margin, against timing noise of the same order."""
    g = judge(cmp)
    lines = [f"Sensitivity (not the headline: issue 15 judges at 0.95), {g} / gradient:", "",
             "| reached at | ops apart | ops uncensored for both | trials | seconds | bound | trials, uncensored "
             "| seconds, uncensored |",
             "| ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |"]
    for m in [cmp.reach_frac, *margins]:
        r = dataclasses.replace(cmp, reach_frac=m).ratios().get(g)
        if r is None:
            return lines + ["| (needs both gradient and genetic) | — | — | — | — | — | — | — |"]
        lines.append(f"| {m:g} | {len(r['apart'])} | {r['uncensored']} of {r['tasks']} | {r['trials95']:.2f}x "
                     f"| {r['seconds95']:.2f}x | {r['bound'] if r['censored'] else 'none'} "
                     f"| {r['uncensored_trials95']:.2f}x | {r['uncensored_seconds95']:.2f}x |")
    return lines


def open_records(path: Path, scratch: Path) -> fj.Database:
    """A comparison's records, read-only: a database as is, or a JSONL export (``.jsonl``, ``.jsonl.gz``,
    what ``Database.export_jsonl`` writes and docs/data/ ships) imported into ``scratch``."""
    if not path.name.endswith((".jsonl", ".jsonl.gz")):
        return fj.Database(path, readonly=True)
    db = fj.Database(scratch)
    _log(f"{_rel(path)}: {db.import_jsonl(path)} records")
    return db

if __name__ == "__main__":
    sys.exit(main())
