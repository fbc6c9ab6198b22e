"""Would work stealing in the parallel loops keep a 2-thread network on time when a core slows? (issue 14)

Session 22 left ResNet-18 CIFAR at 2 threads 1.08-1.15x onnxruntime in the host's usual state and
0.97-1.00x in its slow phases, and suggested parallel chunks that a running thread can take over:
our kernels split their parallel loop statically, so a thread whose core slows holds up the step,
where onnxruntime's pool hands out smaller pieces. This probe measures that lever before building it:

1. ``--fma``: per-thread time of equal FMA work in a 2-thread OpenMP region, every round, for
   ``--seconds``: do the host's slowdowns hit one core at a time (stealing helps) or both (it cannot)?
2. the network: a tuned build (``--db``, a ``benchmarks/networks.py`` database with its mixed plan)
   as emitted (``schedule(static)``) next to the same C source with every plain ``parallel for`` of a
   fused loop rewritten to per-thread ranges that a thread, once its own range is done, steals from the
   back of the fullest other range (one 64-bit compare-and-swap per iteration; the static split when
   nobody is late), and onnxruntime at its defaults, interleaved (pause + 2 untimed runs before each
   block), outputs checked against onnxruntime; optionally with a process pinned to the second core
   (``--interfere ON:OFF:NICE``: busy ON s of every ON+OFF s at that nice level).

Usage:
    python benchmarks/steal_probe.py --fma --seconds 20
    python benchmarks/steal_probe.py --db results/nets.db --model resnet18 --dataset cifar10 --rounds 15
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

STEAL_HEADER = r"""
#ifndef FJ_STEAL_DEFINED
#define FJ_STEAL_DEFINED
int omp_get_thread_num(void);
int omp_get_max_threads(void);
#define FJ_MAXT 64
typedef struct { unsigned long long v; char pad[56]; } __attribute__((aligned(64))) fj_steal_t;
static inline int fj_steal_init(fj_steal_t* st, long n, int cap) {  /* libgomp's static split, packed lo | hi << 32 */
  int t = omp_get_max_threads();
  if (t > cap) t = cap;
  if (t > FJ_MAXT) t = FJ_MAXT;
  if (t > n) t = (int)n;
  if (t < 1) t = 1;
  long q = n / t, r = n % t, lo = 0;
  for (int i = 0; i < t; ++i) {
    long hi = lo + q + (i < r);
    st[i].v = (unsigned long long)lo | ((unsigned long long)hi << 32);
    lo = hi;
  }
  return t;
}
static inline int fj_steal_next(fj_steal_t* st, int nt, long* out) {
  int me = omp_get_thread_num();
  unsigned long long v = __atomic_load_n(&st[me].v, __ATOMIC_RELAXED);
  while ((unsigned)v < (unsigned)(v >> 32)) {  /* own range, from the front */
    if (__atomic_compare_exchange_n(&st[me].v, &v, v + 1, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
      *out = (long)(unsigned)v;
      return 1;
    }
  }
  for (;;) {  /* the fullest other range, from the back */
    int best = -1; unsigned most = 0; unsigned long long bv = 0;
    for (int k = 0; k < nt; ++k) {
      unsigned long long w = __atomic_load_n(&st[k].v, __ATOMIC_RELAXED);
      unsigned left = (unsigned)(w >> 32) - (unsigned)w;
      if ((unsigned)w < (unsigned)(w >> 32) && left > most) { most = left; best = k; bv = w; }
    }
    if (best < 0) return 0;
    unsigned long long nv = bv - (1ULL << 32);
    if (__atomic_compare_exchange_n(&st[best].v, &bv, nv, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
      *out = (long)(unsigned)(nv >> 32);
      return 1;
    }
  }
}
#endif
"""

_PARALLEL_FOR = re.compile(r"#pragma omp parallel for schedule\(static\)( num_threads\((\w+)\))?\n"
                           r"(\s*)for \(long (\w+) = 0; \4 < ([^;]+); \+\+\4\) \{")


def stealing(source: str) -> tuple[str, int]:
    """The C source with every plain static ``parallel for`` (not collapsed) stealing; and how many."""
    count = 0

    def rewrite(m: re.Match) -> str:
        nonlocal count
        count += 1
        i, cap, ind, var, n = count, m.group(2) or "FJ_MAXT", m.group(3), m.group(4), m.group(5)
        return (f"fj_steal_t fjst{i}[FJ_MAXT]; const int fjnt{i} = fj_steal_init(fjst{i}, {n}, {cap});\n"
                f"{ind}#pragma omp parallel num_threads(fjnt{i})\n"
                f"{ind}for (long {var} = 0; fj_steal_next(fjst{i}, fjnt{i}, &{var}); ) {{")

    out = _PARALLEL_FOR.sub(rewrite, source)
    return STEAL_HEADER + out, count


FMA_PROBE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <omp.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
__attribute__((noinline)) float work(long n, float s) {
  float a[12][8];
  for (int i = 0; i < 12; i++) for (int j = 0; j < 8; j++) a[i][j] = s + i + j;
  for (long k = 0; k < n; k++)
    for (int i = 0; i < 12; i++)
#pragma omp simd
      for (int j = 0; j < 8; j++) a[i][j] = a[i][j] * 0.999f + 1e-4f;
  float r = 0; for (int i = 0; i < 12; i++) for (int j = 0; j < 8; j++) r += a[i][j]; return r;
}
int main(int argc, char** argv) {
  double secs = atof(argv[1]); double t0 = now(); float sink = 0; double tt[2][200]; int it = 0;
  while (now() - t0 < secs) {
#pragma omp parallel num_threads(2) reduction(+:sink)
    { int t = omp_get_thread_num(); double a = now(); sink += work(40000, t); tt[t][it] = now() - a; }
    if (++it == 200) {
      double s0 = 0, s1 = 0, mx = 0;
      for (int i = 0; i < 200; i++) { s0 += tt[0][i]; s1 += tt[1][i];
        double r = tt[0][i] > tt[1][i] ? tt[0][i] / tt[1][i] : tt[1][i] / tt[0][i]; if (r > mx) mx = r; }
      printf("%.1f %.4f %.4f %.3f\n", now() - t0, s0 / 200 * 1e3, s1 / 200 * 1e3, mx); fflush(stdout); it = 0;
    }
  }
  return sink == 12345.0f;
}
"""


def fma_probe(seconds: float) -> None:
    """Per 200 rounds: each thread's mean time of equal work, their ratio, the largest single ratio."""
    with tempfile.TemporaryDirectory() as d:
        src, exe = os.path.join(d, "probe.c"), os.path.join(d, "probe")
        Path(src).write_text(FMA_PROBE)
        subprocess.run(["gcc", "-O2", "-march=native", "-fopenmp", src, "-o", exe], check=True)
        out = subprocess.run([exe, str(seconds)], capture_output=True, text=True, check=True).stdout
    rows = [tuple(map(float, line.split())) for line in out.splitlines() if line.strip()]
    ratios = [max(a, b) / min(a, b) for _, a, b, _ in rows]
    print(f"{len(rows)} windows of 200 rounds; thread 0 / 1 mean ms {statistics.median(r[1] for r in rows):.3f} / "
          f"{statistics.median(r[2] for r in rows):.3f}")
    print(f"slower thread / faster per window: median {statistics.median(ratios):.3f}, "
          f">= 1.10 in {sum(r >= 1.10 for r in ratios)} windows, >= 1.25 in {sum(r >= 1.25 for r in ratios)}, "
          f"max {max(ratios):.2f}; largest single-round ratio {max(r[3] for r in rows):.1f}")


def network_probe(args) -> None:
    import onnxruntime as ort

    import felixjax as fj
    from codegen import netbuild
    from codegen.target import Target
    from felixjax.database import Database
    from felixjax.network import build_model
    from felixjax.network_build import CompiledModel

    proto = fj.zoo.make_model(args.model, dataset=args.dataset, seed=0)
    with Database(args.db, readonly=True) as d:
        plan = d.get_meta(f"networks.mixed_plan:{proto.graph.name}:{args.threads}")
    model = fj.load_onnx(proto, layout=json.loads(plan) if plan else "nchw")
    exe = build_model(model, Target.cpu(), db=args.db, threads=args.threads)
    src, n = stealing(exe.net.source)
    net2 = dataclasses.replace(exe.net, source=src)
    builds = {"static": exe, "steal": CompiledModel(model, exe.target, exe.schedules, net2,
                                                     netbuild.load(net2, threads=args.threads))}
    shape = [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    o = ort.SessionOptions()
    o.intra_op_num_threads = args.threads
    sess = ort.InferenceSession(proto.SerializeToString(), sess_options=o)
    name = sess.get_inputs()[0].name
    ref = sess.run(None, {name: x})[0]
    for k, b in builds.items():
        np.testing.assert_allclose(b(x), ref, rtol=1e-3, atol=1e-3, err_msg=k)
    hog = None
    if args.interfere:
        on, off, nice = (args.interfere.split(":") + ["19"])[:3]
        code = (f"import os, time\nos.sched_setaffinity(0, {{1}})\nos.nice({int(nice)})\nwhile True:\n"
                f"    t = time.perf_counter()\n    while time.perf_counter() - t < {float(on)}: pass\n"
                f"    time.sleep({float(off)})\n")
        hog = subprocess.Popen([sys.executable, "-c", code])
    t: dict = {k: [] for k in [*builds, "onnxruntime"]}
    try:
        for _ in range(args.rounds):
            for k, b in builds.items():
                time.sleep(0.1)
                b.timeit(x, number=2)
                t[k].append(b.timeit(x, number=args.number))
            time.sleep(0.1)
            sess.run(None, {name: x})
            sess.run(None, {name: x})
            s0 = time.perf_counter()
            for _ in range(args.number):
                sess.run(None, {name: x})
            t["onnxruntime"].append((time.perf_counter() - s0) / args.number)
    finally:
        if hog is not None:
            hog.kill()
    for k, b in builds.items():
        np.testing.assert_allclose(b(x), ref, rtol=1e-3, atol=1e-3, err_msg=k)
    med = {k: statistics.median(v) * 1e3 for k, v in t.items()}
    print(f"{n} parallel loops stealing; medians of {args.rounds} rounds x {args.number} runs"
          + (f", interference {args.interfere}" if args.interfere else ""))
    print("  " + "  ".join(f"{k} {v:.3f} ms ({med['onnxruntime'] / v:.3f}x)" for k, v in med.items()))
    print("  static / steal per round: " + " ".join(f"{a / b:.2f}" for a, b in zip(t["static"], t["steal"])))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fma", action="store_true", help="the per-thread FMA probe instead of the network")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--db", help="a benchmarks/networks.py database (tuned records and the mixed plan)")
    p.add_argument("--model", default="resnet18")
    p.add_argument("--dataset", default="cifar10")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--number", type=int, default=40)
    p.add_argument("--interfere", default="", help="ON:OFF[:NICE] seconds of a busy process pinned to core 1")
    args = p.parse_args(argv)
    if args.fma:
        fma_probe(args.seconds)
    elif args.db:
        network_probe(args)
    else:
        p.error("--fma or --db")
    return 0


if __name__ == "__main__":
    sys.exit(main())
