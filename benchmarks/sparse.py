"""Sparse and channel-pruned layers on this CPU (issue 16): the sparse rows of a DLAS-style table.

For each layer (a 3x3 conv, a 1x1 conv, a depthwise conv, a batch-1 dense layer, a transformer-style
matmul; the shapes of ``benchmarks/lowp.py``) and each thread count, four variants of the same layer:

* ``fp32``: the dense float32 layer;
* ``sp50`` / ``sp90``: 50% / 90% unstructured zero weights (``sparsity=``; the sparse sketch; a
  depthwise conv has no sparse kernel: groups > 1, reported as n/a);
* ``pruned50``: 50% channel pruning: the layer's output channels halved and, as the next layer of a
  pruned network sees it, its input channels too (depthwise: its channels halved).

each with its default schedule and tuned (``fj.tune``, the same strategy and number of trials for every
variant), then every schedule re-timed interleaved (A B C ... A B C ..., ``--rounds``) through the
measuring process, whose output check against ``Task.reference`` runs before and after every timing.
The dense layer is timed twice: warm caches, and flushed before every call (``TimingProtocol(
flush_cache=True, min_repeat_ms=0, flush_bytes=64 MiB)``).

Speedups are ratios of medians in this run: achieved = fp32 latency / variant latency (default vs
default, tuned vs tuned); expected = the FLOP ratio, as in DLAS (sparsity s: 1 / (1 - s); pruning:
the dense over the pruned layer's FLOPs). Targets (issue 16): the 90%-sparse batch-1 dense layer
>= 3x the tuned fp32 dense layer at equal trials; 50% channel pruning >= 60% of its expected speedup.

Usage:
    python benchmarks/sparse.py                       # full table, 1 and 2 threads (~1 h on 2 cores)
    python benchmarks/sparse.py --quick               # smoke run: small layers, 3 trials, 1 thread
    python benchmarks/sparse.py --trials 64 --strategy gradient --threads 1 --out results/sparse.md
    python benchmarks/sparse.py --json results/sparse.json   # rows for benchmarks/lowp.py --merge
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
try:
    import felixjax  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT))

import numpy as np

import felixjax as fj
from codegen.measure import LocalRunner, TimingProtocol
from codegen.ops import Task, conv2d, dense, depthwise_conv2d, matmul
from codegen.space import Config, Space, default_sketch
from codegen.sparse import expected_speedup
from codegen.target import Target
from felixjax.measurer import Measurer

VARIANTS = ("fp32", "sp50", "sp90", "pruned50")


def layers(quick: bool) -> dict[str, Task]:
    """The layers of the table, the shapes and names of ``benchmarks/lowp.py`` (``quick``: small ones)."""
    if quick:
        return {"conv3x3": conv2d(1, 16, 14, 14, out_channels=16, kernel=3, padding=1),
                "conv1x1": conv2d(1, 32, 14, 14, out_channels=16, kernel=1),
                "dwconv3x3": depthwise_conv2d(1, 32, 14, 14, kernel=3, padding=1),
                "dense_b1": dense(1, 512, 512),
                "matmul": matmul(32, 64, 64)}
    return {"conv3x3": conv2d(1, 64, 56, 56, out_channels=64, kernel=3, padding=1),
            "conv1x1": conv2d(1, 256, 28, 28, out_channels=128, kernel=1),
            "dwconv3x3": depthwise_conv2d(1, 128, 56, 56, kernel=3, padding=1),
            "dense_b1": dense(1, 1024, 1024),
            "matmul": matmul(128, 768, 768)}


def variant(task: Task, name: str) -> Task | None:
    """``task`` as variant ``name`` (None: no such kernel, e.g. a sparse depthwise conv)."""
    if name == "fp32":
        return task
    p = task.p
    if name.startswith("sp"):
        s = int(name[2:]) / 100
        if task.op == "conv2d" and p["groups"] != 1:
            return None
        if task.op == "dense":
            return dense(p["n"], p["in"], p["out"], sparsity=s)
        if task.op == "matmul":
            return matmul(p["m"], p["n"], p["k"], sparsity=s)
        return conv2d(p["n"], p["c"], p["h"], p["w"], out_channels=p["k"], kernel=(p["r"], p["s"]),
                      stride=p["stride"], padding=p["pad"], sparsity=s)
    # pruned50: output channels halved, and the input channels (the previous layer's outputs) too
    if task.op == "dense":
        return dense(p["n"], p["in"] // 2, p["out"] // 2)
    if task.op == "matmul":
        return matmul(p["m"], p["n"] // 2, p["k"] // 2)
    if p["groups"] != 1:
        return depthwise_conv2d(p["n"], p["c"] // 2, p["h"], p["w"], kernel=(p["r"], p["s"]), stride=p["stride"],
                                padding=p["pad"])
    return conv2d(p["n"], p["c"] // 2, p["h"], p["w"], out_channels=p["k"] // 2, kernel=(p["r"], p["s"]),
                  stride=p["stride"], padding=p["pad"])


def expected(base: Task, task: Task) -> float:
    """DLAS's expected speedup of ``task`` over ``base``: the FLOP ratio."""
    if task.sparsity:
        return expected_speedup(task.sparsity)
    return base.flops / task.flops


@dataclass
class Cell:
    layer: str
    variant: str
    threads: int
    task: Task
    expected: float
    configs: dict[str, Config] = field(default_factory=dict)  # "default" / "tuned"
    times: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # (schedule, cache) -> seconds
    errors: list[str] = field(default_factory=list)

    def median(self, schedule: str, cache: str) -> float:
        v = self.times.get((schedule, cache), [])
        return float(np.median(v)) if v else float("nan")


def tune(task: Task, target: Target, threads: int, args, db: str) -> Config:
    # one run per thread count (the database also keys records by thread count since b33f6e3; before,
    # a 2-thread tuning resumed, and reused, the 1-thread one)
    res = fj.tune(task, target, strategy=args.strategy, trials=args.trials, seed=args.seed, db=db, threads=threads,
                  run=f"sparse:{threads}t", progress=False, retime=0)
    if res.best is None:
        raise RuntimeError(f"{task.name}: no correct kernel in {args.trials} trials")
    return res.best.config


def time_all(cells: list[Cell], target: Target, protocol: TimingProtocol, cache: str, rounds: int) -> None:
    """Every (cell, schedule) timed once per round, interleaved; output checked by the measuring process."""
    with LocalRunner(protocol=protocol) as runner:
        measurers = {}
        for _ in range(rounds):
            for c in cells:
                key = (c.task, c.threads)
                if key not in measurers:
                    measurers[key] = Measurer(c.task, target, runner, threads=c.threads, protocol=protocol)
                for sched, cfg in c.configs.items():
                    got: list = []
                    measurers[key].measure([cfg], lambda cf, res, got=got: got.append(res) or True)
                    r = got[0]
                    if r.ok:
                        c.times.setdefault((sched, cache), []).append(r.latency_s)
                    else:
                        c.errors.append(f"{sched}/{cache}: {r.status} {r.error[:120]}")
                time.sleep(0.05)


def speedup(base: Cell, c: Cell, sched: str, cache: str) -> float:
    return base.median(sched, cache) / c.median(sched, cache)


def table(cells: list[Cell], caches: dict[str, list[str]]) -> list[str]:
    lines = [("| layer | variant | threads | cache | default µs | tuned µs | expected | achieved default | "
              "achieved tuned | tuned / expected |"), "|---|---|---|---|---|---|---|---|---|---|"]
    base = {(c.layer, c.threads): c for c in cells if c.variant == "fp32"}
    for c in cells:
        for cache in caches.get(c.layer, ["warm"]):
            b = base[(c.layer, c.threads)]
            sd, st = speedup(b, c, "default", cache), speedup(b, c, "tuned", cache)
            lines.append(f"| {c.layer} | {c.variant} | {c.threads} | {cache} | {1e6 * c.median('default', cache):.1f} | "
                         f"{1e6 * c.median('tuned', cache):.1f} | {c.expected:.2f}x | {sd:.2f}x | {st:.2f}x | "
                         f"{100 * st / c.expected:.0f}% |")
    return lines


def json_rows(cells: list[Cell], caches: dict[str, list[str]]) -> list[dict]:
    """Rows in the form of ``benchmarks/lowp.py`` (``--merge``): speedup vs our tuned fp32, expected =
    the FLOP ratio; the dtype column names the variant (``float32 sp90``, ``float32 pruned50``)."""
    base = {(c.layer, c.threads): c for c in cells if c.variant == "fp32"}
    rows = []
    for c in cells:
        for cache in caches.get(c.layer, ["warm"]):
            ref = base[(c.layer, c.threads)].median("tuned", cache)
            for sched in ("default", "tuned"):
                t = c.median(sched, cache)
                ok = bool(np.isfinite(t))
                speed = ref / t if ok else None
                dtype = "float32" if c.variant == "fp32" else f"float32 {c.variant}"
                rows.append({"layer": c.layer, "variant": sched, "dtype": dtype, "threads": c.threads,
                             "ms": 1e3 * t if ok else None, "speedup": speed, "expected": c.expected,
                             "achieved_over_expected": None if speed is None else speed / c.expected,
                             "note": f"{cache} caches; {c.configs[sched].sketch}"})
    return rows


def targets(cells: list[Cell]) -> list[str]:
    base = {(c.layer, c.threads): c for c in cells if c.variant == "fp32"}
    out = []
    for c in cells:
        b = base[(c.layer, c.threads)]
        if c.layer == "dense_b1" and c.variant == "sp90":
            for cache in ("warm", "flushed"):
                s = speedup(b, c, "tuned", cache)
                out.append(f"- 90%-sparse batch-1 dense vs tuned fp32 dense ({c.threads} thread(s), {cache}): "
                           f"{s:.2f}x, target >= 3x: {'holds' if s >= 3 else 'MISSED'}")
        if c.variant == "pruned50":
            s = speedup(b, c, "tuned", "warm")
            out.append(f"- 50% channel pruning, {c.layer} ({c.threads} thread(s)): {s:.2f}x of expected "
                       f"{c.expected:.2f}x = {100 * s / c.expected:.0f}%, target >= 60%: "
                       f"{'holds' if s >= 0.6 * c.expected else 'MISSED'}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small layers, 3 trials, 1 thread, 1 round (smoke run)")
    ap.add_argument("--trials", type=int, default=64, help="trials per tuned variant (the same for every variant)")
    ap.add_argument("--strategy", default="gradient", help="search strategy of every tuning run")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    ap.add_argument("--layers", default="", help="comma-separated subset of the layers")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="", help="also write the table (markdown) here")
    ap.add_argument("--json", default="", help="also write the rows as JSON here (benchmarks/lowp.py --merge)")
    args = ap.parse_args(argv)
    if args.quick:
        args.trials, args.threads, args.rounds = min(args.trials, 3), "1", 1
        args.strategy = "random" if args.strategy == "gradient" else args.strategy
    target = Target.cpu()
    threads = [int(t) for t in args.threads.split(",") if t]
    chosen = layers(args.quick)
    if args.layers:
        chosen = {k: v for k, v in chosen.items() if k in args.layers.split(",")}
    t0 = time.time()
    cells: list[Cell] = []
    with tempfile.TemporaryDirectory() as tmp:
        db = os.path.join(tmp, "sparse.db")
        for name, base in chosen.items():
            for v in VARIANTS:
                task = variant(base, v)
                if task is None:
                    print(f"{name} {v}: n/a (no sparse kernel for a grouped conv)", file=sys.stderr)
                    continue
                for t in threads:
                    c = Cell(name, v, t, task, expected(base, task))
                    c.configs["default"] = Space(task, default_sketch(task, target), target).default()
                    c.configs["tuned"] = tune(task, target, t, args, db)
                    print(f"[{time.time() - t0:6.0f} s] tuned {task.name} at {t} thread(s): {c.configs['tuned'].sketch}",
                          file=sys.stderr)
                    cells.append(c)
    time_all(cells, target, TimingProtocol(), "warm", args.rounds)
    flushed = [c for c in cells if c.layer == "dense_b1"]
    # 64 MiB written before each timed call: more than this machine's L3 share (the default, 2x L2, keeps a
    # 4 MiB weight matrix in L3)
    time_all(flushed, target, TimingProtocol(warmup=1, min_repeat_ms=0.0, repeats=15, max_number=1, flush_cache=True,
                                             flush_bytes=64 << 20), "flushed", args.rounds)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT,
                          check=False).stdout.strip()
    cmd = "python benchmarks/sparse.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    cpu = platform.processor() or platform.machine()
    lines = [(f"Sparse / pruned layers, {datetime.date.today()}, commit {head}, `{cmd}`; {cpu}, {target.cores} cores, "
              f"SIMD {target.simd_lanes} fp32 lanes; strategy {args.strategy}, {args.trials} trials per variant, "
              f"{args.rounds} interleaved round(s); medians. {time.time() - t0:.0f} s."), ""]
    lines += table(cells, {"dense_b1": ["warm", "flushed"]})
    lines += ["", "Targets:"] + targets(cells)
    errors = [f"- {c.layer} {c.variant} {c.threads}t: {e}" for c in cells for e in c.errors]
    if errors:
        lines += ["", "Errors:"] + errors
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(json_rows(cells, {"dense_b1": ["warm", "flushed"]}), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
