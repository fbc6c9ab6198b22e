"""Tuning on simulated GPUs (issue 18): % of the spec's fp32 peak reached by each strategy.

For every (task, GPU, strategy): ``fj.tune`` on ``Target.cuda_sim(gpu)`` with a small trial budget
(the session measures the sketch's default schedule first, then the strategy's proposals). Every
measured kernel is rendered as CUDA, compiled for the CPU behind the emulation shim and run on
sampled blocks against numpy (``--check-blocks``; the corner blocks come first) before it is
simulated, so a wrong kernel is ``wrong_result`` and never counted. No GPU is used or needed: the
latencies are the simulator's (``codegen.cuda.sim``), deterministic, so one run per configuration
is enough; a real GPU's Spearman / MAPE / cuBLAS comparisons are not measured here.

Run: ``python benchmarks/cuda_sim.py --trials 16 --write`` (the table goes into docs/BENCHMARKS.md
between the ``cuda_sim`` markers, with the commit and the command).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TASKS = {
    "matmul2048": "matmul:m=2048,n=2048,k=2048",
    "conv": "conv2d:n=1,c=64,h=56,w=56,k=64,r=3,pad=1",
}


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return head or "unknown"


def run(tasks: list[str], gpus: list[str], strategies: list[str], trials: int, check_blocks: int, nvcc: bool,
        seed: int = 0) -> list[dict]:
    import felixjax as fj
    from codegen.cuda.space import CudaSpace
    from codegen.ops import parse_spec
    from codegen.run.gpusim import GpuSimMeasurer

    rows = []
    for name in tasks:
        task = parse_spec(TASKS[name])
        for gpu in gpus:
            tg = fj.Target.cuda_sim(gpu)
            peak = tg.spec.peak_flops
            default = CudaSpace(task, tg).default()
            for strat in strategies:
                t0 = time.perf_counter()
                res = fj.tune(task, tg, strategy=strat, trials=trials, seed=seed, progress=False, retime=0,
                              measurer=lambda t, target: GpuSimMeasurer(t, target, max_blocks=check_blocks, nvcc=nvcc))
                wall = time.perf_counter() - t0
                hist = res.history
                ok = [r for r in hist if r.ok]
                dflt = next((r for r in hist if r.config == default), None)
                best = min(ok, key=lambda r: r.latency_s) if ok else None
                rows.append({
                    "task": name, "gpu": gpu, "strategy": strat, "trials": len(hist), "ok": len(ok),
                    "wrong": sum(r.status == "wrong_result" for r in hist),
                    "failed": sum(r.status not in ("ok", "wrong_result") for r in hist),
                    "default_pct": 100 * task.flops / dflt.latency_s / peak if dflt is not None and dflt.ok else float("nan"),
                    "best_pct": 100 * task.flops / best.latency_s / peak if best else float("nan"),
                    "best_tflops": task.flops / best.latency_s / 1e12 if best else float("nan"),
                    "best_is_default": best is not None and best.config == default,
                    "best_config": best.config.dumps() if best else "", "wall_s": wall})
                r = rows[-1]
                print(f"{name:10s} {gpu:5s} {strat:8s} default {r['default_pct']:5.1f}%  best {r['best_pct']:5.1f}% "
                      f"({r['ok']}/{r['trials']} ok, {r['wrong']} wrong)  {wall:.0f} s", flush=True)
    return rows


def table(rows: list[dict]) -> str:
    out = ["| task | GPU | strategy | trials (ok / wrong / failed) | default schedule, % of fp32 peak | "
           "tuned best, % of fp32 peak | TFLOP/s | best = default? | wall s |",
           "| --- | --- | --- | --- | ---: | ---: | ---: | --- | ---: |"]
    for r in rows:
        out.append(f"| {r['task']} | {r['gpu']} | {r['strategy']} | {r['trials']} ({r['ok']} / {r['wrong']} / "
                   f"{r['failed']}) | {r['default_pct']:.1f} | **{r['best_pct']:.1f}** | {r['best_tflops']:.2f} | "
                   f"{'yes' if r['best_is_default'] else 'no'} | {r['wall_s']:.0f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="example: python benchmarks/cuda_sim.py --trials 16 --write")
    ap.add_argument("--tasks", default="matmul2048,conv", help=f"comma list of {', '.join(TASKS)}")
    ap.add_argument("--gpus", default="a100,h100,orin")
    ap.add_argument("--strategies", default="gradient,genetic,random")
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--check-blocks", type=int, default=2, help="blocks of each kernel run by the CPU emulation")
    ap.add_argument("--nvcc", action="store_true", help="compile with nvcc and simulate with ptxas's registers "
                                                        "(default: the space's register estimate)")
    ap.add_argument("--write", action="store_true", help="write the table into docs/BENCHMARKS.md")
    args = ap.parse_args(argv)
    if not args.nvcc:
        os.environ["FELIXJAX_NVCC"] = "/nonexistent/nvcc"  # the session's measurers too
    tasks = [t for t in args.tasks.split(",") if t]
    bad = [t for t in tasks if t not in TASKS]
    if bad:
        print(f"unknown task(s) {bad}; known: {', '.join(TASKS)}", file=sys.stderr)
        return 2
    from codegen.cuda.specs import SPECS

    unknown = [g for g in args.gpus.split(",") if g not in SPECS]
    if unknown:
        print(f"unknown GPU(s) {unknown}; known: {', '.join(sorted(SPECS))}", file=sys.stderr)
        return 2
    print("simulated timings (codegen.run.gpusim's analytic model of each GPU; no GPU ran), kernels checked on the "
          "CPU emulation", file=sys.stderr)
    t0, commit = time.perf_counter(), _commit()  # the code that runs, not what HEAD is at the end
    rows = run(tasks, args.gpus.split(","), args.strategies.split(","), args.trials, args.check_blocks, args.nvcc)
    minutes = (time.perf_counter() - t0) / 60
    text = table(rows)
    print(text)
    if args.write:
        from benchmarks.kernels import write_doc

        cmd = " ".join(["python benchmarks/cuda_sim.py"] + (argv if argv is not None else sys.argv[1:]))
        head = (f"Simulated (no GPU lent), at commit {commit}, `{cmd}` ({minutes:.1f} min on a shared, loaded "
                f"2-core machine). Tasks: {', '.join(f'{t} = `{TASKS[t]}`' for t in tasks)}. Each run measures "
                f"the sketch's default schedule first, then the strategy's proposals ({args.trials} trials in all, "
                f"seed 0). Every kernel was emulated on the CPU on {args.check_blocks} sampled blocks (corner blocks "
                f"first) and matched numpy before it was simulated; registers are "
                f"{'ptxas' if args.nvcc else 'the space estimate (nvcc off)'}. Latencies are the simulator's "
                "(codegen/cuda/sim.py, calibration unchanged); real-GPU accuracy (Spearman, MAPE, cuBLAS) is not "
                "measured.")
        write_doc(head + "\n\n" + text, begin="<!-- cuda_sim:begin -->", end="<!-- cuda_sim:end -->",
                  heading="Tuning on simulated GPUs (benchmarks/cuda_sim.py)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
