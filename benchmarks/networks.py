"""Network benchmark (issue 5): whole models tuned with a fixed budget, end to end against onnxruntime.

For each model (default: ResNet-18 and MobileNetV2 at CIFAR-10 shapes, batch 1) it

1. tunes every distinct task with ``fj.tune_model`` (Ansor's gradient task scheduler) under a budget of
   ``--trials-per-task`` times the number of tasks, and records the tuning wall time;
2. builds the model twice into one C library each: with the tuned schedules, and with every task's
   default schedule (the untuned baseline);
3. checks both builds against onnxruntime on a random input, then times the three contenders interleaved
   in one process (A B C A B C ..., ``--rounds`` blocks each of at least ``--min-time`` seconds), same
   thread count for all, onnxruntime at its default session options (spinning on; a pause before each
   timed block lets its threads go idle); our builds are timed by a loop in C,
   onnxruntime through IO binding to preallocated buffers.

Compare the ratios of one run, never absolute times across runs: the 2-core development VMs drift by up
to 1.5x within minutes.

Usage:
    python benchmarks/networks.py                              # 64 trials per task (tens of minutes)
    python benchmarks/networks.py --quick                      # smoke test: 2 trials per task
    python benchmarks/networks.py --trials-per-task 32 --models resnet18 --threads 1
    python benchmarks/networks.py --write                      # also update docs/BENCHMARKS.md
    python benchmarks/networks.py --layout both                # NCHW and NCHW8c builds side by side
"""
from __future__ import annotations

import argparse
import datetime
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout: `benchmarks` and `felixjax` importable
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import felixjax as fj  # noqa: E402
from codegen.measure import LocalRunner, TimingProtocol  # noqa: E402
from codegen.target import Target  # noqa: E402
from felixjax.network import _ort_session, build_model, time_interleaved, tune_model  # noqa: E402
from benchmarks.kernels import _git, machine_lines, write_doc  # noqa: E402

MODELS = ("resnet18", "mobilenet_v2")
BEGIN, END = "<!-- networks:begin -->", "<!-- networks:end -->"
DOC = ROOT / "docs" / "BENCHMARKS.md"


def _log(msg: str) -> None:
    print(f"[networks] {msg}", file=sys.stderr, flush=True)


def checked_blocks(proto, builds: dict, x: np.ndarray, threads: int, name: str) -> tuple[dict, dict]:
    """Block timers (``number`` runs -> seconds) of every build (its C loop) and of onnxruntime at its
    default session options (I/O bound once), after checking every build against onnxruntime on ``x``;
    also the builds' max relative errors."""
    sess = _ort_session(proto, threads)
    in_name = sess.get_inputs()[0].name
    ref = sess.run(None, {in_name: x})[0]
    errs = {}
    for label, exe in builds.items():
        errs[label] = float(np.abs(exe(x) - ref).max() / np.abs(ref).max())
        if errs[label] > 1e-3:
            raise AssertionError(f"{name} {label} build differs from onnxruntime: {errs[label]:.3g}")
    binding = sess.io_binding()
    binding.bind_input(in_name, "cpu", 0, np.float32, list(x.shape), x.ctypes.data)
    ort_out = np.empty(ref.shape, np.float32)
    binding.bind_output(sess.get_outputs()[0].name, "cpu", 0, np.float32, list(ref.shape), ort_out.ctypes.data)

    def ort_block(number: int, _bound=(x, ort_out)) -> float:  # the bound buffers live as long as the timer
        t = time.perf_counter()
        for _ in range(number):
            sess.run_with_iobinding(binding)
        return time.perf_counter() - t

    def lib_block(exe):
        ins, outs = exe._inputs([x]), exe.library.new_outputs()
        return lambda number: exe.library.timeit(ins, outs, number)

    return {**{label: lib_block(exe) for label, exe in builds.items()}, "onnxruntime": ort_block}, errs


def bench_model(name: str, dataset: str, *, target: Target, threads: int, trials_per_task: int, strategy: str,
                db: str, seed: int, rounds: int, min_time_s: float, runner: LocalRunner,
                layouts: tuple[str, ...] = ("nchw",), in_network: int = 3) -> dict:
    """Tune, build (tuned and default), check and time one zoo model against onnxruntime; with several
    ``layouts`` (``nchw``, ``nchwc``: :func:`felixjax.layout.block_channels`) each is tuned (one shared
    database: tasks the layouts share are tuned once) and built, and every build is timed in the same
    interleaved rounds. The first layout's builds are ``tuned`` / ``default``, the others'
    ``tuned-<layout>`` / ``default-<layout>``."""
    proto = fj.zoo.make_model(name, dataset=dataset, seed=0)
    builds, stats = {}, {"trials": 0, "tune_s": 0.0, "build_s": 0.0, "estimate_ms": {}, "tuned_tasks": 0, "tasks": 0}
    for i, layout in enumerate(layouts):
        model = fj.load_onnx(proto, layout=_mixed_plan(proto, target, threads, db) if layout == "mixed" else layout)
        n_tasks = len(model.tasks)
        budget = trials_per_task * n_tasks
        _log(f"{name} ({layout}): {n_tasks} tasks, {sum(w for _, w in model.tasks)} anchor ops; tuning {budget} "
             f"trials ({strategy})")
        suffix = "" if i == 0 else f"-{layout}"
        if budget == 0:  # --trials-per-task 0: build from the database as it is (re-time an earlier run)
            t0 = time.perf_counter()
            builds["tuned" + suffix] = build_model(model, target, db=db, threads=threads)
            builds["default" + suffix] = build_model(model, target, threads=threads)
            if any("inside a network" in s.note for s in builds["tuned" + suffix].schedules):
                _kernel_best_build(builds, suffix, model, target, threads, db)
            stats["build_s"] += time.perf_counter() - t0
            tuned = [s for s in builds["tuned" + suffix].schedules if s.source == "tuned"]
            stats["estimate_ms"][layout] = 1e3 * sum(s.weight * (s.latency_s or 0.0) for s in tuned)
            if i == 0:
                stats["tuned_tasks"], stats["tasks"] = len(tuned), n_tasks
            continue
        t0 = time.perf_counter()
        res = tune_model(model, target, trials=budget, db=db, strategy=strategy, seed=seed, threads=threads,
                         runner=runner, in_network=in_network, progress=lambda p: _log(
                             f"{name} round {p['round']} {p['task'].name}: {p['task_trials']} trials, "
                             f"network est. {p['estimate_s'] * 1e3:.3f} ms, {p['trials']}/{p['budget']}"))
        stats["tune_s"] += time.perf_counter() - t0
        _log(f"{name} ({layout}): tuned in {time.perf_counter() - t0:.0f} s\n{res.table()}")
        if res.selection is not None:
            _log(f"{name} ({layout}): schedules chosen inside the network\n{res.selection.table()}")
        t0 = time.perf_counter()
        builds["tuned" + suffix] = res.build(threads=threads)
        builds["default" + suffix] = build_model(model, target, threads=threads)
        if res.selection is not None and res.selection.kept:
            _kernel_best_build(builds, suffix, model, target, threads, db)
        stats["build_s"] += time.perf_counter() - t0
        stats["trials"] += res.trials
        stats["estimate_ms"][layout] = res.estimated_latency_s * 1e3
        if i == 0:
            stats["tuned_tasks"], stats["tasks"] = sum(t.best is not None for t in res.tasks), n_tasks

    rng = np.random.default_rng(seed)
    x = rng.standard_normal(fj.load_onnx(proto).input_shapes["input"]).astype(np.float32)
    blocks, errs = checked_blocks(proto, builds, x, threads, name)
    times = time_interleaved(blocks, rounds=rounds, min_time_s=min_time_s)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    # onnxruntime / tuned within each round (the blocks timed next to each other): robust to the host's slow
    # episodes, which move both contenders when they last a round or more
    paired = sorted(o / t for o, t in zip(times["onnxruntime"], times["tuned"]))
    best = {k: min(v) * 1e3 for k, v in times.items()}
    _log(f"{name}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in med.items()) + f" (medians of {rounds})")
    label = f"{name} ({dataset})" + ("" if layouts[0] == "nchw" else f", {layouts[0].upper()}")
    return {"model": label, "layouts": layouts, "median_ms": med, "min_ms": best, "errors": errs, "paired": paired,
            **stats,
            "estimate_ms": stats["estimate_ms"][layouts[0]]}


def _kernel_best_build(builds: dict, suffix: str, model, target: Target, threads: int, db: str) -> None:
    """For a tuned build holding schedules chosen inside the network (``tune_model(in_network=...)``),
    also build ``kernel-best``: every task with its fastest kernel alone (what it was before the choice),
    timed in the same rounds."""
    from felixjax.database import Database
    from felixjax.network_select import family_candidates

    key = target.at_threads(threads).key
    with Database(db, readonly=True) as d:
        configs = {t: c[0].config for t, _ in model.tasks if (c := family_candidates(d, t, key, 1))}
    builds["kernel-best" + suffix] = build_model(model, target, configs=configs, threads=threads)


def render(rows: list[dict], threads: int) -> str:
    out = [f"End to end, batch 1, {threads} thread(s); median (min) ms of the interleaved blocks; "
           "speedup = onnxruntime median / tuned build median.", "",
           "| model | tasks | trials | tuning wall time | default build | tuned build | onnxruntime | "
           "speedup vs onnxruntime | anchors (sum of tuned kernels) |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        m, b = r["median_ms"], r["min_ms"]
        out.append(f"| {r['model']} | {r['tasks']} | {r['trials']} | {r['tune_s'] / 60:.1f} min | "
                   f"{m['default']:.3f} ({b['default']:.3f}) | {m['tuned']:.3f} ({b['tuned']:.3f}) | "
                   f"{m['onnxruntime']:.3f} ({b['onnxruntime']:.3f}) | {m['onnxruntime'] / m['tuned']:.2f}x | "
                   f"{r['estimate_ms']:.3f} |")
    out.append("")
    for r in rows:
        for layout in r["layouts"][1:]:
            m, b = r["median_ms"], r["min_ms"]
            out.append(f"- {r['model']} with its convolutions in {layout.upper()} (`felixjax.layout`), same rounds: "
                       f"default build {m['default-' + layout]:.3f} ({b['default-' + layout]:.3f}) ms, tuned build "
                       f"{m['tuned-' + layout]:.3f} ({b['tuned-' + layout]:.3f}) ms: "
                       f"**{m['onnxruntime'] / m['tuned-' + layout]:.2f}x** onnxruntime, "
                       f"{m['tuned'] / m['tuned-' + layout]:.2f}x the {r['layouts'][0].upper()} tuned build")
    for r in rows:
        p = r["paired"]
        out.append(f"- {r['model']}: onnxruntime / tuned within each round: median **{statistics.median(p):.2f}x** "
                   f"({p[0]:.2f}-{p[-1]:.2f}x over {len(p)} rounds)")
    for r in rows:
        for key in [k for k in r["median_ms"] if k.startswith("kernel-best")]:
            m, b, tuned = r["median_ms"], r["min_ms"], "tuned" + key[len("kernel-best"):]
            out.append(f"- {r['model']}: the tuned build without its schedules chosen inside the network (each task's "
                       f"fastest kernel alone), same rounds: {m[key]:.3f} ({b[key]:.3f}) ms, "
                       f"{m['onnxruntime'] / m[key]:.2f}x onnxruntime; the in-network choice: "
                       f"**{m[key] / m[tuned]:.2f}x** faster")
    for r in rows:
        out.append(f"- {r['model']}: {r['tuned_tasks']}/{r['tasks']} tasks with a correct tuned kernel; both builds "
                   f"took {r['build_s']:.0f} s to compile; max |ours - onnxruntime| / max |onnxruntime|: tuned "
                   f"{r['errors']['tuned']:.1e}, default {r['errors']['default']:.1e}")
    return "\n".join(out) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS),
                    help=f"comma-separated zoo models (default {','.join(MODELS)})")
    ap.add_argument("--dataset", default="cifar10", help="cifar10 (32x32, default) | imagenet (224x224)")
    ap.add_argument("--trials-per-task", type=int, default=None,
                    help="tuning budget per task (default 64; quick 2; 0: no tuning, build from --db as it is)")
    ap.add_argument("--strategy", default=None, help="search strategy (default gradient if registered, else random)")
    ap.add_argument("--threads", type=int, default=None, help="threads of every contender (default: all cores)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds (default 7; quick 3)")
    ap.add_argument("--min-time", type=float, default=None, help="seconds per timed block (default 0.2; quick 0.05)")
    ap.add_argument("--db", default=None, help="tuning database (default: a fresh temporary one)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--in-network", type=int, default=3, metavar="K",
                    help="tune_model's in-network choice among each task's K fastest sketch families (0: off)")
    ap.add_argument("--layout", default="nchw",
                    help="the convolutions' layout: nchw (default), nchwc (channel-blocked, felixjax.layout), "
                         "mixed (each conv in the layout it ran faster in: felixjax.pipeline.mixed_layout), "
                         "both (nchw,nchwc) or a comma-separated list (the first is the reference build)")
    ap.add_argument("--quick", action="store_true", help="smoke test: tiny budgets")
    ap.add_argument("--write", action="store_true", help=f"update {DOC.relative_to(ROOT)} between its markers")
    args = ap.parse_args(argv)
    q = args.quick
    args.trials_per_task = args.trials_per_task if args.trials_per_task is not None else (2 if q else 64)
    args.rounds = args.rounds if args.rounds is not None else (3 if q else 7)
    args.min_time = args.min_time if args.min_time is not None else (0.05 if q else 0.2)
    if args.trials_per_task < 0 or args.rounds < 1:
        ap.error("--trials-per-task must be >= 0 (0: no tuning, build from --db as it is) and --rounds >= 1")
    if args.trials_per_task == 0 and not args.db:
        ap.error("--trials-per-task 0 re-times the builds of an existing --db: give one")
    return args


def _mixed_plan(proto, target: Target, threads: int, db: str) -> str | dict[str, str]:
    """The layout :func:`felixjax.choose_layout` measures fastest as a whole build (NCHW, NCHW8c, the
    per-conv plans of :func:`felixjax.pipeline.mixed_layout` and :func:`~felixjax.pipeline.fastest_plan`),
    with ``db``'s best records (each task's default schedule where it has none): a layout name or a per-conv
    mapping, as ``load_onnx(layout=...)`` takes; stored in ``db`` so that a re-timing builds the same tasks."""
    import json

    from felixjax.database import Database

    meta = f"networks.mixed_plan:{proto.graph.name}:{threads}"
    if db and Path(db).exists():  # the plan this database was tuned in (a re-timing builds the same tasks)
        with Database(db, readonly=True) as d:
            if (stored := d.get_meta(meta)) is not None:
                _log(f"mixed layout: the plan stored in {db}")
                return json.loads(stored)
    fresh = not (db and Path(db).exists())  # a fresh database (nothing tuned yet): the defaults
    plan, times = fj.choose_layout(proto, target, threads=threads, db=None if fresh else db)
    _log("layout: " + ", ".join(f"{k} {1e3 * v:.3f} ms" for k, v in times.items()) + ": "
         + (plan if isinstance(plan, str) else "{" + ", ".join(f"{k}: {v}" for k, v in plan.items()) + "}"))
    if db:
        with Database(db) as d:
            d.set_meta(meta, json.dumps(plan))
    return plan


def _layouts(arg: str) -> tuple[str, ...]:
    from felixjax.layout import LAYOUTS

    out = ("nchw", "nchwc") if arg == "both" else tuple(a.strip() for a in arg.split(",") if a.strip())
    bad = [a for a in out if a not in LAYOUTS + ("mixed",)]
    if bad or not out:
        raise SystemExit(f"--layout: unknown layout(s) {bad or arg!r}; known: {', '.join(LAYOUTS)}, mixed, both")
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    load_start = os.getloadavg()[0]
    target = Target.cpu()
    threads = args.threads or target.cores
    from felixjax.strategies import registered

    strategy = args.strategy or ("gradient" if "gradient" in registered() else "random")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        if m not in fj.zoo.MODELS:
            raise SystemExit(f"unknown model {m!r}; zoo: {', '.join(fj.zoo.MODELS)}")
    protocol = TimingProtocol.quick() if args.quick else TimingProtocol(warmup=0, min_repeat_ms=10, repeats=3)
    tmp = tempfile.TemporaryDirectory(prefix="felixjax-networks-")
    db = args.db or os.path.join(tmp.name, "networks.db")
    rows = []
    with LocalRunner(protocol=protocol) as runner:
        for name in models:
            rows.append(bench_model(name, args.dataset, target=target, threads=threads,
                                    trials_per_task=args.trials_per_task, strategy=strategy, db=db, seed=args.seed,
                                    rounds=args.rounds, min_time_s=args.min_time, runner=runner,
                                    layouts=_layouts(args.layout), in_network=args.in_network))
    tmp.cleanup()
    elapsed = time.perf_counter() - started
    commit = _git("rev-parse", "--short", "HEAD") or "unknown"
    if _git("status", "--porcelain", "--untracked-files=no"):
        commit += " (with uncommitted changes)"
    command = "python " + " ".join(shlex.quote(a) for a in ["benchmarks/networks.py",
                                                              *(sys.argv[1:] if argv is None else argv)])
    header = [
        f"Measured {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC at commit {commit} with "
        f"`{command}` ({elapsed / 60:.1f} min).",
        "",
        *machine_lines(target),
        f"- tuning: {strategy} search, {args.trials_per_task} trials per task, Ansor's gradient task scheduler; "
        f"kernels measured with {threads} thread(s)",
        f"- timing: {args.rounds} interleaved rounds, blocks of >= {args.min_time * 1e3:.0f} ms; same threads for "
        "every contender; onnxruntime: default session options (spinning on), 0.1 s pause + 2 untimed calls "
        "before every timed block; ours: libgomp defaults",
        f"- load average (1 min) at start / end: {load_start:.1f} / {os.getloadavg()[0]:.1f} on {target.cores} cores "
        "(well above 1, other jobs shared the cores and the numbers are noisy)",
        "",
    ]
    text = "\n".join(header) + "\n" + render(rows, threads)
    print(text)
    if args.write:
        write_doc(text, DOC, begin=BEGIN, end=END, heading="Networks (benchmarks/networks.py)")
        _log(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
