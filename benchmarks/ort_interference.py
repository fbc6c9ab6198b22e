"""Does onnxruntime in the same process slow our build down? (issue 14: the 2-thread network gap)

Session 18 (AVX2 EPYC) saw a 2-thread ResNet-18 build run 1.45x slower timed beside onnxruntime than
the sum of its own per-step profile, and suspected onnxruntime's spinning worker threads (its default
``allow_spinning``) of stealing a core after each of its runs. This script tests that directly:

1. our build's whole-network C loop (``library.timeit``) alone, before any onnxruntime session exists;
2. the same after an onnxruntime block (default session options, same threads), for several pauses
   between the two (0 s, the benchmarks' 0.1 s, 0.5 s, 2 s), with 2 untimed runs of ours first;
3. during each of our timed blocks, the CPU time (``/proc/self/task/*/stat``, user + system ticks) of
   every thread of the process: onnxruntime's workers spinning through our block would show up as
   ticks on threads that are not ours;
4. ours alone again at the end.

Outputs are checked against onnxruntime once. A build slowed by onnxruntime shows (2) above (1) and (4),
falling with the pause, and foreign threads with ticks.

Usage:
    python benchmarks/ort_interference.py --model resnet18 --dataset imagenet --threads 2
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import felixjax as fj  # noqa: E402
from codegen.target import Target  # noqa: E402
from felixjax.network import build_model  # noqa: E402
from felixjax.ort_compare import _ort_session  # noqa: E402


def thread_ticks() -> dict[str, int]:
    """User + system clock ticks of every thread of this process, by thread id."""
    out = {}
    for tid in os.listdir(f"/proc/{os.getpid()}/task"):
        try:
            fields = Path(f"/proc/{os.getpid()}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        out[tid] = int(fields[11]) + int(fields[12])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--dataset", default="imagenet")
    ap.add_argument("--db", default=None, help="tuning database (default: every task's default schedule)")
    ap.add_argument("--layout", default="nchw", help="nchw | nchwc (felixjax.layout)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--block-s", type=float, default=0.3, help="seconds per timed block of ours")
    ap.add_argument("--pauses", default="0,0.1,0.5,2", help="comma-separated pauses after onnxruntime (s)")
    args = ap.parse_args(argv)

    proto = fj.zoo.make_model(args.model, dataset=args.dataset, seed=0)
    exe = build_model(fj.load_onnx(proto, layout=args.layout), Target.cpu(), db=args.db, threads=args.threads)
    exe.set_threads(args.threads)
    rng = np.random.default_rng(0)
    ins = [rng.standard_normal(s).astype(np.float32) for s in exe.net.input_shapes]
    lib_in, lib_out = exe._inputs(ins), exe.library.new_outputs()
    ours_tids: set[str] = set()

    def ours(n: int) -> float:
        return exe.library.timeit(lib_in, lib_out, n)

    ours(3)
    number = max(3, int(args.block_s / (ours(2) / 2)))
    ours_tids |= set(thread_ticks())  # the Python thread and our OpenMP team (onnxruntime not loaded yet)

    def block() -> tuple[float, int]:
        """ms per run of one timed block of ours; ticks spent meanwhile by threads that are not ours."""
        before = thread_ticks()
        ms = ours(number) / number * 1e3
        after = thread_ticks()
        foreign = sum(t - before.get(k, 0) for k, t in after.items() if k not in ours_tids)
        return ms, foreign

    alone = [block()[0] for _ in range(args.rounds)]
    sess = _ort_session(proto, args.threads)
    feed = dict(zip([i.name for i in sess.get_inputs()], ins))
    ref = sess.run(None, feed)
    err = max(float(np.abs(y - r).max() / max(np.abs(r).max(), 1e-30)) for y, r in zip(exe.run(ins), ref))
    if not err <= 1e-3:
        raise SystemExit(f"our build differs from onnxruntime: max |diff| / max |ref| = {err:.3g}")

    def ort_block() -> float:
        t0 = time.perf_counter()
        for _ in range(number):
            sess.run(None, feed)
        return (time.perf_counter() - t0) / number * 1e3

    ort_block()
    rows = []
    for pause in (float(p) for p in args.pauses.split(",")):
        mine, theirs, foreign = [], [], []
        for _ in range(args.rounds):
            theirs.append(ort_block())
            time.sleep(pause)
            ours(2)
            ms, ticks = block()
            mine.append(ms)
            foreign.append(ticks)
        rows.append((pause, statistics.median(mine), min(mine), statistics.median(theirs), sum(foreign)))
    after = [block()[0] for _ in range(args.rounds)]

    hz = os.sysconf("SC_CLK_TCK")
    print(f"{args.model} ({args.dataset}, {args.layout}), {args.threads} thread(s), db {args.db}; "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; {number} runs per block, "
          f"{args.rounds} blocks per row; max |ours - onnxruntime| / max |onnxruntime| {err:.1e}")
    print()
    print("| ours timed | ours ms (median / min) | onnxruntime ms | ticks of other threads during our blocks |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| alone, before onnxruntime exists | {statistics.median(alone):.3f} / {min(alone):.3f} | | |")
    for pause, med, best, ort_ms, ticks in rows:
        print(f"| after an onnxruntime block, {pause:g} s pause | {med:.3f} / {best:.3f} | {ort_ms:.3f} | "
              f"{ticks} ({ticks / hz * 1e3:.0f} ms) |")
    print(f"| alone, at the end | {statistics.median(after):.3f} / {min(after):.3f} | | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
