"""Kernel benchmark (issue 2): our generated kernels next to numpy, onnxruntime and jax.jit.

For every operator of the suite, at each thread count (default: 1 and all cores), it prints the
median and best GFLOP/s of

* default: ``Space.default()`` of every sketch measured through the runner; the faster sketch's
  default is shown;
* random: the best of N random valid schedules, ``fj.tune(strategy="random")`` through the real
  measuring process, tuned at this thread count (same seed at every thread count: builds are cached);
* numpy (matmul and dense), onnxruntime (all), jax.jit (all);

all prepared once and timed interleaved in this process (A B C A B C ..., see
``felixjax.baselines.time_interleaved``), each cell also as a percentage of this machine's fp32 peak
at that thread count (``codegen.peak.measure_fp32_peak``: T times the 1-thread FMA probe, or the
T-thread probe when that is higher; a busy VM starves multi-threaded probes). Every contender's output is checked
against ``Task.reference`` before and after timing. Compare ratios within one run: on a shared
2-core VM absolute numbers drift by up to 1.5x within minutes.

Issue 14's report (``--suites``): per op and thread count the ratios to onnxruntime at its default
session options (> 1: ours is faster) of the default schedule, the tuned one (``--trials`` random
schedules) and the better of the two; their geomean per suite and thread count; a bar chart of the
ratios (``docs/img/kernels_vs_onnxruntime.png``); and for every miss (< 1.0x) its roofline figure:
the GFLOP/s reached against the machine's limit for the op, min(fp32 peak, copy bandwidth x the
op's arithmetic intensity), both measured in the same run (``codegen.peak``,
:func:`measure_bandwidth`), plotted in ``docs/img/kernels_roofline.png``.

Usage:
    python benchmarks/kernels.py                      # the op suite, ~6-9 minutes
    python benchmarks/kernels.py --quick              # CI smoke: tiny budgets
    python benchmarks/kernels.py --ops matmul512,dw28 --random 64 --threads 1
    python benchmarks/kernels.py --write              # also update docs/BENCHMARKS.md
    # issue 14's run (op + fresh suites, 1 and 2 threads, ~15 minutes on a quiet 2-core machine):
    python benchmarks/kernels.py --suites ops,fresh --trials 16 --budget-minutes 14 --write
"""
from __future__ import annotations

import os

# Before numpy loads OpenBLAS: idle OpenBLAS workers otherwise spin for ~0.1 s after each call and
# steal the next contender's cores (the peers' equivalent of onnxruntime's allow_spinning=0).
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

import argparse  # noqa: E402
import datetime  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
try:
    import felixjax  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import felixjax as fj  # noqa: E402
from codegen.measure import LocalRunner, MeasureResult, TimingProtocol  # noqa: E402
from codegen.ops import Task, parse_spec  # noqa: E402
from codegen.bandwidth import measure_bandwidth, roofline  # noqa: E402
from codegen.peak import measure_fp32_peak  # noqa: E402
from codegen.space import Config, Space, sketches_for  # noqa: E402
from codegen.target import Target  # noqa: E402
from felixjax import baselines  # noqa: E402
from felixjax.tuner import Measurer  # noqa: E402

SUITE: dict[str, Task] = {
    "matmul512": fj.ops.matmul(512, 512, 512),
    "matmul1024": fj.ops.matmul(1024, 1024, 1024),
    "conv56": fj.ops.conv2d(1, 64, 56, 56, out_channels=64, kernel=3, padding=1),
    "conv28": fj.ops.conv2d(1, 128, 28, 28, out_channels=128, kernel=3, padding=1),
    "conv14_1x1": fj.ops.conv2d(1, 256, 14, 14, out_channels=256, kernel=1),
    "dw28": fj.ops.depthwise_conv2d(1, 256, 28, 28, kernel=3, padding=1),
    "dense4096": fj.ops.dense(1, 4096, 1000),
}
COLUMNS = ("default", "random", "numpy", "onnxruntime", "jax")
HEADERS = {"default": "default", "random": "best random", "numpy": "numpy", "onnxruntime": "onnxruntime",
           "jax": "jax.jit"}
BEGIN, END = "<!-- kernels:begin -->", "<!-- kernels:end -->"
DOC = ROOT / "docs" / "BENCHMARKS.md"


@dataclass
class Row:
    """One operator at one thread count: every contender's timing (or why it has none)."""

    key: str
    task: Task
    threads: int
    gflops: dict[str, tuple[float, float]] = field(default_factory=dict)  # name -> (median, best)
    errors: dict[str, str] = field(default_factory=dict)
    random_trials: int = 0
    random_ok: int = 0
    sketches: dict[str, str] = field(default_factory=dict)  # default / random -> sketch name
    seconds: float = 0.0  # the whole operator
    tune_s: float = 0.0  # random tuning only
    suite: str = ""  # the suite (felixjax.suites) it came from, with --suites

    def ratio(self, name: str) -> float | None:
        """onnxruntime's median time / ``name``'s (> 1: ``name`` is faster); ``"best"``: the faster of the
        default and the tuned schedule."""
        if name == "best":
            got = [r for r in (self.ratio("default"), self.ratio("random")) if r is not None]
            return max(got) if got else None
        if name in self.gflops and "onnxruntime" in self.gflops:
            return self.gflops[name][0] / self.gflops["onnxruntime"][0]
        return None


def _log(msg: str) -> None:
    print(f"[kernels] {msg}", file=sys.stderr, flush=True)


_short = baselines.short_error


def _best_default(task: Task, target: Target, runner: LocalRunner, threads: int,
                  protocol: TimingProtocol) -> tuple[Config | None, str]:
    """Space.default() of every sketch, measured through the runner; the fastest ok one."""
    measurer = Measurer(task, target, runner, threads=threads, protocol=protocol)
    configs = [Space(task, sk, target).default() for sk in sketches_for(task, target)]
    results: dict[Config, MeasureResult] = {}
    measurer.measure(configs, lambda cfg, res: results.__setitem__(cfg, res) or True)
    ok = [c for c in configs if results[c].ok]
    if not ok:
        return None, "; ".join(f"{c.sketch}: {results[c].status} {results[c].error[:100]}" for c in configs)
    return min(ok, key=lambda c: results[c].latency_s), ""


def _add_kernel(contenders: dict, row: Row, name: str, task: Task, cfg: Config, arrays: list[np.ndarray],
                threads: int, target: Target, expected: np.ndarray) -> None:
    try:
        contenders[name] = baselines.kernel_contender(task, cfg, arrays, threads=threads, target=target,
                                                      expected=expected, name=name)
    except RuntimeError as e:  # a failed rebuild is reported, not fatal
        row.errors[name] = _short(e)


def bench_op(key: str, task: Task, threads: int, *, target: Target, runner: LocalRunner, trials: int,
             tune_seconds: float | None, tune_protocol: TimingProtocol, rounds: int, min_time_s: float,
             seed: int) -> Row:
    """Tune, prepare, check, time interleaved and check again one operator at one thread count."""
    t0 = time.perf_counter()
    row = Row(key, task, threads)
    arrays = task.random_inputs(seed=0)
    expected = task.reference(*arrays)
    contenders: dict[str, baselines.Contender] = {}

    default, why = _best_default(task, target, runner, threads, tune_protocol)
    if default is None:
        row.errors["default"] = f"no default ran correctly: {why}"
    else:
        row.sketches["default"] = default.sketch
        _add_kernel(contenders, row, "default", task, default, arrays, threads, target, expected)
    if trials > 0:
        t_tune = time.perf_counter()
        res = fj.tune(task, target, strategy="random", trials=trials, seconds=tune_seconds, runner=runner,
                      threads=threads, protocol=tune_protocol, seed=seed, batch=8, progress=False)
        row.tune_s = time.perf_counter() - t_tune
        row.random_trials, row.random_ok = len(res.history), sum(r.ok for r in res.history)
        if res.best is None:
            row.errors["random"] = f"no correct random schedule ({res.status_counts()})"
        else:
            row.sketches["random"] = res.best.config.sketch
            _add_kernel(contenders, row, "random", task, res.best.config, arrays, threads, target, expected)
    baselines.add_checked_peers(task, arrays, contenders, row.errors, threads=threads, expected=expected)
    _log(f"{task.name} threads={threads}: timing {', '.join(contenders)}")
    times = baselines.time_interleaved(contenders, rounds=rounds, min_time_s=min_time_s)
    for name, s in baselines.summarize(times).items():
        try:
            contenders[name].check(run=False)
            row.gflops[name] = s.gflops(task.flops)
        except AssertionError as e:
            row.errors[name] = "after timing: " + _short(e)
    for c in contenders.values():
        c.close()
    row.seconds = time.perf_counter() - t0
    return row


# ---- report ----------------------------------------------------------------------------------------

def _cell(row: Row, name: str, peak: float) -> str:
    if name in row.gflops:
        med, best = row.gflops[name]
        return f"{med:.1f} / {best:.1f} ({100 * med / peak:.0f}%)"
    if name in row.errors:
        return "error"
    return "—"


def render_tables(rows: list[Row], peaks: dict[int, float], probes: dict[int, float], cores: int) -> str:
    """Markdown: one table per thread count, plus the errors and tuning details under it.

    ``peaks[T]`` is the denominator of "% of peak" (the larger of the T-thread FMA probe and T times the
    1-thread probe); ``probes[T]`` what the T-thread probe measured in this run.
    """
    out = []
    for threads in sorted(peaks):
        rs = [r for r in rows if r.threads == threads]
        label = f"{threads} thread" + ("s" if threads > 1 else "") + (" (all cores)" if threads == cores else "")
        probe = "" if threads == 1 else f"; the {threads}-thread FMA probe measured {probes[threads]:.1f} now"
        out.append(f"### {label}: fp32 peak {peaks[threads]:.1f} GFLOP/s (measured{probe})\n")
        out.append("GFLOP/s median / best of the interleaved rounds (median as % of peak).\n")
        out.append("| op | MFLOP | " + " | ".join(HEADERS[c] for c in COLUMNS) + " | best random / onnxruntime |")
        out.append("|---|---:|" + "---:|" * len(COLUMNS) + "---:|")
        for r in rs:
            ratio = "—"
            if "random" in r.gflops and "onnxruntime" in r.gflops:
                ratio = f"{r.gflops['random'][0] / r.gflops['onnxruntime'][0]:.2f}x"
            cells = " | ".join(_cell(r, c, peaks[threads]) for c in COLUMNS)
            out.append(f"| {r.task.name} | {r.task.flops / 1e6:.1f} | {cells} | {ratio} |")
        out.append("")
        notes = []
        for r in rs:
            sk = ", ".join(f"{k}: {v}" for k, v in r.sketches.items())
            notes.append(f"- {r.task.name}: random {r.random_ok}/{r.random_trials} ok; sketches {sk or '—'}; "
                         f"{r.seconds:.0f} s")
            notes += [f"  - {name}: {err}" for name, err in r.errors.items()]
        out += notes
        out.append("")
    return "\n".join(out)


def op_bytes(task: Task) -> int:
    """The least bytes an op moves: every input (data, weights, bias, residual) and the output, once."""
    shapes = list(task.input_shapes()) + [tuple(task.output_shape)]
    return 4 * sum(int(np.prod(s, dtype=np.int64)) for s in shapes)


def _geomean(vals: list[float]) -> float | None:
    return float(np.exp(np.mean(np.log(vals)))) if vals else None


def _x(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}x"


RATIO_PNG = ROOT / "docs" / "img" / "kernels_vs_onnxruntime.png"
ROOFLINE_PNG = ROOT / "docs" / "img" / "kernels_roofline.png"


def ratio_report(rows: list[Row], peaks: dict[int, float], bandwidth: dict[int, float], *,
                 write_images: bool = False) -> str:
    """Issue 14's report: ratios to onnxruntime per op (default, tuned, best of both), geomeans per suite
    and thread count, every miss with its roofline figure; with ``write_images`` the bar chart and the
    roofline plot (docs/img)."""
    out = ["### Ratios to onnxruntime at its defaults (onnxruntime median time / ours; > 1: ours faster)", "",
           "| suite | op | threads | default | tuned | best | target |", "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        best = r.ratio("best")
        verdict = "—" if best is None else ("met" if best >= 1.0 else "**miss**")
        out.append(f"| {r.suite} | {r.task.name} | {r.threads} | {_x(r.ratio('default'))} | {_x(r.ratio('random'))} "
                   f"| {_x(best)} | {verdict} |")
    out += ["", "| suite | threads | geomean default | geomean tuned | geomean best | ops >= 1.0x (best) |",
            "|---|---:|---:|---:|---:|---:|"]
    for suite in sorted({r.suite for r in rows}):
        for t in sorted(peaks):
            rs = [r for r in rows if r.suite == suite and r.threads == t]
            cols = [_geomean([v for v in (r.ratio(c) for r in rs) if v is not None]) for c in ("default", "random", "best")]
            met = sum((r.ratio("best") or 0) >= 1.0 for r in rs)
            out.append(f"| {suite} | {t} | " + " | ".join(_x(v) for v in cols) + f" | {met} / {len(rs)} |")
    out += ["", "Misses against the roofline: GFLOP/s of our best schedule and of onnxruntime, against the op's "
            "limit min(fp32 peak, copy bandwidth x intensity), bandwidth measured in this run "
            + ", ".join(f"{bw:.1f} GB/s at {t} thread(s)" for t, bw in sorted(bandwidth.items())) + ".", "",
            "| op | threads | intensity (flop/B) | limit GFLOP/s | ours GFLOP/s (% of limit) | onnxruntime (% of limit) |",
            "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        best = r.ratio("best")
        if best is None or best >= 1.0 or r.threads not in bandwidth:
            continue
        ours = max(r.gflops[c][0] for c in ("default", "random") if c in r.gflops)
        ai = r.task.flops / op_bytes(r.task)
        lim = roofline(r.task.flops, op_bytes(r.task), peaks[r.threads], bandwidth[r.threads])
        ort = r.gflops["onnxruntime"][0]
        out.append(f"| {r.task.name} | {r.threads} | {ai:.2f} | {lim:.1f} | {ours:.1f} ({100 * ours / lim:.0f}%) | "
                   f"{ort:.1f} ({100 * ort / lim:.0f}%) |")
    if write_images:
        _plots(rows, peaks, bandwidth)
        out += ["", f"![ratios](img/{RATIO_PNG.name}) ![roofline](img/{ROOFLINE_PNG.name})"]
    return "\n".join(out) + "\n"


def _plots(rows: list[Row], peaks: dict[int, float], bandwidth: dict[int, float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    RATIO_PNG.parent.mkdir(parents=True, exist_ok=True)
    threads = sorted(peaks)
    names = list(dict.fromkeys(r.task.name for r in rows))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.7 * len(names) + 2), 4.0))
    width = 0.8 / max(1, len(threads))
    for i, t in enumerate(threads):
        by = {r.task.name: r.ratio("best") for r in rows if r.threads == t}
        ax.bar(np.arange(len(names)) + i * width, [by.get(n) or 0.0 for n in names], width, label=f"{t} thread(s)")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(np.arange(len(names)) + width * (len(threads) - 1) / 2)
    ax.set_xticklabels(names, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("onnxruntime time / ours (best of default, tuned)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RATIO_PNG, dpi=110)
    plt.close(fig)
    if not bandwidth:
        return
    fig, axes = plt.subplots(1, len(bandwidth), figsize=(5.5 * len(bandwidth), 4.0), squeeze=False)
    for ax, (t, bw) in zip(axes[0], sorted(bandwidth.items())):
        ais = np.logspace(-1.5, 3, 200)
        ax.loglog(ais, np.minimum(peaks[t], bw * ais), "k-", lw=1, label=f"min(peak, {bw:.0f} GB/s x AI)")
        for r in (r for r in rows if r.threads == t):
            ai = r.task.flops / op_bytes(r.task)
            ours = max([r.gflops[c][0] for c in ("default", "random") if c in r.gflops] or [np.nan])
            miss = (r.ratio("best") or 0) < 1.0
            ax.plot(ai, ours, "o", color="C3" if miss else "C2", ms=5)
            if "onnxruntime" in r.gflops:
                ax.plot(ai, r.gflops["onnxruntime"][0], "x", color="C0", ms=5)
            ax.annotate(r.task.name.split("_")[0] + ("*" if miss else ""), (ai, ours), fontsize=6)
        ax.set_title(f"{t} thread(s): o ours (red: miss), x onnxruntime", fontsize=9)
        ax.set_xlabel("arithmetic intensity (flop / byte)")
        ax.set_ylabel("GFLOP/s")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(ROOFLINE_PNG, dpi=110)
    plt.close(fig)


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_lines(target: Target) -> list[str]:
    import jax
    import onnxruntime

    kib = 1024
    return [
        f"- machine: {target.name}, {target.cores} cores, {32 * target.simd_lanes}-bit SIMD "
        f"({target.simd_lanes} fp32 lanes), L1d {target.l1d_bytes // kib} KiB, L2 {target.l2_bytes // kib} KiB, "
        f"L3 share {target.l3_bytes // kib} KiB per core",
        f"- software: {target.compiler}; Python {platform.python_version()}, numpy {np.__version__}, "
        f"onnxruntime {onnxruntime.__version__}, jax {jax.__version__}",
    ]


def write_doc(text: str, path: Path = DOC, *, begin: str = BEGIN, end: str = END,
              heading: str = "Kernels (benchmarks/kernels.py)") -> None:
    """Replace one benchmark's section (between its markers) of docs/BENCHMARKS.md (created if missing)."""
    section = f"{begin}\n{text.rstrip()}\n{end}"
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    if begin in old and end in old:
        new = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: section, old, count=1, flags=re.S)
    else:
        new = old.rstrip() + f"\n\n## {heading}\n\n" + section + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new)


# ---- main ----------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", default=",".join(SUITE),
                    help=f"comma-separated suite names ({', '.join(SUITE)}) or op specs "
                         "(KIND:key=value;...; use ';' between a spec's keys)")
    ap.add_argument("--suites", default=None,
                    help="comma-separated felixjax.suites names (ops, fresh, ...): their ops instead of --ops, "
                         "plus issue 14's ratio report, geomeans, bar chart and rooflines")
    ap.add_argument("--only", default=None,
                    help="with --suites: keep the ops whose task name contains one of these comma-separated strings")
    ap.add_argument("--random", "--trials", dest="random", type=int, default=None,
                    help="random schedules tuned per op and thread count (default 32; quick 4)")
    ap.add_argument("--budget-minutes", type=float, default=None,
                    help="cap on the whole run: half of it is the tuning budget (--budget-s), and ops whose turn "
                         "comes after the cap are skipped (reported)")
    ap.add_argument("--threads", default=None, help="comma-separated thread counts (default 1,<all cores>)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="wall-clock budget for all random tuning together (default 420 s; quick 60 s)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 7; quick 3)")
    ap.add_argument("--min-time", type=float, default=None, help="seconds per timed block (default 0.05)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="tiny budgets (CI smoke test)")
    ap.add_argument("--write", action="store_true", help=f"update {DOC.relative_to(ROOT)} between its markers")
    args = ap.parse_args(argv)
    q = args.quick
    args.random = args.random if args.random is not None else (4 if q else 32)
    args.budget_s = args.budget_s if args.budget_s is not None else (60.0 if q else 420.0)
    if args.budget_minutes is not None:
        args.budget_s = min(args.budget_s, 30.0 * args.budget_minutes)
    args.rounds = args.rounds if args.rounds is not None else (3 if q else 7)
    args.min_time = args.min_time if args.min_time is not None else (0.01 if q else 0.05)
    return args


def select_ops(spec: str) -> dict[str, Task]:
    out = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        if item in SUITE:
            out[item] = SUITE[item]
        elif ":" in item:
            task = parse_spec(item.replace(";", ","))
            out[task.name] = task
        else:
            raise SystemExit(f"unknown op {item!r}; suite: {', '.join(SUITE)} (or KIND:key=value;...)")
    return out


def select_suites(spec: str) -> tuple[dict[str, Task], dict[str, str]]:
    """The ops of the named ``felixjax.suites`` (by task name, first suite wins) and each one's suite."""
    from felixjax.suites import suite

    tasks, where = {}, {}
    for name in filter(None, (s.strip() for s in spec.split(","))):
        for task in suite(name):
            if task.name not in tasks:
                tasks[task.name], where[task.name] = task, name
    return tasks, where


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    load_start = os.getloadavg()[0]
    target = Target.cpu()
    threads = sorted({int(t) for t in (args.threads or f"1,{target.cores}").split(",")})
    where: dict[str, str] = {}
    if args.suites:
        tasks, where = select_suites(args.suites)
        if args.only:
            keep = [k.strip() for k in args.only.split(",") if k.strip()]
            tasks = {k: t for k, t in tasks.items() if any(x in k for x in keep)}
    else:
        tasks = select_ops(args.ops)
    skipped: list[str] = []
    bandwidth: dict[int, float] = {}
    tune_protocol = TimingProtocol.quick() if args.quick else TimingProtocol(warmup=0, min_repeat_ms=10, repeats=2)
    # Cheapest first, so budget a small op leaves unused flows to the big ones.
    order = sorted(tasks.items(), key=lambda kv: kv[1].flops)
    rows: list[Row] = []
    peaks: dict[int, float] = {}
    tune_spent = 0.0
    pairs_left = len(order) * len(threads)
    # Peak is a maximum: the best of many short repeats, so a time slice lost to a neighbour does not count.
    peak_protocol = TimingProtocol(warmup=5, min_repeat_ms=2.0, repeats=50)
    probes: dict[int, float] = {}
    with LocalRunner(protocol=tune_protocol) as runner:
        probes[1] = measure_fp32_peak(1, runner=runner, target=target, protocol=peak_protocol)
        for t in threads:
            if t not in probes:
                probes[t] = measure_fp32_peak(t, runner=runner, target=target, protocol=peak_protocol)
            # T cores can do at least T times one core; a T-thread probe below that means a busy machine.
            peaks[t] = max(probes[t], t * probes[1])
            _log(f"fp32 peak at {t} thread(s): {peaks[t]:.1f} GFLOP/s (probe now: {probes[t]:.1f})")
            if args.suites:
                bandwidth[t] = measure_bandwidth(t)
                _log(f"copy bandwidth at {t} thread(s): {bandwidth[t]:.1f} GB/s")
            for key, task in order:
                share = max(args.budget_s - tune_spent, 0.0) / pairs_left
                pairs_left -= 1
                if args.budget_minutes is not None and time.perf_counter() - started > 60 * args.budget_minutes:
                    skipped.append(f"{task.name} at {t} thread(s)")
                    continue
                row = bench_op(key, task, t, target=target, runner=runner, trials=args.random,
                               tune_seconds=max(share, 1.0), tune_protocol=tune_protocol, rounds=args.rounds,
                               min_time_s=args.min_time, seed=args.seed)
                tune_spent += row.tune_s
                row.suite = where.get(key, "")
                rows.append(row)
                _log(f"{task.name} threads={t}: done in {row.seconds:.1f} s "
                     f"({row.random_trials} random trials); total {time.perf_counter() - started:.0f} s")
    suite_order = list(tasks)
    rows.sort(key=lambda r: (r.threads, suite_order.index(r.key)))
    tables = render_tables(rows, peaks, probes, target.cores)
    elapsed = time.perf_counter() - started
    commit = _git("rev-parse", "--short", "HEAD") or "unknown"
    if _git("status", "--porcelain", "--untracked-files=no"):
        commit += " (with uncommitted changes)"
    command = "python " + " ".join(shlex.quote(a) for a in
                                   [os.path.relpath(sys.argv[0], ROOT) if sys.argv[0] else "benchmarks/kernels.py",
                                    *(sys.argv[1:] if argv is None else argv)])
    header = [
        f"Measured {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC at commit {commit} "
        f"with `{command}` ({elapsed / 60:.1f} min).",
        "",
        *machine_lines(target),
        f"- protocol: {args.rounds} interleaved rounds per op, blocks of >= {args.min_time * 1e3:.0f} ms; "
        f"random: {args.random} schedules per op and thread count, {args.budget_s:.0f} s tuning budget in all; "
        "same thread count for every contender; onnxruntime at its default session options (spinning on), "
        "a 0.1 s pause and 2 untimed calls before every timed block; numpy BLAS threads limited; "
        "jax pinned to the first N cores when N < all.",
        f"- load average (1 min) at start / end: {load_start:.1f} / {os.getloadavg()[0]:.1f} on {target.cores} "
        "cores (this run's own load is about 1; well above that, other jobs shared the cores and the numbers "
        "are noisy, multi-threaded ones most)",
        "",
    ]
    if skipped:
        header.append(f"- skipped (past --budget-minutes {args.budget_minutes:g}): {', '.join(skipped)}")
        header.append("")
    text = "\n".join(header) + "\n" + tables
    if args.suites:
        text += "\n" + ratio_report(rows, peaks, bandwidth, write_images=args.write)
    print(text)
    if args.write:
        write_doc(text)
        _log(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
