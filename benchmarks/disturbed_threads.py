"""Does the disturbance check see a busy machine under 2-thread kernels? (session 74)

Each kernel (3 operators x 3 configs, 2 threads) is timed with one attempt per measurement
(``remeasure=0``), first on the quiet machine, then beside ``--busy`` processes spinning on the CPUs.
Every timing attempt is judged by both rules from the same numbers:

* old: wall time > 1.5 x the process's CPU time (all threads);
* new: that, or one thread of the kernel waited more than a third of the time for a CPU (its
  run-queue delay, ``/proc/self/task/*/schedstat``).

Printed: per phase, how many timings each rule flags, and how slow the timings each rule lets
through are against the quiet median of the same kernel (median and worst ratio). A good rule flags
nothing on the quiet machine and lets no slow timing through on the busy one.

    python benchmarks/disturbed_threads.py            # ~2 min on the 2-vCPU machine
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import numpy as np

import codegen.measure as cm
import felixjax as fj
from codegen.measure import LocalRunner
from codegen.measure_records import disturbed
from felixjax.measurer import Measurer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--busy", type=int, default=1, help="spinning processes in the busy phase (default 1)")
    ap.add_argument("--repeats", type=int, default=4, help="timings per kernel and phase (default 4)")
    args = ap.parse_args()
    seen: list = []
    interpret = cm._interpret

    def spy(out, max_ratio):  # the child's attempts (wall, cpu, longest wait) as the parent receives them
        seen.append([tuple(a) for a in out.get("attempts") or []])
        return interpret(out, max_ratio)

    cm._interpret = spy
    tg = fj.Target.cpu()
    rng = np.random.default_rng(0)
    tasks = [fj.ops.matmul(256, 256, 256), fj.ops.conv2d(1, 64, 28, 28, out_channels=64, kernel=3, padding=1),
             fj.ops.dense(1, 1024, 1024)]
    kernels = []
    runner = LocalRunner(max_wall_cpu_ratio=None, remeasure=0)  # judged here, by both rules
    for t in tasks:
        m = Measurer(t, tg, runner, threads=2)
        sp = next(iter(m.spaces.values()))
        kernels += [(m, c) for c in [sp.default()] + [sp.sample(rng) for _ in range(2)]]
    rows: dict[str, list] = {}
    for phase in ("quiet", "busy"):
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy if phase == "busy" else 0)]
        time.sleep(0.5)
        try:
            out = []
            for k, (m, cfg) in enumerate(kernels):
                for _ in range(args.repeats):
                    seen.clear()
                    got: list = []
                    m.measure([cfg], lambda c, r, got=got: got.append(r) or True)
                    if got and got[0].latencies and seen and seen[0]:
                        w, c, q = (seen[0][0] + (None,))[:3]
                        out.append((k, statistics.median(got[0].latencies), disturbed(w, c, 1.5),
                                    disturbed(w, c, 1.5, q), c / w, (q or 0.0) / w))
            rows[phase] = out
        finally:
            for h in hogs:
                h.kill()
    runner.close()
    quiet = {k: statistics.median([r[1] for r in rows["quiet"] if r[0] == k]) for k in range(len(kernels))}
    print(f"{len(kernels)} kernels x {args.repeats} timings, 2 threads, busy phase: {args.busy} spinning process(es)")
    for phase, out in rows.items():
        for name, col in (("old rule", 2), ("new rule", 3)):
            flagged = sum(r[col] for r in out)
            kept = [r[1] / quiet[r[0]] for r in out if not r[col]]
            spread = (f"kept timings / quiet median: median {statistics.median(kept):.2f}x, worst {max(kept):.2f}x"
                      if kept else "none kept")
            print(f"{phase:5s} {name}: flags {flagged:2d} of {len(out)}; {spread}")
        cpu = [r[4] for r in out]
        wait = [r[5] for r in out]
        print(f"{phase:5s} CPU/wall {min(cpu):.2f}-{max(cpu):.2f}, longest thread wait / wall {min(wait):.2f}-{max(wait):.2f}")


if __name__ == "__main__":
    main()
