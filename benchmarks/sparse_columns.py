"""Sparse layers whose output columns do not fill whole vectors: the exact sparse sketch against its
padded-columns variant (``sparse_bsr.pad_x8`` ..., session 79) and the dense layer, default schedules.

A sparse kernel vectorizes along its output columns (a conv's output pixels, a dense layer's batch rows),
and the exact sketch's column tile must divide their count: at 7x7 or 14x14 maps only scalar (or 4-lane)
schedules exist. The padded variant stores each row of columns as whole vectors (zeros past the end) in its
timed copy and writes the real columns only. Here every layer is timed as the dense float32 layer (its
default schedule, what a network builds untuned), and at 50% and 90% unstructured zeros with the default
schedule of each sparse sketch, interleaved (A B C ... A B C ..., ``--rounds``) in the measuring process,
whose output check against numpy runs before and after every timing. Ratios are of medians in this run.

    python benchmarks/sparse_columns.py                   # 1 thread, 5 rounds (~3 min on 2 cores)
    python benchmarks/sparse_columns.py --threads 2 --rounds 7
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from codegen.measure import LocalRunner
from codegen.ops import Task, conv2d, dense, matmul
from codegen.space import Space, sketches_for
from codegen.target import Target
from felixjax.measurer import Measurer
from felixjax.network_build import default_config_for

LAYERS: dict[str, Task] = {  # none of them used while writing the padded variant except the first two
    "conv 3x3 256ch 7x7": conv2d(1, 256, 7, 7, out_channels=256, kernel=3, padding=1),
    "conv 1x1 512->512 7x7": conv2d(1, 512, 7, 7, out_channels=512, kernel=1),
    "conv 1x1 160->960 7x7 (MobileNetV2)": conv2d(1, 160, 7, 7, out_channels=960, kernel=1),
    "conv 1x1 256->256 14x14": conv2d(1, 256, 14, 14, out_channels=256, kernel=1),
    "conv 3x3 128ch 14x14": conv2d(1, 128, 14, 14, out_channels=128, kernel=3, padding=1),
    "conv 3x3 s2 64->128 28x28 -> 14x14": conv2d(1, 64, 28, 28, out_channels=128, kernel=3, stride=2, padding=1),
    "dense batch 12 512->512": dense(12, 512, 512),
    "matmul 197x384x384 (ViT tokens)": matmul(197, 384, 384),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sparsity", default="0.5,0.9")
    args = ap.parse_args()
    target = Target.cpu()
    levels = [float(s) for s in args.sparsity.split(",")]
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, {target.simd_lanes} fp32 lanes, "
          f"{args.threads} thread(s), {args.rounds} interleaved rounds, load {os.getloadavg()[0]:.2f} at start")
    print("| layer | dense ms | " + " | ".join(f"sp{int(s * 100)} exact ms | sp{int(s * 100)} padded ms | "
                                            f"exact / padded | dense / sparse" for s in levels) + " |")
    print("|---" * (2 + 4 * len(levels)) + "|")
    with LocalRunner() as runner:
        for name, task in LAYERS.items():
            arms = {"dense": (task, default_config_for(task, target))}
            for s in levels:
                sparse = replace(task, sparsity=s)
                for sk in sketches_for(sparse, target):
                    arms[f"{s} {'padded' if sk.pad else 'exact'}"] = (sparse, Space(sparse, sk, target).default())
            measurers = {k: Measurer(t, target, runner, threads=args.threads) for k, (t, _) in arms.items()}
            times: dict[str, list[float]] = {k: [] for k in arms}
            for _ in range(args.rounds):
                for k, (_, cfg) in arms.items():
                    got = []
                    measurers[k].measure([cfg], lambda c, r, got=got: got.append(r) or True)
                    if got[0].ok:
                        times[k].append(got[0].latency_s)
                    else:
                        print(f"  {name} {k}: {got[0].status} {got[0].error[:160]}", file=sys.stderr)
            med = {k: statistics.median(v) * 1e3 if v else float("nan") for k, v in times.items()}
            cells = [f"{med['dense']:.3f}"]
            for s in levels:
                ex, pd = med.get(f"{s} exact", float("nan")), med.get(f"{s} padded", float("nan"))
                cells += [f"{ex:.3f}", f"{pd:.3f}" if f"{s} padded" in med else "(none)",
                          f"{ex / pd:.2f}x" if f"{s} padded" in med else "-",
                          f"{med['dense'] / (pd if f'{s} padded' in med else ex):.2f}x"]
            print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
