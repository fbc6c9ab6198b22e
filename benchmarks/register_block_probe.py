"""Probe (issue 14): is the GEMM register block what keeps matmul below onnxruntime on AVX2?

On a 16-register AVX2 core the classic micro-kernel is 6 rows x 2 vectors (12 accumulators). The
``gemm_packed`` tiles divide their extents, so M = 512 allows 4 or 8 rows only (8 accumulators, or 16
that do not fit). This script times, interleaved in one process, the default 4x16 block of matmul
512^3, an 8x8 block, and the 6x16 block on M = 516 (the next multiple of 6: what a pad-to-6 variant of
the row axis would compute, 0.8% more work), each checked against numpy before timing.

Run: ``python benchmarks/register_block_probe.py`` (about 30 s, 1 thread).
"""
from __future__ import annotations

import argparse

import numpy as np

from codegen.ops import matmul
from codegen.space import Config, Space
from codegen.target import Target
from felixjax.baselines import kernel_contender, time_interleaved

# name: (M, m tiles, n tiles, k tiles) for gemm_packed on (b, m, n, k); N = K = 512
CASES = {
    "M512 4x16 (default)": (512, (1, 1, 128, 4), (8, 1, 4, 16), (1, 512)),
    "M512 8x8": (512, (1, 1, 64, 8), (8, 1, 8, 8), (1, 512)),
    "M516 6x16": (516, (1, 1, 86, 6), (8, 1, 4, 16), (1, 512)),
    "M516 6x16 kc256": (516, (1, 1, 86, 6), (8, 1, 4, 16), (2, 256)),
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds (default 7)")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    target = Target.cpu()
    contenders, flops = {}, {}
    for name, (m, mt, nt, kt) in CASES.items():
        task = matmul(m, 512, 512)
        cfg = Config("gemm_packed", ((1, 1, 1, 1), mt, nt, kt), 3, 8, 16)
        Space(task, "gemm_packed", target).validate(cfg)
        arrays = task.random_inputs(0)
        c = kernel_contender(task, cfg, arrays, threads=1, target=target, expected=task.reference(*arrays))
        c.check()
        contenders[name], flops[name] = c, task.flops
    times = time_interleaved(contenders, rounds=args.rounds)
    for name, c in contenders.items():
        c.check()  # after timing too
        print(f"{name:22s} {flops[name] / np.median(times[name]) / 1e9:6.1f} GFLOP/s (median of {args.rounds} rounds)")


if __name__ == "__main__":
    main()
