"""Per-call overhead from Python: wall time of a call minus the same work timed by its C loop.

* network: ``exe(x)`` of a built network (``fj.build_model``, default schedules) against
  ``exe.timeit(x)`` (``fj_model_time_with``: the whole network ``number`` times in C);
* kernel: a kernel as ``res.kernel()`` returns it (:class:`codegen.runtime.Kernel`), called as
  ``k(x, w)`` and bound (``k.bind(w)(x)``), against its harness's ``fj_time`` loop. ``--tune N`` gets
  the kernel from a real ``fj.tune`` of ``N`` trials; without it, the default schedule is built
  through the same class (what ``res.kernel()`` builds, minus the tuning).

Both sides run interleaved in blocks (a few untimed calls before each), and the report gives the
median over blocks of (wall per call - C per call) and the fastest wall block minus the fastest C
block ("min-min", the steadier figure on a busy machine), in microseconds. Every Python call returns
a fresh output array (checked). Issue 14's target: under 5 us.

    python benchmarks/overhead.py                      # transformer block seq 16 dim 32 (~0.4 MFLOP)
    python benchmarks/overhead.py --threads 1 --blocks 30
    python benchmarks/overhead.py --tune 8             # a tuned kernel (takes a minute)
    python benchmarks/overhead.py --clock cpu          # a busy machine: thread CPU time, not wall time
    python benchmarks/overhead.py --paths fastcall,ctypes   # the C-extension call path next to ctypes

Timings on a loaded machine are noisy: compare the figures of one run, never across machines.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import time

import numpy as np


_CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def _block(call, c_loop, number: int, warm: int = 5, clock: str = "wall") -> tuple[float, float]:
    """One interleaved block: ``number`` Python calls, then the C loop; returns (Python per call, C per
    call) in seconds. ``clock="wall"``: wall time (the C loop times itself); ``"cpu"``: this thread's CPU
    time around both loops, which leaves out the time other processes hold the core (a busy machine;
    with 1 OpenMP thread all the work runs on the calling thread)."""
    for _ in range(warm):
        call()
    now = _CLOCKS[clock]
    t0 = now()
    for _ in range(number):
        call()
    py = (now() - t0) / number
    c_loop(warm)
    if clock == "wall":
        return py, c_loop(number) / number
    t0 = now()
    c_loop(number)
    return py, (now() - t0) / number


def _report(blocks: list[tuple[float, float]]) -> str:
    """Median over blocks of (wall - C), and min wall - min C: on a busy machine the minima are the
    steadier estimate of what a call costs by itself (neighbours only ever add time)."""
    diffs = [w - c for w, c in blocks]
    best = min(w for w, _ in blocks) - min(c for _, c in blocks)
    return (f"{1e6 * statistics.median(diffs):7.2f} us median (min-min {1e6 * best:6.2f} us; "
            f"blocks {1e6 * min(diffs):.2f} .. {1e6 * max(diffs):.2f})")


def network_contenders(args, tag: str) -> list[tuple]:
    import felixjax as fj
    from felixjax import zoo
    from felixjax.onnx_import import load_onnx

    proto = zoo.make_model("transformer_block", seq=args.seq, dim=args.dim, heads=2)
    model = load_onnx(proto)
    exe = fj.build_model(model, threads=args.threads)
    x = np.random.default_rng(0).standard_normal(exe.net.input_shapes[0]).astype(np.float32)
    y1, y2 = exe(x), exe(x)
    assert y1 is not y2 and np.array_equal(y1, y2), "calls must return fresh, equal outputs"
    ins = exe._inputs(x)
    outs = exe.library.new_outputs()
    c_loop = lambda n: exe.library.timeit(ins, outs, n)  # noqa: E731
    c_loop(50)  # warm
    what = f"network {model.name} ({len(model.tasks)} tasks, {exe.net.steps} steps)"
    return [(f"{what}, exe(x){tag}", lambda: exe(x), c_loop),
            (f"{what}, checked path exe.library([x]){tag}", lambda: exe.library([x]), c_loop)]


def _kernel(args):
    import felixjax as fj
    from codegen.build import build
    from codegen.lower import lower
    from codegen.render_c import render
    from codegen.runtime import Kernel
    from codegen.space import Space, default_sketch

    task = fj.ops.dense(args.rows, args.dim, args.dim, bias=True, act="relu")
    target = fj.Target.cpu()
    if args.tune:
        res = fj.tune(task, trials=args.tune, strategy="random", db=None, progress=False)
        return task, res.kernel(threads=args.threads), f"tuned ({args.tune} trials)"
    sp = Space(task, default_sketch(task, target), target)
    plan = lower(sp, sp.default())
    return task, Kernel(plan, build(render(plan)).lib_path, threads=args.threads), "default schedule"


def kernel_contenders(args, tag: str) -> list[tuple]:
    task, k, how = _kernel(args)
    arrays = task.random_inputs()
    x, w, rest = arrays[0], arrays[1], arrays[2:]
    bound = k.bind(w)
    y1, y2 = bound(x, *rest), bound(x, *rest)
    assert y1 is not y2 and np.array_equal(y1, y2), "calls must return fresh, equal outputs"
    assert np.array_equal(k(x, w, *rest), y1)
    fn = k._lib.fj_time
    fn.restype = ctypes.c_double
    ptrs = bound._ptrs  # the bound kernel's argument array (data, weights, ..., out, workspace), set by its last call
    c_loop = lambda n: fn(ptrs, ctypes.c_long(n))  # noqa: E731
    c_loop(100)  # warm
    return [(f"kernel {task.name}, k(x, w, ...), {how}{tag}", lambda: k(x, w, *rest), c_loop),
            (f"kernel {task.name}, k.bind(w)(x, ...), {how}{tag}", lambda: bound(x, *rest), c_loop)]


def contenders(args) -> list[tuple]:
    """(name, call, C loop) per path in ``--paths``: ``fastcall`` (codegen.fastcall, the default where it
    builds) and ``ctypes`` (``FELIXJAX_NO_FASTCALL=1``, the path before it), built side by side."""
    out = []
    for path in args.paths.split(","):
        if path not in ("fastcall", "ctypes"):
            raise SystemExit(f"--paths: fastcall or ctypes, got {path!r}")
        saved = os.environ.pop("FELIXJAX_NO_FASTCALL", None)
        if path == "ctypes":
            os.environ["FELIXJAX_NO_FASTCALL"] = "1"
        try:
            tag = f" [{path}]" if "," in args.paths else ""
            out += network_contenders(args, tag) + kernel_contenders(args, tag)
        finally:
            os.environ.pop("FELIXJAX_NO_FASTCALL", None)
            if saved is not None:
                os.environ["FELIXJAX_NO_FASTCALL"] = saved
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--blocks", type=int, default=15)
    ap.add_argument("--number", type=int, default=200, help="calls per timed block")
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--rows", type=int, default=1, help="rows of the kernel's dense layer")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall: wall time (a quiet machine); cpu: the thread's CPU time (a busy machine, 1 thread)")
    ap.add_argument("--tune", type=int, default=0, help="trials of a real fj.tune for the kernel (0: default)")
    ap.add_argument("--paths", default="fastcall",
                    help="per-call paths to time side by side: fastcall, ctypes, or fastcall,ctypes")
    args = ap.parse_args(argv)
    found = contenders(args)
    blocks: dict[str, list] = {name: [] for name, _, _ in found}
    for _ in range(args.blocks):  # interleaved: every contender's block in turn
        for name, call, c_loop in found:
            blocks[name].append(_block(call, c_loop, args.number, clock=args.clock))
    rows = [{"what": name, "c_us": 1e6 * min(c for _, c in over), "overhead": over} for name, over in blocks.items()]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"# per-call overhead = wall time of a Python call - the same work in its C loop "
          f"({args.blocks} interleaved blocks of {args.number} calls, {args.threads} thread(s), {args.clock} clock; C: the fastest "
          f"block's per call; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores); "
          f"commit {commit}; {' '.join(['python'] + sys.argv)}")
    for r in rows:
        print(f"{r['what']:<80} C {r['c_us']:8.2f} us/call   overhead {_report(r['overhead'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
