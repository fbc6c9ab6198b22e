"""Probe (issue 15, lever 6): what does a large ``unroll`` knob buy, and what does it cost to compile?

The unroll knob is a *max* unroll step of the innermost reduction loop (``#pragma GCC unroll n``),
capped at ``codegen.space.MAX_UNROLL_STEP`` (64) since this probe, and by the renderer so the unrolled
body stays under ``MAX_UNROLLED_FMAS`` statements. Gradient descent on the cost model tends to end at the top of the knob's box (log2 unroll 8-9), and a 1-row
dense block of 5 vectors unrolled 256 times takes gcc ~12 s where 64 takes ~0.5 s: on real hardware
gradient search then spends most of its seconds compiling (a 32-trial dense run: 72 s of builds vs
genetic's 9 s). This script measures, for a few kernels and each unroll step, with both caps lifted:
gcc's compile time (fresh cache each time), and the kernel's speed (interleaved in one process, user-mode cycles where ``perf_event_open`` is allowed,
else wall time), each kernel checked against numpy before and after timing.

Run: ``python benchmarks/unroll_probe.py [--threads 1] [--rounds 7] [--event cycles|none]`` (~3 min).
"""
from __future__ import annotations

import argparse
import importlib
import json
import tempfile

import numpy as np

from codegen.build import build
from codegen.lower import lower
from codegen.ops import conv2d, dense, matmul
from codegen.render_c import render
from codegen.renderers import cstyle
from codegen.space import Config, Space, default_config, default_sketch
from codegen.target import Target
from felixjax import cycles
from felixjax.baselines import KernelContender, time_interleaved

UNROLLS = (8, 32, 64, 128, 256, 512)


def _cases(target: Target) -> list[tuple[str, object, Config]]:
    """(label, task, base config): default schedules of kernels inside and outside the suites, plus
    the 1-row dense block gradient search picked on ``fresh``'s dense 1280 -> 1000."""
    out = []
    for task in (dense(1, 1280, 1000), matmul(257, 96, 384), dense(1, 2048, 512), matmul(192, 320, 200),
                 conv2d(1, 96, 20, 20, out_channels=96, kernel=3, padding=1)):
        sp = Space(task, default_sketch(task, target), target)
        out.append((f"{task.name} default", task, default_config(sp)))
    out.append(("dense_1x1280_1000 1x5-vector block", dense(1, 1280, 1000),
                Config("gemm_packed", ((1, 1, 1, 1), (1, 1, 1, 1), (1, 1, 25, 40), (2, 640)), 1, 8, 1)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--event", default="cycles", help="cycles (default, where allowed) or none: wall time")
    args = ap.parse_args()
    event = None if args.event == "none" or not cycles.available() else args.event
    target = Target.cpu()
    cstyle.MAX_UNROLLED_FMAS = 1 << 30  # the caps lifted: the knob's raw effect
    importlib.import_module("codegen.lower").MAX_UNROLL_STEP = 1 << 30  # the module (codegen.lower is also a function)
    print(f"unit: {'M' + event if event else 'ms wall'} per call (median of {args.rounds} interleaved blocks)")
    print("| kernel | unroll | compile s | time | vs unroll 8 |")
    print("|---|---:|---:|---:|---:|")
    for label, task, base in _cases(target):
        sp = Space(task, base.sketch, target)
        arrays = task.random_inputs(0)
        expected = task.reference(*arrays)
        contenders, compile_s = {}, {}
        for u in UNROLLS:
            cfg = Config(base.sketch, base.tiles, base.parallel, base.vec, u, base.extra)
            sp.validate(cfg)
            plan = lower(sp, cfg)
            with tempfile.TemporaryDirectory() as cache:
                b = build(render(plan), cache_dir=cache, timeout_s=300)
                assert b.status == "ok", b.error[:300]
                # the library must outlive the temporary cache: rebuild into the shared cache (cached
                # there when it was built before; its compile time is the fresh one above)
                compile_s[u] = b.seconds
            b = build(render(plan), timeout_s=300)
            c = KernelContender(plan, b.lib_path, arrays, threads=args.threads, expected=expected, name=str(u))
            c.check()
            contenders[u] = c
        times = time_interleaved(contenders, rounds=args.rounds, event=event)
        for c in contenders.values():
            c.check(run=False)
        med = {u: float(np.median(v)) for u, v in times.items()}
        scale = 1e-6 if event else 1e3
        for u in UNROLLS:
            print(f"| {label} | {u} | {compile_s[u]:.2f} | {med[u] * scale:.3f} | {med[8] / med[u]:.3f}x |",
                  flush=True)
    print(json.dumps({"threads": args.threads, "event": event}))


if __name__ == "__main__":
    main()
