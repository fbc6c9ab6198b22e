"""Tuning benchmark (issue 3): gradient search on every operator, then its best kernels next to peers.

For every operator of the op suite (``benchmarks/kernels.py``'s ``SUITE``) and every thread count
(default: 1 and all cores):

1. ``fj.tune(task, strategy="gradient", trials=N, threads=T)`` through the real runner: every trial is
   built by gcc in worker processes and timed in the separate measuring process, output checked
   against numpy before and after timing;
2. the best kernel found, numpy (matmul and dense), onnxruntime and jax.jit, all at the same ``T``
   threads, prepared once in this process, checked, timed interleaved (A B C A B C ...; see
   ``felixjax.baselines.time_interleaved``) and checked again;
3. the tuner's own cost: time outside build and measure (``propose_s + update_s`` of
   ``TuneResult.stats``, which includes any JAX compilation) as a share of the tuning wall time, and
   the JAX compilations during the ``fj.tune`` call (see ``JitCounter`` for what exactly is counted).

It writes a table per thread count and one of the issue's targets (met / missed, with the ratio):
>= 1.0x numpy on matmul 1024, >= 0.8x onnxruntime on the 3x3 and 1x1 convolutions, >= 1.0x
onnxruntime on depthwise and dense, tuner overhead < 5% of tuning wall time. Ratios are speed ratios
of medians measured in one interleaved run (> 1: felixjax is faster); compare ratios, not absolute
times: on a shared 2-core VM absolute numbers drift by up to 1.5x within minutes.

``--budget-min`` bounds the whole run: each (operator, thread count) gets an equal share of what is
left (minus a reserve for the final timing), in the order cheapest operator first, so time a small
operator leaves unused flows to the big ones. A run cut short by its budget reports fewer trials.

Usage:
    python benchmarks/tune_ops.py                       # full: 7 ops x 256 trials x {1, all cores}
    python benchmarks/tune_ops.py --quick               # smoke test: 16 trials, 2 small ops, 1 thread
    python benchmarks/tune_ops.py --ops matmul1024,conv56 --trials 128 --threads 1
    python benchmarks/tune_ops.py --budget-min 90 --write   # bounded, and update docs/BENCHMARKS.md
    python benchmarks/tune_ops.py --db results/tune_ops.db  # keep every measurement (resumable)
"""
from __future__ import annotations

import os

# Before numpy loads OpenBLAS: idle OpenBLAS workers otherwise spin after each call and steal the
# next contender's cores (see benchmarks/kernels.py).
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

import argparse  # noqa: E402
import datetime  # noqa: E402
import math  # noqa: E402
import shlex  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout: `benchmarks` and `felixjax` importable
    sys.path.insert(0, str(ROOT))


import felixjax as fj  # noqa: E402
from benchmarks.kernels import SUITE, _git, machine_lines, select_ops, write_doc  # noqa: E402
from codegen.measure import LocalRunner, TimingProtocol  # noqa: E402
from codegen.ops import Task  # noqa: E402
from codegen.target import Target  # noqa: E402
from felixjax import baselines  # noqa: E402
from felixjax.strategies.gradient import GradientSearch  # noqa: E402

BEGIN, END = "<!-- tune_ops:begin -->", "<!-- tune_ops:end -->"
HEADING = "Gradient tuning against peers (benchmarks/tune_ops.py)"
DOC = ROOT / "docs" / "BENCHMARKS.md"
PEERS = ("numpy", "onnxruntime", "jax")
HEADERS = {"felixjax": "felixjax (tuned)", "numpy": "numpy", "onnxruntime": "onnxruntime", "jax": "jax.jit"}
QUICK_OPS = "matmul512,dw28"
# Issue 3's targets: (label, suite key, peer, minimum speed ratio felixjax / peer).
TARGETS = (
    ("matmul 1024 vs numpy", "matmul1024", "numpy", 1.0),
    ("3x3 conv 56x56 vs onnxruntime", "conv56", "onnxruntime", 0.8),
    ("3x3 conv 28x28 vs onnxruntime", "conv28", "onnxruntime", 0.8),
    ("1x1 conv 14x14 vs onnxruntime", "conv14_1x1", "onnxruntime", 0.8),
    ("depthwise 3x3 vs onnxruntime", "dw28", "onnxruntime", 1.0),
    ("dense 4096->1000 vs onnxruntime", "dense4096", "onnxruntime", 1.0),
)
OVERHEAD_TARGET = 0.05


def _log(msg: str) -> None:
    print(f"[tune_ops] {msg}", file=sys.stderr, flush=True)


_short = baselines.short_error


# ---- counting JAX compilations -------------------------------------------------------------------

class JitCounter:
    """Counts JAX compilation events of this process through ``jax.monitoring`` listeners.

    * ``executables``: ``/jax/core/compile/backend_compile_duration`` events, one per XLA executable
      jax obtained (a fresh XLA compilation or a load from the persistent compilation cache); this
      includes the small executables of eagerly dispatched jnp operations, not only ``jax.jit``
      functions;
    * ``cache_hits``: ``/jax/compilation_cache/cache_hits``, executables loaded from the persistent
      cache (``felixjax.jaxcache``) instead of compiled: ``executables - cache_hits`` were compiled;
    * ``traces``: ``/jax/core/compile/jaxpr_trace_duration`` events (a jitted function traced to a jaxpr);
    * ``seconds``: summed duration of the executable events (compiling or loading).

    Executables already in the in-memory jit caches (same function, same shapes) produce no event:
    that is the "compiled once, reused" case the design aims for.
    """

    EXEC = "/jax/core/compile/backend_compile_duration"
    TRACE = "/jax/core/compile/jaxpr_trace_duration"
    HIT = "/jax/compilation_cache/cache_hits"

    def __init__(self) -> None:
        import jax.monitoring as mon

        self.executables = self.cache_hits = self.traces = 0
        self.seconds = 0.0
        mon.register_event_duration_secs_listener(self._duration)
        mon.register_event_listener(self._event)

    def _duration(self, event: str, duration: float, **_: object) -> None:
        if event == self.EXEC:
            self.executables += 1
            self.seconds += float(duration)
        elif event == self.TRACE:
            self.traces += 1

    def _event(self, event: str, **_: object) -> None:
        if event == self.HIT:
            self.cache_hits += 1

    def snapshot(self) -> dict:
        return {"executables": self.executables, "cache_hits": self.cache_hits, "traces": self.traces,
                "seconds": self.seconds}

    def since(self, snap: dict) -> dict:
        now = self.snapshot()
        d = {k: now[k] - snap[k] for k in now}
        d["compiled"] = d["executables"] - d["cache_hits"]
        return d


# ---- one operator at one thread count --------------------------------------------------------------

@dataclass
class Row:
    key: str
    task: Task
    threads: int
    trials: int = 0
    ok: int = 0
    trial_budget: int = 0
    tune_seconds: float | None = None
    stats: dict = field(default_factory=dict)
    jit: dict = field(default_factory=dict)
    best_config: str = ""
    tuned_gflops: float = math.nan  # best while tuning (tuning protocol)
    times: dict = field(default_factory=dict)  # contender -> baselines.Summary
    errors: dict = field(default_factory=dict)
    timing_s: float = 0.0

    @property
    def overhead(self) -> float:
        w = self.stats.get("wall_s", 0.0)
        return (self.stats.get("propose_s", 0.0) + self.stats.get("update_s", 0.0)) / w if w > 0 else math.nan

    def ratio(self, peer: str) -> float:
        """Speed of felixjax's best kernel relative to ``peer`` (median over rounds; > 1: ours faster)."""
        if "felixjax" not in self.times or peer not in self.times:
            return math.nan
        return self.times[peer].median_s / self.times["felixjax"].median_s


def tune_op(key: str, task: Task, threads: int, *, target: Target, runner: LocalRunner, args, seconds: float | None,
            counter: JitCounter, db) -> tuple[Row, object]:
    row = Row(key, task, threads, trial_budget=args.trials, tune_seconds=seconds)
    strategy = GradientSearch(starts=args.starts, steps=args.steps, batch_size=args.batch)
    snap = counter.snapshot()
    res = fj.tune(task, target, strategy, trials=args.trials, seconds=seconds, db=db, seed=args.seed,
                  run=f"gradient:{args.seed}:t{threads}", runner=runner, threads=threads, protocol=args.tune_protocol,
                  progress=not args.quiet)
    row.jit = counter.since(snap)
    row.stats = dict(res.stats)
    row.trials, row.ok = len(res.history), sum(r.ok for r in res.history)
    if res.best is None:
        row.errors["felixjax"] = f"no correct kernel in {row.trials} trials ({res.status_counts()})"
    else:
        row.best_config = res.best.config.dumps()
        row.tuned_gflops = res.best.gflops
    return row, res


def time_op(row: Row, res, *, target: Target, rounds: int, min_time_s: float) -> None:
    """The tuned kernel and the peers, at the row's threads, checked, interleaved, checked again."""
    t0 = time.perf_counter()
    task, threads = row.task, row.threads
    arrays = task.random_inputs(seed=0)
    expected = task.reference(*arrays)
    contenders: dict[str, baselines.Contender] = {}
    if res.best is not None:
        try:
            contenders["felixjax"] = baselines.kernel_contender(task, res.best.config, arrays, threads=threads,
                                                                target=target, expected=expected)
        except RuntimeError as e:
            row.errors["felixjax"] = _short(e)
    baselines.add_checked_peers(task, arrays, contenders, row.errors, threads=threads, expected=expected)
    if contenders:
        times = baselines.time_interleaved(contenders, rounds=rounds, min_time_s=min_time_s)
        for name, s in baselines.summarize(times).items():
            try:
                contenders[name].check(run=False)
                row.times[name] = s
            except AssertionError as e:
                row.errors[name] = "after timing: " + _short(e)
    for c in contenders.values():
        c.close()
    row.timing_s = time.perf_counter() - t0


# ---- report ------------------------------------------------------------------------------------------

def _fmt_ratio(r: float) -> str:
    return f"{r:.2f}x" if math.isfinite(r) else "—"


def _cell(row: Row, name: str) -> str:
    if name in row.times:
        s = row.times[name]
        med, best = s.gflops(row.task.flops)
        return f"{s.median_s * 1e3:.4g} ms ({med:.1f} / {best:.1f})"
    return "error" if name in row.errors else "—"


def render_tables(rows: list[Row], cores: int) -> str:
    out = []
    for threads in sorted({r.threads for r in rows}):
        rs = [r for r in rows if r.threads == threads]
        label = f"{threads} thread" + ("s" if threads > 1 else "") + (" (all cores)" if threads == cores else "")
        out.append(f"### {label}\n")
        out.append("Median latency per call (GFLOP/s at the median / at the best round); ratios are felixjax's "
                   "speed over the peer's, medians (> 1: felixjax faster).\n")
        out.append("| op | trials (ok) | " + " | ".join(HEADERS[c] for c in ("felixjax", *PEERS))
                   + " | vs numpy | vs onnxruntime | vs jax.jit | tuning wall | overhead "
                   "| jit: compiled / cached / traces |")
        out.append("|---|---:|" + "---:|" * 4 + "---:|" * 3 + "---:|---:|---:|")
        for r in rs:
            cells = " | ".join(_cell(r, c) for c in ("felixjax", *PEERS))
            ratios = " | ".join(_fmt_ratio(r.ratio(p)) for p in PEERS)
            j = r.jit
            jit = f"{j.get('compiled', 0)} / {j.get('cache_hits', 0)} / {j.get('traces', 0)}"
            out.append(f"| {r.task.name} | {r.trials} ({r.ok}) | {cells} | {ratios} | "
                       f"{r.stats.get('wall_s', 0.0):.0f} s | {100 * r.overhead:.1f}% | {jit} |")
        out.append("")
        for r in rs:
            cut = ""
            if r.trials < r.trial_budget:
                cut = (f"; stopped at {r.trials}/{r.trial_budget} trials by its {r.tune_seconds:.0f} s share of "
                       "the budget")
            s = r.stats
            out.append(f"- {r.task.name}: best {r.best_config or '—'} ({r.tuned_gflops:.1f} GFLOP/s while "
                       f"tuning){cut}; "
                       f"propose {s.get('propose_s', 0):.1f} s + update {s.get('update_s', 0):.1f} s, build+measure "
                       f"{s.get('build_measure_s', 0):.1f} s in {s.get('rounds', 0)} rounds; XLA compile/load "
                       f"{r.jit.get('seconds', 0.0):.1f} s")
            out += [f"  - {name}: {err}" for name, err in r.errors.items()]
        out.append("")
    return "\n".join(out)


def render_targets(rows: list[Row]) -> str:
    out = ["### Targets (issue 3)\n",
           "| target | threads | felixjax / peer (median) | required | result |", "|---|---:|---:|---:|---|"]
    by = {(r.key, r.threads): r for r in rows}
    threads = sorted({r.threads for r in rows})
    for label, key, peer, need in TARGETS:
        for t in threads:
            r = by.get((key, t))
            if r is None:
                out.append(f"| {label} | {t} | — | >= {need:.1f}x | not run |")
                continue
            ratio = r.ratio(peer)
            if not math.isfinite(ratio):
                verdict = "no result (" + "; ".join(f"{k}: {v}" for k, v in r.errors.items())[:120] + ")"
            else:
                verdict = "met" if ratio >= need else f"missed by {100 * (1 - ratio / need):.0f}%"
            out.append(f"| {label} | {t} | {_fmt_ratio(ratio)} | >= {need:.1f}x | {verdict} |")
    outside = sum(r.stats.get("propose_s", 0.0) + r.stats.get("update_s", 0.0) for r in rows)
    wall = sum(r.stats.get("wall_s", 0.0) for r in rows)
    compile_s = sum(r.jit.get("seconds", 0.0) for r in rows)
    if wall > 0:
        share = outside / wall
        verdict = "met" if share < OVERHEAD_TARGET else f"missed ({100 * share:.1f}% vs < 5%)"
        worst = max(rows, key=lambda r: r.overhead if math.isfinite(r.overhead) else -1)
        out.append(f"| tuner overhead: propose + update / tuning wall, all runs | all | {100 * share:.1f}% "
                   f"| < 5% | {verdict} |")
        out.append("")
        out.append(f"Overhead: {outside:.0f} s of {wall:.0f} s tuning wall time was spent outside build and "
                   f"measure (proposing: descent, rounding, ranking; updating: cost-model training), "
                   f"{compile_s:.0f} s of it compiling or loading XLA executables (without those: "
                   f"{100 * max(outside - compile_s, 0.0) / max(wall - compile_s, 1e-9):.1f}%); worst single run "
                   f"{worst.task.name} at {worst.threads} thread(s): {100 * worst.overhead:.1f}%. "
                   f"JIT columns count the XLA executables jax produced during each `fj.tune` call: "
                   f"compiled (fresh XLA compilations, eager jnp operations included), cached (loaded from "
                   f"the persistent compilation cache instead), traces (jaxprs traced); functions already "
                   f"compiled in this process for the same shapes count nothing.")
    return "\n".join(out)


def provenance(started: float, argv: list[str] | None, script: str, load_start: float) -> tuple[str, str]:
    """(the "Measured ... with `command`" line, the load-average line) of a benchmark run."""
    commit = _git("rev-parse", "--short", "HEAD") or "unknown"
    if _git("status", "--porcelain", "--untracked-files=no"):
        commit += " (with uncommitted changes)"
    args = sys.argv[1:] if argv is None else argv
    command = "python " + " ".join(shlex.quote(a) for a in [script, *args])
    elapsed = time.perf_counter() - started
    cores = os.cpu_count() or 1
    measured = (f"Measured {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC at commit {commit} "
                f"with `{command}` ({elapsed / 60:.1f} min).")
    load = (f"- load average (1 min) at start / end: {load_start:.1f} / {os.getloadavg()[0]:.1f} on {cores} cores "
            "(this run's own load is about 1; well above that, other jobs shared the cores and the numbers "
            "are noisy, multi-threaded ones most)")
    return measured, load


# ---- main ----------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("Usage:")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", default=None,
                    help=f"comma-separated suite names ({', '.join(SUITE)}) or op specs (KIND:key=value;...); "
                         f"default: all (quick: {QUICK_OPS})")
    ap.add_argument("--trials", type=int, default=None, help="trials per op and thread count (default 256; quick 16)")
    ap.add_argument("--threads", default=None, help="comma-separated thread counts (default 1,<all cores>; quick 1)")
    ap.add_argument("--budget-min", type=float, default=None,
                    help="wall-clock budget of the whole run in minutes (default 150; quick 6)")
    ap.add_argument("--starts", type=int, default=None, help="gradient starts per sketch per round (default: the strategy's, 64)")
    ap.add_argument("--steps", type=int, default=32, help="Adam steps per round (default 32)")
    ap.add_argument("--batch", type=int, default=None, help="candidates measured per round (default: the strategy's, 64; quick 8)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds (default 7; quick 3)")
    ap.add_argument("--min-time", type=float, default=None, help="seconds per timed block (default 0.05; quick 0.01)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--db", default=None, help="database of every measurement (default: in memory); "
                                               "an interrupted run resumes from it")
    ap.add_argument("--quick", action="store_true", help="tiny budgets (smoke test)")
    ap.add_argument("--quiet", action="store_true", help="no per-round progress lines")
    ap.add_argument("--write", action="store_true", help="update the tune_ops section of --doc")
    ap.add_argument("--doc", type=Path, default=DOC,
                    help=f"the document --write updates (default {DOC.relative_to(ROOT)})")
    args = ap.parse_args(argv)
    q = args.quick
    args.ops = args.ops or (QUICK_OPS if q else ",".join(SUITE))
    args.trials = args.trials if args.trials is not None else (16 if q else 256)
    args.threads = args.threads or ("1" if q else None)
    args.budget_min = args.budget_min if args.budget_min is not None else (6.0 if q else 150.0)
    defaults = GradientSearch()
    args.starts = args.starts if args.starts is not None else defaults.starts
    args.batch = args.batch if args.batch is not None else (8 if q else defaults.batch_size)
    args.rounds = args.rounds if args.rounds is not None else (3 if q else 7)
    args.min_time = args.min_time if args.min_time is not None else (0.01 if q else 0.05)
    args.tune_protocol = (TimingProtocol.quick() if q else TimingProtocol(warmup=1, min_repeat_ms=10, repeats=3))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    load_start = os.getloadavg()[0]
    deadline = started + 60.0 * args.budget_min
    target = Target.cpu()
    threads = sorted({int(t) for t in (args.threads or f"1,{target.cores}").split(",")})
    tasks = select_ops(args.ops)
    order = sorted(tasks.items(), key=lambda kv: kv[1].flops)  # cheapest first: unused budget flows on
    counter = JitCounter()
    reserve = 3.0 * args.rounds * 4 * args.min_time + (5.0 if args.quick else 15.0)  # final timing, per pair
    pairs = [(t, key, task) for t in threads for key, task in order]
    rows: list[Row] = []
    _log(f"{len(pairs)} runs of up to {args.trials} trials; budget {args.budget_min:g} min")
    db = fj.Database(args.db) if args.db else None
    try:
        with LocalRunner(protocol=args.tune_protocol) as runner:
            for i, (t, key, task) in enumerate(pairs):
                left = len(pairs) - i
                share = (deadline - time.perf_counter() - reserve * left) / left
                row, res = tune_op(key, task, t, target=target, runner=runner, args=args, seconds=max(share, 5.0),
                                   counter=counter, db=db)
                _log(f"{task.name} threads={t}: {row.trials} trials in {row.stats.get('wall_s', 0):.0f} s "
                     f"(share {share:.0f} s), overhead {100 * row.overhead:.1f}%, jit {row.jit}; timing peers")
                time_op(row, res, target=target, rounds=args.rounds, min_time_s=args.min_time)
                rows.append(row)
                ratios = ", ".join(f"{p} {_fmt_ratio(row.ratio(p))}" for p in PEERS if p in row.times)
                _log(f"{task.name} threads={t}: felixjax vs {ratios or '—'}; "
                     f"total {time.perf_counter() - started:.0f} s")
    finally:
        if db is not None:
            db.close()
    suite_order = list(tasks)
    rows.sort(key=lambda r: (r.threads, suite_order.index(r.key)))
    import jax

    measured, load = provenance(started, argv, "benchmarks/tune_ops.py", load_start)
    cache = jax.config.jax_compilation_cache_dir
    header = [
        measured, "",
        *machine_lines(target),
        f"- tuning: `fj.tune(strategy=\"gradient\")`, {args.trials} trials per op and thread count "
        f"({args.starts} starts x {args.steps} Adam steps, {args.batch} candidates per round), tuned at the thread "
        f"count it is timed at; timing protocol while tuning: {args.tune_protocol}; whole-run budget "
        f"{args.budget_min:g} min; JAX persistent compilation cache: {cache or 'off'}",
        f"- final timing: {args.rounds} interleaved rounds per op, blocks of >= {args.min_time * 1e3:.0f} ms, every "
        "contender at the same thread count, outputs checked against numpy before and after; onnxruntime at its "
        "default session options (spinning on, a pause before every timed block); numpy BLAS threads limited; jax pinned to the first N cores when N < all.",
        load, "",
    ]
    text = "\n".join(header) + "\n" + render_targets(rows) + "\n\n" + render_tables(rows, target.cores)
    print(text)
    if args.write:
        write_doc(text, args.doc, begin=BEGIN, end=END, heading=HEADING)
        _log(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
